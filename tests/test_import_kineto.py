"""``advisor import`` of Kineto traces made by torch.profiler on the CPU in the test itself."""

from __future__ import annotations

import gzip
import importlib.util
import json
import os
import subprocess
import sys
import tracemalloc
from pathlib import Path

import pytest

from advisor.importers.jsonstream import StreamError
from advisor.importers.kineto import import_traces, public_op
from advisor.importers.kineto_read import read_trace
from advisor.records.samples import CollectiveStat, OpStat, StepSample

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "tests" / "scripts" / "profiled_train.py"


def _script():
    spec = importlib.util.spec_from_file_location("profiled_train", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def trace_dir(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("trace")
    _script().train(str(out), steps=5, width=64, batch=32)
    return out


def _events(path: Path) -> list[dict]:
    return json.loads(path.read_text())["traceEvents"]


def _steps(records) -> list[StepSample]:
    return sorted((r for r in records if isinstance(r, StepSample)), key=lambda s: (s.rank, s.index))


def test_steps_and_phases_come_from_the_trace_annotations(trace_dir):
    path = trace_dir / "rank0.json"
    events = _events(path)
    result = import_traces([path])
    steps = _steps(result.records)
    assert [s.index for s in steps] == [0, 1, 2, 3, 4]
    spans = {int(e["name"].split("#")[1]): e["dur"] for e in events if e["name"].startswith("ProfilerStep#")}
    optimizer = sorted((e["ts"], e["dur"]) for e in events if e["name"].startswith("Optimizer.step#"))
    # Timestamps near 1e12 us keep about 1 ns once ends are computed as ts + dur: compare to 10 ns.
    ns10 = 1e-8
    for sample, (_, opt_dur) in zip(steps, optimizer):
        assert sample.time_s == pytest.approx(spans[sample.index] / 1e6, abs=ns10)
        assert sum(sample.phases.values()) == pytest.approx(sample.time_s, abs=ns10)
        assert sample.phases["optimizer_s"] == pytest.approx(opt_dur / 1e6, abs=ns10)
        assert sample.phases["forward_s"] > 0 and sample.phases["backward_s"] > 0 and sample.phases["data_s"] > 0


def test_ops_carry_self_time_and_flops_from_recorded_shapes(trace_dir):
    result = import_traces([trace_dir / "rank0.json"])
    addmm = [o for o in result.records if isinstance(o, OpStat) and o.name == "aten.addmm" and o.step == 2]
    # Two Linear layers, batch 32: 64 -> 128 -> 10; FLOPs 2MKN + MN (bias) each.
    assert sorted(o.flops for o in addmm) == sorted([2 * 32 * 64 * 128 + 32 * 128, 2 * 32 * 128 * 10 + 32 * 10])
    assert all(o.phase == "forward" and o.count == 1 and o.dtype == "float32" for o in addmm)
    # aten::linear encloses aten::addmm: its FLOPs are counted once, at addmm.
    linear = [o for o in result.records if isinstance(o, OpStat) and o.name == "aten.linear" and o.step == 2]
    assert linear and all(o.flops == 0 for o in linear)
    backward_mm = [o for o in result.records if isinstance(o, OpStat) and o.name == "aten.mm" and o.step == 2]
    assert backward_mm and all(o.phase == "backward" and o.flops > 0 for o in backward_mm)
    durations = [e["dur"] for e in _events(trace_dir / "rank0.json") if e["name"] == "aten::addmm"]
    assert all(0 < o.time_s <= max(durations) / 1e6 for o in addmm)


def test_gzipped_trace_imports_the_same(trace_dir, tmp_path):
    gz = tmp_path / "rank0.json.gz"
    gz.write_bytes(gzip.compress((trace_dir / "rank0.json").read_bytes()))
    plain = import_traces([trace_dir / "rank0.json"]).records
    zipped = import_traces([gz]).records
    assert [s.to_dict() for s in _steps(plain)] == [s.to_dict() for s in _steps(zipped)]


def _write_trace(path: Path, events: list[dict], **meta) -> None:
    path.write_text(json.dumps({"schemaVersion": 1, **meta, "traceEvents": events}))


def _op(name, ts, dur, tid=1, **args):
    return {"ph": "X", "cat": "cpu_op", "name": name, "pid": 1, "tid": tid, "ts": ts, "dur": dur, "args": args}


def test_events_with_missing_or_overflowed_timestamps_are_skipped_and_counted(tmp_path):
    events = [
        {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#0", "pid": 1, "tid": 1, "ts": 0, "dur": 1000},
        _op("aten::mm", 10, 100, **{"Input Dims": [[4, 8], [8, 2]], "Input type": ["float", "float"]}),
        {"ph": "X", "cat": "cpu_op", "name": "aten::add", "pid": 1, "tid": 1, "dur": 5},  # no ts
        _op("aten::mul", 200, 18446744073709551.0),  # an overflowed (unsigned) duration
        _op("aten::mul", 1e19, 5),  # an overflowed timestamp
        _op("aten::mul", "NaN", 5),
    ]
    path = tmp_path / "t.json"
    _write_trace(path, events)
    result = import_traces([path])
    assert result.summary["skipped_events"] == 4
    assert any("4 event(s)" in note for note in result.notes)
    ops = [o for o in result.records if isinstance(o, OpStat)]
    assert [(o.name, o.flops) for o in ops] == [("aten.mm", 2 * 4 * 8 * 2)]


def test_imported_records_pass_the_same_intake_as_live_ones(tmp_path):
    """A NaN base time made every record's time NaN: the import showed its steps, a later report
    none, and --json crashed after the session was made. An op of 2^121 FLOPs was stored, then
    dropped with a warning by every later read. Now both are handled before anything is stored."""
    events = [
        {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#0", "pid": 1, "tid": 1, "ts": 0, "dur": 1000},
        _op("aten::mm", 10, 100, **{"Input Dims": [[4, 8], [8, 2]], "Input type": ["float", "float"]}),
        _op("aten::mm", 300, 100, **{"Input Dims": [[2**40, 2**40], [2**40, 2**40]], "Input type": ["float"] * 2}),
    ]
    path = tmp_path / "t.json"
    path.write_text(json.dumps({"schemaVersion": 1, "baseTimeNanoseconds": float("nan"), "traceEvents": events}))
    env = {**os.environ, "ADVISOR_HOME": str(tmp_path / "home")}
    run = lambda *args: subprocess.run([sys.executable, "-m", "advisor", *args], cwd=ROOT, env=env,
                                       capture_output=True, text=True, timeout=120)
    imported = run("import", str(path), "--json", str(tmp_path / "r.json"))
    assert imported.returncode == 0, imported.stderr[-2000:]
    first = json.loads((tmp_path / "r.json").read_text())
    assert first["summary"]["steps"] == 1
    assert any("1 record(s) with impossible values were left out" in w and "flops" in w for w in first["warnings"])
    [session] = (tmp_path / "home" / "sessions").iterdir()
    later = run("report", str(session), "--json", str(tmp_path / "later.json"))
    assert later.returncode == 0, later.stderr[-2000:]
    again = json.loads((tmp_path / "later.json").read_text())
    assert again["summary"]["steps"] == 1  # what was stored reads back whole
    assert not any("dropped while loading" in w for w in again["warnings"])


def _rank_trace(path: Path, rank: int, world: int) -> Path:
    events = [{"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#0", "pid": 1, "tid": 1, "ts": 0,
               "dur": 1000}, _op("aten::mul", 10, 100)]
    _write_trace(path, events, distributedInfo={"backend": "gloo", "rank": rank, "world_size": world})
    return path


def test_one_jobs_traces_from_several_nodes_import_together_and_other_jobs_are_refused(tmp_path):
    """A multi-node job leaves each node's ranks' traces on that node: given together, they make one
    session of every rank; traces whose world sizes differ are of different jobs and are refused."""
    node0 = [_rank_trace(tmp_path / f"r{r}.json", r, 4) for r in (0, 1)]
    node1 = [_rank_trace(tmp_path / f"r{r}.json", r, 4) for r in (2, 3)]
    result = import_traces(node0 + node1)
    assert sorted({s.rank for s in _steps(result.records)}) == [0, 1, 2, 3]
    assert not any("have no trace here" in note for note in result.notes)
    partial = import_traces(node0)
    assert any("2 of 4 ranks have no trace here (ranks 2, 3)" in note for note in partial.notes)
    other = _rank_trace(tmp_path / "other.json", 2, 8)
    with pytest.raises(ValueError, match="world of 4 ranks .* one of 8: traces of different jobs"):
        import_traces(node0 + [other])
    with pytest.raises(ValueError, match="says rank 5 of a world of 4"):
        import_traces([_rank_trace(tmp_path / "bad.json", 5, 4)])


def test_a_truncated_trace_is_one_clear_error(tmp_path, trace_dir):
    path = tmp_path / "cut.json"
    path.write_bytes((trace_dir / "rank0.json").read_bytes()[:5000])
    with pytest.raises(StreamError):
        read_trace(path)


def test_large_trace_is_streamed_in_bounded_memory(tmp_path):
    """A trace many times larger than what the reader holds: tracemalloc's peak stays far below it."""
    path = tmp_path / "big.json"
    n = 120_000
    with open(path, "w") as handle:
        handle.write('{"schemaVersion": 1, "traceEvents": [\n')
        handle.write(json.dumps({"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#0", "pid": 1,
                                 "tid": 1, "ts": 0, "dur": n * 10 + 10}))
        pad = "x" * 200  # Kineto events carry long args; this stands for them
        for i in range(n):
            handle.write(",\n" + json.dumps(_op("aten::add" if i % 2 else "aten::mul", 1 + i * 10, 5,
                                                **{"Input Dims": [[64, 64], [64, 64]], "Input type": ["float"] * 2,
                                                   "Ev Idx": i, "Concrete Inputs": ["", ""], "pad": pad})))
        handle.write('\n], "traceName": "big"}')
    size = path.stat().st_size
    tracemalloc.start()
    try:
        trace = read_trace(path)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert trace.events == n + 1 and len(trace.op_ts) == n
    assert size > 40e6
    # Loading it whole would take several times its size; the reader keeps ~40 bytes per op.
    assert peak < size / 5, f"peak {peak} bytes for a {size}-byte trace"


def test_collective_names_map_to_the_probe_ops():
    assert public_op("c10d::allreduce_") == "all_reduce"
    assert public_op("gloo:all_reduce") == "all_reduce"
    assert public_op("nccl:_reduce_scatter_base") == "reduce_scatter"
    assert public_op("ncclDevKernel_AllGather_RING_LL(ncclDevComm*, unsigned long, ncclWork*)") == "all_gather"
    assert public_op("ncclKernel_AllReduce_RING_LL_Sum_float(ncclWorkElem)") == "all_reduce"
    assert public_op("aten::add") is None


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _torchrun(out: Path, *extra: str) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port",
            str(_free_port()), *extra, str(SCRIPT), "--out", str(out), "--steps", "4"]


@pytest.mark.slow
def test_two_gloo_ranks_import_with_collectives_and_straggler(tmp_path):
    out = tmp_path / "traces"
    out.mkdir()
    subprocess.run(_torchrun(out), check=True, cwd=ROOT, capture_output=True, timeout=240)
    result = import_traces(sorted(out.glob("rank*.json")))
    steps = _steps(result.records)
    assert sorted({(s.rank, s.index) for s in steps}) == [(r, i) for r in (0, 1) for i in range(4)]
    calls = [c for c in result.records if isinstance(c, CollectiveStat) and c.op == "all_reduce"]
    params = 64 * 128 + 128 + 128 * 10 + 10
    # DDP: one bucket per step, the gradients' bytes, on each of the 2 ranks.
    assert sorted((c.rank, c.step) for c in calls) == [(r, i) for r in (0, 1) for i in range(4)]
    assert all(c.bytes == 4 * params and c.group_size == 2 and c.dtype == "float32" for c in calls)
    assert all(0 <= c.exposed_s <= c.time_s for c in calls)
    from advisor.report import build_report
    from advisor.state import LiveState

    live = LiveState()
    for record in result.records:
        live.add(record)
    report = build_report(live.snapshot())
    assert report["straggler"] is not None and report["straggler"]["matched_calls"] >= 4
    assert {row["rank"] for row in report["comm"]} == {0, 1}


def test_cli_import_makes_a_session_with_notes_and_advice(trace_dir, tmp_path):
    env = {**os.environ, "ADVISOR_HOME": str(tmp_path / "home")}
    out = tmp_path / "report.json"
    proc = subprocess.run([sys.executable, "-m", "advisor", "import", str(trace_dir), "--name", "mine",
                           "--json", str(out)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(out.read_text())
    assert report["summary"]["steps"] == 5
    assert any("no per-module activation" in w and "no checkpointing" in w for w in report["warnings"])
    assert "diagnosis" in report and report["run"]["script"].endswith("rank0.json")
    sessions = list((tmp_path / "home" / "sessions").iterdir())
    assert len(sessions) == 1 and "-mine-" in sessions[0].name
    again = subprocess.run([sys.executable, "-m", "advisor", "report", sessions[0].name, "--json", str(tmp_path / "r2.json")],
                           cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)
    assert again.returncode == 0, again.stderr
    assert json.loads((tmp_path / "r2.json").read_text())["summary"]["steps"] == 5


def test_cli_refuses_bad_files_and_creates_no_session(tmp_path):
    env = {**os.environ, "ADVISOR_HOME": str(tmp_path / "home")}
    bad = tmp_path / "bad.json"
    bad.write_text('{"traceEvents": [{"ph": "X", "ts": 1,')
    other = tmp_path / "notes.txt"
    other.write_text("hello")
    # An artifact that cannot be read is exit 3 (as an unreadable session); a wrong argument 2.
    for args, code in (([str(bad)], 3), ([str(other)], 2), ([str(tmp_path / "missing.json")], 2)):
        proc = subprocess.run([sys.executable, "-m", "advisor", "import", *args], cwd=ROOT, env=env,
                              capture_output=True, text=True, timeout=120)
        assert proc.returncode == code, proc.stderr
        assert proc.stderr.startswith("advisor: error: ") and "Traceback" not in proc.stderr
    assert not (tmp_path / "home" / "sessions").exists() or not any((tmp_path / "home" / "sessions").iterdir())


def _steady_median(samples: list[StepSample]) -> float:
    import statistics

    return statistics.median(s.time_s for s in samples if s.index > 0)


TOLERANCE = 0.05  # relative: the step time and every phase


@pytest.mark.slow
def test_import_matches_an_attach_session_of_the_same_run(tmp_path):
    """The script profiles itself while the advisor's agent records it: same steps, and the step
    time and each phase within 5%.

    What lines the two up (issue 15): the agent marks its own step-boundary work when the script
    profiles itself (``advisor::step_boundary``, inside the trace's ``Optimizer.step`` span) and
    the importer leaves it out of the step, as the agent's session does; and the importer's data
    phase is everything before the first forward op, as the agent counts it. Measured on a quiet
    machine (2026-11-24), width 1024 and batch 512 (steps of about 45 ms): step 0.999-1.001, data
    0.985, forward 1.007-1.009, backward 0.983-0.987, optimizer 1.021-1.030. What is left is a
    fixed 0.1-0.2 ms per boundary (the hooks' dispatch, the autograd engine's start, inside one
    phase in the trace and the next in the agent): with steps of 10 ms (width 512, batch 256)
    forward reads 1.04, backward 0.94 and optimizer 1.06-1.08, so the test runs steps whose
    phases are several ms long.

    The two agree on the boundary work because it is small: the channel sends records in batches
    from its own thread, so no step pays a thread hand-off for its record (with a send per record
    the optimizer phase read 5-40% apart)."""
    # One run that another process preempts inside the agent's boundary work reads apart (the
    # trace counts it, the agent does not): a miss is run again once, as other load-bound tests do.
    misses = _trace_against_attach(tmp_path / "first")
    if misses:
        misses = _trace_against_attach(tmp_path / "second")
    assert not misses, misses


@pytest.mark.slow
def test_two_gloo_ranks_phases_match_the_attach_session(tmp_path):
    """The same comparison under `advisor attach --nproc-per-node 2` (DDP on gloo), every rank:
    measured 2026-11-24, step 1.000, data 0.98, forward 1.003-1.005, backward 0.995-0.996,
    optimizer 1.004-1.006."""
    misses = _trace_against_attach(tmp_path / "first", ranks=2)
    if misses:
        misses = _trace_against_attach(tmp_path / "second", ranks=2)
    assert not misses, misses


def _trace_against_attach(folder, ranks: int = 1) -> list[str]:
    """Attach the self-profiling script; the figures that differ from its trace by more than TOLERANCE."""
    folder.mkdir()
    out = folder / "traces"
    report_path = folder / "attach.json"
    env = {**os.environ, "ADVISOR_HOME": str(folder / "home")}
    launch = ["--nproc-per-node", str(ranks)] if ranks > 1 else []
    proc = subprocess.run([sys.executable, "-m", "advisor", "attach", "--headless", *launch, "--probes", "none",
                           "--json", str(report_path), str(SCRIPT), "--out", str(out), "--steps", "8",
                           "--width", "1024", "--batch", "512"],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    attach = json.loads(report_path.read_text())
    every = _steps(import_traces(sorted(out.glob("rank*.json"))).records)
    assert sorted({s.rank for s in every}) == list(range(ranks))
    return [f"rank {rank}: {miss}" for rank in range(ranks)
            for miss in _misses([s for s in every if s.rank == rank],
                                {s["index"]: s for s in attach["steps"] if s["rank"] == rank})]


def _misses(imported: list[StepSample], live: dict[int, dict]) -> list[str]:
    """The step time and phases of one rank that differ by more than TOLERANCE."""
    assert sorted(live) == [s.index for s in imported]
    steady = [s for s in imported if s.index > 0]
    misses = []
    ratio = sum(s.time_s for s in steady) / sum(live[s.index]["time_s"] for s in steady)
    if abs(ratio - 1.0) > TOLERANCE:
        misses.append(f"step time ratio {ratio:.3f}")
    for phase in ("data_s", "forward_s", "backward_s", "optimizer_s"):
        mine = sum(s.phases[phase] for s in steady)
        theirs = sum(live[s.index]["phases"][phase] for s in steady)
        if abs(mine - theirs) > TOLERANCE * theirs:
            misses.append(f"{phase}: trace {mine:.4f} s, attach {theirs:.4f} s")
    return misses


def test_gpu_trace_kernel_times_nccl_exposure_and_memory_peaks(tmp_path):
    """A hand-written CUDA trace: op time is its kernels' time, an NCCL call's time is its kernel's,
    exposed where no other kernel runs; peak memory per step from [memory] events."""
    mm_args = {"Input Dims": [[256, 512], [512, 1024]], "Input type": ["c10::BFloat16"] * 2, "External id": 7}
    events = [
        {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#3", "pid": 1, "tid": 1, "ts": 1000, "dur": 1000},
        {"ph": "X", "cat": "user_annotation", "name": "Optimizer.step#SGD.step", "pid": 1, "tid": 1, "ts": 1800,
         "dur": 100},
        _op("aten::mm", 1100, 20, **mm_args),
        _op("c10d::allreduce_", 1500, 10, **{"Input Dims": [[[1024, 1024]], [], [], [], [], []],
                                             "Input type": ["TensorList", "", "", "", "Scalar", "Scalar"],
                                             "External id": 9}),
        {"ph": "X", "cat": "cpu_op", "name": "record_param_comms", "pid": 1, "tid": 1, "ts": 1502, "dur": 5,
         "args": {"Collective name": "allreduce", "Group size": 4, "Process Group Name": "0", "Seq": 5,
                  "In msg nelems": 1024 * 1024, "Out msg nelems": 1024 * 1024, "dtype": "Float"}},
        {"ph": "X", "cat": "kernel", "name": "ampere_bf16_gemm", "pid": 0, "tid": 7, "ts": 1130, "dur": 400,
         "args": {"External id": 7, "device": 0}},
        {"ph": "X", "cat": "kernel", "name": "ncclDevKernel_AllReduce_Sum_f32_RING_LL(ncclDevComm*)", "pid": 0,
         "tid": 20, "ts": 1510, "dur": 200, "args": {"External id": 9, "device": 0}},
        {"ph": "i", "s": "t", "name": "[memory]", "pid": 1, "tid": 1, "ts": 1200,
         "args": {"Total Allocated": 5_000_000, "Total Reserved": 8_000_000, "Device Type": 1}},
        {"ph": "i", "s": "t", "name": "[memory]", "pid": 1, "tid": 1, "ts": 1300,
         "args": {"Total Allocated": 7_000_000, "Total Reserved": 8_000_000, "Device Type": 1}},
        {"ph": "i", "s": "t", "name": "[memory]", "pid": 1, "tid": 1, "ts": 2500,  # after the step
         "args": {"Total Allocated": 9_000_000, "Total Reserved": 9_000_000, "Device Type": 1}},
    ]
    path = tmp_path / "gpu.json"
    _write_trace(path, events, baseTimeNanoseconds=1_700_000_000_000_000_000, record_shapes=1,
                 distributedInfo={"backend": "nccl", "rank": 1, "world_size": 4},
                 deviceProperties=[{"id": 0, "name": "NVIDIA H100", "totalGlobalMem": 80 << 30}])
    result = import_traces([path])
    (step,) = _steps(result.records)
    assert (step.rank, step.index, step.peak_memory_bytes) == (1, 3, 7_000_000)
    assert step.phases["optimizer_s"] == pytest.approx(100e-6)
    (mm,) = [o for o in result.records if isinstance(o, OpStat)]
    assert mm.time_s == pytest.approx(400e-6) and mm.dtype == "bfloat16"
    assert mm.flops == 2 * 256 * 512 * 1024 and mm.bytes == 2 * (256 * 512 + 512 * 1024 + 256 * 1024)
    (call,) = [c for c in result.records if isinstance(c, CollectiveStat)]
    assert (call.op, call.group_size, call.bytes, call.dtype, call.step) == ("all_reduce", 4, 4 * 1024 * 1024, "float32", 3)
    assert call.time_s == pytest.approx(200e-6)
    assert call.exposed_s == pytest.approx(180e-6)  # the gemm covers 1510..1530
    assert call.start == pytest.approx(1_700_000_000 + 1500e-6)
    (seq,) = [r for r in result.records if getattr(r, "name", "") == "collective_seq"]
    assert (seq.rank, seq.step, seq.data["calls"]) == (1, 3, [{"op": "all_reduce", "group": "0", "seq": 5,
                                                               "start": call.start}])
    run = next(r for r in result.records if type(r).__name__ == "RunInfo")
    assert run.device["type"] == "cuda" and run.device["name"] == "NVIDIA H100" and run.world_size == 4


@pytest.mark.slow
def test_two_gloo_ranks_import_the_same_collectives_as_attach(tmp_path):
    """Under `advisor attach --nproc-per-node 2`, the script's own traces import to the all-reduces
    the agent's comm probe recorded: same ranks, steps, sizes and group size."""
    out = tmp_path / "traces"
    report_path = tmp_path / "attach.json"
    env = {**os.environ, "ADVISOR_HOME": str(tmp_path / "home")}
    proc = subprocess.run([sys.executable, "-m", "advisor", "attach", "--headless", "--nproc-per-node", "2",
                           "--probes", "comm", "--json", str(report_path), str(SCRIPT), "--out", str(out),
                           "--steps", "4"], cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    attach = json.loads(report_path.read_text())
    imported = import_traces(sorted(out.glob("rank*.json"))).records

    def rows(items):
        return sorted((r["rank"], r["op"], r["group_size"], r["bytes"], r["count"]) for r in items
                      if r["op"] == "all_reduce")

    from advisor.report import build_report
    from advisor.state import LiveState

    live = LiveState()
    for record in imported:
        live.add(record)
    mine = build_report(live.snapshot())
    assert rows(mine["collectives"]) == rows(attach["collectives"])
    assert rows(mine["collectives"]) == [(r, "all_reduce", 2, 4 * (64 * 128 + 128 + 128 * 10 + 10), 4) for r in (0, 1)]
    assert sorted((s["rank"], s["index"]) for s in mine["steps"]) == sorted(
        (s["rank"], s["index"]) for s in attach["steps"])


def test_the_advisors_own_boundary_work_and_the_loop_before_forward(tmp_path):
    """A trace made under `advisor attach` marks the agent's step-boundary work
    (advisor::step_boundary, inside Optimizer.step): it is left out of the step and of the
    optimizer phase, as the agent's session leaves it out. Data is everything before the first
    forward op (the loop's own work too), as the agent counts it."""
    def span(name, ts, dur, cat="user_annotation"):
        return {"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": 1, "ts": ts, "dur": dur}

    events = [
        span("ProfilerStep#0", 0, 1000),
        span("enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__", 0, 100),
        _op("aten::mm", 150, 100, **{"Input Dims": [[4, 8], [8, 2]], "Input type": ["float", "float"]}),
        _op("autograd::engine::evaluate_function: MmBackward0", 400, 200),
        span("Optimizer.step#AdamW.step", 700, 250),
        span("advisor::step_boundary", 700, 20),
        span("advisor::step_boundary", 900, 50),
    ]
    path = tmp_path / "t.json"
    _write_trace(path, events)
    [step] = _steps(import_traces([path]).records)
    assert step.time_s == pytest.approx(930e-6)  # 1000 us less the agent's 70 us
    assert step.phases["optimizer_s"] == pytest.approx(180e-6)
    assert step.phases["data_s"] == pytest.approx(150e-6)  # the loader's 100 us and the loop's 50 before forward
    assert step.phases["forward_s"] == pytest.approx(250e-6)  # 150 to the first backward op at 400
    assert step.phases["backward_s"] == pytest.approx(200e-6)
    assert sum(step.phases.values()) == pytest.approx(step.time_s)
