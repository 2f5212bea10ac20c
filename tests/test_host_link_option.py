"""``--host-link-bandwidth`` on ``advisor attach`` and ``advisor plan``: parsed as a rate, one-line
errors on bad input, handed to the agent's override, and planning with it changes the advice."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import recorded

from advisor.cli import agent_settings, build_parser, main
from advisor.records.units import parse_rate

ROOT = Path(__file__).resolve().parents[1]
TINY = str(ROOT / "tests" / "scripts" / "tiny_train.py")


@pytest.mark.parametrize("text, value", [("16GB/s", 16e9), ("12.5GiB/s", 12.5 * 2**30), ("25e9", 25e9),
                                         (" 3 gb/s ", 3e9), ("800MiB", 800 * 2**20)])
def test_parse_rate(text: str, value: float) -> None:
    assert parse_rate(text) == pytest.approx(value)


@pytest.mark.parametrize("text", ["fast", "0", "-1GB/s", "nan", "inf", "GB/s", "12 parsecs/s"])
def test_parse_rate_refuses(text: str) -> None:
    with pytest.raises(ValueError, match="rate"):
        parse_rate(text)


def test_attach_passes_the_override_to_the_agent_and_refuses_bad_input(capsys) -> None:
    ns = build_parser().parse_args(["attach", "--host-link-bandwidth", "25GB/s", TINY])
    assert agent_settings(ns).host_link_bandwidth == 25e9
    assert agent_settings(build_parser().parse_args(["attach", TINY])).host_link_bandwidth is None
    assert agent_settings(build_parser().parse_args(["attach", "--host-link-bandwidth", "25e9", TINY])
                          ).host_link_bandwidth == 25e9  # a bare number of bytes per second, from 1 MiB/s up
    for command in (["attach", "--headless", "--host-link-bandwidth", "fast", TINY],
                    ["attach", "--headless", "--host-link-bandwidth", "5", TINY],  # meant 5 GB/s, read 5 B/s
                    ["plan", "latest", "-o", "p.json", "--host-link-bandwidth", "0GB/s"]):
        assert main(command) == 2
        err = capsys.readouterr().err
        assert "rate" in err and "hint:" in err and "Traceback" not in err
        assert len(err.strip().splitlines()) <= 2  # the error line and its hint


def _stored(name: str) -> Path:
    """A recorded session written to a session store, as ``advisor attach`` leaves it."""
    from advisor.paths import DB_NAME, new_session_dir
    from advisor.store import SessionStore

    meta, records = recorded.read(name)
    folder = new_session_dir(f"{name}.py")
    store = SessionStore(folder / DB_NAME)
    for record in records:
        store.put(record)
    store.set_meta(**{**meta, "session_id": folder.name})
    store.close()
    return folder


def test_plan_with_a_fast_host_link_offloads(tmp_path) -> None:
    """The recorded GPT session under its README budget: checkpointing with the recorded (CPU, no
    real link) figure; with a 50 GB/s link the offload mix wins, and the plan says so."""
    folder = _stored("gpt")
    plain, fast = tmp_path / "plain.json", tmp_path / "fast.json"
    assert main(["plan", str(folder), "-o", str(plain), "--memory-budget", "24MB"]) == 0
    assert main(["plan", str(folder), "-o", str(fast), "--memory-budget", "24MB",
                 "--host-link-bandwidth", "50GB/s"]) == 0
    remedy = lambda path: json.loads(path.read_text())["remedies"][0]["remedy"]  # noqa: E731
    assert remedy(plain) == "activation_checkpointing"
    assert remedy(fast) == "activation_offload"
