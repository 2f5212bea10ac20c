"""``--log-to``: the session's findings, each apply's predicted and measured figures and the
step-time and memory series, sent to the experiment trackers people already watch.

Logged where the report is built (the controller: ``advisor attach``, an in-process session's
controller), from the report alone (``series.tracker_data``), so torch is never on this path and
every figure is the report's. Each tool is an optional extra, imported only when named:
``tensorboard`` (``advisor[tensorboard]``: tensorboardX's event writer), ``mlflow``
(``advisor[mlflow]``: mlflow-skinny, with SQLAlchemy for its default local store) and ``wandb``
(``advisor[wandb]``). ``TOOL:WHERE`` names the destination: a folder for tensorboard, a tracking
URI for mlflow, a project for wandb. A tracker that fails is said on stderr; it never changes
the run's exit code or its report.
"""

from __future__ import annotations

import contextlib
import importlib.util
import sys
from dataclasses import dataclass
from typing import Any, Callable

from advisor.trackers import mlflow_log, tensorboard_log, wandb_log
from advisor.trackers.series import TrackerData, tracker_data

WRITERS: dict[str, Callable[[TrackerData, str | None], str]] = {
    "tensorboard": tensorboard_log.log, "mlflow": mlflow_log.log, "wandb": wandb_log.log}
PACKAGES = {"tensorboard": tensorboard_log.PACKAGE, "mlflow": mlflow_log.PACKAGE, "wandb": wandb_log.PACKAGE}
TOOLS = tuple(WRITERS)


@dataclass(frozen=True, kw_only=True)
class LogTarget:
    """One ``--log-to`` destination."""

    tool: str  # one of TOOLS
    where: str | None = None  # tensorboard: a folder; mlflow: a tracking URI; wandb: a project


def parse_target(value: str) -> LogTarget:
    """``TOOL`` or ``TOOL:WHERE``; ``ValueError`` naming the tools otherwise."""
    tool, _, where = value.partition(":")
    tool = tool.strip().lower()
    if tool not in WRITERS:
        raise ValueError(f"unknown tracker {value!r}: expected {', '.join(TOOLS)} (optionally TOOL:WHERE)")
    return LogTarget(tool=tool, where=where.strip() or None)


def missing_package(target: LogTarget) -> str | None:
    """Why ``target`` cannot be logged to on this machine (its package is not installed), or None."""
    package = PACKAGES[target.tool]
    if importlib.util.find_spec(package) is not None:
        return None
    return f"--log-to {target.tool} needs the {package} package: pip install 'advisor[{target.tool}]'"


def log_report(report: dict[str, Any], targets: list[LogTarget], *,
               say: Callable[[str], None] | None = None) -> dict[str, str]:
    """Log ``report`` to every target; tool -> where it went (failures are said, never raised)."""
    say = say or (lambda line: print(line, file=sys.stderr, flush=True))
    if not targets:
        return {}
    data = tracker_data(report)
    written: dict[str, str] = {}
    for target in targets:
        try:
            with contextlib.redirect_stdout(sys.stderr):  # stdout is the script's, never a library's
                written[target.tool] = WRITERS[target.tool](data, target.where)
        except Exception as exc:  # noqa: BLE001 - a tracker must never cost the run its report
            say(f"advisor: could not log to {target.tool}: {type(exc).__name__}: {str(exc)[:300]}")
            continue
        say(f"advisor: logged the session to {target.tool}: {written[target.tool]}")
    return written
