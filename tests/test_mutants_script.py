"""tools/mutants.py's own logic: which mutants count as a message's wording, the proportional seeded sample, the
names of mutmut's mutants, and the equivalence entries (mutmut itself is not needed for these)."""
import importlib.util
import json
import os
import sys
import textwrap
from collections import Counter

import pytest

from tools import mutants


def pair(original_body, mutant_body, name="f"):
    return (f"def x_{name}__mutmut_orig(a):\n{original_body}", f"def x_{name}__mutmut_3(a):\n{mutant_body}")


def test_only_a_messages_text_is_wording():
    wording = [
        pair('    raise ValueError(f"bad {a}: fix it")\n', '    raise ValueError(f"XXbad {a}: fix itXX")\n'),
        pair('    raise ConfigError("a" + str(a))\n', '    raise ConfigError("XXaXX" + str(a))\n'),
        pair('    print("done", a)\n', '    print("DONE", a)\n'),
        pair('    ddp.say(f"note: {a}")\n', '    ddp.say(f"NOTE: {a}")\n'),
        pair('    return TrainError("diverged")\n', '    return TrainError("XXdivergedXX")\n'),
        pair('    p.add_argument("--x", default=1, help="the x")\n', '    p.add_argument("--x", default=1, help="THE X")\n'),
    ]
    behaviour = [
        pair('    path = a + "ckpt.pt"\n', '    path = a + "XXckpt.ptXX"\n'),  # what is saved
        pair('    return {"loss": a}\n', '    return {"XXlossXX": a}\n'),  # what is reported
        pair('    raise ValueError(f"bad {a}")\n', '    raise ValueError(f"bad {a + 1}")\n'),
        pair('    if a > 1:\n        raise ValueError("x")\n', '    if a >= 1:\n        raise ValueError("x")\n'),
        pair('    print("done", a)\n', '    print("done", None)\n'),
        pair('    raise ValueError("x")\n', '    raise TypeError("x")\n'),
        pair('    p.add_argument("--x", default="auto", help="h")\n', '    p.add_argument("--x", default="AUTO", help="h")\n'),
        # inside a message call, but not its text: where it goes, an exit status, a number
        pair('    print("done", file=sys.stderr)\n', '    print("done")\n'),
        pair('    raise SystemExit(1)\n', '    raise SystemExit(2)\n'),
        pair('    sys.exit(1)\n', '    sys.exit(2)\n'),
        pair('    warnings.warn("slow", stacklevel=2)\n', '    warnings.warn("slow", stacklevel=3)\n'),
    ]
    assert all(mutants.only_message_text(*p) for p in wording)
    method = [textwrap.indent(source, "    ") for source in wording[0]]  # a method's source, as mutmut writes it
    assert mutants.only_message_text(*method)
    assert not any(mutants.only_message_text(*p) for p in behaviour)


def test_the_sample_is_proportional_seeded_and_covers_every_module():
    rows = {"a": [f"a{i}" for i in range(1000)], "b": [f"b{i}" for i in range(300)], "c": [f"c{i}" for i in range(5)],
            "d": [f"d{i}" for i in range(40)]}
    sample = mutants.draw_sample(rows, 100, seed=3)
    counts = Counter(name[0] for name in sample)
    total = 1345
    assert counts["a"] == round(100 * 1000 / total) and counts["b"] == round(100 * 300 / total)
    assert counts["c"] == 5  # all of a row smaller than the minimum
    assert counts["d"] == mutants.MIN_PER_MODULE  # 3 by proportion, raised to the minimum
    assert len(set(sample)) == len(sample) and set(sample) <= {n for v in rows.values() for n in v}
    assert mutants.draw_sample(rows, 100, seed=3) == sample
    assert mutants.draw_sample(rows, 100, seed=4) != sample



def test_the_sample_keeps_its_mutants_when_a_row_grows():
    """After a merge adds mutants to one row, the sample of the other rows is the same and that row's changes by
    about the added share: a new sitting judges only what changed (a fresh random draw would replace most of it)."""
    rows = {"a": [f"a{i}" for i in range(1000)], "b": [f"b{i}" for i in range(300)]}
    before = mutants.draw_sample(rows, 100, seed=3)
    grown = {"a": rows["a"] + [f"a_new{i}" for i in range(20)], "b": rows["b"]}
    after = mutants.draw_sample(grown, 100, seed=3)
    assert [n for n in after if n[0] == "b"] == [n for n in before if n[0] == "b"]
    old_a, new_a = {n for n in before if n[0] == "a"}, {n for n in after if n[0] == "a"}
    assert len(new_a) == round(100 * 1020 / 1320) and len(old_a) == round(100 * 1000 / 1300)
    assert len(old_a - new_a) <= 3, "more than the added names and the row's one extra place pushed out"

def test_mutant_names_and_their_rows():
    method = "training.divergence.xǁDivergenceMonitorǁ__init____mutmut_12"
    function = "data.loader.x_permute__mutmut_7"
    assert mutants.module_of(method) == "training.divergence" and mutants.function_of(method) == \
        "DivergenceMonitor.__init__"
    assert mutants.module_of(function) == "data.loader" and mutants.function_of(function) == "permute"
    assert mutants.group_of(method) == "training/" and mutants.group_of(function) == "data/"
    assert mutants.group_of("attention_kernels.grape_ap.x_f__mutmut_1") == "attention_kernels/grape_ap.py"
    assert mutants.group_of("attention_kernels.grape_ap_triton.x_f__mutmut_1") is None
    assert mutants.group_of("config.x_resolve__mutmut_1") == "config.py"


def test_an_equivalence_entry_matches_its_function_and_lines_only():
    name = "training.divergence.xǁDivergenceMonitorǁproblem__mutmut_3"
    local = "xǁDivergenceMonitorǁproblem"
    sources = {name: (f"def {local}__mutmut_orig(self):\n    x = 1\n    if a > 1:\n        return 2\n",
                      f"def {local}__mutmut_3(self):\n    x = 1\n    if a >= 1:\n        return 2\n")}
    assert mutants.changed_lines(*sources[name]) == ("if a > 1:", "if a >= 1:")
    entry = {"function": "training.divergence.DivergenceMonitor.problem", "original": "if a > 1:",
             "mutant": "if a >= 1:", "reason": "r"}
    assert mutants.equivalence(name, sources, [entry]) == "r"
    assert mutants.equivalence(name, sources, [{**entry, "mutant": "if a < 1:"}]) is None
    assert mutants.equivalence(name, sources, [{**entry, "function": "training.divergence.problem"}]) is None
    default = ("def x_f__mutmut_orig(a, b: int = 0):\n    return a + b\n",
               "def x_f__mutmut_1(a, b: int = 1):\n    return a + b\n")  # a mutant of the def line itself
    assert mutants.changed_lines(*default) == ("def x_f(a, b: int = 0):", "def x_f(a, b: int = 1):")
    twelfth = (default[0], default[0].replace("__mutmut_orig", "__mutmut_12").replace("a + b", "a - b"))
    assert mutants.changed_lines(*twelfth) == ("return a + b", "return a - b")  # not its renamed def line
    decorated = tuple("@classmethod\n" + source.replace("(a,", "(cls, a,") for source in twelfth)
    assert mutants.changed_lines(*decorated) == ("return a + b", "return a - b")  # the def line after a decorator
    removed = (twelfth[0].replace("    return", "    a += 1\n    return"),
               twelfth[0].replace("__mutmut_orig", "__mutmut_3"))
    assert mutants.changed_lines(*removed) == ("a += 1", "")  # a statement taken out: nothing in its place


def test_every_module_of_the_repository_reaches_the_mutants_copy():
    """mutmut runs the tests in its copy mutants/, which holds only source_paths and also_copy: a new top-level
    module missing from both breaks every test's import there (lm_loss.py did, after the FSDP merge)."""
    import tomllib
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    with open(os.path.join(root, "pyproject.toml"), "rb") as f:
        settings = tomllib.load(f)["tool"]["mutmut"]
    copied = {p.split("/")[0] for p in settings["source_paths"] + settings["also_copy"]} | {"tests"}
    needed = {name for name in os.listdir(root) if name.endswith(".py") or (
        os.path.isdir(os.path.join(root, name)) and not name.startswith(".") and name != "mutants" and any(
            f.endswith(".py") for _, _, files in os.walk(os.path.join(root, name)) for f in files))}
    assert needed <= copied, f"not in [tool.mutmut] source_paths or also_copy: {sorted(needed - copied)}"
    missing = [p for p in settings["source_paths"] if not os.path.exists(os.path.join(root, p))]
    assert not missing, f"source_paths that do not exist: {missing}"


def test_the_table_counts_each_exit_status_and_scores_killed_over_judged(tmp_path, monkeypatch):
    """mutmut's exit codes: 1 a test failed, 3 pytest stopped with an internal error (both killed), 0 survived, 5
    and 33 no test ran, 36/24/-24/152/255 a timeout, None not run yet. The score is (killed + timeouts) over every
    judged mutant that is not equivalent, "no test" included (a mutant no test reaches is one the tests miss)."""
    codes = {"config.x_a__mutmut_1": 1, "config.x_a__mutmut_2": 3, "config.x_a__mutmut_3": 0,
             "config.x_a__mutmut_4": 5, "config.x_a__mutmut_5": 36, "config.x_a__mutmut_6": None,
             "config.x_a__mutmut_7": 0, "data.loader.x_b__mutmut_1": 1, "data.loader.x_b__mutmut_2": 33,
             "data.loader.x_b__mutmut_3": -24}
    sources = {name: ("def x_a__mutmut_orig(a):\n    return a + 1\n", f"def {name.split('.')[-1]}(a):\n    return a - 1\n")
               for name in codes}
    sources["config.x_a__mutmut_7"] = ("def x_a__mutmut_orig(a):\n    n = 1\n", "def x_a__mutmut_7(a):\n    n = 2\n")
    equivalents = [{"function": "config.a", "original": "n = 1", "mutant": "n = 2", "reason": "r"}]
    (tmp_path / "docs").mkdir()
    (tmp_path / "docs" / "testing.md").write_text(f"before\n{mutants.MARKERS[0]}\nold\n{mutants.MARKERS[1]}\nafter\n")
    monkeypatch.setattr(mutants, "ROOT", str(tmp_path))
    monkeypatch.setattr(mutants, "results", lambda: {n: {"exit_code": c} for n, c in codes.items()})
    monkeypatch.setattr(mutants, "load_equivalents", lambda: equivalents)
    monkeypatch.setattr(mutants, "left_out_tests", lambda: [])
    state = {"sample": sorted(codes), "command": "`c`", "commit": "abc", "date": "d", "seed": 1, "population": 10,
             "generated": 12, "wall_s": 60.0, "sittings": [{}], "machine": "m", "mean_load": 1.0}
    summary = mutants.write_report(state, sources, {"config": 2})
    assert summary["rows"]["config.py"] == {"killed": 2, "survived": 1, "equivalent": 1, "timeout": 1, "no test": 1,
                                            "not run": 1}
    assert summary["rows"]["data/"] == {"killed": 1, "survived": 0, "equivalent": 0, "timeout": 1, "no test": 1,
                                        "not run": 0}
    assert summary["totals"]["killed"] == 3 and summary["totals"]["timeout"] == 2 and summary["totals"]["no test"] == 2
    assert sorted(summary["survivors"]) == ["config.x_a__mutmut_3", "config.x_a__mutmut_4", "data.loader.x_b__mutmut_2"]
    document = (tmp_path / "docs" / "testing.md").read_text()
    assert document.startswith("before\n") and document.endswith("after\n") and "\nold\n" not in document
    rows = {line.split(" | ")[0]: line for line in document.splitlines() if line.startswith("| ")}
    assert rows["| config.py"].endswith("| 7 | 2 | 1 | 1 | 1 | 1 | 1 | 60% |")  # (2 + 1) / (2 + 1 + 1 + 1)
    assert rows["| data/"].endswith("| 3 | 1 | 0 | 0 | 1 | 1 | 0 | 67% |")  # (1 + 1) / 3
    assert rows["| **all**"].endswith("| 62% |")  # (3 + 2) / 8
    assert rows["| model.py"].endswith("| 0 | 0 | 0 | 0 | 0 | 0 | 0 | - |")
    listed = (tmp_path / "docs" / "mutants.md").read_text()
    assert "`config.x_a__mutmut_3`: `return a + 1` -> `return a - 1`" in listed and "mutmut_7" not in listed


def test_a_mutants_tests_run_fastest_first_within_the_budget_and_at_least_one():
    durations = {"slow": 50.0, "fast": 1.0, "mid": 20.0, "huge": 500.0}
    tests = ["slow", "huge", "fast", "unrecorded", "mid"]
    assert mutants.tests_within_budget(tests, durations, 0) == ["fast", "mid", "slow", "huge", "unrecorded"]
    assert mutants.tests_within_budget(tests, durations, 71.0) == ["fast", "mid", "slow"]
    assert mutants.tests_within_budget(tests, durations, 70.9) == ["fast", "mid"]
    assert mutants.tests_within_budget(["huge", "unrecorded"], durations, 60.0) == ["huge"]  # over it alone: kept
    assert mutants.tests_within_budget([], durations, 60.0) == []


def test_a_sitting_runs_the_unjudged_mutants_and_a_recheck_the_unlisted_survivors_with_every_test():
    state = {"sample": ["a", "b", "c", "d", "e"], "rechecked": ["z"]}
    outcome = {"a": {"exit_code": 1}, "b": {"exit_code": 0}, "c": {"exit_code": 0}, "d": {"exit_code": 5}}
    assert mutants.plan_sitting(state, outcome, 60.0, False, lambda name: False) == ["e"]
    assert state["budget_s"] == state["first_budget_s"] == 60.0
    # "d" no test reached: a recording run since may have found tests that do
    assert mutants.plan_sitting(state, outcome, 30.0, True, lambda name: name == "c") == ["b", "d"]
    assert state["budget_s"] == 0 and state["first_budget_s"] == 60.0  # the table names the first run's budget
    assert state["rechecked"] == ["b", "d", "z"]


def load_site_module(monkeypatch):
    """tools/mutants_site/sitecustomize.py as the stats run's subprocesses import it (it patches mutmut's
    trampoline module on import; monkeypatch puts the originals back)."""
    from mutmut.mutation import trampoline
    monkeypatch.setattr(trampoline, "get_mutant_under_test", trampoline.get_mutant_under_test)
    monkeypatch.setattr(trampoline, "record_trampoline_hit", trampoline.record_trampoline_hit)
    path = os.path.join(os.path.dirname(mutants.__file__), "mutants_site", "sitecustomize.py")
    spec = importlib.util.spec_from_file_location("grape_mutants_site", path)
    spec.loader.exec_module(importlib.util.module_from_spec(spec))
    return trampoline


@pytest.mark.parametrize("where", ["test process", "subprocess"])
def test_the_stats_run_records_calls_outside_compiled_code_only(where, tmp_path, monkeypatch):
    """In the stats run a function called from code torch.compile traces runs unrecorded (dynamo cannot trace the
    recording); elsewhere the mutant under test is mutmut's, whether or not the code is compiled."""
    import torch
    monkeypatch.setenv("GRAPE_MUTMUT_HITS", str(tmp_path))
    compiling = [False]
    monkeypatch.setattr(torch.compiler, "is_compiling", lambda: compiling[0])
    monkeypatch.setenv("MUTANT_UNDER_TEST", "stats")
    if where == "subprocess":
        get = load_site_module(monkeypatch).get_mutant_under_test
    else:
        from mutmut.mutation import trampoline
        get = mutants.outside_compiled_code(trampoline.get_mutant_under_test)
    seen = {}
    for name in ("stats", "config.x_a__mutmut_1", ""):
        monkeypatch.setenv("MUTANT_UNDER_TEST", name)
        for compiling[0] in (False, True):
            seen[name, compiling[0]] = get()
    assert seen == {("stats", False): "stats", ("stats", True): "",
                    ("config.x_a__mutmut_1", False): "config.x_a__mutmut_1",
                    ("config.x_a__mutmut_1", True): "config.x_a__mutmut_1", ("", False): "", ("", True): ""}


def test_a_fixture_a_test_needs_costs_it_until_a_test_before_it_set_it_up():
    durations = {"a.py::t1": 1.0, "a.py::t2": 1.0, "b.py::t3": 5.0, "b.py::t4": 0.5}
    fixture_s = {"data|a.py": 10.0, "tmp|a.py::t1": 0.25, "tmp|a.py::t2": 0.25}
    uses = {"a.py::t1": ["data|a.py", "tmp|a.py::t1"], "a.py::t2": ["data|a.py", "tmp|a.py::t2"], "b.py::t3": []}
    tests = list(durations)
    # t3 (5) before t1 (1 + 10 + 0.25); once t1 built the module's data, t2 costs 1.25; picked files grouped
    assert mutants.tests_within_budget(tests, durations, 0, fixture_s, uses) == \
        ["b.py::t4", "b.py::t3", "a.py::t1", "a.py::t2"]
    assert mutants.tests_within_budget(tests, durations, 16.75, fixture_s, uses) == \
        ["b.py::t4", "b.py::t3", "a.py::t1"]
    assert mutants.tests_within_budget(tests, durations, 18.0, fixture_s, uses) == \
        ["b.py::t4", "b.py::t3", "a.py::t1", "a.py::t2"]
    assert mutants.tests_within_budget(tests, durations, 16.7, fixture_s, uses) == ["b.py::t4", "b.py::t3"]
    # a fixture is paid once, however many tests need it: the third of three users costs its call alone
    shared = {"c.py::t1": 1.0, "c.py::t2": 1.0, "c.py::t3": 1.0}
    three = {t: ["data|c.py"] for t in shared}
    assert mutants.tests_within_budget(list(shared), shared, 12.0, {"data|c.py": 10.0}, three) == \
        ["c.py::t1", "c.py::t2"]
    # a cheap test of another file picked between two of one file runs after them (the file's fixtures once)
    durations = {"a.py::t1": 1.0, "b.py::t2": 2.0, "a.py::t3": 3.0}
    assert mutants.tests_within_budget(list(durations), durations, 0) == ["a.py::t1", "a.py::t3", "b.py::t2"]


def test_the_recording_run_keys_each_fixtures_set_up_time_as_the_tests_that_need_it_do(tmp_path, monkeypatch):
    """A tiny suite run the way mutmut runs ours (its copy in mutants/, whose prefix the ids lose): each test's
    fixtures, each timed once where it was built, add up to what the test costs alone; an overriding fixture
    counts with its own scope; the costs are saved beside the last recording run's."""
    suite = tmp_path / "mutants"
    suite.mkdir()
    (suite / "conftest.py").write_text(textwrap.dedent("""
        import time
        import pytest

        @pytest.fixture(scope="session")
        def shared():
            time.sleep(0.2)
    """))
    (suite / "test_costs.py").write_text(textwrap.dedent("""
        import time
        import pytest

        @pytest.fixture(scope="module")
        def data(shared):
            from mutmut.state import state
            state()._stats.add("m.build")  # what a mutated function's trampoline records
            time.sleep(0.4)

        @pytest.fixture
        def scratch():
            time.sleep(0.1)

        def test_one(data):
            from mutmut.state import state
            state()._stats.add("m.check")

        def test_two(data, scratch):
            pass

        class TestGroup:
            @pytest.fixture(scope="class")
            def built(self):
                time.sleep(0.3)

            def test_three(self, built):
                pass
    """))
    (suite / "test_override.py").write_text(textwrap.dedent("""
        import time
        import pytest

        @pytest.fixture
        def shared():
            time.sleep(0.05)

        def test_four(shared):
            pass
    """))
    monkeypatch.setenv("GRAPE_MUTMUT_HITS", str(tmp_path))
    monkeypatch.setattr(mutants, "ROOT", str(tmp_path))
    monkeypatch.setattr(mutants, "_fixture_costs", {})
    monkeypatch.chdir(tmp_path)
    for name in ("failed", "fixture_s", "uses", "fixture_calls"):
        monkeypatch.setattr(mutants.RecordingRun, name, type(getattr(mutants.RecordingRun, name))())
    from mutmut.state import state
    monkeypatch.setattr(state(), "_stats", set())

    class Credit:  # as mutmut's own recorder does: what was recorded since the last test, to that test
        credited = {}

        def pytest_runtest_teardown(self, item):
            Credit.credited[item.nodeid.removeprefix("mutants/")] = set(state()._stats)
            state()._stats.clear()
    assert pytest.main(["-q", "-p", "no:cacheprovider", f"--rootdir={tmp_path}", "mutants"],
                       plugins=[mutants.RecordingRun(), Credit()]) == 0
    assert Credit.credited["test_costs.py::test_one"] == {"m.build", "m.check"}  # the module's first test
    assert Credit.credited["test_costs.py::test_two"] == set()
    tests_by_function = {"m.check": {"test_costs.py::test_one"}, "m.build": {"test_costs.py::test_one"}}
    assert mutants.RecordingRun.credit_fixture_calls(tests_by_function) == 1  # the pairs not there before
    assert tests_by_function == {"m.check": {"test_costs.py::test_one"},
                                 "m.build": {"test_costs.py::test_one", "test_costs.py::test_two"}}
    fixture_s, uses = mutants.RecordingRun.fixture_s, mutants.RecordingRun.uses
    alone = {test: sum(fixture_s[key] for key in keys) for test, keys in uses.items()}  # every key was timed
    assert set(alone) == {"test_costs.py::test_one", "test_costs.py::test_two", "test_costs.py::TestGroup::test_three",
                          "test_override.py::test_four"}
    assert 0.6 <= alone["test_costs.py::test_one"] < 0.6 + 0.15
    assert 0.7 <= alone["test_costs.py::test_two"] < 0.7 + 0.15
    assert 0.3 <= alone["test_costs.py::TestGroup::test_three"] < 0.3 + 0.15
    assert 0.05 <= alone["test_override.py::test_four"] < 0.05 + 0.12  # its own fixture, not the session's
    assert set(uses["test_costs.py::test_one"]) < set(uses["test_costs.py::test_two"])  # the same module's data
    # the module's data and the session's fixture are built once, for the first test
    order = mutants.tests_within_budget(list(uses), {t: 0.0 for t in uses}, 0, fixture_s, uses)
    assert order == ["test_override.py::test_four", "test_costs.py::TestGroup::test_three",
                     "test_costs.py::test_one", "test_costs.py::test_two"]

    (tmp_path / "mutants" / "fixture_costs.json").write_text(json.dumps(
        {"fixtures": {"old|x.py": 1.0, "data|test_costs.py": 99.0}, "uses": {"x.py::t": ["old|x.py"]}}))
    mutants.RecordingRun.save()  # the last run's costs kept, its own replacing theirs
    saved = mutants.load_fixture_costs()
    assert saved["uses"] == {"x.py::t": ["old|x.py"], **uses}
    assert saved["fixtures"] == {"old|x.py": 1.0, **fixture_s}


def test_the_fixture_costs_are_read_again_when_their_file_changes_and_not_changed_by_a_reader(tmp_path, monkeypatch):
    monkeypatch.setattr(mutants, "ROOT", str(tmp_path))
    monkeypatch.setattr(mutants, "_fixture_costs", {})
    assert mutants.load_fixture_costs() == {"fixtures": {}, "uses": {}}  # before any recording run
    path = tmp_path / "mutants" / "fixture_costs.json"
    path.parent.mkdir()
    path.write_text(json.dumps({"fixtures": {"a|": 1.0}, "uses": {"t": ["a|"]}}))
    first = mutants.load_fixture_costs()
    assert first == {"fixtures": {"a|": 1.0}, "uses": {"t": ["a|"]}}
    first["fixtures"]["added|"] = 9.0  # a caller's change stays its own
    assert mutants.load_fixture_costs() == {"fixtures": {"a|": 1.0}, "uses": {"t": ["a|"]}}
    path.write_text(json.dumps({"fixtures": {"b|": 2.0}, "uses": {}}))
    os.utime(path, ns=(path.stat().st_mtime_ns + 10**9,) * 2)  # a new stamp even on a coarse clock
    assert mutants.load_fixture_costs() == {"fixtures": {"b|": 2.0}, "uses": {}}


def test_a_new_machine_resumes_from_the_committed_record_keeping_only_verdicts_of_unchanged_mutants(tmp_path,
                                                                                                      monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "docs").mkdir()
    (tmp_path / "mutants").mkdir()
    names = ["config.x_a__mutmut_1", "config.x_a__mutmut_2", "config.x_b__mutmut_1", "config.x_b__mutmut_2"]
    sources = {n: (f"def {n.split('.')[1].split('__')[0]}__mutmut_orig(a):\n    return a + 1\n",
                   f"def {n.split('.')[1]}(a):\n    return a - 1\n") for n in names + ["config.x_c__mutmut_1"]}
    outcome = {names[0]: {"exit_code": 1, "duration": 2.5}, names[1]: {"exit_code": 0, "duration": 9.0},
               names[2]: {"exit_code": None}, names[3]: {"exit_code": 36, "duration": 120.0},
               "config.x_c__mutmut_1": {"exit_code": 1, "duration": 1.0}}  # not sampled: not recorded
    state = {"sample": names, "sittings": [{"seconds": 60.0}], "rechecked": [names[1]], "stats_fingerprint": "f",
             "seed": 3}
    mutants.save_record(state, sources, outcome)
    recorded = json.loads((tmp_path / "docs" / "mutants_results.json").read_text())
    assert set(recorded["verdicts"]) == {names[0], names[1], names[3]}
    # the next machine: fresh .meta files (nothing judged), and names[1]'s source changed since
    (tmp_path / "mutants" / "config.py.meta").write_text(json.dumps(
        {"exit_code_by_key": {n: None for n in names}, "durations_by_key": {}}))
    sources[names[1]] = (sources[names[1]][0], sources[names[1]][1].replace("- 1", "- 2"))
    restored_state, restored, stale = mutants.restore_record(sources)
    assert (restored, stale) == (2, 1)
    assert restored_state == {k: v for k, v in state.items() if k != "stats_fingerprint"}  # stats are not kept
    meta = json.loads((tmp_path / "mutants" / "config.py.meta").read_text())
    assert meta["exit_code_by_key"] == {names[0]: 1, names[1]: None, names[2]: None, names[3]: 36}
    assert meta["durations_by_key"] == {names[0]: 2.5, names[3]: 120.0}
    assert mutants.results()[names[3]] == {"exit_code": 36, "duration": 120.0}
    # a verdict the machine already has is its own, not the record's
    meta["exit_code_by_key"][names[1]] = 1
    meta["exit_code_by_key"][names[0]] = 0
    (tmp_path / "mutants" / "config.py.meta").write_text(json.dumps(meta))
    sources[names[1]] = (sources[names[1]][0], sources[names[1]][1].replace("- 2", "- 1"))
    assert mutants.restore_record(sources)[1:] == (0, 0)
    assert json.loads((tmp_path / "mutants" / "config.py.meta").read_text())["exit_code_by_key"][names[0]] == 0


def test_a_subprocess_counts_for_the_test_that_started_it_or_every_test_that_needs_its_fixture(tmp_path,
                                                                                                 monkeypatch):
    monkeypatch.chdir(tmp_path)
    hits = tmp_path / mutants.HITS
    hits.mkdir(parents=True)
    records = [{"test": "mutants/a.py::t1", "functions": ["m.f"]},  # started by a test's call
               {"test": mutants.FIXTURE_PREFIX + "data|a.py", "functions": ["m.g", "m.f"]},  # by a module fixture
               {"test": "", "functions": ["m.h"]},  # outlived its test
               {"test": "b.py::t4", "functions": ["m.h"]}]  # a test that failed in the stats run
    for i, record in enumerate(records):
        (hits / f"{i}.json").write_text(json.dumps(record))
    uses = {"b.py::t4": ["data|a.py"],  # (first: the tests after it still get their credit)
            "a.py::t1": ["data|a.py", "tmp|a.py::t1"], "a.py::t2": ["data|a.py"], "a.py::t3": ["tmp|a.py::t3"]}
    tests_by_function = {"m.f": {"a.py::t1"}}
    assert mutants.credit_subprocess_calls(tests_by_function, uses, {"b.py::t4"}) == 3  # t1: m.g; t2: m.f, m.g
    assert tests_by_function == {"m.f": {"a.py::t1", "a.py::t2"}, "m.g": {"a.py::t1", "a.py::t2"}}


def test_the_current_test_is_the_last_one_marked(tmp_path, monkeypatch):
    monkeypatch.setenv("GRAPE_MUTMUT_HITS", str(tmp_path))
    monkeypatch.delenv("GRAPE_MUTMUT_TEST", raising=False)
    for test in ("a.py::t1", "a.py::t2"):
        mutants.mark_current_test(test)
    assert (tmp_path / "current_test").read_text() == "a.py::t2" and os.environ["GRAPE_MUTMUT_TEST"] == "a.py::t2"


def test_the_command_on_a_new_machine_takes_the_records_sittings_and_verdicts(tmp_path, monkeypatch):
    """main on a machine with generated mutants but no mutants/sample.json: the report counts the committed
    record's sittings and verdicts."""
    monkeypatch.setattr(mutants, "ROOT", str(tmp_path))
    monkeypatch.chdir(tmp_path)
    for folder in ("mutants", "docs", "tools"):
        (tmp_path / folder).mkdir()
    name = "config.x_f__mutmut_1"
    (tmp_path / "pyproject.toml").write_text('[tool.mutmut]\nsource_paths = ["config.py"]\n')  # read on import
    (tmp_path / "config.py").write_text("def f(a):\n    return a + 1\n")
    (tmp_path / "mutants" / "config.py").write_text(
        "def x_f__mutmut_orig(a):\n    return a + 1\n\ndef x_f__mutmut_1(a):\n    return a - 1\n")
    (tmp_path / "mutants" / "config.py.meta").write_text(json.dumps({"exit_code_by_key": {name: None}}))
    (tmp_path / "docs" / "testing.md").write_text(f"{mutants.MARKERS[0]}\n{mutants.MARKERS[1]}\n")
    state = {"sample": [name], "sittings": [{"start": 1.0, "seconds": 600.0, "load": 2.0}], "seed": 2026,
             "size": 420, "all": False, "rechecked": []}
    mutants.save_record(state, mutants.mutants_with_sources(), {name: {"exit_code": 1, "duration": 0.5}})
    assert mutants.main(["--report"]) == 0
    assert json.loads((tmp_path / "mutants" / "sample.json").read_text())["sittings"] == state["sittings"]
    report = (tmp_path / "docs" / "testing.md").read_text()
    assert "Wall time 10 min in 1 sitting(s)" in report
    assert "| **all** | 1 | 1 | 0 | 0 | 0 | 0 | 0 | 100% |" in report


def generate(tmp_path, monkeypatch, source, name="m", swaps=True):
    """mutmut's mutants of a module's source (written where tools/mutants.py reads mutants, as mutmut writes them),
    with the argument swaps added or not: {mutant name: (original function, mutant)}, and the mutated file."""
    from mutmut.mutation import file_mutation
    monkeypatch.setattr(file_mutation, "mutation_operators", file_mutation.mutation_operators)
    monkeypatch.setattr(file_mutation, "create_mutations", file_mutation.create_mutations)
    if swaps:
        mutants.add_argument_swaps()
    generated = file_mutation.mutate_file_contents(f"{name}.py", source)
    path = tmp_path / f"{name}.py"
    path.write_text(generated.code)
    compile(generated.code, str(path), "exec")  # every mutant applies: the file holds them all
    sources = mutants.function_sources(f"{path}.meta")
    return {n: (sources[n.split("__mutmut_")[0] + "__mutmut_orig"], sources[n]) for n in generated.mutant_names}, path


def test_the_argument_swaps_are_one_mutant_a_neighbouring_pair_after_mutmuts_own(tmp_path, monkeypatch):
    source = textwrap.dedent("""
        def f(a, b):
            return g(a, b) + h(x)


        def s(a, b, c):
            return min(a, b) + np.maximum(a, b) + g(a, a) + k(a, b, c) + k(x=a, y=b, z=1, w="w") + m(*a, b)
    """)
    own, _ = generate(tmp_path, monkeypatch, source, swaps=False)
    with_swaps, _ = generate(tmp_path, monkeypatch, source)
    assert {n: with_swaps[n] for n in own} == own  # mutmut's own mutants: the same names, the same code
    added = [mutants.changed_lines(*with_swaps[n]) for n in with_swaps if n not in own]
    assert added == [
        ("return g(a, b) + h(x)", "return g(b, a) + h(x)"),
        ("return min(a, b) + np.maximum(a, b) + g(a, a) + k(a, b, c) + k(x=a, y=b, z=1, w=\"w\") + m(*a, b)",
         "return min(a, b) + np.maximum(a, b) + g(a, a) + k(b, a, c) + k(x=a, y=b, z=1, w=\"w\") + m(*a, b)"),
        ("return min(a, b) + np.maximum(a, b) + g(a, a) + k(a, b, c) + k(x=a, y=b, z=1, w=\"w\") + m(*a, b)",
         "return min(a, b) + np.maximum(a, b) + g(a, a) + k(a, c, b) + k(x=a, y=b, z=1, w=\"w\") + m(*a, b)"),
        ("return min(a, b) + np.maximum(a, b) + g(a, a) + k(a, b, c) + k(x=a, y=b, z=1, w=\"w\") + m(*a, b)",
         "return min(a, b) + np.maximum(a, b) + g(a, a) + k(a, b, c) + k(x=b, y=a, z=1, w=\"w\") + m(*a, b)"),
    ]
    for function in ("x_f__", "x_s__"):  # each function's swaps numbered after its own mutants
        number = {n: int(n.rsplit("_", 1)[1]) for n in with_swaps if n.startswith(function)}
        assert min(v for n, v in number.items() if n not in own) > max(v for n, v in number.items() if n in own)

def test_a_swapped_pair_of_arguments_is_caught_by_a_test_of_the_sign_and_missed_by_one_of_the_size(tmp_path,
                                                                                                   monkeypatch):
    """The class of bug the swaps stand for, through mutmut's own trampolines: a report's paired difference
    computed the wrong way round survives every test whose assertion ignores its sign."""
    source = textwrap.dedent("""
        def mean(xs):
            return sum(xs) / len(xs)


        def diff(values, reference):
            return mean(values) - mean(reference)


        def summary(mine, reference):
            return {"gain": diff(mine, reference)}
    """)
    sources, path = generate(tmp_path, monkeypatch, source, name="swap_report")
    swapped = [n for n, pair in sources.items() if mutants.changed_lines(*pair)[1] ==
               'return {"gain": diff(reference, mine)}']
    assert len(swapped) == 1
    (tmp_path / "test_sign.py").write_text(
        "from swap_report import summary\n\ndef test_sign():\n    assert summary([3, 5], [1, 2])['gain'] == 2.5\n")
    (tmp_path / "test_size.py").write_text(
        "from swap_report import summary\n\ndef test_size():\n    assert abs(summary([3, 5], [1, 2])['gain']) == 2.5\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "swap_report", raising=False)
    exit_codes = {}
    qualified = "swap_report." + swapped[0]  # as mutmut names it to the trampolines: module.name
    for mutant in ("", qualified):
        monkeypatch.setenv("MUTANT_UNDER_TEST", mutant)
        for test in ("test_sign.py", "test_size.py"):
            exit_codes[mutant, test] = int(pytest.main(["-q", "-p", "no:cacheprovider", f"--rootdir={tmp_path}",
                                                        str(tmp_path / test)]))
    monkeypatch.delitem(sys.modules, "swap_report", raising=False)
    assert exit_codes == {("", "test_sign.py"): 0, ("", "test_size.py"): 0,
                          (qualified, "test_sign.py"): 1, (qualified, "test_size.py"): 0}


def test_the_mutated_files_are_made_again_once_when_the_added_operators_change(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "mutants").mkdir()
    made = tmp_path / "mutants" / "config.py"
    made.write_text("x = 1\n")
    (tmp_path / "mutants" / "config.py.meta").write_text("{}")
    stamp = tmp_path / mutants.OPERATORS_STAMP
    for written, dated_back in ((None, True), ("swap_arguments 0", True), (mutants.ADDED_OPERATORS, False)):
        os.utime(made, (1e9, 1e9))
        if written is not None:
            stamp.write_text(written + "\n")
        mutants.date_back_for_new_operators()
        assert (made.stat().st_mtime == 0) == dated_back, written
