"""The command lines of sample.py, eval/ and scripts/: --help names every option with its default, an
abbreviated option is refused (argparse would otherwise take --window for --windows without a word), and an --out
that is a file is said to be one."""
import pytest

import sample
from eval import extrapolation, long_context, zero_shot
from studies import curves as plot_runs

PARSERS = {"sample.py": sample.build_parser, "eval/extrapolation.py": extrapolation.build_parser,
           "eval/zero_shot.py": zero_shot.build_parser, "scripts/plot_runs.py": plot_runs.build_parser,
           "eval/long_context.py": long_context.build_parser}


def options(parser):
    return [a for a in parser._actions if a.option_strings and a.dest != "help"]


def help_entry(text, option):
    """The help lines of one option (from its line to the next option's), whitespace joined."""
    lines, inside = [], False
    for line in text.splitlines():
        starts = line.strip().startswith("-")
        if starts:
            inside = line.strip().split()[0].rstrip(",") == option
        if inside:
            lines.append(line)
    return " ".join(" ".join(lines).split())


@pytest.mark.parametrize("name", PARSERS)
def test_help_lists_every_option_with_its_default(name, monkeypatch):
    monkeypatch.setenv("COLUMNS", "300")  # the check reads words, not the layout (no value cut at a line end)
    parser = PARSERS[name]()
    text = parser.format_help()
    for action in options(parser):
        entry = help_entry(text, action.option_strings[0])
        assert entry, f"{name}: {action.option_strings[0]} missing from --help"
        if action.required or action.default is False:  # a required option or an on/off flag
            continue
        assert "default" in entry or "required" in entry, f"{name}: {entry!r} does not state its default"
        if action.default not in (None, ""):  # a default in words (None) is read by people, not here
            assert str(action.default) in entry, f"{name}: {entry!r} does not show {action.default!r}"


@pytest.mark.parametrize("name", PARSERS)
def test_an_abbreviated_option_is_refused(name, capsys):
    parser = PARSERS[name]()
    required = [arg for a in parser._actions if a.required for arg in (a.option_strings[:1] or []) + ["x"]]
    positional = ["x"] if any(not a.option_strings for a in parser._actions) else []
    longs = [o for a in options(parser) for o in a.option_strings if o.startswith("--")]
    for option in longs:
        prefix = option[:-1]
        if any(o != option and o.startswith(prefix) for o in longs):
            continue  # ambiguous: argparse refuses it with or without abbreviations
        with pytest.raises(SystemExit) as exit_info:
            parser.parse_args(positional + required + [f"{prefix}=1"])
        assert exit_info.value.code == 2
        assert f"unrecognized arguments: {prefix}=1" in capsys.readouterr().err, (name, option)


@pytest.mark.parametrize("name", ["eval/zero_shot.py", "eval/extrapolation.py"])
@pytest.mark.parametrize("below", [False, True])
def test_an_out_folder_that_is_a_file_is_one_sentence_before_any_evaluation(name, below, tmp_path, capsys):
    """--out naming a file (or a folder below one) was a FileExistsError traceback once the scores were computed;
    the run named here does not exist, so only a check made first can answer."""
    main = {"eval/zero_shot.py": zero_shot.main, "eval/extrapolation.py": extrapolation.main}[name]
    blocker = tmp_path / "file"
    blocker.write_text("mine")
    out = blocker / "out" if below else blocker
    with pytest.raises(SystemExit) as info:
        main(["--ckpt", str(tmp_path / "no_run"), "--out", str(out), "--device", "cpu"])
    assert info.value.code == 2
    assert capsys.readouterr().err == f"error: the results folder {out} cannot be made: {blocker} is a file, not a " \
                                      "folder; choose another --out (or move the file)\n"
    assert blocker.read_text() == "mine"


@pytest.mark.parametrize("module,least", [("eval.retrieval", 1), ("eval.reach", 2)])
def test_each_evaluation_refuses_a_context_below_its_least_and_takes_that_least(module, least, tmp_path, capsys):
    """reach reads the mass over queries in [L/2, L), so it needs 2 tokens; retrieval and extrapolation 1."""
    import importlib
    parse_args = importlib.import_module(module).parse_args
    assert parse_args(["--ckpt", str(tmp_path), "--context", str(least)]).context == least
    with pytest.raises(SystemExit) as info:
        parse_args(["--ckpt", str(tmp_path), "--context", str(least - 1)])
    assert info.value.code == 2
    unit = "token" if least == 1 else "tokens"
    assert capsys.readouterr().err.endswith(f"error: --context must be at least {least} {unit} (got {least - 1}); "
                                            "leave it out to use the checkpoint's block_size\n")
