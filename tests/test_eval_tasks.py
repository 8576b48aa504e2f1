"""eval/tasks.py: the tasks' evaluation splits exported from the hub as JSON lines."""
import json
import os


# -------------------------------------------------------------------------------- where generated mutants found no test
# Each test here fails under at least one generated mutant (tools/mutants.py) that survived before
# it was written.


def test_export_hub_data_writes_each_tasks_evaluation_split_as_json_lines(tmp_path, monkeypatch, capsys):
    """--export-data on a machine with internet: no test reached it (it downloads); with the hub replaced by rows
    in memory, each task's stock YAML decides the dataset, its name and the split, and every row is written."""
    import datasets

    from eval import tasks
    (tmp_path / "base.yaml").write_text("dataset_path: org/base\nvalidation_split: validation\n")
    (tmp_path / "task_a.yaml").write_text("include: base.yaml\ndataset_name: sub\ntest_split: test\n")
    (tmp_path / "task_b.yaml").write_text("dataset_path: org/b\nvalidation_split: dev\n")
    manager = type("Manager", (), {"task_index": {"a": {"yaml_path": str(tmp_path / "task_a.yaml")},
                                                  "b": {"yaml_path": str(tmp_path / "task_b.yaml")}}})()
    hub = {("org/base", "sub", "test"): [{"q": "é?", "label": 1}, {"q": "two", "label": 0}],
           ("org/b", None, "dev"): [{"text": "x"}]}
    monkeypatch.setattr(datasets, "load_dataset", lambda path, name, split: hub[(path, name, split)])
    out = tmp_path / "out"
    tasks.export_hub_data(manager, ["a", "b"], str(out))
    for task, key in (("a", ("org/base", "sub", "test")), ("b", ("org/b", None, "dev"))):
        lines = (out / f"{task}.jsonl").read_text(encoding="utf-8").splitlines()
        assert [json.loads(line) for line in lines] == hub[key]
    assert sorted(os.listdir(out)) == ["a.jsonl", "b.jsonl"]  # no .tmp left behind
    assert f"wrote 2 rows to {out / 'a.jsonl'}" in capsys.readouterr().out
