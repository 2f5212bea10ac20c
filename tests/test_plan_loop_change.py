"""``advisor plan`` on a multi-rank job whose top recommendation is a pipeline (restart class):
it prints the per-rank training-loop change instead of writing a plan it could not apply."""

from __future__ import annotations

from test_host_link_option import _stored

from advisor.cli import main


def test_plan_prints_the_pipeline_loop_change(tmp_path, capsys) -> None:
    folder = _stored("ddp")  # two gloo ranks; under 8 MB per rank only a 2-stage pipeline fits
    out = tmp_path / "plan.json"
    assert main(["plan", str(folder), "-o", str(out), "--memory-budget", "8MB"]) == 0
    captured = capsys.readouterr()
    assert "schedule.step(x)" in captured.out and "pipeline(model" in captured.out
    assert "SplitPoint.BEGINNING" in captured.out and "n_microbatches=" in captured.out
    assert "no plan written" in captured.err and "restart" in captured.err
    assert not out.exists()
