"""Several train.py runs in one torchrun launch, for tests/test_fsdp.py (each launch costs seconds of start-up on
a small machine, so the runs a test needs share one):

    python -m torch.distributed.run --standalone --nproc_per_node=N tests/distributed_runs.py PLAN.json

PLAN.json: {"runs": [ARGV, ...], "measure": [ARGV, ...], "results": PATH, "kill_at_save": K, "kill_run": ARGV}
(all but "runs" and "results" optional). Each ARGV of "runs" is the argument list of train.run; the main process
writes {"runs": [{"losses", "val_losses", "grad_norms", "step", "grad_accum", "graphs", "graph_breaks"}, ...],
"memory": [{"measured", "planned"}, ...]} to PATH as JSON ("graphs" and "graph_breaks": how many graphs
torch.compile made and how many graph breaks it met during that run, from torch._dynamo's counters), "memory" holding the measured peak of a training step and the planner's for each ARGV of
"measure" (CONFIG --key=value ...). With "kill_run", that run comes last, and its main process sends itself SIGKILL at its K-th
checkpoint, after every process has written and hashed its shards and before ckpt.pt names them: the moment at
which a kill would leave two steps' files on disk. torchrun then ends the whole job, as it would on a cluster.
"""
import json
import os
import signal
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import train  # noqa: E402
from config import resolve  # noqa: E402
from model import GPTConfig  # noqa: E402
from training import checkpointing, memory  # noqa: E402
from training.distributed import Distributed  # noqa: E402


def grad_norms(run_dir: str) -> list[float]:
    with open(os.path.join(run_dir, "metrics.jsonl")) as f:
        return [r["grad_norm"] for r in map(json.loads, f) if r["type"] == "train"]


def compiled_so_far() -> tuple[int, int]:
    """(graphs torch.compile has made in this process, graph breaks it has met)."""
    from torch._dynamo.utils import counters
    return counters["stats"]["unique_graphs"], sum(counters["graph_break"].values())


def kill_at_commit(save_number: int) -> None:
    """Make the main process die by SIGKILL just before it commits its `save_number`-th sharded checkpoint."""
    commit, saves = checkpointing.Checkpointer.write, []

    def write(self, state):
        if "shards" in state:
            saves.append(state["step"])
            if len(saves) == save_number:
                os.kill(os.getpid(), signal.SIGKILL)
        commit(self, state)
    checkpointing.Checkpointer.write = write


def main() -> None:
    with open(sys.argv[1]) as f:
        plan = json.load(f)
    main_process, results = int(os.environ.get("RANK", 0)) == 0, []
    for argv in plan["runs"]:
        graphs, breaks = compiled_so_far()
        out = train.run(argv)
        if main_process:
            graphs_after, breaks_after = compiled_so_far()
            results.append({"losses": out["losses"], "val_losses": out["val_losses"], "step": out["step"],
                            "grad_accum": out["grad_accum"],
                            "grad_norms": grad_norms(out["out_dir"])[-len(out["losses"]):],
                            "graphs": graphs_after - graphs, "graph_breaks": breaks_after - breaks})
    peaks = []
    for argv in plan.get("measure", []):
        model_cfg, cfg = resolve(argv[0], argv[1:], GPTConfig)
        ddp = Distributed(cfg.device, cfg.dist_timeout_s, cfg.parallel)
        peaks.append({"measured": memory.measure_peak(model_cfg, cfg, ddp),
                      "planned": memory.plan(model_cfg, cfg, ddp.world_size).total})
    if main_process:
        with open(plan["results"], "w") as f:
            json.dump({"runs": results, "memory": peaks}, f)
    if plan.get("kill_run"):
        kill_at_commit(plan["kill_at_save"])
        train.run(plan["kill_run"])


if __name__ == "__main__":
    main()
