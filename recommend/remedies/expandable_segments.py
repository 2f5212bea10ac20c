"""Expandable allocator segments, the predictor half (proposed by ``rules/fragmentation.py``).

``restart``: the CUDA caching allocator reads ``PYTORCH_CUDA_ALLOC_CONF`` when it starts, so the
setting goes into the plan's environment (``advisor.records.plan.Plan.env``), which
``advisor attach --plan`` puts into the training process's environment. Its applier
(``apply/remedies/expandable_segments.py``) changes nothing: it checks, in the training process,
that the allocator got the setting, so a plan run without it fails loudly instead of silently.
"""

from __future__ import annotations

from advisor.recommend.remedies import RemedySpec

ENV = {"PYTORCH_CUDA_ALLOC_CONF": "expandable_segments:True"}

SPEC = RemedySpec(name="expandable_segments", apply_class="restart", phase="saved-tensors")
