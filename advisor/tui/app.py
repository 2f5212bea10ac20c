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
from textual.css.query import NoMatches
from textual.widgets import DataTable, Footer, Header, TabbedContent, TabPane

from advisor.records.advice import Recommendation
from advisor.records.remedy import applied_name
from advisor.records.results import ApplyResult
from advisor.regime import apply_refusal, last_kept, revert_refusal
from advisor.state import SessionState, Source
from advisor.tui.confirm_screen import ConfirmApplyScreen
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
from advisor.tui.navigation import Navigation, subtitle
from advisor.tui.recommendations_view import RecommendationsView
from advisor.tui.result_view import ResultView
from advisor.tui.results import RESULT_FINISHED, RESULT_LEFT_RUNNING, RESULT_STOP_TRAINING  # noqa: F401 - callers' names
from advisor.tui.session_actions import SessionActions
from advisor.tui.steps_view import StepsView
from advisor.tui.view_model import ViewModel
from advisor.tui.views.advice import AdviceView
from advisor.tui.views.comm import CommView
from advisor.tui.views.compute import ComputeView
from advisor.tui.views.events import EventsView
from advisor.tui.views.memory import MemoryView
from advisor.tui.views.output import OutputView
from advisor.tui.views.overview import OverviewView
from advisor.tui.views.ranks import RanksView

# (key, tab id, tab label): one view per tab, each reachable by its key from anywhere. The tabs
# name their keys, so the footer leaves them out: at 80 columns it has room for the actions.
VIEWS: tuple[tuple[str, str, str], ...] = (
    ("1", "overview", "Overview"), ("2", "memory", "Memory"), ("3", "compute", "Compute"),
    ("4", "comm", "Comm"), ("5", "ranks", "Ranks"), ("6", "advice", "Advice"), ("7", "events", "Events"),
    ("8", "output", "Output"),
)
RANK_KEYS = Binding.Group("Rank", compact=True)  # `[` and `]` share one footer entry


class AdvisorApp(Navigation, SessionActions, App[str]):
    """Main screen: exit banner, one tab per view (keys 1-7), footer. Every view reads one
    ``ViewModel`` for the chosen rank, rebuilt in a worker when the session changes."""

    TITLE = "advisor"
    CSS = """
    #views { height: 1fr; }
    #views > ContentSwitcher { height: 1fr; }
    TabPane { padding: 0; height: 1fr; }
    TabPane > Vertical { height: 1fr; }
    OverviewView > StepsView { height: 1fr; }
    /* A short terminal (80x24): the banner and the diagnosis shrink to their first lines, so the
       views keep their rows; Enter (evidence) and the Events view have the rest. */
    .-short ExitBanner { max-height: 3; border: none; border-left: heavy $error; }
    .-short ExitBanner.-completed { border-left: heavy $success; }
    .-short RecommendationsView > #diagnosis { max-height: 2; }
    .-short AdviceView > #advice-lower { height: 6; }
    /* No room for a readable plot of the phases: their means take one line instead, and the
       step table keeps its rows (the sparklines go: the table has the figures). */
    .-short OverviewView > #phases-chart { display: none; }
    .-short OverviewView > #overview-phases { display: block; }
    .-short StepsView > #steps-sparks { display: none; }
    .-short ComputeView > #roofline-chart { display: none; }  /* its fallback is the ops table below */
    .-short MemoryView > #memory-summary { max-height: 3; }
    .-short MemoryView > #memory-chart { height: 9; }  /* the traced step's table, whole */
    """
    SHORT_ROWS = 32  # below this many rows the app is "-short"
    BINDINGS = [
        *(Binding(key, f"view('{tab}')", label, show=False) for key, tab, label in VIEWS),
        Binding("a", "apply", "Apply"),
        Binding("r", "revert", "Revert"),
        Binding("enter", "evidence", "Evidence"),
        Binding("left_square_bracket", "rank(-1)", "Rank-", group=RANK_KEYS),
        Binding("right_square_bracket", "rank(1)", "Rank+", group=RANK_KEYS),
        Binding("b", "budget", "Budget"),
        Binding("p", "plan", "Plan"),
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
        self.read_only = bool(getattr(source, "read_only", False))
        self.rank: int | None = None  # None: the slowest rank (the default), else the user's choice
        self.model: ViewModel | None = None
        self._budget: int | None = None  # a budget the user set with `b` (recorded sessions)
        self._building = False  # a model build is running
        self._rebuild = False  # and the state changed since it started
        self._model_error: str | None = None

    # ----- layout -----

    def compose(self) -> ComposeResult:
        yield Header(show_clock=False)
        yield ExitBanner(id="exit-banner")
        views = {"overview": OverviewView, "memory": MemoryView, "compute": ComputeView, "comm": CommView,
                 "ranks": RanksView, "advice": AdviceView, "events": EventsView, "output": OutputView}
        with TabbedContent(id="views", initial="overview"):
            for key, tab, label in VIEWS:
                with TabPane(f"{key} {label}", id=tab):
                    yield views[tab](id=f"{tab}-view")
        # The command palette (ctrl+p) still works; its footer entry would push `a Apply` off at 80 columns.
        yield Footer(show_command_palette=False)

    def on_mount(self) -> None:
        # Widgets live on the main screen; keep references so actions work from pushed screens too.
        self.steps_view = self.query_one(StepsView)
        self.recs_view = self.query_one(RecommendationsView)
        self.result_view = self.query_one(ResultView)
        self.result_view.read_only = self.read_only
        self.exit_banner = self.query_one(ExitBanner)
        self.output_view = self.query_one(OutputView)
        self.views = [self.query_one(cls) for cls in (OverviewView, MemoryView, ComputeView, CommView,
                                                       RanksView, AdviceView, EventsView)]
        self.steps_view.query_one(DataTable).focus()
        if self.read_only and hasattr(self.source, "readvise"):
            self._recompute(self._budget)  # a recorded session's advice, computed afresh from its records
        self.poll()
        self.set_interval(self.poll_interval, self.poll)

    def on_resize(self) -> None:
        self.set_class(self.size.height < self.SHORT_ROWS, "-short")
        self.sub_title = subtitle(self.state, self.model, self.size.width - len(self.title))
        if hasattr(self, "exit_banner"):
            self.exit_banner.update_state(self.state)  # its short form on a short terminal

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
        # Only the script's output changed: redraw (its view, the last line), but the views' model
        # (every record walked again) need not be rebuilt for a line of output.
        output_only = self._signature is not None and _without_output(signature) == _without_output(self._signature)
        self._signature = signature
        self.state = state
        self._check_pending(state)
        try:
            self._redraw()
        except NoMatches:  # a tick while the app is torn down (a test's failure, an exit): no widgets
            return
        if not output_only:
            self._build_model()
        if state.finished and not self._ended_posted:
            self._ended_posted = True
            self.post_message(TrainingEnded(state.exit_code, state.exit_reason))
        self.post_message(StateRefreshed(state.latest_step(), getattr(self.source, "version", None)))

    def _check_pending(self, state: SessionState) -> None:
        if self._pending is not None and state.finished and not any(
            str(r.recommendation_id) == self._pending["recommendation_id"]
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
                if str(result.recommendation_id) == rec_id:
                    self._pending = None
                    self.post_message(ApplyFinished(result))
                    break
        if self._reverting is not None and len(state.applied) > self._reverting["applied_count"]:
            self._reverting = None
            self.result_view.notice = None

    def _redraw(self) -> None:
        state = self.state
        self.sub_title = subtitle(state, self.model, self.size.width - len(self.title))
        self.exit_banner.update_state(state)
        self.steps_view.update_state(state, self.shown_rank())
        self.recs_view.update_state(state)
        self.result_view.pending = self._pending
        self.result_view.update_state(state)
        self.output_view.update_state(state)
        self.query_one(OverviewView).update_output(state)

    # ----- actions -----

    def check_action(self, action: str, parameters: tuple[object, ...]) -> bool | None:
        # The evidence screen is already open: hide its key from that screen's footer.
        if action == "evidence" and isinstance(self.screen, EvidenceScreen):
            return False
        if action in ("apply", "revert") and self.read_only:
            return None  # shown greyed: a recorded session has no job to change
        if action == "budget" and not self.read_only:
            return False  # live advice follows --memory-budget; `advisor open` can change it afterwards
        return True

    def _selected(self) -> Recommendation | None:
        if isinstance(self.screen, EvidenceScreen):
            return self.screen.recommendation  # `a` on the evidence screen applies what it shows
        return self.recs_view.selected

    def action_apply(self) -> None:
        rec = self._selected()
        rec_id = rec.id if rec else None
        reason = self._apply_refusal(rec)
        if reason:
            self.post_message(ApplyRefused(rec_id, reason))
            self.notify(reason, title="Not applied", severity="warning")
            return
        assert rec is not None and rec_id is not None
        if rec.apply_class == "live-opt-in":
            # It changes numerics: only with the user's explicit yes (headless needs --allow-inexact).
            def answered(yes: bool | None) -> None:
                if yes:
                    self._start_apply(rec, rec_id, confirmed=True)
                else:
                    self.notify("Not applied.", title=rec.title or rec_id)

            self.push_screen(ConfirmApplyScreen(rec.title or rec.remedy or rec_id), answered)
            return
        self._start_apply(rec, rec_id)

    def _start_apply(self, rec: Recommendation, rec_id: str, *, confirmed: bool = False) -> None:
        self._pending = {
            "recommendation_id": rec_id,
            "title": rec.title or rec.remedy or rec_id,
            "applied_count": len(self.state.applied),
        }
        self.result_view.notice = None
        self._redraw()
        self.post_message(ApplyRequested(rec_id))
        self._send_apply(rec_id, confirmed)

    def _apply_refusal(self, rec: Recommendation | None) -> str | None:
        return apply_refusal(self.state, rec, in_flight=self._pending is not None)

    @work(thread=True, group="source", exit_on_error=False)
    def _send_apply(self, recommendation_id: str, confirmed: bool = False) -> None:
        try:
            error = (self.source.apply(recommendation_id, confirmed=True) if confirmed
                     else self.source.apply(recommendation_id))
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
        result = message.result
        if message.status == "failed":
            error = (result.error if isinstance(result, ApplyResult) else None) or "no error text"
            self.notify(f"{error}", title="Apply failed; training goes on as before", severity="error")
        else:
            self.notify(f"{applied_name(result.remedy, message.recommendation_id)}: {message.status}")
        self._redraw()

    def action_revert(self) -> None:
        kept = last_kept(self.state.applied)
        reason = revert_refusal(self.state, in_flight=self._pending is not None or self._reverting is not None)
        if reason:
            self.post_message(RevertRefused(reason))
            self.notify(reason, title="Not reverted", severity="warning")
            return
        assert kept is not None
        rec_id = str(kept.recommendation_id)
        self._reverting = {"recommendation_id": rec_id, "applied_count": len(self.state.applied)}
        name = applied_name(kept.remedy, rec_id)
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

    # Views, ranks and the model: advisor/tui/navigation.py; budget, plan and quit:
    # advisor/tui/session_actions.py.


def _signature(source: Source, state: SessionState) -> tuple[object, ...]:
    """Cheap fingerprint of what the screen shows; a source's ``version`` is used when it has one.
    The script's output count comes last (``_without_output``)."""
    return (
        getattr(source, "version", None),
        tuple((rank, len(s), s[-1].index if s else -1) for rank, s in sorted(state.steps.items())),
        len(state.applied),
        len(state.events),
        tuple(r.id for r in state.recommendations),
        repr(state.diagnosis),
        repr(state.pending_apply),
        state.finished,
        state.exit_code,
        state.exit_reason,
        len(state.exits),
        len(state.memory),
        state.output_lines,
    )


def _without_output(signature: tuple[object, ...]) -> tuple[object, ...]:
    """The signature less the script's output: a live source's version counts each output line
    too (``LiveState.append_output``), so the output count is taken off it."""
    version, *rest, lines = signature
    return (version - lines if isinstance(version, int) and isinstance(lines, int) else version, *rest)


def _error_notice(what: str, error: str) -> Text:
    text = Text()
    text.append(f"✗ {what}: ", style="bold red")
    text.append(error, style="red")
    return text


def make_app(source: Source, *, title: str = "advisor", poll_interval: float = 0.25,
             budget_bytes: int | None = None) -> AdvisorApp:
    """Build the app over a live session, a recorded one (``RecordedSource``) or a fake; run it
    with ``.run()`` on the main thread. ``budget_bytes``: advise a recorded session at this budget."""
    app = AdvisorApp(source, title=title, poll_interval=poll_interval)
    app._budget = budget_bytes
    return app
