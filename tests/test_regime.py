"""advisor/regime.py: which remedies are in force, refusals, and the regime advice describes.

Built on the recorded GPT session (tests/data/gpt.jsonl.gz: steps 0-7, deep steps 1-4) with
an apply history added the way the receiver folds it: ``ApplyResult`` entries, and a user
revert's ``RevertResult``.
"""

import recorded
from recommendations import recommendation

from dataclasses import replace

from advisor.advice import AdviceLoop
from advisor.records.remedy import command_digest
from advisor.records.results import ApplyResult, Measurement, RevertResult
from advisor.regime import (
    apply_refusal,
    current_regime,
    in_force,
    last_kept,
    regime_start,
    revert_refusal,
)

REC = recommendation("checkpoint-blocks-4", params={"modules": ["blocks.0"]}, peak=1, step_time_s=0.1,
                     title="Checkpoint 4 blocks")


def kept(at_step: int, rec_id: str = "checkpoint-blocks-4") -> ApplyResult:
    return ApplyResult(remedy="activation_checkpointing", recommendation_id=rec_id, at_step=at_step,
                       status="kept", after=Measurement(steps=(at_step, at_step + 1)))


def auto_reverted(at_step: int, window: tuple[int, ...]) -> ApplyResult:
    return ApplyResult(remedy="activation_checkpointing", recommendation_id="x", at_step=at_step,
                       status="reverted", after=Measurement(steps=window))


def user_revert(at_step: int, rec_id: str = "checkpoint-blocks-4") -> RevertResult:
    return RevertResult(remedy="activation_checkpointing", recommendation_id=rec_id, at_step=at_step)


def steps_of(state) -> list[int]:
    return [s.index for s in state.steps[0]]


def test_a_kept_remedy_starts_the_regime():
    state = recorded.load_state("gpt")
    state.applied = [kept(2)]
    assert [r.recommendation_id for r in in_force(state.applied)] == ["checkpoint-blocks-4"]
    regime = current_regime(state)
    assert steps_of(regime) == [2, 3, 4, 5, 6, 7]
    assert {m.step for m in regime.modules} == {2, 3, 4}
    assert min(m.step for m in regime.memory) == 2


def test_after_a_user_revert_the_reverted_remedy_is_not_in_force():
    """The stale regime: a revert at step 4 of a remedy kept at step 2 makes step 4 the start."""
    state = recorded.load_state("gpt")
    state.applied = [kept(2), user_revert(4)]
    assert in_force(state.applied) == [] and last_kept(state.applied) is None
    assert regime_start(state.applied) == 4
    assert steps_of(current_regime(state)) == [4, 5, 6, 7]


def test_after_a_revert_with_nothing_measured_since_the_baseline_is_advised():
    state = recorded.load_state("gpt")
    state.applied = [kept(3), user_revert(5)]  # no deep step after 5: fall back to steps before 3
    assert steps_of(current_regime(state)) == [0, 1, 2]


def test_a_remedy_reverted_after_its_window_changes_the_regime_after_the_window():
    state = recorded.load_state("gpt")
    state.applied = [auto_reverted(1, (1, 2))]
    assert in_force(state.applied) == [] and regime_start(state.applied) == 3
    assert steps_of(current_regime(state)) == [3, 4, 5, 6, 7]


def test_remedies_stack_and_a_revert_undoes_the_newest():
    applied = [kept(2, "a"), kept(3, "b"), user_revert(4, "b")]
    assert [r.recommendation_id for r in in_force(applied)] == ["a"]
    assert last_kept(applied).recommendation_id == "a"
    assert regime_start([ApplyResult(remedy="zero", status="failed", at_step=None)]) is None


def test_refusals():
    state = recorded.load_state("gpt")
    state.finished = False
    assert apply_refusal(state, REC) is None
    assert "already in flight" in apply_refusal(state, REC, in_flight=True)
    assert "needs a restart" in apply_refusal(state, replace(REC, live=False))
    assert apply_refusal(state, None) == "No recommendation to apply yet."
    assert revert_refusal(state) == "Nothing to revert: no remedy is in force."
    state.applied = [kept(2)]
    assert revert_refusal(state) is None
    state.applied = [kept(2), user_revert(4)]
    assert revert_refusal(state) == "Nothing to revert: no remedy is in force."
    state.finished = True
    assert apply_refusal(state, REC).startswith("Training has ended")


def test_the_advice_loop_sends_typed_commands_in_the_old_wire_shape_and_refuses_a_stale_revert():
    session = recorded.FakeSession()
    loop = AdviceLoop(session, budget_bytes=None)
    try:
        for record in recorded.read("gpt")[1]:
            session.live.add(record)
        session.live.update(recommendations=[REC])
        # The history arrives as the agents send it: an apply_result event, then apply_reverted.
        session.live.add(kept(2).event(step=2))
        session.live.add(user_revert(4, REC.id).event(step=4))
        assert regime_start(session.live.snapshot().applied) == 4
        assert loop.revert() == "Nothing to revert: no remedy is in force."  # was sent before the fix
        assert session.sent == []
        assert loop.apply(REC.id) is None
        assert session.sent == [{"type": "apply", "recommendation": REC.to_dict(), "at_step": 9, "measure_steps": 3,
                                 "confirmed": False,
                                 "digest": command_digest(REC.remedy, REC.params, 9)}]
        assert loop.apply(REC.id) == "An apply is already in flight; wait for its result."
        session.live.update(pending_apply=None, applied=[kept(9)])
        # every rank reverts at one boundary, past the furthest rank, like an apply
        assert loop.revert() is None and session.sent[-1] == {"type": "revert", "at_step": 9}
    finally:
        loop.close()
