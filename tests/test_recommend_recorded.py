"""Exact figures from the Profile and the advice on three recorded sessions (tests/data).

As Holistic Trace Analysis tests its analyses on recorded traces: each file is a real
``advisor attach`` session (tests/data/README.md has the commands), so these figures are
what the recommender makes of measured data, not of hand-written dicts. A change to the
profile, a rule or a cost model that moves any of them shows up here first.
"""

import pytest
import recorded

from advisor.advice import AdviceLoop, advise_state
from advisor.recommend.profile import profile_from_records
from advisor.report import build_report
from advisor.sections.comm import build_comm_section
from advisor.state import SessionState
from advisor.store import load_state

BUDGET = 24_000_000  # the README's --memory-budget 24MB
CPU_CAPACITY = 25276063744  # the recording machine's memory (RunInfo.device.memory_capacity)
BLOCKS = ["blocks.0", "blocks.1", "blocks.2", "blocks.3"]


def profile_of(state: SessionState, budget_bytes=None):
    steps = [s for rank in sorted(state.steps) for s in state.steps[rank]]
    return profile_from_records(steps=steps, memory=state.memory, modules=state.modules, ops=state.ops,
                                collectives=state.collectives, events=state.events,
                                runs=list(state.runs.values()), models=state.models,
                                optimizers=state.optimizers, budget_bytes=budget_bytes)


def advice_of(state: SessionState, budget_bytes=None):
    """``advise_state`` in the report's form (``to_dict``): the figures below are the report's."""
    diagnosis, recs = advise_state(state, budget_bytes=budget_bytes)
    return (None if diagnosis is None else diagnosis.to_dict()), [r.to_dict() for r in recs]


def test_gpt_profile():
    profile = profile_of(recorded.load_state("gpt"))
    assert profile.peak_bytes == 34407204
    assert profile.budget_bytes == CPU_CAPACITY
    assert profile.categories_at_peak == {"parameter": 3732480, "gradient": 3732480, "optimizer_state": 7465176,
                                          "activation": 18424320, "temporary": 1048584, "input": 4160, "other": 4,
                                          "offloaded_host": 0}
    assert profile.categories_max["activation"] == 18424324
    assert profile.categories_max["temporary"] == 3407880
    # The median of the light steps after the warm-up that follow a light step (6, 7): deep steps 1-4,
    # step 0, and step 5 (right after the deep ones: it pays for their teardown) are left out.
    assert profile.step_time_s == 1.767434843500041
    assert profile.phases["backward_s"] == 0.7334538270000053
    assert len(profile.modules) == 45
    assert profile.module("blocks.0").type == "Block"
    assert profile.time_scale == 1.0
    assert profile.oom is None
    assert (len(profile.ops), len(profile.collectives)) == (1084, 0)


def test_gpt_advice_under_the_readme_budget():
    diagnosis, recs = advice_of(recorded.load_state("gpt"), budget_bytes=BUDGET)
    assert diagnosis["bottleneck"] == "memory"
    assert diagnosis["summary"] == "peak 32.8 MiB is 143% of the 22.9 MiB budget"
    assert [r["id"] for r in recs] == ["checkpoint-blocks-4", "fused-optimizer"]
    rec = recs[0]
    assert rec["remedy"] == "activation_checkpointing" and rec["live"] and rec["exact"] and rec["fits"]
    assert rec["params"] == {"modules": BLOCKS}
    assert rec["block_plan"] == [{"name": b, "choice": "recompute"} for b in BLOCKS]
    # The simulated peak (recommend/peak_model.py). A run of the same model with the four blocks
    # really checkpointed tracked exactly this peak; the conservative bound said 22299428.
    assert rec["predicted"] == {"peak_memory_bytes": 20679456, "step_time_s": 1.790366904500047}
    assert rec["cost_model"].startswith("dp: simulated backward")
    assert rec["baseline"] == {"peak_memory_bytes": 34407204, "step_time_s": 1.767434843500041}
    assert len(rec["curve"]) == 12


def test_gpt_without_a_budget_reads_its_optimizer_share_from_the_settled_steps():
    # Steps 6 and 7 (step 5 follows the deep ones): a median optimizer phase of 0.93 s in a median
    # 1.77 s step, over the fused-optimizer rule's 25% (with step 5's 2.17 s step it was under).
    diagnosis, recs = advice_of(recorded.load_state("gpt"))
    assert (diagnosis["bottleneck"], diagnosis["summary"]) == ("launch_overhead", "the optimizer step takes 52% of the step")
    assert [r["id"] for r in recs] == ["fused-optimizer"]


def test_gpt_ops_cover_most_of_their_deep_steps_so_no_host_overhead():
    # Ops are timed on deep steps 2 and 4: compared with those steps (not the light ones, which
    # the probes do not slow down), they cover more than half: the host-overhead rule is silent.
    from advisor.recommend.rules import run
    from advisor.recommend.rules._figures import op_time_per_step

    profile = profile_of(recorded.load_state("gpt"))
    deep = [profile.step_times[i][0] - profile.step_times[i][1] for i in (2, 4)]
    assert op_time_per_step(profile.ops) / (sum(deep) / 2) > 0.5
    assert run("host_overhead", profile) is None


def test_ddp_profile_reads_rank_zero():
    state = recorded.load_state("ddp")
    assert sorted(state.runs) == [0, 1] and {r: len(s) for r, s in state.steps.items()} == {0: 30, 1: 30}
    profile = profile_of(state)
    assert profile.peak_bytes == 11287104
    assert profile.categories_at_peak == {"parameter": 2149928, "gradient": 2149928, "optimizer_state": 4299968,
                                          "activation": 0, "temporary": 2676268, "input": 8452, "other": 2560,
                                          "offloaded_host": 0}
    assert profile.step_time_s == 0.014652452000007088
    assert profile.time_scale == 0.07389039943133338
    assert len(profile.modules) == 23
    assert (len(profile.ops), len(profile.collectives)) == (606, 64)
    assert {c.rank for c in profile.collectives} == {0}


def test_ddp_advice_is_communication_then_straggler_then_input():
    # 2 ranks on gloo/CPU: rank 0's ordinary steps have a median 5.15 ms of exposed all-reduce in a
    # median 14.7 ms step (rules/communication.py); the comm section shows the same figures.
    state = recorded.load_state("ddp")
    diagnosis, recs = advice_of(state)
    assert (diagnosis["bottleneck"], diagnosis["summary"]) == (
        "communication", "exposed communication takes 35% of the step")
    assert diagnosis["evidence"][0] == {"what": "exposed collective time / step time", "value": 0.3513,
                                        "threshold": 0.1}
    rank0 = build_comm_section(state)[0]
    assert round(rank0["exposed_share"], 4) == 0.3513 and round(rank0["exposed_s"], 6) == diagnosis["evidence"][1]["value"]
    assert [e["value"] for e in diagnosis["evidence"][-2:]] == [
        "rank 0 is a straggler: its own work takes 1.33x rank 1's, 513 µs more in data",
        "waiting for data takes 6% of the step (median data wait over the median ordinary step)"]
    # Those that fit the (host memory) budget first: larger DDP buckets predict no peak, so they
    # do not fit it; accumulation keeps today's peak, compression adds its 16-bit bucket copies.
    assert [(r["id"], r["apply_class"], r["predicted"]["step_time_s"], r["fits"]) for r in recs] == [
        ("grad-accumulation", "restart", 0.010791769750937874, True),
        ("grad-compression", "live-opt-in", 0.014183482654914314, True),
        ("ddp-bucket", "restart", 0.009504875667914803, False)]
    assert recs[1]["predicted"]["peak_memory_bytes"] == 11287104 + 2149928 // 2
    # the input finding has no remedy: this recording predates the DataLoader capture


def test_oom_profile_adds_the_model_states_step_zero_never_held():
    state = recorded.load_state("oom")
    assert state.steps == {} and state.exit_code == 1
    profile = profile_of(state)
    # Measured 22.3 MB at the OOM; gradients (1x) and AdamW state (2x parameters) were not yet allocated.
    assert profile.categories_max["gradient"] == 0 and profile.categories_max["optimizer_state"] == 0
    assert profile.categories_at_peak["gradient"] == 3732480
    assert profile.categories_at_peak["optimizer_state"] == 7464960
    assert profile.peak_bytes == 34406988
    assert profile.step_time_s is None
    assert profile.oom.op == "aten.nll_loss_backward" and profile.oom.requested_bytes == 1048576
    assert profile.oom.budget_bytes == BUDGET
    assert len(profile.modules) == 44


def test_oom_advice_uses_the_recorded_budget():
    diagnosis, recs = advice_of(recorded.load_state("oom"))  # no budget given: the recorded 24MB
    assert diagnosis["summary"] == "out of memory in aten.nll_loss_backward"
    # The peak the failed step needed, named apart from the memory section's measured 22.1 MiB.
    assert diagnosis["evidence"][0] == {"what": "peak memory the failed step needed (measured, plus its failed "
                                                "request and model states)", "value": 35455564, "unit": "bytes"}
    assert [(r["id"], r["params"], r["predicted"], r["confidence"]) for r in recs] == [
        ("checkpoint-blocks-4", {"modules": BLOCKS}, {"peak_memory_bytes": 23347788, "step_time_s": None}, "low")]


def _advised(recs):
    return [(r["id"], r["params"], r["predicted"], r["baseline"], r["curve"]) for r in recs]


@pytest.mark.parametrize("name,budget", [("gpt", BUDGET), ("oom", None), ("ddp", None)])
def test_live_advice_equals_report_advice(name, budget):
    """The AdviceLoop fed a session record by record, then finished as attach finishes it, gives
    exactly the report's diagnosis and recommendations: ids, params and predictions."""
    session = recorded.FakeSession()
    loop = AdviceLoop(session, budget_bytes=budget)
    try:
        _, records = recorded.read(name)
        for record in records:
            session.live.add(record)
            loop.on_record(record)
        assert loop.wait_idle(timeout=120)
        loop.finish()
        assert loop.last_error is None
        live = session.live.snapshot()
        report = build_report(live, budget_bytes=budget)
    finally:
        loop.close()
    assert report["warnings"] == []
    assert live.diagnosis.to_dict() == report["diagnosis"]
    live_recs = [r.to_dict() for r in live.recommendations]
    assert _advised(live_recs) == _advised(report["recommendations"])
    assert live_recs == report["recommendations"]
    if name != "ddp":
        assert live.recommendations  # a real comparison, not two empty lists


def test_stored_session_advises_as_its_records(tmp_path):
    """The SQLite round trip (what `advisor report` and `advisor plan` read) changes no figure."""
    db = recorded.write_session("gpt", tmp_path)
    assert advise_state(load_state(db), budget_bytes=BUDGET) == advise_state(recorded.load_state("gpt"),
                                                                            budget_bytes=BUDGET)


def test_wait_idle_returns_once_the_loop_has_advised():
    session = recorded.FakeSession()
    loop = AdviceLoop(session, budget_bytes=BUDGET)
    try:
        assert loop.wait_idle(timeout=5)  # nothing seen yet: idle at once
        _, records = recorded.read("gpt")
        for record in records:
            session.live.add(record)
            loop.on_record(record)
        assert loop.wait_idle(timeout=120)
        assert session.live.snapshot().recommendations  # the deep steps were advised on
    finally:
        loop.close()
