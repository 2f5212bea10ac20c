"""``advisor fit``'s controller side, torch-free: roofline times, fixed costs, the verdict and the plan."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
from recorded import load_state

from advisor.fit_costs import CUBLAS_WORKSPACE_DEFAULT, NCCL_COMMUNICATOR_BYTES, fixed_costs
from advisor.fit_report import build_fit_report, model_state, render_fit_report, write_fit_plan
from advisor.fit_times import collective_seconds, op_seconds, roofline_step, with_roofline_times
from advisor.probes.memory.cuda import allocator_block_bytes
from advisor.recommend.remedies import check_params
from advisor.records.fit import MIB, TARGETS, FitSettings
from advisor.records.plan import read_plan
from advisor.records.samples import CollectiveStat, OpStat

H100 = {"peak_flops": {"bf16": 989e12, "fp32": 67e12}, "memory_bandwidth": 3.35e12}


def test_the_allocator_hands_out_512_byte_blocks() -> None:
    assert [allocator_block_bytes(n) for n in (1, 511, 512, 513, 4 * 2**20)] == [512, 512, 512, 1024, 4 * 2**20]


def test_an_op_takes_the_longer_of_its_flops_and_its_bytes_at_the_roof() -> None:
    matmul = OpStat(step=2, name="aten.mm", dtype="bfloat16", flops=989 * 10**12, bytes=10**9)
    copy = OpStat(step=2, name="aten.add", dtype="float32", flops=10**6, bytes=335 * 10**9)
    assert op_seconds(matmul, H100["peak_flops"], H100["memory_bandwidth"]) == pytest.approx(1.0)
    assert op_seconds(copy, H100["peak_flops"], H100["memory_bandwidth"]) == pytest.approx(0.1)


def test_a_collective_moves_its_bus_bytes_over_nvlink_or_the_network() -> None:
    fit = FitSettings(target="h100", nproc_per_node=8, nnodes=2)
    inside = CollectiveStat(step=1, op="all_reduce", group_size=8, bytes=10**9)
    across = replace(inside, group_size=16)
    link, network = TARGETS["h100"].link_bandwidth, TARGETS["h100"].network_bandwidth
    assert collective_seconds(inside, fit) == pytest.approx(2 * 7 / 8 * 1e9 / link)
    assert collective_seconds(across, fit) == pytest.approx(2 * 15 / 16 * 1e9 / network)
    assert collective_seconds(inside, FitSettings(target="cpu")) is None


def test_collectives_longer_than_the_backward_pass_are_exposed() -> None:
    state = load_state("gpt")
    step = roofline_step(state, H100, FitSettings(target="h100", nproc_per_node=8))
    assert step.counted_step is not None and step.compute_s > 0 and step.collectives_s == 0.0
    huge = CollectiveStat(rank=0, step=step.counted_step, op="all_reduce", group_size=8, bytes=10**12)
    state.collectives.append(huge)
    timed = roofline_step(state, H100, FitSettings(target="h100", nproc_per_node=8))
    assert timed.exposed_s == pytest.approx(timed.collectives_s - timed.by_phase["backward_s"])
    retimed = with_roofline_times(state, timed)
    assert [s.time_s for s in retimed.rank0_steps()] == [timed.step_s] * len(retimed.rank0_steps())
    assert retimed.collectives[-1].time_s == pytest.approx(timed.collectives_s)
    blocks = [m for m in retimed.modules if m.name == "blocks.0"]
    assert blocks and all(m.forward_s > 0 and m.backward_s > 0 for m in blocks)


def test_fixed_costs_are_said_measured_or_assumed() -> None:
    assert fixed_costs(FitSettings(target="cpu"), [8]) == []
    h100 = fixed_costs(FitSettings(target="h100", nproc_per_node=8), [8, 1])
    assert [c.source for c in h100] == ["measured", "assumed", "assumed"]
    assert h100[1].bytes == 2 * 32 * MIB and h100[2].bytes == NCCL_COMMUNICATOR_BYTES
    a100 = fixed_costs(FitSettings(target="a100-80gb"), [])
    assert [c.name for c in a100] == ["CUDA context and libraries", "cuBLAS workspaces"]
    assert a100[1].bytes == 2 * CUBLAS_WORKSPACE_DEFAULT


def test_fit_settings_refuse_unknown_targets_and_give_torchruns_environment() -> None:
    with pytest.raises(ValueError, match="unknown target 'x'"):
        FitSettings(target="x")
    assert FitSettings(target="h100").environment() == {}
    env = FitSettings(target="h100", nproc_per_node=8, nnodes=2).environment()
    assert (env["RANK"], env["WORLD_SIZE"], env["LOCAL_WORLD_SIZE"]) == ("0", "16", "8")


def test_a_job_over_its_budget_gets_the_recommenders_plan(tmp_path: Path) -> None:
    """On a recorded CPU session of examples/gpt.py: a budget under its peak gives a plan file
    ``advisor attach --plan`` reads; the plan's prediction is under the budget."""
    state = load_state("gpt")
    peak = max(s.total_bytes for s in state.memory)
    fits = build_fit_report(state, fit=FitSettings(target="cpu"), budget_bytes=2 * peak)
    assert fits["verdict"]["fits"] is True and fits["plan"] is None
    report = build_fit_report(state, fit=FitSettings(target="cpu"), budget_bytes=int(peak * 0.8))
    assert report["verdict"]["fits"] is False and report["verdict"]["predicted_bytes"] == peak
    assert report["memory"]["model_state"] == model_state(state)
    plan = report["plan"]
    assert plan["recommendation"] is not None and plan["predicted_bytes"] <= int(peak * 0.8)
    path = write_fit_plan(report, str(tmp_path / "plan.json"))
    assert path is not None
    assert read_plan(path, check=check_params).remedies[0].remedy == plan["recommendation"]["remedy"]
    text = render_fit_report(report)
    assert "does not fit" in text and "roofline estimate" in text and "plan:" in text
