"""Fused optimizer kernels, the applier half: switch the script's optimizer to ``fused=True``.

In place, on the very object the script steps: every param group gets ``fused=True`` and
``foreach=False`` through a state-dict round trip, so ``load_state_dict`` casts each ``step``
counter to the fused kernels' dtype and device (``Adam.__setstate__`` rules), and the moments
are kept. ``revert()`` does the round trip back to the groups' previous flags. Numerics: the
fused kernels reassociate the update (PYTORCH-NOTES: parameters drift by about 7e-9), hence
apply class ``live-equivalent``. The predictor is ``recommend/remedies/fused_optimizer.py``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any, Sequence

import torch

from advisor.apply.target import Target, as_target

logger = logging.getLogger("advisor.apply")

PHASE = "optimizer"  # advisor.records.remedy.PHASES
_FALLBACK_DEVICES = ("cpu", "cuda")


def _fused_devices() -> tuple[str, ...]:
    try:  # where torch has fused optimizer kernels (a private helper; the public fallback is a guess)
        from torch.utils._foreach_utils import _get_fused_kernels_supported_devices

        return tuple(_get_fused_kernels_supported_devices())
    except Exception:  # pragma: no cover - older or newer torch
        return _FALLBACK_DEVICES


def supports_fused(opt: torch.optim.Optimizer) -> str | None:
    """None when ``opt`` can switch to fused kernels, else why not (one sentence)."""
    if "fused" not in opt.defaults:
        return f"{type(opt).__name__} has no fused implementation"
    devices = _fused_devices()
    for group in opt.param_groups:
        if group.get("differentiable"):
            return "fused kernels do not support differentiable=True"
        for p in group["params"]:
            if not torch.is_floating_point(p) or p.device.type not in devices:
                return f"fused kernels need floating-point parameters on {', '.join(devices)}"
    return None


@dataclass(eq=False)
class FusedHandle:
    """The optimizers switched and their groups' previous flags; ``revert()`` restores them."""

    # (optimizer, its groups' previous flags, previous _step_supports_amp_scaling, where each
    # parameter's "step" counter lived: load_state_dict moves it to the device for fused kernels
    # and leaves it there for foreach ones, so revert moves it back)
    switched: list[tuple[torch.optim.Optimizer, list[dict[str, Any]], bool, dict[torch.Tensor, Any]]] = \
        field(default_factory=list)
    reverted: bool = False

    def revert(self) -> None:
        if self.reverted:
            return
        for opt, flags, amp, places in reversed(self.switched):
            _set_flags(opt, flags, amp)
            for param, (device, dtype) in places.items():
                step = opt.state.get(param, {}).get("step")
                if torch.is_tensor(step):
                    opt.state[param]["step"] = step.to(device=device, dtype=dtype)
        self.reverted = True
        logger.info("Reverted %d optimizer(s) to their previous kernels", len(self.switched))


def _set_flags(opt: torch.optim.Optimizer, flags: list[dict[str, Any]], amp_scaling: bool) -> None:
    state = opt.state_dict()
    for group, new in zip(state["param_groups"], flags):
        group.update(new)
    opt.load_state_dict(state)  # casts each "step" for the kernels now named in the groups
    # Set by the constructor for fused optimizers; GradScaler reads it to pass the scale in.
    opt._step_supports_amp_scaling = amp_scaling  # type: ignore[attr-defined]


def apply_fused_optimizer(target: Target | torch.nn.Module, *, optimizers: Sequence[int] | None = None
                          ) -> FusedHandle:
    """Switch the target's optimizers (all, or those at the given ``optimizers`` indexes) to fused.

    ``ValueError`` and nothing changed when one cannot switch or none is left to switch.
    """
    found = as_target(target).optimizers
    chosen = found if optimizers is None else [found[i] for i in _indexes(optimizers, len(found))]
    todo = [o for o in chosen if not all(g.get("fused") for g in o.param_groups)]
    if not todo:
        raise ValueError("no optimizer to switch: none captured, or all are fused already")
    for opt in todo:
        why = supports_fused(opt)
        if why:
            raise ValueError(why)
    handle = FusedHandle()
    try:
        for opt in todo:
            previous = [{"fused": g.get("fused"), "foreach": g.get("foreach")} for g in opt.param_groups]
            amp = bool(getattr(opt, "_step_supports_amp_scaling", False))
            places = {p: (st["step"].device, st["step"].dtype) for p, st in opt.state.items()
                      if torch.is_tensor(st.get("step"))}
            _set_flags(opt, [{"fused": True, "foreach": False}] * len(opt.param_groups), True)
            handle.switched.append((opt, previous, amp, places))
    except BaseException:
        handle.revert()  # atomic: leave no optimizer half switched
        raise
    logger.info("Switched %d optimizer(s) to fused kernels: %s", len(todo),
                ", ".join(type(o).__name__ for o in todo))
    return handle


def _indexes(value: Sequence[int], count: int) -> list[int]:
    if isinstance(value, (str, bytes)) or not all(isinstance(i, int) and 0 <= i < count for i in value):
        raise ValueError(f"optimizers must be a list of indexes in 0..{count - 1}, got {value!r}")
    return list(value)


def check_fused_optimizer(target: Target) -> dict[str, str]:
    """Refused when no captured optimizer can switch (LBFGS has no fused kernels, say)."""
    optimizers = target.optimizers
    if not optimizers:
        return {"": "no optimizer captured"}
    reasons = [supports_fused(o) for o in optimizers if not all(g.get("fused") for g in o.param_groups)]
    if not reasons:
        return {"": "every optimizer is fused already"}
    if all(reasons):
        return {"": str(reasons[0])}
    return {}
