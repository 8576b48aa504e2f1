"""train.parallel = "fsdp" against DDP, and sharded checkpoints: a kill -9 between the shard writes and the commit,
resume on another number of processes, damage, and the readers of a sharded run directory.

Two torchrun launches (4 and 2 gloo processes on the CPU, tests/distributed_runs.py) hold every multi-process run;
the references run in this process. The tiny model trains 20 steps with gradient accumulation (2 micro-batches a
step under FSDP, 8 in the 1-process reference) and clipping active at every step (grad_clip 0.3, below every
step's norm), and one pair without clipping (grad_clip 0, a branch of its own under FSDP). The faults of a sharded
save (a full disk, an unwritable directory, a process killed during it) and shards whose ckpt.pt is gone are here too.
"""
import json
import os
import pickle
import re
import shutil
import signal
import subprocess
import sys
import textwrap

import pytest
import torch

import checkpoints
import train
from config import ConfigError
from data.loader import validation_batches
from model import GPT
from checkpoints import load_gpt
from tests.helpers import SMALL, ProcessJob, synthetic_corpus, tiny_config
from training.errors import TrainError

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
pytestmark = pytest.mark.usefixtures("one_thread")
ENCODINGS = ("rope", "fox", "grape_ap")
TRAIN = dict(max_iters=20, warmup_iters=4, global_batch_size=8, batch_size=1, grad_clip=0.3, eval_interval=10,
             eval_windows=8)
FP32_ROUNDING = 1e-5  # relative: what summing the same gradients in another order changes over 20 steps
QUICKSTART = os.path.join(REPO, "configs", "quickstart.toml")
# planned against measured under FSDP with 2 processes (the 1-process cases are in test_memory.py)
PLANNED_FSDP = [
    (["--parallel=fsdp"], "fsdp rope"),
    (["--parallel=fsdp", "--pos=fox", "--activation_checkpointing=blocks"], "fsdp fox, every block recomputed"),
    (["--parallel=fsdp", "--pos=grape_ap", "--fsdp_reshard_after_forward=false"], "fsdp grape_ap, kept gathered"),
    (["--parallel=fsdp", "--vocab_size=8192", "--loss=plain", "--fsdp_reduce_each_micro_batch"],
     "fsdp plain loss, sharded accumulation"),
    (["--parallel=ddp", "--pos=fox", "--kv_shift"], "ddp fox+kv_shift"),
]


def launch(processes: int, plan: dict, root) -> subprocess.CompletedProcess:
    path = root / f"plan{processes}.json"
    path.write_text(json.dumps(plan))
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone",
                           f"--nproc_per_node={processes}", os.path.join(REPO, "tests", "distributed_runs.py"),
                           str(path)], cwd=REPO, env=env, capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("fsdp")
    data_dir = synthetic_corpus(root, 40, 800)
    config = root / "tiny.toml"
    config.write_text(tiny_config(data_dir, **TRAIN))
    config = str(config)
    torch.set_num_threads(1)
    # the reference: DDP's code path on one process, 8 micro-batches a step
    reference = {pos: train.run([config, f"--pos={pos}", f"--out_dir={root / 'ddp1' / pos}"]) for pos in ENCODINGS}
    unclipped = train.run([config, "--pos=rope", "--grad_clip=0", f"--out_dir={root / 'ddp1_unclipped'}"])
    # a DDP checkpoint at step 10, resumed under FSDP by 2 processes below
    train.run([config, "--pos=fox", f"--out_dir={root / 'ddp_then_fsdp'}", "--stop_iter=10"])

    def fsdp(pos, out, *more):
        return [config, f"--pos={pos}", "--parallel=fsdp", f"--out_dir={root / out}", *more]

    four = launch(4, {"runs": [fsdp(pos, f"fsdp4/{pos}") for pos in ENCODINGS], "results": str(root / "four.json"),
                      "kill_run": fsdp("fox", "killed", "--ckpt_interval=4"), "kill_at_save": 2}, root)
    killed = root / "killed"
    shutil.copytree(killed, root / "killed_as_left")
    shutil.copytree(killed, root / "resumed_by_1")
    two = launch(2, {"runs": [fsdp(pos, f"fsdp2/{pos}", "--batch_size=2") for pos in ENCODINGS]
                     + [fsdp("fox", "killed", "--batch_size=2", "--resume"),
                        fsdp("fox", "fsdp2_checkpointed", "--batch_size=2", "--activation_checkpointing=blocks"),
                        fsdp("rope", "fsdp2_reduce_each", "--batch_size=2", "--fsdp_reduce_each_micro_batch"),
                        fsdp("fox", "ddp_then_fsdp", "--batch_size=2", "--resume"),
                        fsdp("rope", "fsdp2_unclipped", "--batch_size=2", "--grad_clip=0"),
                        fsdp("fox", "fsdp2_stopped_at_10", "--batch_size=2", "--stop_iter=10")],
                     "measure": [[QUICKSTART, *SMALL, *overrides] for overrides, _ in PLANNED_FSDP],
                     "results": str(root / "two.json")}, root)
    assert two.returncode == 0, two.stderr[-3000:]
    # one process under DDP: the shards of 4 processes resumed by a model that is not sharded
    by_1 = train.run([config, "--pos=fox", "--parallel=ddp", f"--out_dir={root / 'resumed_by_1'}", "--resume"])
    with open(root / "four.json") as f:
        four_results = dict(zip(ENCODINGS, json.load(f)["runs"]))
    with open(root / "two.json") as f:
        two_results = json.load(f)
    runs = two_results["runs"]
    return {"root": root, "config": config, "data_dir": data_dir, "reference": reference, "four": four,
            "fsdp4": four_results, "fsdp2": dict(zip(ENCODINGS, runs[:3])), "resumed_by_2": runs[3],
            "checkpointed": runs[4], "reduce_each": runs[5], "ddp_then_fsdp": runs[6], "resumed_by_1": by_1,
            "unclipped_reference": unclipped, "unclipped": runs[7], "memory": two_results["memory"]}


def logged(run_dir, kind="train", key="loss"):
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        return [r[key] for r in map(json.loads, f) if r["type"] == kind]


@pytest.mark.parametrize("processes", [2, 4])
def test_fsdp_gives_the_losses_and_grad_norms_of_ddp(runs, processes):
    for pos in ENCODINGS:
        reference, fsdp = runs["reference"][pos], runs[f"fsdp{processes}"][pos]
        assert reference["grad_accum"] == 8 and fsdp["grad_accum"] == 2
        ref_norms = logged(runs["root"] / "ddp1" / pos, key="grad_norm")
        assert min(ref_norms) > TRAIN["grad_clip"]  # clipping acts at every step
        assert len(fsdp["losses"]) == 20
        assert fsdp["losses"] == pytest.approx(reference["losses"], rel=FP32_ROUNDING), pos
        # the logged norm is the whole gradient's, not a shard's (a shard's would be ~1/sqrt(processes) of it)
        assert fsdp["grad_norms"] == pytest.approx(ref_norms, rel=1e-4), pos
    # validation, its windows shared out in lockstep, scores what one process scores
    fox_val = logged(runs["root"] / f"fsdp{processes}" / "fox", "val", "val_loss")
    assert fox_val == pytest.approx([v for _, v in runs["reference"]["fox"]["val_losses"]], rel=FP32_ROUNDING)
    assert len(fox_val) == 3


def test_fsdp_without_clipping_gives_the_losses_and_grad_norms_of_ddp(runs):
    """grad_clip = 0 takes a branch of its own under FSDP (the whole gradient's norm from the shards, nothing clipped;
    DDP clips to an infinite norm), which the comparisons above, all clipping, never reach."""
    reference, fsdp = runs["unclipped_reference"], runs["unclipped"]
    ref_norms = logged(runs["root"] / "ddp1_unclipped", key="grad_norm")
    assert len(fsdp["losses"]) == 20 and min(ref_norms) > TRAIN["grad_clip"]  # each step one that clipping cuts
    assert fsdp["losses"] == pytest.approx(reference["losses"], rel=FP32_ROUNDING)
    assert fsdp["grad_norms"] == pytest.approx(ref_norms, rel=1e-4)
    clipped = runs["fsdp2"]["rope"]["losses"]  # the same run clipped at 0.3: clipping off changed the losses
    assert max(abs(a - b) / b for a, b in zip(fsdp["losses"], clipped)) > 100 * FP32_ROUNDING


@pytest.mark.parametrize("case", range(len(PLANNED_FSDP)), ids=[case for _, case in PLANNED_FSDP])
def test_planned_peak_of_fsdp_with_2_processes_is_within_15_percent_of_the_measured(runs, case):
    peak = runs["memory"][case]
    assert peak["planned"] == pytest.approx(peak["measured"], rel=0.15), PLANNED_FSDP[case]


def test_reducing_each_micro_batch_gives_the_same_losses(runs):
    """FSDP's sharded accumulation (a reduce-scatter per micro-batch) against its default (one per step)."""
    assert runs["reduce_each"]["losses"] == pytest.approx(runs["fsdp2"]["rope"]["losses"], rel=FP32_ROUNDING)
    assert runs["reduce_each"]["grad_norms"] == pytest.approx(runs["fsdp2"]["rope"]["grad_norms"], rel=1e-4)


def test_activation_checkpointing_under_fsdp_gives_the_same_losses(runs):
    assert runs["checkpointed"]["losses"] == pytest.approx(runs["fsdp2"]["fox"]["losses"], rel=1e-6)
    assert runs["checkpointed"]["grad_norms"] == pytest.approx(runs["fsdp2"]["fox"]["grad_norms"], rel=1e-6)


def test_a_kill_before_the_commit_leaves_the_previous_checkpoint_whole(runs):
    assert runs["four"].returncode != 0  # the main process died by SIGKILL at its second checkpoint
    left = runs["root"] / "killed_as_left"
    ckpt = checkpoints.load(str(left / "ckpt.pt"), required=("model_config",), assemble=False)
    assert ckpt["step"] == 4 and ckpt["shards"]["world_size"] == 4
    # both steps' shards are on disk, all of step 8's written, but ckpt.pt names only step 4's
    directories = sorted(os.listdir(left / checkpoints.SHARDS_DIR))
    assert [d.split("-")[0] for d in directories] == ["00000004", "00000008"]
    assert ckpt["shards"]["dir"] == os.path.join(checkpoints.SHARDS_DIR, directories[0])
    assert {"__0_0.distcp", "__3_0.distcp", ".metadata"} <= set(ckpt["shards"]["files"])
    assert checkpoints.unreferenced_shard_directories(str(left)) == [str(left / checkpoints.SHARDS_DIR / directories[1])]
    checkpoints.verify_shards(str(left / "ckpt.pt"), ckpt)  # every shard of step 4 is as written


@pytest.mark.parametrize("processes", [2, 1])
def test_resume_on_another_number_of_processes_continues_the_losses(runs, processes):
    """Saved by 4 processes at step 4 (then killed at step 8), resumed by 2 under FSDP and by 1 under DDP."""
    resumed = runs[f"resumed_by_{processes}"]
    uninterrupted = runs["fsdp4"]["fox"]["losses"]
    assert len(resumed["losses"]) == 16 and resumed["step"] == 20
    assert resumed["losses"] == pytest.approx(uninterrupted[4:], rel=FP32_ROUNDING)
    run_dir = runs["root"] / ("killed" if processes == 2 else "resumed_by_1")
    # the uncommitted step-8 shards were removed at the start; the last save's are the only ones left (under DDP
    # the last save is one file, and the step-4 shards it replaced are gone too)
    assert [d.split("-")[0] for d in os.listdir(run_dir / checkpoints.SHARDS_DIR)] == \
        (["00000020"] if processes == 2 else [])
    assert ("shards" in checkpoints.load(str(run_dir / "ckpt.pt"), required=(), assemble=False)) == (processes == 2)
    assert logged(run_dir, key="iter") == list(range(1, 21))  # metrics.jsonl trimmed to the checkpoint


def test_a_ddp_checkpoint_resumes_under_fsdp(runs):
    """One process under DDP saved a single-file checkpoint at step 10; 2 processes under FSDP continue it with
    the uninterrupted 1-process run's losses, and their checkpoint is sharded."""
    resumed = runs["ddp_then_fsdp"]
    assert resumed["step"] == 20 and len(resumed["losses"]) == 10
    assert resumed["losses"] == pytest.approx(runs["reference"]["fox"]["losses"][10:], rel=FP32_ROUNDING)
    ckpt = checkpoints.load(str(runs["root"] / "ddp_then_fsdp" / "ckpt.pt"), required=(), assemble=False)
    assert ckpt["shards"]["world_size"] == 2


def test_readers_take_a_sharded_run_directory_as_it_is(runs):
    """checkpoints.load_gpt (sample.py, the evaluations, export_hf.py, init_from) assembles the weights that 4
    processes saved in shards; their validation loss, computed here by a plain forward pass, is the one the run
    logged at its last step."""
    run_dir = runs["root"] / "fsdp4" / "fox"
    model, ckpt = load_gpt(str(run_dir))
    assert ckpt["step"] == 20 and "shards" in ckpt
    with torch.no_grad():
        total = windows = 0
        for x, y in validation_batches(runs["data_dir"], batch_size=1, block_size=32, max_windows=8):
            total += model(x, y)[1].item() * len(x)
            windows += len(x)
    assert total / windows == pytest.approx(logged(run_dir, "val", "val_loss")[-1], rel=1e-6)
    # the same weights as the 1-process run's single file, to fp32 rounding
    single, _ = load_gpt(str(runs["root"] / "ddp1" / "fox"))
    for (name, a), b in zip(model.state_dict().items(), single.state_dict().values()):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5, msg=name)


def test_export_hf_takes_a_sharded_run_directory(runs, tmp_path):
    """scripts/export_hf.py's export of the 4-process sharded run against its export of the 1-process run's
    single file: the same tensors to fp32 rounding."""
    from safetensors.torch import load_file
    from hf.export import export
    exported = {}
    for name, run_dir in (("sharded", runs["root"] / "fsdp4" / "fox"), ("single", runs["root"] / "ddp1" / "fox")):
        export(str(run_dir), str(tmp_path / name), "remote")
        exported[name] = load_file(str(tmp_path / name / "model.safetensors"))
    assert exported["sharded"].keys() == exported["single"].keys() and len(exported["single"]) > 10
    for key, tensor in exported["single"].items():
        torch.testing.assert_close(exported["sharded"][key], tensor, rtol=1e-4, atol=1e-5, msg=key)


def test_a_damaged_or_missing_shard_is_refused_in_one_sentence(runs, tmp_path):
    run_dir = tmp_path / "damaged"
    shutil.copytree(runs["root"] / "fsdp2" / "rope", run_dir)
    ckpt = checkpoints.load(str(run_dir / "ckpt.pt"), required=(), assemble=False)
    shard = os.path.join(checkpoints.shard_directory(str(run_dir / "ckpt.pt"), ckpt), "__1_0.distcp")
    with open(shard, "r+b") as f:  # one flipped byte inside a tensor
        f.seek(os.path.getsize(shard) // 2)
        byte = f.read(1)
        f.seek(-1, 1)
        f.write(bytes([byte[0] ^ 0xFF]))
    with pytest.raises(checkpoints.CheckpointError, match=r"1 of the \d+ shard files .* are not as written "
                                                          r"\(__1_0\.distcp \(its contents do not match"):
        load_gpt(str(run_dir))
    with pytest.raises(TrainError, match=r"__1_0\.distcp \(its contents do not match its checksum\)"):
        train.run([runs["config"], "--pos=rope", "--parallel=fsdp", f"--out_dir={run_dir}", "--resume"])
    os.remove(shard)
    with pytest.raises(checkpoints.CheckpointError, match=r"__1_0\.distcp \(missing\)"):
        load_gpt(str(run_dir))
    shutil.rmtree(checkpoints.shard_directory(str(run_dir / "ckpt.pt"), ckpt))
    with pytest.raises(TrainError, match="is sharded, but its shard directory .* is missing"):
        train.run([runs["config"], "--pos=rope", "--parallel=fsdp", f"--out_dir={run_dir}", "--resume"])


def test_bf16_policy_gathers_the_matrices_in_bf16_and_keeps_positional_parameters_fp32():
    """FSDP's bf16 mixed precision: the weight matrices and the embedding compute in bf16, the norms and the
    encodings' own parameters (here GRAPE-AP's path projection and KV-shift's gates) in fp32, as under autocast;
    the master weights and the reduced gradients stay fp32. A group of one process, made by Distributed."""
    from model import GPTConfig
    from training.distributed import Distributed
    config = GPTConfig(n_layer=2, n_head=2, n_embd=32, head_dim=16, vocab_size=64, block_size=16, pos="grape_ap",
                       kv_shift=True)
    idx = torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(0))
    torch.manual_seed(0)
    fp32_loss = GPT(config)(idx, idx)[1].item()
    ddp = Distributed("cpu", 60, "fsdp")
    try:
        torch.manual_seed(0)
        model = GPT(config)
        ddp.shard(model, bf16_params=True, reshard_after_forward=True, compile_blocks=False)
        block, seen = model.blocks[1], {}
        watched = {"qkv": block.attn.qkv, "mlp.up": block.mlp.up, "embedding": model.wte,
                   "path": block.attn.bias.path, "kv_shift": block.attn.kv_shift.gate, "attn_norm": block.attn_norm,
                   "q_norm": block.attn.q_norm, "final norm": model.norm}
        def record(name):
            def hook(module, args):
                seen.setdefault(name, module.weight.dtype)
            return hook
        for name, module in watched.items():
            module.register_forward_pre_hook(record(name))
        loss = model(idx, idx)[1]
        loss.backward()
        bf16, fp32 = torch.bfloat16, torch.float32
        assert seen == {"qkv": bf16, "mlp.up": bf16, "embedding": bf16, "path": fp32, "kv_shift": fp32,
                        "attn_norm": fp32, "q_norm": fp32, "final norm": bf16}
        assert {p.dtype for p in model.parameters()} == {fp32} and {p.grad.dtype for p in model.parameters()} == {fp32}
        assert 0 < abs(loss.item() - fp32_loss) < 1e-2 * fp32_loss  # bf16 rounding, nothing more
    finally:
        ddp.release()


# ----------------------------------------------------------------------------- compile = true under FSDP

COMPILE_TRAIN = dict(max_iters=6, warmup_iters=2, global_batch_size=4, batch_size=1, eval_interval=3, eval_windows=4)
# relative: inductor fuses and reorders the blocks' fp32 arithmetic (the norms' reductions, the MLP's silu x up,
# the softmax), each fused op rounding differently, by ~1e-7; over these 6 steps the losses and validation losses
# moved apart by at most 1.4e-7 and the gradient norms by 1.2e-6 (measured, torch 2.13): 1e-4 leaves a margin of
# about 100 over the largest, far below what a wrong block, a gradient not reduced or a micro-batch lost would do
# to losses that fall by 1e-2 to 1e-1 a step
COMPILED_ROUNDING = 1e-4


def test_compile_under_fsdp_compiles_each_block_before_sharding_and_gives_the_uncompiled_losses(tmp_path):
    """compile = true under FSDP, 2 gloo processes, inductor on the CPU, 2 micro-batches a step, validation at
    steps 0, 3 and 6 (a no-grad graph too): each block is compiled before fully_shard (the start-up line counts
    them on the model; torch._dynamo's counters say graphs were made, without a graph break), and the training
    and validation losses are the uncompiled FSDP run's."""
    data_dir = synthetic_corpus(tmp_path, 10, 400)
    config = tmp_path / "tiny.toml"
    config.write_text(tiny_config(data_dir, **COMPILE_TRAIN))

    def fsdp(out, *more):
        return [str(config), "--pos=rope", "--parallel=fsdp", f"--out_dir={tmp_path / out}", *more]
    done = launch(2, {"runs": [fsdp("eager"), fsdp("compiled", "--compile")],
                      "results": str(tmp_path / "results.json")}, tmp_path)
    assert done.returncode == 0, done.stderr[-3000:]
    with open(tmp_path / "results.json") as f:
        eager, compiled = json.load(f)["runs"]
    starts = [line for line in done.stdout.splitlines() if line.startswith("model: ")]
    assert len(starts) == 2, done.stdout[-3000:]
    assert "FSDP (sharded)" in starts[0] and ", compile: off, " in starts[0]
    assert ", compile: 2 of 2 blocks (per block, before fully_shard; embedding, final norm, LM head and loss eager), " \
        in starts[1]
    assert eager["graphs"] == 0 and compiled["graphs"] > 0 and compiled["graph_breaks"] == 0
    assert len(compiled["losses"]) == 6 and compiled["grad_accum"] == 2
    assert compiled["losses"] == pytest.approx(eager["losses"], rel=COMPILED_ROUNDING)
    assert compiled["grad_norms"] == pytest.approx(eager["grad_norms"], rel=COMPILED_ROUNDING)
    assert [step for step, _ in compiled["val_losses"]] == [0, 3, 6]
    assert [v for _, v in compiled["val_losses"]] == pytest.approx([v for _, v in eager["val_losses"]],
                                                                   rel=COMPILED_ROUNDING)


# ----------------------------------------------------------------------------- shards without their ckpt.pt

def tree_bytes(root) -> dict:
    """Every file under root, by its path below root."""
    return {str(path.relative_to(root)): path.read_bytes() for path in sorted(root.rglob("*")) if path.is_file()}


def without_ckpt_pt(runs, tmp_path):
    """A copy of the 2-process sharded run stopped at step 10 whose ckpt.pt is gone, and its shard directory."""
    run_dir = tmp_path / "run"
    shutil.copytree(runs["root"] / "fsdp2_stopped_at_10", run_dir)
    os.remove(run_dir / "ckpt.pt")
    [name] = os.listdir(run_dir / checkpoints.SHARDS_DIR)
    return run_dir, run_dir / checkpoints.SHARDS_DIR / name


@pytest.mark.fault
def test_shards_whose_ckpt_pt_is_gone_are_kept_and_resume_recovers_them(runs, tmp_path, capsys):
    """ckpt.pt deleted beside the complete sharded checkpoint of 2 processes at step 10: a new run there deleted the
    shards, said "the checkpoint is intact" and started from scratch; it is refused now with every file left as it
    was, and --resume continues from the shards with the uninterrupted run's losses."""
    run_dir, shard_dir = without_ckpt_pt(runs, tmp_path)
    left = tree_bytes(run_dir)
    new_run = [runs["config"], "--pos=fox", "--parallel=fsdp", f"--out_dir={run_dir}"]
    with pytest.raises(ConfigError) as info:
        train.run(new_run)
    assert str(info.value) == (f"{run_dir} holds the sharded checkpoint {shard_dir} of iteration 10 but no ckpt.pt; add "
                               "--resume to continue from it, choose another --out_dir, or add --start_over to move it "
                               "aside and start a new run.")
    assert tree_bytes(run_dir) == left and checkpoints.unreferenced_shard_directories(str(run_dir)) == []
    capsys.readouterr()
    resumed = train.run(new_run + ["--resume"])
    out = capsys.readouterr().out
    assert (f"note: {run_dir / 'ckpt.pt'} is missing: resuming from the sharded checkpoint {shard_dir} of iteration 10, "
            "the latest whose files are all there (its .metadata, written last, lists them), but they cannot be checked "
            "against the checksums that were in ckpt.pt; the settings are config.json's, and the divergence checks' "
            "loss history, also in ckpt.pt, starts afresh.\n") in out
    assert "removed" not in out and "is intact" not in out
    assert resumed["step"] == 20 and len(resumed["losses"]) == 10
    assert resumed["losses"] == pytest.approx(runs["reference"]["fox"]["losses"][10:], rel=FP32_ROUNDING)
    assert logged(run_dir, key="iter") == list(range(1, 21))
    # its own checkpoint, written at the end, replaced the recovered shards
    assert [d.split("-")[0] for d in os.listdir(run_dir / checkpoints.SHARDS_DIR)] == ["00000020"]


@pytest.mark.fault
def test_incomplete_or_planted_shards_without_ckpt_pt_are_kept_and_named(runs, tmp_path):
    """The same run directory with its shards' .metadata deleted (a write cut short), then replaced by a pickle that
    runs a command: neither a new run nor --resume removes or loads anything, each refusal names the problem, and
    the command never runs."""
    run_dir, shard_dir = without_ckpt_pt(runs, tmp_path)
    os.remove(shard_dir / ".metadata")
    left = tree_bytes(run_dir)
    args = [runs["config"], "--pos=fox", "--parallel=fsdp", f"--out_dir={run_dir}"]
    with pytest.raises(ConfigError) as info:
        train.run(args)
    assert str(info.value) == (f"{run_dir} holds sharded checkpoint files that no ckpt.pt names, none of them a "
                               f"complete checkpoint ({shard_dir.name} in ckpt.shards); choose another --out_dir, or "
                               "add --start_over to move them aside and start a new run.")
    with pytest.raises(TrainError) as info:
        train.run(args + ["--resume"])
    assert str(info.value) == (f"cannot resume {run_dir}: its ckpt.pt is missing, and no sharded checkpoint in "
                               f"ckpt.shards is complete ({shard_dir.name}: it has no .metadata, which is written last: "
                               "the write was cut short); restore ckpt.pt from a backup, or start a new run with "
                               "--start_over (which moves these files aside) or in another --out_dir.")
    assert tree_bytes(run_dir) == left
    marker = tmp_path / "pwned"

    class Payload:
        def __reduce__(self):
            return os.system, (f"touch {marker}",)
    (shard_dir / ".metadata").write_bytes(pickle.dumps(Payload()))
    with pytest.raises(TrainError, match=r"\.metadata is refused: it names \w+\.system, which no checkpoint's "
                                         "metadata holds, and loading it could run code"):
        train.run(args + ["--resume"])
    assert not marker.exists()


@pytest.mark.fault
def test_start_over_moves_the_earlier_run_aside_and_deletes_nothing(runs, tmp_path, capsys):
    """--start_over in a run directory holding shards without their ckpt.pt, then in one holding a ckpt.pt: each
    earlier run is moved whole into a folder of its own, byte for byte, a new run starts from step 0, and the folder
    with a ckpt.pt resumes as a run directory."""
    run_dir, _ = without_ckpt_pt(runs, tmp_path)
    first = tree_bytes(run_dir)
    args = [runs["config"], "--pos=fox", "--parallel=fsdp", f"--out_dir={run_dir}"]
    started = train.run(args + ["--stop_iter=2", "--start_over"])
    assert started["losses"] == pytest.approx(runs["reference"]["fox"]["losses"][:2], rel=FP32_ROUNDING)
    [aside] = [path for path in run_dir.iterdir() if path.name.startswith("earlier-")]
    assert tree_bytes(aside) == first
    assert (f"note: --start_over: moved the earlier run's ckpt.shards, config.json, metrics.jsonl to {aside} (nothing "
            "was deleted).") in capsys.readouterr().out
    second = {name: data for name, data in tree_bytes(run_dir).items() if not name.startswith("earlier-")}
    with pytest.raises(ConfigError, match="already holds a checkpoint; add --resume to continue it, choose another "
                                          "--out_dir, or add --start_over to move it aside and start a new run"):
        train.run(args + ["--stop_iter=1"])
    train.run(args + ["--stop_iter=1", "--start_over"])
    [again] = [path for path in run_dir.iterdir() if path.name.startswith("earlier-") and path != aside]
    assert tree_bytes(again) == second and tree_bytes(aside) == first
    assert train.run(args[:-1] + [f"--out_dir={again}", "--stop_iter=3", "--resume"])["step"] == 3
    with pytest.raises(ConfigError, match="--start_over starts a new run"):
        train.parse_args([runs["config"], "--resume", "--start_over"])


# ----------------------------------------------------------------------------- a sharded save that fails

@pytest.fixture(scope="module")
def tiny_fsdp(tmp_path_factory):
    """The tiny model's config on a small corpus, and the run directory of 1 process under FSDP stopped at step 2."""
    root = tmp_path_factory.mktemp("tiny_fsdp")
    config = root / "tiny.toml"
    config.write_text(tiny_config(synthetic_corpus(root, 20, 400), model={"pos": "rope"}))
    torch.set_num_threads(1)
    train.run([str(config), "--parallel=fsdp", "--stop_iter=2", f"--out_dir={root / 'run'}"])
    return str(config), root / "run"


def checkpoint_bytes(run_dir) -> dict:
    """ckpt.pt and every shard file (a resume rewrites config.json and metrics.jsonl)."""
    return {name: data for name, data in tree_bytes(run_dir).items()
            if name == "ckpt.pt" or name.startswith(checkpoints.SHARDS_DIR)}


def as_root(command: list[str]) -> bool:
    return os.geteuid() == 0 and subprocess.run(command, capture_output=True).returncode == 0


@pytest.mark.fault
@pytest.mark.parametrize("fault", ["full disk", "immutable directory"])
def test_a_sharded_save_on_a_full_disk_or_unwritable_directory_is_one_sentence(tiny_fsdp, tmp_path, fault):
    """A full disk (a small tmpfs) or an unwritable ckpt.shards (chattr +i) during a sharded save: it was torch's
    CheckpointException traceback (a BaseException, past the save's `except Exception`), naming neither; now one
    sentence names the free space or the system's reason and says that the previous checkpoint is intact, which it
    is, byte for byte, and the resume after the remedy goes on."""
    config, saved = tiny_fsdp
    mount = tmp_path / "small"
    mount.mkdir()
    if fault == "full disk":
        if not as_root(["mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", str(mount)]):
            pytest.skip("needs root to mount a small tmpfs")
        run_dir = mount / "run"
        shutil.copytree(saved, run_dir)
        with open(mount / "filler", "wb", buffering=0) as f:  # the disk filled up to 128 KiB, less than the shards
            try:
                while f.write(b"\0" * 65536):
                    pass
            except OSError:
                pass
        os.truncate(mount / "filler", os.path.getsize(mount / "filler") - 131072)
        reason = r"no space left on the device \(\d+ MiB free in " + re.escape(str(run_dir)) + r"\)"
        remedy = "Free space"
        undo = [["rm", str(mount / "filler")]]
    else:
        run_dir = mount / "run"
        shutil.copytree(saved, run_dir)
        shards = str(run_dir / checkpoints.SHARDS_DIR)
        if as_root(["chattr", "+i", shards]):
            reason, undo = "Operation not permitted", [["chattr", "-i", shards]]
        else:  # not root: a directory without write permission
            os.chmod(shards, 0o555)
            reason, undo = "Permission denied", [["chmod", "755", shards]]
        remedy = "Make the directory writable"
    before = checkpoint_bytes(run_dir)
    args = [config, "--parallel=fsdp", "--stop_iter=3", f"--out_dir={run_dir}", "--resume"]
    try:
        with pytest.raises(TrainError) as info:
            train.run(args)
        shards = re.escape(str(run_dir / checkpoints.SHARDS_DIR))
        assert re.fullmatch(rf"could not write the sharded checkpoint {shards}/00000003-[0-9a-f]{{8}}: {reason}; the "
                            rf"previous checkpoint {re.escape(str(run_dir / 'ckpt.pt'))} is intact\. {remedy} \(or "
                            r"choose another --out_dir\), then run again \(with --resume if a checkpoint exists\)\.",
                            str(info.value)), str(info.value)
        assert checkpoint_bytes(run_dir) == before  # the failed save's own files removed, nothing else touched
        failed_step = logged(run_dir)[-1]
        for command in undo:  # the remedy: free space, or make the directory writable
            subprocess.run(command, check=True)
        undo = []
        resumed = train.run(args)
        assert resumed["step"] == 3 and resumed["losses"] == [failed_step]
    finally:
        for command in undo:
            subprocess.run(command)
        if fault == "full disk":
            subprocess.run(["umount", str(mount)], check=True)


# Runs train.py as one rank of a 2-process job launched like torchrun does, without its supervisor (which would end
# the survivor), so that the test sees what the survivor says: rank argv[1] SIGKILLs itself as it starts writing its
# shards of the second sharded checkpoint.
KILL_DURING_SHARDED_SAVE = """
    import os, signal, sys
    import torch.distributed.checkpoint.filesystem as filesystem
    import train
    victim, real_write, saves = sys.argv[1], filesystem._write_files_from_queue, []

    def write_files(*args, **kwargs):
        saves.append(1)
        if os.environ["RANK"] == victim and len(saves) == 2:
            os.kill(os.getpid(), signal.SIGKILL)
        return real_write(*args, **kwargs)

    filesystem._write_files_from_queue = write_files
    sys.argv = ["train.py"] + sys.argv[2:]
    train.main()
"""


@pytest.mark.fault
def test_a_process_killed_during_a_sharded_save_is_named_by_the_survivor(tiny_fsdp, tmp_path, capsys):
    """kill -9 of one of 2 processes while they write a sharded checkpoint: the surviving main process said the
    checkpoint could not be written and to free space or make the directory writable (a surviving rank 1 said
    nothing); each survivor now says that another process died and that the previous checkpoint is intact, which
    it is, and it resumes."""
    config, _ = tiny_fsdp
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", "PYTHONPATH": REPO}

    def start(victim):
        # (a dead peer's closed socket is seen at once, so the timeout costs nothing when the test passes; it must
        # outlast every phase in which one process waits for the other: the start-up's wait for both to join, with
        # 4 processes importing torch, and a checkpoint write)
        args = [str(victim), config, "--parallel=fsdp", "--batch_size=2", "--ckpt_interval=2",
                "--dist_timeout_s=300", f"--out_dir={tmp_path / str(victim)}"]
        return ProcessJob(textwrap.dedent(KILL_DURING_SHARDED_SAVE), args, env, REPO)

    jobs = {}
    try:
        for victim in (1, 0):  # both jobs at once, to save time
            jobs[victim] = start(victim)
        for victim, job in jobs.items():
            survivor, run_dir = 1 - victim, tmp_path / str(victim)
            err = job.wait(survivor, timeout=600)
            job.wait(victim, timeout=30)
            if job.returncodes() == [1, 1] and "Timed out waiting" in job.report():
                # Known and not understood (seen in two CI runs and once here, each time on 2 loaded cores): both
                # processes of a job waited in collectives until the 300 s timeout, before the victim's kill. Each
                # still said so in one sentence; the case under test is run once more and must hold then. Not
                # reproduced since: 36 runs of both jobs at once on 2 cores shared with two or three training
                # processes, with a watchdog ready to py-spy both ranks after 100 s.
                print(f"retrying the job whose victim is process {victim}:\n{job.report()}", file=sys.stderr)
                job.kill()
                shutil.rmtree(run_dir, ignore_errors=True)
                job = jobs[victim] = start(victim)
                err = job.wait(survivor, timeout=600)
                job.wait(victim, timeout=30)
            assert job.returncodes()[victim] == -signal.SIGKILL and job.returncodes()[survivor] == 1, job.report()
            shards = re.escape(str(run_dir / checkpoints.SHARDS_DIR))
            assert re.fullmatch(rf"error: process {survivor} stopped: another process died or stopped responding while "
                                rf"the sharded checkpoint {shards}/00000004-[0-9a-f]{{8}} was written \(.+\); the "
                                rf"previous checkpoint {re.escape(str(run_dir / 'ckpt.pt'))} is intact\. Fix the cause, "
                                r"then run again \(with --resume if a checkpoint exists\)\.", err.strip()), job.report()
            assert checkpoints.load(str(run_dir / "ckpt.pt"))["step"] == 2  # its shards all as their checksums say
    finally:
        for job in jobs.values():
            job.kill()
    # the main process survived rank 1 and removed what its save had written; rank 1 could not, so the next start does
    assert [d.split("-")[0] for d in os.listdir(tmp_path / "1" / checkpoints.SHARDS_DIR)] == ["00000002"]
    run_dir = tmp_path / "0"
    before = logged(run_dir)  # iterations 3 and 4 were trained before the kill
    capsys.readouterr()
    resumed = train.run([config, "--parallel=fsdp", "--batch_size=2", f"--out_dir={run_dir}", "--resume"])
    assert "note: removed 1 sharded checkpoint directory that ckpt.pt does not name" in capsys.readouterr().out
    assert resumed["step"] == 6 and resumed["losses"][:2] == pytest.approx(before[2:4], rel=FP32_ROUNDING)


def commit_newer(run_dir, step: int) -> None:
    """What a running job's next sharded save does to run_dir: a new shard directory, ckpt.pt renamed over the old
    one to name it, then the old directory removed (made here from a copy of the current shards)."""
    path = str(run_dir / "ckpt.pt")
    ckpt = checkpoints.load(path, required=(), assemble=False)
    old = checkpoints.shard_directory(path, ckpt)
    name = os.path.join(checkpoints.SHARDS_DIR, f"{step:08d}-{step:08x}")
    shutil.copytree(old, run_dir / name)
    checkpoints.save(path + ".next", {**ckpt, "step": step, "shards": {**ckpt["shards"], "dir": name}})
    os.replace(path + ".next", path)
    shutil.rmtree(old)


@pytest.mark.fault
@pytest.mark.parametrize("during", ["verify_shards", "load_sharded_model"])
def test_a_reader_during_a_sharded_save_gets_the_newer_checkpoint(runs, tmp_path, monkeypatch, during):
    """sample.py and export_hf.py against a 2-process run that saved every step: 6 reads in 16 failed (tracebacks
    from torch.distributed.checkpoint, bare 'No such file' lines, a false 'damaged ... restore it from a backup'),
    when the save replaced ckpt.pt and removed the shards it had named while they were read."""
    run_dir = tmp_path / "saving"
    shutil.copytree(runs["root"] / "fsdp2" / "rope", run_dir)
    expected, _ = load_gpt(str(run_dir))
    real, saves = getattr(checkpoints, during), []

    def saved_meanwhile(*args, **kwargs):
        if not saves:
            saves.append(21)
            commit_newer(run_dir, 21)
        return real(*args, **kwargs)
    monkeypatch.setattr(checkpoints, during, saved_meanwhile)
    model, ckpt = load_gpt(str(run_dir))
    assert saves == [21] and ckpt["step"] == 21
    for (name, a), b in zip(model.state_dict().items(), expected.state_dict().values()):
        assert torch.equal(a, b), name


@pytest.mark.fault
def test_a_checkpoint_replaced_at_every_read_is_one_sentence(runs, tmp_path, monkeypatch):
    run_dir = tmp_path / "saving"
    shutil.copytree(runs["root"] / "fsdp2" / "rope", run_dir)
    real, steps = checkpoints.verify_shards, iter(range(21, 100))

    def saved_meanwhile(*args, **kwargs):
        commit_newer(run_dir, next(steps))
        return real(*args, **kwargs)
    monkeypatch.setattr(checkpoints, "verify_shards", saved_meanwhile)
    with pytest.raises(checkpoints.CheckpointError) as refused:
        load_gpt(str(run_dir))
    assert str(refused.value) == (f"checkpoint {run_dir / 'ckpt.pt'} was replaced 5 times while it was read: a run is "
                                  "saving it now, every few seconds; run this again, or once that run has ended")
    assert next(steps) == 26  # (five reads, each met by a save)


@pytest.mark.fault
def test_a_finished_sharded_run_without_ckpt_pt_is_reached_by_the_command_its_readers_name(runs, tmp_path, capsys):
    """A sharded run at its last iteration whose ckpt.pt is gone: sample.py and export_hf.py said "no checkpoint"
    without a word of the shards, and train.py --resume said "nothing to do" and wrote no ckpt.pt."""
    run_dir, shard_dir = without_ckpt_pt(runs, tmp_path)
    weights = checkpoints.load_sharded_model(str(run_dir / "x"), {"shards": {"dir": os.path.relpath(shard_dir,
                                                                                                  run_dir)}})
    with pytest.raises(checkpoints.UserError) as refused:
        checkpoints.load_model(str(run_dir))
    command = f"python train.py --resume {run_dir} --stop_iter=10"
    assert str(refused.value) == (f"no checkpoint at {run_dir / 'ckpt.pt'}, but {shard_dir} holds the complete sharded "
                                  f"checkpoint of iteration 10: `{command}` writes ckpt.pt from it without training "
                                  "further; then run this again")
    capsys.readouterr()
    assert train.run(command.split()[2:])["losses"] == []
    assert (f"wrote {run_dir / 'ckpt.pt'} at iteration 10 from the recovered sharded checkpoint (this run ends at 10); "
            "nothing else to do.") in capsys.readouterr().out
    model, _, ckpt = checkpoints.load_model(str(run_dir))
    assert ckpt["step"] == 10
    for name, tensor in model.state_dict().items():
        assert torch.equal(tensor, weights[name]), name
