"""Domain messages the app posts, past tense, small: tests assert on these.

Workers (threads) post them with ``post_message``, which Textual makes
thread-safe; handlers on the app update the widgets on the main thread.
"""

from __future__ import annotations

from typing import Any

from textual.message import Message

from advisor.records.results import ApplyHistory


class StateRefreshed(Message):
    """A poll found the session changed and the widgets were redrawn."""

    def __init__(self, latest_step: int, version: object) -> None:
        super().__init__()
        self.latest_step = latest_step
        self.version = version


class ApplyRequested(Message):
    """The user asked to apply a live recommendation; the request goes to the source next."""

    def __init__(self, recommendation_id: str) -> None:
        super().__init__()
        self.recommendation_id = recommendation_id


class ApplyRefused(Message):
    """The app declined an apply without calling the source (not live, finished, busy, none)."""

    def __init__(self, recommendation_id: str | None, reason: str) -> None:
        super().__init__()
        self.recommendation_id = recommendation_id
        self.reason = reason


class ApplySent(Message):
    """``source.apply`` returned; ``error`` is its error text, or None when the job accepted it."""

    def __init__(self, recommendation_id: str, error: str | None) -> None:
        super().__init__()
        self.recommendation_id = recommendation_id
        self.error = error


class ApplyFinished(Message):
    """An applied result for the requested recommendation arrived (status kept/reverted/failed)."""

    def __init__(self, result: ApplyHistory) -> None:
        super().__init__()
        self.result = result
        self.recommendation_id = str(result.recommendation_id or "")
        self.status = str(result.status)


class RevertRequested(Message):
    """The user asked to revert the last kept remedy."""

    def __init__(self, recommendation_id: str | None) -> None:
        super().__init__()
        self.recommendation_id = recommendation_id


class RevertRefused(Message):
    """The app declined a revert without calling the source (nothing kept, finished)."""

    def __init__(self, reason: str) -> None:
        super().__init__()
        self.reason = reason


class RevertSent(Message):
    """``source.revert`` returned; ``error`` is its error text, or None."""

    def __init__(self, error: str | None) -> None:
        super().__init__()
        self.error = error


class TrainingEnded(Message):
    """The training job ended; posted once, the first poll that sees ``finished``."""

    def __init__(self, exit_code: int | None, reason: str) -> None:
        super().__init__()
        self.exit_code = exit_code
        self.reason = reason


class ModelBuilt(Message):
    """A worker built the views' model (``advisor.tui.view_model.ViewModel``) for one rank."""

    def __init__(self, model: Any, rank: int, error: str | None = None) -> None:
        super().__init__()
        self.model = model  # None when the build failed (``error`` says why)
        self.rank = rank
        self.error = error


class RankSwitched(Message):
    """The user chose another rank: every view now shows it."""

    def __init__(self, rank: int) -> None:
        super().__init__()
        self.rank = rank


class AdviceRecomputed(Message):
    """A recorded session's advice was recomputed at another budget (or failed with ``error``)."""

    def __init__(self, budget_bytes: int | None, count: int, error: str | None) -> None:
        super().__init__()
        self.budget_bytes = budget_bytes
        self.count = count
        self.error = error


class PlanWritten(Message):
    """A recommendation was written to a plan file (or failed with ``error``)."""

    def __init__(self, path: str, recommendation_id: str, error: str | None) -> None:
        super().__init__()
        self.path = path
        self.recommendation_id = recommendation_id
        self.error = error
