"""``advisor check``: every recorded session's report passes it, and it names the field and the
values of each contradiction a reader met in reports before it existed (issue 31)."""

from __future__ import annotations

import copy
import gzip
import json
import statistics
from pathlib import Path

import pytest
import recorded
from checked import assert_consistent

from advisor.check import Breach, check_diff, check_report
from advisor.cli import main
from advisor.report import build_report

RECORDED = sorted(p.name[: -len(".jsonl.gz")] for p in recorded.DATA.glob("*.jsonl.gz"))


@pytest.fixture(scope="module")
def ddp() -> dict:
    return build_report(recorded.load_state("ddp"))


def _fields(breaches: list[Breach]) -> set[str]:
    return {b.field for b in breaches}


@pytest.mark.parametrize("name", RECORDED)
def test_every_recorded_session_passes(name: str) -> None:
    assert RECORDED == ["ddp", "gpt", "gpt_h100", "oom"]  # a new recording is checked too
    assert_consistent(build_report(recorded.load_state(name)), name)


def test_the_diagnosis_quoting_another_statistic_is_named(ddp: dict) -> None:
    """A mean exposed time over a median step (87% beside a comm table's 69%)."""
    report = copy.deepcopy(ddp)
    row = report["comm"][0]
    row["exposed_s"] *= 1.3
    row["exposed_share"] = row["exposed_s"] / row["step_time_s"]
    lines = [b.line() for b in check_report(report)]
    assert any(line.startswith("diagnosis.evidence: the diagnosis's 'exposed collective time / step time'")
               and "comm[rank 0].exposed_share=" in line for line in lines), lines


def test_a_mean_step_where_the_median_of_ordinary_steps_is_due_is_named(ddp: dict) -> None:
    report = copy.deepcopy(ddp)
    mean = statistics.fmean(s["time_s"] for s in report["steps"] if s["rank"] == 1)
    report["comm"][1]["step_time_s"] = mean
    report["straggler"]["per_rank_step_time_s"]["1"] = mean
    assert {"comm[1].step_time_s", "straggler.per_rank_step_time_s.1", "comm[1].exposed_share"} <= _fields(
        check_report(report))


def test_shares_above_one_and_exposed_beyond_comm_or_step_are_named(ddp: dict) -> None:
    report = copy.deepcopy(ddp)
    row = report["comm"][1]
    row["exposed_s"] = row["step_time_s"] * 1.01  # summed concurrent calls: 22.3 ms in a 21.8 ms step
    row["exposed_share"] = 1.01
    fields = _fields(check_report(report))
    assert {"comm[1].exposed_share", "comm[1].exposed_s"} <= fields
    report = copy.deepcopy(ddp)
    report["ops"][0]["roof_fraction"], report["ops"][0]["above_roof"] = 1.5, False
    assert "ops[0].roof_fraction" in _fields(check_report(report))
    report["ops"][0]["above_roof"] = True  # flagged above the roof: allowed
    assert "ops[0].roof_fraction" not in _fields(check_report(report))


def test_ops_and_exposed_communication_beyond_the_step_are_named(ddp: dict) -> None:
    report = copy.deepcopy(ddp)
    report["compute"]["op_time_s"] = report["compute"]["step_time_s"] - report["comm"][0]["exposed_s"] / 2
    [breach] = [b for b in check_report(report) if b.field == "compute.op_time_s"]
    assert "exposed communication" in breach.message and "comm[rank 0].exposed_s" in breach.values


def test_phases_that_do_not_add_up_to_their_step_are_named(ddp: dict) -> None:
    report = copy.deepcopy(ddp)
    report["steps"][3]["phases"]["backward_s"] += 0.5
    report["summary"]["phase_mean_s"]["forward_s"] *= 2
    report["summary"]["phase_fraction"]["forward"] = 0.5  # not what phase_share says, nor summing to 1
    assert {"steps[3].phases", "summary.phase_mean_s", "summary.phase_fraction",
            "summary.phase_fraction.forward"} <= _fields(check_report(report))


def test_the_diff_phases_summing_past_their_step_are_named() -> None:
    change = {"a": 0.3, "b": 0.3, "abs": 0.0, "rel": 0.0}
    diff = {"schema": "advisor.diff/1", "mean_step_time": {"a": 0.681, "b": 0.681, "abs": 0.0, "rel": 0.0},
            "phases": {k: change for k in ("data_s", "forward_s", "backward_s", "optimizer_s", "other_s")}}
    assert _fields(check_diff(diff)) == {"phases.a", "phases.b"}
    assert _fields(check_report(diff)) == {"phases.a", "phases.b"}


def test_memory_that_does_not_add_up_or_a_peak_left_out_is_named(ddp: dict) -> None:
    report = copy.deepcopy(ddp)
    report["memory"]["categories_at_peak"]["activation"] = report["memory"]["peak_bytes"] + 10
    fields = _fields(check_report(report))
    assert {"memory.categories_at_peak", "memory.categories_at_peak.activation",
            "memory.categories_max.activation"} <= fields
    report = copy.deepcopy(ddp)
    report["memory"].update(peak_bytes=None, categories_at_peak={})
    report["steps"][0]["peak_memory_bytes"] = 23_000_000  # "Memory at peak: —" beside a 22.1 MiB step
    [breach] = [b for b in check_report(report) if b.field == "memory.peak_bytes"]
    assert breach.values["max(steps[].peak_memory_bytes)"] == 23_000_000


def test_a_compute_step_that_is_not_the_ordinary_step_is_named(ddp: dict) -> None:
    report = copy.deepcopy(ddp)
    report["compute"]["step_time_s"] = report["compute"]["profiled_step_time_s"]
    assert "compute.step_time_s" in _fields(check_report(report))


def _apply_report(kind_after: str = "light", after_time: float | None = None) -> dict:
    steps = [{"index": i, "rank": 0, "time_s": t, "deep": i in (1, 2, 5, 6), "phases": {"other_s": t}}
             for i, t in enumerate((1.0, 0.5, 0.5, 0.10, 0.12, 0.4, 0.4, 0.05, 0.07, 0.06))]
    after = {"step_time_s": after_time if after_time is not None else statistics.fmean((0.05, 0.07, 0.06)),
             "time_steps": [7, 8, 9] if kind_after == "light" else [5, 6], "step_kind": kind_after,
             "peak_memory_bytes": None, "peak_steps": []}
    before = {"step_time_s": 0.11, "time_steps": [3, 4], "step_kind": "light", "peak_memory_bytes": None,
              "peak_steps": []}
    return {"schema": "advisor.report/1", "steps": steps, "summary": {"steps_dropped": 0},
            "applied": [{"remedy": "dataloader", "rank": 0, "at_step": 5, "status": "kept",
                         "predicted": {"step_time_s": 0.06, "peak_memory_bytes": None},
                         "measured": {"before": before, "after": after}}]}


def test_an_apply_timed_on_other_steps_or_with_another_statistic_is_named() -> None:
    assert check_report(_apply_report()) == []
    median = statistics.median((0.05, 0.07, 0.06)) + 0.001
    [breach] = check_report(_apply_report(after_time=median))
    assert breach.field == "applied[0].measured.after.step_time_s" and "mean" in breach.message
    fields = _fields(check_report(_apply_report(kind_after="deep", after_time=0.4)))
    assert "applied[0].measured.after.step_kind" in fields  # deep after light: not comparable


def test_cli_exit_codes_and_one_line_per_breach(tmp_path, ddp: dict, capsys) -> None:
    good = tmp_path / "good.json"
    good.write_text(json.dumps(ddp))
    assert main(["check", str(good)]) == 0
    assert capsys.readouterr().out.strip() == f"{good}: consistent"
    report = copy.deepcopy(ddp)
    report["comm"][0]["exposed_share"] = 1.5
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps(report))
    assert main(["check", str(bad)]) == 1
    lines = capsys.readouterr().out.splitlines()
    assert lines and all(line.startswith(f"{bad}: ") for line in lines)
    assert any("comm[0].exposed_share: a share must lie in [0, 1] (comm[0].exposed_share=1.5)" in line
               for line in lines), lines
    bad.unlink()  # not left for the after-test check
    for name, text in (("notjson.json", "{"), ("other.json", '{"schema": "x"}')):
        path = tmp_path / name
        path.write_text(text)
        assert main(["check", str(path)]) == 2
        assert "advisor: error:" in capsys.readouterr().err
    assert main(["check", str(tmp_path / "missing.json")]) == 2


def test_recorded_data_files_are_the_ones_the_readme_lists() -> None:
    listed = (recorded.DATA / "README.md").read_text()
    for name in RECORDED:
        assert f"`{name}.jsonl.gz`" in listed
        with gzip.open(recorded.DATA / f"{name}.jsonl.gz", "rt") as handle:
            assert json.loads(handle.readline())["kind"] == "meta"


def test_the_checker_is_torch_free() -> None:
    import subprocess
    import sys

    code = "import sys, advisor.check; assert 'torch' not in sys.modules and 'rich' not in sys.modules"
    proc = subprocess.run([sys.executable, "-c", code], cwd=Path(__file__).resolve().parents[1],
                          capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr


def _phase_report(phase: str, steps: list[tuple[float, float]]) -> dict:
    """The report of one rank's steps, each (time, seconds of ``phase``), the rest forward."""
    from advisor.records.samples import StepSample
    from advisor.state import LiveState

    live = LiveState(session_id=phase)
    for index, (time_s, spent) in enumerate(steps):
        live.add(StepSample(index=index, time_s=time_s, end_time=100.0 + index,
                            phases={phase: spent, "forward_s": time_s - spent}))
    return build_report(live.snapshot())


def test_a_data_wait_share_that_is_not_the_median_over_the_median_is_named() -> None:
    """The input rule quotes the median data wait over the median ordinary step; the ddp report's
    "also: input: 6%" stood beside a phase table of mean fractions (8.9%), and nothing checked it."""
    report = _phase_report("data_s", [(0.5, 0.1), (0.1, 0.05), (0.1, 0.04), (0.12, 0.06), (0.1, 0.05)])
    evidence = {e["what"]: e for e in report["diagnosis"]["evidence"]}
    assert report["diagnosis"]["bottleneck"] == "input"
    assert evidence["data wait / step time"]["value"] == pytest.approx(0.05 / 0.1)
    assert check_report(report) == []
    wrong = copy.deepcopy(report)
    for item in wrong["diagnosis"]["evidence"]:
        if item["what"] == "data wait / step time":
            item["value"] = 0.45  # a mean of ratios, say
    assert [b.field for b in check_report(wrong)] == ["diagnosis.evidence"]


def test_an_optimizer_share_that_is_not_the_median_over_the_median_is_named() -> None:
    """The optimizer-step rule quotes the median optimizer phase over the median ordinary step,
    the statistic of the input rule's share; nothing checked it."""
    report = _phase_report("optimizer_s", [(0.5, 0.1), (0.1, 0.05), (0.1, 0.04), (0.12, 0.07), (0.1, 0.05)])
    evidence = {e["what"]: e for e in report["diagnosis"]["evidence"]}
    assert evidence["optimizer step / step time"]["value"] == pytest.approx(0.05 / 0.1)
    assert check_report(report) == []
    wrong = copy.deepcopy(report)
    for item in wrong["diagnosis"]["evidence"]:
        if item["what"] == "optimizer step / step time":
            item["value"] = round(statistics.fmean(o / t for t, o in [(0.1, 0.05), (0.1, 0.04), (0.12, 0.07),
                                                                     (0.1, 0.05)]), 4)  # a mean of ratios
    assert [b.line().split(":")[0] for b in check_report(wrong)] == ["diagnosis.evidence"]


def test_a_host_gap_quoting_other_op_times_than_the_compute_section_is_named() -> None:
    """The host-overhead rule's 'op time per deep step' is the compute section's profiled op time."""
    from advisor.records.samples import OpStat, StepSample
    from advisor.state import LiveState

    live = LiveState(session_id="host")
    for index in range(8):
        time_s = 0.4 if index == 3 else 0.1
        live.add(StepSample(index=index, time_s=time_s, deep=index == 3, end_time=100.0 + index,
                            phases={"forward_s": time_s / 2, "backward_s": time_s / 2}))
    live.add(OpStat(step=3, name="aten.addmm", module="fc", phase="forward", count=1, flops=10**6, bytes=10**5,
                    time_s=0.02, dtype="float32"))
    report = build_report(live.snapshot())
    evidence = {e["what"]: e for e in report["diagnosis"]["evidence"]}
    assert evidence["op time per deep step"]["value"] == pytest.approx(report["compute"]["profiled_op_time_s"])
    assert check_report(report) == []
    wrong = copy.deepcopy(report)
    wrong["compute"]["profiled_op_time_s"] *= 1.5
    wrong["compute"]["profiled_step_time_s"] *= 1.5
    assert "diagnosis's 'op time per deep step'" in " ".join(b.line() for b in check_report(wrong))


def test_an_fp32_matmul_time_that_is_not_the_ops_sections_is_named() -> None:
    """The compute rule's 'fp32 matmul/conv time per step' is the fp32 matmul rows of ``ops`` as
    profiled (kernel times on CUDA)."""
    from advisor.records.samples import Event, OpStat, StepSample
    from advisor.state import LiveState

    live = LiveState(session_id="matmul")
    live.add(Event(name="device_spec", data={"type": "cuda", "name": "H100", "peak_flops": {"fp32": 5e13, "tf32": 4e14},
                                             "memory_bandwidth": 3e12}))
    for index in range(6):
        live.add(StepSample(index=index, time_s=0.1, deep=index == 2, end_time=100.0 + index,
                            phases={"forward_s": 0.05, "backward_s": 0.05}))
    for k in range(3):  # 3 x 25 ms of a 100 ms step, each 1e12 FLOP in 25 ms: 80% of the fp32 roof
        live.add(OpStat(step=2, name="aten.mm", module=f"fc{k}", phase="forward", count=1, flops=10**12,
                        bytes=10**8, time_s=0.025, dtype="float32"))
    report = build_report(live.snapshot())
    evidence = {e["what"]: e for e in report["diagnosis"]["evidence"]}
    assert evidence["fp32 matmul/conv time per step"]["value"] == pytest.approx(0.075)
    assert check_report(report) == []
    wrong = copy.deepcopy(report)
    wrong["ops"][0]["profiled_time_s"] *= 1.2
    assert "'fp32 matmul/conv time per step'" in " ".join(b.line() for b in check_report(wrong))
