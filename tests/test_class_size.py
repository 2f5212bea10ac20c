"""No class too long to read in one sitting (issue 36: the agent had grown to a 779-line class)."""

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
MAX_LINES = 400


def long_classes(root: Path) -> list[str]:
    out = []
    for folder in ("advisor", "probes", "apply", "recommend", "bench", "tests"):
        for path in sorted((root / folder).rglob("*.py")):
            if path.relative_to(root).parts[:2] in (("advisor", "probes"), ("advisor", "apply"), ("advisor", "recommend")):
                continue  # links to the top-level folders, read there
            try:
                tree = ast.parse(path.read_text(), filename=str(path))
            except SyntaxError:  # a test's fixture script that must not compile
                continue
            for node in ast.walk(tree):
                if isinstance(node, ast.ClassDef) and node.end_lineno - node.lineno + 1 > MAX_LINES:
                    out.append(f"{path.relative_to(root)}:{node.lineno} {node.name} "
                               f"({node.end_lineno - node.lineno + 1} lines)")
    return out


def test_no_class_is_over_400_lines() -> None:
    assert long_classes(ROOT) == []


def test_the_check_sees_a_long_class(tmp_path: Path) -> None:
    (tmp_path / "advisor").mkdir()
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_LINES))
    (tmp_path / "advisor" / "big.py").write_text(f"class Big:\n{body}\n")
    for folder in ("probes", "apply", "recommend", "bench", "tests"):
        (tmp_path / folder).mkdir()
    assert long_classes(tmp_path) == [f"advisor/big.py:1 Big ({MAX_LINES + 1} lines)"]
