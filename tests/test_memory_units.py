"""Budget parsing, the NVML wrapper's failure states, and the report section on recorded data."""

from __future__ import annotations

import types

import pytest

from advisor.records.samples import StepSample
from advisor.trace import memory_trace_events

from advisor.sections.memory import (
    MAX_TIMELINE_POINTS,
    build_memory_section,
    render_memory_section,
)
from advisor.state import SessionState
from advisor.records.units import parse_size
from advisor.probes.device.nvml import Nvml
from advisor.probes.memory.oom import requested_bytes_from_message
from advisor.records.samples import MEMORY_CATEGORIES, Event, MemorySample, ModuleStat


@pytest.mark.parametrize(
    "text,expected",
    [("12GiB", 12 * 2**30), ("800MiB", 800 * 2**20), ("1.5GB", 1_500_000_000), ("123", 123), ("2 g", 2 * 2**30)],
)
def test_parse_size(text, expected):
    assert parse_size(text) == expected


@pytest.mark.parametrize("text", ["", "GiB", "12 parsecs", "-5MiB", "1.2.3"])
def test_parse_size_rejects_with_the_valid_units(text):
    with pytest.raises(ValueError, match="GiB"):
        parse_size(text)


class _NVMLError(Exception):
    pass


def _fake_nvml(*, init_fails=False, count=1, mem_fails=False):
    info = types.SimpleNamespace(used=5 * 2**30)
    proc = types.SimpleNamespace(pid=42, usedGpuMemory=3 * 2**30)

    def init():
        if init_fails:
            raise _NVMLError("Driver Not Loaded")

    def mem(handle):
        if mem_fails:
            raise _NVMLError("Not Supported")
        return info

    return types.SimpleNamespace(
        nvmlInit=init,
        nvmlDeviceGetCount=lambda: count,
        nvmlDeviceGetHandleByIndex=lambda i: ("h", i),
        nvmlDeviceGetHandleByUUID=lambda u: (_ for _ in ()).throw(_NVMLError("bad uuid")),
        nvmlDeviceGetMemoryInfo=mem,
        nvmlDeviceGetComputeRunningProcesses=lambda h: [proc],
    )


def test_nvml_four_states():
    def missing():
        raise ImportError("no pynvml")

    gone = Nvml(missing)
    assert gone.device_used_bytes(0) is None and gone.status == "package missing"
    no_driver = Nvml(lambda: _fake_nvml(init_fails=True))
    assert no_driver.process_used_bytes(0, 42) is None and no_driver.status.startswith("no driver")
    assert Nvml(lambda: _fake_nvml(count=0)).device_used_bytes(0) is None
    unsupported = Nvml(lambda: _fake_nvml(mem_fails=True))
    assert unsupported.device_used_bytes(0) is None
    assert unsupported.process_used_bytes(0, 42, "GPU-x") == 3 * 2**30  # other fields still work
    assert Nvml(lambda: _fake_nvml()).device_used_bytes(0) == 5 * 2**30


def test_requested_bytes_from_cuda_message():
    assert requested_bytes_from_message("Tried to allocate 20.00 MiB (GPU 0)") == 20 * 2**20
    assert requested_bytes_from_message("something else") is None


def _sample(step: int, t: float, cats: dict[str, int]) -> MemorySample:
    full = {c: cats.get(c, 0) for c in MEMORY_CATEGORIES}
    return MemorySample(step=step, time=t, event="op", categories=full, total_bytes=sum(full.values()))


def test_section_keeps_the_peak_when_downsampling_and_exports_counters():
    samples = [_sample(1, i * 1e-4, {"parameter": 100, "temporary": i % 97}) for i in range(5000)]
    samples.append(_sample(1, 0.6, {"parameter": 100, "activation": 1000, "gradient": 7}))
    state = SessionState(memory=samples)
    state.modules = [
        ModuleStat(step=1, name="a", activation_bytes=10),
        ModuleStat(step=2, name="a", activation_bytes=30),
        ModuleStat(step=2, name="b", activation_bytes=20),
        ModuleStat(rank=1, step=2, name="c", activation_bytes=99),
    ]
    state.events = [Event(step=2, name="module_activations", data={"inclusive_bytes": {"a": 35}})]
    section = build_memory_section(state, budget_bytes=2000)
    assert section["peak_bytes"] == 1107
    assert section["categories_at_peak"]["activation"] == 1000
    assert sum(section["categories_at_peak"].values()) == section["peak_bytes"]
    assert section["categories_max"]["temporary"] == 96
    assert len(section["timeline"]) <= MAX_TIMELINE_POINTS
    assert max(p["total_bytes"] for p in section["timeline"]) == 1107
    assert [m["name"] for m in section["modules"]] == ["a", "b"]  # rank 0, latest step
    assert section["modules"][0]["activation_bytes"] == 30
    assert section["modules"][0]["activation_inclusive_bytes"] == 35
    assert section["oom"] is None and "cuda" not in section
    state.steps = {0: [StepSample(index=1, time_s=1.0, end_time=1000.0)]}
    events = memory_trace_events(state)
    assert len(events) == len(samples) and all(e["ph"] == "C" for e in events)
    assert events[-1]["args"]["activation"] == 1000
    # The counters share the steps' clock: epoch microseconds from the step's start.
    assert events[-1]["ts"] == pytest.approx((999.0 + 0.6) * 1e6)
    assert len(render_memory_section(section)) == 2


def test_section_reports_the_oom_and_renders_it():
    state = SessionState(
        events=[Event(step=3, name="oom", data={"op": "aten.mm", "module": "fc", "categories": {"parameter": 5}})]
    )
    section = build_memory_section(state, budget_bytes=None)
    assert section["oom"]["module"] == "fc" and section["oom"]["step"] == 3
    assert section["peak_bytes"] is None
    assert len(render_memory_section(section)) == 2  # the breakdown and the OOM panel
