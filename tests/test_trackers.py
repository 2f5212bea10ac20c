"""``--log-to wandb|mlflow|tensorboard`` (issue 35, item 3): what each tracker receives, read back
from what each tool wrote offline.

The report is a recorded session's (tests/data/gpt, advised at 70% of its peak: a memory
diagnosis and a live recommendation) with one apply added as the executor reports it; each tool logs it in a process of its own, as the
controller does (WANDB_MODE=offline, a SQLite MLflow store, TensorBoard event files), and the test
reads the files back with the tool's own formats: every step's time, loss and peak, each apply's
predicted and measured figures at its step, and the findings' text.
"""

from __future__ import annotations

import glob
import importlib.util
import json
import os
import struct
import subprocess
import sys
from pathlib import Path

import pytest

import advisor.trackers as trackers
from advisor import cli
from advisor.report import build_report
from advisor.trackers import LogTarget, parse_target
from advisor.trackers.series import tracker_data
from recorded import load_state

ROOT = Path(__file__).resolve().parents[1]
APPLY = {"remedy": "activation_checkpointing", "recommendation_id": "checkpoint-blocks-4", "params": {}, "rank": 0,
         "at_step": 2, "status": "kept", "error": None, "reason": "peak went down",
         "predicted": {"peak_memory_bytes": 23347788, "step_time_s": 1.5},
         "measured": {"before": {"peak_memory_bytes": 35455564, "step_time_s": 1.2},
                      "after": {"peak_memory_bytes": 23000000, "step_time_s": 1.4}}}


def needs(package: str) -> pytest.MarkDecorator:
    return pytest.mark.skipif(importlib.util.find_spec(package) is None, reason=f"{package} is not installed")


@pytest.fixture(scope="module")
def report() -> dict:
    built = build_report(load_state("gpt"), budget_bytes=24_000_000)
    built["applied"] = [APPLY]
    assert built["diagnosis"] and built["recommendations"] and len(built["steps"]) >= 2
    return built


def expected_steps(report: dict) -> dict[int, dict[str, float]]:
    """advisor/step_time_s and advisor/loss by step, from the report itself."""
    return {s["index"]: {"advisor/step_time_s": s["time_s"], "advisor/loss": s["loss"]}
            for s in report["steps"] if s["loss"] is not None}


def log_in_a_process(report: dict, target: str, cwd: Path, **env: str) -> subprocess.CompletedProcess:
    path = cwd / "report.json"
    path.write_text(json.dumps(report))
    code = ("import json, sys; from advisor.trackers import log_report, parse_target; "
            f"log_report(json.load(open({str(path)!r})), [parse_target({target!r})])")
    done = subprocess.run([sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(ROOT), **env})
    assert done.returncode == 0 and "could not log" not in done.stderr, done.stderr[-3000:]
    assert done.stdout == ""  # stdout is the script's: nothing of a tracker's lands there
    return done


def test_what_a_tracker_receives_is_the_reports(report: dict) -> None:
    data = tracker_data(report)
    for step, figures in expected_steps(report).items():
        for name, value in figures.items():
            assert data.metrics[step][name] == value
    peaks = {s["index"]: s["peak_memory_bytes"] for s in report["steps"] if s["peak_memory_bytes"] is not None}
    assert peaks and all(data.metrics[i]["advisor/peak_memory_bytes"] == v for i, v in peaks.items())
    applied = data.metrics[2]
    assert applied["advisor/apply/checkpoint-blocks-4/predicted_step_time_s"] == 1.5
    assert applied["advisor/apply/checkpoint-blocks-4/measured_step_time_s"] == 1.4
    assert applied["advisor/apply/checkpoint-blocks-4/measured_peak_memory_bytes"] == 23000000
    assert report["diagnosis"]["summary"] in data.findings and "checkpoint-blocks-4" in data.findings
    assert data.summary["advisor/bottleneck"] == "memory"
    assert data.recommendations[0][0] == report["recommendations"][0]["id"]


def test_a_bad_target_is_a_usage_error(monkeypatch, capsys) -> None:
    assert cli.main(["attach", "--log-to", "neptune", "x.py"]) == 2
    assert "unknown tracker 'neptune': expected tensorboard, mlflow, wandb" in capsys.readouterr().err
    monkeypatch.setitem(trackers.PACKAGES, "wandb", "no_such_pkg_x")  # as if wandb were not installed
    script = Path(__file__).resolve().parent / "scripts" / "tiny_train.py"
    assert cli.main(["attach", "--headless", "--log-to", "wandb", str(script)]) == 2
    assert "pip install 'advisor[wandb]'" in capsys.readouterr().err
    assert parse_target("mlflow:sqlite:///x.db") == LogTarget(tool="mlflow", where="sqlite:///x.db")


def _tfrecords(path: str) -> list[bytes]:
    data, out, pos = Path(path).read_bytes(), [], 0
    while pos < len(data):
        (length,) = struct.unpack("<Q", data[pos:pos + 8])
        out.append(data[pos + 12:pos + 12 + length])
        pos += 12 + length + 4
    return out


def read_tensorboard(folder: Path) -> tuple[dict[int, dict[str, float]], dict[str, str]]:
    from tensorboardX.proto.event_pb2 import Event

    scalars: dict[int, dict[str, float]] = {}
    texts: dict[str, str] = {}
    for path in glob.glob(str(folder / "**" / "events.out.tfevents.*"), recursive=True):
        for raw in _tfrecords(path):
            event = Event.FromString(raw)
            for value in event.summary.value:
                if value.HasField("tensor") and value.tensor.string_val:
                    texts[value.tag] = value.tensor.string_val[0].decode()
                else:
                    scalars.setdefault(event.step, {})[value.tag] = value.simple_value
    return scalars, texts


@needs("tensorboardX")
def test_tensorboard_event_files(report: dict, tmp_path: Path) -> None:
    log_in_a_process(report, f"tensorboard:{tmp_path / 'runs'}", tmp_path)
    scalars, texts = read_tensorboard(tmp_path / "runs" / report["session"]["id"])
    for step, figures in expected_steps(report).items():
        for name, value in figures.items():
            assert scalars[step][name] == pytest.approx(value, rel=1e-6)  # event files hold float32
    assert scalars[2]["advisor/apply/checkpoint-blocks-4/measured_step_time_s"] == pytest.approx(1.4)
    assert report["diagnosis"]["summary"] in next(t for tag, t in texts.items() if "findings" in tag)


@needs("mlflow")
@needs("sqlalchemy")
def test_mlflow_local_store(report: dict, tmp_path: Path) -> None:
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    log_in_a_process(report, f"mlflow:{uri}", tmp_path)
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    [run] = client.search_runs([client.get_experiment_by_name("advisor").experiment_id])
    assert run.info.run_name == report["session"]["id"] and run.info.status == "FINISHED"
    for name in ("advisor/step_time_s", "advisor/loss"):
        history = {m.step: m.value for m in client.get_metric_history(run.info.run_id, name)}
        assert history == {step: figures[name] for step, figures in expected_steps(report).items()}
    [predicted] = client.get_metric_history(run.info.run_id, "advisor/apply/checkpoint-blocks-4/predicted_step_time_s")
    assert (predicted.step, predicted.value) == (2, 1.5)
    assert run.data.params["advisor/bottleneck"] == "memory"
    findings = Path(client.download_artifacts(run.info.run_id, "advisor/findings.md", str(tmp_path)))
    assert report["diagnosis"]["summary"] in findings.read_text()


def _wandb_records(path: str) -> list[bytes]:
    """The records of a W&B offline run file: a 7-byte header, then LevelDB-log records (a 4-byte
    checksum, a 2-byte length, a 1-byte type) in 32 KiB blocks; types 1 whole, 2-4 first/middle/last."""
    data, block, out, parts, pos = Path(path).read_bytes(), 32768, [], [], 7
    assert data[:4] == b":W&B"
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:
            pos += left
            continue
        _, length, kind = struct.unpack("<IHB", data[pos:pos + 7])
        if kind == 0:
            pos += left
            continue
        chunk, pos = data[pos + 7:pos + 7 + length], pos + 7 + length
        if kind == 1:
            out.append(chunk)
        elif kind == 2:
            parts = [chunk]
        else:
            parts.append(chunk)
            if kind == 4:
                out.append(b"".join(parts))
    return out


@needs("wandb")
def test_wandb_offline_run(report: dict, tmp_path: Path) -> None:
    log_in_a_process(report, "wandb", tmp_path, WANDB_MODE="offline", WANDB_SILENT="true")
    from wandb.proto import wandb_internal_pb2

    [path] = glob.glob(str(tmp_path / "wandb" / "offline-run-*" / "run-*.wandb"))
    history: dict[int, dict[str, float]] = {}
    names = []
    for raw in _wandb_records(path):
        record = wandb_internal_pb2.Record.FromString(raw)
        kind = record.WhichOneof("record_type")
        if kind == "run":
            names.append((record.run.display_name, record.run.project))
        elif kind == "history":
            items = {i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in record.history.item}
            history.setdefault(items["_step"], {}).update(items)
    assert names == [(report["session"]["id"], "advisor")]
    for step, figures in expected_steps(report).items():
        for name, value in figures.items():
            assert history[step][name] == value
    assert history[2]["advisor/apply/checkpoint-blocks-4/predicted_peak_memory_bytes"] == 23347788
    assert any(key.startswith("advisor/recommendations") for key in history[max(history)])


@needs("tensorboardX")
@pytest.mark.slow
def test_attach_logs_its_session(tmp_path: Path) -> None:
    """``advisor attach --log-to tensorboard:DIR``: the session's own steps, as its report has them."""
    report_path = tmp_path / "report.json"
    done = subprocess.run([sys.executable, "-m", "advisor", "attach", "--headless", "--json", str(report_path),
                           "--log-to", f"tensorboard:{tmp_path / 'runs'}", "tests/scripts/tiny_train.py",
                           "--steps", "5"], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    attached = json.loads(report_path.read_text())
    assert "advisor: logged the session to tensorboard" in done.stderr
    scalars, _ = read_tensorboard(tmp_path / "runs" / attached["session"]["id"])
    assert sorted(i for i in scalars if "advisor/step_time_s" in scalars[i]) == list(range(5))
    for step, figures in expected_steps(attached).items():
        assert scalars[step]["advisor/loss"] == pytest.approx(figures["advisor/loss"], rel=1e-6)
