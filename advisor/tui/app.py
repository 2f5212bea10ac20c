"""The advisor's Textual app: polls a ``Source``, shows steps, diagnosis, remedies and results.

Built through ``make_app(source)`` so the CLI and the tests construct it the
same way. Calls into the source that may block (apply, revert) run in thread
workers and report back with small past-tense messages (``messages.py``).
"""

from __future__ import annotations

from typing import Any

from rich.text import Text
from textual import work
from textual.app import App, ComposeResult
from textual.binding import Binding
from textual.containers import Vertical
from textual.widgets import DataTable, Footer, Header

from advisor.regime import apply_refusal, last_kept, revert_refusal
from advisor.state import SessionState, Source
from advisor.tui.evidence_screen import EvidenceScreen
from advisor.tui.exit_banner import ExitBanner
from advisor.tui.messages import (
    ApplyFinished,
    ApplyRefused,
    ApplyRequested,
    ApplySent,
    RevertRefused,
    RevertRequested,
    RevertSent,
    StateRefreshed,
    TrainingEnded,
)
from advisor.tui.recommendations_view import RecommendationsView
from advisor.tui.result_view import ResultView
from advisor.tui.steps_view import StepsView

# What ``App.run()`` returns, for the CLI: whether the user left a running job or a finished one.
RESULT_STOPPED = "stopped"  # quit while training ran; source.stop() was called
RESULT_FINISHED = "finished"  # quit after training had ended


class AdvisorApp(App[str]):
    """Main screen: exit banner, steps, diagnosis and recommendations, apply results, footer."""

    TITLE = "advisor"
    # Stacked, not side by side: both tables need ~90 columns, more than half a usual terminal.
    CSS = """
    #panes { height: 1fr; }
    #panes > StepsView { height: 1fr; }
    #panes > RecommendationsView { height: 1fr; }
    """
    BINDINGS = [
        Binding("a", "apply", "Apply"),
        Binding("r", "revert", "Revert"),
        Binding("enter", "evidence", "Evidence"),
        Binding("q", "quit", "Quit"),
    ]

    def __init__(self, source: Source, *, title: str = "advisor", poll_interval: float = 0.25) -> None:
        super().__init__()
        self.source = source
        self.title = title
        self.poll_interval = poll_interval
        self.state = SessionState()
        self._signature: object = None
        self._pending: dict[str, Any] | None = None  # the apply this app asked for and awaits
        self._reverting: dict[str, Any] | None = None
        self._ended_posted = False
        self._snapshot_error: str | None = None

    # ----- layout -----

    def compose(self) -> ComposeResult:
        yield Header(show_clock=False)
        yield ExitBanner(id="exit-banner")
        with Vertical(id="panes"):
            yield StepsView(id="steps")
            yield RecommendationsView(id="recommendations")
        yield ResultView(id="results")
        yield Footer()

    def on_mount(self) -> None:
        # Widgets live on the main screen; keep references so actions work from pushed screens too.
        self.steps_view = self.query_one(StepsView)
        self.recs_view = self.query_one(RecommendationsView)
        self.result_view = self.query_one(ResultView)
        self.exit_banner = self.query_one(ExitBanner)
        self.recs_view.query_one(DataTable).focus()
        self.poll()
        self.set_interval(self.poll_interval, self.poll)

    # ----- polling -----

    def poll(self) -> None:
        """Take a snapshot; redraw only when something the screen shows has changed."""
        if self._closing or self._closed:  # a tick during shutdown finds the widgets gone
            return
        try:
            state = self.source.snapshot()
        except Exception as exc:  # a broken source must not take the UI (and its history) down
            message = f"{type(exc).__name__}: {exc}"
            if message != self._snapshot_error:
                self._snapshot_error = message
                self.notify(f"could not read the session: {message}", severity="error")
            return
        self._snapshot_error = None
        signature = _signature(self.source, state)
        if signature == self._signature:
            return
        self._signature = signature
        self.state = state
        self._check_pending(state)
        self._redraw()
        if state.finished and not self._ended_posted:
            self._ended_posted = True
            self.post_message(TrainingEnded(state.exit_code, state.exit_reason))
        self.post_message(StateRefreshed(state.latest_step(), getattr(self.source, "version", None)))

    def _check_pending(self, state: SessionState) -> None:
        if self._pending is not None and state.finished and not any(
            str(r.get("recommendation_id")) == self._pending["recommendation_id"]
            for r in state.applied[self._pending["applied_count"] :]
        ):
            # The job ended before the next step boundary: the apply will never happen.
            self.result_view.notice = Text(
                f"✗ {self._pending['title']} was not applied: training ended first", style="bold red"
            )
            self._pending = None
        if self._pending is not None:
            rec_id = self._pending["recommendation_id"]
            for result in state.applied[self._pending["applied_count"] :]:
                if str(result.get("recommendation_id")) == rec_id:
                    self._pending = None
                    self.post_message(ApplyFinished(dict(result)))
                    break
        if self._reverting is not None and len(state.applied) > self._reverting["applied_count"]:
            self._reverting = None
            self.result_view.notice = None

    def _redraw(self) -> None:
        state = self.state
        self.sub_title = _subtitle(state)
        self.exit_banner.update_state(state)
        self.steps_view.update_state(state)
        self.recs_view.update_state(state)
        self.result_view.pending = self._pending
        self.result_view.update_state(state)

    # ----- actions -----

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        # The evidence screen is already open: hide its key from that screen's footer.
        if action == "evidence" and isinstance(self.screen, EvidenceScreen):
            return False
        return True

    def _selected(self) -> dict[str, Any] | None:
        if isinstance(self.screen, EvidenceScreen):
            return self.screen.recommendation  # `a` on the evidence screen applies what it shows
        return self.recs_view.selected

    def action_apply(self) -> None:
        rec = self._selected()
        rec_id = str(rec.get("id")) if rec else None
        reason = self._apply_refusal(rec)
        if reason:
            self.post_message(ApplyRefused(rec_id, reason))
            self.notify(reason, title="Not applied", severity="warning")
            return
        assert rec is not None and rec_id is not None
        self._pending = {
            "recommendation_id": rec_id,
            "title": str(rec.get("title") or rec.get("remedy") or rec_id),
            "applied_count": len(self.state.applied),
        }
        self.result_view.notice = None
        self._redraw()
        self.post_message(ApplyRequested(rec_id))
        self._send_apply(rec_id)

    def _apply_refusal(self, rec: dict[str, Any] | None) -> str | None:
        return apply_refusal(self.state, rec, in_flight=self._pending is not None)

    @work(thread=True, group="source", exit_on_error=False)
    def _send_apply(self, recommendation_id: str) -> None:
        try:
            error = self.source.apply(recommendation_id)
        except Exception as exc:  # the source's failure is shown, never fatal to the UI
            error = f"{type(exc).__name__}: {exc}"
        self.post_message(ApplySent(recommendation_id, error))

    def on_apply_sent(self, message: ApplySent) -> None:
        if message.error is None:
            return
        pending = self._pending
        title = pending["title"] if pending else message.recommendation_id
        if pending and pending["recommendation_id"] == message.recommendation_id:
            self._pending = None
        self.result_view.notice = _error_notice(f"could not apply {title}", message.error)
        self.notify(message.error, title=f"Could not apply {title}", severity="error")
        self._redraw()

    def on_apply_finished(self, message: ApplyFinished) -> None:
        if message.status == "failed":
            error = message.result.get("error") or "no error text"
            self.notify(f"{error}", title="Apply failed; training goes on as before", severity="error")
        else:
            self.notify(f"{message.result.get('remedy', message.recommendation_id)}: {message.status}")
        self._redraw()

    def action_revert(self) -> None:
        kept = last_kept(self.state.applied)
        reason = revert_refusal(self.state, in_flight=self._pending is not None or self._reverting is not None)
        if reason:
            self.post_message(RevertRefused(reason))
            self.notify(reason, title="Not reverted", severity="warning")
            return
        assert kept is not None
        rec_id = str(kept.get("recommendation_id"))
        self._reverting = {"recommendation_id": rec_id, "applied_count": len(self.state.applied)}
        name = kept.get("remedy") or rec_id
        self.result_view.notice = Text(f"↺ reverting {name} at next step boundary…", style="bold yellow")
        self._redraw()
        self.post_message(RevertRequested(rec_id))
        self._send_revert()

    @work(thread=True, group="source", exit_on_error=False)
    def _send_revert(self) -> None:
        try:
            error = self.source.revert()
        except Exception as exc:
            error = f"{type(exc).__name__}: {exc}"
        self.post_message(RevertSent(error))

    def on_revert_sent(self, message: RevertSent) -> None:
        if message.error is None:
            return
        self._reverting = None
        self.result_view.notice = _error_notice("could not revert", message.error)
        self.notify(message.error, title="Could not revert", severity="error")
        self._redraw()

    def action_evidence(self) -> None:
        if isinstance(self.screen, EvidenceScreen):
            return
        rec = self.recs_view.selected
        if rec is None:
            self.notify("No recommendation yet.", severity="warning")
            return
        self.push_screen(EvidenceScreen(rec))

    def on_recommendations_view_opened(self, message: RecommendationsView.Opened) -> None:
        if not isinstance(self.screen, EvidenceScreen):
            self.push_screen(EvidenceScreen(message.recommendation))

    def on_data_table_row_selected(self, event: DataTable.RowSelected) -> None:
        # Enter on the steps table: Enter means "evidence" everywhere on the main screen.
        if event.data_table.id == "steps-table":
            self.action_evidence()

    async def action_quit(self) -> None:
        """Stop following a running job (the CLI decides its fate), then leave."""
        try:
            finished = self.source.snapshot().finished
        except Exception:
            finished = self.state.finished
        if finished:
            self.exit(RESULT_FINISHED)
            return
        try:
            self.source.stop()
        except Exception as exc:  # quitting must always work
            self.log.error(f"source.stop() failed: {exc!r}")
        self.exit(RESULT_STOPPED)


def _signature(source: Source, state: SessionState) -> tuple[object, ...]:
    """Cheap fingerprint of what the screen shows; a source's ``version`` is used when it has one."""
    return (
        getattr(source, "version", None),
        tuple((rank, len(s), s[-1].index if s else -1) for rank, s in sorted(state.steps.items())),
        len(state.applied),
        len(state.events),
        tuple(str(r.get("id")) for r in state.recommendations),
        repr(state.diagnosis),
        repr(state.pending_apply),
        state.finished,
        state.exit_code,
        state.exit_reason,
        len(state.exits),
        len(state.memory),
        len(state.output_tail),
    )


def _subtitle(state: SessionState) -> str:
    parts = []
    if state.session_id:
        parts.append(f"session {state.session_id}")
    run = state.runs.get(0) or next(iter(state.runs.values()), None)
    if run is not None:
        parts.append(run.script)
        device = run.device.get("name") or run.device.get("type")
        if device:
            parts.append(str(device))
    if state.world_size > 1:
        parts.append(f"{state.world_size} ranks")
    latest = state.latest_step()
    parts.append("finished" if state.finished else (f"step {latest}" if latest >= 0 else "starting"))
    return " · ".join(parts)


def _error_notice(what: str, error: str) -> Text:
    text = Text()
    text.append(f"✗ {what}: ", style="bold red")
    text.append(error, style="red")
    return text


def make_app(source: Source, *, title: str = "advisor", poll_interval: float = 0.25) -> AdvisorApp:
    """Build the app over a live session or a fake; run it with ``.run()`` on the main thread."""
    return AdvisorApp(source, title=title, poll_interval=poll_interval)
