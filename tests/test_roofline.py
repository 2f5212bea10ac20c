"""recommend/roofline.py verdicts and the report's compute section on recorded data."""

from __future__ import annotations

import subprocess
import sys

import pytest

from advisor.sections.compute import (
    build_compute_section,
    build_ops_section,
    device_fields,
    device_spec_from_state,
    render_compute_section,
)
from advisor.state import LiveState
from advisor.records.samples import Event, OpStat, StepSample
from advisor.recommend.roofline import OpFigures, dtype_key, op_verdict, step_summary

M, K, N = 256, 512, 128
MM_FLOPS = 2 * M * N * K
MM_BYTES = 2 * (M * K + K * N + M * N)
MM_INTENSITY = M * N * K / (M * K + K * N + M * N)


def test_matmul_flips_from_compute_to_memory_bound_when_the_ridge_rises() -> None:
    bandwidth = 1e12
    low = op_verdict(flops=MM_FLOPS, bytes=MM_BYTES, time_s=1e-5, dtype="bfloat16",
                     peak_flops={"bf16": 0.5 * MM_INTENSITY * bandwidth}, bandwidth=bandwidth)
    high = op_verdict(flops=MM_FLOPS, bytes=MM_BYTES, time_s=1e-5, dtype="bfloat16",
                      peak_flops={"bf16": 2.0 * MM_INTENSITY * bandwidth}, bandwidth=bandwidth)
    assert low.intensity == pytest.approx(MM_INTENSITY)
    assert low.bound == "compute" and high.bound == "memory"
    assert low.roof_flops_per_s == pytest.approx(0.5 * MM_INTENSITY * bandwidth)  # the flat roof
    assert high.roof_flops_per_s == pytest.approx(MM_INTENSITY * bandwidth)  # the slope
    assert high.achieved_flops_per_s == pytest.approx(MM_FLOPS / 1e-5)
    assert high.roof_fraction == pytest.approx(MM_FLOPS / 1e-5 / (MM_INTENSITY * bandwidth))


def test_dtype_picks_its_own_peak() -> None:
    peaks = {"bf16": 1000.0, "fp32": 10.0}
    assert dtype_key("torch.bfloat16") == "bf16" and dtype_key("float8_e4m3fn") == "fp8"
    fp32 = op_verdict(flops=100, bytes=10, time_s=1.0, dtype="float32", peak_flops=peaks, bandwidth=1.0)
    bf16 = op_verdict(flops=100, bytes=10, time_s=1.0, dtype="bfloat16", peak_flops=peaks, bandwidth=1.0)
    assert fp32.bound == "compute" and bf16.bound == "memory"  # ridges 10 and 1000, intensity 10


def test_zero_bytes_and_unknown_ceilings() -> None:
    view = op_verdict(flops=0, bytes=0, time_s=1e-6, dtype="float32", peak_flops={"fp32": 1.0}, bandwidth=1.0)
    assert view.intensity is None and view.bound is None
    blind = op_verdict(flops=10, bytes=10, time_s=1.0, dtype="float32", peak_flops={}, bandwidth=None)
    assert blind.intensity == 1.0 and blind.bound is None and blind.achieved_flops_per_s == 10.0


def test_step_summary() -> None:
    ops = [OpFigures(flops=8e9, bytes=1e7, time_s=0.04, dtype="bfloat16"),  # I = 800: compute
           OpFigures(flops=1e7, bytes=1e8, time_s=0.03, dtype="bfloat16"),  # I = 0.1: memory
           OpFigures(flops=1e6, bytes=1e6, time_s=0.01, dtype="float32")]
    s = step_summary(ops, step_time_s=0.1, peak_flops={"bf16": 1e12, "fp32": 1e11}, bandwidth=1e10,
                     mfu_step_time_s=0.08)
    assert s.dominant_dtype == "bf16"
    assert s.achieved_flops_per_s == pytest.approx((8e9 + 1e7 + 1e6) / 0.08)
    assert s.mfu == pytest.approx((8e9 + 1e7 + 1e6) / 0.08 / 1e12)
    assert s.memory_bound_share == pytest.approx(0.04 / 0.1)  # ops 2 and 3 (fp32 ridge 10 > I = 1)
    assert s.unaccounted_share == pytest.approx(0.2)


def _state(device_type: str = "cpu"):
    live = LiveState()
    spec = {"type": device_type, "name": "NVIDIA H200", "peak_flops": {"bf16": 1e12}, "memory_bandwidth": 1e10,
            "memory_capacity": 141 * 10**9, "source": "spec", "spec_peak_flops": {"bf16": 1e12}}
    live.add(Event(name="device_spec", data=spec))
    for index, deep, t in ((0, False, 0.05), (1, False, 0.05), (2, True, 0.1), (3, True, 0.1)):
        live.add(StepSample(index=index, time_s=t, deep=deep))
    for step in (2, 3):
        live.add(OpStat(step=step, name="aten.mm", module="fc", phase="forward", input_shapes=[[M, K], [K, N]],
                        dtype="bfloat16", count=2, flops=2 * MM_FLOPS, bytes=2 * MM_BYTES, time_s=0.04))
        live.add(OpStat(step=step, name="aten.add", module="", phase="forward", input_shapes=[[M, N], [M, N]],
                        dtype="bfloat16", count=1, flops=M * N, bytes=6 * M * N, time_s=0.02))
        live.add(OpStat(step=step, name="aten.view", module="fc", phase="forward", input_shapes=[[M, N]],
                        dtype="bfloat16", count=1, flops=0, bytes=0, time_s=0.001))
    return live.snapshot()


def test_ops_section_averages_per_step_and_sorts_by_time() -> None:
    state = _state()
    spec = device_spec_from_state(state)
    items = build_ops_section(state, spec)
    assert [i["name"] for i in items] == ["aten.mm", "aten.add"]  # the view moves no bytes: left out
    mm = items[0]
    assert set(mm) >= {"name", "module", "input_shapes", "dtype", "count", "flops", "bytes", "intensity",
                       "time_s", "achieved_flops_per_s", "bound", "roof_fraction"}
    # Deep steps took 0.1 s, ordinary ones 0.05 s: op times are shown on the ordinary step's base,
    # the profiled figure beside them.
    assert mm["count"] == 2 and mm["flops"] == 2 * MM_FLOPS and mm["time_s"] == pytest.approx(0.02)
    assert mm["profiled_time_s"] == pytest.approx(0.04)
    assert mm["achieved_flops_per_s"] == pytest.approx(2 * MM_FLOPS / 0.02)
    assert mm["intensity"] == pytest.approx(MM_INTENSITY) and mm["bound"] == "memory"  # ridge 100
    assert items[1]["bound"] == "memory"


def test_cuda_kernel_times_are_not_scaled_by_the_profiled_steps_slowdown() -> None:
    state = _state("cuda")
    mm = build_ops_section(state, device_spec_from_state(state))[0]
    assert mm["time_s"] == mm["profiled_time_s"] == pytest.approx(0.04)  # kernels run as fast under the profiler
    c = build_compute_section(state, device_spec_from_state(state))
    assert c["op_time_base"] == "device kernels"
    assert c["op_time_s"] == pytest.approx(0.061) and c["step_time_s"] == pytest.approx(0.05)  # 0.04 + 0.02 + 0.001


def test_compute_section_and_device_fields() -> None:
    state = _state()
    spec = device_spec_from_state(state)
    c = build_compute_section(state, spec)
    flops = 2 * MM_FLOPS + M * N
    assert c["deep_steps"] == [2, 3] and c["light_step_time_s"] == pytest.approx(0.05)
    assert c["achieved_flops_per_s"] == pytest.approx(flops / 0.05)
    assert c["mfu"] == pytest.approx(flops / 0.05 / 1e12)
    assert c["memory_bound_share"] == pytest.approx(0.6)  # 0.06 s of the 0.1 s deep step
    assert c["unaccounted_share"] == pytest.approx(1 - 0.061 / 0.1)
    assert [m["module"] for m in c["per_module"]] == ["fc", ""]
    assert c["time_base"] == "light step" and c["time_scale"] == pytest.approx(0.5)
    assert c["profiled_step_time_s"] == pytest.approx(0.1) and c["step_time_s"] == pytest.approx(0.05)
    assert c["op_time_s"] == pytest.approx(0.0305) and c["profiled_op_time_s"] == pytest.approx(0.061)
    assert c["per_module"][0]["time_s"] == pytest.approx(0.0205)
    assert c["per_module"][0]["profiled_time_s"] == pytest.approx(0.041)
    dev = device_fields(spec)
    assert dev["peak_flops"] == {"bf16": 1e12} and dev["source"] == "spec" and dev["measured_peak_flops"] is None
    assert len(render_compute_section(build_ops_section(state, spec), c)) == 2


def test_op_times_add_up_to_no_more_than_the_step() -> None:
    """Whatever the profiler's overlap, the ops of a report fit in the step they are shown against."""
    live = LiveState()
    for index, deep, t in ((0, False, 1.0), (1, False, 0.05), (2, True, 0.2), (3, False, 0.06)):
        live.add(StepSample(index=index, time_s=t, deep=deep))
    for i in range(5):  # nested profiler times: 0.3 s of ops in a 0.2 s step
        live.add(OpStat(step=2, name=f"aten.op{i}", module="m", phase="forward", input_shapes=[[4]],
                        dtype="float32", count=1, flops=100, bytes=64, time_s=0.06))
    state = live.snapshot()
    ops = build_ops_section(state, None)
    compute = build_compute_section(state, None)
    # the warm-up step 0 is left out, and step 3 (right after the deep step 2: its teardown)
    assert compute["light_step_time_s"] == pytest.approx(0.05)
    assert sum(o["time_s"] for o in ops) <= compute["light_step_time_s"] * (1 + 1e-9)
    assert sum(m["time_s"] for m in compute["per_module"]) <= compute["step_time_s"] * (1 + 1e-9)
    assert compute["op_time_s"] <= compute["step_time_s"] * (1 + 1e-9)
    assert sum(o["profiled_time_s"] for o in ops) == pytest.approx(0.3)


def test_empty_session() -> None:
    state = LiveState().snapshot()
    assert build_ops_section(state, None) == []
    assert build_compute_section(state, None)["mfu"] is None


def test_roofline_imports_no_torch(repo_root) -> None:
    code = "import sys, advisor.recommend.roofline; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, cwd=repo_root)
    assert out.stdout.strip() == "False"


def test_an_op_above_its_roof_is_flagged_with_the_reason_and_marked_in_every_table() -> None:
    """Peak 1e12 FLOP/s, 1e10 B/s (ridge 100); deep steps 0.1 s, ordinary 0.05 s (scale 0.5).
    An op at 60% of its roof as profiled reads 120% after scaling: the scale is to blame. A
    memory-bound op above its roof as profiled moved fewer DRAM bytes than counted; a
    compute-bound one beat the FLOP/s ceiling."""
    from advisor.report_markdown import report_markdown
    from advisor.tui.views.compute import ops_table

    live = LiveState()
    live.add(Event(name="device_spec", data={"type": "cpu", "name": "cpu", "peak_flops": {"fp32": 1e12},
                                             "memory_bandwidth": 1e10, "source": "measured"}))
    for index, deep, t in ((0, False, 0.05), (1, False, 0.05), (2, True, 0.1)):
        live.add(StepSample(index=index, time_s=t, deep=deep))
    # (name, flops, bytes, profiled time): roofs 1e10 FLOP/s (I = 1), 1e10 (I = 1), 1e12 (I = 1000)
    for name, flops, nbytes, t in (("aten.scaled", 6e7, 6e7, 0.01), ("aten.cached", 3e8, 3e8, 0.02),
                                   ("aten.fast", 3e10, 3e7, 0.02), ("aten.ok", 1e7, 1e7, 0.004)):
        live.add(OpStat(step=2, name=name, module="", phase="forward", input_shapes=[[4]], dtype="float32",
                        count=1, flops=flops, bytes=nbytes, time_s=t))
    state = live.snapshot()
    ops = {op["name"]: op for op in build_ops_section(state, device_spec_from_state(state))}
    assert ops["aten.scaled"]["roof_fraction"] == pytest.approx(1.2)  # 6e7 / 0.005 s / 1e10: kept as computed
    assert (ops["aten.scaled"]["above_roof"], ops["aten.scaled"]["above_roof_reason"]) == (True, "time_scale")
    assert (ops["aten.cached"]["above_roof"], ops["aten.cached"]["above_roof_reason"]) == (True, "cache_reuse")
    assert (ops["aten.fast"]["above_roof"], ops["aten.fast"]["above_roof_reason"]) == (True, "ceiling")
    assert (ops["aten.ok"]["roof_fraction"], ops["aten.ok"]["above_roof"]) == (pytest.approx(0.5), False)
    assert ops["aten.ok"]["above_roof_reason"] is None
    items = list(ops.values())
    table = render_compute_section(items, build_compute_section(state, device_spec_from_state(state)))[1]
    cells = [str(c) for c in table.columns[-1].cells]
    assert sorted(cells) == ["120%*", "300%*", "300%*", "50%"]
    assert "cache" in str(table.caption) and "ceiling" in str(table.caption) and "ordinary step" in str(table.caption)
    markdown = report_markdown({"ops": items, "compute": {}})
    assert "| 120%\\* |" in markdown and "\\* above the roof" in markdown  # "*" escaped in Markdown
    assert "120%*" in list(ops_table(items).columns[-1].cells) and ops_table(items).caption
