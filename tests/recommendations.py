"""Complete recommendations for tests that need one (the executor decodes every field of an
apply command's recommendation, checked, as it comes from the controller). Torch-free."""

from __future__ import annotations

from typing import Any

from advisor.records.advice import Prediction, Recommendation


def recommendation(id: str = "r1", remedy: str = "activation_checkpointing", *, params: dict[str, Any] | None = None,
                   peak: int | None = None, step_time_s: float | None = None,
                   baseline_step_time_s: float | None = None, **changes: Any) -> Recommendation:
    """A live-exact recommendation of ``remedy`` with ``params``, predicting ``peak`` bytes and
    ``step_time_s`` seconds against a baseline of ``baseline_step_time_s``; ``changes`` set any
    other field."""
    fields: dict[str, Any] = dict(
        id=id, remedy=remedy, title=f"{remedy} ({id})", params=dict(params or {}),
        predicted=Prediction(peak_memory_bytes=peak, step_time_s=step_time_s),
        baseline=Prediction(peak_memory_bytes=None, step_time_s=baseline_step_time_s),
        budget_bytes=None, cost_model="test", confidence="medium", exact=True, live=True)
    return Recommendation(**{**fields, **changes})


def wire(id: str = "r1", remedy: str = "activation_checkpointing", **kw: Any) -> dict[str, Any]:
    """``recommendation(...)`` in the JSON form an apply command carries."""
    return recommendation(id, remedy, **kw).to_dict()
