"""Fuzzing each importer: Kineto traces and CUDA memory snapshots of any shape (wrong types, 2^70
ids, NaN, nesting past reason, flipped bytes) go through ``advisor import`` and ``advisor report``
in this process under an address-space cap. The result is a session or a one-line refusal (exit
2 or 3, nothing left behind); never a traceback, never memory past the cap."""

from __future__ import annotations

import json
import os
import pickle
import resource
import tempfile
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_failure_fuzz import HUGE_INT, JSON, SCALARS

from advisor.cli import main

pytestmark = pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="RLIMIT_AS as Linux enforces it")

CAP_ABOVE_NOW = 1 << 30  # what the importer may take beyond this process's own address space

NAMES = ["ProfilerStep#0", "ProfilerStep#1", "ProfilerStep#99999999999", "aten::mm", "aten::linear", "aten::add",
         "aten::conv2d", "autograd::engine::evaluate_function: MmBackward0", "Optimizer.step#SGD.step",
         "Optimizer.zero_grad#SGD.zero_grad", "enumerate(DataLoader)#_SingleProcessDataLoaderIter.__next__",
         "[memory]", "c10d::allreduce_", "gloo:all_reduce", "record_param_comms", "ncclDevKernel_AllReduce_Sum_f32",
         "nn.Module: Linear", "advisor::step_boundary", "DistributedDataParallel.forward", "reducer::copy"]
ARG_KEYS = ["Input Dims", "Input type", "Concrete Inputs", "External id", "Total Allocated", "Total Reserved",
            "In msg nelems", "Out msg nelems", "Collective name", "dtype", "Group size", "Process Group Name", "Seq"]
IDS = st.integers(0, 3) | HUGE_INT | st.integers(min_value=2**62, max_value=2**70)
TIMES = st.floats(0, 2000) | st.integers(0, 2000)

EVENT = st.fixed_dictionaries({}, optional={
    "ph": st.sampled_from(["X", "i", "I", "M", "C"]) | JSON, "ts": TIMES | JSON, "dur": TIMES | JSON,
    "name": st.sampled_from(NAMES) | JSON, "tid": IDS | JSON, "pid": IDS,
    "cat": st.sampled_from(["cpu_op", "kernel", "user_annotation", "gpu_memcpy", "python_function"]) | JSON,
    "args": st.dictionaries(st.sampled_from(ARG_KEYS) | st.text(max_size=5), JSON | IDS, max_size=5) | JSON})
TRACE = st.fixed_dictionaries({"traceEvents": st.lists(EVENT, max_size=30)}, optional={
    "distributedInfo": st.fixed_dictionaries({}, optional={"rank": IDS | SCALARS, "world_size": IDS | SCALARS,
                                                           "pg_config": JSON}) | JSON,
    "deviceProperties": st.lists(st.fixed_dictionaries({}, optional={"name": JSON, "id": IDS,
                                                                    "totalGlobalMem": IDS}), max_size=2) | JSON,
    "baseTimeNanoseconds": SCALARS, "record_shapes": SCALARS, "host_name": JSON, "other": JSON})

FRAME = st.fixed_dictionaries({}, optional={
    "filename": st.sampled_from(["/x/torch/optim/adam.py", "train.py", "/x/torch/nn/modules/linear.py"]) | JSON,
    "line": IDS | SCALARS, "name": st.sampled_from(["forward", "backward", "step", "_apply"]) | JSON})
FRAMES = st.lists(FRAME, max_size=4) | JSON
SIZES = st.integers(0, 1 << 20) | IDS | SCALARS
BLOCK = st.fixed_dictionaries({}, optional={
    "address": SIZES, "size": SIZES, "frames": FRAMES,
    "state": st.sampled_from(["active_allocated", "active_pending_free", "inactive"]) | JSON})
SEGMENT = st.fixed_dictionaries({}, optional={"device": st.integers(0, 2) | IDS | SCALARS, "total_size": SIZES,
                                              "blocks": st.lists(BLOCK, max_size=4) | JSON})
ENTRY = st.fixed_dictionaries({}, optional={
    "action": st.sampled_from(["alloc", "free_completed", "free_requested", "segment_alloc", "segment_free",
                               "oom"]) | JSON, "addr": SIZES, "size": SIZES, "frames": FRAMES, "device_free": SIZES})
SNAPSHOT = (st.fixed_dictionaries({"segments": st.lists(SEGMENT, max_size=4) | JSON}, optional={
    "device_traces": st.lists(st.lists(ENTRY, max_size=6), max_size=2) | JSON}) | st.lists(SEGMENT, max_size=3) | JSON)


@contextmanager
def _capped() -> Iterator[None]:
    """This process's soft ``RLIMIT_AS`` at its address space now plus ``CAP_ABOVE_NOW``."""
    with open("/proc/self/status") as status:
        size_kb = next(int(line.split()[1]) for line in status if line.startswith("VmSize:"))
    soft, hard = resource.getrlimit(resource.RLIMIT_AS)
    cap = size_kb * 1024 + CAP_ABOVE_NOW
    resource.setrlimit(resource.RLIMIT_AS, (cap if hard == resource.RLIM_INFINITY else min(cap, hard), hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_AS, (soft, hard))


def _import_and_report(write) -> None:
    """``advisor import`` of the file ``write(path)`` makes, then ``advisor report`` of what it made."""
    previous = os.environ.get("ADVISOR_HOME")
    with tempfile.TemporaryDirectory() as scratch:
        folder = Path(scratch)
        os.environ["ADVISOR_HOME"] = str(folder / "home")
        try:
            path = write(folder)
            with _capped():
                code = main(["import", str(path), "--json", str(folder / "r.json")])
                sessions = folder / "home" / "sessions"
                made = sorted(sessions.iterdir()) if sessions.exists() else []
                if code == 0:
                    [session] = made
                    assert main(["report", str(session), "--json", str(folder / "again.json")]) == 0
                else:  # a one-line refusal (main printed it): nothing left behind
                    assert code in (2, 3) and made == []
        finally:
            if previous is None:
                os.environ.pop("ADVISOR_HOME", None)
            else:
                os.environ["ADVISOR_HOME"] = previous


FUZZ = settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck))


@FUZZ
@given(trace=TRACE, nest=st.sampled_from([0, 0, 0, 50, 5000]), cut=st.none() | st.integers(1, 400))
def test_any_trace_imports_or_is_refused_in_one_line(trace, nest, cut):
    def write(folder: Path) -> Path:
        text = json.dumps(trace)
        if nest:  # an event nested past what any reader follows
            text = text.replace('"traceEvents": [', '"traceEvents": [' + "[" * nest + "]" * nest + ",", 1)
        if cut is not None:
            text = text[:cut]
        path = folder / "trace.json"
        path.write_text(text)
        return path

    _import_and_report(write)


@FUZZ
@given(snapshot=SNAPSHOT, protocol=st.integers(0, pickle.HIGHEST_PROTOCOL),
       flips=st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 255)), max_size=3))
def test_any_snapshot_imports_or_is_refused_in_one_line(snapshot, protocol, flips):
    def write(folder: Path) -> Path:
        data = bytearray(pickle.dumps(snapshot, protocol=protocol))
        for where, value in flips:  # a damaged file: bytes changed anywhere
            data[where % len(data)] = value
        path = folder / "snap.pickle"
        path.write_bytes(bytes(data))
        return path

    _import_and_report(write)
