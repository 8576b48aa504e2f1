"""Generated mutation testing: mutmut's mutants of the modules a wrong result would come from, a seeded sample of
them (or all), each run against only the tests that reach its function, cheapest test first, stopping at the first
failure; resumable; the per-module table is written into docs/testing.md and the survivors into docs/mutants.md.

    nice -n 10 python3 tools/mutants.py            # the seeded sample (420 mutants); run it again to resume
    python3 tools/mutants.py --all --jobs 16       # every mutant, on a machine with more cores
    python3 tools/mutants.py --report              # rewrite the table from the results so far
    python3 tools/mutants.py --survivors           # each surviving mutant's diff, for triage
    python3 tools/mutants.py --fresh               # start over (after merging: the run on the final commit)

The modules are pyproject.toml's [tool.mutmut] source_paths (only the report logic of the study runner
studies/ is sampled: REPORT_FUNCTIONS). mutmut 3 (docs/testing.md says why it and not cosmic-ray) copies the
repository to mutants/, with every function of those modules replaced by a trampoline that calls the original or one of its
mutants, chosen by the environment variable MUTANT_UNDER_TEST, which subprocesses inherit: a test that runs
`python3 train.py` or torchrun tests the mutant too. mutmut first runs the whole suite once to record which tests
reach each function ("stats"); it sees only calls in the test process, so a sitecustomize (tools/mutants_site/)
records the calls made in subprocesses during that run, and they are added to the tests of each function. Results
are kept per mutant in mutants/ (mutmut's own .meta files): a stopped run resumes with the mutants it has not
judged; a function that changed since is judged again. The sample's verdicts and sittings are also committed in
docs/mutants_results.json, from which a new machine or clone resumes (mutants/ is not committed). This script
adds an operator that swaps two arguments of a call (swap_arguments), the sampling, the cheapest-first test order,
the subprocess calls, the record and the report; it depends on mutmut's internals and is pinned to mutmut 3.8.

Mutants that change only the text of a message (an exception's, a warning's, a printed line's) are left out of
the population: they are listed as such in the report's counts, not sampled. Every other survivor must be killed
by a test or listed in tools/mutants_equivalent.toml with a one-line reason.
"""
from __future__ import annotations

import argparse
import ast
import datetime
import difflib
import glob
import hashlib
import json
import os
import random
import re
import shutil
import signal
import subprocess
import sys
import textwrap
import time
import tomllib

import pytest

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
STATE = os.path.join("mutants", "sample.json")
REPORT = os.path.join("docs", "testing.md")  # the table goes between its mutants:begin/end markers
SURVIVORS = os.path.join("docs", "mutants.md")
# the run's record, committed: mutants/ is not, and a new machine (or clone) resumes from this file
RECORD = os.path.join("docs", "mutants_results.json")
MARKERS = ("<!-- mutants:begin (tools/mutants.py writes this part) -->", "<!-- mutants:end -->")
EQUIVALENT = os.path.join("tools", "mutants_equivalent.toml")
SITE = os.path.join(ROOT, "tools", "mutants_site")
HITS = os.path.join("mutants", "subprocess_hits")
FAILED_IN_STATS = os.path.join("mutants", "stats_failed.json")  # of the last recording run
FIXTURE_COSTS = os.path.join("mutants", "fixture_costs.json")  # each fixture's set-up time, each test's fixtures
LEFT_OUT = os.path.join("mutants", "left_out_tests.json")  # of all of them
DEFAULT_SAMPLE, DEFAULT_SEED, MIN_PER_MODULE = 420, 2026, 8

# The report logic of the study runner studies/ (the rest runs jobs; a wrong number in the report comes from these).
REPORT_FUNCTIONS = {"read_records", "run_trained", "final_val_loss", "run_finished", "lost_records",
                    "checkpoint_identity", "describe", "paired_difference", "verdict", "read_json", "run_row",
                    "extrapolation_summary", "zero_shot_summary", "count_parameters", "setup_summary",
                    "build_report", "fmt", "setup_lines", "paper_warning", "markdown"}
# Rows of the table: the modules (a package is one row).
GROUPS = [("config.py", "config"), ("checkpoints.py", "checkpoints"), ("training/", "training."),
          ("data/", "data."), ("hf/", "hf."), ("eval/", "eval."), ("positional.py", "positional"),
          ("model.py", "model"), ("attention.py", "attention"), ("lm_loss.py", "lm_loss"),
          ("attention_kernels/grape_ap.py", "attention_kernels.grape_ap"),
          ("studies/ (report)", "studies.")]
# Each mutated module's own test file, by the rule of docs/testing.md ("Where a module's tests are": tests/test_<module>.py,
# test_<package>_<module>.py for data/, hf/ and eval/), and where one other file holds part of its tests by an
# older name, that file too; None: the module has no own file yet (its tests are in the train.py files). --own-file
# runs each sampled mutant against these files alone, to measure what `pytest tests/test_<module>.py` catches.
OWN_TEST_FILES = {
    "config": ["tests/test_config.py"], "checkpoints": ["tests/test_checkpoints.py"],
    "training.checkpointing": ["tests/test_checkpointing.py"], "training.distributed": ["tests/test_distributed.py"],
    "training.divergence": ["tests/test_divergence.py"], "training.errors": ["tests/test_training_layout.py"],
    "training.layout": ["tests/test_training_layout.py"], "training.memory": ["tests/test_memory.py"],
    "training.metrics": ["tests/test_metrics.py"], "training.optimizer": ["tests/test_optimizer.py"],
    "training.step": ["tests/test_step.py"], "training.stopping": ["tests/test_stopping.py"],
    "data.loader": ["tests/test_data_loader.py"],
    "data.prefetch": ["tests/test_data_prefetch.py", "tests/test_data_verify.py"],
    "data.manifest": ["tests/test_data_manifest.py"], "data.verify": ["tests/test_data_verify.py"],
    "data.shards": ["tests/test_data_prepare.py"], "data.prepare": ["tests/test_data_prepare.py"],
    "data.sources": ["tests/test_data_sources.py"], "data.pipeline": ["tests/test_data_pipeline.py"],
    "data.scratch": ["tests/test_data_scratch.py"], "data.assemble": ["tests/test_data_assemble.py"],
    "data.prepared": ["tests/test_data_prepared.py"],
    "hf.export": ["tests/test_hf_export.py"], "hf.init_from": ["tests/test_hf_init_from.py"],
    "hf.qwen3": ["tests/test_hf_qwen3.py"], "hf.remote_code": ["tests/test_hf_remote_code.py"],
    "hf.tokenizer_files": ["tests/test_hf_tokenizer_files.py"],
    "eval.zero_shot": ["tests/test_eval_zero_shot.py"], "eval.lm_adapter": ["tests/test_eval_adapter.py"],
    "eval.extrapolation": ["tests/test_eval_extrapolation.py"], "eval.tasks": ["tests/test_eval_tasks.py"],
    "eval.outputs": ["tests/test_eval_outputs.py"], "eval.retrieval": ["tests/test_eval_retrieval.py"],
    "eval.reach": ["tests/test_eval_reach.py"], "data.retrieval": ["tests/test_data_retrieval.py"],
    "training.run_lock": ["tests/test_run_lock.py"],
    "positional": ["tests/test_positional.py"], "model": ["tests/test_model.py"],
    "attention": ["tests/test_attention.py"], "lm_loss": ["tests/test_lm_loss.py"],
    "attention_kernels.grape_ap": ["tests/test_kernels.py"],
    **{f"studies.{part}": ["tests/test_study.py", "tests/test_study_features.py"] for part in ("launch", "summary", "report")},
}
OWN_RESULTS = os.path.join("mutants", "own_file.json")  # --own-file's verdicts (resumable)
OWN_MARKERS = ("<!-- own-file:begin (tools/mutants.py --own-file writes this part) -->", "<!-- own-file:end -->")
TEXT_KEYWORDS = {"help", "description", "epilog", "metavar", "usage"}  # argparse's texts for people
MESSAGE_CALLS = {"print", "say", "warn", "warning", "write", "info", "note", "_write", "error", "fail", "exit"}
STATUS = {1: "killed", 3: "killed", 0: "survived", 5: "no test", 33: "no test", 36: "timeout", 24: "timeout",
          -24: "timeout", 152: "timeout", 255: "timeout", None: "not run"}


# ----------------------------------------------------------------------------- mutants and their sources

def module_of(name: str) -> str:
    return name.split(".x", 1)[0] if ".x_" in name or ".xǁ" in name else name.rsplit(".", 1)[0]


def function_of(name: str) -> str:
    """'training.divergence.xǁDivergenceMonitorǁproblem__mutmut_3' -> 'DivergenceMonitor.problem'."""
    tail = name[len(module_of(name)) + 1:].rsplit("__mutmut_", 1)[0]  # x_function or xǁClassǁmethod
    return tail[2:].replace("ǁ", ".")


def group_of(name: str) -> str | None:
    module = module_of(name)
    for label, prefix in GROUPS:
        if module == prefix or (prefix.endswith(".") and module.startswith(prefix)):
            return label
    return None


def mutated_files() -> list[str]:
    return sorted(glob.glob("mutants/**/*.py.meta", recursive=True))


def function_sources(meta_path: str) -> dict[str, str]:
    """Source of every mutant and original function (by mutmut's mangled name) of one mutated file."""
    path = meta_path[:-len(".meta")]
    with open(path) as f:
        text = f.read()
    lines, sources = text.splitlines(True), {}
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)) and "__mutmut_" in node.name:
            first = min([node.lineno] + [d.lineno for d in node.decorator_list])
            sources[node.name] = "".join(lines[first - 1:node.end_lineno])
    return sources


def mutants_with_sources() -> dict[str, tuple[str, str]]:
    """{mutant name: (original function source, mutant source)} for every mutant mutmut generated."""
    out = {}
    for meta_path in mutated_files():
        with open(meta_path) as f:
            names = list(json.load(f)["exit_code_by_key"])
        sources = function_sources(meta_path)
        for name in names:
            local = name[len(module_of(name)) + 1:]
            original = sources.get(local.rsplit("__mutmut_", 1)[0] + "__mutmut_orig")
            if original is not None and local in sources:
                out[name] = (original, sources[local])
    return out


def changed_lines(original: str, mutant: str) -> tuple[str, str]:
    """The first changed line, before and after (whitespace-trimmed), ignoring the def line's renaming (but not a
    changed default in it)."""
    def unnamed(source):  # (the def line follows the decorators, if any)
        lines = source.splitlines()
        at = next(i for i, line in enumerate(lines) if line.lstrip().startswith(("def ", "async def ")))
        lines[at] = re.sub(r"__mutmut_(orig|\d+)\(", "(", lines[at], count=1)
        return lines
    a, b = unnamed(original), unnamed(mutant)
    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(a=a, b=b, autojunk=False).get_opcodes():
        if tag != "equal":
            return " ".join(x.strip() for x in a[i1:i2]), " ".join(x.strip() for x in b[j1:j2])
    return "", ""


def only_message_text(original: str, mutant: str) -> bool:
    """Whether the mutant changes nothing but string constants inside a raise, inside the arguments of a call that
    prints or warns (MESSAGE_CALLS) or builds an ...Error, in an f-string, or in an argparse text (TEXT_KEYWORDS):
    a message's wording."""
    def body(source):
        tree = ast.parse(textwrap.dedent(source)).body[0]  # (a method's source is indented)
        tree.name = "f"
        return tree

    def walk(a, b, inside):
        if type(a) is not type(b):
            return False
        if isinstance(a, ast.Constant):
            return a.value == b.value or (isinstance(a.value, str) and isinstance(b.value, str) and inside)
        if isinstance(a, ast.AST):
            here = inside or isinstance(a, (ast.Raise, ast.JoinedStr)) or (
                isinstance(a, ast.keyword) and a.arg in TEXT_KEYWORDS) or (
                isinstance(a, ast.Call) and (getattr(a.func, "id", None) or getattr(a.func, "attr", None)) in
                MESSAGE_CALLS) or (isinstance(a, ast.Call) and (getattr(a.func, "id", "") or "").endswith("Error"))
            return all(walk(getattr(a, field, None), getattr(b, field, None), here) for field in a._fields)
        if isinstance(a, list):
            return len(a) == len(b) and all(walk(x, y, inside) for x, y in zip(a, b))
        return a == b
    try:
        return walk(body(original), body(mutant), False)
    except SyntaxError:
        return False


def population(sources: dict[str, tuple[str, str]]) -> tuple[dict[str, list[str]], dict[str, int]]:
    """The sampled population per table row, and per row the number of mutants left out as message wording."""
    rows, wording = {label: [] for label, _ in GROUPS}, {label: 0 for label, _ in GROUPS}
    for name, (original, mutant) in sorted(sources.items()):
        label = group_of(name)
        if label is None:
            continue
        if module_of(name).startswith("studies.") and function_of(name).split(".")[-1] not in REPORT_FUNCTIONS:
            continue
        if only_message_text(original, mutant):
            wording[label] += 1
            continue
        rows[label].append(name)
    return rows, wording


def draw_sample(rows: dict[str, list[str]], size: int, seed: int) -> list[str]:
    """size mutants spread over the rows in proportion to their populations (at least MIN_PER_MODULE each, or all
    of a smaller row). Each row's mutants are ranked by a seeded hash of their names and the first ones taken, so a
    mutant stays in the sample while its row's population hardly changes: a sitting after a merge judges again only
    the mutants of the functions that changed (mutmut forgets their results) and the few that entered the sample."""
    total = sum(len(v) for v in rows.values())
    chosen = []
    for label, names in rows.items():
        n = min(len(names), max(MIN_PER_MODULE, round(size * len(names) / total)))
        chosen += sorted(names, key=lambda name: hashlib.sha256(f"{seed}:{name}".encode()).hexdigest())[:n]
    return sorted(chosen)


# ----------------------------------------------------------------------------- an operator mutmut lacks

# Calls whose result does not depend on the order of two of their arguments: swapping them makes equivalent mutants.
ORDERLESS_CALLS = {"min", "max", "minimum", "maximum", "isclose", "hypot", "gcd"}
ADDED_OPERATORS = "swap_arguments 1"  # a change makes mutmut generate every mutated file again, once
OPERATORS_STAMP = os.path.join("mutants", "added_operators")  # the ADDED_OPERATORS the files in mutants/ were made with


def swap_arguments(node):
    """mutmut-style operator over a libcst Call: each pair of neighbouring arguments swapped, one mutant a pair,
    positional (f(a, b) -> f(b, a)) or keyword (f(x=a, y=b) -> f(x=b, y=a), where neither is a constant: a default
    swapped with a help text is a type error, not a question of order). It stands for a difference, ratio or
    comparison a caller passes the wrong way round, which only a test whose data makes the order matter catches.
    No mutant for a call that ignores the order (ORDERLESS_CALLS) or for two arguments written the same."""
    import libcst as cst
    func = node.func
    called = func.value if isinstance(func, cst.Name) else func.attr.value if isinstance(func, cst.Attribute) else ""
    if called in ORDERLESS_CALLS:
        return
    args = node.args
    for i in range(len(args) - 1):
        a, b = args[i], args[i + 1]
        if a.star or b.star or (a.keyword is None) != (b.keyword is None):
            continue
        if a.keyword is not None and (is_constant(a.value) or is_constant(b.value)):
            continue
        if cst.Module(body=[]).code_for_node(a.value) == cst.Module(body=[]).code_for_node(b.value):
            continue
        yield node.with_changes(args=[*args[:i], a.with_changes(value=b.value), b.with_changes(value=a.value),
                                      *args[i + 2:]])


def is_constant(value) -> bool:
    import libcst as cst
    return isinstance(value, (cst.BaseNumber, cst.BaseString)) or (
        isinstance(value, cst.Name) and value.value in ("True", "False", "None")) or (
        isinstance(value, cst.UnaryOperation) and isinstance(value.expression, cst.BaseNumber))


def add_argument_swaps() -> None:
    """Adds swap_arguments to mutmut's operators, in this process and the ones it forks to generate mutants. Its
    mutants are numbered after mutmut's own in each function, so mutmut's keep their names, and the verdicts
    recorded under them (in mutants/ and RECORD) stay theirs."""
    import libcst as cst
    from mutmut.mutation import file_mutation, mutators
    if getattr(file_mutation.create_mutations, "adds_argument_swaps", False):
        return
    swapped = {}  # id -> node (held, so that no other node takes its id before the sort)

    def operator(node):
        for mutant in swap_arguments(node):
            swapped[id(mutant)] = mutant
            yield mutant
    file_mutation.mutation_operators = [*mutators.mutation_operators, (cst.Call, operator)]
    create = file_mutation.create_mutations

    def swaps_last(*args, **kwargs):
        swapped.clear()
        module, found, ignored_classes, ignored_functions = create(*args, **kwargs)
        found.sort(key=lambda mutation: id(mutation.mutated_node) in swapped)  # stable: each group keeps its order
        return module, found, ignored_classes, ignored_functions
    swaps_last.adds_argument_swaps = True
    file_mutation.create_mutations = swaps_last


def date_back_for_new_operators() -> None:
    """mutmut makes a file's mutants again only when the file is newer than its copy in mutants/: where the copies
    were made with other added operators (OPERATORS_STAMP), they are dated back so that each is made again (the
    verdicts of mutmut's own mutants are kept while their function is unchanged)."""
    if os.path.exists(OPERATORS_STAMP):
        with open(OPERATORS_STAMP) as f:
            if f.read().strip() == ADDED_OPERATORS:
                return
    for meta_path in mutated_files():
        if os.path.exists(meta_path[:-len(".meta")]):
            os.utime(meta_path[:-len(".meta")], (0, 0))


# ----------------------------------------------------------------------------- running mutmut

def patch_mutmut(state: dict) -> None:
    """Three changes to mutmut's flow: each mutant's tests run cheapest first within the budget (pytest keeps the
    order of the ids given); the recording run (RecordingRun) also credits the calls made in the suite's
    subprocesses and in fixtures' set-up to every test they serve, and times the fixtures; and the clean run of the
    selected tests is skipped when the stats run (the same tests, unmutated) passed."""
    import mutmut.__main__ as main
    from mutmut.runners import harness
    from mutmut.state import state as mutmut_state

    add_argument_swaps()  # mutmut's run makes the mutants of a file changed since again
    regular = harness.PytestRunner._pytest_args_regular_run

    def cheapest_first(self, tests):
        costs = load_fixture_costs()
        return regular(self, tests_within_budget(tests, mutmut_state().duration_by_test, state.get("budget_s") or 0,
                                                 costs["fixtures"], costs["uses"]))
    harness.PytestRunner._pytest_args_regular_run = cheapest_first

    execute = harness.PytestRunner.execute_pytest

    def with_current_test(self, params, **kwargs):
        """In the stats run (in the child process that runs the tests): the whole suite, not stopping at a failure;
        a test that fails there is reported and left out of every mutant's tests (it could only kill mutants
        falsely), and the run counts as collected."""
        if os.environ.get("MUTANT_UNDER_TEST") != "stats":
            return execute(self, params, **kwargs)
        kwargs["plugins"] = [*kwargs.get("plugins", []), RecordingRun()]
        from mutmut.mutation import trampoline
        if not getattr(trampoline.get_mutant_under_test, "outside_compiled_code", False):
            trampoline.get_mutant_under_test = outside_compiled_code(trampoline.get_mutant_under_test)
        code = execute(self, [p for p in params if p != "-x"], **kwargs)
        RecordingRun.credit_fixture_calls(mutmut_state().tests_by_mangled_function_name)
        RecordingRun.save()
        return 0 if code == 1 and RecordingRun.failed else code
    harness.PytestRunner.execute_pytest = with_current_test

    main.copy_also_copy_files = copy_unmutated_files

    collect = main.run_stats_collection

    def stats_with_subprocesses(runner, tests=None):
        os.makedirs(HITS, exist_ok=True)
        for old in glob.glob(os.path.join(HITS, "*.json")):
            os.remove(old)
        os.environ["GRAPE_MUTMUT_HITS"] = os.path.abspath(HITS)
        os.environ["PYTHONPATH"] = SITE + os.pathsep + os.environ.get("PYTHONPATH", "")
        # also where tests set PYTHONPATH to the repository alone (it acts only during this run)
        shutil.copy(os.path.join(SITE, "sitecustomize.py"), os.path.join("mutants", "sitecustomize.py"))
        try:
            collect(runner, tests)
        finally:
            os.environ.pop("GRAPE_MUTMUT_HITS", None)
            os.environ["PYTHONPATH"] = os.environ["PYTHONPATH"].replace(SITE + os.pathsep, "", 1)
        failed = []
        if os.path.exists(FAILED_IN_STATS):
            with open(FAILED_IN_STATS) as f:
                failed = json.load(f)
        if failed:
            print(f"    {len(failed)} test(s) failed in the stats run and are left out of every mutant's tests: "
                  + ", ".join(failed), flush=True)
            for function, reaching in mutmut_state().tests_by_mangled_function_name.items():
                reaching.difference_update(failed)
            left_out = sorted(set(left_out_tests()) | set(failed))  # read before "w" empties the file
            with open(LEFT_OUT, "w") as f:
                json.dump(left_out, f)
        added = credit_subprocess_calls(mutmut_state().tests_by_mangled_function_name,
                                        load_fixture_costs()["uses"], set(failed))
        from mutmut.stats import save_stats
        save_stats()
        state["stats_ok"] = True
        state["stats_fingerprint"] = fingerprint()
        print(f"    {added} (test, function) pairs seen only in subprocesses added")
    main.run_stats_collection = stats_with_subprocesses

    clean = None

    def get_runner(max_children):
        nonlocal clean
        runner = real_get_runner(max_children)
        clean = runner.run_clean_tests
        runner.run_clean_tests = lambda tests: 0 if state.get("stats_ok") else clean(tests)
        return runner
    real_get_runner = main.get_mutant_runner
    main.get_mutant_runner = get_runner


class RecordingRun:
    """Tells the subprocesses of the stats run which test started them, notes the tests that fail, times each
    fixture's set-up (mutmut records only the tests' call phase), and notes the functions each fixture's set-up
    calls: mutmut credits them to the test being set up only, and a module-scoped fixture is set up for the
    module's first test, so an assertion about its work in a later test would never meet their mutants."""
    failed, fixture_s, uses, fixture_calls = [], {}, {}, {}

    @classmethod
    def pytest_runtest_setup(cls, item):
        mark_current_test(item.nodeid)
        cls.uses[item.nodeid.removeprefix("mutants/")] = fixture_keys(item)

    @classmethod
    @pytest.hookimpl(wrapper=True)
    def pytest_fixture_setup(cls, fixturedef, request):
        # pytest has set up the fixture's own fixtures before this hook: their time is not counted twice
        from mutmut.state import state as mutmut_state
        key = f"{fixturedef.argname}|{request.node.nodeid.removeprefix('mutants/')}"
        hits, test = mutmut_state()._stats, os.environ.get("GRAPE_MUTMUT_TEST", "")
        before = set(hits)
        hits.clear()
        mark_current_test(FIXTURE_PREFIX + key)  # a subprocess the fixture starts records under it
        started = time.perf_counter()
        try:
            return (yield)
        finally:
            cls.fixture_s[key] = cls.fixture_s.get(key, 0.0) + time.perf_counter() - started
            cls.fixture_calls.setdefault(key, set()).update(hits)
            hits.update(before)  # mutmut still credits them to this test too
            mark_current_test(test)

    @classmethod
    def credit_fixture_calls(cls, tests_by_function: dict) -> int:
        """Each function a fixture's set-up called, credited to every test that needs the fixture; returns the
        (test, function) pairs added."""
        added = 0
        for test, keys in cls.uses.items():
            for key in keys:
                for function in cls.fixture_calls.get(key, ()):
                    if test not in tests_by_function.setdefault(function, set()):
                        tests_by_function[function].add(test)
                        added += 1
        return added

    @classmethod
    def pytest_runtest_logreport(cls, report):
        if report.failed:
            cls.failed.append(report.nodeid.removeprefix("mutants/"))

    @classmethod
    def save(cls):
        """The failed tests, and the fixture costs added to those of the last recording run (a run of only the new
        tests keeps the others' costs); written where the script reads them (the tests run in mutants/)."""
        with open(os.path.join(ROOT, FAILED_IN_STATS), "w") as f:
            json.dump(cls.failed, f)
        costs = load_fixture_costs()
        costs["fixtures"].update(cls.fixture_s)
        costs["uses"].update(cls.uses)
        with open(os.path.join(ROOT, FIXTURE_COSTS), "w") as f:
            json.dump(costs, f)


FIXTURE_PREFIX = "fixture:"  # a subprocess started by a fixture's set-up records under "fixture:KEY"


def mark_current_test(test: str) -> None:
    """Tells the stats run's subprocesses whom their calls count for: in the environment they inherit, and in a
    file for those whose environment a test module built at import time (without the variable)."""
    os.environ["GRAPE_MUTMUT_TEST"] = test
    with open(os.path.join(os.environ["GRAPE_MUTMUT_HITS"], "current_test"), "w") as f:
        f.write(test)


def credit_subprocess_calls(tests_by_function: dict, uses: dict, failed: set) -> int:
    """The functions each subprocess of the stats run called (its file in HITS), credited to the test that started
    it, or to every test that needs the fixture whose set-up started it; a test that failed in the stats run is
    left out. Returns the (test, function) pairs added."""
    added = 0
    for path in glob.glob(os.path.join(HITS, "*.json")):
        with open(path) as f:
            record = json.load(f)
        started_by = record["test"].removeprefix("mutants/")
        if not started_by:
            continue  # (a subprocess that outlived its test)
        if started_by.startswith(FIXTURE_PREFIX):
            key = started_by[len(FIXTURE_PREFIX):]
            tests = [test for test, keys in uses.items() if key in keys]
        else:
            tests = [started_by]
        for test in tests:
            if test in failed:
                continue
            for function in record["functions"]:
                if test not in tests_by_function.setdefault(function, set()):
                    tests_by_function[function].add(test)
                    added += 1
    return added


def tests_within_budget(tests, durations: dict, budget: float, fixture_s: dict | None = None,
                        uses: dict | None = None) -> list:
    """The cheapest tests first; with a budget, only the ones that fit in it (at least one). A test costs its
    recorded call time plus the set-up of its fixtures (uses[test], timed in fixture_s) that no test before it set
    up: each mutant runs in a fresh process, so a fixture built for a module's first test is built again for every
    mutant. The tests picked are then grouped by file, in the order each file first came, so that a module's
    fixtures are built once (pytest tears them down when the next test is in another file). An unrecorded test
    comes last. An empty list means the whole suite to mutmut (its forced-fail check): kept as it is."""
    fixture_s, uses = fixture_s or {}, uses or {}
    users = {}  # fixture key: the tests that need it
    for test in tests:
        for key in uses.get(test, ()):
            users.setdefault(key, []).append(test)
    cost = {t: durations.get(t, 1e9) + sum(fixture_s.get(k, 0.0) for k in set(uses.get(t, ()))) for t in tests}
    picked, spent = [], 0.0
    while cost:
        test = min(cost, key=lambda t: (cost[t], t))
        if budget and picked and spent + cost[test] > budget:
            break
        spent += cost.pop(test)
        picked.append(test)
        for key in set(uses.get(test, ())):
            for other in users.pop(key, ()):
                if other in cost:
                    cost[other] -= fixture_s.get(key, 0.0)
    first = {}
    for i, test in enumerate(picked):
        first.setdefault(test.split("::")[0], i)
    return sorted(picked, key=lambda t: first[t.split("::")[0]])


def fixture_keys(item) -> list[str]:
    """The fixtures a test needs, each as "name|id of the node it is set up for" (the test's own id for a
    function-scoped fixture, the file's for a module-scoped one, "" for the session), as the stats run keys their
    set-up times."""
    keys = []
    for name in item.fixturenames:
        definitions = item._fixtureinfo.name2fixturedefs.get(name)
        if not definitions:
            continue  # pytest's own request
        scope = definitions[-1].scope
        node = item if scope == "function" else item.session if scope == "session" else \
            item.getparent({"class": pytest.Class, "module": pytest.Module, "package": pytest.Package}[scope])
        keys.append(f"{name}|{(node.nodeid if node else '').removeprefix('mutants/')}")
    return keys


def load_fixture_costs() -> dict:
    """{"fixtures": {key: set-up seconds}, "uses": {test: [key]}} of the recording runs (empty before one); read
    once per change of the file, not once per mutant."""
    path = os.path.join(ROOT, FIXTURE_COSTS)
    stamp = os.stat(path).st_mtime_ns if os.path.exists(path) else None
    if _fixture_costs.get("stamp") != stamp or "costs" not in _fixture_costs:
        costs = {"fixtures": {}, "uses": {}}
        if stamp is not None:
            with open(path) as f:
                costs = json.load(f)
        _fixture_costs.update(stamp=stamp, costs=costs)
    return {key: dict(value) for key, value in _fixture_costs["costs"].items()}


_fixture_costs: dict = {}


def outside_compiled_code(get_mutant_under_test):
    """mutmut's get_mutant_under_test, except that in the stats run code that torch.compile traces calls the
    original functions without recording the call: the recording is Python that dynamo cannot trace (a fullgraph
    compile would fail); the same functions run eagerly too. (tools/mutants_site/sitecustomize.py does the same
    in the stats run's subprocesses; it cannot import this file.)"""
    import torch

    def get():
        name = get_mutant_under_test()
        return "" if name == "stats" and torch.compiler.is_compiling() else name
    get.outside_compiled_code = True
    return get


def plan_sitting(state: dict, outcome: dict, budget: float, recheck: bool, is_equivalent) -> list[str]:
    """The sampled mutants this sitting runs, and its budget in state: those not judged yet, with the given budget;
    or with --recheck the survivors not listed as equivalent (listed ones would only run every test that reaches
    them to survive again), each with all its tests, and those no test reached (a later recording run may have
    found tests that do)."""
    if not recheck:
        state["budget_s"] = state["first_budget_s"] = budget
        return [n for n in state["sample"] if outcome.get(n, {}).get("exit_code") is None]
    pending = [n for n in state["sample"] if STATUS.get(outcome.get(n, {}).get("exit_code")) in ("survived", "no test")
               and not is_equivalent(n)]
    state["budget_s"] = 0
    state["rechecked"] = sorted(set(state.get("rechecked", [])) | set(pending))
    return pending


def copy_unmutated_files() -> None:
    """mutmut's also_copy, without overwriting the mutated modules inside the folders it names (mutmut's own copy
    would, and then regenerate every mutant of them on each start)."""
    from mutmut.configuration import config
    mutated = {os.path.normpath(str(p)) for p in config().source_paths}

    def skip(folder, names):
        return [n for n in names if os.path.normpath(os.path.join(folder, n)) in mutated or n == "__pycache__"]
    for path in map(str, config().also_copy):
        destination = os.path.join("mutants", path)
        if not os.path.exists(path) or os.path.normpath(path) in mutated:
            continue
        if os.path.isfile(path):
            os.makedirs(os.path.dirname(destination) or ".", exist_ok=True)
            shutil.copy2(path, destination)
        else:
            shutil.copytree(path, destination, dirs_exist_ok=True, ignore=skip)


def left_out_tests() -> list[str]:
    if not os.path.exists(LEFT_OUT):
        return []
    with open(LEFT_OUT) as f:
        return json.load(f)


def fingerprint() -> str:
    """A hash of the mutated modules and the tests: while it is the one of the last stats run (which ran all the
    tests on the unmutated code and passed), mutmut's clean run of the same tests is skipped."""
    from mutmut.configuration import config
    digest = hashlib.sha256()
    paths = [str(p) for p in config().source_paths] + ["tests"]
    files = sorted(f for p in paths for f in ([p] if os.path.isfile(p) else glob.glob(f"{p}/**/*.py", recursive=True)))
    for path in files:
        with open(path, "rb") as f:
            digest.update(path.encode() + b"\0" + f.read())
    return digest.hexdigest()


def results() -> dict[str, dict]:
    """{mutant name: {"exit_code", "duration"}} from mutmut's .meta files."""
    out = {}
    for meta_path in mutated_files():
        with open(meta_path) as f:
            meta = json.load(f)
        for name, code in meta["exit_code_by_key"].items():
            out[name] = {"exit_code": code, "duration": meta.get("durations_by_key", {}).get(name)}
    return out


def source_digest(original: str, mutant: str) -> str:
    return hashlib.sha256(f"{original}\0{mutant}".encode()).hexdigest()[:16]


def save_record(state: dict, sources: dict, outcome: dict) -> None:
    """The run's state (sample, sittings, rechecks) and each judged sampled mutant's exit code, with a digest of
    its source and its function's, in RECORD: one mutant a line, for readable diffs."""
    kept = {k: v for k, v in state.items() if k not in ("stats_fingerprint", "stats_ok")}
    verdicts = {n: [outcome[n]["exit_code"], outcome[n].get("duration"), source_digest(*sources[n])]
                for n in state["sample"] if n in sources and outcome.get(n, {}).get("exit_code") is not None}
    lines = [json.dumps(n, ensure_ascii=False) + ": " + json.dumps(v) for n, v in sorted(verdicts.items())]
    with open(RECORD, "w") as f:
        f.write('{"state": ' + json.dumps(kept, sort_keys=True) + ',\n"verdicts": {\n' + ",\n".join(lines) + "\n}}\n")


def restore_record(sources: dict) -> tuple[dict, int, int]:
    """On a machine without mutants/sample.json: the committed record's state, and its verdicts written into
    mutmut's .meta files for each mutant whose source and function are unchanged (mutmut keeps a verdict while its
    function is unchanged too); returns (state, verdicts restored, verdicts dropped as stale)."""
    with open(RECORD) as f:
        record = json.load(f)
    restored = stale = 0
    for meta_path in mutated_files():
        with open(meta_path) as f:
            meta = json.load(f)
        changed = False
        for name in meta["exit_code_by_key"]:
            verdict = record["verdicts"].get(name)
            if verdict is None or meta["exit_code_by_key"][name] is not None:
                continue
            code, duration, digest = verdict
            if name not in sources or source_digest(*sources[name]) != digest:
                stale += 1
                continue
            meta["exit_code_by_key"][name] = code
            meta.setdefault("durations_by_key", {})[name] = duration
            restored, changed = restored + 1, True
        if changed:
            with open(meta_path, "w") as f:
                json.dump(meta, f)
    return record["state"], restored, stale


def load_equivalents() -> list[dict]:
    if not os.path.exists(EQUIVALENT):
        return []
    with open(EQUIVALENT, "rb") as f:
        return tomllib.load(f).get("equivalent", [])


def equivalence(name: str, sources: dict, equivalents: list[dict]) -> str | None:
    """The reason a mutant is listed as equivalent, or None: matched on its function and changed line."""
    if name not in sources:
        return None
    before, after = changed_lines(*sources[name])
    for entry in equivalents:
        if entry["function"] == f"{module_of(name)}.{function_of(name)}" and entry["original"] == before \
                and entry["mutant"] == after:
            return entry["reason"]
    return None


def git(*args) -> str:
    return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True).stdout.strip()


def write_report(state: dict, sources: dict, wording: dict) -> dict:
    outcome, equivalents = results(), load_equivalents()
    rows = {label: {"killed": 0, "survived": 0, "equivalent": 0, "timeout": 0, "no test": 0, "not run": 0}
            for label, _ in GROUPS}
    survivors = []
    for name in state["sample"]:
        status = STATUS.get(outcome.get(name, {}).get("exit_code"), "other")
        label = group_of(name)
        reason = equivalence(name, sources, equivalents) if status in ("survived", "no test") else None
        if reason:
            status = "equivalent"
        if status in ("survived", "no test"):
            survivors.append(name)
        rows[label][status if status in rows[label] else "not run"] += 1
    table = [f"{state['command']} on commit `{state['commit']}`, {state['date']}: {len(state['sample'])} mutants "
             f"drawn with seed {state['seed']} from {state['population']} (the modules' {state['generated']} "
             f"generated mutants less {sum(wording.values())} that change only a message's text, and less the "
             f"non-report functions of studies/), in proportion to each module's mutants (at least "
             f"{MIN_PER_MODULE}). Wall time {state['wall_s'] / 60:.0f} min in {len(state['sittings'])} sitting(s), "
             f"{state['machine']}, mean load {state['mean_load']:.1f} while it ran (other work shared the machine). "
             f"Each mutant ran the tests that reach its function, cheapest first, stopping at the first failure, up "
             f"to {state.get('first_budget_s', 0):g} s of their recorded time (call and fixture set-up); "
             f"{len(state.get('rechecked', []))} survivors of that ran again with all of them (`--recheck`).",
             "", "| module | sampled | killed | survived | equivalent | timeout | no test reaches it | not run | "
             "killed / non-equivalent |", "|---|---|---|---|---|---|---|---|---|"]
    totals = {k: 0 for k in rows[GROUPS[0][0]]}
    for label, row in rows.items():
        for k, v in row.items():
            totals[k] += v
    for label, row in [*rows.items(), ("**all**", totals)]:
        judged = row["killed"] + row["survived"] + row["timeout"] + row["no test"]
        score = f"{100 * (row['killed'] + row['timeout']) / judged:.0f}%" if judged else "-"
        table.append(f"| {label} | {sum(row.values())} | {row['killed']} | {row['survived']} | {row['equivalent']} | "
                     f"{row['timeout']} | {row['no test']} | {row['not run']} | {score} |")
    table += ["", f"A timeout counts as killed (the mutant made a test hang). Survivors: {len(survivors)}, listed in "
              f"`{SURVIVORS}`; the equivalent mutants and their reasons are in `{EQUIVALENT}`."]
    if left_out_tests():
        table += ["", "Tests that failed on the unmutated code in mutmut's recording run, and so were left out of "
                  "every mutant's tests: " + ", ".join(f"`{t}`" for t in left_out_tests()) + "."]
    replace_between_markers(os.path.join(ROOT, REPORT), "\n".join(table))
    listing = ["# Surviving generated mutants", "", f"From the run described in `{REPORT}` (`python3 "
               "tools/mutants.py --survivors` prints each one's diff). Each needs a test that kills it, or an "
               f"entry in `{EQUIVALENT}` that says why no test can.", ""]
    for name in survivors:
        before, after = changed_lines(*sources[name]) if name in sources else ("?", "?")
        listing.append(f"- `{name}`: `{before}` -> `{after}`")
    if not survivors:
        listing.append("None.")
    with open(os.path.join(ROOT, SURVIVORS), "w") as f:
        f.write("\n".join(listing) + "\n")
    return {"rows": rows, "totals": totals, "survivors": survivors}


def replace_between_markers(path: str, text: str) -> None:
    with open(path) as f:
        document = f.read()
    begin, end = document.index(MARKERS[0]) + len(MARKERS[0]), document.index(MARKERS[1])
    with open(path, "w") as f:
        f.write(document[:begin] + "\n" + text + "\n" + document[end:])


def load_average() -> float:
    return os.getloadavg()[0]


def own_file_order(sample: list[str], seed: int) -> list[str]:
    """The sample, one mutant of each module in turn (each module's in their seeded rank), so that a sitting
    stopped early has judged some of every module."""
    by_module = {}
    for name in sorted(sample, key=lambda n: hashlib.sha256(f"{seed}:{n}".encode()).hexdigest()):
        by_module.setdefault(module_of(name), []).append(name)
    queues, out = [by_module[m] for m in sorted(by_module)], []
    while any(queues):
        out += [q.pop(0) for q in queues if q]
    return out


def run_own_file(name: str, files: list[str], cap_s: float) -> tuple[int | None, float]:
    """pytest -x on `files` in mutants/ with mutant `name` active ("" = none), in a child forked from this process
    (torch already imported) in its own process group; (exit code or None past cap_s, seconds)."""
    started = time.time()
    pid = os.fork()
    if pid == 0:  # the child: mutants/ is the repository, and its output goes to a log
        try:
            os.setsid()
            os.chdir(os.path.join(ROOT, "mutants"))
            sys.path[:] = [os.getcwd()] + [p for p in sys.path if os.path.abspath(p or ".") not in
                                           (ROOT, os.path.join(ROOT, "tools"))]
            os.environ["MUTANT_UNDER_TEST"] = name
            log = os.open(os.path.join(ROOT, "mutants", "own_file.log"), os.O_WRONLY | os.O_CREAT | os.O_APPEND)
            os.dup2(log, 1)
            os.dup2(log, 2)
            print(f"\n==== {name or '(no mutant)'}: {' '.join(files)}", flush=True)
            code = pytest.main([*files, "-x", "-q", "-p", "no:cacheprovider"])
        except BaseException:
            code = 99
        os._exit(int(code))
    try:
        return wait_own_file(pid, started, cap_s)
    except KeyboardInterrupt:
        os.killpg(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
        raise


def wait_own_file(pid: int, started: float, cap_s: float) -> tuple[int | None, float]:
    while True:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status), time.time() - started
        if time.time() - started > cap_s:
            os.killpg(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
            return None, time.time() - started
        time.sleep(0.2)


def own_file_sitting(sample: list[str], seed: int, cap_s: float, sources: dict, clean: bool = True) -> dict:
    """Each sampled mutant of a module with an own test file against that file alone (OWN_TEST_FILES), after a
    clean run of each file (a file that fails unmutated would kill falsely: its mutants are left out). A mutant is
    killed when pytest fails (exit 1), survives when it passes, and counts as a timeout past max(cap_s, 3 x the
    clean run). Without the clean runs (clean=False: where the whole suite has just passed on the same commit) the
    limit is cap_s, and a mutant still running then is "past the cap", not judged: a slow file cannot be told
    from a hang. Verdicts accumulate in OWN_RESULTS; stop it any time (Ctrl-C or kill PID)."""
    import torch  # noqa: F401 (imported once here, not in every forked child)
    import numpy  # noqa: F401
    import hypothesis  # noqa: F401
    record = {"clean": {}, "verdicts": {}, "seconds": 0.0}
    if os.path.exists(OWN_RESULTS):
        with open(OWN_RESULTS) as f:
            record = json.load(f)
    record["digests"] = record.get("digests", {})
    record["cap_s"] = cap_s
    order = [n for n in own_file_order(sample, seed) if OWN_TEST_FILES.get(module_of(n))]
    pending = [n for n in order if n not in record["verdicts"] or
               record["digests"].get(n) != (source_digest(*sources[n]) if n in sources else None)]
    print(f"--own-file: {len(order)} sampled mutants of modules with an own test file, {len(pending)} to run; "
          f"{len(sample) - len(order)} of modules without one", flush=True)
    started = time.time()

    def stop(signum, frame):
        raise KeyboardInterrupt
    signal.signal(signal.SIGTERM, stop)
    try:
        for i, name in enumerate(pending):
            files = OWN_TEST_FILES[module_of(name)]
            key = " ".join(files)
            if not clean:
                record["clean"].setdefault(key, [0, None])
            if key not in record["clean"]:
                code, seconds = run_own_file("", files, 3600)
                record["clean"][key] = [code, seconds]
                print(f"    clean run of {key}: exit {code}, {seconds:.0f} s", flush=True)
            clean_code, clean_s = record["clean"][key]
            if clean_code != 0:
                record["verdicts"][name] = ["clean run failed", 0.0]
                continue
            code, seconds = run_own_file(name, files, max(cap_s, 3 * clean_s) if clean_s else cap_s)
            verdict = {None: "timeout" if clean_s else "past the cap", 0: "survived", 1: "killed",
                       5: "no test"}.get(code, f"exit {code}")
            record["verdicts"][name] = [verdict, seconds]
            record["digests"][name] = source_digest(*sources[name]) if name in sources else None
            print(f"    [{i + 1}/{len(pending)}] {name}: {verdict} ({seconds:.0f} s)", flush=True)
            with open(OWN_RESULTS, "w") as f:
                json.dump(record, f)
    except KeyboardInterrupt:
        print("stopped: run the same command again to continue", file=sys.stderr)
    finally:
        record["seconds"] += time.time() - started
        with open(OWN_RESULTS, "w") as f:
            json.dump(record, f)
    return record


def write_own_file_report(sample: list[str], record: dict, sources: dict, command: str) -> str:
    """The per-module table of --own-file (killed by the module's own test file / judged), beside the whole
    suite's verdicts of the same mutants from RECORD where their source is unchanged; between OWN_MARKERS."""
    equivalents = load_equivalents()
    suite = {}
    if os.path.exists(RECORD):
        with open(RECORD) as f:
            for name, (code, _, digest) in json.load(f)["verdicts"].items():
                if name in sources and source_digest(*sources[name]) == digest:
                    suite[name] = STATUS.get(code, "other")
    rows = {}
    for name in sample:
        module = module_of(name)
        row = rows.setdefault(module, {"sampled": 0, "equivalent": 0, "judged": 0, "killed": 0, "timeout": 0,
                                       "suite judged": 0, "suite killed": 0, "not run": 0,
                                       "past the cap": 0})
        row["sampled"] += 1
        if equivalence(name, sources, equivalents):
            row["equivalent"] += 1
            continue
        verdict = record["verdicts"].get(name, [None])[0]
        if verdict == "past the cap":
            row["past the cap"] += 1
        elif verdict in ("killed", "survived", "timeout", "no test"):
            row["judged"] += 1
            row["killed"] += verdict == "killed"
            row["timeout"] += verdict == "timeout"
            if suite.get(name) in ("killed", "timeout", "survived", "no test"):
                row["suite judged"] += 1
                row["suite killed"] += suite[name] in ("killed", "timeout")
        else:
            row["not run"] += 1

    def pct(a, b):
        return f"{100 * a / b:.0f}%" if b else "-"
    total = {k: sum(r[k] for r in rows.values()) for k in next(iter(rows.values()))}
    clean = record.get("clean", {})
    lines = [f"{command}: {len(sample)} mutants drawn as the score's sample is (seed, proportions, at least "
             f"{MIN_PER_MODULE} a table row), each run with `pytest -x` on its module's own test file(s) alone "
             f"(`OWN_TEST_FILES` in tools/mutants.py), one mutant at a time; {record.get('seconds', 0) / 60:.0f} "
             f"min on {os.cpu_count()} cores shared with other work. Killed = the own file fails; a timeout "
             f"(3 x the file's clean run, at least the cap) counts as killed; without the clean runs (`--no-clean`, "
             f"after the whole suite passed on the commit) a mutant still running at the cap "
             f"({record.get('cap_s', 0):g} s) is past the cap, not judged. The whole suite's verdicts of the "
             f"same mutants are those of the score above (`{RECORD}`; mutants whose function changed since are "
             f"left out of that column). Equivalent mutants (`{EQUIVALENT}`) are left out of both.",
             "", "| module | own test file(s) | sampled | equivalent | not run | past the cap | killed by own file / "
             "judged | whole suite, same mutants |", "|---|---|---|---|---|---|---|---|"]
    for module in sorted(rows, key=lambda m: [g for g, (_, p) in enumerate(GROUPS) if m == p or
                                              (p.endswith(".") and m.startswith(p))] + [m]):
        r = rows[module]
        files = OWN_TEST_FILES.get(module)
        own = ", ".join(f"`{os.path.basename(f)}`" for f in files) if files else "none yet"
        if files and clean.get(" ".join(files), [0])[0] not in (0, None):
            own += " (failed unmutated: not run)"
        path = module.replace(".", "/") + ".py"
        lines.append(f"| `{path}` | {own} | {r['sampled']} | {r['equivalent']} | {r['not run']} | {r['past the cap']} | "
                     f"{r['killed'] + r['timeout']} / {r['judged']} ({pct(r['killed'] + r['timeout'], r['judged'])}) | "
                     f"{r['suite killed']} / {r['suite judged']} ({pct(r['suite killed'], r['suite judged'])}) |")
    lines.append(f"| **all** | | {total['sampled']} | {total['equivalent']} | {total['not run']} | {total['past the cap']} | "
                 f"{total['killed'] + total['timeout']} / {total['judged']} "
                 f"({pct(total['killed'] + total['timeout'], total['judged'])}) | {total['suite killed']} / "
                 f"{total['suite judged']} ({pct(total['suite killed'], total['suite judged'])}) |")
    text = "\n".join(lines)
    with open(os.path.join(ROOT, REPORT)) as f:
        document = f.read()
    if OWN_MARKERS[0] in document:
        begin, end = document.index(OWN_MARKERS[0]) + len(OWN_MARKERS[0]), document.index(OWN_MARKERS[1])
        with open(os.path.join(ROOT, REPORT), "w") as f:
            f.write(document[:begin] + "\n" + text + "\n" + document[end:])
    return text


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--sample", type=int, default=DEFAULT_SAMPLE, help="mutants to draw (default %(default)s)")
    parser.add_argument("--seed", type=int, default=DEFAULT_SEED, help="seed of the draw (default %(default)s)")
    parser.add_argument("--all", action="store_true", help="every mutant instead of a sample")
    parser.add_argument("--jobs", type=int, default=2, help="mutants run at once (default %(default)s)")
    parser.add_argument("--fresh", action="store_true", help="delete mutants/ and start over")
    parser.add_argument("--report", action="store_true", help="only rewrite the report from the results so far")
    parser.add_argument("--survivors", action="store_true",
                        help="print each survivor's diff and an entry for tools/mutants_equivalent.toml to fill in")
    parser.add_argument("--budget", type=float, default=60.0,
                        help="run a mutant's tests cheapest first only up to this many seconds of their recorded "
                             "time (default %(default)s; 0 = all of them)")
    parser.add_argument("--recheck", action="store_true",
                        help="run the survivors not listed as equivalent, and the mutants no test reached, again "
                             "with all the tests that reach them (no budget)")
    parser.add_argument("--own-file", action="store_true",
                        help="run each sampled mutant against its module's own test file alone (OWN_TEST_FILES) "
                             "and write that table; the score's run, state and record are left as they are")
    parser.add_argument("--no-clean", action="store_true",
                        help="with --own-file: no clean run of each own file first (the whole suite has just passed "
                             "on this commit); a mutant still running at --cap is then not judged")
    parser.add_argument("--cap", type=float, default=120.0,
                        help="with --own-file: a mutant's time limit, at least 3 x its file's clean run "
                             "(default %(default)s s)")
    args = parser.parse_args(argv)
    os.chdir(ROOT)
    try:
        import mutmut  # noqa: F401
    except ImportError:
        print("mutmut is not installed: python3 -m pip install -r requirements-dev.txt", file=sys.stderr)
        return 2
    if args.fresh and os.path.isdir("mutants"):
        shutil.rmtree("mutants")
    import mutmut.__main__ as main_module
    from mutmut.configuration import config

    state = {"sittings": []}
    if os.path.exists(STATE):
        with open(STATE) as f:
            state = json.load(f)
    if not args.report and not args.survivors:
        # before the sample is drawn: mutmut would regenerate the mutants of changed files only inside its run,
        # after a sample drawn from the old ones (a few seconds when nothing changed; minutes the first time)
        print("generating the mutants of new and changed files ...", flush=True)
        os.makedirs("mutants", exist_ok=True)
        from mutmut.utils.file_utils import copy_src_dir
        main_module.set_mutant_under_test("mutant_generation")
        copy_src_dir()
        copy_unmutated_files()
        add_argument_swaps()
        date_back_for_new_operators()
        main_module.create_mutants(max(1, args.jobs))
        with open(OPERATORS_STAMP, "w") as f:
            f.write(ADDED_OPERATORS + "\n")
        main_module.set_mutant_under_test("")
    sources = mutants_with_sources()
    if not sources:
        print("no generated mutants in mutants/: run `python3 tools/mutants.py` first (it generates them, and on "
              f"a new machine resumes from {RECORD})", file=sys.stderr)
        return 2
    if not os.path.exists(STATE) and os.path.exists(RECORD) and not args.fresh:
        state, restored, stale = restore_record(sources)
        with open(STATE, "w") as f:
            json.dump(state, f)
        print(f"resumed from {RECORD}: {restored} verdicts restored"
              + (f", {stale} dropped (their function changed since: they run again)" if stale else ""), flush=True)
    rows, wording = population(sources)
    sample = sorted(n for names in rows.values() for n in names) if args.all else \
        draw_sample(rows, args.sample, args.seed)
    if args.own_file:  # its own record and table: the score's state is not touched
        if not args.report:
            record = own_file_sitting(sample, args.seed, args.cap, sources, clean=not args.no_clean)
        else:
            with open(OWN_RESULTS) as f:
                record = json.load(f)
        print(write_own_file_report(sample, record, sources, f"`python3 tools/mutants.py --own-file --sample "
                                    f"{args.sample} --seed {args.seed}` on commit `{git('rev-parse', '--short', 'HEAD')}`"))
        return 0
    if (state.get("seed"), state.get("size"), state.get("all")) != (args.seed, args.sample, args.all):
        state = {"sittings": [], "stats_fingerprint": state.get("stats_fingerprint")}  # another run: its own time
    state.update(sample=sample, seed=args.seed, size=args.sample, all=args.all)
    state.update(population=sum(len(v) for v in rows.values()), generated=len(sources),
                 commit=git("rev-parse", "--short", "HEAD") + ("-dirty" if git("status", "--porcelain",
                                                                               "--untracked-files=no") else ""),
                 command="`nice -n 10 python3 tools/mutants.py" + (" --all" if args.all else "") + "`",
                 machine=f"{os.cpu_count()} cores, --jobs {args.jobs}")

    if args.survivors:
        equivalents = load_equivalents()
        outcome = results()
        for name in state["sample"]:
            if STATUS.get(outcome.get(name, {}).get("exit_code")) in ("survived", "no test") and \
                    not equivalence(name, sources, equivalents):
                original, mutant = sources[name]
                before, after = changed_lines(original, mutant)
                print(f"# == {name} ({STATUS[outcome[name]['exit_code']]})")
                print("".join("# " + line for line in difflib.unified_diff(
                    original.splitlines(True)[1:], mutant.splitlines(True)[1:], n=1)))
                print(f"[[equivalent]]  # or a test that kills it\nfunction = {json.dumps(f'{module_of(name)}.{function_of(name)}', ensure_ascii=False)}\n"
                      f"original = {json.dumps(before, ensure_ascii=False)}\nmutant = {json.dumps(after, ensure_ascii=False)}\n"
                      'reason = ""\n')
        return 0
    if not args.report:
        equivalents = load_equivalents()
        pending = plan_sitting(state, results(), args.budget, args.recheck,
                               lambda name: equivalence(name, sources, equivalents))
        print((f"rechecking the {len(pending)} survivors not listed as equivalent and mutants no test reached"
               if args.recheck else f"{len(state['sample']) - len(pending)} of {len(state['sample'])} sampled "
                                    f"mutants judged; running {len(pending)}") + f" with {args.jobs} job(s)"
              + (f", each with its cheapest tests up to {state['budget_s']:g} s" if state["budget_s"] else
                 ", each with all its tests"), flush=True)
        started, loads = time.time(), [load_average()]

        def stop(signum, frame):
            raise KeyboardInterrupt  # to the handler below, which records the sitting
        # a run started in the background (`... &`) ignores Ctrl-C's SIGINT; `kill PID` then stops it the same way
        signal.signal(signal.SIGTERM, stop)
        with open(STATE, "w") as f:  # the sample, before any work (a kill -9 keeps it)
            json.dump(state, f)
        if pending:
            config()  # read [tool.mutmut] now, from the repository root
            state["stats_ok"] = state.get("stats_fingerprint") == fingerprint()
            patch_mutmut(state)
            try:
                main_module._run(pending, args.jobs)
            except KeyboardInterrupt:
                print("stopped: run the same command again to continue", file=sys.stderr)
            except SystemExit as stop:
                if stop.code not in (0, None):
                    print(f"mutmut stopped ({stop.code}); see its output above", file=sys.stderr)
                    return 1
            finally:
                loads.append(load_average())
                state["sittings"].append({"start": started, "seconds": time.time() - started,
                                          "load": sum(loads) / len(loads)})
                state.pop("stats_ok", None)
                with open(STATE, "w") as f:
                    json.dump(state, f)
    sittings = state["sittings"]
    state["wall_s"] = sum(s["seconds"] for s in sittings)
    state["mean_load"] = (sum(s["load"] * s["seconds"] for s in sittings) / state["wall_s"]) if state["wall_s"] else 0
    state["date"] = datetime.date.today().isoformat()
    summary = write_report(state, sources, wording)
    with open(STATE, "w") as f:
        json.dump(state, f)
    save_record(state, sources, results())
    t = summary["totals"]
    print(f"{t['killed']} killed, {t['survived']} survived, {t['equivalent']} equivalent, {t['timeout']} timeout, "
          f"{t['no test']} reached by no test, {t['not run']} not run; table in {REPORT}, survivors in {SURVIVORS}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
