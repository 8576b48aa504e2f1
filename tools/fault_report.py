"""The fault-injection cases and whether each held: runs the tests marked `fault` (all of tests/test_faults.py,
and the cases of other test files that need their fixtures) and writes docs/faults.md.

    python3 tools/fault_report.py            # about 4 minutes on 2 cores -> docs/faults.md

A case is one test (one row per parameter set); it "held" when the fault ended as the test demands (one
sentence with a remedy that works, nothing damaged loaded or trained on, nothing good lost). The table says
what each case injects, from the first sentence of its test's docstring (or its name).
"""
import ast
import os
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
TESTS = "tests"
MAIN_FILE = "test_faults.py"  # its cases are named without their file in the table


def descriptions(path: str) -> dict[str, str]:
    """test function name -> the first sentence of its docstring, or its name in words."""
    tree = ast.parse(open(path).read())
    out = {}
    for node in tree.body:
        if isinstance(node, ast.FunctionDef) and node.name.startswith("test_"):
            doc = ast.get_docstring(node)
            words = node.name[len("test_"):].replace("_", " ")
            out[node.name] = (doc.split(". ")[0].split("\n\n")[0].replace("\n", " ").rstrip(".") if doc else words)
    return out


def main() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        xml_path = os.path.join(tmp, "faults.xml")
        subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-m", "fault", TESTS,
                        f"--junitxml={xml_path}"], cwd=REPO)
        cases = ET.parse(xml_path).getroot().iter("testcase")
        rows, about = [], {}
        for case in cases:
            file = case.get("classname").rpartition(".")[2] + ".py"  # "tests.test_study" -> test_study.py
            if file not in about:
                about[file] = descriptions(os.path.join(REPO, TESTS, file))
            function, _, params = case.get("name").partition("[")
            failed = case.find("failure") is not None or case.find("error") is not None
            skipped = case.find("skipped") is not None
            outcome = "skipped" if skipped else "NOT HELD" if failed else "held"
            what = about[file].get(function, function) + (f" (`{params.rstrip(']')}`)" if params else "")
            rows.append((function if file == MAIN_FILE else f"{file}::{function}", what, outcome))
    held = sum(outcome == "held" for _, _, outcome in rows)
    lines = ["# Fault injection: cases tried and held", "",
             f"`python3 tools/fault_report.py` runs the tests marked `fault` (`pytest -m fault {TESTS}`: all of "
             f"`{TESTS}/{MAIN_FILE}`, and the cases named with their file, which use the fixtures there) and writes "
             f"this table. **{held} of {len(rows)} cases held.** A case holds when the fault ends as its test "
             "demands: one sentence with a remedy that works when followed, nothing damaged loaded or trained on, "
             "nothing good lost.", "",
             "| test | what is injected or tried | result |", "|---|---|---|"]
    lines += [f"| `{function}` | {what} | {outcome} |" for function, what, outcome in rows]
    with open(os.path.join(REPO, "docs", "faults.md"), "w") as f:
        f.write("\n".join(lines) + "\n")
    print(f"{held} of {len(rows)} cases held -> docs/faults.md")


if __name__ == "__main__":
    main()
