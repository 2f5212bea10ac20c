"""advise() on synthetic GPT-like profiles: memory pressure, headroom, OOM, infeasible, hygiene."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import pytest

from advisor.recommend.advise import advise
from advisor.recommend.remedies.checkpoint_solver import brute_force
from advisor.recommend.memory_model import chain_from_profile, predicted_peak
from profiles import records_profile

MIB = 2**20


def gpt_report(*, layers: int = 8, budget_share: float | None = 0.95, oom: dict | None = None,
               block_act: int = 60 * MIB, params: int = 40 * MIB, data_s: float = 0.001) -> dict[str, Any]:
    """A session whose activations sit in numbered blocks, with realistic attribution and sizes
    (``records_profile``'s keywords)."""
    boundary = 4 * MIB
    modules: list[dict[str, Any]] = [
        {"name": "", "type": "GPT", "depth": 0, "activation_bytes": 0, "input_bytes": 1024, "output_bytes": 4,
         "forward_s": 0.2, "step": 3},
        {"name": "embed", "type": "Embedding", "depth": 1, "activation_bytes": boundary, "input_bytes": 1024,
         "output_bytes": boundary, "forward_s": 0.001, "step": 3},
        {"name": "head", "type": "Linear", "depth": 1, "activation_bytes": 2 * boundary, "input_bytes": boundary,
         "output_bytes": 16 * MIB, "forward_s": 0.01, "step": 3},
    ]
    for i in range(layers):
        own = block_act // 6  # layer norms and the residual output, produced by the block itself
        modules += [
            {"name": f"blocks.{i}", "type": "Block", "depth": 2, "activation_bytes": own, "input_bytes": boundary,
             "output_bytes": boundary, "forward_s": 0.02, "backward_s": 0.04, "step": 3},
            {"name": f"blocks.{i}.attn", "type": "Attention", "depth": 3, "activation_bytes": block_act // 2,
             "input_bytes": boundary, "output_bytes": boundary, "forward_s": 0.008, "step": 3},
            {"name": f"blocks.{i}.mlp", "type": "MLP", "depth": 3, "activation_bytes": block_act - own - block_act // 2,
             "input_bytes": boundary, "output_bytes": boundary, "forward_s": 0.01, "step": 3},
        ]
    activation = sum(m["activation_bytes"] for m in modules) + 2 * MIB  # loss etc., owned by no module
    cats = {"parameter": params, "gradient": params // 4, "optimizer_state": 2 * params,
            "activation": activation, "temporary": 8 * MIB, "input": MIB, "other": 0}
    peak = sum(cats.values())
    budget = int(peak / budget_share) if budget_share else None
    steps = [{"index": i, "rank": 0, "time_s": 0.5, "loss": 1.0, "deep": False,
              "phases": {"data_s": data_s, "forward_s": 0.15, "backward_s": 0.3, "optimizer_s": 0.04, "other_s": 0.0}}
             for i in range(6)]
    return {"budget_bytes": budget, "peak_bytes": peak, "categories_at_peak": cats, "modules": modules, "oom": oom,
            "steps": steps}


def test_memory_pressure_gives_a_fitting_checkpointing_plan() -> None:
    report = gpt_report(budget_share=0.95)
    profile = records_profile(**report)
    diagnosis, recs = advise(profile)
    assert diagnosis.bottleneck == "memory"
    assert recs and recs[0].remedy == "activation_checkpointing" and recs[0].fits
    rec = recs[0]
    budget = report["budget_bytes"]
    assert rec.predicted.peak_memory_bytes <= 0.9 * budget < report["peak_bytes"]
    modules = rec.params["modules"]
    assert modules and all(m.startswith("blocks.") and m.count(".") == 1 for m in modules)
    assert rec.id == f"checkpoint-blocks-{len(modules)}" and rec.exact and rec.live
    # Added time: one more forward of each block, scaled from probed to ordinary steps (0.15 / 0.2).
    assert rec.predicted.step_time_s == pytest.approx(0.5 + len(modules) * 0.02 * 0.75)
    # The plan is the brute-force optimum of the same model at the 90% target.
    chain = chain_from_profile(profile)
    assert chain is not None and chain.n == 8
    best = brute_force(chain, int(0.9 * budget))
    assert best.feasible and len(best.indices) == len(modules)
    assert rec.predicted.step_time_s - 0.5 == pytest.approx(best.overhead_s)
    assert rec.curve and rec.curve[-1].modules_count == 0
    out = rec.to_dict()
    json.dumps(out)
    assert {"id", "remedy", "params", "predicted", "baseline", "exact", "live", "curve"} <= set(out)


def test_no_recommendation_with_headroom() -> None:
    diagnosis, recs = advise(records_profile(**gpt_report(budget_share=0.5)))
    assert diagnosis.bottleneck == "none" and recs == []
    assert diagnosis.evidence[0].value == pytest.approx(0.5, abs=1e-3)


def test_calibrated_model_reproduces_the_measured_peak() -> None:
    report = gpt_report()
    profile = records_profile(**report)
    chain = chain_from_profile(profile)
    assert chain is not None
    assert predicted_peak(chain, set()) == report["peak_bytes"]
    assert chain.other_activation_bytes == 4 * MIB + 8 * MIB + 2 * MIB  # embed + head + unowned


def _states_heavy_report(budget_ratio: float) -> dict:
    # Activations not owned by any block (and model states) exceed the budget: no checkpointing plan fits.
    report = gpt_report(budget_share=0.95, params=3000 * MIB)
    report["categories_at_peak"]["activation"] = report["categories_at_peak"]["optimizer_state"] + 1
    report["peak_bytes"] = sum(report["categories_at_peak"].values())
    report["budget_bytes"] = int(report["peak_bytes"] * budget_ratio)  # a --memory-budget below the peak
    return report


def test_infeasible_checkpointing_budget_offloads_the_optimizer_state() -> None:
    diagnosis, recs = advise(records_profile(**_states_heavy_report(1 / 1.05)))
    assert diagnosis.bottleneck == "memory"
    assert recs[0].remedy == "optimizer_offload" and recs[0].fits and recs[0].apply_class == "live-exact"
    assert recs[0].predicted.peak_memory_bytes <= int(diagnosis.evidence[0].value / 1.05)
    assert any("lowest peak" in e.what for e in diagnosis.evidence)


def test_nothing_live_fits_gives_the_cpu_step_plan_and_says_what_would_help() -> None:
    diagnosis, recs = advise(records_profile(**_states_heavy_report(0.5)))
    assert diagnosis.bottleneck == "memory"
    assert not any(r.fits for r in recs if r.live)
    cpu = [r for r in recs if r.remedy == "cpu_offload"]
    assert cpu and cpu[0].apply_class == "restart" and not cpu[0].live
    said = {e.what: e.value for e in diagnosis.evidence}
    assert "no set of checkpointed or offloaded modules fits" in str(said["no remedy fits the budget"])
    assert said["lowest peak a remedy reaches"] > 0
    assert "ZeRO" in str(said["would help"]) and "micro-batch" in str(said["would help"])


def test_model_states_dominating_gives_no_checkpointing() -> None:
    diagnosis, recs = advise(records_profile(**gpt_report(params=2000 * MIB)))
    assert diagnosis.bottleneck == "memory"
    assert all(r.remedy != "activation_checkpointing" for r in recs)


def test_oom_is_a_memory_diagnosis_with_low_confidence_plan() -> None:
    report = gpt_report(budget_share=1.0)
    cats = dict(report["categories_at_peak"])
    report["oom"] = {"op": "aten.mm", "module": "blocks.7.mlp", "requested_bytes": 8 * MIB, "categories": cats}
    report["budget_bytes"] = int(report["peak_bytes"] * 1.02)
    diagnosis, recs = advise(records_profile(**report))
    assert diagnosis.bottleneck == "memory" and "out of memory" in diagnosis.summary
    assert recs[0].remedy == "activation_checkpointing" and recs[0].confidence == "low"
    assert recs[0].predicted.peak_memory_bytes <= report["budget_bytes"]


def test_input_rule_is_reported_when_memory_is_fine() -> None:
    diagnosis, recs = advise(records_profile(**gpt_report(budget_share=0.5, data_s=0.1)))
    assert diagnosis.bottleneck == "input" and recs == []


def test_advice_serialises_to_report_shaped_dicts() -> None:
    diagnosis, recs = advise(records_profile(**gpt_report()))
    out = {"diagnosis": diagnosis.to_dict(), "recommendations": [r.to_dict() for r in recs]}
    assert set(out["diagnosis"]) == {"bottleneck", "summary", "evidence"}
    assert out["recommendations"][0]["predicted"]["peak_memory_bytes"] > 0
    json.dumps(out, allow_nan=False)


def test_recommend_imports_no_torch_textual_or_rich(repo_root) -> None:
    code = (
        "import sys, advisor.recommend.advise, advisor.recommend.remedies.checkpoint_solver, advisor.recommend.rules, advisor.recommend.profile, "
        "advisor.recommend.memory_model, advisor.records.advice\n"
        "bad = sorted(m for m in ('torch', 'textual', 'rich', 'scipy') if m in sys.modules)\n"
        "print(','.join(bad))"
    )
    result = subprocess.run([sys.executable, "-c", code], cwd=repo_root, capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == ""


def test_model_without_a_block_chain_gets_the_greedy_tree_plan() -> None:
    mib = MIB
    modules = [
        {"name": "", "depth": 0, "forward_s": 0.1},
        {"name": "encoder", "depth": 1, "activation_bytes": 10 * mib, "input_bytes": mib, "output_bytes": mib, "forward_s": 0.02},
        {"name": "encoder.conv", "depth": 2, "activation_bytes": 300 * mib, "input_bytes": mib, "output_bytes": 2 * mib, "forward_s": 0.03},
        {"name": "decoder", "depth": 1, "activation_bytes": 200 * mib, "input_bytes": mib, "output_bytes": mib, "forward_s": 0.05},
    ]
    cats = {"parameter": 100 * mib, "activation": 520 * mib, "temporary": 10 * mib}
    peak = sum(cats.values())
    report = {"budget_bytes": int(peak / 0.95), "peak_bytes": peak, "categories_at_peak": cats, "modules": modules}
    diagnosis, recs = advise(records_profile(**report))
    assert diagnosis.bottleneck == "memory"
    rec = recs[0]
    assert rec.remedy == "activation_checkpointing" and rec.confidence == "medium" and rec.curve is None
    # Best bytes saved per second first (encoder, then decoder); one module alone cannot help because
    # its recomputation comes back in backward, so both are needed.
    assert rec.params["modules"] == ["encoder", "decoder"]
    assert rec.predicted.peak_memory_bytes <= 0.9 * report["budget_bytes"]
    assert rec.predicted.step_time_s is None  # no steps recorded: the time is unknown, not invented
