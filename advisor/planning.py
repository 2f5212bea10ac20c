"""``advisor plan SESSION -o plan.json``: from a recorded (perhaps OOM-ed) run to a plan that fits."""

from __future__ import annotations

import sys
from pathlib import Path

from advisor.advice import advise_state
from advisor.errors import AdvisorError
from advisor.recommend.remedies import remedy_modules
from advisor.records.plan import Plan, PlanEntry, save_plan
from advisor.store import load_state


def write_plan_from_session(db_path: Path, output: str, *, budget_bytes: int | None,
                            recommendation_id: str | None) -> int:
    # The advice `advisor report` and the live loop give for this session (one path: advise_state).
    diagnosis, recommendations = advise_state(load_state(db_path), budget_bytes=budget_bytes)
    # Applicable remedies only: live ones, and restart ones the plan can carry (an environment).
    recs = [r for r in recommendations if r.get("live") or _plan_env(r["remedy"])]
    if recommendation_id:
        chosen = next((r for r in recs if r["id"] == recommendation_id), None)
        if chosen is None:
            raise AdvisorError(f"no recommendation {recommendation_id!r} in this session",
                               hint=f"valid: {', '.join(r['id'] for r in recs) or 'none'}")
    else:
        chosen = recs[0] if recs else None
    if chosen is None:
        raise AdvisorError(f"nothing to plan: {(diagnosis or {}).get('summary') or 'no recommendation for this session'}",
                           hint="pass --memory-budget to plan against a smaller budget")
    save_plan(Plan(remedies=(PlanEntry(remedy=chosen["remedy"], params=chosen["params"],
                                       recommendation_id=chosen["id"]),),
                   env=_plan_env(chosen["remedy"])), output)
    print(f"wrote plan {output}: {chosen.get('title') or chosen['remedy']}; run it with "
          f"`advisor attach --plan {output} ...`", file=sys.stderr)
    return 0


def _plan_env(remedy: str) -> dict[str, str]:
    """The environment a restart remedy needs (its predictor module's ``ENV``), else {}."""
    for module in remedy_modules():
        if module.SPEC.name == remedy:
            return dict(getattr(module, "ENV", None) or {})
    return {}
