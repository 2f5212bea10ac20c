"""The report's compute section: ops against the roofline, MFU, per-module figures.

Inputs are the session's ``OpStat`` records (rank 0, or the lowest rank present)
and the device spec dict the agent sent as ``Event(name="device_spec")``
(``advisor.probes.device.spec.DeviceSpec.to_dict()``). Op figures are per-step averages
over the deep-sampled steps that carry ``OpStat`` records (the timed steps).
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from typing import Any, Mapping

from advisor.blocks import Block, Column, Lines, Span, Table
from advisor.recommend.comm import rank_comm
from advisor.records.samples import ordinary_steps
from advisor.recommend.roofline import OpFigures, dtype_key, op_verdict, step_summary
from advisor.records.samples import OpStat
from advisor.records.units import MISSING, fmt_rate, fmt_seconds
from advisor.rich_text import to_rich
from advisor.sections.timebase import light_step_time, scale
from advisor.state import SessionState

SIGNIFICANT_DTYPE_SHARE = 0.01  # FLOPs of a dtype below this share do not decide whether MFU is known

DEVICE_FIELDS: tuple[str, ...] = (
    "peak_flops", "memory_bandwidth", "memory_capacity", "source", "part",
    "spec_peak_flops", "spec_memory_bandwidth", "measured_peak_flops", "measured_memory_bandwidth",
)


def device_spec_from_state(state: SessionState) -> dict[str, Any] | None:
    """The last ``device_spec`` event of the lowest rank, or None."""
    found = [e for e in state.events if e.name == "device_spec"]
    if not found:
        return None
    rank = min(e.rank for e in found)
    return dict([e for e in found if e.rank == rank][-1].data)


def device_fields(spec: Mapping[str, Any] | None) -> dict[str, Any]:
    """Additions to the report's ``run.device``: ceilings and where they came from."""
    spec = spec or {}
    return {name: spec.get(name) for name in DEVICE_FIELDS}


def _rank_ops(state: SessionState) -> list[OpStat]:
    if not state.ops:
        return []
    rank = min(op.rank for op in state.ops)
    return [op for op in state.ops if op.rank == rank]


def _ceilings(spec: Mapping[str, Any] | None) -> tuple[dict[str, float], float | None]:
    spec = spec or {}
    return dict(spec.get("peak_flops") or {}), spec.get("memory_bandwidth")


def _step_scales(state: SessionState, ops: list[OpStat]) -> tuple[dict[int, float], dict[int, float], float | None,
                                                                  float | None]:
    """Per timed step: the factor to an ordinary step and the profiled step's own time; and the
    ordinary step time. A profiled step's time is at least its ops' total, so that ops whose
    profiler times overlap still scale to no more than an ordinary step.

    The factor is light / profiled, and at most what leaves room in the ordinary step for its
    exposed communication (``RankComm`` of the ops' rank): the probes slow the computation, not
    the wait for the other ranks, and the plain ratio read 19.1 ms of ops beside 11.7 ms of
    exposed communication in a 22.7 ms step.

    Without a light step the base is the median of the steps after step 0 (all profiled), the
    statistic the comm section's step time and exposed time are: the profiled step itself left
    a 2.0 ms step of a 4-step 2-rank run beside a median exposed 3 ms of the others. Returns
    (scales, profiled step times, light step time, the base step time)."""
    light = light_step_time(state)
    rank = ops[0].rank if ops else 0
    samples = {s.index: s for s in state.steps.get(rank) or state.rank0_steps()}
    steady = [s.time_s for s in ordinary_steps(list(samples.values())) if s.time_s > 0]
    base = light or (statistics.median(steady) if steady else None)
    op_totals: dict[int, float] = defaultdict(float)
    for op in ops:
        op_totals[op.step] += op.time_s
    mine = [c for c in state.collectives if c.rank == rank]
    ordinary = rank_comm(mine, list(samples.values()), rank) if mine else None
    profiled: dict[int, float] = {}
    scales: dict[int, float] = {}
    inline = _inline_steps(ops)
    for step, total in op_totals.items():
        sample = samples.get(step)
        profiled[step] = max(sample.time_s if sample else 0.0, total)
        # Ops timed inside the counting mode are each op's own run: on an ordinary step's base
        # already, shrunk only to fit in it; profiled ones shrink with their step's slowdown.
        scales[step] = scale(base, total if step in inline else profiled[step])
        if ordinary is not None and total > 0:
            room = max((base or profiled[step]) - ordinary.exposed_s, 1e-9)
            scales[step] = min(scales[step], room / total)
    return scales, profiled, light, base


def _kernel_timed(spec: Mapping[str, Any] | None) -> bool:
    """CUDA op times are device kernel times: the profiler slows the host that launches them,
    not the kernels, so they are already on an ordinary step's base. Scaling them by the
    profiled step's slowdown (as CPU op times must be) read an H100 GPT's 17.6 ms of kernels
    as 1 ms of a 31 ms step and diagnosed launch overhead that was not there."""
    return bool(spec) and spec.get("type") == "cuda"  # type: ignore[union-attr]


def _inline_steps(ops: list[OpStat]) -> set[int]:
    """Steps whose op times were taken inside the counting mode (``OpStat.inline``): each op's
    own run, already on an ordinary step's base. Scaled by the counting step's slowdown (the
    mode's Python between ops), 423 ms of ops read as 49 ms of a 353 ms step."""
    return {op.step for op in ops if op.inline}


def _op_scales(scales: dict[int, float], spec: Mapping[str, Any] | None) -> dict[int, float]:
    return {step: 1.0 for step in scales} if _kernel_timed(spec) else scales


def build_ops_section(state: SessionState, spec: Mapping[str, Any] | None) -> list[dict[str, Any]]:
    """One item per op signature (name, module, phase, shapes, dtype), per-step averages over
    the deep steps, sorted by time descending. ``time_s`` is on an ordinary (light) step's base
    (docs/report-schema.md), ``profiled_time_s`` as measured on the profiled step; achieved
    FLOP/s and the share of roof use ``time_s``, like the step's MFU. Ops that move no bytes
    (views, aliases) are left out: their intensity is undefined and their time is negligible."""
    ops = _rank_ops(state)
    steps = sorted({op.step for op in ops})
    if not steps:
        return []
    scales = _op_scales(_step_scales(state, ops)[0], spec)
    peaks, bandwidth = _ceilings(spec)
    groups: dict[tuple, list[float]] = defaultdict(lambda: [0, 0, 0, 0.0, 0.0])
    for op in ops:
        if op.bytes <= 0:
            continue
        key = (op.name, op.module, op.phase, tuple(tuple(s) for s in op.input_shapes), op.dtype)
        g = groups[key]
        g[0] += op.count
        g[1] += op.flops
        g[2] += op.bytes
        g[3] += op.time_s * scales[op.step]
        g[4] += op.time_s
    n = len(steps)
    items = []
    for (name, module, phase, shapes, dtype), (count, flops, nbytes, time_s, profiled) in groups.items():
        flops, nbytes, time_s = flops / n, nbytes / n, time_s / n
        v = op_verdict(flops=flops, bytes=nbytes, time_s=time_s, dtype=dtype, peak_flops=peaks,
                       bandwidth=bandwidth)
        as_profiled = op_verdict(flops=flops, bytes=nbytes, time_s=profiled / n, dtype=dtype, peak_flops=peaks,
                                 bandwidth=bandwidth)
        items.append({
            "name": name, "module": module, "phase": phase, "input_shapes": [list(s) for s in shapes],
            "dtype": dtype, "count": count / n, "flops": flops, "bytes": nbytes,
            "intensity": v.intensity, "time_s": time_s, "profiled_time_s": profiled / n,
            "achieved_flops_per_s": v.achieved_flops_per_s, "bound": v.bound, "roof_fraction": v.roof_fraction,
            **above_roof(v.roof_fraction, as_profiled.roof_fraction, v.bound),
        })
    items.sort(key=lambda item: item["time_s"], reverse=True)
    return items


# Why an op reads above its roof (``above_roof_reason``): the roofline bounds what an op can
# reach from its FLOPs, the bytes the counter gives it and the device's measured ceilings, so a
# reading above it says one of those inputs is off for this op, never that the op beat physics.
ABOVE_ROOF_REASONS = {
    "time_scale": "within the roof as profiled: the factor to an ordinary step shrank this op more than it ran",
    "cache_reuse": "moved fewer DRAM bytes than counted (its operands stayed in cache)",
    "ceiling": "reached more FLOP/s than the measured ceiling (pass --peak-flops to correct it)",
}


def above_roof(fraction: float | None, profiled_fraction: float | None, bound: str | None) -> dict[str, Any]:
    """``above_roof`` (the op's share of its roof exceeds 1) and, when it does, the reason key
    (``ABOVE_ROOF_REASONS``); the share itself stays as computed."""
    if fraction is None or fraction <= 1.0:
        return {"above_roof": False if fraction is not None else None, "above_roof_reason": None}
    if profiled_fraction is not None and profiled_fraction <= 1.0:
        reason = "time_scale"
    else:
        reason = "ceiling" if bound == "compute" else "cache_reuse"
    return {"above_roof": True, "above_roof_reason": reason}


def fmt_roof(op: Mapping[str, Any], none: str = "-") -> str:
    """An op's share of its roof for a table cell: "NN%", with "*" when it reads above the roof
    (``roof_footnote`` says why)."""
    value = op.get("roof_fraction")
    if not isinstance(value, (int, float)):
        return none
    return f"{100 * value:.0f}%" + ("*" if op.get("above_roof") else "")


def roof_footnote(ops: list[Mapping[str, Any]]) -> str | None:
    """One line for the ops shown above their roof, or None when none is."""
    reasons = sorted({op.get("above_roof_reason") for op in ops if op.get("above_roof")} - {None})
    if not reasons:
        return None
    return "* above the roof, so not a measure of efficiency: " + "; ".join(
        ABOVE_ROOF_REASONS.get(r, r) for r in reasons)


def build_compute_section(state: SessionState, spec: Mapping[str, Any] | None) -> dict[str, Any]:
    """Step-level roofline figures, averaged over the timed deep steps, on one time base.

    Op times are normalised to an ordinary (light) step: each timed step's op times are scaled
    by ``time_scale`` = light step time / profiled step time (at most 1). ``mfu`` and
    ``achieved_flops_per_s`` divide the step's FLOPs by the light step time; ``op_time_s`` and
    ``step_time_s`` are on the light base (``step_time_s`` is the light step time, or the
    profiled step's own time when no light step exists), ``profiled_op_time_s`` and
    ``profiled_step_time_s`` as measured on the profiled steps (``StepSample.time_s``).
    ``memory_bound_share`` and ``unaccounted_share`` are fractions, the same on either base.
    """
    ops = _rank_ops(state)
    peaks, bandwidth = _ceilings(spec)
    steps = sorted({op.step for op in ops})
    empty: dict[str, Any] = {
        "mfu": None, "achieved_flops_per_s": None, "memory_bound_share": None, "unaccounted_share": None,
        "dominant_dtype": None, "flops_per_step": None, "op_time_s": None, "step_time_s": None,
        "light_step_time_s": None, "deep_steps": steps, "per_module": [],
        "time_base": None, "time_scale": None, "profiled_op_time_s": None, "profiled_step_time_s": None,
        "op_time_base": None, "rank": None,
    }
    if not steps:
        return empty
    scales, profiled, light, base = _step_scales(state, ops)
    inline = _inline_steps(ops)
    op_scales = _op_scales(scales, spec)
    summaries = []
    mfus: list[float | None] = []
    for step in steps:
        figures = [OpFigures(flops=o.flops, bytes=o.bytes, time_s=o.time_s * op_scales[step], dtype=o.dtype)
                   for o in ops if o.step == step]
        # On the light base the step is the ordinary step: profiled x k is that step when the
        # profiled one was slower, but a profiled step faster than the median ordinary one (a
        # noisy run) would have read "ops 66 ms of a 101 ms step" beside a 2.17 s median step.
        # Without a light step it is the median profiled step (``_step_scales``).
        summaries.append(step_summary(figures, step_time_s=base or profiled[step], peak_flops=peaks,
                                      bandwidth=bandwidth, mfu_step_time_s=light))
        mfus.append(mfu_by_dtype(figures, base or profiled[step], peaks))

    def mean(name: str) -> float | None:
        values = [getattr(s, name) for s in summaries if getattr(s, name) is not None]
        return sum(values) / len(values) if values else None

    def mean_of(values: list[float]) -> float:
        return sum(values) / len(values)

    out = dict(empty)
    known = [m for m in mfus if m is not None]
    out.update({
        "mfu": sum(known) / len(known) if known and len(known) == len(mfus) else None, "achieved_flops_per_s": mean("achieved_flops_per_s"),
        "memory_bound_share": mean("memory_bound_share"), "unaccounted_share": mean("unaccounted_share"),
        "dominant_dtype": summaries[-1].dominant_dtype, "flops_per_step": mean("flops"),
        "op_time_s": mean("op_time_s"), "step_time_s": mean("step_time_s"), "light_step_time_s": light,
        "per_module": _per_module(ops, len(steps), op_scales),
        "time_base": "light step" if light else "profiled step",
        "op_time_base": ("device kernels" if _kernel_timed(spec) else "timed inside the counting mode"
                         if inline >= set(steps) else "scaled by time_scale"),
        "rank": ops[0].rank,
        "time_scale": mean_of([scales[s] for s in steps]),
        "profiled_op_time_s": mean_of([sum(o.time_s for o in ops if o.step == s) for s in steps]),
        "profiled_step_time_s": mean_of([profiled[s] for s in steps]),
    })
    return out


def mfu_by_dtype(figures: list[OpFigures], time_s: float, peak_flops: Mapping[str, float]) -> float | None:
    """Model FLOPs utilisation with each dtype's FLOPs against that dtype's own peak:
    sum over dtypes of FLOPs / peak[dtype], over the step time (the share of the step the
    device would need at its peaks). None when the time is unknown or a dtype carrying at
    least ``SIGNIFICANT_DTYPE_SHARE`` of the FLOPs has no peak of its own: fp16 or fp64 work
    is never judged against the fp32 peak (issue 21, item 13)."""
    totals: dict[str, float] = defaultdict(float)
    for f in figures:
        if f.flops > 0:
            totals[dtype_key(f.dtype)] += f.flops
    everything = sum(totals.values())
    if time_s <= 0 or everything <= 0:
        return None
    needed = 0.0
    for key, flops in totals.items():
        peak = peak_flops.get(key)
        if not peak:
            if flops >= SIGNIFICANT_DTYPE_SHARE * everything:
                return None
            continue
        needed += flops / float(peak)
    return needed / time_s


def _per_module(ops: list[OpStat], n_steps: int, scales: Mapping[int, float]) -> list[dict[str, Any]]:
    """Per innermost module: per-step FLOPs, bytes, op time (light base, and as profiled),
    achieved FLOP/s on the light base, share of op time."""
    groups: dict[str, list[float]] = defaultdict(lambda: [0, 0, 0.0, 0.0])
    for op in ops:
        g = groups[op.module]
        g[0] += op.flops
        g[1] += op.bytes
        g[2] += op.time_s * scales.get(op.step, 1.0)
        g[3] += op.time_s
    total = sum(g[2] for g in groups.values())
    rows = [{
        "module": module, "flops": flops / n_steps, "bytes": nbytes / n_steps, "time_s": t / n_steps,
        "profiled_time_s": p / n_steps,
        "achieved_flops_per_s": flops / t if t > 0 else None,
        "time_share": t / total if total > 0 else None,
    } for module, (flops, nbytes, t, p) in groups.items()]
    rows.sort(key=lambda r: r["time_s"], reverse=True)
    return rows


def _si(value: float | None, unit: str) -> str:
    """FLOP/s and the like in decimal prefixes, three significant figures (``fmt_rate``)."""
    return fmt_rate(value, unit)


def time_base_note(compute: Mapping[str, Any]) -> str:
    """How the op and module times are normalised, in one line (report and TUI)."""
    k = compute.get("time_scale")
    if compute.get("op_time_base") == "device kernels":
        return ("kernel times as measured on the device (profiling slows the host, not the kernels), "
                f"against an ordinary step of {fmt_seconds(compute.get('step_time_s'))}")
    if compute.get("op_time_base") == "timed inside the counting mode":
        return ("each op timed inside the counting mode on the counted step (too many ops for a profiled "
                f"step of their own), against an ordinary step of {fmt_seconds(compute.get('step_time_s'))}")
    step, profiled = compute.get("step_time_s"), compute.get("profiled_step_time_s")
    if compute.get("time_base") == "light step" and k and step and profiled:
        # The ratio of the two figures printed here (mean profiled step over the ordinary step),
        # not ``time_scale`` (a mean of per-step ratios): "1.4x slower: ops 239 ms of 247 ms"
        # beside an 82.6 ms step read as a contradiction.
        ratio = profiled / step
        pace = f"{ratio:.1f}x slower" if ratio >= 1.05 else ("as fast" if ratio > 0.95 else f"{1 / ratio:.1f}x faster")
        return (f"times per ordinary step of {fmt_seconds(step)} (profiled steps ran {pace}: "
                f"ops {fmt_seconds(compute.get('profiled_op_time_s'))} of {fmt_seconds(profiled)} there)")
    return (f"times on profiled steps, against their median of {fmt_seconds(step)} "
            "(no ordinary step to normalise to)")


def _pct(value: float | None) -> str:
    return MISSING if value is None else f"{100 * value:.0f}%"


def compute_blocks(ops: list[dict[str, Any]], compute: Mapping[str, Any], *, top: int = 10) -> list[Block]:
    """A summary line and the top ops by time with their verdicts (``advisor.blocks``)."""
    summary = Lines(lines=(
        (f"MFU {_pct(compute.get('mfu'))} · achieved {_si(compute.get('achieved_flops_per_s'), 'FLOP/s')} · "
         f"ops {fmt_seconds(compute.get('op_time_s'))} of a {fmt_seconds(compute.get('step_time_s'))} step · "
         f"memory-bound {_pct(compute.get('memory_bound_share'))} of step · "
         f"outside ops {_pct(compute.get('unaccounted_share'))}",),
        (time_base_note(compute),)))
    shown = ops[:top]
    if not shown:
        return [summary]
    rows = []
    for item in shown:
        bound = item.get("bound") or MISSING
        style = "yellow" if bound == "memory" else "green" if bound == "compute" else ""
        intensity = item.get("intensity")
        rows.append((item["name"], item.get("module") or "(root)", item.get("phase", ""), item.get("dtype") or "",
                     fmt_seconds(item.get("time_s")), _si(item.get("achieved_flops_per_s"), "FLOP/s"),
                     MISSING if intensity is None else f"{intensity:.1f}", Span(text=bound, style=style),
                     fmt_roof(item, MISSING)))
    # The profiled figure of every op is its time over the factor the note above shows; the JSON
    # keeps it per op (profiled_time_s). Without that column the table fits 120 columns.
    columns = (Column(name="op", fold_at=20), Column(name="module", fold_at=20), Column(name="phase", label=True),
               Column(name="dtype", label=True), Column(name="time", numeric=True), Column(name="FLOP/s", numeric=True),
               Column(name="FLOP/B", numeric=True), Column(name="bound", label=True), Column(name="of roof", numeric=True))
    return [summary, Table(title="Top ops by time (per ordinary step)", columns=columns, rows=tuple(rows),
                           caption=roof_footnote(shown))]


def render_compute_section(ops: list[dict[str, Any]], compute: Mapping[str, Any], *, top: int = 10) -> list[Any]:
    """Rich renderables of ``compute_blocks``."""
    return [to_rich(block) for block in compute_blocks(ops, compute, top=top)]
