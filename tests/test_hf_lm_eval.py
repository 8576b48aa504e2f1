"""lm-eval's own `hf` model on an export gives the log-likelihoods our `grape` adapter gives the checkpoint,
offline on the fixture tasks: through the command line (remote code) and simple_evaluate (native Qwen3)."""
import json
import sys

import pytest

from data.tokenizer import get_tokenizer
from eval import lm_eval_cli
from eval.lm_adapter import GrapeLM
from eval.tasks import write_offline_task_yamls
from eval.tiny import save_run, tiny_model
from hf.export import export
from test_eval_zero_shot import FIXTURES

pytest.importorskip("transformers")
pytest.importorskip("accelerate")
pytestmark = pytest.mark.usefixtures("one_thread")
TASKS = ("arc_easy", "piqa", "winogrande")
LIMIT = 3


@pytest.fixture(scope="module")
def tasks(tmp_path_factory):
    from lm_eval.tasks import TaskManager
    manager = TaskManager()
    yaml_dir = tmp_path_factory.mktemp("task_yamls")
    return manager, dict(zip(TASKS, write_offline_task_yamls(manager, TASKS, str(FIXTURES), str(yaml_dir))))


def loglikelihoods(samples):
    """{(doc_id, choice): log-likelihood} from lm-eval's logged samples."""
    return {(s["doc_id"], i): float(r[0][0]) for s in samples for i, r in enumerate(s["resps"])}


def grape_loglikelihoods(model, tasks):
    import lm_eval
    manager, paths = tasks
    lm = GrapeLM(model=model, tokenizer=get_tokenizer("byte"), batch_size=4, device="cpu")
    results = lm_eval.simple_evaluate(model=lm, tasks=[paths[t] for t in TASKS], task_manager=manager,
                                      limit=LIMIT, log_samples=True)
    return {task: loglikelihoods(results["samples"][task]) for task in TASKS}


def assert_same(ours, theirs):
    """Equal to 1e-5, or to two units of fp32's resolution of the sum for long continuations (|log-likelihood|
    > 40: one fp32 unit at 115 is 7.6e-6, at 238 1.5e-5; the native export's RoPE frequencies are transformers' own
    fp32 formula, which differs from ours by up to one fp32 unit, docs/recipe.md)."""
    for task in TASKS:
        assert theirs[task].keys() == ours[task].keys() and len(ours[task]) >= 2 * LIMIT
        for key, value in ours[task].items():
            assert theirs[task][key] == pytest.approx(value, rel=2.4e-7, abs=1e-5), (task, key)


def test_lm_eval_command_line_on_a_remote_code_export(tmp_path, tasks, monkeypatch):
    model = tiny_model(pos="grape_a_qk", kv_shift=True, block_size=256, seed=5)  # fixtures fit: no truncation
    export(save_run(model, str(tmp_path / "run")), str(tmp_path / "export"))
    monkeypatch.setattr(sys, "argv", list(sys.argv))  # main() hands its arguments to lm-eval through sys.argv
    lm_eval_cli.main(["--model", "hf", "--model_args", f"pretrained={tmp_path / 'export'},trust_remote_code=True",
                      "--tasks", ",".join(TASKS), "--data-dir", str(FIXTURES), "--limit", str(LIMIT),
                      "--device", "cpu", "--batch_size", "4", "--log_samples", "--output_path", str(tmp_path / "out")])
    theirs = {}
    for task in TASKS:
        (samples_file,) = (tmp_path / "out").glob(f"*/samples_{task}_*.jsonl")
        theirs[task] = loglikelihoods([json.loads(line) for line in open(samples_file)])
    assert_same(grape_loglikelihoods(model, tasks), theirs)


def test_lm_eval_hf_on_a_native_qwen3_export(tmp_path, tasks):
    import lm_eval
    model = tiny_model(pos="rope", block_size=256, seed=6)
    export(save_run(model, str(tmp_path / "run")), str(tmp_path / "export"))
    manager, paths = tasks
    results = lm_eval.simple_evaluate(model="hf", model_args=f"pretrained={tmp_path / 'export'}",
                                      tasks=[paths[t] for t in TASKS], task_manager=manager, limit=LIMIT,
                                      device="cpu", batch_size=4, log_samples=True)
    assert type(results["config"]["model"]) is str
    assert_same(grape_loglikelihoods(model, tasks),
                {task: loglikelihoods(results["samples"][task]) for task in TASKS})
