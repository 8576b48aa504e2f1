"""Write constraints.txt: the exact version of every package that the README's install command brings into a fresh
virtual environment, so that CI and a newcomer install what CI last passed with, not whatever the index serves
today (a new pytest once broke the README's test command overnight).

    python3 tools/pin_requirements.py            # about 2 minutes: a fresh venv in a temporary folder, then a freeze

requirements.txt and requirements-dev.txt keep their ranges for users who bring their own (CUDA) torch;
constraints.txt narrows them for the CPU install. torch itself is left out of it: the install command pins the CPU
build (torch==2.13.0) on its own, and a GPU user drops that pin and the constraints file together.
tests/test_setup_commands.py checks that every pinned version lies in its requirement's range.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CONSTRAINTS = os.path.join(REPO, "constraints.txt")
INSTALL = ["torch==2.13.0", "-r", "requirements.txt", "-r", "requirements-dev.txt"]
LEFT_OUT = {"torch"}  # pinned by the install command itself (the CPU build); see the docstring
HEADER = """\
# The exact versions CI installs, written by `python3 tools/pin_requirements.py`: a freeze of a fresh virtual
# environment after `pip install {install}`.
# Used as `pip install -c constraints.txt ...` by .ci/run and the README's set-up; requirements*.txt keep the
# ranges. torch is pinned by the install command itself.
"""


def package_name(line: str) -> str:
    """'Jinja2==3.1.6' -> 'jinja2': the name as pip compares it (PEP 503: case and -_. runs folded)."""
    return re.sub(r"[-_.]+", "-", line.split("==", 1)[0].strip()).lower()


def constraints_text(freeze: str) -> str:
    """constraints.txt's text from `pip freeze` output: one `name==version` a line, sorted, without the packages
    the install command pins itself and without anything that is not a plain pin (an editable or a URL install
    would tie CI to one machine's files)."""
    pins = []
    for line in freeze.splitlines():
        line = line.strip()
        if not line or line.startswith("#") or "==" not in line or " @ " in line or line.startswith("-e"):
            continue
        if package_name(line) not in LEFT_OUT:
            pins.append(line)
    return HEADER.format(install=" ".join(INSTALL)) + "\n".join(sorted(pins, key=package_name)) + "\n"


def fresh_freeze(folder: str) -> str:
    """`pip freeze` of a new virtual environment in FOLDER after the README's install (without the constraints)."""
    venv = os.path.join(folder, "venv")
    subprocess.run([sys.executable, "-m", "venv", venv], check=True)
    python = os.path.join(venv, "bin", "python")
    print(f"installing into a fresh virtual environment: pip install {' '.join(INSTALL)}", flush=True)
    subprocess.run([python, "-m", "pip", "install", "-q", "--disable-pip-version-check", *INSTALL], cwd=REPO,
                   check=True)
    return subprocess.run([python, "-m", "pip", "freeze"], check=True, capture_output=True, text=True).stdout


def main() -> None:
    with tempfile.TemporaryDirectory() as folder:
        text = constraints_text(fresh_freeze(folder))
    temporary = CONSTRAINTS + ".writing"
    with open(temporary, "w") as f:
        f.write(text)
    os.replace(temporary, CONSTRAINTS)
    print(f"wrote {CONSTRAINTS}: {text.count(chr(10)) - HEADER.count(chr(10))} pinned packages")


if __name__ == "__main__":
    main()
