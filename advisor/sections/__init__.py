"""Report sections, one module per area; ``build_sections`` assembles them.

A section that fails on odd data becomes a warning in the report instead of
losing the whole report: the rest of a session is still worth reading.
"""

from __future__ import annotations

from typing import Any, Callable

from advisor.advice import advise_state
from advisor.recommend.calibration import model_errors
from advisor.sections.comm import (
    build_collectives_section,
    build_comm_section,
    build_straggler_section,
)
from advisor.sections.compute import (
    build_compute_section,
    build_ops_section,
    device_fields,
    device_spec_from_state,
)
from advisor.sections.links import build_links_section
from advisor.sections.memory import build_memory_section
from advisor.sections.regimes import build_regimes_section
from advisor.sections.zero import build_zero_section
from advisor.state import SessionState


def _memory(state: SessionState, report: dict[str, Any], budget: int | None) -> dict[str, Any]:
    return {"memory": build_memory_section(state, budget_bytes=budget)}


def _compute(state: SessionState, report: dict[str, Any], budget: int | None) -> dict[str, Any]:
    spec = device_spec_from_state(state) or {}
    if spec:
        report["run"]["device"].update(device_fields(spec))
    return {"ops": build_ops_section(state, spec), "compute": build_compute_section(state, spec),
            "regimes": build_regimes_section(state, spec)}


def _comm(state: SessionState, report: dict[str, Any], budget: int | None) -> dict[str, Any]:
    return {"collectives": build_collectives_section(state), "comm": build_comm_section(state),
            "straggler": build_straggler_section(state), "comm_links": build_links_section(state)}


Advice = tuple[Any, list[Any]]  # (Diagnosis | None, [Recommendation]) as ``advise_state`` returns them


def _advice(state: SessionState, report: dict[str, Any], budget: int | None, advice: Advice | None = None
            ) -> dict[str, Any]:
    # The same call the live advice loop makes, on the same records: the report only serialises it
    # (``advice``: that call's answer, made by the caller on this state already).
    diagnosis, recommendations = advice if advice is not None else advise_state(state, budget_bytes=budget)
    calibration = [errors.to_dict() for errors in model_errors(state.applied, state.steps).values()]
    return {"diagnosis": None if diagnosis is None else diagnosis.to_dict(),
            "recommendations": [r.to_dict() for r in recommendations],
            "applied": [entry.as_history() for entry in state.applied], "calibration": calibration}


def _zero(state: SessionState, report: dict[str, Any], budget: int | None) -> dict[str, Any]:
    return {"zero": build_zero_section(state)}


SECTIONS: list[tuple[str, Callable[[SessionState, dict[str, Any], int | None], dict[str, Any]]]] = [
    ("memory", _memory), ("compute", _compute), ("comm", _comm), ("advice", _advice),
    ("zero", _zero),
]


def build_sections(state: SessionState, report: dict[str, Any], *, budget_bytes: int | None,
                   advice: Advice | None = None) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for name, build in SECTIONS:
        try:
            if build is _advice and advice is not None:
                out.update(_advice(state, report | out, budget_bytes, advice))
                continue
            out.update(build(state, report | out, budget_bytes))
        except Exception as exc:  # noqa: BLE001 - reported, never fatal
            report["warnings"].append(f"report section {name} failed: {type(exc).__name__}: {exc}")
    return out
