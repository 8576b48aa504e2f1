"""What several test files share: a tiny byte-level model's config file and a corpus prepared for it
(the fixture `one_thread` is in conftest.py)."""
import json
import math
import os
import random
import subprocess
import sys

import torch
from hypothesis import strategies as st

from model import GPT, GPTConfig

# A 2-layer, 32-wide model on byte tokens (vocabulary 256 + specials < 320) and a few steps of training.
TINY_MODEL = dict(n_layer=2, n_head=2, n_embd=32, head_dim=16, vocab_size=320, block_size=32)
TINY_TRAIN = dict(batch_size=4, global_batch_size=4, max_iters=6, lr=1e-2, min_lr=1e-3, warmup_iters=2,
                  log_interval=1, eval_interval=0, eval_windows=8, ckpt_interval=0, device="cpu")
# A small model whose training step's memory the planner is checked against (tests/test_memory.py, test_fsdp.py):
# overrides of configs/quickstart.toml.
SMALL = ["--n_layer=3", "--n_head=2", "--n_embd=64", "--head_dim=32", "--block_size=128", "--batch_size=4",
         "--global_batch_size=8", "--vocab_size=512", "--device=cpu"]


def tiny_config(data_dir, model=None, **train) -> str:
    """The TOML text of the tiny model trained on data_dir: `model` overrides [model] keys, keyword
    arguments override [train] keys."""
    def section(values):
        return "\n".join(f"{key} = {json.dumps(value)}" for key, value in values.items())
    return (f"[model]\n{section({**TINY_MODEL, **(model or {})})}\n\n"
            f"[train]\n{section({'data_dir': str(data_dir), **TINY_TRAIN, **train})}\n")


def synthetic_text(seed: int, n_words: int) -> str:
    """English-like text from a small vocabulary: a byte model can learn its words quickly."""
    rng = random.Random(seed)
    words = ("the model reads every token and learns which word comes next in a sentence about "
             "positions rotations gates and biases of attention heads").split()
    sentences = []
    while n_words > 0:
        length = rng.randint(4, 12)
        sentences.append(" ".join(rng.choice(words) for _ in range(length)).capitalize() + ".")
        n_words -= length
    return " ".join(sentences)


def prepare_byte_corpus(root, texts, *, val_tokens=4096, shard_tokens=50_000) -> str:
    """Write texts as root/corpus.jsonl, prepare it with the byte tokenizer into root/prepared; its path."""
    from data.prepare import files_source, prepare
    with open(root / "corpus.jsonl", "w") as f:
        for text in texts:
            f.write(json.dumps({"text": text}) + "\n")
    out = root / "prepared"
    prepare(files_source(str(root / "corpus.jsonl")), str(out), tokenizer="byte", val_tokens=val_tokens,
            shard_tokens=shard_tokens, workers=1, progress_bar=False)
    return str(out)


def synthetic_corpus(root, n_docs: int, n_words: int, **prepare_options) -> str:
    """n_docs documents of synthetic_text, n_words each, prepared with the byte tokenizer under root; its path."""
    return prepare_byte_corpus(root, [synthetic_text(doc, n_words) for doc in range(n_docs)], **prepare_options)


def write_position_shards(folder, sizes, val_first: int, val_tokens: int) -> str:
    """A byte-tokenizer shard folder with its manifest in which every train token is its own global position
    (shards of the given sizes, in order), so a window read back shows where it came from; the validation shard
    holds val_first, val_first + 1, ... (val_tokens of them)."""
    import numpy as np

    from data import verify
    from data.shards import write_shard
    write_shard(os.path.join(folder, "val_000000.bin"), np.arange(val_first, val_first + val_tokens))
    shards, start = [{"file": "val_000000.bin", "split": "val", "tokens": val_tokens}], 0
    for i, n in enumerate(sizes):
        name = f"train_{i + 1:06d}.bin"
        write_shard(os.path.join(folder, name), np.arange(start, start + n))
        shards.append({"file": name, "split": "train", "tokens": n})
        start += n
    for shard in shards:
        shard["sha256"] = verify.hash_and_max(os.path.join(folder, shard["file"]))[0]
    with open(os.path.join(folder, "manifest.json"), "w") as f:
        json.dump({"tokenizer": "byte", "shards": shards}, f)
    return str(folder)


def tiny_model_logits_and_grads(pos, kv_shift, backend, wrap=lambda model: model, **config):
    """A 1-layer model's logits on 21 tokens at start position 3 and every parameter's gradient of the
    loss, with its positional parameters moved off their init (so each one matters). config: more GPTConfig
    values (e.g. n_head, n_kv_head, window)."""
    import torch
    from model import GPT, GPTConfig
    torch.manual_seed(0)
    model = GPT(GPTConfig(**{**dict(n_layer=1, n_head=2, n_embd=32, head_dim=16, vocab_size=29, block_size=24,
                                    pos=pos, kv_shift=kv_shift, attn_backend=backend), **config}))
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "bias." in name or "kv_shift" in name:
                p.add_(0.3 * torch.randn(p.shape, generator=torch.Generator().manual_seed(5)))
    idx = torch.randint(0, 29, (2, 21), generator=torch.Generator().manual_seed(1))
    logits, loss = wrap(model)(idx, idx, start_pos=3)
    loss.backward()
    return logits.detach(), {n: p.grad.clone() for n, p in model.named_parameters()}


def run_under_triton_interpreter(test_file, path):
    """Run `python test_file path` with TRITON_INTERPRET=1 and return what it saved to path.
    TRITON_INTERPRET must be set before triton itself is imported (its own library functions are decorated
    at import), so interpreted kernels run in a child process; the comparisons happen in the parent."""
    import importlib.util
    import os
    import subprocess
    import sys

    import pytest
    import torch
    if importlib.util.find_spec("triton") is None:
        pytest.skip("triton is not installed")
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    env = dict(os.environ, TRITON_INTERPRET="1", PYTHONPATH=root + os.pathsep + os.environ.get("PYTHONPATH", ""))
    child = subprocess.run([sys.executable, os.path.abspath(test_file), str(path)], cwd=root, env=env,
                           capture_output=True, text=True, timeout=900)
    assert child.returncode == 0, f"the interpreted Triton kernels failed:\n{child.stderr[-4000:]}"
    return torch.load(path)


def examples(n):
    """hypothesis settings for a test whose examples are costly: n examples under the CI profile, 20x as many under
    `--hypothesis-profile=long` (conftest.py)."""
    from hypothesis import settings
    return settings(max_examples=n * 20 if settings().max_examples > 100 else n)


def poisoned_allocations(value: float):
    """A context in which torch.empty and torch.empty_like fill every floating-point tensor with `value` (NaN, -inf):
    a kernel that reads scratch or output memory no program wrote then fails the comparison, where fresh memory
    (often zeros) would hide it."""
    import contextlib

    import torch

    @contextlib.contextmanager
    def context():
        empty, empty_like = torch.empty, torch.empty_like

        def fill(tensor):
            return tensor.fill_(value) if tensor.is_floating_point() else tensor
        torch.empty = lambda *a, **kw: fill(empty(*a, **kw))
        torch.empty_like = lambda *a, **kw: fill(empty_like(*a, **kw))
        try:
            yield
        finally:
            torch.empty, torch.empty_like = empty, empty_like
    return context()


def flash_attention_bf16(q, k, v, bias, scale: float, grad_out):
    """FlashAttention's arithmetic in bf16, emulated in PyTorch on bf16 q, k, v: the bf16 floor a bf16 attention
    kernel is judged against. Logits scale·q·kᵀ + bias in fp32 (bf16 products are exact in fp32), softmax in fp32, P
    rounded to bf16 for P·v, the output rounded to bf16; backward with D = rowsum(dO·O) of the rounded O, dS =
    P∘(dO·vᵀ - D) in fp32 and rounded to bf16 for dQ and dK, P rounded for dV, gradients rounded to bf16.
    bias: (Tq, Tk) or broadcastable, -inf where masked. Returns (out, dq, dk, dv) in fp64."""
    import torch
    bf16 = torch.bfloat16
    q, k, v, grad_out = (x.to(bf16).float() for x in (q, k, v, grad_out))
    logits = scale * q @ k.transpose(-1, -2) + bias.float()
    lse = torch.logsumexp(logits, -1, keepdim=True)
    probs = torch.exp(logits - lse)
    low = probs.to(bf16).float()
    out = (low @ v).to(bf16).float()
    delta = (grad_out * out).sum(-1, keepdim=True)
    d_logits = probs * (grad_out @ v.transpose(-1, -2) - delta)
    d_low = d_logits.to(bf16).float()
    grads = [scale * d_low @ k, scale * d_low.transpose(-1, -2) @ q, low.transpose(-1, -2) @ grad_out]
    return [out.double()] + [g.to(bf16).double() for g in grads]


def model_grads(pos, loss_impl="plain", checkpointing="none", dtype=torch.float32):
    torch.manual_seed(0)
    model = GPT(GPTConfig(n_layer=3, n_head=2, n_embd=32, head_dim=16, vocab_size=300, block_size=24, pos=pos,
                          kv_shift=pos == "fox")).to(dtype)
    model.loss_impl, model.loss_chunk_tokens = loss_impl, 10
    model.set_activation_checkpointing(checkpointing, 2)
    idx = torch.randint(0, 300, (3, 24), generator=torch.Generator().manual_seed(1))
    targets = idx.roll(-1, 1)
    targets[0, :5] = -1
    logits, loss = model(idx, targets)
    loss.backward()
    return logits, loss.detach(), {n: p.grad for n, p in model.named_parameters()}


any_seconds = st.one_of(st.floats(min_value=0, max_value=1e8, allow_nan=False),
                    st.integers(0, 10**8).map(float),
                    st.sampled_from([59.4, 59.5, 59.6, 60.0, 3599.4, 3599.5, 3600.0, 3660.0, 86399.5, 86400.0]))


def down(x):
    return math.nextafter(x, -math.inf)


def up(x):
    return math.nextafter(x, math.inf)


def same_payload(a, b) -> bool:
    """Independent of the checksum code: every tensor equal bit for bit (dtype and shape too), every other value
    equal and of the same type, through nested dicts, lists and tuples."""
    if isinstance(a, torch.Tensor):
        return isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape and torch.equal(a, b)
    if isinstance(a, dict):
        return isinstance(b, dict) and a.keys() == b.keys() and all(same_payload(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return type(a) is type(b) and len(a) == len(b) and all(map(same_payload, a, b))
    return type(a) is type(b) and a == b


class ProcessJob:
    """`world_size` processes of one job started by hand as torchrun would (RANK, LOCAL_RANK, WORLD_SIZE), running
    `python -c script *args` with stdout and stderr captured, and the job's TCP store served by this process for the
    job's whole life, as torchrun's agent serves it (TORCHELASTIC_USE_AGENT_STORE: every process joins as a client).
    A port found free by binding port 0, released and bound again by the job's main process seconds later can in
    between become another socket's ephemeral port (a listener or a connection of another job started at the same
    time), and a process then joins the wrong job's sockets; here the port stays bound from before the first process
    starts. Output goes to files, not pipes: a test waits for one process at a time (of two jobs, even), and a pipe
    nobody reads meanwhile fills at 64 KiB and stops its writer in the middle of a print, which to the other process
    is a peer that stopped responding. (A suspect, not a proven cause, for a CI run in which both processes of one
    job of test_fsdp.py's kill-during-a-sharded-save test waited out the 300 s collective timeout.)"""

    def __init__(self, script: str, args: list[str], env: dict, cwd: str, world_size: int = 2):
        import tempfile
        from torch.distributed import TCPStore
        self.store = TCPStore("127.0.0.1", 0, world_size=None, is_master=True, wait_for_workers=False)
        job = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(self.store.port), "TORCHELASTIC_USE_AGENT_STORE": "True",
               "WORLD_SIZE": str(world_size)}
        self.outputs = [(tempfile.TemporaryFile("w+"), tempfile.TemporaryFile("w+")) for _ in range(world_size)]
        self.procs = [subprocess.Popen([sys.executable, "-c", script, *args], cwd=cwd,
                                       env={**env, **job, "RANK": str(r), "LOCAL_RANK": str(r)},
                                       stdout=self.outputs[r][0], stderr=self.outputs[r][1], text=True)
                      for r in range(world_size)]
        self.stderr = [None] * world_size

    def _read_stderr(self, rank: int) -> str:
        err = self.outputs[rank][1]
        err.seek(0)
        return err.read()

    def wait(self, rank: int, timeout: float) -> str:
        """Process `rank`'s stderr, once it has ended."""
        self.procs[rank].wait(timeout=timeout)
        self.stderr[rank] = self._read_stderr(rank)
        return self.stderr[rank]

    def returncodes(self) -> list:
        return [proc.returncode for proc in self.procs]

    def report(self) -> str:
        """Every process's return code and the end of its stderr, for a failed assertion's message."""
        return "\n".join(f"--- process {r}, return code {proc.returncode}:\n{(self.stderr[r] or '')[-2000:]}"
                         for r, proc in enumerate(self.procs))

    def kill(self) -> None:
        for rank, proc in enumerate(self.procs):
            proc.kill()
            proc.wait()
            if self.stderr[rank] is None:
                self.stderr[rank] = self._read_stderr(rank)
            for file in self.outputs[rank]:
                file.close()


def unwritable(monkeypatch, folder):
    """Makes `folder` refuse new files, as an immutable or read-only folder does (tests may run as root, to whom
    chmod is no obstacle): the write probe of eval/outputs.py and every open for writing in it fail with EPERM."""
    import builtins
    import errno
    import tempfile
    folder = os.path.abspath(folder)
    probe, real_open = tempfile.NamedTemporaryFile, builtins.open

    def refusing_probe(*args, dir=None, **kwargs):
        if dir is not None and os.path.abspath(dir) == folder:
            raise PermissionError(errno.EPERM, "Operation not permitted", os.path.join(dir, ".write_probe_x"))
        return probe(*args, dir=dir, **kwargs)

    def refusing_open(file, mode="r", *args, **kwargs):
        if any(m in mode for m in "wax") and os.path.dirname(os.path.abspath(file)) == folder:
            raise PermissionError(errno.EPERM, "Operation not permitted", file)
        return real_open(file, mode, *args, **kwargs)
    monkeypatch.setattr(tempfile, "NamedTemporaryFile", refusing_probe)
    monkeypatch.setattr(builtins, "open", refusing_open)


def refused_out_message(out, locked, below, what="the results", option="--out"):
    """eval/outputs.check_writable's sentence for `out` in (below) or at a folder `locked` that refuses new files."""
    if below:
        return (f"cannot make the folder {out} for {what} (Operation not permitted in {locked}); choose a writable "
                f"{option} (or make {locked} writable)")
    return (f"cannot write {what} to {out} (Operation not permitted); choose a writable {option} (or make that "
            "directory writable)")


def full_disk(monkeypatch, folder):
    """Makes every file opened for writing under `folder` fail as a full disk does, after a few bytes."""
    import builtins
    import errno
    real_open, folder = builtins.open, os.path.abspath(folder)

    class FullDisk:
        def __init__(self, file):
            self.file = file

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self.file.close()

        def write(self, text):
            self.file.write(text[:10])
            raise OSError(errno.ENOSPC, "No space left on device")

    def full_disk_open(file, mode="r", *args, **kwargs):
        opened = real_open(file, mode, *args, **kwargs)
        return FullDisk(opened) if "w" in mode and os.path.abspath(file).startswith(folder + os.sep) else opened
    monkeypatch.setattr(builtins, "open", full_disk_open)


def run_with_non_finite_weight(run_dir, value: float, pos="fox", step=7) -> str:
    """A run directory whose ckpt.pt (a tiny byte model, its checksum valid) holds `value` (NaN or an infinity) in one
    element of a weight in the middle of the state dict, not the first; returns the sentence that names it, as
    checkpoints.non_finite describes it."""
    from eval.tiny import save_run, tiny_model

    model = tiny_model(pos=pos, block_size=32, seed=2)
    names = [name for name, tensor in model.state_dict().items() if tensor.is_floating_point()]
    name = names[len(names) // 2]
    with torch.no_grad():
        model.state_dict()[name].view(-1)[3] = value
    save_run(model, run_dir, step=step)
    kind = "NaN" if math.isnan(value) else "infinite"
    return f"is damaged: its tensor {name} (1 {kind} of {model.state_dict()[name].numel():,} values) is not finite"
