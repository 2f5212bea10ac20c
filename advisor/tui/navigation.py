"""The app's views and ranks: the views' model built in a worker, tabs, rank switching.

A mixin of ``AdvisorApp`` (advisor/tui/app.py), kept apart so each file reads in one sitting.
"""

from __future__ import annotations

import os
from typing import Any

from textual import work
from textual.widgets import DataTable, TabbedContent, TabPane

from advisor.state import SessionState
from advisor.tui.messages import ModelBuilt, RankSwitched
from advisor.tui.view_model import ViewModel, build_view_model
from advisor.tui.views.memory import MemoryView
from advisor.tui.views.ranks import RanksView


class Navigation:
    """Needs the app's ``state``, ``rank``, ``model``, ``views``, ``read_only`` and ``_budget``."""

    state: SessionState
    rank: int | None
    model: ViewModel | None
    views: list[Any]
    read_only: bool
    _budget: int | None
    _building: bool
    _rebuild: bool
    _model_error: str | None

    def _build_model(self) -> None:
        """Build the views' model from the latest state in a worker, one build at a time: a
        change that arrives during a build is built next, so a long run never piles up threads."""
        if self._building:
            self._rebuild = True
            return
        self._building = True
        self._model_worker(self.state, self.rank, self._budget)

    @work(thread=True, group="model", exit_on_error=False)
    def _model_worker(self, state: SessionState, rank: int | None, budget: int | None) -> None:
        """The section builders walk every record: never on the UI thread."""
        try:
            model = build_view_model(state, rank=rank, budget_bytes=budget, live=not self.read_only)
        except Exception as exc:  # odd data must not take the UI down; the other views still work
            self.post_message(ModelBuilt(None, rank if rank is not None else -1, error=f"{type(exc).__name__}: {exc}"))
            return
        self.post_message(ModelBuilt(model, model.rank))

    def on_model_built(self, message: ModelBuilt) -> None:
        self._building = False
        if self._rebuild:
            self._rebuild = False
            self._build_model()
        if message.model is None:
            if message.error != self._model_error:
                self._model_error = message.error
                self.notify(str(message.error), title="Could not build the views", severity="error")
            return
        self._model_error = None
        if self.rank is not None and message.rank != self.rank:
            return  # built for a rank the user has since left; the next build is for the new one
        self.model = message.model
        self.sub_title = subtitle(self.state, message.model, self.size.width - len(self.title))
        for view in self.views:
            view.update_model(message.model)
        self.steps_view.update_state(self.state, message.model.rank)
        # The baseline's peak where the advice leaves it unsaid, and whose measurement results show.
        memory = message.model.memory_now or message.model.memory
        self.recs_view.measured_peak = memory.get("peak_bytes")
        self.recs_view.update_state(self.state)
        self.result_view.rank = message.model.rank
        self.result_view.update_state(self.state)

    def action_view(self, tab: str) -> None:
        self.query_one(TabbedContent).active = tab
        pane = self.query_one(f"#{tab}", TabPane)
        tables = pane.query(DataTable)
        if tables:
            tables.first().focus()

    def action_rank(self, delta: int) -> None:
        if self.model is None or len(self.model.ranks) < 2:
            self.notify("This session has one rank.", severity="warning")
            return
        ranks = [r.rank for r in self.model.ranks]
        here = ranks.index(self.model.rank) if self.model.rank in ranks else 0
        self._switch_rank(ranks[(here + delta) % len(ranks)])

    def on_ranks_view_chosen(self, message: RanksView.Chosen) -> None:
        self._switch_rank(message.rank)

    def _switch_rank(self, rank: int) -> None:
        self.rank = rank
        self.post_message(RankSwitched(rank))
        self.steps_view.update_state(self.state, rank)  # the step table is cheap: switch it at once
        self._build_model()

    def shown_rank(self) -> int | None:
        """The rank every view shows: the user's choice, else the model's (the slowest); None before
        either is known."""
        if self.rank is not None:
            return self.rank
        return self.model.rank if self.model is not None else None

    def action_sort_modules(self) -> None:
        key = self.query_one(MemoryView).cycle_sort()
        self.notify(f"modules sorted by {key.replace('_', ' ')}")


def subtitle(state: SessionState, model: ViewModel | None = None, width: int = 0) -> str:
    """What runs, where it is, which rank is shown, the device and the session, in that order of
    importance: with ``width`` (cells for the subtitle), the parts that do not fit are left out
    whole rather than cut."""
    latest = state.latest_step()
    parts = ["finished" if state.finished else (f"step {latest}" if latest >= 0 else "starting")]
    run = state.runs.get(0) or next(iter(state.runs.values()), None)
    if run is not None:
        parts.insert(0, os.path.basename(run.script) or run.script)
    if state.world_size > 1:
        parts.append(f"{state.world_size} ranks" + (f", rank {model.rank} shown" if model else ""))
    device = (run.device.get("name") or run.device.get("type")) if run is not None else None
    if device:
        parts.append(str(device))
    if state.session_id:
        parts.append(f"session {state.session_id}")
    if width <= 0:
        return " · ".join(parts)
    kept: list[str] = []
    for part in parts:
        if len(" · ".join([*kept, part])) <= width - 24:  # the header's icon, its clock's room and " — "
            kept.append(part)
    return " · ".join(kept)
