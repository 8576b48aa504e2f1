"""The README's two set-up commands are what CI runs, the GPT-2 ranks fetch they rely on keeps one file, and the
figures the docs give for the set-up (the test count, the quickstart's losses and memory) are the code's."""
import hashlib
import io
import json
import os
import re
import shutil
import subprocess
import tarfile

import pytest

from data import tokenizer
from data.shards import DataError
from tools import doc_figures, pin_requirements

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def readme_setup_commands():
    text = open(os.path.join(REPO, "README.md")).read()
    block = re.search(r"## Set up\n\n```bash\n(.*?)```", text, re.S).group(1)
    return [line for line in block.splitlines() if line and not line.startswith("#")]


def test_ci_runs_the_readme_commands():
    install_and_run, tests = readme_setup_commands()
    ci = [line for line in open(os.path.join(REPO, ".ci", "run")).read().splitlines()
          if line and not line.startswith(("#", "set ", "cd ", "export "))]
    assert install_and_run.endswith(" && python3 train.py configs/quickstart.toml")
    readme_slurm = re.findall(r"`apt-get install ([^`]*)`", open(os.path.join(REPO, "README.md")).read())
    apt_lines = [line for line in ci if "apt-get install" in line]
    assert ci == [install_and_run.removesuffix(" && python3 train.py configs/quickstart.toml"), *apt_lines, tests]
    assert "requirements-dev.txt" in install_and_run and "pip" not in tests  # one install, then only tests
    # the SLURM packages the README names are what CI installs, before the tests, which must then not skip them
    assert readme_slurm == ["slurm-wlm munge"] and len(apt_lines) == 1
    assert apt_lines[0].endswith("apt-get install -y -qq slurm-wlm munge")
    assert "export GRAPE_REQUIRE_SLURM=1" in open(os.path.join(REPO, ".ci", "run")).read().splitlines()


def fake_pip_download(ranks_bytes, returncode=0):
    """subprocess.run for `pip download`: writes a source archive holding whisper/assets/gpt2.tiktoken."""
    def run(command, **kwargs):
        assert command[1:4] == ["-m", "pip", "download"] and "--no-deps" in command
        if returncode == 0:
            folder = command[command.index("-d") + 1]
            with tarfile.open(os.path.join(folder, "openai_whisper-20250625.tar.gz"), "w:gz") as archive:
                info = tarfile.TarInfo("openai_whisper-20250625/whisper/assets/gpt2.tiktoken")
                info.size = len(ranks_bytes)
                archive.addfile(info, io.BytesIO(ranks_bytes))
        return subprocess.CompletedProcess(command, returncode, "", "ERROR: No matching distribution found")
    return run


def test_fetch_keeps_the_ranks_file_only_when_its_sha256_is_the_gpt2_ranks(tmp_path, monkeypatch):
    forged = b"IQ== 0\n"  # a ranks file, but not GPT-2's
    monkeypatch.setattr(tokenizer.subprocess, "run", fake_pip_download(forged))
    with pytest.raises(DataError, match="does not have the GPT-2 ranks' sha256"):
        tokenizer.fetch_gpt2_ranks(str(tmp_path / "gpt2.tiktoken"))
    assert not (tmp_path / "gpt2.tiktoken").exists()
    monkeypatch.setattr(tokenizer.subprocess, "run", fake_pip_download(forged, returncode=1))
    with pytest.raises(DataError, match="could not download openai-whisper==20250625 .*No matching distribution"):
        tokenizer.fetch_gpt2_ranks(str(tmp_path / "gpt2.tiktoken"))


def test_fetch_writes_the_ranks_that_tokenize_as_gpt2(tmp_path, monkeypatch):
    local = os.environ.get("GRAPE_GPT2_RANKS") or tokenizer.REPO_RANKS
    if not os.path.isfile(local):
        pytest.skip("no GPT-2 ranks on this machine (python3 -m data.tokenizer --fetch-gpt2-ranks)")
    ranks = open(local, "rb").read()
    monkeypatch.setattr(tokenizer.subprocess, "run", fake_pip_download(ranks))
    target = tokenizer.fetch_gpt2_ranks(str(tmp_path / "cache" / "gpt2.tiktoken"))
    assert hashlib.sha256(open(target, "rb").read()).hexdigest() == tokenizer.GPT2_RANKS_SHA256
    monkeypatch.setenv("GRAPE_GPT2_RANKS", target)
    assert tokenizer.gpt2_encoding().encode_ordinary("Hello world") == [15496, 995]


def test_the_test_count_in_the_docs_is_the_suites():
    """docs/setup.md said 638 tests when the suite had about 1,290: the number written is now checked against the
    suite, collected as pytest collects it"""
    written = doc_figures.written("tests")
    assert written, "docs/setup.md has no <!-- figure:tests --> marker"
    count = f"{doc_figures.collected_tests():,}"
    assert set(written.values()) == {count}, (f"the docs say {written} tests, the suite has {count}: run python3 "
                                              "tools/doc_figures.py tests")


def test_every_copy_of_the_quickstarts_figures_is_the_same_and_names_its_commit():
    written = doc_figures.written("quickstart")
    assert set(written) == {"README.md", os.path.join("docs", "setup.md")} and len(set(written.values())) == 1
    text = next(iter(written.values()))
    assert re.fullmatch(r"validation loss 10\.\d\d → .* \(200\); peak memory \d+\.\d\d GiB \(process max RSS, "
                        r"the run's last line\); commit [0-9a-f]{7}", text), text


def fake_quickstart_run(run_dir, **config):
    """A finished quickstart run directory as train.py writes it (config.json, metrics.jsonl), made up."""
    os.makedirs(run_dir)
    config = {"config_file": os.path.join(doc_figures.REPO, doc_figures.QUICKSTART), "overrides": [],
              "resumes": [], "code_version": "0123456789abcdef", **config}
    (run_dir / "config.json").write_text(json.dumps(config))
    records = [{"type": "val", "iter": 0, "val_loss": 10.8353}, {"type": "train", "iter": 100, "loss": 6.1},
               {"type": "val", "iter": 100, "val_loss": 5.7273}, {"type": "val", "iter": 200, "val_loss": 5.4449},
               {"type": "summary", "iter": 200, "stopped": "done", "peak_memory_gb": 0.8312,
                "memory_kind": "process max RSS"}]
    (run_dir / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))


def test_the_quickstart_figures_are_written_from_a_finished_run_of_the_readme_command(tmp_path):
    repo = tmp_path / "repo"
    (repo / "docs").mkdir(parents=True)
    for doc in doc_figures.DOCS:
        shutil.copy(os.path.join(doc_figures.REPO, doc), repo / doc)
    fake_quickstart_run(tmp_path / "run")
    text = doc_figures.quickstart_figure(str(tmp_path / "run"))
    assert text == ("validation loss 10.84 → 5.73 (step 100) → 5.44 (200); peak memory 0.83 GiB (process max RSS, "
                    "the run's last line); commit 0123456")
    assert doc_figures.write("quickstart", text, str(repo)) == ["README.md", os.path.join("docs", "setup.md")]
    assert set(doc_figures.written("quickstart", str(repo)).values()) == {text}
    # what the docs must not claim: another run's figures, a resumed run's memory, uncommitted code's losses
    for name, config, why in [("other", {"overrides": ["--max_iters=20"]}, "is not a run of"),
                              ("resumed", {"resumes": [{"iter": 100}]}, "was resumed"),
                              ("dirty", {"code_version": "0123456789abcdef-dirty"}, "uncommitted")]:
        fake_quickstart_run(tmp_path / name, **config)
        with pytest.raises(doc_figures.FigureError, match=why):
            doc_figures.quickstart_figure(str(tmp_path / name))


def copied_docs(tmp_path):
    repo = tmp_path / "repo"
    (repo / "docs").mkdir(parents=True)
    for doc in doc_figures.DOCS:
        shutil.copy(os.path.join(doc_figures.REPO, doc), repo / doc)
    return repo, {doc: (repo / doc).read_bytes() for doc in doc_figures.DOCS}


@pytest.mark.fault
def test_a_figure_that_cannot_be_written_leaves_every_doc_as_it_was(tmp_path, monkeypatch):
    """Under `ulimit -f 8` README.md was cut to 8,192 bytes (written in place), and with docs/setup.md immutable
    README.md was rewritten and then a traceback left the two copies of the figure unequal."""
    import builtins
    import errno
    repo, before = copied_docs(tmp_path)
    real_open, real_replace = builtins.open, os.replace

    def limited_open(file, mode="r", *args, **kwargs):  # a file size limit: writes past 8 KiB fail
        opened = real_open(file, mode, *args, **kwargs)
        if "w" in mode and str(file).startswith(str(repo)):
            write = opened.write

            def capped(text):
                if opened.tell() + len(text) > 8192:
                    raise OSError(errno.EFBIG, "File too large", str(file))
                return write(text)
            opened.write = capped
        return opened
    monkeypatch.setattr(builtins, "open", limited_open)
    figure = "validation loss 10.84 → 5.00 (step 50); peak memory 0.70 GiB; commit 0123456"
    with pytest.raises(doc_figures.FigureError, match=r"^cannot write figure 'quickstart' \(File too large: "
                                                      r".*README\.md\.tmp\), so no doc was changed; free space or make "
                                                      r"README\.md, docs/setup\.md writable, then run again$"):
        doc_figures.write("quickstart", figure, str(repo))
    monkeypatch.setattr(builtins, "open", real_open)
    assert {doc: (repo / doc).read_bytes() for doc in doc_figures.DOCS} == before
    assert not list(repo.rglob("*.tmp"))

    def immutable_setup(src, dst):  # README.md is replaced first, then docs/setup.md refuses
        if str(dst).endswith(os.path.join("docs", "setup.md")):
            raise PermissionError(errno.EPERM, "Operation not permitted", str(dst))
        return real_replace(src, dst)
    monkeypatch.setattr(os, "replace", immutable_setup)
    with pytest.raises(doc_figures.FigureError, match="Operation not permitted: .*setup.md\\), so no doc was changed"):
        doc_figures.write("quickstart", figure, str(repo))
    monkeypatch.setattr(os, "replace", real_replace)
    assert {doc: (repo / doc).read_bytes() for doc in doc_figures.DOCS} == before
    assert not list(repo.rglob("*.tmp"))
    assert doc_figures.write("quickstart", figure, str(repo)) == ["README.md", os.path.join("docs", "setup.md")]
    assert set(doc_figures.written("quickstart", str(repo)).values()) == {figure}


@pytest.mark.fault
def test_an_unfinished_quickstart_run_is_answered_with_what_to_do(tmp_path):
    fake_quickstart_run(tmp_path / "run")
    records = (tmp_path / "run" / "metrics.jsonl").read_text().splitlines()[:-1]  # no summary yet
    (tmp_path / "run" / "metrics.jsonl").write_text("\n".join(records) + "\n")
    with pytest.raises(doc_figures.FigureError) as refused:
        doc_figures.quickstart_figure(str(tmp_path / "run"))
    assert str(refused.value).endswith(f"if it is still training, run this again when it is done, else train it again "
                                       f"in one go (python3 train.py {doc_figures.QUICKSTART} --out_dir="
                                       f"{tmp_path / 'run'} --start_over): a resumed run's peak memory would be its "
                                       "last start's only")


def test_the_suites_time_is_measured_by_running_the_readme_command(tmp_path):
    """docs/setup.md gave 2 min 51 s for 638 tests at an old commit: the figure is now the time of a run of the
    README's own test command, refused when it does not pass or the code is not committed."""
    seen = []
    times = iter([100.0, 100.0 + 9 * 60 + 12.4])

    def run(command, **kwargs):
        seen.append((command, kwargs["cwd"]))
        return subprocess.CompletedProcess(command, 0, "...\n1601 passed, 2 warnings in 551.90s (0:09:11)\n", "")
    with pytest.raises(doc_figures.FigureError, match="not a clean commit \\(0123abc-dirty\\)"):
        doc_figures.suite_figure(run=run, version="0123abc-dirty")
    assert seen == []  # refused before the suite runs
    text = doc_figures.suite_figure(run=run, clock=lambda: next(times), version="0123abcdef")
    assert seen == [(readme_setup_commands()[1], doc_figures.REPO)]
    assert re.fullmatch(r"1,601 passed in 9 min 12 s \(\d+ cores, commit 0123abc\)", text), text

    def failing(command, **kwargs):
        return subprocess.CompletedProcess(command, 1, "1 failed, 1600 passed in 500.00s\n", "")
    with pytest.raises(doc_figures.FigureError, match="did not pass \\(exit status 1\\): '1 failed, 1600 passed"):
        doc_figures.suite_figure(run=failing, clock=iter([0.0, 1.0]).__next__, version="0123abcdef")


def requirements(path: str) -> list:
    """The requirements of a requirements file, as packaging parses them (comments and blank lines dropped)."""
    from packaging.requirements import Requirement
    lines = (line.split("#", 1)[0].strip() for line in open(os.path.join(REPO, path)))
    return [Requirement(line) for line in lines if line]


def pinned_versions() -> dict[str, str]:
    pins = {}
    for line in open(os.path.join(REPO, "constraints.txt")):
        line = line.split("#", 1)[0].strip()
        if line:
            name, version = line.split("==")
            pins[pin_requirements.package_name(name)] = version
    return pins


def test_every_requirement_is_pinned_inside_its_range():
    """A fresh install got pytest 9.2.0 (requirements: pytest>=8) and the README's test command failed: CI now
    installs the versions in constraints.txt. Each of them must satisfy its range, or the pins and the ranges
    disagree and a user with the ranges gets something CI never ran."""
    pins = pinned_versions()
    checked = []
    for path in ("requirements.txt", "requirements-dev.txt"):
        for requirement in requirements(path):
            name = pin_requirements.package_name(requirement.name)
            if name in pin_requirements.LEFT_OUT:
                continue
            assert name in pins, f"{requirement.name} ({path}) has no pin: run python3 tools/pin_requirements.py"
            assert requirement.specifier.contains(pins[name], prereleases=True), (
                f"constraints.txt pins {name}=={pins[name]}, outside {path}'s {requirement}: run python3 "
                "tools/pin_requirements.py")
            checked.append(name)
    assert {"pytest", "lm-eval", "numpy", "transformers"} <= set(checked)
    assert "torch" not in pins  # the install command pins the CPU build; a GPU user must be able to drop both


def test_the_constraints_file_is_a_freeze_without_torch_sorted_by_name():
    freeze = ("torch==2.13.0+cpu\nJinja2==3.1.6\npytest==9.2.0\n-e git+https://x/y#egg=z\nzz @ file:///tmp/zz\n"
              "A_b.c==1\nfilelock==3.0\n")
    text = pin_requirements.constraints_text(freeze)
    pins = [line for line in text.splitlines() if not line.startswith("#")]
    assert pins == ["A_b.c==1", "filelock==3.0", "Jinja2==3.1.6", "pytest==9.2.0"]  # by name as pip compares it
    assert pin_requirements.package_name("A_b.c==1") == "a-b-c"


def test_ci_and_the_readme_install_with_the_constraints():
    install_and_run, _ = readme_setup_commands()
    assert "-c constraints.txt torch==2.13.0 -r requirements.txt -r requirements-dev.txt" in install_and_run


@pytest.mark.fault
def test_a_figure_whose_end_marker_is_missing_or_stray_is_refused_with_its_doc_and_line(tmp_path):
    """Without its end marker, the suite figure ran on to the tests figure's end (the prose between and that
    figure's begin marker replaced, exit 0); README.md's quickstart figure was left unwritten without a word."""
    def without_end(name):
        return lambda text: re.sub(rf"(<!-- figure:{name} -->.*?)<!-- /figure -->", r"\1", text, count=1, flags=re.S)
    setup = os.path.join("docs", "setup.md")
    for doc, name, change, said in [
            (setup, "suite", without_end("suite"),
             "figure 'suite' has no <!-- /figure --> before the next figure's marker on line {next}"),
            ("README.md", "quickstart", without_end("quickstart"), "figure 'quickstart' has no <!-- /figure --> after it"),
            ("README.md", "quickstart", lambda text: text.replace("## Set up", "<!-- /figure -->\n## Set up", 1),
             "<!-- /figure --> ends no figure")]:
        repo, before = copied_docs(tmp_path / f"{name}{len(said)}")
        text = change(before[doc].decode())
        assert text != before[doc].decode()
        (repo / doc).write_text(text, encoding="utf-8")
        lines = text.splitlines()
        begin = next((n for n, line in enumerate(lines, 1) if f"<!-- figure:{name} -->" in line), None)
        stray = next(n for n, line in enumerate(lines, 1) if line.startswith("<!-- /figure -->")) \
            if "ends no" in said else None
        following = next(n for n, line in enumerate(lines, 1) if n > begin and "<!-- figure:" in line) \
            if "{next}" in said else None
        with pytest.raises(doc_figures.FigureError) as info:
            doc_figures.write(name, "1,234 passed in 1 min 2 s (2 cores, commit abcdef0)", str(repo))
        assert str(info.value).startswith(f"{doc} line {stray or begin}: {said.format(next=following)}")
        assert (repo / doc).read_text(encoding="utf-8") == text  # nothing replaced
        other = next(d for d in doc_figures.DOCS if d != doc)
        assert (repo / other).read_bytes() == before[other]


@pytest.mark.fault
@pytest.mark.parametrize("config, metrics, said", [
    (b"[1, 2]", None, "config.json holds a JSON list, not the run's settings that train.py writes"),
    (b"\xff\xfe{", None, "is not a readable run directory"),
    (None, '{"type": "val", "iter": 0}', "metrics.jsonl line 6 is not a record as train.py writes it"),
    (None, '{"type": "summary", "iter": 200, "stopped": "done", "peak_memory_gb": "0.83", "memory_kind": "rss"}',
     "metrics.jsonl line 6 is not a record as train.py writes it"),
    (None, "[3]", "metrics.jsonl line 6 is not a record as train.py writes it")])
def test_a_run_whose_config_or_metrics_lines_are_malformed_is_one_sentence(tmp_path, config, metrics, said):
    fake_quickstart_run(tmp_path / "run")
    if config is not None:
        (tmp_path / "run" / "config.json").write_bytes(config)
    if metrics is not None:
        with open(tmp_path / "run" / "metrics.jsonl", "a") as f:
            f.write(metrics + "\n")
    with pytest.raises(doc_figures.FigureError, match=re.escape(said)):
        doc_figures.quickstart_figure(str(tmp_path / "run"))
