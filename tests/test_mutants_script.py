"""scripts/mutants.py's own logic: which mutants count as a message's wording, the proportional seeded sample, the
names of mutmut's mutants, and the equivalence entries (mutmut itself is not needed for these)."""
import os
import textwrap
from collections import Counter

from scripts import mutants


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
    assert mutants.group_of("kernels.grape_ap.x_f__mutmut_1") == "kernels/grape_ap.py"
    assert mutants.group_of("kernels.grape_ap_triton.x_f__mutmut_1") is None
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
