"""Kineto traces (``torch.profiler``'s Chrome JSON, one file per rank) -> the agent's records.

What each record is made of (trace times are microseconds; records use seconds and, for
``start``/``end_time``, wall clock = ``baseTimeNanoseconds`` + ``ts``):

- ``RunInfo`` per rank: rank and world size from ``distributedInfo`` (file order otherwise),
  the device from ``deviceProperties``.
- ``StepSample`` per ``ProfilerStep#N`` (index N): its duration, and phases from the trace's
  own annotations on the stepping thread: ``enumerate(DataLoader)#...`` (data), the span of
  ``autograd::engine::evaluate_function`` ops (backward), ``Optimizer.step#...`` (optimizer),
  forward from the first op after the data wait (or the first ``nn.Module:`` /
  ``*.forward`` annotation) to backward; the rest is other. Peak memory from ``[memory]`` events.
- ``OpStat`` per (step, aten op, shapes, dtype, phase): self time on the CPU (ops nested in it
  excluded) or, when GPU kernels were traced, the time of the kernels it launched; FLOPs and
  bytes from ``advisor.importers.formulas``, counted once at the outermost op that has a formula.
- ``CollectiveStat`` per call: the ``c10d::*`` op that issued it paired in order with what ran
  it (an NCCL kernel, else gloo's or NCCL's ``gloo:*``/``nccl:*`` annotation); bytes from the
  recorded shapes (nccl-tests conventions); exposed time = the part of its interval with no
  compute (other GPU kernels; on the CPU, the top-level ops of the non-communication threads).
"""

from __future__ import annotations

import bisect
from collections import Counter, defaultdict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterable

from advisor.importers.formulas import DTYPE_NAMES, FORMULA_OPS, op_cost
from advisor.importers.kineto_comm import collective_records, public_op  # noqa: F401 - re-exported
from advisor.importers.kineto_read import RankTrace, Span, read_trace, thaw
from advisor.importers.limits import MAX_NAME, MAX_RANKS, LimitError, bounded_int
from advisor.importers.result import ImportResult
from advisor.records.intervals import merge_intervals, overlap_s
from advisor.records.samples import ExitInfo, OpStat, RunInfo, StepSample

BACKWARD_PREFIX = "autograd::engine::evaluate_function"
# Per step, pass 2 looks at the trace's spans and backward ops: steps x those is its work, bounded
# so that a trace past it is refused at once rather than worked through for hours.
MAX_STEP_WORK = 300_000_000

def import_traces(paths: Iterable[Path]) -> ImportResult:
    """Read every trace file (one per rank) and build the records of one session."""
    traces = [read_trace(p) for p in paths]
    result = ImportResult()
    ranks: dict[int, Path] = {}
    world = _one_world_size(traces)
    for order, trace in enumerate(traces):
        rank = _dist(trace).get("rank")
        rank = rank if type(rank) is int else order
        if rank in ranks:
            raise ValueError(f"{trace.path} and {ranks[rank]} are both rank {rank}; import one run's traces together")
        if not 0 <= rank < world:
            raise ValueError(f"{trace.path} says rank {rank} of a world of {world}")
        ranks[rank] = trace.path
        _rank_records(trace, rank, world, result)
    _notes(traces, result)
    missing = world - len(ranks)
    if missing:  # a multi-node job's traces sit on every node: the report holds the ranks given
        first = [r for r in range(min(world, len(ranks) + 9)) if r not in ranks][:8]
        shown = ", ".join(map(str, first)) + (", ..." if missing > len(first) else "")
        result.notes.append(f"Kineto trace: {missing} of {world} ranks have no trace here (ranks {shown}): "
                            "copy every node's traces and import them together for the whole job")
    return result


def _one_world_size(traces: list[RankTrace]) -> int:
    """The world size the traces agree on (their count when none says); traces that disagree come
    from different jobs (or a restarted elastic job) and are refused, as `advisor report` refuses
    sessions of different jobs."""
    said: dict[int, Path] = {}
    for trace in traces:
        size = _dist(trace).get("world_size")
        if type(size) is int and size > MAX_RANKS:  # checked before anything is sized by it
            raise LimitError(f"{trace.path} says its job has a world of {size} ranks, more than the "
                             f"{MAX_RANKS} the importer holds")
        if type(size) is int and size > 0:
            said.setdefault(size, trace.path)
    if len(said) > 1:
        (a, pa), (b, pb) = sorted(said.items())[:2]
        raise ValueError(f"{pa} is from a world of {a} ranks and {pb} from one of {b}: traces of different jobs; "
                         "import one job's traces together")
    return max([len(traces), *said])


def _dist(trace: RankTrace) -> dict[str, Any]:
    info = trace.meta.get("distributedInfo")
    return info if isinstance(info, dict) else {}


def _device(trace: RankTrace) -> dict[str, Any]:
    props = trace.meta.get("deviceProperties")
    if isinstance(props, list) and props and isinstance(props[0], dict) and (trace.k_ts or trace.nccl_kernels):
        p = props[0]
        name = p.get("name")
        return {"type": "cuda", "name": name[:MAX_NAME] if isinstance(name, str) else None,
                "index": bounded_int(p.get("id"), high=1023), "memory_capacity": bounded_int(p.get("totalGlobalMem"))}
    return {"type": "cpu", "name": "cpu", "index": None, "memory_capacity": None}


def _check_work(trace: RankTrace, steps: int, backward_ops: int) -> None:
    spans = (len(trace.data) + len(trace.optimizer) + len(trace.zero_grad) + len(trace.forward_marks)
             + len(trace.reducer) + len(trace.advisor) + len(trace.memory) + backward_ops)
    if steps * spans > MAX_STEP_WORK:
        raise LimitError(f"{trace.path} holds {steps} steps and {spans} spans to place in them, more than the "
                         "importer works through; profile fewer steps (torch.profiler.schedule) or split the trace")


# ------------------------------------------------------------------------------ per rank


@dataclass
class _Step:
    index: int
    start: float  # us
    end: float
    fwd: tuple[float, float] = (0.0, 0.0)
    opt: list[tuple[float, float]] = field(default_factory=list)


def _clip(spans: Iterable[Span], lo: float, hi: float) -> list[tuple[float, float]]:
    return merge_intervals((max(s.ts, lo), min(s.end, hi)) for s in spans if s.end > lo and s.ts < hi)


def _length(intervals: list[tuple[float, float]]) -> float:
    return sum(b - a for a, b in intervals)


def _rank_records(trace: RankTrace, rank: int, world: int, result: ImportResult) -> None:
    base = trace.base_s
    wall = lambda us: base + us / 1e6  # one clock conversion, used everywhere below
    host = trace.meta.get("host_name")
    result.records.append(RunInfo(
        script=str(trace.path), argv=[], rank=rank, local_rank=rank, world_size=world,
        hostname=host[:MAX_NAME] if isinstance(host, str) else "", started_at=wall(min(trace.op_ts, default=0.0)),
        device=_device(trace), config={"imported_from": "kineto", "files": [str(trace.path)]}))
    step_tids = Counter(span.tid for _, span in trace.steps)
    main_tid = step_tids.most_common(1)[0][0] if step_tids else None
    names = [sig[0] for sig in trace.signatures]
    is_bw = [n.startswith(BACKWARD_PREFIX) for n in names]
    bw_rows = [i for i in range(len(trace.op_ts)) if is_bw[trace.op_sig[i]]]
    _check_work(trace, len({index for index, _ in trace.steps}), len(bw_rows))
    is_reducer = ["reducer::" in n for n in names]
    trace.reducer.extend(Span(names[trace.op_sig[i]], trace.op_tid[i], trace.op_ts[i], trace.op_dur[i])
                         for i in range(len(trace.op_ts)) if is_reducer[trace.op_sig[i]])
    steps: list[_Step] = []
    seen: set[int] = set()
    for index, span in sorted(trace.steps, key=lambda item: item[1].ts):
        if index in seen:
            continue
        seen.add(index)
        steps.append(_Step(index=index, start=span.ts, end=span.end))
    main_rows = sorted((i for i in range(len(trace.op_ts)) if trace.op_tid[i] == main_tid),
                       key=lambda i: trace.op_ts[i])
    main_starts = [trace.op_ts[i] for i in main_rows]
    for step in steps:
        sample = _step_sample(trace, step, rank, bw_rows, main_rows, main_starts, main_tid, wall)
        result.records.append(sample)
    starts = [s.start for s in steps]
    result.records.extend(_op_stats(trace, rank, steps, starts, names, is_bw))
    result.records.extend(collective_records(
        trace, world, rank=rank, step_of=lambda ts: _step_of(starts, steps, ts, nearest=True), names=names, wall=wall))
    result.records.append(ExitInfo(rank=rank, code=0, reason=f"imported from Kineto trace {trace.path.name}",
                                   steps=len(steps)))
    result.summary.setdefault("ranks", []).append(
        {"rank": rank, "file": str(trace.path), "events": trace.events, "skipped_events": trace.skipped,
         "steps": len(steps), "ops": len(trace.op_ts), "collectives": len(trace.collectives) + len(trace.nccl_kernels)})


def _step_sample(trace: RankTrace, step: _Step, rank: int, bw_rows: list[int], main_rows: list[int],
                 main_starts: list[float], main_tid: int | None, wall: Any) -> StepSample:
    lo, hi = step.start, step.end
    on_main = lambda spans: [s for s in spans if s.tid == main_tid]
    data = _clip(on_main(trace.data), lo, hi)
    opt = _clip(on_main(trace.optimizer), lo, hi)
    step.opt = opt
    bw_spans = [(trace.op_ts[i], trace.op_ts[i] + trace.op_dur[i]) for i in bw_rows
                if trace.op_ts[i] < hi and trace.op_ts[i] + trace.op_dur[i] > lo]
    bw_start = max(lo, min((a for a, _ in bw_spans), default=hi))
    bw_end = min(hi, max((b for _, b in bw_spans), default=hi))
    # DDP waits for its last buckets after autograd's last op, then copies them into the
    # gradients: that is still inside loss.backward(), so backward ends after the reducer's work.
    opt_start = min([a for a, _ in opt if a >= bw_end] + [hi])
    bw_end = max([bw_end] + [min(s.end, hi) for s in on_main(trace.reducer) if bw_end <= s.ts < opt_start])
    backward = (bw_start, bw_end) if bw_spans else (hi, hi)
    # Forward: from the module's first forward annotation, else the first op on the stepping thread
    # after the data wait that precedes backward (and outside zero_grad, which can come first).
    limit = backward[0] if bw_spans else min([a for a, _ in opt] + [hi])
    marks = [s.ts for s in trace.forward_marks if lo <= s.ts < limit]
    waits = [b for a, b in data if b <= limit]
    after = max(waits) if waits else lo
    skip = _clip(on_main(trace.zero_grad), lo, hi) + data
    fwd_start = min(marks) if marks else None
    if fwd_start is None:
        k = bisect.bisect_left(main_starts, after)
        while k < len(main_starts) and main_starts[k] < limit:
            t = main_starts[k]
            if not any(a <= t < b for a, b in skip):
                fwd_start = t
                break
            k += 1
    forward = (fwd_start, limit) if fwd_start is not None and fwd_start < limit else (limit, limit)
    step.fwd = forward
    # The advisor agent's own step-boundary work, marked when the script profiled itself under
    # `advisor attach` (advisor::step_boundary, inside Optimizer.step): not the job's time, and
    # left out of the step as the agent's session leaves it out.
    own = _clip(on_main(trace.advisor), lo, hi)
    total = (hi - lo - _length(own)) / 1e6
    # Data: everything before the step's first forward (the agent's definition: the loop's own
    # work and zero_grad there count, not only the DataLoader's spans), and DataLoader waits later.
    data = merge_intervals(data + ([(lo, forward[0])] if forward[0] > lo else []))
    phases = {
        "data_s": _length(data) / 1e6,
        "forward_s": (forward[1] - forward[0] - overlap_s(forward, data)) / 1e6,
        "backward_s": (backward[1] - backward[0] - overlap_s(backward, opt)) / 1e6,
        "optimizer_s": (_length(opt) - sum(overlap_s(span, own) for span in opt)) / 1e6,
    }
    used = sum(phases.values())
    if used > total > 0:  # overlapping annotations: scale down so the phases add up to the step
        phases = {k: v * total / used for k, v in phases.items()}
        used = total
    phases["other_s"] = max(0.0, total - used)
    peaks = [a for t, a, _ in trace.memory if lo <= t <= hi]
    return StepSample(index=step.index, rank=rank, end_time=wall(hi), time_s=total, phases=phases,
                      peak_memory_bytes=max(peaks) if peaks else None)


def _step_of(starts: list[float], steps: list[_Step], ts: float, *, nearest: bool = False) -> _Step | None:
    """The step whose span holds ``ts``; with ``nearest``, else the next step (set-up before
    step 0 belongs to step 0, as the agent files it), else the last one."""
    k = bisect.bisect_right(starts, ts) - 1
    if k >= 0 and ts <= steps[k].end:
        return steps[k]
    if not nearest or not steps:
        return None
    return steps[k + 1] if k + 1 < len(steps) else steps[-1]


def _op_stats(trace: RankTrace, rank: int, steps: list[_Step], starts: list[float], names: list[str],
              is_bw: list[bool]) -> list[OpStat]:
    """Aggregate aten ops per (step, signature, phase), with self (or kernel) time.

    One pass per thread over its ops in start order, with a stack of the open ones: a child's
    duration is taken off its parent's self time, and FLOPs are counted at the outermost op
    that has a formula (``aten::linear``'s ``aten::addmm`` inside it counts none).
    """
    kernel_time: dict[int, float] = defaultdict(float)
    for ext, dur in zip(trace.k_ext, trace.k_dur):
        if ext >= 0:
            kernel_time[ext] += dur
    on_gpu = bool(trace.k_ts)
    costs: dict[int, tuple[int, int]] = {}
    groups: dict[tuple[int, int, str], list[float]] = {}

    def close(stack: list[list[Any]]) -> None:
        _end, row, child_us, formula, in_bw, formula_below, aten_below, under_formula = stack.pop()
        is_aten = names[trace.op_sig[row]].startswith("aten::")
        if stack:
            stack[-1][5] = stack[-1][5] or formula or formula_below
            stack[-1][6] = stack[-1][6] or is_aten or aten_below
        # FLOPs and bytes at the innermost op with a formula (aten::linear > aten::addmm counts
        # once, at addmm, where the time is spent); outside formula ops, bytes at the innermost
        # aten op, so a composite op and its parts do not both count.
        owns = formula and not formula_below
        moves = owns or (not formula and not under_formula and not aten_below)
        finish(row, trace.op_dur[row] - child_us, owns, moves, in_bw)

    def finish(row: int, self_us: float, owns: bool, leaf: bool, in_bw: bool) -> None:
        sig = trace.op_sig[row]
        name = names[sig]
        if not name.startswith("aten::"):
            return
        ts = trace.op_ts[row]
        step = _step_of(starts, steps, ts)
        if step is None:
            return
        if sig not in costs:
            _, dims, types, concrete = trace.signatures[sig]
            costs[sig] = op_cost(name[6:], thaw(dims) or [], list(types or ()), list(concrete or ()))
        flops, nbytes = costs[sig]
        time_us = kernel_time.get(trace.op_ext[row], 0.0) if on_gpu else max(0.0, self_us)
        phase = ("backward" if in_bw else "optimizer" if any(a <= ts < b for a, b in step.opt)
                 else "forward" if step.fwd[0] <= ts < step.fwd[1] else "other")
        g = groups.setdefault((step.index, sig, phase), [0, 0.0, 0, 0])
        g[0] += 1
        g[1] += time_us
        g[2] += flops if owns else 0
        g[3] += nbytes if leaf else 0

    by_tid: dict[int, list[int]] = defaultdict(list)
    for i, tid in enumerate(trace.op_tid):
        by_tid[tid].append(i)
    for rows in by_tid.values():
        rows.sort(key=lambda i: (trace.op_ts[i], -trace.op_dur[i]))
        # [end, row, child time, is a formula op, in backward, formula op below, aten op below,
        #  formula op above]
        stack: list[list[Any]] = []
        for i in rows:
            ts, dur = trace.op_ts[i], trace.op_dur[i]
            while stack and stack[-1][0] <= ts:
                close(stack)
            parent = stack[-1] if stack else None
            if parent is not None:
                parent[2] += min(dur, parent[0] - ts)
            name = names[trace.op_sig[i]]
            in_bw = bool(parent and parent[4]) or is_bw[trace.op_sig[i]]
            under_formula = bool(parent and (parent[3] or parent[7]))
            stack.append([ts + dur, i, 0.0, name.startswith("aten::") and name[6:] in FORMULA_OPS, in_bw,
                          False, False, under_formula])
        while stack:
            close(stack)
    out = []
    for (index, sig, phase), (count, time_us, flops, nbytes) in groups.items():
        name, dims, types, _ = trace.signatures[sig]
        if on_gpu and time_us == 0 and flops == 0:
            continue  # a CPU-side op that launched nothing
        shapes = [list(s) for s in (thaw(dims) or []) if isinstance(s, list) and all(isinstance(x, int) for x in s)]
        dtype = next((DTYPE_NAMES[t] for t in (types or ()) if t in DTYPE_NAMES), "")
        out.append(OpStat(rank=rank, step=index, name="aten." + name[6:], phase=phase, input_shapes=shapes,
                          dtype=dtype, count=int(count), flops=int(flops), bytes=int(nbytes),
                          time_s=time_us / 1e6))
    return out


def _notes(traces: list[RankTrace], result: ImportResult) -> None:
    notes = result.notes
    notes.append("Kineto trace: no per-module activation, parameter, gradient or optimizer-state bytes, so no "
                 "memory breakdown and no checkpointing or sharding plan (import a CUDA memory snapshot with it)")
    notes.append("Kineto trace: no loss values and no measured device ceilings (MFU and roofline verdicts need "
                 "`advisor attach`)")
    if not any(t.steps for t in traces):
        notes.append("Kineto trace: no ProfilerStep#N annotations (profile with a schedule and call prof.step() "
                     "each step), so no step times and no time advice")
    if not any(t.meta.get("record_shapes") for t in traces):
        notes.append("Kineto trace: shapes were not recorded (record_shapes=False), so no FLOPs, bytes or "
                     "collective sizes")
    if not any(t.memory for t in traces):
        notes.append("Kineto trace: no memory events (profile_memory=False), so no peak memory per step")
    skipped = sum(t.skipped for t in traces)
    if skipped:
        notes.append(f"Kineto trace: {skipped} event(s) with a missing or overflowed timestamp or duration "
                     "were skipped")
    result.summary["skipped_events"] = skipped
    result.summary["events"] = sum(t.events for t in traces)
