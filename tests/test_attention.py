"""attention.py: attend() against its definition written out per query (the dense reference and fused SDPA, grouped
key heads, windows, decoding rows and prefill chunks), the causal mask, and the backend a layer resolves to, described.
The lifted, tile and path-integral backends are tested against the dense one in test_kernels_lift.py,
test_kernels_separable.py and test_kernels.py, and in whole models in test_model.py."""
import math

import pytest
import torch

from attention import attend, causal_mask, describe_backend


# -------------------------------------------------------------------------------- where generated mutants found no test
# Each test here fails under at least one generated mutant (tools/mutants.py) that survived before
# it was written.


@pytest.mark.parametrize("backend", ["sdpa", "lifted", "tile", "path_integral", "dense"])
def test_every_resolved_backend_is_described(backend):
    assert describe_backend(backend)


# -------------------------------------------------------------------------------- attend() against its definition


B, H, H_KV, T, D, DV = 2, 4, 2, 7, 8, 5  # all different, so that a wrong axis cannot line up by accident


def written_out(q, k, v, scale, q_pos, k_pos, window):
    """attend's contract one query at a time: softmax over the keys j with 0 <= q_pos - k_pos[j] < window of
    scale·q·k_j, query head h reading key head h // (H / H_kv), in fp64."""
    out = torch.zeros(q.shape[0], q.shape[1], q.shape[2], v.shape[-1], dtype=torch.float64)
    group = q.shape[1] // k.shape[1]
    for b in range(q.shape[0]):
        for h in range(q.shape[1]):
            for i, t in enumerate(q_pos.tolist()):
                seen = [j for j, s in enumerate(k_pos.tolist()) if 0 <= t - s and (window is None or t - s < window)]
                logits = [scale * float(q[b, h, i] @ k[b, h // group, j]) for j in seen]
                top = max(logits)
                weights = [math.exp(x - top) for x in logits]
                for w, j in zip(weights, seen):
                    out[b, h, i] += w / sum(weights) * v[b, h // group, j]
    return out


@pytest.mark.parametrize("backend", ["dense", "sdpa"])
@pytest.mark.parametrize("window", [None, 3])
@pytest.mark.parametrize("queries", [T, 1, 3])  # training, one decoding step, a chunk of a prefill
def test_attend_is_the_causal_softmax_of_its_definition(backend, window, queries):
    """The dense reference and fused SDPA, with grouped key heads, a window, and queries that are the last ones of
    the keys (at absolute positions that do not start at 0), against the formula written out per query."""
    generator = torch.Generator().manual_seed(queries + (window or 0))
    q = torch.randn(B, H, queries, D, dtype=torch.float64, generator=generator)
    k = torch.randn(B, H_KV, T, D, dtype=torch.float64, generator=generator)
    v = torch.randn(B, H_KV, T, DV, dtype=torch.float64, generator=generator)
    k_pos = torch.arange(T) + 5
    q_pos = k_pos[-queries:]
    scale = 0.3
    got = attend(q, k, v, backend=backend, scale=scale, q_pos=q_pos, k_pos=k_pos, window=window)
    assert got.shape == (B, H, queries, DV) and got.dtype == torch.float64
    torch.testing.assert_close(got, written_out(q, k, v, scale, q_pos, k_pos, window), rtol=1e-12, atol=1e-12)


def test_the_causal_mask_sees_the_keys_at_or_before_the_query_within_the_window():
    q_pos, k_pos = torch.tensor([4, 6]), torch.arange(7)
    assert causal_mask(q_pos, k_pos).tolist() == [[j <= 4 for j in range(7)], [j <= 6 for j in range(7)]]
    assert causal_mask(q_pos, k_pos, 2).tolist() == [[j in (3, 4) for j in range(7)], [j in (5, 6) for j in range(7)]]
