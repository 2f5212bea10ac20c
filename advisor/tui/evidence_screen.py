"""One recommendation in full: parameters, prerequisites, evidence and its trade-off curve."""

from __future__ import annotations

import math
from typing import Any, Sequence

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import Screen
from textual.widgets import Footer, Static

from advisor.records.advice import CurvePoint, Recommendation
from advisor.tui.format import bar, fmt_bytes, fmt_seconds, fmt_transition_bytes, fmt_transition_seconds

BAR_WIDTH = 24
CHOICE_STYLES = {"keep": "dim", "recompute": "cyan", "offload": "magenta"}


def evidence_text(rec: Recommendation) -> Text:
    """Everything about a recommendation except its curve, as plain lines."""
    text = Text()
    text.append(rec.title or rec.remedy or rec.id, style="bold")
    text.append(f"   [{rec.remedy}, id {rec.id}]", style="dim")
    predicted, baseline = rec.predicted, rec.baseline
    text.append("\n\nPredicted peak memory: ")
    text.append(fmt_transition_bytes(baseline.peak_memory_bytes, predicted.peak_memory_bytes))
    text.append("\nPredicted step time:   ")
    text.append(fmt_transition_seconds(baseline.step_time_s, predicted.step_time_s))
    text.append(f"\nConfidence: {rec.confidence}   cost model: {rec.cost_model or '—'}")
    text.append("\nExact (same numerics): " + ("yes" if rec.exact else "no"))
    if rec.live:
        text.append("\nApplies live at the next step boundary (press a).")
    else:
        text.append("\nNot live: it needs a restart of the training script.", style="yellow")
    if rec.parts:
        text.append("\n\nParts, applied together in this order (each predicted alone)", style="bold")
        for part in rec.parts:
            alone = part.predicted
            text.append(f"\n  {part.id:<24} {part.apply_class:<16} peak {fmt_bytes(alone.peak_memory_bytes)}"
                        + ("" if rec.budget_bytes is None or (alone.peak_memory_bytes or 0) <= rec.budget_bytes
                           else " (over the budget)")
                        + f", step {fmt_seconds(alone.step_time_s)}")
    elif rec.params:
        text.append("\n\nParameters", style="bold")
        for name, value in rec.params.items():
            text.append(f"\n  {name} = {_short(value)}")
    if rec.block_plan:
        text.append("\n\nPlan per block", style="bold")
        for block in rec.block_plan:
            text.append(f"\n  {block.name:<24} ")
            text.append(block.choice, style=CHOICE_STYLES.get(block.choice, ""))
    if rec.prerequisites:
        text.append("\n\nPrerequisites", style="bold")
        for item in rec.prerequisites:
            text.append(f"\n  • {item}")
    text.append("\n\nEvidence", style="bold")
    if not rec.evidence:
        text.append("\n  none recorded", style="dim")
    for item in rec.evidence:
        text.append(f"\n  • {item}")
    return text


def _finite(value: float) -> float:
    return value if math.isfinite(value) else 0.0  # a plan with no finite cost draws no bar


def curve_text(curve: Sequence[CurvePoint] | None) -> Text:
    """The memory/time trade-off as bars: one row per budget the solver tried, smallest first."""
    if not curve:
        return Text("No trade-off curve for this remedy.", style="dim")
    points = sorted(curve, key=lambda p: p.budget_bytes)
    max_peak = max(p.peak_memory_bytes for p in points)
    max_overhead = max(_finite(p.overhead_s) for p in points)
    text = Text()
    text.append("Trade-off curve", style="bold")
    text.append(f"\n{'budget':>10}  {'peak memory':<{BAR_WIDTH + 11}}  {'added time':<{BAR_WIDTH + 11}}  modules")
    for p in points:
        overhead = _finite(p.overhead_s)
        text.append(f"\n{fmt_bytes(p.budget_bytes):>10}  ")
        text.append(bar(p.peak_memory_bytes, max_peak, BAR_WIDTH), style="magenta")
        text.append(f" {fmt_bytes(p.peak_memory_bytes):>9}  ")
        text.append(bar(overhead, max_overhead, BAR_WIDTH), style="cyan")
        text.append(f" {'+' + fmt_seconds(overhead):>9}  ")
        text.append(str(p.modules_count))
    return text


def _short(value: Any, limit: int = 120) -> str:
    """Long parameter lists (e.g. module names) are cut so the screen stays readable."""
    s = ", ".join(map(str, value)) if isinstance(value, (list, tuple)) else str(value)
    return s if len(s) <= limit else s[: limit - 1] + "…"


class EvidenceScreen(Screen[None]):
    """Pushed by Enter on a recommendation; Escape returns to the main screen."""

    BINDINGS = [Binding("escape", "close", "Back")]
    DEFAULT_CSS = """
    EvidenceScreen > VerticalScroll { padding: 1 2; }
    EvidenceScreen Static { height: auto; }
    EvidenceScreen #curve { margin-top: 1; }
    """

    def __init__(self, recommendation: Recommendation) -> None:
        super().__init__()
        self.recommendation = recommendation

    def compose(self) -> ComposeResult:
        with VerticalScroll():
            yield Static(evidence_text(self.recommendation), id="evidence")
            yield Static(curve_text(self.recommendation.curve), id="curve")
        yield Footer()

    def action_close(self) -> None:
        self.dismiss(None)
