"""Whether a job runs compiled code (``torch.compile``), read without importing dynamo.

The deep probes' dispatch modes run compiled code outside its graph (``advisor/agent/deep.py``),
and compiling blocks of a model that is compiled already changes nothing
(``apply/remedies/compile_blocks.py``): both ask here.
"""

from __future__ import annotations

import sys
from typing import Iterable

import torch


def compiled_model(models: Iterable[torch.nn.Module]) -> bool:
    """Whether any of ``models`` (as the script holds them, wrappers included) is compiled: an
    ``OptimizedModule`` anywhere down its wrappers, or a submodule compiled in place
    (``module.compile()`` sets ``_compiled_call_impl``). Without torch._dynamo imported none is."""
    if "torch._dynamo" not in sys.modules:
        return False
    from torch._dynamo.eval_frame import OptimizedModule

    for model in models:
        held: object = model
        while isinstance(held, torch.nn.Module):  # DDP(compiled), compiled(DDP), ...
            if isinstance(held, OptimizedModule):
                return True
            inner = getattr(held, "_orig_mod", None)  # never truth-test a module: __len__ is forwarded
            held = inner if inner is not None else getattr(held, "module", None)
        if any(getattr(sub, "_compiled_call_impl", None) is not None for sub in model.modules()):
            return True
    return False


def dynamo_graphs() -> int:
    """How many graphs dynamo has made in this process (its own counter); 0 without torch._dynamo."""
    if "torch._dynamo" not in sys.modules:
        return 0
    from torch._dynamo.utils import counters

    return int(counters["stats"]["unique_graphs"])
