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
