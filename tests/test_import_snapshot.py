"""``advisor import`` of CUDA memory snapshots: built in the documented format, made on a GPU,
and a malicious pickle that must be refused without running anything."""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
from pathlib import Path

import pytest

from advisor.importers.safe_pickle import UnsafePickleError, load_plain
from advisor.importers.snapshot import analyze, classify, import_snapshot
from advisor.records.samples import Event, MemorySample

ROOT = Path(__file__).resolve().parents[1]
MiB = 1 << 20
TORCH = "/usr/lib/python3/site-packages/torch"


def _f(filename: str, line: int, name: str) -> dict:
    return {"filename": filename, "line": line, "name": name}


PARAM = [_f(f"{TORCH}/nn/modules/module.py", 900, "_apply"), _f("train.py", 5, "build")]
OPTIM = [_f(f"{TORCH}/optim/adam.py", 100, "_init_group"), _f("train.py", 30, "step")]
FORWARD = [_f(f"{TORCH}/nn/modules/linear.py", 125, "forward"), _f(f"{TORCH}/nn/modules/module.py", 1750, "_call_impl"),
           _f("train.py", 20, "train_step")]
BACKWARD = [_f(f"{TORCH}/autograd/graph.py", 824, "_engine_run_backward"), _f(f"{TORCH}/_tensor.py", 626, "backward"),
            _f("train.py", 22, "train_step")]
P, O, X, T, G, Y = (0x10000000 + i * 0x1000000 for i in range(6))


def _block(addr: int, size: int, state: str, frames: list | None = None) -> dict:
    return {"address": addr, "size": size, "requested_size": size, "state": state, "frames": frames or [],
            "some_future_key": 1}


def snapshot_dict(*, oom: bool = False) -> dict:
    """Parameters (4 MiB) and optimizer state (8 MiB) live before the trace; the trace allocates an
    activation (6), a backward temporary (3) and a gradient (4, still held at the dump), frees the
    first two, then a 2 MiB activation comes and goes. Peak: 25 MiB after the gradient."""
    seg1 = {"device": 0, "address": P, "total_size": 32 * MiB, "stream": 0, "segment_type": "large",
            "segment_pool_id": (0, 0), "allocated_size": 12 * MiB, "active_size": 12 * MiB,
            "blocks": [_block(P, 4 * MiB, "active_allocated", PARAM), _block(O, 8 * MiB, "active_allocated", OPTIM),
                       _block(O + 8 * MiB, 20 * MiB, "inactive")]}
    seg2 = {"device": 0, "address": G, "total_size": 32 * MiB, "stream": 0, "segment_type": "large",
            "segment_pool_id": (0, 0), "allocated_size": 4 * MiB, "active_size": 4 * MiB,
            "blocks": [_block(G, 4 * MiB, "active_allocated", BACKWARD), _block(G + 4 * MiB, 28 * MiB, "inactive")]}
    trace = [
        {"action": "segment_alloc", "addr": G, "size": 32 * MiB, "stream": 0, "frames": FORWARD},
        {"action": "alloc", "addr": X, "size": 6 * MiB, "stream": 0, "frames": FORWARD},
        {"action": "alloc", "addr": T, "size": 3 * MiB, "stream": 0, "frames": BACKWARD},
        {"action": "alloc", "addr": G, "size": 4 * MiB, "stream": 0, "frames": BACKWARD},
        {"action": "free_requested", "addr": X, "size": 6 * MiB, "stream": 0, "frames": FORWARD},
        {"action": "free_completed", "addr": X, "size": 6 * MiB, "stream": 0, "frames": FORWARD},
        {"action": "free_requested", "addr": T, "size": 3 * MiB, "stream": 0, "frames": BACKWARD},
        {"action": "free_completed", "addr": T, "size": 3 * MiB, "stream": 0, "frames": BACKWARD},
        {"action": "alloc", "addr": Y, "size": 2 * MiB, "stream": 0, "frames": FORWARD},
        {"action": "free_completed", "addr": Y, "size": 2 * MiB, "stream": 0, "frames": FORWARD},
    ]
    if oom:
        trace.append({"action": "oom", "size": 1 << 30, "device_free": 5 * MiB, "stream": 0, "frames": FORWARD})
    return {"segments": [seg1, seg2], "device_traces": [trace], "allocator_settings": {"PYTORCH_CUDA_ALLOC_CONF": ""},
            "external_annotations": []}


def _write(tmp_path: Path, data: object, name: str = "snap.pickle") -> Path:
    path = tmp_path / name
    with open(path, "wb") as handle:
        pickle.dump(data, handle)
    return path


def test_peak_allocator_view_and_categories_from_a_documented_snapshot(tmp_path):
    view = analyze(load_plain(_write(tmp_path, snapshot_dict())))
    assert view["peak_allocated_bytes"] == 25 * MiB
    assert view["peak_reserved_bytes"] == 64 * MiB
    assert view["reserved_minus_allocated_bytes"] == 39 * MiB
    assert view["fragmentation"] == pytest.approx(1 - 25 / 64)
    assert view["end_allocated_bytes"] == 16 * MiB
    cats = view["categories_at_peak"]
    assert cats == {"parameter": 4 * MiB, "gradient": 4 * MiB, "optimizer_state": 8 * MiB, "activation": 6 * MiB,
                    "temporary": 3 * MiB, "input": 0, "other": 0, "offloaded_host": 0}
    assert [(s["site"], s["bytes"]) for s in view["top_sites"]] == [
        ("train.py:30 in step", 8 * MiB), ("train.py:22 in train_step", 7 * MiB),
        ("train.py:20 in train_step", 6 * MiB), ("train.py:5 in build", 4 * MiB)]


def test_snapshot_without_history_reports_the_dump_state(tmp_path):
    data = snapshot_dict()
    del data["device_traces"]
    view = analyze(load_plain(_write(tmp_path, data)))
    assert view["peak_allocated_bytes"] == 16 * MiB and view["peak_reserved_bytes"] == 64 * MiB
    assert view["trace_entries"] == 0


def test_classify_by_frames():
    assert classify(OPTIM) == "optimizer_state"
    assert classify(BACKWARD) == "temporary" and classify(BACKWARD, held_at_end=True) == "gradient"
    assert classify([_f("??", 0, "torch::autograd::AccumulateGrad::apply")]) == "gradient"
    assert classify(FORWARD) == "activation" and classify(PARAM) == "parameter"
    assert classify([_f(f"{TORCH}/utils/data/_utils/pin_memory.py", 1, "pin_memory")]) == "input"
    assert classify([]) == "other"


def test_import_records_and_an_oom_that_the_recommender_sees(tmp_path):
    result = import_snapshot(_write(tmp_path, snapshot_dict(oom=True)))
    sample = next(r for r in result.records if isinstance(r, MemorySample))
    assert sample.total_bytes == 25 * MiB and sample.reserved_bytes == 64 * MiB
    assert sample.categories["optimizer_state"] == 8 * MiB
    oom = next(r for r in result.records if isinstance(r, Event) and r.name == "oom")
    assert oom.data["requested_bytes"] == 1 << 30
    assert any("no step times" in n for n in result.notes)


def test_cli_import_of_a_snapshot_advises_from_the_oom(tmp_path):
    env = {**os.environ, "ADVISOR_HOME": str(tmp_path / "home")}
    path = _write(tmp_path, snapshot_dict(oom=True))
    out = tmp_path / "r.json"
    proc = subprocess.run([sys.executable, "-m", "advisor", "import", str(path), "--json", str(out)], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(out.read_text())
    assert report["memory"]["peak_bytes"] == 25 * MiB
    assert report["memory"]["categories_at_peak"]["parameter"] == 4 * MiB
    assert report["memory"]["cuda"]["reserved_minus_allocated_bytes"] == 39 * MiB
    assert report["memory"]["oom"]["requested_bytes"] == 1 << 30
    assert report["diagnosis"] is not None  # the recommender advised from what the snapshot holds
    assert any("no step times" in w for w in report["warnings"])


class _Payload:
    """Unpickling this runs os.system(touch MARKER): what a tampered snapshot would carry."""

    def __init__(self, marker: str) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_malicious_pickle_is_refused_and_nothing_runs(tmp_path):
    marker = tmp_path / "pwned"
    data = snapshot_dict()
    data["segments"][0]["blocks"][0]["frames"] = [_Payload(str(marker))]
    path = _write(tmp_path, data, "evil.pickle")
    with pytest.raises(UnsafePickleError, match="refused"):
        load_plain(path)
    assert not marker.exists()
    env = {**os.environ, "ADVISOR_HOME": str(tmp_path / "home")}
    proc = subprocess.run([sys.executable, "-m", "advisor", "import", str(path)], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 3  # an artifact that cannot be read, as an unreadable session
    assert "refused" in proc.stderr and "posix.system" in proc.stderr and "Traceback" not in proc.stderr
    assert not marker.exists()
    assert not (tmp_path / "home" / "sessions").exists() or not any((tmp_path / "home" / "sessions").iterdir())


def test_oversized_snapshot_is_refused_before_reading(tmp_path):
    path = _write(tmp_path, snapshot_dict())
    with pytest.raises(ValueError, match="over the"):
        load_plain(path, max_bytes=100)


@pytest.mark.gpu
def test_real_snapshot_from_dump_snapshot(tmp_path):
    import torch

    torch.cuda.memory._record_memory_history(max_entries=100_000)
    try:
        torch.cuda.reset_peak_memory_stats()
        model = torch.nn.Sequential(torch.nn.Linear(1024, 4096), torch.nn.ReLU(), torch.nn.Linear(4096, 1024)).cuda()
        opt = torch.optim.Adam(model.parameters())
        for _ in range(2):
            loss = model(torch.randn(512, 1024, device="cuda")).square().mean()
            loss.backward()
            opt.step()
            opt.zero_grad()
        torch.cuda.synchronize()
        path = tmp_path / "real.pickle"
        torch.cuda.memory._dump_snapshot(str(path))
        peak = torch.cuda.max_memory_allocated()
    finally:
        torch.cuda.memory._record_memory_history(enabled=None)
    view = analyze(load_plain(path))
    cats = view["categories_at_peak"]
    params = sum(p.numel() * 4 for p in model.parameters())
    assert view["peak_allocated_bytes"] == pytest.approx(peak, rel=0.02)
    assert cats["parameter"] >= params * 0.99
    assert cats["optimizer_state"] >= 2 * params * 0.99  # Adam's exp_avg and exp_avg_sq
    assert cats["activation"] + cats["temporary"] + cats["gradient"] > 0


def test_import_and_diff_never_load_torch(tmp_path):
    """The controller's import path stays torch-free (the FLOPs table is the importer's own)."""
    path = _write(tmp_path, snapshot_dict(oom=True))
    trace = tmp_path / "t.json"
    trace.write_text(json.dumps({"traceEvents": [
        {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#0", "pid": 1, "tid": 1, "ts": 0, "dur": 100},
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 10, "dur": 50,
         "args": {"Input Dims": [[4, 8], [8, 2]], "Input type": ["float", "float"]}}]}))
    code = ("import sys\nfrom advisor.cli import main\n"
            f"assert main(['import', {str(path)!r}, '--name', 'snaponly', '--json', {str(tmp_path / 'a.json')!r}]) == 0\n"
            f"assert main(['import', {str(trace)!r}, {str(path)!r}, '--name', 'combined', '--json', {str(tmp_path / 'b.json')!r}]) == 0\n"
            f"assert main(['diff', 'snaponly', 'combined', '--json', {str(tmp_path / 'd.json')!r}]) == 0\n"
            "print('torch' in sys.modules)\n")
    env = {**os.environ, "ADVISOR_HOME": str(tmp_path / "home")}
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == "False"
    both = json.loads((tmp_path / "b.json").read_text())
    assert both["summary"]["steps"] == 1 and both["memory"]["peak_bytes"] == 25 * MiB
    assert json.loads((tmp_path / "d.json").read_text())["peak_memory"]["abs"] == 0
