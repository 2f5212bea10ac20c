"""Typed controller commands (advisor/records/commands.py) keep the wire's dict shape."""

import pytest
from recommendations import recommendation

from advisor.records.commands import ApplyCommand, RevertCommand, command_from_dict
from advisor.records.jsonable import to_json
from advisor.records.results import ApplyResult, ApplyStarted, Measurement, RevertResult


def test_apply_command_round_trips_and_ignores_unknown_keys():
    rec = recommendation("a", params={"modules": ["x"]})
    wire = {"type": "apply", "recommendation": rec.to_dict(), "at_step": 7,
            "measure_steps": 3, "confirmed": False, "digest": "abc"}
    command = command_from_dict({**wire, "shard_hint": "newer controllers may add this"})
    assert command == ApplyCommand(recommendation=rec, at_step=7, measure_steps=3, digest="abc")
    assert command.recommendation.params == {"modules": ["x"]}  # typed: the executor reads attributes
    assert command.to_dict() == wire
    # an older controller's command (no confirmation, no digest; null measure_steps) still reads
    old = {k: v for k, v in wire.items() if k not in ("confirmed", "digest")}
    assert command_from_dict(old) == ApplyCommand(recommendation=rec, at_step=7, measure_steps=3)
    assert command_from_dict({**old, "measure_steps": None}).measure_steps == 3


def test_a_malformed_apply_command_names_the_field():
    wire = {"type": "apply", "recommendation": recommendation("a").to_dict(), "at_step": "7"}
    with pytest.raises(ValueError, match=r"apply command\.at_step: expected an integer"):
        command_from_dict(wire)
    wire = {"type": "apply", "recommendation": {**recommendation("a").to_dict(), "params": ["x"]}}
    with pytest.raises(ValueError, match=r"apply command\.recommendation\.params: expected an object"):
        command_from_dict(wire)


def test_revert_command_and_unknown_types():
    assert command_from_dict({"type": "revert"}) == RevertCommand()
    assert RevertCommand().to_dict() == {"type": "revert"}
    with pytest.raises(ValueError, match=r"valid: \['apply', 'revert'\]"):
        command_from_dict({"type": "rewind"})
    with pytest.raises(ValueError, match="not a 'revert' command"):
        RevertCommand.from_dict({"type": "apply"})


def test_one_json_helper_for_every_family():
    assert to_json({"a": (1.0, float("nan")), 2: [float("inf")]}) == {"a": [1.0, None], "2": [None]}
    result = ApplyResult(remedy="r", status="kept", params={"t": float("nan")})
    assert result.to_dict()["params"] == {"t": None}
    revert = RevertResult(remedy="r", recommendation_id="a", at_step=4)
    assert RevertResult.from_dict({**revert.to_dict(), "extra": 1}) == revert
    assert revert.to_dict() == {"remedy": "r", "recommendation_id": "a", "at_step": 4, "reason": "reverted on request"}


def test_apply_started_keeps_both_senders_shapes():
    executor = {"remedy": "r", "recommendation_id": "a", "params": {"modules": ["x"]}, "at_step": 5,
                "measure_steps": 3, "before": {"peak_memory_bytes": 10, "step_time_s": 0.5, "steps": [3, 4]}}
    plan = {"remedy": "r", "recommendation_id": None, "params": {}, "at_step": 0, "from_plan": True}
    for wire in (executor, plan):
        started = ApplyStarted.from_dict(wire)
        out = started.to_dict()
        assert ApplyStarted.from_dict(out) == started
        for key, value in wire.items():  # every field the sender wrote survives (newer ones may be added)
            assert out[key] == value if key != "before" else value.items() <= out[key].items()
    assert ApplyStarted.from_dict(executor).before == Measurement(peak_memory_bytes=10, step_time_s=0.5, steps=(3, 4))
