"""Checking a controller command in the training process, on its typed record.

The channel delivers JSON; ``advisor.records.commands.command_from_dict`` is the one decoder into
``ApplyCommand`` / ``RevertCommand`` (the agent decodes, the executor accepts either form and
decodes a mapping the same way). What the record's types cannot promise is checked here, before
anything is queued: the recommendation names a known remedy with params its applier takes, the
steps are whole numbers, and the digest is the command's own (``command_digest``), which every
rank's vote compares.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

from advisor.apply import registry
from advisor.records.commands import DEFAULT_MEASURE_STEPS, ApplyCommand, Command, RevertCommand, command_from_dict
from advisor.records.remedy import command_digest


def as_command(command: Command | Mapping[str, Any]) -> Command:
    """The typed command; a wire mapping is decoded (``ValueError`` for an unknown type)."""
    if isinstance(command, (ApplyCommand, RevertCommand)):
        return command
    if isinstance(command, Mapping):
        return command_from_dict(command)
    raise ValueError(f"not a command: {type(command).__name__}")


def _step(value: Any, what: str) -> None:
    if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
        raise ValueError(f"{what} must be a step index >= 0 or null, not {value!r}")


def checked_apply(command: ApplyCommand) -> ApplyCommand:
    """``command`` with its digest filled in and ``measure_steps`` defaulted; ``ValueError`` when
    malformed (for the controller's reply)."""
    rec = command.recommendation
    if not isinstance(rec, Mapping) or not isinstance(rec.get("remedy"), str):
        raise ValueError("apply needs a recommendation with a 'remedy' name")
    params = rec.get("params") or {}
    if not isinstance(params, Mapping):
        raise ValueError("recommendation params must be an object")
    registry.check_params(rec["remedy"], params)  # also rejects unknown remedies
    _step(command.at_step, "at_step")
    steps = DEFAULT_MEASURE_STEPS if command.measure_steps is None else command.measure_steps  # JSON null
    if isinstance(steps, bool) or not isinstance(steps, int) or steps < 1:
        raise ValueError(f"measure_steps must be an integer >= 1, not {steps!r}")
    digest = command_digest(rec["remedy"], params, command.at_step)
    if command.digest not in (None, digest):
        raise ValueError(f"digest {command.digest!r} does not match the command ({digest})")
    return dataclasses.replace(command, measure_steps=steps, digest=digest)


def checked_revert(command: RevertCommand) -> RevertCommand:
    """``command`` as it came; ``ValueError`` when its ``at_step`` is not a step index."""
    _step(command.at_step, "at_step")
    return command
