"""Remedy name -> apply function: the plug-in point for every remedy the executor can enact.

An apply function has the torchtitan shape ``apply_<remedy>(model, *, ...)``:
it changes ``model`` in place, logs one line, and returns a handle whose
``revert()`` undoes it exactly. It must be atomic: either it returns a handle,
or it raises with the model unchanged (the executor still reverts a handle
when something fails after the function returned).

Later remedies (cpu offload, ZeRO stage, pipeline, mixed precision,
micro-batching) register here under the names the recommender uses.
"""

from __future__ import annotations

import inspect
import os
from typing import Any, Callable, Mapping, Protocol

from torch import nn

from advisor.apply.activation_checkpoint import apply_activation_checkpointing


class RemedyHandle(Protocol):
    """What an apply function returns."""

    def revert(self) -> None:
        """Undo the remedy exactly; calling it twice does nothing the second time."""


ApplyFn = Callable[..., RemedyHandle]

_REMEDIES: dict[str, ApplyFn] = {
    "activation_checkpointing": apply_activation_checkpointing,
}

FAULTS_ENV = "ADVISOR_TEST_FAULTS"
FAULT_KEY = "_inject_failure"
FAULT_POINTS: tuple[str, ...] = ("apply",)


class InjectedFault(RuntimeError):
    """Raised at a fault-injection point (tests only; see ``FAULTS_ENV``)."""


def faults_enabled() -> bool:
    return os.environ.get(FAULTS_ENV) == "1"


def remedy_names() -> list[str]:
    return sorted(_REMEDIES)


def register(name: str, fn: ApplyFn, *, replace: bool = False) -> None:
    """Add a remedy (or, with ``replace=True``, override one: tests inject failures this way)."""
    if name in _REMEDIES and not replace:
        raise ValueError(f"remedy {name!r} is already registered; pass replace=True to override")
    _REMEDIES[name] = fn


def unregister(name: str) -> None:
    _REMEDIES.pop(name, None)


def get(name: str) -> ApplyFn:
    try:
        return _REMEDIES[name]
    except KeyError:
        raise ValueError(f"unknown remedy {name!r}; valid: {remedy_names()}") from None


def split_params(params: Mapping[str, Any]) -> tuple[dict[str, Any], str | None]:
    """Separate the remedy's keywords from the test-only fault key.

    The fault key is honoured only when ``ADVISOR_TEST_FAULTS=1``: a
    recommendation from a real controller can never trigger it.
    """
    clean = {k: v for k, v in params.items() if k != FAULT_KEY}
    fault = params.get(FAULT_KEY) if faults_enabled() else None
    if fault is not None and fault not in FAULT_POINTS:
        raise ValueError(f"{FAULT_KEY}={fault!r}; valid: {list(FAULT_POINTS)}")
    return clean, fault


def check_params(name: str, params: Mapping[str, Any]) -> None:
    """``ValueError`` naming the accepted keywords when ``params`` does not fit the remedy."""
    fn = get(name)
    sig = inspect.signature(fn)
    accepted = [p.name for p in sig.parameters.values() if p.kind is inspect.Parameter.KEYWORD_ONLY]
    if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in sig.parameters.values()):
        return
    unknown = sorted(set(params) - set(accepted))
    missing = [p.name for p in sig.parameters.values()
               if p.kind is inspect.Parameter.KEYWORD_ONLY and p.default is inspect.Parameter.empty
               and p.name not in params]
    if unknown or missing:
        raise ValueError(
            f"remedy {name!r} takes keywords {accepted}"
            + (f"; unknown: {unknown}" if unknown else "")
            + (f"; missing: {missing}" if missing else "")
        )


def apply_remedy(model: nn.Module, name: str, params: Mapping[str, Any]) -> RemedyHandle:
    """Apply remedy ``name`` with ``params`` to ``model``; atomic (see the module docstring)."""
    clean, fault = split_params(params)
    check_params(name, clean)
    handle = get(name)(model, **clean)
    if fault == "apply":
        # Fail *after* the model changed, so the caller's rollback path is exercised too.
        try:
            raise InjectedFault(f"injected failure while applying {name} ({FAULTS_ENV}=1)")
        except InjectedFault:
            handle.revert()
            raise
    return handle
