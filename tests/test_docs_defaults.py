"""The README's CLI reference and exit codes agree with the parser and the code."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

from advisor import errors
from advisor.cli import build_parser, main

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def _subparser(name: str) -> argparse.ArgumentParser:
    parser = build_parser()
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return action.choices[name]


def _readme_rows(command: str = "attach") -> dict[str, str]:
    """``--option`` -> the meaning column of the README's table of ``advisor COMMAND``'s options
    (the first table after the line that introduces the command's synopsis)."""
    rows: dict[str, str] = {}
    lines = README.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(f"`advisor {command} [options]"))
    in_table = False
    for line in lines[start + 1:]:
        if not line.startswith("|"):
            if in_table:
                break
            continue
        in_table = True
        match = re.match(r"^\| (`-.*?`) \| (.*) \|$", line)
        if match:
            for option in re.findall(r"`(--?[a-z-]+)", match.group(1)):
                rows[option] = match.group(2)
    return rows


@pytest.mark.parametrize("command", ["attach", "fit"])
def test_every_option_is_documented_and_every_documented_one_exists(command: str) -> None:
    parser = _subparser(command)
    options = {o for a in parser._actions for o in a.option_strings if o.startswith("-") and o not in ("-h", "--help")}
    documented = set(_readme_rows(command))
    # A short option shares its row with its long one (``-o FILE``); the parser knows both.
    assert {o for o in options if o.startswith("--")} == {o for o in documented if o.startswith("--")}
    assert {o for o in documented if not o.startswith("--")} <= options


@pytest.mark.parametrize(
    ("option", "pattern", "dest"),
    [
        ("--deep-steps", r"default ([\d,]+) and", "deep_steps"),
        ("--deep-every", r"every (\d+)th", "deep_every"),
        ("--probes", r"`(\w+)` \(default\)", "probes"),
        ("--format", r"`(\w+)` \(default\)", "format"),
    ],
)
def test_documented_defaults_match_the_parser(option: str, pattern: str, dest: str) -> None:
    text = _readme_rows()[option]
    documented = re.search(pattern, text)
    assert documented, text
    default = _subparser("attach").get_default(dest)
    shown = ",".join(map(str, default)) if isinstance(default, list) else str(default)
    assert shown == documented.group(1)


def test_documented_exit_codes_match_the_code() -> None:
    codes = re.search(r"Exit codes:(.*?)\n\n", README, re.S).group(1)
    assert f"{errors.EXIT_USAGE} bad command line or unusable script" in " ".join(codes.split())
    assert f"{errors.EXIT_SESSION} a\nsession".replace("\n", " ") in " ".join(codes.split())
    assert f"{errors.EXIT_LAUNCH} the training process could not be started" in " ".join(codes.split())
    assert f"{errors.EXIT_INTERRUPTED}" in codes and "syntax error" in codes
    assert "`advisor plan`: 0 plan written; 1 nothing to plan" in " ".join(codes.split())


def test_syntax_error_exits_with_the_documented_code(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    script = tmp_path / "broken.py"
    script.write_text("def f(:\n")
    assert main(["attach", "--headless", str(script)]) == errors.EXIT_USAGE
    assert "broken.py:1" in capsys.readouterr().err


@pytest.mark.parametrize("argv", [["attach", "--headles", "x.py"], ["report", "--jso", "f", "latest"]])
def test_no_abbreviations_and_the_hint_names_the_subcommand(argv: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    assert main(argv) == errors.EXIT_USAGE
    err = capsys.readouterr().err
    assert f"unrecognized arguments: {argv[1]}" in err
    assert f"`advisor {argv[0]} --help`" in err


def test_attach_with_nothing_says_what_is_missing(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["attach"]) == errors.EXIT_USAGE
    err = capsys.readouterr().err
    assert "attach needs a SCRIPT" in err and "ARGS" not in err.splitlines()[0]


def test_budget_defaults_to_the_device_memory() -> None:
    from advisor.records.samples import RunInfo
    from advisor.report import build_report
    from advisor.state import LiveState

    live = LiveState()
    live.add(RunInfo(script="s.py", argv=[], device={"type": "cpu", "name": "x", "memory_capacity": 8 << 30}))
    assert build_report(live.snapshot())["memory"]["budget_bytes"] == 8 << 30
    assert build_report(live.snapshot(), budget_bytes=1 << 20)["memory"]["budget_bytes"] == 1 << 20
