"""Per-GPU memory of a training run, planned from its configuration: the planner behind train.py's start-up check
and `python -m training.memory`.

    python -m training.memory configs/1.3b/fox.toml --gpus 8 --gpu-memory 80
    python -m training.memory configs/2.7b/rope.toml --gpus 8 --gpu-memory 40 --parallel=fsdp --activation_checkpointing=blocks

prints, for one GPU, the bytes of the weights, their gradients and AdamW's moments (fp32, sharded over the
processes under FSDP, plus the weights FSDP gathers for computing), the activations a block keeps for its
backward pass (with and without activation checkpointing), the loss's own peak (the logits, or one chunk of
them) and the workspace of a block's backward pass, under DDP and under FSDP, and the largest micro-batch that
fits. Overrides (--key=value) are train.py's.

How: the parameter counts come from one block and the rest built on the meta device (no memory, so any depth
costs the same). Activations, loss and workspace come from running one block, and the final norm with the head
and the loss, forward and backward on fake tensors (shapes and dtypes without memory or arithmetic) at the real
micro-batch, in the run's precision, while every tensor they allocate and free is tracked (LiveBytes). So every
encoding, backend choice and loss implementation is planned from its own code. The attention kernels are those
this machine would run (on a CPU: the fused SDPA paths; the CUDA tile kernel keeps a little less). The
fine print (what the phases are, what is left out) is in docs/train.md, "Memory".
"""
from __future__ import annotations

import argparse
import contextlib
import dataclasses
import math
import os
import sys
import weakref
from dataclasses import dataclass

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

GiB = 2 ** 30


# ----------------------------------------------------------------------------- tracking what tensors occupy

class LiveBytes(TorchDispatchMode):
    """The bytes of the tensor storages that the operations run inside this mode allocate and that are still
    alive (`live`), and their maximum (`peak`). A storage is counted once, however many views share it, and
    until its last reference goes."""

    def __init__(self):
        super().__init__()
        self.live = self.peak = 0
        self.alive: set[int] = set()

    def _track(self, tensor: torch.Tensor) -> None:
        storage = tensor.untyped_storage()
        key = storage._cdata
        if key in self.alive:
            return
        size = storage.nbytes()
        self.alive.add(key)
        self.live += size
        self.peak = max(self.peak, self.live)
        weakref.finalize(storage, self._free, key, size)

    def _free(self, key: int, size: int) -> None:
        if key in self.alive:
            self.alive.discard(key)
            self.live -= size

    def reset_peak(self) -> None:
        self.peak = self.live

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        for tensor in tree_flatten(out)[0]:
            if isinstance(tensor, torch.Tensor):
                self._track(tensor)
        return out


def nbytes(tensor: torch.Tensor) -> int:
    return tensor.untyped_storage().nbytes()


# ----------------------------------------------------------------------------- probes on fake tensors

@dataclass
class BlockCost:
    saved: int       # bytes one block keeps from its forward for its backward, its input included
    checkpointed: int  # the same for a checkpointed block (its input)
    workspace: int   # the most its backward holds beyond that, its weights' gradients excluded


def _fake_mode():
    from torch._subclasses.fake_tensor import FakeTensorMode
    return FakeTensorMode(allow_non_fake_inputs=True)


def _autocast(enabled: bool):
    return torch.autocast("cpu", dtype=torch.bfloat16, enabled=enabled)


_probes: dict = {}  # the probes' results in this process, by their arguments: a test suite plans the same
                   # configuration many times


def cached(probe):
    def run(model_cfg, *args):
        key = (probe.__name__, repr(model_cfg), args)
        if key not in _probes:
            _probes[key] = probe(model_cfg, *args)
        return _probes[key]
    run.__doc__, run.__name__ = probe.__doc__, probe.__name__
    return run


def block_cost(model_cfg, batch: int, autocast: bool, bf16_matrices: bool = False) -> BlockCost:
    """probe_block's result; past 8 sequences from the probes at 4 and 8, since a block's saved tensors are
    affine in the micro-batch (measured exact) and its largest transient is, once the micro-batch dominates it."""
    if batch <= 8:
        return probe_block(model_cfg, batch, autocast, bf16_matrices)
    four, eight = (probe_block(model_cfg, b, autocast, bf16_matrices) for b in (4, 8))
    return BlockCost(*(round(y + (batch - 8) * (y - x) / 4) for x, y in zip(dataclasses.astuple(four),
                                                                          dataclasses.astuple(eight))))


@cached
def probe_block(model_cfg, batch: int, autocast: bool, bf16_matrices: bool = False) -> BlockCost:
    """One block's activation memory at micro-batch `batch` x block_size, forward and backward on fake tensors.
    `autocast`: under bf16 autocast (DDP's bf16, FSDP's autocast mode). `bf16_matrices`: FSDP's bf16 parameters,
    planned as autocast; either way the bf16 weight copies are left out (counted apart, or as gathered weights)."""
    from model import Block
    T, C = model_cfg.block_size, model_cfg.n_embd
    with _fake_mode():
        block = Block(model_cfg)
        x = torch.empty(batch, T, C, requires_grad=True)
        positions = torch.arange(T)
        tracker = LiveBytes()
        with tracker, _autocast(autocast or bf16_matrices):
            y = block(x, positions)
            after_forward = tracker.live
            grad = torch.empty_like(y)
            tracker.reset_peak()
            start = tracker.live
            y.backward(grad)
            weight_grads = sum(nbytes(p.grad) for p in block.parameters() if p.grad is not None)
            backward_extra = tracker.peak - start
    # autocast's bf16 weight copies are counted apart (Plan.weight_copies; FSDP's bf16 parameters replace them)
    weight_copies = weight_copy_bytes(model_cfg) if autocast or bf16_matrices else 0
    saved = after_forward - nbytes(y) + nbytes(x) - weight_copies
    return BlockCost(saved=saved, checkpointed=nbytes(x), workspace=max(0, backward_extra - weight_grads))


def weight_copy_bytes(model_cfg) -> int:
    """The bytes of one block's bf16 copies of its weight matrices (autocast keeps them for the backward pass)."""
    from model import Block
    with torch.device("meta"):
        block = Block(model_cfg)
    matrices = [block.attn.qkv.weight, block.attn.proj.weight, block.mlp.gate.weight, block.mlp.up.weight,
                block.mlp.proj.weight]
    return 2 * sum(p.numel() for p in matrices)


def probe_loss(model_cfg, tokens: int, loss_impl: str, chunk_tokens: int, autocast: bool,
               bf16_weights: bool = False) -> int:
    """The most the final norm, the LM head and the loss hold beyond their input and the head's weight and its
    gradient, forward and backward, for `tokens` tokens on fake tensors. Past two chunks the chunked loss's
    memory grows by the same amount a token (its per-token tensors; one chunk's logits at a time), so longer
    inputs are extrapolated from two lengths instead of running a loop over all their chunks."""
    if loss_impl == "chunked" and tokens > 2 * chunk_tokens:
        one, two = (_probe_loss(model_cfg, n * chunk_tokens, loss_impl, chunk_tokens, autocast, bf16_weights)
                    for n in (1, 2))
        return round(two + (tokens - 2 * chunk_tokens) * (two - one) / chunk_tokens)
    return _probe_loss(model_cfg, tokens, loss_impl, chunk_tokens, autocast, bf16_weights)


@cached
def _probe_loss(model_cfg, tokens: int, loss_impl: str, chunk_tokens: int, autocast: bool,
                bf16_weights: bool = False) -> int:
    from lm_loss import lm_loss
    from model import RMSNorm
    C, V = model_cfg.n_embd, model_cfg.vocab_size
    with _fake_mode():
        norm = RMSNorm(C, model_cfg.norm_eps)
        weight = torch.nn.Parameter(torch.empty(V, C, dtype=torch.bfloat16 if bf16_weights else torch.float32))
        hidden = torch.empty(tokens, C, requires_grad=True)
        targets = torch.zeros(tokens, dtype=torch.long)
        tracker = LiveBytes()
        with tracker:
            with _autocast(autocast):
                loss = lm_loss(loss_impl, norm(hidden), weight, targets, chunk_tokens)
            loss.backward()
            weight_grad = nbytes(weight.grad)
    return max(0, tracker.peak - weight_grad)


# ----------------------------------------------------------------------------- the plan

def parameter_counts(model_cfg) -> tuple[int, int, int]:
    """(all parameters, one block's, the rest: embedding = tied head, final norm), without allocating."""
    from model import GPT
    with torch.device("meta"):
        one_layer = GPT(dataclasses.replace(model_cfg, n_layer=1))
    block = sum(p.numel() for p in one_layer.blocks[0].parameters())
    root = one_layer.num_params() - block
    return root + model_cfg.n_layer * block, block, root


@dataclass
class Plan:
    """Bytes on one GPU at the step's peak, by kind."""
    parallel: str
    gpus: int
    micro_batch: int
    weights: int          # fp32 master weights (this GPU's shard under FSDP)
    gathered: int         # FSDP: weights gathered for computing (the root's, and one to two blocks' or all)
    gradients: int        # fp32 (sharded under FSDP; plus the unsharded accumulation between reductions)
    optimizer: int        # AdamW's two fp32 moments (sharded under FSDP)
    weight_copies: int    # bf16 autocast's copies of the weight matrices, kept for the backward pass
    per_block: int        # activations one block keeps for its backward pass
    per_checkpointed_block: int  # the same with activation checkpointing (its input)
    activations: int      # all blocks', as configured
    loss: int             # the loss's own peak (logits or a chunk of them, their gradients)
    workspace: int        # the largest transient of the backward pass (a block's, a recomputed block's, FSDP's
                          # gradient reduction, the embedding's gradient)

    @property
    def total(self) -> int:
        states = self.weights + self.gathered + self.gradients + self.optimizer + self.weight_copies
        return states + self.activations + max(self.loss, self.workspace)


def plan(model_cfg, cfg, gpus: int, parallel: str | None = None, use_bf16: bool = False,
         micro_batch: int | None = None, loss_impl: str | None = None, grad_accum: int | None = None) -> Plan:
    """The memory of one GPU of a run of model_cfg and cfg (its parallel mode, checkpointing, loss) on `gpus`
    processes; `parallel`, `micro_batch`, `loss_impl` replace the configuration's. `use_bf16`: the run computes in
    bf16 (under autocast, or FSDP's bf16 parameters with fsdp_bf16 = params)."""
    from model import checkpointed_blocks
    parallel = parallel or cfg.parallel
    B = micro_batch or cfg.batch_size
    loss_impl = loss_impl or ("chunked" if cfg.loss == "auto" else cfg.loss)
    if loss_impl in ("liger", "cce"):  # fused kernels: planned as the chunked loss, which holds about as much
        loss_impl = "chunked"
    if grad_accum is None:
        grad_accum = max(1, cfg.global_batch_size // max(1, B * gpus))
    sharded = parallel == "fsdp"
    bf16_params = sharded and use_bf16 and cfg.fsdp_bf16 == "params"
    autocast = use_bf16 and not bf16_params
    L, T, C, V = model_cfg.n_layer, model_cfg.block_size, model_cfg.n_embd, model_cfg.vocab_size
    P, P_block, P_root = parameter_counts(model_cfg)
    shard = gpus if sharded else 1
    weights, optimizer = 4 * P / shard, 8 * P / shard
    accumulating = grad_accum > 1
    if sharded:
        # sharded fp32 gradients; between the micro-batches of a step FSDP accumulates them unsharded (fp32)
        gradients = 4 * P / gpus + (4 * P if accumulating and not cfg.fsdp_reduce_each_micro_batch else 0)
        compute = 2 if bf16_params else 4
        blocks_gathered = 2 if cfg.fsdp_reshard_after_forward else L  # (the next one is gathered ahead)
        gathered = compute * (P_root + blocks_gathered * P_block) if gpus > 1 or compute == 2 else 0
    else:
        gradients, gathered = 4 * P, 0
    copies = L * weight_copy_bytes(model_cfg) if autocast else 0
    cost = block_cost(model_cfg, B, autocast, bf16_params)
    recomputed = set(checkpointed_blocks(cfg.activation_checkpointing, L, cfg.activation_checkpointing_every))
    kept = [cost.checkpointed if i in recomputed else cost.saved for i in range(L)]
    activations = sum(kept)
    loss = probe_loss(model_cfg, B * T, loss_impl, cfg.loss_chunk_tokens, autocast, bf16_params)
    # The backward pass runs from the last block to the first; while block i's runs, blocks 0..i still hold
    # their activations, block i its recomputed ones if it is checkpointed, plus its own transients and, under
    # FSDP, its unsharded gradient before the reduction (and the fp32 copy that is reduced, in bf16). At the end
    # the embedding's gradient is one dense vocabulary x width fp32 tensor. `workspace` is the most of these
    # beyond all the activations.
    own = cost.workspace + (P_block * ((compute + 4) if bf16_params else 4) if sharded and gpus > 1 else 0)
    held = backward = 0
    for i, kept_i in enumerate(kept):
        held += kept_i
        backward = max(backward, held + (cost.saved if i in recomputed else 0) + own)
    workspace = max(0, backward - activations, 4 * V * C - activations)
    return Plan(parallel=parallel, gpus=gpus, micro_batch=B, weights=round(weights), gathered=round(gathered),
                gradients=round(gradients), optimizer=round(optimizer), weight_copies=copies,
                per_block=cost.saved, per_checkpointed_block=cost.checkpointed, activations=activations, loss=loss,
                workspace=workspace)


def generous_bound(model_cfg, cfg, gpus: int) -> float:
    """Bytes that a step on one GPU certainly stays under, from the parameter count alone: the planner is only
    needed where this does not fit (train.py's start-up check). The probes measure 20-40 bytes a token and
    channel for a block's activations and workspace together; this takes 96, 16 bytes a logit for the loss (the
    plain loss holds three fp32 logits tensors at most), and fp32 (B, H, T, T) tensors four times a block for the
    dense attention backend."""
    P, P_block, P_root = parameter_counts(model_cfg)
    B, L, T, C, V = cfg.batch_size, model_cfg.n_layer, model_cfg.block_size, model_cfg.n_embd, model_cfg.vocab_size
    states = 16 * P + 4 * (P_root + 2 * P_block)
    tokens = B * T
    activations = 96 * tokens * max(C, model_cfg.n_head * model_cfg.head_dim) * (L + 1)
    if model_cfg.attn_backend == "dense":
        activations += 16 * B * model_cfg.n_head * T * T * (L + 1)
    logits = tokens if cfg.loss == "plain" else min(tokens, cfg.loss_chunk_tokens)
    return states + activations + 16 * logits * V + 4 * V * C


def largest_micro_batch(model_cfg, cfg, gpus: int, capacity_bytes: float, parallel: str, use_bf16: bool,
                        limit: int = 1 << 16) -> int:
    """The largest micro-batch (sequences) whose plan fits in capacity_bytes, 0 if none does. Every part of a
    plan is affine in the micro-batch once it holds a loss chunk's tokens, so two plans give the candidate, and
    exact plans confirm it (fake tensors cost time by the number of their operations, which grows with it)."""
    def total(batch):
        return plan(model_cfg, cfg, gpus, parallel, use_bf16, micro_batch=batch).total
    if total(1) > capacity_bytes:
        return 0
    first = max(1, math.ceil(cfg.loss_chunk_tokens / model_cfg.block_size))
    a, b = total(first), total(2 * first)
    slope = max(b - a, 1) / first
    guess = min(limit, max(1, int(first + (capacity_bytes - a) / slope)))
    # bracket the answer around the guess (low fits, high does not), then bisect
    step = max(1, guess // 32)
    low, high = guess, guess
    while low > 1 and total(low) > capacity_bytes:
        low, high = max(1, low - step), low
    if high == low:
        while high <= limit and total(high) <= capacity_bytes:
            low, high = high, high + step
    while high - low > 1:
        middle = (low + high) // 2
        low, high = (middle, high) if total(middle) <= capacity_bytes else (low, middle)
    return min(low, limit)


# ----------------------------------------------------------------------------- measuring a real step

class RandomBatches:
    """Micro-batch number i: random token ids seeded by i (what train_step reads through batches.batch(i))."""

    def __init__(self, batch_size: int, block_size: int, vocab_size: int):
        self.shape, self.vocab_size = (batch_size, block_size + 1), vocab_size

    def batch(self, index: int):
        tokens = torch.randint(0, self.vocab_size, self.shape, generator=torch.Generator().manual_seed(index))
        return tokens[:, :-1], tokens[:, 1:]


def state_bytes(model, optimizer) -> int:
    """Bytes of this process's weights (its shards under FSDP), buffers, gradients and optimizer state."""
    from torch.distributed.tensor import DTensor

    def local(t):
        return t.to_local() if isinstance(t, DTensor) else t
    tensors = [local(p) for p in model.parameters()] + [local(p.grad) for p in model.parameters() if p.grad is not None]
    tensors += [b for b in model.buffers()]
    tensors += [local(v) for state in optimizer.state.values() for v in state.values() if isinstance(v, torch.Tensor)]
    return sum({t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors}.values())


def training_steps(model_cfg, cfg, ddp, use_bf16: bool = False):
    """A function step(i) that runs training step i as train.py does (its model set-up and compilation, train_step
    with the config's accumulation, the AdamW step) on random tokens and returns its StepResult; and the model and
    its optimizer."""
    from model import GPT
    from training.layout import bf16_parameters, lay_out, wrapped_for_training
    from training.optimizer import make_optimizer
    from training.step import train_step
    from training.stopping import StopSignals
    torch.manual_seed(cfg.seed)
    model = GPT(model_cfg).to(ddp.device)
    lay_out(model, cfg, ddp, use_bf16)
    optimizer = make_optimizer(model, cfg, ddp.device)
    trained = wrapped_for_training(model, cfg, ddp)
    batches = RandomBatches(cfg.batch_size, model_cfg.block_size, model_cfg.vocab_size)
    grad_accum = cfg.global_batch_size // (cfg.batch_size * ddp.world_size)
    autocast = (lambda: torch.autocast(ddp.device.type, dtype=torch.bfloat16)) \
        if use_bf16 and not bf16_parameters(cfg, use_bf16) else contextlib.nullcontext

    def step(i):
        result = train_step(trained, model, batches, i, grad_accum, cfg, ddp, autocast, StopSignals())
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        return result
    return step, model, optimizer


def measure_peak(model_cfg, cfg, ddp, use_bf16: bool = False, steps: int = 2) -> int:
    """Bytes at the peak of the last of `steps` real training steps (training_steps) on random tokens: on CUDA
    the allocator's maximum; on the CPU what was alive before the step (the weights, the AdamW moments) plus the
    most the step itself held, from the profiler's record of every allocation and free."""
    step, model, optimizer = training_steps(model_cfg, cfg, ddp, use_bf16)
    for i in range(steps - 1):
        step(i)
    if ddp.device.type == "cuda":
        torch.cuda.synchronize(ddp.device)
        torch.cuda.reset_peak_memory_stats(ddp.device)
        step(steps - 1)
        return torch.cuda.max_memory_allocated(ddp.device)
    before = state_bytes(model, optimizer)
    return before + profiled_peak(lambda: step(steps - 1))


def profiled_peak(work) -> int:
    """The most that `work` held at once beyond what was allocated before it, on the CPU, from the profiler's
    record of each allocation and free with the allocator's running total. That total also counts what earlier
    profiled work allocated and still holds (a parameter's .grad), so the peak is taken against its value just
    before the first allocation here."""
    from torch._C._profiler import _EventType
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as recording:
        work()
    # the event tree depth first, children in the order they happened: the allocations in time order
    stack, totals = list(reversed(recording.profiler.kineto_results.experimental_event_tree())), []
    while stack:
        event = stack.pop()
        stack.extend(reversed(event.children))
        if event.tag == _EventType.Allocation and event.extra_fields.device.type == "cpu":
            totals.append((event.extra_fields.total_allocated, event.extra_fields.alloc_size))
    if not totals:
        return 0
    before = totals[0][0] - totals[0][1]
    return max(0, max(total for total, _ in totals) - before)


# ----------------------------------------------------------------------------- the command line

def gb(n: float) -> str:
    return f"{n / GiB:,.2f}"


def table(model_cfg, cfg, gpus: int, gpu_memory_gb: float, use_bf16: bool) -> str:
    plans = {mode: plan(model_cfg, cfg, gpus, mode, use_bf16) for mode in ("ddp", "fsdp")}
    rows = [("weights (fp32 master)", "weights"), ("weights gathered for compute", "gathered"),
            ("gradients", "gradients"), ("AdamW moments", "optimizer"), ("bf16 weight copies (autocast)",
                                                                        "weight_copies"),
            ("activations, one block", "per_block"), ("activations, one checkpointed block", "per_checkpointed_block"),
            ("activations, all blocks as configured", "activations"), ("logits / loss peak", "loss"),
            ("workspace (backward transients)", "workspace")]
    lines = [f"{'GiB per GPU':<40} {'ddp':>10} {'fsdp':>10}"]
    lines += [f"{label:<40} {gb(getattr(plans['ddp'], key)):>10} {gb(getattr(plans['fsdp'], key)):>10}"
              for label, key in rows]
    lines.append(f"{'total at the peak':<40} {gb(plans['ddp'].total):>10} {gb(plans['fsdp'].total):>10}")
    capacity = gpu_memory_gb * GiB
    fit = {mode: largest_micro_batch(model_cfg, cfg, gpus, capacity, mode, use_bf16) for mode in plans}
    lines.append(f"{'largest micro-batch that fits':<40} {fit['ddp']:>10} {fit['fsdp']:>10}")
    return "\n".join(lines)


def main(argv=None) -> None:
    from config import ConfigError, read_toml, resolve
    from model import GPTConfig
    from training.step import process_counts, split_batch
    parser = argparse.ArgumentParser(prog="python -m training.memory", allow_abbrev=False, description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("config", metavar="CONFIG", help="a config file of train.py (configs/...)")
    parser.add_argument("--gpus", type=int, default=8, help="processes (GPUs) the run uses (default 8)")
    parser.add_argument("--gpu-memory", type=float, default=80.0, metavar="GB",
                        help="memory of one GPU in GiB (default 80)")
    parser.add_argument("--dtype", choices=("bf16", "fp32"), default="bf16",
                        help="the run's precision on the GPUs (default bf16, what dtype = auto gives on CUDA)")
    args, overrides = parser.parse_known_args(argv)
    if args.gpus < 1:
        parser.error(f"--gpus must be at least 1 (got {args.gpus})")
    if not math.isfinite(args.gpu_memory) or args.gpu_memory <= 0:
        parser.error(f"--gpu-memory must be a positive number of GiB, such as 80 (got {args.gpu_memory:g})")
    try:
        if os.path.isfile(args.config) and not args.config.endswith(".json"):  # (a run's config.json has every key)
            merged = read_toml(args.config)
            if not any(merged.values()):
                raise ConfigError(f"config file {args.config} sets no key of [model] or [train] (with its includes), "
                                  "so there is no run to plan, only the defaults; name a config file of train.py, "
                                  "such as configs/quickstart.toml")
        model_cfg, cfg = resolve(args.config, overrides, GPTConfig)
        try:  # the micro-batch train.py would run on that many processes, or its refusal
            micro, _ = split_batch(cfg.global_batch_size, cfg.batch_size, args.gpus)
        except ValueError as problem:
            raise ConfigError(f"{problem}, so train.py would refuse this run; plan it on "
                              f"{process_counts(cfg.global_batch_size, args.gpus)} GPUs (a number that divides "
                              f"{cfg.global_batch_size}) or change --global_batch_size.") from None
        cfg = dataclasses.replace(cfg, batch_size=micro)
    except ConfigError as error:
        print(f"error: {error}", file=sys.stderr)
        sys.exit(2)
    P, _, _ = parameter_counts(model_cfg)
    print(f"{args.config}: {P / 1e6:,.0f}M parameters, micro-batch {cfg.batch_size} x {model_cfg.block_size} tokens, "
          f"{args.gpus} GPUs of {args.gpu_memory:g} GiB, {args.dtype}, activation checkpointing "
          f"{cfg.activation_checkpointing}, loss {cfg.loss}" + (f" (chunks of {cfg.loss_chunk_tokens} tokens)" if
                                                              cfg.loss in ("auto", "chunked") else ""))
    print(table(model_cfg, cfg, args.gpus, args.gpu_memory, args.dtype == "bf16"))


if __name__ == "__main__":
    main()
