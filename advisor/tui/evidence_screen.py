"""One recommendation in full: parameters, prerequisites, evidence and its trade-off curve."""

from __future__ import annotations

from typing import Any

from rich.text import Text
from textual.app import ComposeResult
from textual.binding import Binding
from textual.containers import VerticalScroll
from textual.screen import Screen
from textual.widgets import Footer, Static

from advisor.tui.format import bar, fmt_bytes, fmt_seconds, fmt_transition_bytes, fmt_transition_seconds

BAR_WIDTH = 24
CHOICE_STYLES = {"keep": "dim", "recompute": "cyan", "offload": "magenta"}


def evidence_text(rec: dict[str, Any]) -> Text:
    """Everything about a recommendation except its curve, as plain lines."""
    text = Text()
    text.append(str(rec.get("title") or rec.get("remedy") or rec.get("id")), style="bold")
    text.append(f"   [{rec.get('remedy', '?')}, id {rec.get('id', '?')}]", style="dim")
    predicted = rec.get("predicted") or {}
    baseline = rec.get("baseline") or {}
    text.append("\n\nPredicted peak memory: ")
    text.append(fmt_transition_bytes(baseline.get("peak_memory_bytes"), predicted.get("peak_memory_bytes")))
    text.append("\nPredicted step time:   ")
    text.append(fmt_transition_seconds(baseline.get("step_time_s"), predicted.get("step_time_s")))
    confidence = rec.get("confidence")
    conf = f"{confidence:.0%}" if isinstance(confidence, (int, float)) else str(confidence or "—")
    text.append(f"\nConfidence: {conf}   cost model: {rec.get('cost_model') or '—'}")
    text.append("\nExact (same numerics): " + ("yes" if rec.get("exact") else "no"))
    if rec.get("live"):
        text.append("\nApplies live at the next step boundary (press a).")
    else:
        text.append("\nNot live: it needs a restart of the training script.", style="yellow")
    params = rec.get("params") or {}
    if params:
        text.append("\n\nParameters", style="bold")
        for name, value in params.items():
            text.append(f"\n  {name} = {_short(value)}")
    plan = rec.get("block_plan") or []
    if plan:
        text.append("\n\nPlan per block", style="bold")
        for block in plan:
            choice = str(block.get("choice", "?"))
            text.append(f"\n  {block.get('name', '?'):<24} ")
            text.append(choice, style=CHOICE_STYLES.get(choice, ""))
    prerequisites = rec.get("prerequisites") or []
    if prerequisites:
        text.append("\n\nPrerequisites", style="bold")
        for item in prerequisites:
            text.append(f"\n  • {item}")
    text.append("\n\nEvidence", style="bold")
    evidence = rec.get("evidence") or []
    if not evidence:
        text.append("\n  none recorded", style="dim")
    for item in evidence:
        text.append(f"\n  • {item}")
    return text


def curve_text(curve: list[dict[str, Any]] | None) -> Text:
    """The memory/time trade-off as bars: one row per budget the solver tried, smallest first."""
    if not curve:
        return Text("No trade-off curve for this remedy.", style="dim")
    points = sorted(curve, key=lambda p: p.get("budget_bytes") or 0)
    max_peak = max((p.get("peak_memory_bytes") or 0) for p in points)
    max_overhead = max((p.get("overhead_s") or 0) for p in points)
    text = Text()
    text.append("Trade-off curve", style="bold")
    text.append(f"\n{'budget':>10}  {'peak memory':<{BAR_WIDTH + 11}}  {'added time':<{BAR_WIDTH + 11}}  modules")
    for p in points:
        peak = p.get("peak_memory_bytes") or 0
        overhead = p.get("overhead_s") or 0
        text.append(f"\n{fmt_bytes(p.get('budget_bytes')):>10}  ")
        text.append(bar(peak, max_peak, BAR_WIDTH), style="magenta")
        text.append(f" {fmt_bytes(peak):>9}  ")
        text.append(bar(overhead, max_overhead, BAR_WIDTH), style="cyan")
        text.append(f" {'+' + fmt_seconds(overhead):>9}  ")
        text.append(str(p.get("modules_count", "—")))
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

    def __init__(self, recommendation: dict[str, Any]) -> None:
        super().__init__()
        self.recommendation = recommendation

    def compose(self) -> ComposeResult:
        with VerticalScroll():
            yield Static(evidence_text(self.recommendation), id="evidence")
            yield Static(curve_text(self.recommendation.get("curve")), id="curve")
        yield Footer()

    def action_close(self) -> None:
        self.dismiss(None)
