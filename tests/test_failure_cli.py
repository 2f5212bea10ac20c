"""Bad output paths and arguments fail before the job starts; the script keeps the user's umask and stdin."""

import json
import os
import subprocess
import sys
from pathlib import Path

from advisor.cli import main

ROOT = Path(__file__).resolve().parents[1]
TINY = str(ROOT / "tests" / "scripts" / "tiny_train.py")


def _sessions() -> list[Path]:
    root = Path(os.environ["ADVISOR_HOME"]) / "sessions"
    return sorted(root.glob("*/session.sqlite")) if root.exists() else []


def test_bad_output_paths_are_refused_before_the_job_starts(tmp_path, capsys):
    cases = [
        (["attach", "--headless", "--json", str(tmp_path / "missing" / "r.json"), TINY], "does not exist"),
        (["attach", "--headless", "--json", str(tmp_path), TINY], "is a folder"),
        (["attach", "--headless", "--json", TINY, TINY], "would overwrite the training script"),
    ]
    for argv, message in cases:
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert message in err and "hint:" in err and "Traceback" not in err
    assert _sessions() == []  # nothing ran


def test_memory_budget_zero_and_malformed_apply_ids_are_usage_errors(capsys):
    assert main(["attach", "--headless", "--memory-budget", "0", TINY]) == 2
    assert "more than 0 bytes" in capsys.readouterr().err
    assert main(["attach", "--headless", "--apply", "../x", TINY]) == 2
    assert "recommendation id" in capsys.readouterr().err


def test_report_and_plan_refuse_to_overwrite_the_recorded_script(tmp_path, capsys):
    from advisor.paths import DB_NAME, new_session_dir
    from advisor.store import SessionStore

    script = tmp_path / "train.py"
    script.write_text("print(1)\n")
    folder = new_session_dir("train.py")
    store = SessionStore(folder / DB_NAME)
    store.set_meta(session_id=folder.name, script=str(script), finished=True, exit_code=0, exit_reason="x")
    store.close()
    assert main(["report", str(folder), "--json", str(script)]) == 2
    assert main(["plan", str(folder), "-o", str(script)]) == 2
    assert script.read_text() == "print(1)\n"
    assert "would overwrite the training script" in capsys.readouterr().err


def test_write_json_never_follows_a_planted_tmp_symlink(tmp_path):
    from advisor.report import write_json

    victim = tmp_path / "victim.txt"
    victim.write_text("precious")
    out = tmp_path / "r.json"
    os.symlink(victim, str(out) + ".tmp")  # what another user could plant in a shared folder
    write_json({"a": 1}, str(out))
    assert victim.read_text() == "precious"
    assert json.loads(out.read_text()) == {"a": 1}
    assert not out.is_symlink()


def test_the_script_keeps_the_users_umask_and_the_terminals_stdin(tmp_path):
    out = tmp_path / "made-here"
    out.mkdir()
    run = subprocess.run(
        [sys.executable, "-m", "advisor", "attach", "--headless", "--probes", "none",
         str(ROOT / "tests" / "scripts" / "env_probe.py"), "--out", str(out)],
        cwd=ROOT, input="y\n", capture_output=True, text=True, timeout=180, umask=0o022)
    assert run.returncode == 0, run.stderr[-2000:]
    assert "file 0o644" in run.stdout and "dir 0o755" in run.stdout  # as under plain python
    assert "read 'y'" in run.stdout
    db = _sessions()[0]
    assert os.stat(db).st_mode & 0o077 == 0 and os.stat(db.parent).st_mode & 0o077 == 0  # ours stay private
