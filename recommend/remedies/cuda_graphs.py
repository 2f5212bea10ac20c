"""CUDA graphs for a static-shape step, the predictor half (``rules/host_overhead.py``).

``restart``: capturing a graph changes the training loop (static input buffers, a warm-up on a
side stream), so no applier exists; the recommendation carries the exact change to make.
"""

from __future__ import annotations

from advisor.recommend.remedies import RemedySpec

SPEC = RemedySpec(name="cuda_graphs", apply_class="restart", phase="layout")

CHANGE = ('compile the model with torch.compile(model, mode="reduce-overhead") (CUDA graphs with '
          "static input buffers), or capture the step with torch.cuda.graphs.make_graphed_callables; "
          "inputs must keep one shape")
