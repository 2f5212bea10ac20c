"""Chain members a failed forward never reached, sized from the last member it completed.

A job that runs out of memory in its forward records the modules that ran: on an 8-block GPT
that failed in ``blocks.4``, blocks 0-3 whole, block 4 in part, blocks 5-7 not at all. A plan
solved over that chain checkpoints among blocks 0-4 and leaves the rest as they were, so the
planned run runs out again. The model's structure (``ModelInfo.modules``) names every member;
members of one type are taken to save what the last completed one saved (its row and its
submodules' rows, renamed). Torch-free.
"""

from __future__ import annotations

import re
from dataclasses import replace
from typing import Any, Mapping, Sequence

from advisor.records.samples import ModuleStat

_MEMBER = re.compile(r"^(.*)\.(\d+)$")


def _within(name: str, root: str) -> bool:
    return name == root or name.startswith(root + ".")


def extrapolate(rows: Sequence[ModuleStat], structure: Sequence[Mapping[str, Any]],
                failing_module: str | None) -> tuple[list[ModuleStat], list[str]]:
    """(module stats with the unreached and the partial members filled in, the members filled).

    ``rows``: the measured modules; ``structure``: the model's modules (``ModelInfo.modules``:
    {"name", "type", ...}); ``failing_module``: where the forward ran out (its chain member ran
    in part and is replaced too). Members of a chain of mixed types are left alone."""
    measured = {r.name: r for r in rows}
    groups: dict[str, dict[int, str]] = {}
    types: dict[str, str] = {}
    for module in structure:
        name = str(module.get("name") or "")
        types[name] = str(module.get("type") or "")
        match = _MEMBER.match(name)
        if match:
            groups.setdefault(match[1], {})[int(match[2])] = name
    filled: list[str] = []
    added: list[ModuleStat] = []
    for members in groups.values():
        if len(members) < 2 or len({types[n] for n in members.values()}) != 1:
            continue
        partial = next((n for n in members.values() if failing_module and _within(failing_module, n)), None)
        complete = [n for i, n in sorted(members.items()) if n in measured and n != partial]
        missing = [n for i, n in sorted(members.items()) if n not in measured or n == partial]
        if not complete or not missing:
            continue
        template = complete[-1]
        subtree = [r for n, r in measured.items() if _within(n, template)]
        for target in missing:
            for row in subtree:
                added.append(replace(row, name=target + row.name[len(template):]))
            filled.append(target)
    if not filled:
        return list(rows), []
    kept = [r for r in rows if not any(_within(r.name, f) for f in filled)]
    return kept + added, filled
