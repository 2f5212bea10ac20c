"""``advisor check REPORT.json``: the invariants a reader of a report relies on.

A report that contradicts itself (a share above 100%, an exposed time longer than its step, a
diagnosis quoting a figure no section shows) costs the reader's trust in every other figure.
``check_report`` recomputes what can be recomputed from the report itself and names each field
that disagrees, with the values; an empty list means the report is consistent. The end-to-end
tests and every recorded session run it (tests/checked.py).

Torch-free and standard library only: it reads the JSON the report writes
(docs/report-schema.md, which states the statistic of every figure checked here).
"""

from __future__ import annotations

import json
import math
import statistics
import sys
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping, Sequence

from advisor.recommend.rules._figures import FP32_DTYPES, MATMUL_OPS
from advisor.records.samples import ordinary_steps

REPORT_SCHEMA = "advisor.report/1"
DIFF_SCHEMA = "advisor.diff/1"
PHASES = ("data_s", "forward_s", "backward_s", "optimizer_s", "other_s")

# Figures are compared after a JSON round trip and, in the diagnosis's evidence, after rounding
# (shares to 4 decimals, seconds to 6): a relative tolerance for sums, an absolute one for those.
REL_TOL = 1e-6
SHARE_ABS_TOL = 1e-4
SECONDS_ABS_TOL = 2e-6
BYTES_ABS_TOL = 1.0

# Keys whose value is a fraction in [0, 1] wherever they appear in a report.
SHARE_KEYS = frozenset({"exposed_share", "memory_bound_share", "unaccounted_share", "time_share", "mfu",
                        "roof_fraction", "time_scale"})


@dataclass(frozen=True, kw_only=True)
class Breach:
    """One invariant the report breaks: the field (a JSON path such as ``comm[1].exposed_s``),
    the values that disagree (path -> value) and what a reader would have been told wrong."""

    field: str
    values: Mapping[str, Any] = field(default_factory=dict)
    message: str

    def line(self) -> str:
        shown = ", ".join(f"{k}={_show(v)}" for k, v in self.values.items())
        return f"{self.field}: {self.message}" + (f" ({shown})" if shown else "")


def _show(value: Any) -> str:
    return f"{value:.6g}" if isinstance(value, float) else json.dumps(value, default=str)


def _num(value: Any) -> float | None:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return None
    return float(value) if math.isfinite(value) else None


def _close(a: float, b: float, *, abs_tol: float = 1e-9) -> bool:
    return math.isclose(a, b, rel_tol=REL_TOL, abs_tol=abs_tol)


def _at_most(a: float, b: float, *, abs_tol: float = 1e-9) -> bool:
    return a <= b or _close(a, b, abs_tol=abs_tol)


class _Checks:
    """Collects breaches; one method per area of the report."""

    def __init__(self, report: Mapping[str, Any]) -> None:
        self.report = report
        self.out: list[Breach] = []
        steps = [s for s in report.get("steps") or [] if isinstance(s, Mapping)]
        self.steps_by_rank: dict[int, list[Mapping[str, Any]]] = {}
        for s in steps:
            self.steps_by_rank.setdefault(int(s.get("rank") or 0), []).append(s)
        summary = report.get("summary") or {}
        run = report.get("run") or {}
        # Figures over every step can be recomputed only from a complete list of one run's steps.
        self.complete = not summary.get("steps_dropped") and not run.get("restarts")

    def breach(self, path: str, message: str, **values: Any) -> None:
        self.out.append(Breach(field=path, values=values, message=message))

    # -- helpers -------------------------------------------------------------------

    def light_steps(self, rank: int, first: int | None = None, last: int | None = None) -> list[Mapping[str, Any]]:
        """A rank's ordinary steps (``ordinary_steps``: not step 0, not deep, not right after a deep
        one, with its fallbacks): the steps every "step time" figure is the median of."""
        mine = [s for s in self.steps_by_rank.get(rank, [])
                if (first is None or s.get("index", 0) >= first) and (last is None or s.get("index", 0) <= last)]
        return ordinary_steps(mine, index=lambda s: s.get("index", 0), deep=lambda s: bool(s.get("deep")))

    def light_median(self, rank: int, **window: Any) -> float | None:
        times = [t for s in self.light_steps(rank, **window) if (t := _num(s.get("time_s"))) is not None]
        return statistics.median(times) if times else None

    def first_rank(self) -> int | None:
        return min(self.steps_by_rank) if self.steps_by_rank else None

    def median_is(self, path: str, value: Any, rank: int, **window: Any) -> None:
        """``value`` must be the median of ``rank``'s light steps (in the window)."""
        got, want = _num(value), self.light_median(rank, **window)
        if got is None or want is None or not self.complete:
            return
        if not _close(got, want, abs_tol=1e-9):
            self.breach(path, f"a step time is the median of rank {rank}'s ordinary steps (not step 0, "
                        "not deep-sampled, not right after a deep one), and this one is not", **{path: got, "median of the steps": want})

    # -- areas ---------------------------------------------------------------------

    def shares(self, node: Any, path: str) -> None:
        """Every fraction in [0, 1] (an op's ``roof_fraction`` may exceed 1 when ``above_roof``
        says so: the roofline's inputs are off for it), every ``*_pct`` in [0, 100]."""
        if isinstance(node, Mapping):
            for key, value in node.items():
                here = f"{path}.{key}" if path else str(key)
                number = _num(value)
                if key in SHARE_KEYS and number is not None:
                    flagged = key == "roof_fraction" and node.get("above_roof") is True
                    if not flagged and not (-1e-12 <= number <= 1 + 1e-9):
                        self.breach(here, "a share must lie in [0, 1]"
                                    + (" (or be flagged above_roof)" if key == "roof_fraction" else ""),
                                    **{here: number})
                elif str(key).endswith("_pct") and number is not None and not (0 <= number <= 100):
                    self.breach(here, "a percentage must lie in [0, 100]", **{here: number})
                elif key == "phase_share" and isinstance(value, Mapping):
                    self.fractions(here, value)
                elif key == "phase_fraction" and isinstance(value, Mapping):
                    self.fractions(here, value)
                else:
                    self.shares(value, here)
        elif isinstance(node, list):
            for i, item in enumerate(node):
                self.shares(item, f"{path}[{i}]")

    def fractions(self, path: str, values: Mapping[str, Any]) -> None:
        numbers = {k: _num(v) for k, v in values.items()}
        for key, number in numbers.items():
            if number is not None and not (-1e-12 <= number <= 1 + 1e-9):
                self.breach(f"{path}.{key}", "a share must lie in [0, 1]", **{f"{path}.{key}": number})
        known = [n for n in numbers.values() if n is not None]
        if any(known) and not _close(sum(known), 1.0, abs_tol=1e-6):  # all 0: steps without phases
            self.breach(path, "the phases' shares must add up to the whole step", **{f"sum({path})": sum(known)})

    def steps(self) -> None:
        for i, s in enumerate(self.report.get("steps") or []):
            time_s, phases = _num(s.get("time_s")), s.get("phases") or {}
            parts = [_num(v) for v in phases.values()]
            if time_s is None or not parts or None in parts:
                continue
            if not _close(sum(parts), time_s, abs_tol=1e-6):  # type: ignore[arg-type]
                self.breach(f"steps[{i}].phases", "the phases must add up to the step they split",
                            **{f"sum(steps[{i}].phases)": sum(parts), f"steps[{i}].time_s": time_s})  # type: ignore[arg-type]
            device = _num(s.get("device_time_s"))
            if device is not None and device < 0:
                self.breach(f"steps[{i}].device_time_s", "a time cannot be negative", **{f"steps[{i}].device_time_s": device})

    def summary(self) -> None:
        summary = self.report.get("summary") or {}
        rank = self.first_rank()
        if rank is not None:
            self.median_is("summary.median_step_s", summary.get("median_step_s"), rank)
        fraction, share = summary.get("phase_fraction"), summary.get("phase_share")
        if isinstance(fraction, Mapping) and isinstance(share, Mapping):
            for key, value in fraction.items():
                old = _num(share.get(f"{key}_s"))
                if old is not None and _num(value) is not None and not _close(old, float(value)):
                    self.breach(f"summary.phase_fraction.{key}", "the deprecated phase_share must hold the same "
                                "fractions", **{f"summary.phase_fraction.{key}": value,
                                                f"summary.phase_share.{key}_s": old})
        mean_phases, mean = summary.get("phase_mean_s"), _num(summary.get("mean_step_s"))
        if isinstance(mean_phases, Mapping) and mean is not None:
            total = sum(n for v in mean_phases.values() if (n := _num(v)) is not None)
            if total and not _close(total, mean, abs_tol=1e-9):
                self.breach("summary.phase_mean_s", "the phases must add up to the mean step they split",
                            **{"sum(summary.phase_mean_s)": total, "summary.mean_step_s": mean})

    def memory(self) -> None:
        memory = self.report.get("memory") or {}
        peak = _num(memory.get("peak_bytes"))
        at_peak = {k: n for k, v in (memory.get("categories_at_peak") or {}).items() if (n := _num(v)) is not None}
        maxima = {k: n for k, v in (memory.get("categories_max") or {}).items() if (n := _num(v)) is not None}
        if peak is None:
            if any(at_peak.values()):
                self.breach("memory.peak_bytes", "categories are given at a peak the report does not state",
                            **{"memory.peak_bytes": None, "sum(memory.categories_at_peak)": sum(at_peak.values())})
            steps_peak = [n for s in self.report.get("steps") or [] if (n := _num(s.get("peak_memory_bytes"))) is not None]
            if steps_peak:
                self.breach("memory.peak_bytes", "the steps carry a peak the memory section does not show",
                            **{"memory.peak_bytes": None, "max(steps[].peak_memory_bytes)": max(steps_peak)})
            return
        if at_peak:
            counted = sum(v for k, v in at_peak.items() if k != "offloaded_host")
            if not _close(counted, peak, abs_tol=BYTES_ABS_TOL):
                self.breach("memory.categories_at_peak", "the categories at the peak must add up to the peak",
                            **{"sum(memory.categories_at_peak)": counted, "memory.peak_bytes": peak})
            for key, value in at_peak.items():
                if key != "offloaded_host" and value > peak + BYTES_ABS_TOL:
                    self.breach(f"memory.categories_at_peak.{key}", "a category cannot exceed the peak it is part of",
                                **{f"memory.categories_at_peak.{key}": value, "memory.peak_bytes": peak})
                if key in maxima and value > maxima[key] + BYTES_ABS_TOL:
                    self.breach(f"memory.categories_max.{key}", "a category's maximum is below its value at the peak",
                                **{f"memory.categories_max.{key}": maxima[key], f"memory.categories_at_peak.{key}": value})
        elif peak and any(maxima.values()):
            pass  # maxima without a breakdown at the peak: nothing to add up
        for i, point in enumerate(memory.get("timeline") or []):
            total = _num(point.get("total_bytes"))
            if total is not None and total > peak + BYTES_ABS_TOL:
                self.breach(f"memory.timeline[{i}].total_bytes", "a point of the timeline is above the peak",
                            **{f"memory.timeline[{i}].total_bytes": total, "memory.peak_bytes": peak})
                break

    def compute(self) -> None:
        compute = self.report.get("compute") or {}
        op, step = _num(compute.get("op_time_s")), _num(compute.get("step_time_s"))
        light = _num(compute.get("light_step_time_s"))
        if op is not None and step is not None and not _at_most(op, step):
            self.breach("compute.op_time_s", "the ops of a step cannot take longer than the step",
                        **{"compute.op_time_s": op, "compute.step_time_s": step})
        p_op, p_step = _num(compute.get("profiled_op_time_s")), _num(compute.get("profiled_step_time_s"))
        if p_op is not None and p_step is not None and not _at_most(p_op, p_step):
            self.breach("compute.profiled_op_time_s", "the ops of a profiled step cannot take longer than it",
                        **{"compute.profiled_op_time_s": p_op, "compute.profiled_step_time_s": p_step})
        if compute.get("time_base") == "light step" and light is not None and step is not None \
                and not _close(step, light):
            self.breach("compute.step_time_s", "on the light-step time base the step is the ordinary step",
                        **{"compute.step_time_s": step, "compute.light_step_time_s": light})
        rank = self.first_rank()
        if rank is not None and light is not None:
            self.median_is("compute.light_step_time_s", light, rank)
        comm = self.comm_rows()
        # Host-timed ops only: on a GPU the collectives' kernels overlap the compute kernels, and
        # "exposed" is the host's wait.
        if op is not None and step is not None and comm and compute.get("op_time_base") != "device kernels":
            low = compute.get("rank") if compute.get("rank") in comm else min(comm)
            exposed = _num(comm[low].get("exposed_s"))
            if exposed is not None and not _at_most(op + exposed, step, abs_tol=1e-6):
                self.breach("compute.op_time_s", f"ops plus rank {low}'s exposed communication cannot exceed "
                            "the step", **{"compute.op_time_s": op, f"comm[rank {low}].exposed_s": exposed,
                                           "compute.step_time_s": step})

    def comm_rows(self) -> dict[int, Mapping[str, Any]]:
        return {int(r["rank"]): r for r in self.report.get("comm") or [] if isinstance(r, Mapping) and "rank" in r}

    def comm(self) -> None:
        for i, row in enumerate(self.report.get("comm") or []):
            step, comm, exposed = (_num(row.get(k)) for k in ("step_time_s", "comm_s", "exposed_s"))
            here = f"comm[{i}]"
            if exposed is not None and comm is not None and not _at_most(exposed, comm):
                self.breach(f"{here}.exposed_s", "exposed communication cannot exceed the communication",
                            **{f"{here}.exposed_s": exposed, f"{here}.comm_s": comm})
            if comm is not None and step is not None and not _at_most(comm, step):
                self.breach(f"{here}.comm_s", "a step's communication cannot exceed the step",
                            **{f"{here}.comm_s": comm, f"{here}.step_time_s": step})
            if exposed is not None and step is not None and not _at_most(exposed, step):
                self.breach(f"{here}.exposed_s", "exposed communication cannot exceed the step",
                            **{f"{here}.exposed_s": exposed, f"{here}.step_time_s": step})
            share = _num(row.get("exposed_share"))
            if share is not None and exposed is not None and step and not _close(share, exposed / step):
                self.breach(f"{here}.exposed_share", "the share must be the exposed time over the step time shown",
                            **{f"{here}.exposed_share": share, f"{here}.exposed_s / {here}.step_time_s": exposed / step})
            if "rank" in row:
                self.median_is(f"{here}.step_time_s", row.get("step_time_s"), int(row["rank"]))
        straggler = self.report.get("straggler") or {}
        rows = self.comm_rows()
        for rank, value in (straggler.get("per_rank_step_time_s") or {}).items():
            path = f"straggler.per_rank_step_time_s.{rank}"
            self.median_is(path, value, int(rank))
            other = rows.get(int(rank), {}).get("step_time_s")
            if _num(other) is not None and _num(value) is not None and not _close(float(value), float(other)):
                self.breach(path, "the straggler's step time must be the one the comm section shows",
                            **{path: value, f"comm[rank {rank}].step_time_s": other})

    def described(self) -> tuple[dict[int, Mapping[str, Any]], float | None] | None:
        """The comm rows and the peak of the steps the diagnosis describes: the whole session's, or
        after an apply the regime's (``diagnosis.steps`` names it); None when no section shows them."""
        diagnosis, regimes = self.report.get("diagnosis") or {}, self.report.get("regimes") or []
        steps = diagnosis.get("steps") or {}
        peak = _num((self.report.get("memory") or {}).get("peak_bytes"))
        if not regimes:
            return self.comm_rows(), peak
        for regime in regimes:
            if (regime.get("first_step"), regime.get("last_step")) == (steps.get("first"), steps.get("last")):
                rows = {int(r["rank"]): r for r in regime.get("comm") or [] if "rank" in r}
                return rows, _num(regime.get("peak_bytes"))
        indices = [s.get("index") for s in self.steps_by_rank.get(self.first_rank() or 0, [])]
        if indices and (steps.get("first"), steps.get("last")) == (min(indices), max(indices)):
            return self.comm_rows(), peak
        return None

    def diagnosis(self) -> None:
        diagnosis = self.report.get("diagnosis") or {}
        evidence = {str(e.get("what")): e for e in diagnosis.get("evidence") or [] if isinstance(e, Mapping)}
        described = self.described()
        if described is None:
            return
        rows, peak = described
        if rows:
            low = rows[min(rows)]
            for what, key, tol in (("exposed collective time / step time", "exposed_share", SHARE_ABS_TOL),
                                   ("exposed collective time per step", "exposed_s", SECONDS_ABS_TOL),
                                   ("collective time per step", "comm_s", SECONDS_ABS_TOL),
                                   ("step time (median of ordinary steps)", "step_time_s", SECONDS_ABS_TOL)):
                item, shown = evidence.get(what), _num(low.get(key))
                value = _num(item.get("value")) if item else None
                if value is not None and shown is not None and not _close(value, shown, abs_tol=tol):
                    self.breach("diagnosis.evidence", f"the diagnosis's '{what}' must be the figure the comm "
                                "section shows", **{f"evidence '{what}'": value,
                                                    f"comm[rank {min(rows)}].{key}": shown})
        self.data_wait(evidence)
        self.op_evidence(evidence)
        item = evidence.get("peak memory")
        value = _num(item.get("value")) if item else None
        if value is not None and peak is not None and not _close(value, peak, abs_tol=BYTES_ABS_TOL):
            self.breach("diagnosis.evidence", "the diagnosis's 'peak memory' must be the peak the memory "
                        "section shows", **{"evidence 'peak memory'": value, "memory.peak_bytes": peak})

    def data_wait(self, evidence: Mapping[str, Mapping[str, Any]]) -> None:
        """The input rule's 'data wait / step time' and the optimizer-step rule's 'optimizer step /
        step time' are the median phase over the median step of the lowest rank's ordinary steps in
        the steps the diagnosis describes (their summaries say so), where those steps are timed on
        the host (no device time)."""
        rank = self.first_rank()
        if rank is None or not self.complete:
            return
        steps = (self.report.get("diagnosis") or {}).get("steps") or {}
        ordinary = [s for s in self.light_steps(rank, first=steps.get("first"), last=steps.get("last"))
                    if s.get("index", 0) > 0 and not s.get("deep")]
        if not ordinary or any(s.get("device_time_s") is not None for s in ordinary):
            return
        times = [t for s in ordinary if (t := _num(s.get("time_s"))) is not None]
        for what, phase in (("data wait / step time", "data_s"), ("optimizer step / step time", "optimizer_s")):
            item = evidence.get(what)
            value = _num(item.get("value")) if item else None
            spent = [w for s in ordinary if (w := _num((s.get("phases") or {}).get(phase))) is not None]
            if value is None or not spent or not times:
                continue
            shown = statistics.median(spent) / statistics.median(times)
            if not _close(value, round(shown, 4), abs_tol=1e-4):
                self.breach("diagnosis.evidence", f"the diagnosis's '{what}' must be the median {phase[:-2]} phase "
                            "over the median ordinary step", **{f"evidence '{what}'": value,
                                                                "from the steps": round(shown, 4)})

    def op_evidence(self, evidence: Mapping[str, Mapping[str, Any]]) -> None:
        """Where the diagnosis describes the whole session, the host-overhead rule's 'op time per deep
        step' is the compute section's ``profiled_op_time_s``, and the compute rule's 'fp32
        matmul/conv time per step' the fp32 matmul rows of ``ops`` as profiled (both are the ops'
        own times per profiled step, of the compute section's rank)."""
        if self.report.get("regimes"):
            return
        compute = self.report.get("compute") or {}
        item = evidence.get("op time per deep step")
        value, shown = (_num(item.get("value")) if item else None), _num(compute.get("profiled_op_time_s"))
        if value is not None and shown is not None and not _close(value, shown, abs_tol=SECONDS_ABS_TOL):
            self.breach("diagnosis.evidence", "the diagnosis's 'op time per deep step' must be the compute "
                        "section's profiled op time", **{"evidence 'op time per deep step'": value,
                                                         "compute.profiled_op_time_s": shown})
        item = evidence.get("fp32 matmul/conv time per step")
        value = _num(item.get("value")) if item else None
        rows = [r for r in self.report.get("ops") or [] if isinstance(r, Mapping)]
        if value is None or not rows:
            return
        matmul = sum(t for r in rows if r.get("name") in MATMUL_OPS and r.get("dtype") in FP32_DTYPES
                     and (t := _num(r.get("profiled_time_s"))) is not None)
        if not _close(value, matmul, abs_tol=SECONDS_ABS_TOL):
            self.breach("diagnosis.evidence", "the diagnosis's 'fp32 matmul/conv time per step' must be the fp32 "
                        "matmul rows of the ops section", **{"evidence 'fp32 matmul/conv time per step'": value,
                                                             "sum(ops[].profiled_time_s)": matmul})

    def applied(self) -> None:
        for i, entry in enumerate(self.report.get("applied") or []):
            measured = entry.get("measured") or {}
            before, after = measured.get("before") or {}, measured.get("after") or {}
            here = f"applied[{i}].measured"
            kinds = (before.get("step_kind"), after.get("step_kind"))
            if _num(before.get("step_time_s")) is not None and _num(after.get("step_time_s")) is not None \
                    and kinds[0] != kinds[1]:
                self.breach(f"{here}.after.step_kind", "before and after must be timed on the same kind of step",
                            **{f"{here}.before.step_kind": kinds[0], f"{here}.after.step_kind": kinds[1]})
            rank = int(entry.get("rank") or 0)
            for side, m in (("before", before), ("after", after)):
                self.window(f"{here}.{side}", m, rank)

    def window(self, path: str, m: Mapping[str, Any], rank: int) -> None:
        """An apply's window: ``step_time_s`` is the mean of ``time_steps`` (each of ``step_kind``),
        ``peak_memory_bytes`` the largest peak of ``peak_steps``, where the report lists them."""
        listed = {int(s.get("index", -1)): s for s in self.steps_by_rank.get(rank, [])}
        time_steps = [int(x) for x in m.get("time_steps") or []]
        samples = [listed.get(x) for x in time_steps]
        kind = m.get("step_kind")
        if time_steps and None not in samples and kind in ("light", "deep"):
            wrong = [x for x, s in zip(time_steps, samples) if bool(s.get("deep")) != (kind == "deep")]  # type: ignore[union-attr]
            if wrong:
                self.breach(f"{path}.time_steps", f"every timed step must be a {kind} step",
                            **{f"{path}.time_steps": time_steps, "other steps": wrong})
            value = _num(m.get("step_time_s"))
            host = [_num(s.get("time_s")) for s in samples]  # type: ignore[union-attr]
            device = [_num(s.get("device_time_s")) for s in samples]  # type: ignore[union-attr]
            means = [statistics.fmean(v) for v in (host, device) if v and None not in v]  # type: ignore[arg-type]
            if value is not None and means and not any(_close(value, x, abs_tol=1e-9) for x in means):
                self.breach(f"{path}.step_time_s", "an apply's step time is the mean of its timed steps",
                            **{f"{path}.step_time_s": value, "mean of time_steps": means[0]})

    def regimes(self) -> None:
        rank = self.first_rank()
        for i, regime in enumerate(self.report.get("regimes") or []):
            if rank is None or _num(regime.get("step_time_s")) is None:
                continue
            first, last = regime.get("first_step"), regime.get("last_step")
            mine = [s for s in self.light_steps(rank, first=first, last=last)
                    if s.get("index", 0) > 0 and not s.get("deep")]
            times = [float(s["time_s"]) for s in mine]
            got = float(regime["step_time_s"])
            if times and self.complete and not _close(got, statistics.median(times)):
                self.breach(f"regimes[{i}].step_time_s", "a regime's step time is the median of its ordinary steps",
                            **{f"regimes[{i}].step_time_s": got, "median of the steps": statistics.median(times)})

    def zero(self) -> None:
        applied = [a for a in self.report.get("applied") or [] if "params" in a and _sets_zero(a)]
        for i, entry in enumerate(self.report.get("zero") or []):
            if entry.get("source") != "applied":
                continue
            match = [a for a in applied if a.get("rank") == entry.get("rank")
                     and a.get("recommendation_id") == entry.get("recommendation_id") and a.get("status") == "kept"]
            if match and entry.get("measured") != (match[-1].get("measured") or {}).get("after"):
                self.breach(f"zero[{i}].measured", "the stage's measured figures must be its apply's",
                            **{f"zero[{i}].measured": entry.get("measured")})


def _sets_zero(applied: Mapping[str, Any]) -> bool:
    """Whether an ``applied`` entry put a ZeRO stage in force: the ``zero`` remedy, or a joint
    plan with a ``zero`` part (its ``params.parts``)."""
    if applied.get("remedy") == "zero":
        return True
    parts = (applied.get("params") or {}).get("parts") if applied.get("remedy") == "joint_plan" else None
    return isinstance(parts, list) and any(isinstance(p, Mapping) and p.get("remedy") == "zero" for p in parts)


def check_report(report: Mapping[str, Any]) -> list[Breach]:
    """The invariants ``report`` (an ``advisor.report/1`` document, or an ``advisor.diff/1`` one)
    breaks; empty when it is consistent."""
    if report.get("schema") == DIFF_SCHEMA:
        return check_diff(report)
    checks = _Checks(report)
    checks.shares(report, "")
    for area in (checks.steps, checks.summary, checks.memory, checks.compute, checks.comm, checks.diagnosis,
                 checks.applied, checks.regimes, checks.zero):
        area()
    return checks.out


def check_diff(diff: Mapping[str, Any]) -> list[Breach]:
    """An ``advisor diff`` document: on each side the phases add up to the mean step they split."""
    out: list[Breach] = []
    phases, mean = diff.get("phases") or {}, diff.get("mean_step_time") or {}
    for side in ("a", "b"):
        parts = [_num((phases.get(k) or {}).get(side)) for k in PHASES]
        step = _num(mean.get(side))
        if step is None or None in parts:
            continue
        total = sum(p for p in parts if p is not None)
        if total and not _close(total, step, abs_tol=1e-9):  # all 0: steps without phases
            out.append(Breach(field=f"phases.{side}", values={f"sum(phases.{side})": total, f"mean_step_time.{side}": step},
                              message="the phases must add up to the mean step they split"))
    return out


def load_report(path: str) -> dict[str, Any]:
    """The report at ``path``; ``ValueError`` when it cannot be read or is not a report."""
    try:
        with open(path, encoding="utf-8") as handle:
            report = json.load(handle)
    except OSError as exc:
        raise ValueError(f"cannot read {path}: {exc.strerror or exc}") from None
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path} is not JSON: {exc}") from None
    if not isinstance(report, dict) or report.get("schema") not in (REPORT_SCHEMA, DIFF_SCHEMA):
        raise ValueError(f"{path} is not an advisor report (no \"schema\": \"{REPORT_SCHEMA}\" or \"{DIFF_SCHEMA}\")")
    return report


def main(paths: Sequence[str], *, out: Callable[[str], None] = print) -> int:
    """``advisor check``: 0 when every report is consistent, 1 when one breaks an invariant (each
    breach on one line), 2 when one cannot be read."""
    worst = 0
    for path in paths:
        try:
            report = load_report(path)
        except ValueError as exc:
            print(f"advisor: error: {exc}", file=sys.stderr)
            print("hint: pass the JSON of `advisor report SESSION --json FILE` or `advisor attach --json FILE`",
                  file=sys.stderr)
            worst = 2
            continue
        breaches = check_report(report)
        for breach in breaches:
            out(f"{path}: {breach.line()}")
        if breaches:
            worst = max(worst, 1)
        else:
            out(f"{path}: consistent")
    return worst


def breach_lines(breaches: Iterable[Breach]) -> str:
    """The breaches one a line (for an assertion's message)."""
    return "\n".join(b.line() for b in breaches)
