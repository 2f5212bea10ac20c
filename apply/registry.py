"""Remedy name -> applier: every ``apply_<name>`` found in ``advisor.apply.remedies``.

An applier has the torchtitan shape ``apply_<name>(target, *, ...)`` (``target``: an
``advisor.apply.target.Target``): it changes the job in place, logs one line, and returns a
handle whose ``revert()`` undoes it exactly. It must be atomic: either it returns a handle, or it
raises with the job unchanged (the executor still reverts a handle when something fails after
the function returned).

A remedy module may also define ``in_force_<name>(...)``, what it has in force on an object
(``in_force``), and ``check_<name>(target) -> Mapping[str, str]``: why the remedy
cannot apply to this job, keyed by the params it concerns ("" for any params, ``"stage=2"`` for
one value of one param); empty when it can. The agent asks every check before the remedies are
offered (``checks``) and the recommender marks what they refuse as not applicable.

Discovery walks the package (and its ``extend_path`` extensions) once, on first use; adding a
remedy edits nothing here. ``register`` adds one at run time (tests register faulty remedies).
"""

from __future__ import annotations

import importlib
import inspect
import logging
import pkgutil
from typing import Any, Callable, Mapping, Protocol

from advisor.apply import remedies as _package
from advisor.apply.target import Target
from advisor.records.remedy import PHASES

logger = logging.getLogger("advisor.apply")


class RemedyHandle(Protocol):
    """What an apply function returns."""

    def revert(self) -> None:
        """Undo the remedy exactly; calling it twice does nothing the second time."""

    # Optional: ``commit()``, called once every rank has agreed to keep the remedy (right after
    # the apply's vote); a handle may then release what only a revert at that boundary needed.
    # Optional: ``step_period`` (int), when the remedy makes step times repeat with that period
    # (a DataLoader's workers deliver batches in turn); the executor times whole periods.


ApplyFn = Callable[..., RemedyHandle]

_REMEDIES: dict[str, ApplyFn] = {}
_CHECKS: dict[str, Callable[[Target], Mapping[str, str]]] = {}
_IN_FORCE: dict[str, Callable[..., Any]] = {}
_PHASES: dict[str, str] = {}
_discovered = False


def _discover() -> None:
    global _discovered
    if _discovered:
        return
    _discovered = True
    for info in pkgutil.iter_modules(_package.__path__):
        name = info.name
        if name.startswith("_"):
            continue
        try:
            module = importlib.import_module(f"{_package.__name__}.{name}")
        except Exception as exc:  # one broken plug-in must not take the others down
            logger.warning("Could not load remedy %s: %s: %s", name, type(exc).__name__, exc)
            continue
        fn = getattr(module, f"apply_{name}", None)
        if callable(fn):
            _REMEDIES.setdefault(name, fn)
            _PHASES.setdefault(name, getattr(module, "PHASE", PHASES[-1]))
        check = getattr(module, f"check_{name}", None)
        if callable(check):
            _CHECKS.setdefault(name, check)
        in_force = getattr(module, f"in_force_{name}", None)
        if callable(in_force):
            _IN_FORCE.setdefault(name, in_force)


def remedy_names() -> list[str]:
    _discover()
    return sorted(_REMEDIES)


def register(name: str, fn: ApplyFn, *, phase: str = PHASES[-1], replace: bool = False) -> None:
    """Add an applier at run time (or, with ``replace=True``, override one)."""
    _discover()
    if name in _REMEDIES and not replace:
        raise ValueError(f"remedy {name!r} is already registered; pass replace=True to override")
    _REMEDIES[name] = fn
    _PHASES[name] = phase


def unregister(name: str) -> None:
    _REMEDIES.pop(name, None)
    _PHASES.pop(name, None)


def get(name: str) -> ApplyFn:
    _discover()
    try:
        return _REMEDIES[name]
    except KeyError:
        raise ValueError(f"unknown remedy {name!r}; valid: {remedy_names()}") from None


def phase(name: str) -> str:
    _discover()
    return _PHASES.get(name, PHASES[-1])


def checks(target: Target) -> dict[str, dict[str, str]]:
    """Every remedy's refusals for this job (``check_<name>``; see the module docstring). A check
    that raises refuses its remedy with what it raised: nothing is offered that was not cleared."""
    _discover()
    out: dict[str, dict[str, str]] = {}
    for name, check in sorted(_CHECKS.items()):
        try:
            refusals = {str(k): str(v) for k, v in dict(check(target)).items()}
        except Exception as exc:  # noqa: BLE001 - a broken check refuses, it never breaks training
            refusals = {"": f"its check failed: {type(exc).__name__}: {exc}"}
        out[name] = refusals
    return out


def in_force(name: str, *args: Any) -> Any:
    """What remedy ``name`` has in force on ``args`` (its ``in_force_<name>``: ZeRO's stage on an
    optimizer, read when the script saves a checkpoint); None for a remedy that says nothing."""
    _discover()
    fn = _IN_FORCE.get(name)
    return fn(*args) if fn is not None else None


def check_params(name: str, params: Mapping[str, Any]) -> None:
    """``ValueError`` naming the accepted keywords when ``params`` does not fit the applier."""
    if not isinstance(params, Mapping):
        raise ValueError(f"remedy {name!r}: params must be an object")
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


def apply_remedy(target: Target, name: str, params: Mapping[str, Any]) -> RemedyHandle:
    """Apply remedy ``name`` with ``params`` to ``target``; atomic (see the module docstring)."""
    check_params(name, params)
    return get(name)(target, **dict(params))
