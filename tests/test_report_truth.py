"""The contradictions a new user met in a report (issue 31), each with the figure that now holds.

Each test fails on the code before the fix: the figures below are the ones that disagreed.
"""

from __future__ import annotations

import copy
import io
import re
import statistics
from pathlib import Path

import pytest
import recorded
from checked import assert_consistent
from rich.console import Console

from advisor.apply.executor import decide
from advisor.diff import compute_diff
from advisor.diff_render import print_diff
from advisor.exits import stop_note
from advisor.phrases import predicted_step
from advisor.records.results import Measurement
from advisor.records.samples import CollectiveStat, MemorySample, StepSample
from advisor.records.units import fmt_rate
from advisor.render import print_report
from advisor.report import build_report
from advisor.report_blocks import report_sections
from advisor.report_markdown import report_markdown
from advisor.sections.comm import build_comm_section
from advisor.sections.compute import time_base_note
from advisor.state import LiveState
from advisor.tui.view_model import rank_rows

ROOT = Path(__file__).resolve().parents[1]
PHASES = ("data_s", "forward_s", "backward_s", "optimizer_s", "other_s")


def _text(report: dict) -> str:
    out = io.StringIO()
    print_report(report, Console(file=out, width=200, color_system=None))
    return out.getvalue()


def _concurrent_calls_state() -> LiveState:
    """Two DDP buckets in flight together each step: 46 ms each, exposed 44 and 46 ms, in a
    70 ms step. Summed, the exposed time (90 ms) exceeded the step."""
    live = LiveState(session_id="c")
    for index in range(6):
        end = 100.0 + index
        live.add(StepSample(index=index, time_s=0.070, end_time=end, deep=index == 1, phases={"other_s": 0.070}))
        begin = end - 0.070
        for offset, exposed in ((0.0128, 0.044), (0.0144, 0.046)):
            live.add(CollectiveStat(step=index, op="all_reduce", group_size=2, bytes=1 << 20, start=begin + offset,
                                    time_s=0.046, exposed_s=exposed))
    return live


def test_concurrent_calls_never_expose_more_than_their_step() -> None:
    state = _concurrent_calls_state().snapshot()
    [row] = build_comm_section(state)
    # In flight from 12.8 ms to 60.4 ms of the step: 47.6 ms; the exposed parts cannot exceed it.
    assert row["comm_s"] == pytest.approx(0.0476)
    assert row["exposed_s"] == pytest.approx(0.0476) and row["exposed_share"] <= 1.0
    [ranks] = rank_rows(state, [row])  # the TUI's Ranks view: exposed within the median step
    assert ranks.exposed_comm_s <= ranks.median_step_s
    assert_consistent(build_report(state))


def test_the_summary_names_its_fractions_and_seconds_apart() -> None:
    summary = build_report(recorded.load_state("ddp"))["summary"]
    assert set(summary["phase_fraction"]) == {"data", "forward", "backward", "optimizer", "other"}
    assert sum(summary["phase_fraction"].values()) == pytest.approx(1.0)
    assert sum(summary["phase_mean_s"].values()) == pytest.approx(summary["mean_step_s"])
    assert summary["phase_share"]["backward_s"] == summary["phase_fraction"]["backward"]  # kept, deprecated


def _diff_states() -> tuple:
    states = []
    for slow in (6.9, 7.2):  # a job of seconds per step: "6943.274 ms" in the diff before
        live = LiveState(session_id=f"s{slow}")
        for index, t in enumerate((9.0, slow, slow, 0.681 * slow, 3 * slow)):
            live.add(StepSample(index=index, time_s=t, phases={"forward_s": t / 3, "backward_s": 2 * t / 3}))
        states.append(live.snapshot())
    return states


def test_the_diff_phases_add_up_to_the_step_row_they_sit_under() -> None:
    a, b = _diff_states()
    diff = compute_diff(a, build_report(a), b, build_report(b))
    for side in ("a", "b"):
        total = sum(diff["phases"][k][side] for k in PHASES)
        assert total == pytest.approx(diff["mean_step_time"][side])
        assert total > diff["step_time"][side]  # the median is not the step they split
    assert_consistent(diff, "diff")
    out = io.StringIO()
    print_diff(diff, Console(file=out, width=160, color_system=None))
    text = out.getvalue()
    assert "step (mean)" in text and "forward (mean)" in text
    assert "6.90 s" in text and not re.search(r"\d\.\d{3} ms", text)


def test_the_profiled_slowdown_is_the_ratio_of_the_figures_printed_beside_it() -> None:
    # time_scale (a mean of per-step ratios) said 1.4x; the figures shown say 247 / 82.6 = 3.0x.
    compute = {"time_base": "light step", "op_time_base": "scaled by time_scale", "time_scale": 1 / 1.4,
               "step_time_s": 0.0826, "profiled_step_time_s": 0.247, "profiled_op_time_s": 0.239}
    note = time_base_note(compute)
    assert "3.0x slower" in note and "82.6 ms" in note and "247 ms" in note


def test_a_session_without_a_tracker_shows_the_peak_its_steps_carry() -> None:
    live = LiveState(session_id="imported")
    for index, peak in enumerate((20 << 20, 23_200_000, 21 << 20)):
        live.add(StepSample(index=index, time_s=0.1, peak_memory_bytes=peak))
    report = build_report(live.snapshot())
    memory = report["memory"]
    assert (memory["peak_bytes"], memory["peak_step"], memory["peak_source"]) == (23_200_000, 1, "steps")
    assert memory["categories_at_peak"] == {} and memory["categories_max"] == {}
    assert_consistent(report)
    text, markdown = _text(report), report_markdown(report)
    assert "Memory at peak: 22.1 MiB (step 1)" in text and "## Memory at peak: 22.1 MiB (step 1)" in markdown
    assert "0 B" not in text and "no breakdown by category" in markdown
    live.add(MemorySample(step=1, time=0.0, categories={"activation": 5}, total_bytes=5))
    assert build_report(live.snapshot())["memory"]["peak_source"] == "tracked"


def test_keep_and_revert_reasons_speak_the_report_units_and_the_remedy_purpose() -> None:
    # A DataLoader remedy: faster steps, a peak 100 bytes lower. It was kept "because the peak went
    # down from 7.75e-05 GiB to 7.74e-05 GiB".
    keep, reason = decide(before=Measurement(peak_memory_bytes=83_200, step_time_s=0.140),
                          after=Measurement(peak_memory_bytes=83_100, step_time_s=0.034),
                          predicted=Measurement(step_time_s=0.030), budget_bytes=None, baseline_step_time_s=0.135)
    assert keep and reason.startswith("step time 34.0 ms (was 140 ms), within the limit")
    keep, reason = decide(before=Measurement(peak_memory_bytes=34 << 20, step_time_s=0.2),
                          after=Measurement(peak_memory_bytes=63_650_000, step_time_s=0.2),
                          predicted=Measurement(peak_memory_bytes=20 << 20, step_time_s=0.25),
                          budget_bytes=54_100_000, baseline_step_time_s=0.2)
    assert not keep and reason == "peak 60.7 MiB exceeds the budget 51.6 MiB"
    keep, reason = decide(before=Measurement(peak_memory_bytes=100, step_time_s=0.1198),
                          after=Measurement(peak_memory_bytes=100, step_time_s=0.01905),
                          predicted=Measurement(), budget_bytes=None)
    assert keep and reason == "step time 19.1 ms (was 120 ms), within the limit 150 ms (the step before +25%)"
    for text in (reason,):
        assert "GiB" not in text and "e-0" not in text and not re.search(r"\d\.\d{4}", text)


def test_bus_bandwidth_reads_the_same_in_the_report_and_the_tui() -> None:
    from advisor.tui.views.comm import bandwidth

    report = build_report(recorded.load_state("ddp"))
    busbw = max(r["busbw"] for r in report["collectives"] if r["busbw"])
    assert bandwidth(busbw) == fmt_rate(busbw) == "2.29 GB/s"
    assert "2.29 GB/s" in _text(report) and "2.29 GB/s" in report_markdown(report)


def _with_everything(report: dict) -> dict:
    """A recorded report plus an applied remedy, two regimes and a warning: every section."""
    out = copy.deepcopy(report)
    out["applied"] = [{"remedy": "activation_checkpointing", "recommendation_id": "checkpoint-blocks-4",
                       "rank": 0, "at_step": 5, "status": "kept", "reason": "peak 19.7 MiB fits the budget 22.9 MiB",
                       "error": None, "predicted": {"peak_memory_bytes": 20_683_616, "step_time_s": 0.25},
                       "measured": {"before": {}, "after": {"peak_memory_bytes": 20_683_616, "step_time_s": 0.212,
                                                            "step_kind": "light", "time_steps": []}}}]
    out["regimes"] = [{"label": label, "first_step": first, "last_step": last, "steps": last - first + 1,
                       "peak_bytes": peak, "step_time_s": 0.2, "step_time_steps": 2, "profiled_step_time_s": None,
                       "top_ops": [{"name": "aten.mm", "module": "blocks.0", "phase": "forward", "time_s": 0.01}],
                       "top_modules": [{"name": "blocks.0", "activation_bytes": 1 << 20, "light_forward_s": 0.001}]}
                      for label, first, last, peak in (("before any remedy", 0, 4, 34 << 20),
                                                       ("after activation_checkpointing", 5, 19, 20 << 20))]
    out["warnings"] = ["a warning"]
    return out


@pytest.mark.parametrize("name", ["ddp", "oom", "gpt"])
def test_markdown_has_every_section_the_text_report_has(name: str) -> None:
    report = _with_everything(build_report(recorded.load_state(name)))
    titles = [b.title for s in report_sections(report) for b in s.blocks if b.title]
    text, markdown = _text(report), report_markdown(report)
    headings = [line.split(" ", 1)[1] for line in markdown.splitlines() if line.startswith("## ")]
    assert markdown.startswith(f"# advisor report: {titles[0]}")
    assert headings == titles[1:]
    for title in titles:
        assert title in text, title
    assert {"Applied remedies", "Recommendations", "Warnings"} <= set(headings) or name != "ddp"
    if name == "ddp":
        assert {"Collectives", "Communication per step", "Straggler: rank 0"} <= set(headings)
    assert any(h.startswith("The job before and after each remedy") for h in headings)
    assert "| activation_checkpointing | 5 | kept |" in markdown  # an applied remedy, by name


def test_a_ddp_header_names_its_model_once() -> None:
    text = _text(build_report(recorded.load_state("ddp")))
    models = [line for line in text.splitlines() if "model MLP" in line]
    assert len(models) == 1 and "on 2 ranks" in models[0]


def test_the_accumulation_step_says_it_is_a_micro_batch() -> None:
    report = build_report(recorded.load_state("ddp"))
    [rec] = [r for r in report["recommendations"] if r["remedy"] == "grad_accumulation"]
    assert predicted_step(rec) == "10.8 ms per micro-batch (1 of 4)"
    assert "10.8 ms per micro-batch (1 of 4)" in _text(report) and "per micro-batch" in report_markdown(report)


def test_a_job_that_completed_is_never_reported_as_stopped() -> None:
    note = "; the user stopped the job from the TUI (q, then s)"
    assert stop_note(0, "stopped after 200 steps (--steps)", note) == "stopped after 200 steps (--steps)"
    assert stop_note(143, "terminated by SIGTERM", note).endswith(note)


def test_the_quickstart_never_asks_for_more_steps_than_its_example_runs() -> None:
    readme = (ROOT / "README.md").read_text()
    found = re.findall(r"advisor attach [^\n]*?--steps (\d+)[^\n]*?(examples/\w+\.py)([^\n]*)", readme)
    assert found
    for steps, example, script_args in found:
        own = re.search(r"--steps (\d+)", script_args)
        default = re.search(r'add_argument\("--steps", type=int, default=(\d+)\)', (ROOT / example).read_text())
        limit = int(own.group(1)) if own else int(default.group(1))
        assert int(steps) <= limit, (steps, example)


def test_every_step_time_of_the_recorded_reports_is_a_median_of_ordinary_steps() -> None:
    report = build_report(recorded.load_state("ddp"))
    for rank in (0, 1):
        mine = [s for s in report["steps"] if s["rank"] == rank]
        deep = {s["index"] for s in mine if s["deep"]}
        light = [s["time_s"] for s in mine if s["index"] > 0 and not s["deep"] and s["index"] - 1 not in deep]
        assert report["comm"][rank]["step_time_s"] == statistics.median(light)
        assert report["straggler"]["per_rank_step_time_s"][str(rank)] == statistics.median(light)


def test_ops_and_exposed_communication_fit_in_the_ordinary_step() -> None:
    """A DDP run read 19.1 ms of ops beside 11.7 ms of exposed communication in a 22.7 ms step:
    the probes slow the computation, not the wait for the other rank."""
    from advisor.records.samples import OpStat

    live = LiveState(session_id="fit")
    for index in range(6):
        deep = index == 2
        time_s = 0.100 if deep else 0.0227
        live.add(StepSample(index=index, time_s=time_s, end_time=100.0 + index, deep=deep, phases={"other_s": time_s}))
        live.add(CollectiveStat(step=index, op="all_reduce", group_size=2, bytes=1 << 20,
                                start=100.0 + index - 0.0120, time_s=0.0117, exposed_s=0.0117))
    live.add(OpStat(step=2, name="aten.mm", phase="forward", count=1, flops=1e6, bytes=1e5, time_s=0.080,
                    dtype="float32"))
    report = build_report(live.snapshot())
    compute, [row] = report["compute"], report["comm"]
    assert row["exposed_s"] == pytest.approx(0.0117)
    assert compute["op_time_s"] + row["exposed_s"] == pytest.approx(compute["step_time_s"])  # 0.227 x 80 ms did not fit
    assert compute["time_scale"] == pytest.approx((0.0227 - 0.0117) / 0.080)
    assert_consistent(report)


def test_ops_and_exposed_communication_fit_in_the_profiled_step_when_no_light_step_was_timed() -> None:
    """A 4-step 2-rank run (the zoo's smoke ddp_tutorial) had no light step: steps 1-3 were deep,
    the profiled step was the base, and its ops plus the exposed communication outgrew it."""
    from advisor.records.samples import OpStat

    live = LiveState(session_id="short")
    for index in range(4):
        live.add(StepSample(index=index, time_s=0.020, end_time=100.0 + index, deep=index > 0,
                            phases={"other_s": 0.020}))
        live.add(CollectiveStat(step=index, op="all_reduce", group_size=2, bytes=1 << 20,
                                start=100.0 + index - 0.010, time_s=0.008, exposed_s=0.008))
    for step in (1, 2, 3):
        live.add(OpStat(step=step, name="aten.mm", phase="forward", count=1, flops=1e6, bytes=1e5, time_s=0.018,
                        dtype="float32"))
    report = build_report(live.snapshot())
    compute, [row] = report["compute"], report["comm"]
    assert compute["time_base"] == "profiled step"
    assert compute["op_time_s"] + row["exposed_s"] == pytest.approx(compute["step_time_s"])  # 18 + 8 ms in 20
    assert_consistent(report)


def test_without_a_light_step_the_compute_step_is_the_median_the_comm_section_reads() -> None:
    """CI's zoo smoke ddp_tutorial (steps 1-3 deep, 24.8, 7.2 and 2.3 ms): the ops' own profiled
    step (2.3 ms, step 3) was the compute section's step, beside the comm row's median exposed
    time of steps 1-3, which outgrew it: ops squeezed to nothing and still over the step."""
    from advisor.records.samples import OpStat

    live = LiveState(session_id="short")
    for index, (time_s, exposed) in enumerate([(0.013, 0.001), (0.0248, 0.004), (0.0072, 0.003), (0.0023, 0.001)]):
        live.add(StepSample(index=index, time_s=time_s, end_time=100.0 + index, deep=index > 0,
                            phases={"other_s": time_s}))
        live.add(CollectiveStat(step=index, op="all_reduce", group_size=2, bytes=1 << 20,
                                start=100.0 + index - exposed, time_s=exposed, exposed_s=exposed))
    live.add(OpStat(step=3, name="aten.mm", phase="forward", count=1, flops=1e6, bytes=1e5, time_s=0.0012,
                    dtype="float32"))
    report = build_report(live.snapshot())
    compute, [row] = report["compute"], report["comm"]
    assert compute["time_base"] == "profiled step"
    assert compute["step_time_s"] == pytest.approx(row["step_time_s"]) == pytest.approx(0.0072)
    assert row["exposed_s"] == pytest.approx(0.003)
    assert compute["op_time_s"] == pytest.approx(0.0012)  # fits beside the exposed 3 ms: not scaled
    assert_consistent(report)


@pytest.mark.parametrize("inline", [False, True])
def test_ops_timed_inside_the_counting_mode_are_not_scaled_by_its_slowdown(inline) -> None:
    """Issue 37: a step of too many ops for a profiled step of their own keeps the counting step's
    inline op times. Each is the op's own run: scaled by the counting step's 8.6x slowdown, 423 ms
    of ops read as 49 ms of a 353 ms step and the diagnosis blamed host overhead."""
    from advisor.records.samples import OpStat
    from advisor.recommend.rules.host_overhead import host_gap
    from advisor.advice import profile_of_state

    live = LiveState(session_id="inline")
    for index in range(8):
        deep = index == 2
        k = 3.0 / 0.35 if deep else 1.0
        live.add(StepSample(index=index, time_s=3.0 if deep else 0.35, deep=deep,
                            phases={"forward_s": 0.1 * k, "backward_s": 0.2 * k, "optimizer_s": 0.05 * k}))
    for k in range(4):
        live.add(OpStat(step=2, name="aten.addmm", module=f"m{k}", input_shapes=[[8, 16]], dtype="float32",
                        count=100, flops=10**6, bytes=10**5, time_s=0.075, inline=inline))
    state = live.snapshot()
    report = build_report(state)
    compute = report["compute"]
    if inline:
        assert compute["op_time_base"] == "timed inside the counting mode"
        assert compute["op_time_s"] == pytest.approx(0.3)  # as timed: it fits in the 350 ms step
        assert "timed inside the counting mode" in time_base_note(compute)
        assert host_gap(profile_of_state(state)) is None  # 300 of 350 ms: no host gap
    else:
        assert compute["op_time_base"] == "scaled by time_scale"
        assert compute["op_time_s"] == pytest.approx(0.3 * 0.35 / 3.0)
    assert_consistent(report)
