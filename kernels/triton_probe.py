"""Whether the installed Triton builds this codebase's kernels, asked once per kernel family and dtype.

``attn_backend="auto"`` takes a Triton kernel only where it builds: the first time a family is wanted,
one tiny forward and backward launch of its kernels (head dim 64) runs on the current device, and a
failure of any kind (a Triton too old or too new for the kernels' language, a missing compiler) prints
one warning line and sends "auto" to the portable path for the rest of the process, instead of a
traceback in the middle of training. The probe compiles the same kernels the model runs; only resource
limits at other head dims are not covered (scripts/kernel_resources.py checks D = 64 and 128 for sm_90).

``triton_builds`` is marked ``assume_constant_result``: ``torch.compile`` calls it once while tracing and
bakes the answer into the graph, so the probe never becomes part of a compiled model.
"""
from __future__ import annotations

import sys

import torch

DTYPE_NAMES = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}
_DTYPES = {name: dtype for dtype, name in DTYPE_NAMES.items()}
_BUILDS: dict[tuple[str, str], bool] = {}


def _probe_grape_ap(dtype: torch.dtype, device: torch.device) -> None:
    from kernels import grape_ap_triton as kernel
    q, k, v, grad = (torch.randn(1, 1, 64, 64, device=device).to(dtype) for _ in range(4))
    p, r = (torch.randn(1, 1, 64, 8, device=device) for _ in range(2))
    slopes = torch.ones(1, device=device)
    config = kernel.default_config(64, dtype)
    out, lse = kernel.triton_forward(q, k, v, p, r, slopes, 0.125, config)
    kernel.triton_backward(grad, q, k, v, p, r, slopes, out, lse, 0.125, config)


def _probe_separable(dtype: torch.dtype, device: torch.device) -> None:
    from kernels import separable_triton as kernel
    q, k, v, grad = (torch.randn(1, 1, 64, 64, device=device).to(dtype) for _ in range(4))
    features = torch.randn(1, 1, 64, 3, device=device)
    config = kernel.default_config(64, dtype)
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


@torch.compiler.assume_constant_result
def triton_builds(family: str, dtype_name: str) -> bool:
    """True when the Triton kernels of ``family`` ("grape_ap" or "separable") build and run for inputs of
    dtype ``dtype_name`` ("bf16", "fp16", "fp32") on this device; cached for the process."""
    key = (family, dtype_name)
    if key not in _BUILDS:
        try:
            import triton
            from kernels.triton_common import INTERPRET
            if _version(triton.__version__) < MIN_TRITON[family]:
                raise RuntimeError(f"these kernels need triton >= {'.'.join(map(str, MIN_TRITON[family]))}")
            device = torch.device("cpu" if INTERPRET else "cuda")
            PROBES[family](_DTYPES[dtype_name], device)
            _BUILDS[key] = True
        except Exception as error:  # any failure to build or launch: the portable path instead
            version = getattr(sys.modules.get("triton"), "__version__", "(not importable)")
            detail = (str(error).strip().splitlines() or [""])[0][:160]
            print(f"warning: triton {version} cannot build the {family} attention kernel for {dtype_name} "
                  f"({type(error).__name__}: {detail}); attn_backend='auto' uses the portable PyTorch path",
                  file=sys.stderr)
            _BUILDS[key] = False
    return _BUILDS[key]
