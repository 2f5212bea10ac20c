"""The package table of docs/architecture.md, checked statically on every import of every module.

``check_tree(root)`` reads the source tree under ``root`` and returns every problem it finds, one
line each; the real tree must have none, and a copy of it with one violation injected must show
that violation (the second half of this file), so the checker cannot quietly go blind. It checks:

- our packages import only the packages of ours the table allows (function-level and
  ``TYPE_CHECKING`` imports included: a typing dependency is a dependency of the design);
- third-party imports against an allowlist per package (``records``: the standard library
  only); ``TYPE_CHECKING`` imports of third-party names are left out (they never run: the records'
  typing protocols name torch types);
- ``importlib.import_module`` and ``__import__`` (however spelt or aliased) only in the CLI, the
  TUI and the training process's bootstrap, or, with a name that is not a literal, as the named
  plug-in discoveries of a package's own modules; a literal name counts as an import of it;
- no import cycle among our modules, ``TYPE_CHECKING`` imports included;
- no module reachable from the report paths imports torch (the runtime closure from the
  report, its sections, the comparisons, the planning path and ``recommend/``);
- the user-process side (``advisor.api``, ``advisor.integrations``) loads the agent only inside
  functions, so ``import advisor`` never loads torch;
- ``TYPE_CHECKING`` is honoured only when it is ``typing``'s and never assigned in the module.
"""

from __future__ import annotations

import ast
import shutil
import sys
from dataclasses import dataclass, field
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# Package -> its source folder under the root. advisor/probes, advisor/apply and advisor/recommend
# are links to the top-level folders, which are read once, under their installed names.
SOURCES = {
    "advisor.records": ("advisor", "records"),
    "advisor.agent": ("advisor", "agent"),
    "advisor.fit": ("advisor", "fit"),
    "advisor.probes": ("probes",),
    "advisor.apply": ("apply",),
    "advisor.recommend": ("recommend",),
}
OURS = tuple(SOURCES)
CONTROLLER = "advisor (controller)"
# The user's own process, where an in-process session runs the agent around the user's loop
# (``advisor.session()``, the trainer callbacks). ``import advisor`` loads ``advisor.api``, so it
# reaches the agent (and torch) only inside the functions that start a session.
USER = "advisor (user process)"
USER_MODULES = ("advisor.api", "advisor.integrations")
# The controller modules the user-process side may import: torch-free, rich-free, small.
USER_CONTROLLER_OK = ("advisor.errors", "advisor.launch")
# Controller modules that may import the user-process side, each with its reason.
CONTROLLER_TO_USER: dict[str, str] = {
    "advisor": "the package exports advisor.session(), the in-process API",
}
BARE = ("probes", "apply", "recommend", "agent", "records", "fit")  # our folders, never imported by these names

# package -> the packages of ours it may import
TABLE: dict[str, set[str]] = {
    "advisor.records": {"advisor.records"},
    "advisor.probes": {"advisor.probes", "advisor.records"},
    "advisor.apply": {"advisor.apply", "advisor.records"},
    "advisor.recommend": {"advisor.recommend", "advisor.records"},
    "advisor.agent": {"advisor.agent", "advisor.probes", "advisor.apply", "advisor.records"},
    "advisor.fit": {"advisor.fit", "advisor.agent", "advisor.probes", "advisor.records"},
    CONTROLLER: {CONTROLLER, "advisor.recommend", "advisor.records"},
    USER: {USER, "advisor.agent", "advisor.records"},  # and USER_CONTROLLER_OK
}
# package -> the third-party top-level names it may import (the standard library is always allowed)
THIRD_PARTY: dict[str, set[str]] = {
    "advisor.records": set(),
    "advisor.probes": {"torch", "numpy", "pynvml"},
    "advisor.apply": {"torch"},
    "advisor.recommend": {"numpy"},
    "advisor.agent": {"torch"},
    "advisor.fit": {"torch", "safetensors"},  # safetensors only where the script has it installed
    CONTROLLER: set(),
    USER: set(),
}
# Modules that wrap one optional tool each (an extra in pyproject.toml), imported only when asked for.
TOOL_LIBRARIES: dict[str, set[str]] = {
    "advisor.trackers.tensorboard_log": {"tensorboardX"},
    "advisor.trackers.mlflow_log": {"mlflow"},
    "advisor.trackers.wandb_log": {"wandb"},
    "advisor.integrations.transformers": {"transformers"},
    "advisor.integrations.lightning": {"lightning", "pytorch_lightning"},
}
# Controller modules that draw: rich for the reports and progress lines, textual for the TUI.
TUI = ("advisor.tui",)  # the package and everything under it
RENDER = ("advisor.render", "advisor.rich_text", "advisor.diff_render", "advisor.listing", "advisor.progress",
          "advisor.sections")
TUI_LIBRARIES = {"textual", "textual_plotext", "rich"}
RENDER_LIBRARIES = {"rich"}

# Where importlib.import_module / __import__ may name modules: the CLI, the TUI, the bootstrap.
DYNAMIC_OK = ("advisor.cli", "advisor.tui", "advisor.agent.bootstrap")
# Plug-in discovery: a package's own modules, found by name, each with the package it scans.
DISCOVERY: dict[str, tuple[str, str]] = {
    "advisor.apply.registry": ("advisor.apply.remedies", "an applier per remedy module, found by name"),
    "advisor.recommend.remedies": ("advisor.recommend.remedies", "a predictor per remedy module, found by name"),
    "advisor.recommend.rules": ("advisor.recommend.rules", "a rule per module, found by name"),
}
# The report paths: these modules, and everything they import at run time, never import torch.
REPORT_ENTRIES = ("advisor.report", "advisor.sections", "advisor.diff", "advisor.diff_render", "advisor.diff_cli",
                  "advisor.report_markdown", "advisor.planning", "advisor.recommend")

# Deferred imports of our own modules that are allowed, each with its reason; any other
# function-level import of ours would hide a dependency from a reader of the module's head.
DEFERRED: dict[str, str] = {
    "advisor.cli": "per-command imports keep `advisor --help` and `advisor sessions` fast",
    "advisor.tui": "textual loads only when the TUI is built (headless never imports it)",
    "advisor.agent.bootstrap": "the training process imports the agent after setting up sys.path",
    "advisor.api": "the agent (and torch) load when a session starts: `import advisor` stays cheap",
}


@dataclass
class Import:
    name: str  # the module imported (``from a import b``: ``a.b`` when that is a module, else ``a``)
    line: int
    typing_only: bool = False  # under ``if TYPE_CHECKING:``
    deferred: bool = False  # inside a function
    dynamic: bool = False  # importlib.import_module / __import__ with this literal name


@dataclass
class Module:
    name: str
    path: Path
    imports: list[Import] = field(default_factory=list)
    # importlib.import_module / __import__ calls whose name is not a literal: (line, package-local)
    opaque: list[tuple[int, bool]] = field(default_factory=list)


def _is_under(module: str, prefixes: tuple[str, ...]) -> bool:
    return any(module == p or module.startswith(p + ".") for p in prefixes)


def _files(root: Path) -> list[tuple[str, Path]]:
    out = []
    for package, parts in SOURCES.items():
        folder = root.joinpath(*parts)
        for path in sorted(folder.rglob("*.py")):
            rel = path.relative_to(folder).with_suffix("")
            out.append((".".join([package, *(p for p in rel.parts if p != "__init__")]), path))
    for path in sorted((root / "advisor").rglob("*.py")):
        rel = path.relative_to(root / "advisor")
        if rel.parts[0] in ("records", "agent", "fit", "probes", "apply", "recommend"):
            continue
        out.append((".".join(["advisor", *(p for p in rel.with_suffix("").parts if p != "__init__")]), path))
    return out


def _package_of(module: str) -> str:
    if _is_under(module, USER_MODULES):
        return USER
    for package in OURS:
        if _is_under(module, (package,)):
            return package
    return CONTROLLER


def _type_checking_blocks(tree: ast.Module) -> set[int]:
    """ids of the nodes inside ``if TYPE_CHECKING:`` bodies, when that name is typing's own and
    is never assigned in the module (a module's own ``TYPE_CHECKING = True`` runs its imports)."""
    from_typing = any(isinstance(n, ast.ImportFrom) and n.module == "typing"
                      and any(a.name == "TYPE_CHECKING" and a.asname is None for a in n.names)
                      for n in ast.walk(tree))
    typing_module = any(isinstance(n, ast.Import) and any(a.name == "typing" and a.asname is None for a in n.names)
                        for n in ast.walk(tree))
    assigned = any(isinstance(n, ast.Name) and n.id == "TYPE_CHECKING" and isinstance(n.ctx, ast.Store)
                   for n in ast.walk(tree))
    if assigned:
        return set()

    def honoured(test: ast.expr) -> bool:
        if isinstance(test, ast.Name):
            return test.id == "TYPE_CHECKING" and from_typing
        return (isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING"
                and isinstance(test.value, ast.Name) and test.value.id == "typing" and typing_module)

    return {id(n) for block in ast.walk(tree) if isinstance(block, ast.If) and honoured(block.test)
            for stmt in block.body for n in ast.walk(stmt)}  # the ``else`` branch runs: not here


def _resolve_from(node: ast.ImportFrom, module: str, path: Path) -> str:
    if not node.level:
        return node.module or ""
    parts = module.split(".")
    parts = parts[: len(parts) - node.level + (1 if path.name == "__init__.py" else 0)]
    return ".".join(parts + ([node.module] if node.module else []))


def _dynamic_callers(tree: ast.Module) -> tuple[set[str], set[str]]:
    """(names bound to the importlib module, names bound to a dynamic-import function) in this module."""
    modules, functions = {"importlib"}, {"__import__"}
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.name == "importlib":
                    modules.add(alias.asname or "importlib")
                elif alias.name == "builtins":
                    modules.add(alias.asname or "builtins")
        elif isinstance(node, ast.ImportFrom) and node.module in ("importlib", "builtins"):
            for alias in node.names:
                if alias.name in ("import_module", "__import__"):
                    functions.add(alias.asname or alias.name)
    return modules, functions


def _is_dynamic_import(call: ast.Call, modules: set[str], functions: set[str]) -> bool:
    func = call.func
    if isinstance(func, ast.Name):
        return func.id in functions
    return (isinstance(func, ast.Attribute) and func.attr in ("import_module", "__import__")
            and isinstance(func.value, ast.Name) and func.value.id in modules)


def _package_local(arg: ast.expr) -> bool:
    """``f"{__name__}.{x}"`` or ``f"{package.__name__}.{x}"``: a module of the package itself."""
    if not isinstance(arg, ast.JoinedStr) or len(arg.values) < 2:
        return False
    head, dot = arg.values[0], arg.values[1]
    named = isinstance(head, ast.FormattedValue) and (
        (isinstance(head.value, ast.Name) and head.value.id == "__name__")
        or (isinstance(head.value, ast.Attribute) and head.value.attr == "__name__"))
    return named and isinstance(dot, ast.Constant) and str(dot.value).startswith(".")


def read_module(name: str, path: Path, known: set[str]) -> Module:
    tree = ast.parse(path.read_text(), filename=str(path))
    typing_only = _type_checking_blocks(tree)
    in_function = {id(n) for fn in ast.walk(tree) if isinstance(fn, (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda))
                   for n in ast.walk(fn) if n is not fn}
    modules, functions = _dynamic_callers(tree)
    found = Module(name, path)
    for node in ast.walk(tree):
        flags = {"typing_only": id(node) in typing_only, "deferred": id(node) in in_function}
        if isinstance(node, ast.Import):
            found.imports += [Import(a.name, node.lineno, **flags) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = _resolve_from(node, name, path)
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                found.imports.append(Import(sub if sub in known else base, node.lineno, **flags))
        elif isinstance(node, ast.Call) and _is_dynamic_import(node, modules, functions) and node.args:
            arg = node.args[0]
            if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                found.imports.append(Import(arg.value, node.lineno, dynamic=True, **flags))
            else:
                found.opaque.append((node.lineno, _package_local(arg)))
    return found


def read_tree(root: Path) -> dict[str, Module]:
    files = _files(root)
    known = {name for name, _ in files}
    return {name: read_module(name, path, known) for name, path in files}


def _ours(name: str, known: set[str]) -> str | None:
    """The module of ours ``name`` is (or the nearest package of ours holding it), else None."""
    parts = name.split(".")
    while parts and ".".join(parts) not in known:
        parts.pop()
    return ".".join(parts) if parts and parts[0] == "advisor" else None


def _allowed_third_party(module: str) -> set[str]:
    package = _package_of(module)
    allowed = set(THIRD_PARTY[package])
    allowed |= TOOL_LIBRARIES.get(module, set())
    if package == CONTROLLER and _is_under(module, TUI):
        allowed |= TUI_LIBRARIES
    elif package == CONTROLLER and _is_under(module, RENDER):
        allowed |= RENDER_LIBRARIES
    return allowed


def _table_problems(tree: dict[str, Module]) -> list[str]:
    problems = []
    for module in tree.values():
        package = _package_of(module.name)
        for imp in module.imports:
            top = imp.name.split(".")[0]
            where = f"{module.name}:{imp.line}"
            if top in BARE:
                problems.append(f"{where} imports {imp.name!r} by its bare name; use advisor.{imp.name}")
            elif top == "advisor":
                target = _package_of(imp.name)
                if package == USER and target == CONTROLLER and _is_under(imp.name, USER_CONTROLLER_OK):
                    continue
                if package == CONTROLLER and target == USER and module.name in CONTROLLER_TO_USER:
                    continue
                if target not in TABLE[package]:
                    problems.append(f"{where} ({package}) may not import {imp.name} ({target})")
                elif package == USER and target == "advisor.agent" and not imp.deferred:
                    problems.append(f"{where} imports {imp.name} at module level: `import advisor` would load "
                                    "the agent and torch (import it where a session starts)")
            elif top not in sys.stdlib_module_names and not imp.typing_only:
                if top not in _allowed_third_party(module.name):
                    problems.append(f"{where} ({package}) may not import the third-party package {top}")
    return problems


def _dynamic_problems(tree: dict[str, Module]) -> list[str]:
    problems = []
    for module in tree.values():
        if _is_under(module.name, DYNAMIC_OK):
            continue
        for imp in module.imports:
            if imp.dynamic and imp.name.split(".")[0] in ("advisor", *BARE):
                problems.append(f"{module.name}:{imp.line} imports {imp.name} by importlib/__import__; "
                                "import it by name (dynamic imports of ours: the CLI, the TUI and the bootstrap only)")
        for line, local in module.opaque:
            if not (local and module.name in DISCOVERY):
                problems.append(f"{module.name}:{line} calls importlib/__import__ with a computed name "
                                "(allowed only as a named plug-in discovery of the package's own modules)")
    return problems


def _deferred_problems(tree: dict[str, Module]) -> list[str]:
    problems = []
    for module in tree.values():
        ours = [imp for imp in module.imports if imp.deferred and not imp.dynamic and imp.name.startswith("advisor")]
        if module.name in DEFERRED:
            if not ours:
                problems.append(f"{module.name}: named in DEFERRED but imports nothing of ours lazily any more")
        else:
            problems += [f"{module.name}:{imp.line} imports {imp.name} inside a function" for imp in ours]
    return problems


def graph(tree: dict[str, Module], *, typing: bool, discovery: bool) -> dict[str, set[str]]:
    """Our modules -> our modules each imports (``typing``: ``TYPE_CHECKING`` imports too;
    ``discovery``: a plug-in discovery imports every module of the package it scans). A module's
    import of a package that holds it is no edge (Python imports the parents first anyway)."""
    known = set(tree)
    out: dict[str, set[str]] = {}
    for module in tree.values():
        edges = set()
        for imp in module.imports:
            target = _ours(imp.name, known)
            if target is None or (imp.typing_only and not typing) or _is_under(module.name, (target,)):
                continue
            edges.add(target)
        if discovery and module.name in DISCOVERY and module.opaque:
            scanned = DISCOVERY[module.name][0]
            edges |= {m for m in known if m.rsplit(".", 1)[0] == scanned and m != module.name}
        edges.discard(module.name)
        out[module.name] = edges
    return out


def cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """One cycle per strongly connected component of more than one module (Tarjan's algorithm)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(edges.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                top = stack.pop()
                on_stack.discard(top)
                component.append(top)
                if top == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return found


def _torch_problems(tree: dict[str, Module]) -> list[str]:
    """Every module reachable at run time from a report entry point that imports torch, with the path."""
    edges = graph(tree, typing=False, discovery=True)
    came_from: dict[str, str | None] = {m: None for m in tree if _is_under(m, REPORT_ENTRIES)}
    queue = sorted(came_from)
    while queue:
        module = queue.pop()
        for nxt in sorted(edges[module]):
            if nxt not in came_from:
                came_from[nxt] = module
                queue.append(nxt)
    problems = []
    for module in sorted(came_from):
        torch_lines = [imp.line for imp in tree[module].imports
                       if imp.name.split(".")[0] == "torch" and not imp.typing_only]
        if torch_lines:
            path, step = [module], came_from[module]
            while step is not None:
                path.append(step)
                step = came_from[step]
            problems.append(f"torch on a report path: {' <- '.join(path)} (line {torch_lines[0]})")
    return problems


def check_tree(root: Path) -> list[str]:
    """Every violation of the import rules in the source tree under ``root``, one line each."""
    tree = read_tree(root)
    problems = _table_problems(tree) + _dynamic_problems(tree) + _deferred_problems(tree)
    problems += [f"import cycle, TYPE_CHECKING imports included: {' -> '.join(c)}"
                 for c in cycles(graph(tree, typing=True, discovery=False))]
    return problems + _torch_problems(tree)


# -- the real tree -------------------------------------------------------------------------

def test_the_tree_keeps_every_import_rule() -> None:
    tree = read_tree(ROOT)
    assert len(tree) > 200  # the tree really was read
    assert sum(len(v) for v in graph(tree, typing=True, discovery=False).values()) > 500
    assert check_tree(ROOT) == []


def test_every_named_exception_is_still_used() -> None:
    tree = read_tree(ROOT)
    assert all(tree[m].opaque for m in DISCOVERY), "a discovery exception no longer discovers anything"
    assert set(DEFERRED) <= set(tree)


# -- copies of the tree with one violation each: the checker must see it -------------------

def _copy(tmp_path: Path) -> Path:
    root = tmp_path / "tree"
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    shutil.copytree(ROOT / "advisor", root / "advisor", symlinks=True, ignore=ignore)
    for folder in ("probes", "apply", "recommend"):
        shutil.copytree(ROOT / folder, root / folder, ignore=ignore)
    return root


def _append(path: Path, text: str) -> None:
    path.write_text(path.read_text() + "\n" + text)


@pytest.fixture(scope="module")
def pristine(tmp_path_factory) -> Path:
    root = _copy(tmp_path_factory.mktemp("pristine"))
    assert check_tree(root) == []  # the copy itself is clean: what a test injects is what it finds
    return root


def _inject(tmp_path: Path, pristine: Path, edits: dict[str, str]) -> list[str]:
    root = tmp_path / "tree"
    shutil.copytree(pristine, root, symlinks=True)
    for rel, text in edits.items():
        path = root / rel
        if path.exists():
            _append(path, text)
        else:
            path.write_text(text)
    return check_tree(root)


INJECTED = {
    "torch in a report section": (
        {"advisor/sections/memory.py": "import torch\n"},
        ["advisor.sections.memory:", "may not import the third-party package torch",
         "torch on a report path: advisor.sections.memory"]),
    "an importlib import of the executor in the report": (
        {"advisor/report.py": "import importlib\n\ndef _x():\n    return importlib.import_module(\"advisor.apply.executor\")\n"},
        ["advisor.report:", "imports advisor.apply.executor by importlib/__import__",
         "may not import advisor.apply.executor (advisor.apply)",
         "torch on a report path: advisor.apply.executor <- advisor.report"]),
    "a third-party package in the records": (
        {"advisor/records/units.py": "import requests  # noqa\n"},
        ["advisor.records.units:", "may not import the third-party package requests"]),
    "a cycle made only of TYPE_CHECKING imports": (
        {"advisor/records/_cycle_a.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                                        "    from advisor.records._cycle_b import B\n",
         "advisor/records/_cycle_b.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
                                        "    from advisor.records._cycle_a import A\n"},
        ["import cycle, TYPE_CHECKING imports included: advisor.records._cycle_a -> advisor.records._cycle_b"]),
    "__import__ under another name": (
        {"advisor/diff.py": "from importlib import import_module as load\n\ndef _x():\n"
                            "    return load('advisor.agent.agent')\n"},
        ["advisor.diff:", "imports advisor.agent.agent by importlib/__import__", "torch on a report path"]),
    "a computed name outside the plug-in discoveries": (
        {"advisor/report.py": "def _x(name):\n    return __import__('advisor.' + name)\n"},
        ["advisor.report:", "calls importlib/__import__ with a computed name"]),
    "a home-made TYPE_CHECKING": (
        {"advisor/records/units.py": "TYPE_CHECKING = True\nif TYPE_CHECKING:\n    import numpy\n"},
        ["advisor.records.units:", "may not import the third-party package numpy"]),
    "the else branch of TYPE_CHECKING": (
        {"recommend/profile.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    pass\nelse:\n"
                                 "    import torch\n"},
        ["advisor.recommend.profile:", "may not import the third-party package torch",
         "torch on a report path: advisor.recommend.profile"]),
    "the agent at the top of the in-process API": (
        {"advisor/api.py": "from advisor.agent import lifecycle  # noqa\n"},
        ["advisor.api:", "imports advisor.agent.lifecycle at module level"]),
    "the user-process side in the report": (
        {"advisor/report.py": "from advisor import api  # noqa\n"},
        ["advisor.report:", "may not import advisor.api (advisor (user process))"]),
    "a tracker's library elsewhere in the controller": (
        {"advisor/listing.py": "import wandb  # noqa\n"},
        ["advisor.listing:", "may not import the third-party package wandb"]),
    "a function-level import of ours": (
        {"advisor/report.py": "def _x():\n    from advisor.records import units\n    return units\n"},
        ["advisor.report:", "imports advisor.records.units inside a function"]),
}


@pytest.mark.parametrize("case", sorted(INJECTED))
def test_the_checker_sees_an_injected_violation(case: str, tmp_path: Path, pristine: Path) -> None:
    edits, expected = INJECTED[case]
    problems = _inject(tmp_path, pristine, edits)
    for piece in expected:
        assert any(piece in p for p in problems), (piece, problems)
