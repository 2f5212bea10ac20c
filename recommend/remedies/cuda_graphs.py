"""CUDA graphs for a static-shape step, the predictor half (for ``rules/host_overhead.py``'s finding).

``restart``: capturing a graph changes the training loop (static input buffers, a warm-up on a
side stream), so no applier exists; the recommendation carries the exact change to make.
Prediction: graphs remove ``GRAPH_RECOVERED`` of the host gap (one launch per step; assumed).
"""

from __future__ import annotations

from advisor.recommend.finding import Finding, Proposal
from advisor.recommend.profile import Profile
from advisor.recommend.remedies import RemedySpec
from advisor.recommend.rules.host_overhead import host_gap
from advisor.records.advice import Prediction, Recommendation

GRAPH_RECOVERED = 0.9  # assumed share of the gap CUDA graphs remove (one launch per step)
CHANGE = ('compile the model with torch.compile(model, mode="reduce-overhead") (CUDA graphs with '
          "static input buffers), or capture the step with torch.cuda.graphs.make_graphed_callables; "
          "inputs must keep one shape")


def propose(profile: Profile, finding: Finding) -> Proposal:
    gap = host_gap(profile)
    if gap is None or not gap.cuda:
        return Proposal()
    return Proposal(recommendations=(Recommendation(
        id="cuda-graphs", remedy=SPEC.name,
        title="CUDA graphs for the step (static shapes): one launch instead of many",
        params={},
        predicted=Prediction(peak_memory_bytes=None, step_time_s=gap.step_s - GRAPH_RECOVERED * gap.gap_s),
        baseline=Prediction(peak_memory_bytes=None, step_time_s=gap.step_s),
        budget_bytes=profile.budget_bytes,
        cost_model=f"step - {GRAPH_RECOVERED:g} x host gap (assumed)",
        confidence="low", exact=False, live=False, apply_class=SPEC.apply_class,
        prerequisites=["inputs of one static shape", f"change: {CHANGE}"],
        evidence=gap.lines(),
    ),))


SPEC = RemedySpec(name="cuda_graphs", apply_class="restart", phase="layout", addresses=("host_overhead",),
                  propose=propose, restart_change=CHANGE)
