"""The package table of docs/architecture.md, checked statically on every import statement
(function-level ones included), so a deferred import cannot hide a forbidden dependency."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

# Source folder -> the package it is installed as. advisor/probes, advisor/apply and
# advisor/recommend are links to the top-level folders, which are read once, under their own names.
SOURCES = {
    "advisor.records": ROOT / "advisor" / "records",
    "advisor.agent": ROOT / "advisor" / "agent",
    "advisor.probes": ROOT / "probes",
    "advisor.apply": ROOT / "apply",
    "advisor.recommend": ROOT / "recommend",
}
OURS = tuple(SOURCES)
CONTROLLER = "advisor (controller)"

# package -> (packages of ours it may import, third-party top-level names it must not import)
TABLE: dict[str, tuple[set[str], set[str]]] = {
    "advisor.records": ({"advisor.records"}, {"torch", "numpy", "textual", "rich", "pynvml"}),
    "advisor.probes": ({"advisor.probes", "advisor.records"}, {"textual", "rich"}),
    "advisor.apply": ({"advisor.apply", "advisor.records"}, {"textual", "rich", "numpy", "pynvml"}),
    "advisor.recommend": ({"advisor.recommend", "advisor.records"}, {"torch", "textual", "rich", "pynvml"}),
    "advisor.agent": ({"advisor.agent", "advisor.probes", "advisor.apply", "advisor.records"},
                      {"textual", "rich"}),
    CONTROLLER: ({CONTROLLER, "advisor.recommend", "advisor.records"}, {"pynvml"}),
}
# Named exceptions to the table, each with its reason.
EXCEPTIONS: dict[tuple[str, str], str] = {}


def _files() -> list[tuple[str, Path]]:
    out = []
    for package, folder in SOURCES.items():
        for path in folder.rglob("*.py"):
            rel = path.relative_to(folder).with_suffix("")
            parts = [p for p in rel.parts if p != "__init__"]
            out.append((".".join([package, *parts]), path))
    for path in (ROOT / "advisor").rglob("*.py"):
        rel = path.relative_to(ROOT / "advisor")
        if rel.parts[0] in ("records", "agent", "probes", "apply", "recommend"):
            continue
        parts = [p for p in rel.with_suffix("").parts if p != "__init__"]
        out.append((".".join(["advisor", *parts]), path))
    return out


def _package_of(module: str) -> str:
    for package in OURS:
        if module == package or module.startswith(package + "."):
            return package
    return CONTROLLER


def _imports(path: Path, module: str) -> list[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    typing_only = {id(n) for block in ast.walk(tree)  # `if TYPE_CHECKING:` imports never run
                   if isinstance(block, ast.If) and getattr(block.test, "id", None) == "TYPE_CHECKING"
                   for stmt in block.body for n in ast.walk(stmt)}
    names = []
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            if node.level:  # relative: resolve against this module's package
                base = module.split(".")
                is_pkg = path.name == "__init__.py"
                base = base[: len(base) - node.level + (1 if is_pkg else 0)]
                names.append(".".join(base + ([node.module] if node.module else [])))
            elif node.module:
                names.append(node.module)
    return names


def test_every_import_respects_the_package_table():
    problems = []
    files = _files()
    assert len(files) > 50
    for module, path in files:
        package = _package_of(module)
        allowed, banned = TABLE[package]
        for name in _imports(path, module):
            top = name.split(".")[0]
            if top in ("probes", "apply", "recommend", "agent", "records"):
                problems.append(f"{module}: imports {name!r} by its bare name; use advisor.{name}")
            elif top == "advisor":
                target = _package_of(name)
                if target not in allowed and (module, target) not in EXCEPTIONS:
                    problems.append(f"{module} ({package}) may not import {name} ({target})")
            elif top in banned:
                problems.append(f"{module} ({package}) may not import {top}")
    assert problems == []


def test_the_checker_sees_a_violation(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("def f():\n    from advisor.agent import hooks\n    import torch\n")
    assert _imports(bad, "advisor.recommend.bad") == ["advisor.agent", "torch"]


def _edges(path: Path, module: str, known: set[str]) -> set[str]:
    """Our modules that ``module`` imports (function-level included, ``TYPE_CHECKING`` left out).

    ``from package import name`` counts as importing ``package.name`` when that is a module, else
    ``package``. A module importing its parent package first (Python always does) is not an edge.
    """
    tree = ast.parse(path.read_text(), filename=str(path))
    typing_only = {id(n) for block in ast.walk(tree)
                   if isinstance(block, ast.If) and getattr(block.test, "id", None) == "TYPE_CHECKING"
                   for stmt in block.body for n in ast.walk(stmt)}
    out: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in typing_only:
            continue
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name in known)
        elif isinstance(node, ast.ImportFrom):
            base = _imports_from_base(node, module, path)
            for alias in node.names:
                sub = f"{base}.{alias.name}"
                if sub in known:
                    out.add(sub)
                elif base in known:
                    out.add(base)
    out.discard(module)
    return out


def _imports_from_base(node: ast.ImportFrom, module: str, path: Path) -> str:
    if not node.level:
        return node.module or ""
    parts = module.split(".")
    parts = parts[: len(parts) - node.level + (1 if path.name == "__init__.py" else 0)]
    return ".".join(parts + ([node.module] if node.module else []))


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
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
        for nxt in sorted(graph.get(node, ())):
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

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_no_import_cycles_among_our_modules():
    files = _files()
    known = {module for module, _ in files}
    graph = {module: _edges(path, module, known) for module, path in files}
    assert sum(len(v) for v in graph.values()) > 100  # the graph really was read
    assert _cycles(graph) == []


def test_the_cycle_check_sees_a_cycle_through_a_function_level_import(tmp_path):
    a, b = tmp_path / "a.py", tmp_path / "b.py"
    a.write_text("from advisor.x import b\n")
    b.write_text("def f():\n    import advisor.x.a\n")
    known = {"advisor.x.a", "advisor.x.b"}
    graph = {"advisor.x.a": _edges(a, "advisor.x.a", known), "advisor.x.b": _edges(b, "advisor.x.b", known)}
    assert _cycles(graph) == [["advisor.x.a", "advisor.x.b"]]
