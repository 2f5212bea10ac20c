"""The memory rule with the offload remedies: offload (or a mix) when it beats checkpointing at
the same budget on a measured host link, each recommendation says why, params validate."""

from __future__ import annotations

from dataclasses import replace

import pytest
from profiles import records_profile
from test_recommend_advise import MIB, gpt_report

from advisor.recommend.advise import advise
from advisor.recommend.memory_model import chain_from_profile
from advisor.recommend.remedies import check_params
from advisor.recommend.remedies.offload import KEEP, RECOMPUTE, model_for, solve


def test_fast_link_offload_beats_checkpointing_and_says_why() -> None:
    profile = replace(records_profile(**gpt_report(budget_share=0.95)), host_link_bandwidth=50e9)
    diagnosis, recs = advise(profile)
    assert diagnosis.bottleneck == "memory"
    offload = [r for r in recs if r.remedy == "activation_offload"]
    assert offload and offload[0].fits and offload[0].apply_class == "live-exact"
    chain = chain_from_profile(profile)
    ckpt = solve(chain, model_for(profile), int(0.9 * profile.budget_bytes), allowed=(KEEP, RECOMPUTE), optimizer=False)
    added = offload[0].predicted.step_time_s - profile.step_time_s
    assert added < ckpt.overhead_s  # it beat checkpointing alone at the same budget
    assert any("hides behind" in e and "recompute would cost" in e for e in offload[0].evidence)
    assert offload[0].predicted.peak_memory_bytes <= profile.budget_bytes
    assert "blocks.7" not in offload[0].params["modules"]  # the last block is never offloaded
    check_params("activation_offload", offload[0].params)
    assert offload[0].curve and offload[0].curve[-1].overhead_s == 0.0


def test_slow_or_unmeasured_link_leaves_it_to_checkpointing() -> None:
    for link in (None, 1e8):
        profile = replace(records_profile(**gpt_report(budget_share=0.95)), host_link_bandwidth=link)
        _, recs = advise(profile)
        assert recs[0].remedy == "activation_checkpointing"
        assert not any(r.remedy == "activation_offload" for r in recs)


def test_model_states_dominating_offloads_the_optimizer_state() -> None:
    profile = records_profile(**gpt_report(params=2000 * MIB))
    _, recs = advise(profile)
    assert recs[0].remedy == "optimizer_offload" and recs[0].fits
    state = profile.categories_at_peak["optimizer_state"]
    assert recs[0].predicted.peak_memory_bytes == max(profile.peak_bytes - state,
                                                      state + profile.categories_at_peak["parameter"]
                                                      + profile.categories_at_peak["gradient"])


@pytest.mark.parametrize("params, match", [
    ({"modules": "blocks.0"}, "list of module names"),
    ({"modules": []}, "empty"),
    ({"modules": ["blocks.0"], "checkpoint": ["blocks.0"]}, "both"),
    ({"modules": ["blocks.0"], "min_bytes": -1}, "min_bytes"),
    ({"modules": ["blocks.0"], "speed": 1}, "unknown"),
])
def test_bad_activation_offload_params(params, match) -> None:
    with pytest.raises(ValueError, match=match):
        check_params("activation_offload", params)


def test_bad_optimizer_offload_params() -> None:
    check_params("optimizer_offload", {"optimizers": [0]})
    with pytest.raises(ValueError, match="indexes"):
        check_params("optimizer_offload", {"optimizers": "all"})


def test_recorded_session_offload_plan_uses_the_simulated_timeline() -> None:
    """On a recorded session (a deep step ran the chain), the offload plan's peak is
    ``peak_model``'s replay of the measured timeline, not the conservative formula."""
    import recorded
    from test_recommend_recorded import BUDGET, profile_of

    from advisor.recommend.memory_model import chain_timeline
    from advisor.recommend.peak_model import MODEL, choices_peak
    from advisor.recommend.remedies.offload import OFFLOAD, evaluate

    profile = replace(profile_of(recorded.load_state("gpt"), budget_bytes=BUDGET), host_link_bandwidth=50e9)
    _, recs = advise(profile)
    rec = next(r for r in recs if r.remedy == "activation_offload")
    chain = chain_from_profile(profile)
    memory = chain_timeline(profile, chain)
    assert memory is not None and MODEL in rec.cost_model
    choices = tuple(OFFLOAD if n in rec.params["modules"] else RECOMPUTE if n in rec.params.get("checkpoint", ())
                    else KEEP for n in chain.names)
    assert rec.predicted.peak_memory_bytes == choices_peak(memory, choices) <= BUDGET
    assert rec.predicted.peak_memory_bytes < evaluate(chain, model_for(profile), choices, False)[0]  # the formula's
