"""Activation checkpointing of named submodules, applied in place and revertible (the applier
half of the remedy; the predictor is ``recommend/remedies/activation_checkpointing.py``).

How: each named module gets an *instance* ``forward`` attribute that runs the
module's previous forward under non-reentrant ``torch.utils.checkpoint``.
``nn.Module.__call__`` looks ``self.forward`` up on the instance first, so the
module tree is untouched. We chose this over swapping in
``torch.distributed.algorithms._checkpoint.checkpoint_wrapper.CheckpointWrapper``
because the wrapper adds a ``_checkpoint_wrapped_module`` child: its state-dict
hooks strip that prefix from ``state_dict()`` but ``named_parameters()``,
``named_modules()`` and the agent's module names still change, and the
script's own references (``model.blocks[0]``) would point at a different
object than the one in the tree. Patching forward keeps the same module and
Parameter objects, names and state-dict keys, so the script's optimizer and
any DDP wrapper keep working unchanged.

Hooks: the module's own forward pre-hooks, forward hooks and full backward
hooks run in ``__call__`` around our forward, once per call as before. Hooks
of modules *inside* a checkpointed module run again during recomputation in
backward, exactly as with torch's own ``checkpoint_wrapper``.

Non-reentrant checkpointing preserves the RNG state (dropout recomputes the
same mask) and recomputes bit-identical activations on deterministic kernels,
so the loss is unchanged; what changes is memory (activations inside the
module are not kept) and time (one more forward per module in backward).
"""

from __future__ import annotations

import difflib
import functools
import logging
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from advisor.apply.forward_patch import ForwardPatches, is_patched
from advisor.apply.target import Target, as_target, unwrap_model

logger = logging.getLogger("advisor.apply")

_MARK = "__advisor_checkpoint__"  # set on our forward wrapper, to recognise it again


def is_checkpointed(module: nn.Module) -> bool:
    """True when ``apply_activation_checkpointing`` currently wraps ``module``."""
    return is_patched(module, _MARK)


@dataclass(eq=False)
class CheckpointHandle:
    """What ``apply_activation_checkpointing`` changed; ``revert()`` undoes it exactly."""

    modules: tuple[str, ...]
    _patches: ForwardPatches = field(default_factory=lambda: ForwardPatches(_MARK, "checkpointing"), repr=False)
    reverted: bool = False

    def revert(self) -> None:
        """Restore each module's previous forward; safe to call twice."""
        if self.reverted:
            return
        self._patches.restore()
        self.reverted = True
        logger.info("Reverted activation checkpointing of %d modules: %s",
                    len(self.modules), ", ".join(self.modules))

    def describe(self) -> dict[str, Any]:
        return {"remedy": "activation_checkpointing", "modules": list(self.modules)}


def _checkpointed_forward(inner: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(inner)
    def forward(*args: Any, **kwargs: Any) -> Any:
        # Outside autograd (eval, no_grad) there is nothing to save: skip the
        # checkpoint machinery entirely.
        if not torch.is_grad_enabled():
            return inner(*args, **kwargs)
        return checkpoint(inner, *args, use_reentrant=False, **kwargs)

    return forward


def resolve_modules(model: nn.Module, modules: Sequence[str]) -> dict[str, nn.Module]:
    """Map qualified names to submodules of ``model``; ``ValueError`` on bad, duplicate or nested names."""
    if isinstance(modules, str):
        raise ValueError(f"modules must be a list of names, not the string {modules!r}")
    names = list(modules)
    if not names:
        raise ValueError("modules is empty: name at least one submodule to checkpoint")
    table = dict(model.named_modules())
    valid = [n for n in table if n]  # "" (the root) is not a valid target: nothing would be saved
    found: dict[str, nn.Module] = {}
    for name in names:
        if not isinstance(name, str) or name not in table or name == "":
            close = difflib.get_close_matches(str(name), valid, n=5, cutoff=0.5)
            hint = close or valid[:10]
            raise ValueError(
                f"no submodule {name!r} in {type(model).__name__}; "
                f"{'close' if close else 'valid'} names: {hint}"
                + ("" if close or len(valid) <= 10 else f" (and {len(valid) - 10} more)")
            )
        if name in found:
            raise ValueError(f"module {name!r} is named twice")
        found[name] = table[name]
    for a in found:
        for b in found:
            if a != b and b.startswith(a + "."):
                raise ValueError(f"modules overlap: {b!r} is inside {a!r}; name only one of them")
    return found


PHASE = "saved-tensors"  # advisor.records.remedy.PHASES


def apply_activation_checkpointing(target: Target | nn.Module, *, modules: Sequence[str]) -> CheckpointHandle:
    """Checkpoint exactly the named submodules (non-reentrant), in place.

    The model is the target's model that has every named module (a bare model is accepted);
    it may be wrapped (DDP, DataParallel, ``torch.compile``); names are relative to the unwrapped
    module. Either every module is wrapped and a
    handle is returned, or ``ValueError`` is raised and nothing changed.
    Applying to a module that is already checkpointed (or inside / around one)
    is a ``ValueError``: stacking two checkpoints would recompute twice.
    """
    if isinstance(modules, str):
        raise ValueError(f"modules must be a list of names, not the string {modules!r}")
    root = unwrap_model(as_target(target).model_for(list(modules)))
    found = resolve_modules(root, modules)
    for name, module in found.items():
        if is_checkpointed(module):
            raise ValueError(f"module {name!r} is already checkpointed; revert its handle first")
        for sub_name, sub in module.named_modules():
            if sub is not module and is_checkpointed(sub):
                raise ValueError(f"module {name!r} contains checkpointed {name}.{sub_name}")
    for other_name, other in root.named_modules():
        if is_checkpointed(other) and any(n.startswith(other_name + ".") for n in found):
            raise ValueError(f"module {other_name!r} is already checkpointed and contains "
                             f"{[n for n in found if n.startswith(other_name + '.')]}")
    handle = CheckpointHandle(modules=tuple(found))
    try:
        for name, module in found.items():
            handle._patches.patch(name, module, _checkpointed_forward(module.forward))
    except BaseException:
        handle.revert()  # leave nothing half-applied
        raise
    logger.info("Applied activation checkpointing (non-reentrant) to %d modules: %s",
                len(found), ", ".join(found))
    return handle
