"""positional.py's closed forms over their whole range (hypothesis; profiles in conftest.py): Rodrigues' exp of a
rank-2 skew generator against torch.linalg.matrix_exp in fp64 at any angle, on both sides of its small-angle series
(s < 1e-3) and at the switch, to 1e-15; and in the dtype it was given."""
import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from positional import rank2_exp

angles = st.one_of(st.floats(min_value=1e-9, max_value=3.0), st.sampled_from([9.99e-4, 1e-3, 1.001e-3, 5e-4]))


@given(s=angles, d=st.integers(2, 6), seed=st.integers(0, 10**6))
def test_rank2_exp_is_the_matrix_exponential_at_any_angle(s, d, seed):
    g = torch.Generator().manual_seed(seed)
    a, b = torch.randn(d, generator=g, dtype=torch.float64), torch.randn(d, generator=g, dtype=torch.float64)
    b = b - (a @ b) / (a @ a) * a  # orthogonal, so s = |a| |b|
    b = b / b.norm() * s / a.norm()
    L = torch.outer(a, b) - torch.outer(b, a)
    torch.testing.assert_close(rank2_exp(a, b), torch.linalg.matrix_exp(L), atol=1e-15, rtol=1e-13)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("s", [1e-4, 0.7])
def test_rank2_exp_keeps_its_inputs_dtype(dtype, s):
    a = torch.tensor([1.0, 0.0, 0.0], dtype=dtype)
    b = torch.tensor([0.0, s, 0.0], dtype=dtype)
    out = rank2_exp(a, b)
    assert out.dtype == dtype
    expected = torch.linalg.matrix_exp((torch.outer(a, b) - torch.outer(b, a)).double())
    torch.testing.assert_close(out.double(), expected, atol=1e-2 if dtype in (torch.float16, torch.bfloat16)
                               else 1e-6, rtol=0)
