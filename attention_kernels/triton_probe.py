"""Whether the installed Triton builds this codebase's kernels for the inputs at hand, asked once per kernel
family, dtype and head dim.

``attn_backend="auto"`` takes a Triton kernel only where it builds and fits: the first time a family is wanted
for a (dtype, head dim), one tiny forward and backward launch of its kernels at that head dim runs on the current
device. Triton compares each build's own resource report (its shared memory) with the device's limit as it
launches (227 KiB per block on an H100/H200: the separable forward at head dim 256 needs 258 KiB), and any
failure of that kind or another (a Triton too old or too new for the kernels' language, a missing compiler)
prints one warning line and sends "auto" to the portable path for that (dtype, head dim) for the rest of the
process, instead of a traceback in the middle of training.

A kernel that builds is not yet trusted: the probe also runs it at a small size (two query heads sharing one key
head, 258 tokens: full tiles, a ragged one and the diagonal) forward and backward, and compares its output and
every input gradient with the portable PyTorch path in fp32 on the same inputs. An error beyond the dtype's tolerance
(PROBE_TOLERANCE, the error's norm over the reference's; the kernels' bf16 and fp16 rounding is well inside it,
a wrong mask or a lost term far outside) or a non-finite value prints one warning and sends that key to the
portable path for the process: a kernel that computes wrong on a GPU or Triton nobody here tested never trains a
model. The reference runs in fp64, so TF32 (on while training) cannot blur it. ``probe_summary()`` says what was checked, and how long it took, for train.py's start-up line.

``triton_builds`` is marked ``assume_constant_result``: ``torch.compile`` calls it once while tracing and
bakes the answer into the graph, so the probe never becomes part of a compiled model.
"""
from __future__ import annotations

import sys
import time

import torch

DTYPE_NAMES = {torch.bfloat16: "bf16", torch.float16: "fp16", torch.float32: "fp32"}
_DTYPES = {name: dtype for dtype, name in DTYPE_NAMES.items()}
_BUILDS: dict[tuple, bool] = {}
_PROBE_SECONDS: dict[tuple, float] = {}


PROBE_HEADS, PROBE_KV_HEADS = 2, 1


def probe_tokens(device: torch.device) -> int:
    """Two and a bit of the GPU's largest tile (128 rows): full tiles, a ragged one and a diagonal one; under the
    interpreter (the CPU, tiles of 16 to 64) 80 covers the same cases in a tenth of the time."""
    return 80 if device.type == "cpu" else 2 * 128 + 2
# Largest allowed ||kernel - portable|| / ||portable|| per dtype of q, k, v: about three times what the kernels
# measure under the interpreter (bf16 at most 0.0036, fp16 0.0004, fp32 0); a wrong mask, a lost bias term or a
# wrong gradient shows as 0.1 or more, a 2% error of scale as 0.02.
PROBE_TOLERANCE = {torch.float32: 1e-4, torch.float16: 1.5e-3, torch.bfloat16: 1e-2}


class KernelMismatch(Exception):
    """The kernel built and ran but computed something else than the portable path."""


def probe_generator(device: torch.device) -> torch.Generator:
    return torch.Generator(device=device).manual_seed(20260407)


def probe_randn(generator, *shape, scale=1.0):
    return torch.randn(*shape, generator=generator, device=generator.device) * scale


def compare_with_portable(kernel, portable, inputs: list[torch.Tensor], grad_out: torch.Tensor,
                          dtype: torch.dtype) -> float:
    """Run kernel and portable forward and backward (with grad_out) on the same fp32 inputs, q, k, v (the first
    three) rounded to dtype, the kernel reading them in dtype and the portable path in fp64; raise KernelMismatch
    naming the first output or gradient that differs beyond PROBE_TOLERANCE[dtype] or is not finite. Returns the
    largest error (of the reference's largest magnitude) over the output and the gradients."""
    def run(fn, cast):
        rounded = [x.to(dtype) if i < 3 else x for i, x in enumerate(inputs)]
        # the portable path in fp64: exact beside any kernel error (TF32, on for training, would blur fp32's)
        leaves = [(x if cast else x.double()).detach().requires_grad_() for x in rounded]
        out = fn(*leaves)
        out.backward(grad_out.to(out.dtype))
        return [("output", out)] + [(f"gradient {i}", leaf.grad) for i, leaf in enumerate(leaves)]

    tolerance, largest = PROBE_TOLERANCE[dtype], 0.0
    for (name, got), (_, expected) in zip(run(kernel, True), run(portable, False)):
        if got is None or not torch.isfinite(got).all():
            raise KernelMismatch(f"its {name} holds non-finite values (or none)")
        # the norm of the error over the norm of the reference: rounding errors are independent and average out
        # in it, a systematic error (a scale, a lost term, a masked row) does not
        error = (torch.linalg.vector_norm(got.double() - expected) /
                 max(torch.linalg.vector_norm(expected).item(), 1e-300)).item()
        if error > tolerance:
            raise KernelMismatch(f"its {name} is off the portable path's by {error:.3g} in norm, relative "
                                 f"(at most {tolerance:g} allowed for {DTYPE_NAMES[dtype]})")
        largest = max(largest, error)
    return largest


def separable_reference(q, k, v, q_features, k_features, scale):
    """The separable bias's definition, written out densely in fp32 (attention_kernels/separable.py's docstring):
    logit(i, j) = scale·q_i·k_j - (t_i - s_j)(a_i + b_j) + (c_i - c_j) for keys j <= Tk - Tq + i; q_features
    (1, H, Tq, 3) per query head, k_features (1, H_kv, Tk, 3) per key head."""
    H, Tq, Tk = q.shape[1], q.shape[2], k.shape[2]
    k, v = (x.repeat_interleave(H // x.shape[1], dim=1) for x in (k, v))
    kf = k_features.repeat_interleave(H // k_features.shape[1], dim=1)
    t, a, c_q = q_features.unbind(-1)
    s, b, c_k = kf.unbind(-1)
    t, s = t.detach(), s.detach()  # positions: the kernel gives them no gradient (nothing learns them)
    logits = (scale * q @ k.transpose(-1, -2) - (t[..., :, None] - s[..., None, :]) * (a[..., :, None] + b[..., None, :])
              + (c_q[..., :, None] - c_k[..., None, :]))
    visible = torch.ones(Tq, Tk, dtype=torch.bool, device=q.device).tril(Tk - Tq)
    return torch.softmax(logits.masked_fill(~visible, float("-inf")), dim=-1) @ v


def _probe_separable(dtype: torch.dtype, device: torch.device, head_dim: int, value_dim: int) -> float:
    from attention_kernels.separable import separable_attention
    g, T, H, Hkv = probe_generator(device), probe_tokens(device), PROBE_HEADS, PROBE_KV_HEADS
    positions = torch.arange(T, dtype=torch.float32, device=device).expand(1, H, T)
    decay = -torch.cumsum(torch.rand(1, H, T, generator=g, device=device) * 0.2, dim=-1)  # a FoX-like gate sum

    def features(heads, rate_scale):
        rate = torch.rand(1, heads, T, generator=g, device=device) * rate_scale
        return torch.stack([positions[:, :heads], rate, decay[:, :heads]], dim=-1)
    inputs = [probe_randn(g, 1, H, T, head_dim), probe_randn(g, 1, Hkv, T, head_dim), probe_randn(g, 1, Hkv, T, value_dim),
              features(H, 0.05), features(Hkv, 0.05)]
    scale = head_dim ** -0.5

    def kernel(q, k, v, qf, kf):
        return separable_attention(q, k, v, qf, kf, scale, has_rate=True, has_sum=True)
    return compare_with_portable(kernel, lambda *x: separable_reference(*x, scale), inputs,
                                 probe_randn(g, 1, H, T, value_dim), dtype)


# kernel family -> probe(dtype, device, head_dim, value_dim) -> largest relative error; GRAPE-AP's registers itself
# from attention_kernels/grape_ap.py (which imports this module: the probe beside its kernels keeps the imports one-way)
PROBES = {"separable": _probe_separable}
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
            from attention_kernels.triton_common import INTERPRET
            if _version(triton.__version__) < MIN_TRITON[family]:
                raise RuntimeError(f"these kernels need triton >= {'.'.join(map(str, MIN_TRITON[family]))}")
            device = torch.device("cpu" if INTERPRET else "cuda")
            started = time.perf_counter()
            with torch.enable_grad():  # the probe's backward, also when the model is first used under no_grad
                PROBES[family](_DTYPES[dtype_name], device, head_dim, value_dim)
            _PROBE_SECONDS[key] = time.perf_counter() - started
            _BUILDS[key] = True
        except Exception as error:  # any failure to build, fit, launch or agree: the portable path instead
            version = getattr(sys.modules.get("triton"), "__version__", "(not importable)")
            dims = f"head dim {head_dim}" + ("" if value_dim == head_dim else f" (values {value_dim})")
            if isinstance(error, KernelMismatch):
                print(f"warning: the {family} attention kernel computes wrong with triton {version} on "
                      f"{_device_name()} for {dtype_name} at {dims}: {error}; attn_backend='auto' uses the portable "
                      "PyTorch path there for this process (please report it)", file=sys.stderr)
            else:
                print(f"warning: triton {version} cannot run the {family} attention kernel for {dtype_name} at "
                      f"{dims} ({_reason(error)}); attn_backend='auto' uses the portable PyTorch path there",
                      file=sys.stderr)
            _BUILDS[key] = False
    return _BUILDS[key]


def _device_name() -> str:
    return torch.cuda.get_device_name() if torch.cuda.is_available() else "the CPU (Triton interpreter)"


def probe_summary() -> str:
    """The kernels probed so far in this process, for the start-up line: which were built and checked against the
    portable path, in how long, and which fell back to it; "" when none was probed."""
    parts = []
    for (family, dtype_name, head_dim, value_dim), ok in _BUILDS.items():
        dims = f"d{head_dim}" + ("" if value_dim == head_dim else f"/v{value_dim}")
        parts.append(f"{family} {dtype_name} {dims} " + (f"Triton, checked against the portable path in "
                                                         f"{_PROBE_SECONDS[family, dtype_name, head_dim, value_dim]:.1f} s"
                                                         if ok else "portable path (see the warning)"))
    return "; ".join(parts)
