"""Checking a controller command in the training process, on its typed record.

The channel delivers JSON; ``advisor.records.commands.command_from_dict`` is the one decoder into
``ApplyCommand`` / ``RevertCommand``, every field checked against its type, the recommendation
included (the agent decodes, the executor accepts either form and decodes a mapping the same way).
What the types cannot promise is checked here, before anything is queued: the recommendation names
a known remedy with params its applier takes, steps are not negative, and the digest is the
command's own (``command_digest``), which every rank's vote compares.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Mapping

from advisor.apply import registry
from advisor.records.commands import ApplyCommand, Command, RevertCommand, command_from_dict
from advisor.records.remedy import command_digest


def as_command(command: Command | Mapping[str, Any]) -> Command:
    """The typed command; a wire mapping is decoded (``ValueError`` for an unknown type)."""
    if isinstance(command, (ApplyCommand, RevertCommand)):
        return command
    if isinstance(command, Mapping):
        return command_from_dict(command)
    raise ValueError(f"not a command: {type(command).__name__}")


def _step(value: int | None, what: str) -> None:
    if value is not None and value < 0:
        raise ValueError(f"{what} must be a step index >= 0 or null, not {value!r}")


def checked_apply(command: ApplyCommand) -> ApplyCommand:
    """``command`` with its digest filled in; ``ValueError`` when what its types cannot promise
    does not hold (for the controller's reply)."""
    rec = command.recommendation
    registry.check_params(rec.remedy, rec.params)  # also rejects unknown remedies
    _step(command.at_step, "at_step")
    if command.measure_steps < 1:
        raise ValueError(f"measure_steps must be an integer >= 1, not {command.measure_steps!r}")
    digest = command_digest(rec.remedy, rec.params, command.at_step)
    if command.digest not in (None, digest):
        raise ValueError(f"digest {command.digest!r} does not match the command ({digest})")
    return dataclasses.replace(command, digest=digest)


def checked_revert(command: RevertCommand) -> RevertCommand:
    """``command`` as it came; ``ValueError`` when its ``at_step`` is not a step index."""
    _step(command.at_step, "at_step")
    return command
