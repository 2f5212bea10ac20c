"""The TUI's ``Source`` over a running ``Session``: snapshots in, apply/revert commands out."""

from __future__ import annotations

from typing import Any

from advisor.state import SessionState


class SessionSource:
    def __init__(self, session: Any, advice: Any) -> None:
        self._session = session
        self._advice = advice
        self.stopped = False

    @property
    def version(self) -> int:
        return self._session.live.version

    def snapshot(self) -> SessionState:
        state = self._session.live.snapshot()
        if not state.finished and self._session.poll() is not None:
            # The process is gone but finish() has not run yet: show that now.
            state.exit_reason = state.exit_reason or "training process ended"
        return state

    def apply(self, recommendation_id: str, *, confirmed: bool = False) -> str | None:
        return self._advice.apply(recommendation_id, confirmed=confirmed)

    def revert(self) -> str | None:
        return self._advice.revert()

    def stop(self) -> None:
        self.stopped = True
