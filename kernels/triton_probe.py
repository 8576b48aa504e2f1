"""Whether the installed Triton builds this codebase's kernels for the inputs at hand, asked once per kernel
family, dtype and head dim.

``attn_backend="auto"`` takes a Triton kernel only where it builds and fits: the first time a family is wanted
for a (dtype, head dim), one tiny forward and backward launch of its kernels at that head dim runs on the current
device. Triton compares each build's own resource report (its shared memory) with the device's limit as it
launches (227 KiB per block on an H100/H200: the separable forward at head dim 256 needs 258 KiB), and any
failure of that kind or another (a Triton too old or too new for the kernels' language, a missing compiler)
prints one warning line and sends "auto" to the portable path for that (dtype, head dim) for the rest of the
process, instead of a traceback in the middle of training.

``triton_builds`` is marked ``assume_constant_result``: ``torch.compile`` calls it once while tracing and
bakes the answer into the graph, so the probe never becomes part of a compiled model.
"""
from __future__ import annotations

import sys

import torch

DTYPE_NAMES = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}
_DTYPES = {name: dtype for dtype, name in DTYPE_NAMES.items()}
_BUILDS: dict[tuple, bool] = {}


def _probe_grape_ap(dtype: torch.dtype, device: torch.device, head_dim: int, value_dim: int) -> None:
    from kernels import grape_ap_triton as kernel
    q, k = (torch.randn(1, 1, 64, head_dim, device=device).to(dtype) for _ in range(2))
    v, grad = (torch.randn(1, 1, 64, value_dim, device=device).to(dtype) for _ in range(2))
    p, r = (torch.randn(1, 1, 64, 8, device=device) for _ in range(2))
    slopes = torch.ones(1, device=device)
    config = kernel.default_config(head_dim, dtype)
    out, lse = kernel.triton_forward(q, k, v, p, r, slopes, 0.125, config)
    kernel.triton_backward(grad, q, k, v, p, r, slopes, out, lse, 0.125, config)


def _probe_separable(dtype: torch.dtype, device: torch.device, head_dim: int, value_dim: int) -> None:
    from kernels import separable_triton as kernel
    q, k = (torch.randn(1, 1, 64, head_dim, device=device).to(dtype) for _ in range(2))
    v, grad = (torch.randn(1, 1, 64, value_dim, device=device).to(dtype) for _ in range(2))
    features = torch.randn(1, 1, 64, 3, device=device)
    config = kernel.default_config(head_dim, dtype)
    out, lse = kernel.triton_forward(q, k, v, features, features, 0.125, (1, 1), config)
    kernel.triton_backward(grad, q, k, v, features, features, out, lse, 0.125, (1, 1), config)


PROBES = {"grape_ap": _probe_grape_ap, "separable": _probe_separable}
# The oldest Triton each family is proven to build with (docs/triton_versions.md: compiled for sm_90 with each
# Triton that torch 2.4 to 2.14 bring). Older ones are not probed: Triton 3.0 and 3.1 abort the whole process
# (a failed C++ assertion, no Python exception) on the GRAPE-AP key-major kernel.
MIN_TRITON = {"grape_ap": (3, 2), "separable": (3, 0)}


def _version(text: str) -> tuple[int, ...]:
    import re
    return tuple(int(part) for part in re.findall(r"\d+", text)[:2])


def _reason(error: Exception) -> str:
    """Why a probe failed, in a few words: a resource the build needs beyond the device's limit (Triton's
    OutOfResources carries both numbers), else the error's first line."""
    required, limit = getattr(error, "required", None), getattr(error, "limit", None)
    if isinstance(required, int) and isinstance(limit, int):
        resource = getattr(error, "name", "a resource")
        if "shared" in str(resource):
            return (f"its build needs {required / 1024:.0f} KiB of shared memory per block, this GPU allows "
                    f"{limit / 1024:.0f} KiB")
        return f"its build needs {required} of {resource}, this GPU allows {limit}"
    detail = (str(error).strip().splitlines() or [""])[0][:160]
    return f"{type(error).__name__}: {detail}"


@torch.compiler.assume_constant_result
def triton_builds(family: str, dtype_name: str, head_dim: int, value_dim: int | None = None) -> bool:
    """True when the Triton kernels of ``family`` ("grape_ap" or "separable") build, fit and run on this device
    for inputs of dtype ``dtype_name`` ("bf16", "fp16", "fp32") with this query/key head dim (and value head
    dim, default the same); cached for the process."""
    value_dim = head_dim if value_dim is None else value_dim
    key = (family, dtype_name, head_dim, value_dim)
    if key not in _BUILDS:
        try:
            import triton
            from kernels.triton_common import INTERPRET
            if _version(triton.__version__) < MIN_TRITON[family]:
                raise RuntimeError(f"these kernels need triton >= {'.'.join(map(str, MIN_TRITON[family]))}")
            device = torch.device("cpu" if INTERPRET else "cuda")
            PROBES[family](_DTYPES[dtype_name], device, head_dim, value_dim)
            _BUILDS[key] = True
        except Exception as error:  # any failure to build, fit or launch: the portable path instead
            version = getattr(sys.modules.get("triton"), "__version__", "(not importable)")
            dims = f"head dim {head_dim}" + ("" if value_dim == head_dim else f" (values {value_dim})")
            print(f"warning: triton {version} cannot run the {family} attention kernel for {dtype_name} at {dims} "
                  f"({_reason(error)}); attn_backend='auto' uses the portable PyTorch path there", file=sys.stderr)
            _BUILDS[key] = False
    return _BUILDS[key]
