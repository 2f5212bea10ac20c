"""The app's session actions: advice at another budget, a plan file, and quitting.

A mixin of ``AdvisorApp`` (advisor/tui/app.py). Quitting a running job asks what to do with it
(``quit_screen.py``); ``advisor/attach.py`` acts on the answer ``App.run()`` returns.
"""

from __future__ import annotations

from textual import work

from advisor.planning import plan_for, plannable
from advisor.records.advice import Recommendation
from advisor.records.plan import save_plan
from advisor.records.units import fmt_bytes, parse_size
from advisor.state import SessionState, Source
from advisor.tui.ask_screen import AskScreen
from advisor.tui.messages import AdviceRecomputed, PlanWritten
from advisor.tui.quit_screen import LEAVE, STOP, QuitScreen
from advisor.tui.results import (
    RESULT_FINISHED,
    RESULT_LEFT_RUNNING,
    RESULT_STOP_TRAINING,
)
from advisor.tui.view_model import ViewModel


class SessionActions:
    """Needs the app's ``source``, ``state``, ``model``, ``read_only``, ``_budget`` and ``_selected``."""

    source: Source
    state: SessionState
    model: ViewModel | None
    read_only: bool
    _budget: int | None

    def action_budget(self) -> None:
        current = self.model.budget_bytes if self.model else None

        def answered(text: str | None) -> None:
            if not text:
                return
            try:
                budget = parse_size(text)
            except ValueError as exc:
                self.notify(str(exc), title="Not a size", severity="error")
                return
            self._budget = budget
            self._recompute(budget)

        self.push_screen(AskScreen("Recompute the advice at which memory budget? (e.g. 24MB, 12GiB)",
                                   fmt_bytes(current).replace(" ", "") if current else ""), answered)

    @work(thread=True, exclusive=True, group="advice", exit_on_error=False)
    def _recompute(self, budget: int | None) -> None:
        try:
            count, error = self.source.readvise(budget), None  # type: ignore[attr-defined]
        except Exception as exc:  # advice failing on odd data is shown, never fatal
            count, error = 0, f"{type(exc).__name__}: {exc}"
        self.post_message(AdviceRecomputed(budget, count, error))

    def on_advice_recomputed(self, message: AdviceRecomputed) -> None:
        if message.error:
            self.notify(message.error, title="Advice failed", severity="error")
        elif message.budget_bytes is not None:
            self.notify(f"{message.count} recommendation(s) at a {fmt_bytes(message.budget_bytes)} budget")
        self.poll()

    def action_plan(self) -> None:
        rec = self._selected()
        if rec is None:
            self.notify("No recommendation to write.", severity="warning")
            return
        if not plannable(rec):
            self.notify(f"{rec.title or rec.id} cannot be carried by a plan file.", severity="warning")
            return

        def answered(path: str | None) -> None:
            if path:
                self._write_plan(rec, path)

        self.push_screen(AskScreen(f"Write {rec.title or rec.id} to which plan file?",
                                   f"plan-{rec.id}.json"), answered)

    @work(thread=True, group="plan", exit_on_error=False)
    def _write_plan(self, rec: Recommendation, path: str) -> None:
        try:
            save_plan(plan_for(rec), path)
            error = None
        except (OSError, ValueError) as exc:
            error = f"{type(exc).__name__}: {exc}"
        self.post_message(PlanWritten(path, rec.id, error))

    def on_plan_written(self, message: PlanWritten) -> None:
        if message.error:
            self.notify(message.error, title=f"Could not write {message.path}", severity="error")
        else:
            self.notify(f"wrote {message.path}; run it with `advisor attach --plan {message.path} SCRIPT`",
                        title="Plan written")

    async def action_quit(self) -> None:
        """Leave. A running job is the user's to decide: stop it, or leave it running and recorded."""
        try:
            finished = self.source.snapshot().finished
        except Exception:
            finished = self.state.finished
        if finished or self.read_only:
            self.exit(RESULT_FINISHED)
            return
        if isinstance(self.screen, QuitScreen):
            return

        def answered(choice: str | None) -> None:
            if choice not in (STOP, LEAVE):
                return
            try:
                self.source.stop()
            except Exception as exc:  # quitting must always work
                self.log.error(f"source.stop() failed: {exc!r}")
            self.exit(RESULT_STOP_TRAINING if choice == STOP else RESULT_LEFT_RUNNING)

        self.push_screen(QuitScreen(), answered)
