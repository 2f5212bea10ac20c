"""Package boundaries: headless packages never load textual or rich; recommend/ never loads torch."""

import subprocess
import sys

import pytest

ROOT = __import__("pathlib").Path(__file__).resolve().parents[1]


def _walk(package: str) -> list[str]:
    names = []
    for path in (ROOT / package).rglob("*.py"):
        rel = path.relative_to(ROOT).with_suffix("")
        parts = list(rel.parts)
        if parts[-1] == "__init__":
            parts = parts[:-1]
        if parts[-1] in ("__main__", "bench"):
            continue  # entry points run code on import
        names.append(".".join(parts))
    return sorted(names)


def _loaded_after_import(modules: list[str]) -> set[str]:
    code = ("import sys\n" + "".join(f"import {m}\n" for m in modules)
            + "print(','.join(sorted({n.split('.')[0] for n in sys.modules})))")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True)
    return set(out.stdout.strip().split(","))


@pytest.mark.parametrize("package", ["probes", "recommend", "apply"])
def test_headless_packages_do_not_load_ui_libraries(package):
    loaded = _loaded_after_import(_walk(package))
    assert not loaded & {"textual", "rich"}, f"{package} pulled in {loaded & {'textual', 'rich'}}"


def test_recommend_does_not_load_torch():
    loaded = _loaded_after_import(_walk("recommend"))
    assert "torch" not in loaded


def test_controller_entry_does_not_load_torch():
    # `advisor --help` and the TUI must start fast: torch loads only in training processes.
    loaded = _loaded_after_import(["advisor.cli", "advisor.controller", "advisor.report", "advisor.store"])
    assert "torch" not in loaded
