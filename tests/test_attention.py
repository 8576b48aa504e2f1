"""attention.py: the backend a layer resolves to, described."""
import pytest

from attention import describe_backend


# -------------------------------------------------------------------------------- where generated mutants found no test
# Each test here fails under at least one generated mutant (tools/mutants.py) that survived before
# it was written.


@pytest.mark.parametrize("backend", ["sdpa", "lifted", "tile", "path_integral", "dense"])
def test_every_resolved_backend_is_described(backend):
    assert describe_backend(backend)
