"""Sizes and probe names on the command line: one line saying what is wrong and the valid forms,
exit code 2, before anything runs. ``--memory-budget 24`` silently meant 24 bytes ("peak 32.8 MiB
is 143380683% of the 24 B budget"); ``-5GB`` read as an option ("expected one argument")."""

from __future__ import annotations

import pytest

from advisor.cli import BARE_BYTES_FROM, build_parser, main

TINY = "tests/scripts/tiny_train.py"


def _error(capsys) -> list[str]:
    return capsys.readouterr().err.strip().splitlines()


@pytest.mark.parametrize("command", [["attach", "--memory-budget", "{}", TINY], ["report", "latest", "--memory-budget", "{}"],
                                     ["plan", "-o", "p.json", "--memory-budget", "{}"]])
def test_a_size_without_a_unit_is_refused_with_the_forms_to_write(command, capsys) -> None:
    assert main([a.format("24") for a in command]) == 2
    error, hint = _error(capsys)
    assert error == ("advisor: error: argument --memory-budget: '24' has no unit: write a number with a unit, "
                     f"e.g. 24GiB, 800MiB or 1.5GB (a bare number counts as bytes only from {BARE_BYTES_FROM} up)")
    assert hint.startswith("hint: ")


def test_a_bare_number_of_realistic_bytes_is_taken_as_bytes() -> None:
    ns = build_parser().parse_args(["attach", "--memory-budget", "25769803776", TINY])
    assert ns.memory_budget == 24 * 2**30
    assert build_parser().parse_args(["attach", "--memory-budget", "24GB", TINY]).memory_budget == 24 * 10**9


@pytest.mark.parametrize("value", [["--memory-budget", "-5GB"], ["--memory-budget=-5GB"], ["--memory-budget", "-1"]])
def test_a_negative_size_says_so(value, capsys) -> None:
    assert main(["attach", *value, TINY]) == 2
    error, _ = _error(capsys)
    assert "a size cannot be negative" in error and "24GiB, 800MiB or 1.5GB" in error
    assert "expected one argument" not in error


def test_an_unknown_probe_names_the_valid_ones_before_anything_runs(capsys) -> None:
    assert main(["attach", "--probes", "memry", "no-such-script.py"]) == 2
    error, _ = _error(capsys)
    assert error == ("advisor: error: argument --probes: unknown probe(s) memry; valid: memory, compute, comm, "
                     "all, none")  # the probes are checked before the script is looked for
