"""The README's two set-up commands are what CI runs, and the GPT-2 ranks fetch they rely on keeps one file."""
import hashlib
import io
import os
import re
import subprocess
import tarfile

import pytest

from data import tokenizer
from data.shards import DataError

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
    assert ci == [install_and_run.removesuffix(" && python3 train.py configs/quickstart.toml"), tests]
    assert "requirements-dev.txt" in install_and_run and "pip" not in tests  # one install, then only tests


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
