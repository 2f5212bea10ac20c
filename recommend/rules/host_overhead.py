"""Host-overhead rule: the device idles between kernels (CUDA), or on CPU the ops cover a small
share of the step; it proposes ``torch.compile`` of the repeated blocks and, on CUDA, CUDA graphs.

Evidence: op (kernel) time (``Profile.ops``) against the time of the very steps it was measured
on, less their data wait (``Profile.step_times``): ops are timed on deep steps, which the probes
slow down several times over, so they are compared with deep steps, never with light ones. The
rest is the host gap (Python, dispatch, launches). The rule fires when the ops cover less than
``OP_COVERAGE`` of that time; the gap of an ordinary step is its time less data wait times
``1 - coverage``.

Prediction: compile removes ``GAP_RECOVERED`` of the gap (an assumption, labelled as such, low
confidence); the executor measures the first compiled steps after the warm-up and keeps or
reverts on what it measured, which calibrates it.
"""

from __future__ import annotations

from collections import Counter

from advisor.recommend.finding import Finding
from advisor.recommend.profile import Profile
from advisor.recommend.remedies import compile_blocks, cuda_graphs
from advisor.recommend.rules._figures import ms, op_time_per_step
from advisor.records.advice import Prediction, Recommendation

OP_COVERAGE = 0.5  # op time below this share of the (non-data) step: the host dominates
GAP_RECOVERED = 0.5  # assumed share of the host gap compile removes (measured by the apply)
GRAPH_RECOVERED = 0.9  # assumed share of the gap CUDA graphs remove (one launch per step)


def repeated_blocks(profile: Profile) -> list[str]:
    """The shallowest module type that occurs twice or more (transformer layers, res blocks);
    ``[""]`` (the whole model) when nothing repeats."""
    counts = Counter((m.depth, m.type) for m in profile.modules if m.name and m.type)
    repeated = [(depth, -n, t) for (depth, t), n in counts.items() if n >= 2 and _has_children(profile, t)]
    if not repeated:
        return [""]
    depth, _, kind = min(repeated)
    return sorted((m.name for m in profile.modules if m.depth == depth and m.type == kind),
                  key=lambda n: [int(p) if p.isdigit() else p for p in n.split(".")])


def _has_children(profile: Profile, kind: str) -> bool:
    """A block is a module with submodules (two Linear layers are not worth compiling alone)."""
    return any(profile.children(m.name) for m in profile.modules if m.type == kind)


def host_overhead_rule(profile: Profile) -> Finding | None:
    step = profile.step_time_s
    if not step or not profile.ops:
        return None
    busy = step - (profile.phases.get("data_s") or 0.0)
    measured = sorted({o.step for o in profile.ops} & set(profile.step_times))
    deep_busy = sum(profile.step_times[i][0] - profile.step_times[i][1] for i in measured) / max(1, len(measured))
    op_time = op_time_per_step(profile.ops)
    cuda = profile.device.get("type") == "cuda"
    # CUDA op times are kernel times, which the profiler does not slow: compare them with an
    # ordinary step. CPU op times are slowed with their deep step: compare like with like.
    base = busy if cuda else deep_busy
    if busy <= 0 or base <= 0 or op_time <= 0 or op_time >= OP_COVERAGE * base:
        return None
    coverage = op_time / base
    gap = busy * (1.0 - coverage)
    where = "the device idles between kernels" if cuda else "the ops cover a small share of the step"
    evidence = [
        {"what": "op time / step time less data wait (" + ("ordinary steps" if cuda else "deep steps") + ")",
         "value": round(coverage, 4),
         "threshold": OP_COVERAGE},
        {"what": "host gap per step", "value": round(gap, 6), "unit": "s"},
        {"what": "op time per deep step", "value": round(op_time, 6), "unit": "s"},
    ]
    lines = [f"ops {ms(op_time)} of a {ms(base)} {'ordinary' if cuda else 'deep'} step less data wait ({coverage:.0%})",
             f"host gap {ms(gap)} of a {ms(busy)} step"]
    blocks = repeated_blocks(profile)
    recs = [Recommendation(
        id="compile-blocks", remedy=compile_blocks.SPEC.name,
        title=f"torch.compile the repeated blocks: {where} ({coverage:.0%} op time)",
        params={"modules": blocks},
        predicted=Prediction(peak_memory_bytes=None, step_time_s=step - GAP_RECOVERED * gap),
        baseline=Prediction(peak_memory_bytes=None, step_time_s=step),
        cost_model=f"step - {GAP_RECOVERED:g} x host gap (assumed; the apply measures the compiled steps "
                   "after the compile warm-up)",
        confidence="low", exact=False, live=True, apply_class=compile_blocks.SPEC.apply_class,
        prerequisites=["a working torch.compile toolchain (a C++ compiler on CPU, Triton on CUDA)",
                       "the first compiled steps are slow while it compiles"],
        evidence=lines + [f"blocks: {', '.join(b or '(model)' for b in blocks[:4])}"
                          + (f" and {len(blocks) - 4} more" if len(blocks) > 4 else "")],
        fits=True,
    )]
    if cuda:
        recs.append(Recommendation(
            id="cuda-graphs", remedy=cuda_graphs.SPEC.name,
            title="CUDA graphs for the step (static shapes): one launch instead of many",
            params={},
            predicted=Prediction(peak_memory_bytes=None, step_time_s=step - GRAPH_RECOVERED * gap),
            baseline=Prediction(peak_memory_bytes=None, step_time_s=step),
            cost_model=f"step - {GRAPH_RECOVERED:g} x host gap (assumed)",
            confidence="low", exact=False, live=False, apply_class=cuda_graphs.SPEC.apply_class,
            prerequisites=["inputs of one static shape", f"change: {cuda_graphs.CHANGE}"],
            evidence=lines, fits=True,
        ))
    return Finding(bottleneck="launch_overhead", summary=f"host overhead: {where} ({coverage:.0%} op time)",
                   severity=gap / step, evidence=evidence, recommendations=recs)


RULE = host_overhead_rule
