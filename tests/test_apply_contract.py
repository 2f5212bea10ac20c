"""The remedy contract: discovery without edits, plan order, apply classes, same-kind windows."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch
from fakes import FakeContext
from recommendations import recommendation, wire

from advisor.apply import registry
from advisor.apply.executor import Executor, pair
from advisor.apply.orchestrator import apply_in_order
from advisor.apply.target import Target, unwrap
from advisor.recommend.remedies import plan_order
from advisor.records.advice import Prediction, Recommendation, parse_apply_class
from advisor.records.remedy import command_digest
from advisor.records.samples import StepSample
from advisor.records.settings import AgentSettings

ROOT = Path(__file__).resolve().parents[1]


def test_an_applier_on_sys_path_is_found_without_editing_the_package(tmp_path) -> None:
    folder = tmp_path / "advisor" / "apply" / "remedies"
    folder.mkdir(parents=True)
    (folder / "faulty_plugin.py").write_text(textwrap.dedent("""
        PHASE = "layout"

        def apply_faulty_plugin(target, *, when):
            raise RuntimeError("injected by a test plug-in")
    """))
    code = ("import sys; sys.path[:0] = [sys.argv[1], sys.argv[2]]\n"
            "from advisor.apply import registry\n"
            "import json; print(json.dumps([registry.remedy_names(), registry.phase('faulty_plugin')]))")
    out = subprocess.run([sys.executable, "-c", code, str(ROOT), str(tmp_path)], capture_output=True, text=True,
                         check=True).stdout
    names, phase = json.loads(out)
    assert "faulty_plugin" in names and "activation_checkpointing" in names and phase == "layout"
    assert {"activation_offload", "optimizer_offload"} <= set(names)


def test_a_plan_applies_in_phase_order_and_reports_in_its_own() -> None:
    calls: list[str] = []

    def make(name: str, fail: bool = False):
        def apply(target, *, n: int):
            calls.append(name)
            if fail:
                raise ValueError(f"{name} refused")
            return type("H", (), {"revert": lambda self: None})()
        return apply

    registry.register("t_layout", make("t_layout"), phase="layout")
    registry.register("t_saved", make("t_saved", fail=True), phase="saved-tensors")
    registry.register("t_optim", make("t_optim"), phase="optimizer")
    try:
        outcomes = apply_in_order(Target(), [("t_layout", {"n": 1}), ("t_saved", {"n": 2}), ("t_optim", {"n": 3})])
    finally:
        for name in ("t_layout", "t_saved", "t_optim"):
            registry.unregister(name)
    assert calls == ["t_saved", "t_optim", "t_layout"]
    assert [o.remedy for o in outcomes] == ["t_layout", "t_saved", "t_optim"]
    assert outcomes[0].handle is not None and isinstance(outcomes[1].error, ValueError)
    assert plan_order(["fused_optimizer", "activation_checkpointing"]) == ["activation_checkpointing",
                                                                            "fused_optimizer"]


def _rec(**kw) -> Recommendation:
    base = dict(id="x", remedy="activation_checkpointing", title="t", params={},
                predicted=Prediction(peak_memory_bytes=None, step_time_s=None),
                baseline=Prediction(peak_memory_bytes=None, step_time_s=None), budget_bytes=None,
                cost_model="m", confidence="low", exact=True, live=True)
    return Recommendation(**{**base, **kw})


def test_every_recommendation_has_an_apply_class() -> None:
    assert _rec().apply_class == "live-exact"
    assert _rec(exact=False).apply_class == "live-opt-in"
    assert _rec(live=False).apply_class == "restart"
    assert _rec(apply_class="live-equivalent", exact=False).to_dict()["apply_class"] == "live-equivalent"
    with pytest.raises(ValueError, match="valid: live-exact, live-equivalent, live-opt-in, restart"):
        parse_apply_class("live")


@pytest.mark.parametrize(("allow_inexact", "extra", "applied"), [
    (False, {}, False),
    (True, {}, True),
    (False, {"confirmed": True}, True),
])
def test_live_opt_in_needs_allow_inexact_or_a_confirmation(allow_inexact, extra, applied) -> None:
    seen = []

    def apply_scale(target, *, factor: float):
        seen.append(factor)
        return type("H", (), {"revert": lambda self: None})()

    registry.register("t_scale", apply_scale)
    try:
        model = torch.nn.Linear(2, 2)
        ctx = FakeContext([model], settings=AgentSettings(allow_inexact=allow_inexact))
        ex = Executor(ctx)
        ex.submit({"type": "apply", "at_step": 1, "measure_steps": 1, **extra,
                   "recommendation": wire("s", "t_scale", params={"factor": 2.0}, apply_class="live-opt-in")})
        for i in range(3):
            ctx.step = i
            ex.on_boundary(i)
            ex.on_step_end(StepSample(index=i, time_s=0.1))
    finally:
        registry.unregister("t_scale")
    assert bool(seen) == applied
    if not applied:
        [result] = ex.results
        assert result.status == "failed" and "--allow-inexact" in (result.error or "")


def _s(index: int, deep: bool, time_s: float, peak: int | None = None) -> StepSample:
    return StepSample(index=index, time_s=time_s, deep=deep, peak_memory_bytes=peak)


def test_before_and_after_are_timed_on_the_same_kind_of_step() -> None:
    # Light steps 3 and 8 follow deep ones (they pay for the probes' teardown): not timed.
    before = [_s(1, True, 5.0, 100), _s(2, True, 5.0, 110), _s(3, False, 1.5), _s(4, False, 1.0), _s(5, False, 1.2)]
    after = [_s(6, True, 6.0, 90), _s(7, True, 6.0, 80), _s(8, False, 1.6), _s(9, False, 1.1), _s(10, False, 1.3)]
    b, a = pair(before, after, measure_steps=2)
    assert (b.step_kind, b.time_steps, b.step_time_s) == ("light", (4, 5), pytest.approx(1.1))
    assert (a.step_kind, a.time_steps, a.step_time_s) == ("light", (9, 10), pytest.approx(1.2))
    assert (b.peak_memory_bytes, b.peak_steps, a.peak_memory_bytes, a.peak_steps) == (110, (1, 2), 90, (6, 7))
    # Only deep steps after the apply (a run that deep-samples every step): deep against deep.
    b, a = pair(before, [_s(5, True, 6.0, 90), _s(6, True, 6.2, 80), _s(7, True, 6.4, 85)], measure_steps=2)
    assert (b.step_kind, b.time_steps, b.step_time_s) == ("deep", (1, 2), 5.0)
    assert (a.step_kind, a.time_steps, a.step_time_s) == ("deep", (6, 7), pytest.approx(6.3))
    # Nothing of the same kind before: the before time stays unknown rather than compared across kinds.
    b, a = pair([_s(3, False, 1.0)], [_s(5, True, 6.0, 90), _s(6, True, 6.0, 80)], measure_steps=2)
    assert b.step_time_s is None and a.step_kind == "deep"


def test_one_unwrap_for_ddp_and_compile() -> None:
    inner = torch.nn.Linear(2, 2)
    compiled = torch.compile(inner, backend="eager")
    assert unwrap(compiled) == (inner, "OptimizedModule")
    assert unwrap(inner) == (inner, None)
    assert Target.of(compiled).models == [inner]


def test_headless_refuses_live_opt_in_without_allow_inexact() -> None:
    from types import SimpleNamespace

    from advisor.advice import AdviceLoop
    from advisor.state import LiveState

    def loop(allow: bool) -> tuple[AdviceLoop, list[dict]]:
        sent: list[dict] = []
        live = LiveState()
        live.update(recommendations=[recommendation("bf16", "t", apply_class="live-opt-in")])
        session = SimpleNamespace(live=live, options=SimpleNamespace(settings=AgentSettings(allow_inexact=allow)),
                                  send_command=lambda c: sent.append(c) or True)
        return AdviceLoop(session, budget_bytes=None), sent

    advice, sent = loop(False)
    try:
        error = advice.apply("bf16")
    finally:
        advice.close()
    assert error and "--allow-inexact" in error and sent == []
    advice, sent = loop(True)
    try:
        assert advice.apply("bf16", at_step=4) is None
    finally:
        advice.close()
    [command] = [c.to_dict() for c in sent]  # the typed command, as it travels
    assert command["digest"] == command_digest("t", {}, command["at_step"])


@pytest.mark.parametrize(("at_step", "advised_through", "chosen_after"),
                         [(None, 99, 5), (6, 99, 1), (5, 99, 1), (3, 99, 1), (None, 3, None), (8, 3, 6),
                          (8, 99, 6), (7, 99, 5)])
def test_an_apply_waits_for_the_light_step_after_the_deep_ones_unless_that_misses_the_step(
        at_step, advised_through, chosen_after):
    """Steps 1-3 deep, step 5 the first light one that follows a light one (it times the blocks
    the predictions read; step 4 pays for the deep steps' teardown): the apply is chosen once
    advice made with step 5 is in, or at the last step that still meets ``--apply-at-step`` (the
    command must leave before step at_step - 1 ends). Advice made before it (``advised_through``
    3) does not count as ready, though the step itself has arrived. A later step asked for waits
    for advice made with step at_step - 2, the last sent before the job holds for the decision:
    the baseline is every light step up to there, not step 5 alone. A step asked for that step 5
    cannot inform (before 7) is chosen from the first advice, as it always was. With no step asked
    for, ``auto`` waits for advice made with step 5 however late it comes: advice before it has no
    step-time baseline to choose by (``advised_through`` 3: never chosen here)."""
    from types import SimpleNamespace

    from advisor.advice import AdviceLoop
    from advisor.records.samples import StepSample
    from advisor.state import LiveState

    live = LiveState()
    loop = AdviceLoop(SimpleNamespace(live=live, options=None, send_command=lambda c: True), budget_bytes=None,
                      apply_at_step=at_step)
    loop.close()  # its thread stopped: the records below are fed by hand
    loop.apply_request = "auto"
    chosen = []
    loop.apply = lambda rec_id, at_step=None: chosen.append(live.snapshot().latest_step())  # type: ignore[method-assign]
    for index in range(8):
        live.add(StepSample(index=index, time_s=0.1, deep=index in (1, 2, 3)))
        if index == 1:  # the first advice comes with the first deep step's measurements
            live.update(recommendations=[recommendation("r", "t")])
        if index <= advised_through:
            loop._advised_step = index  # what a refresh on this step's record records
        loop._maybe_auto_apply()
    assert chosen == ([] if chosen_after is None else [chosen_after])


@pytest.mark.parametrize(("at_step", "chosen_at"), [(None, 5), (2, 3), (5, 3)])
def test_an_apply_is_never_chosen_from_advice_made_before_the_first_deep_step(at_step, chosen_at):
    """Under load the controller advised on step 0 alone (no memory timeline yet) and --apply auto
    took that advice's first remedy, a fused optimizer, for a job over its memory budget: the
    choice waits for advice made with the first deep step, however late that makes it."""
    from types import SimpleNamespace

    from advisor.advice import AdviceLoop
    from advisor.records.samples import StepSample
    from advisor.state import LiveState

    live = LiveState()
    loop = AdviceLoop(SimpleNamespace(live=live, options=None, send_command=lambda c: True), budget_bytes=None,
                      apply_at_step=at_step)
    loop.close()
    loop.apply_request = "auto"
    chosen = []
    loop.apply = lambda rec_id, at_step=None: chosen.append((live.snapshot().latest_step(), rec_id))  # type: ignore[method-assign]
    for index in range(8):
        live.add(StepSample(index=index, time_s=0.1, deep=index in (1, 2, 3)))
        if index == 0:  # advice from step 0 alone: what a light step's refresh makes while an apply waits
            live.update(recommendations=[recommendation("early", "fused_optimizer")])
            loop._advised_step = 0
        if index == 3:  # the deep steps' advice arrives late, with the job at step 3
            live.update(recommendations=[recommendation("deep", "activation_checkpointing")])
            loop._advised_step = 3
        if index == 5:  # the refresh made with step 4, the first ordinary one (auto without a step waits for it)
            loop._advised_step = 5
        loop._maybe_auto_apply()
    assert chosen == [(chosen_at, "deep")]


def test_a_named_remedy_keeps_the_step_asked_for_though_the_advice_predates_the_deep_steps():
    """The wait for a deep step is ``auto``'s (the choice itself reads the measurement): a named
    remedy is the user's choice, and a rule may name it on step 0's advice alone (gradient
    compression on 2 DDP ranks did, then not on the deep steps' until step 5)."""
    from types import SimpleNamespace

    from advisor.advice import AdviceLoop
    from advisor.records.samples import StepSample
    from advisor.state import LiveState

    live = LiveState()
    loop = AdviceLoop(SimpleNamespace(live=live, options=None, send_command=lambda c: True), budget_bytes=None,
                      apply_at_step=5)
    loop.close()
    loop.apply_request = "grad-compression"
    chosen = []
    loop.apply = lambda rec_id, at_step=None: chosen.append((live.snapshot().latest_step(), rec_id))  # type: ignore[method-assign]
    live.add(StepSample(index=0, time_s=0.1))
    live.update(recommendations=[recommendation("grad-compression", "grad_compression", apply_class="live-opt-in")])
    loop._advised_step = 0
    loop._maybe_auto_apply()
    assert chosen == [(0, "grad-compression")]


def test_the_controller_releases_ranks_held_for_an_apply_it_will_not_make_there():
    """``--apply X --apply-at-step K``: the ranks wait at the boundary before K, having sent step
    K-2. When advice made with that step has no such live recommendation, the controller sends a
    release (once), so the job goes on at once instead of after the hold's timeout."""
    from types import SimpleNamespace

    from advisor.advice import AdviceLoop
    from advisor.records.samples import StepSample
    from advisor.state import LiveState

    live, sent = LiveState(), []
    loop = AdviceLoop(SimpleNamespace(live=live, options=None, send_command=lambda c: sent.append(c) or 1),
                      budget_bytes=None, apply="missing", apply_at_step=5)
    loop.close()
    live.update(recommendations=[recommendation("other", "t")])
    for index in range(5):
        live.add(StepSample(index=index, time_s=0.1, deep=index in (1, 2, 3)))
        loop._advised_step = index
        loop._maybe_auto_apply()
        assert sent == ([] if index < 3 else [{"type": "release"}]), (index, sent)


def test_a_rank_waits_at_the_boundary_before_the_step_asked_for_until_the_decision():
    """The agent sends every record through step K-2, then waits for an apply command or a
    release (at most ``apply_hold_s``): an apply named for step 5 then lands at 5 however long
    the advice takes (faster deep steps had moved one to step 6)."""
    import threading

    import torch

    from advisor.agent.agent import Agent
    from advisor.agent.hooks import install
    from advisor.records.samples import Event, StepSample

    def run(release_after: float | None, hold_s: float) -> list:
        emitted: list = []
        agent = Agent(emit=emitted.append, settings=AgentSettings(deep_steps=(), apply_hold_step=5, apply_hold_s=hold_s))
        held = threading.Event()
        real_wait = agent.hold._decision.wait

        def wait(timeout):
            held.set()
            return real_wait(timeout)
        agent.hold._decision.wait = wait  # type: ignore[method-assign]
        if release_after is not None:
            threading.Thread(target=lambda: held.wait(10) and time.sleep(release_after) is None
                             and agent.submit_command({"type": "release"}), daemon=True).start()
        hooks = install(agent)
        try:
            torch.manual_seed(0)
            model = torch.nn.Linear(8, 1)
            _train_steps(model, 7)
            agent.flush(sync=True)
        finally:
            hooks.remove()
            agent.close()
        return emitted

    emitted = run(release_after=0.3, hold_s=30)
    [hold] = [r for r in emitted if isinstance(r, Event) and r.name == "apply_hold"]
    assert hold.step == 4 and hold.data["at_step"] == 5 and hold.data["decided"]
    assert 0.25 <= hold.data["waited_s"] < 10
    before = emitted[:emitted.index(hold)]
    assert [s.index for s in before if isinstance(s, StepSample)] == [0, 1, 2, 3]  # sent before the wait
    steps = [r for r in emitted if isinstance(r, StepSample)]
    assert steps[4].time_s < hold.data["waited_s"]  # the wait is not the next step's time
    emitted = run(release_after=None, hold_s=0.2)  # no controller: a bounded wait and a warning
    [hold] = [r for r in emitted if isinstance(r, Event) and r.name == "apply_hold"]
    assert not hold.data["decided"] and any(isinstance(r, Event) and r.name == "warning"
                                            and "no decision" in r.data["message"] for r in emitted)


def _train_steps(model, steps):
    import torch

    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(steps):
        loss = model(torch.randn(4, 8)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()


def test_auto_takes_the_best_live_recommendation_that_fits_and_none_when_none_fits(capsys):
    """The ranking puts what fits the budget first; one that does not would only be reverted, over
    the budget, after its window (an optimizer-state offload at 50% of a GPT's peak was)."""
    from advisor.advice import AdviceLoop

    recs = [recommendation("offline", live=False, peak=10, budget_bytes=12),
            recommendation("over", peak=13, budget_bytes=12), recommendation("fits", peak=11, budget_bytes=12)]
    assert AdviceLoop._choose(recs, "auto").id == "fits"
    assert AdviceLoop._choose(recs[:2], "auto") is None
    assert AdviceLoop._choose(recs[:2], "over").id == "over"  # a named one is the user's choice
    assert AdviceLoop._choose([recommendation("compute")], "auto").id == "compute"  # no budget said
    # Under a budget, a remedy that says nothing of memory does not fit it (it once "fitted" an
    # over-budget job); one that leaves memory as it is says so with the measured peak.
    silent = recommendation("comm", peak=None, budget_bytes=20)
    same = recommendation("comm-same", peak=16, budget_bytes=20)
    assert AdviceLoop._choose([silent, same], "auto").id == "comm-same"
    assert AdviceLoop._choose([silent], "auto") is None and not silent.fits


def test_auto_never_chooses_a_live_opt_in_remedy_without_allow_inexact():
    """On 2 DDP ranks `auto` chose gradient compression (live-opt-in) without --allow-inexact; it was
    refused, and the ranks held at the boundary for 60 s."""
    from advisor.advice import AdviceLoop, auto_nothing_reason

    opt_in = recommendation("grad-compression", "grad_compression", apply_class="live-opt-in", exact=False)
    exact = recommendation("checkpoint", peak=11, budget_bytes=12)
    assert AdviceLoop._choose([opt_in], "auto") is None
    assert AdviceLoop._choose([opt_in, exact], "auto").id == "checkpoint"
    assert AdviceLoop._choose([opt_in, exact], "auto", allow_inexact=True).id == "grad-compression"
    assert "--allow-inexact" in auto_nothing_reason([opt_in], allow_inexact=False)


def test_a_refused_choice_releases_the_held_ranks_at_once_and_is_said_in_the_report():
    """The ranks wait at the boundary before K for the decision; a choice that the controller then
    refuses leaves no later decision to wait for: the release goes at once, before advice made
    with step K-2, and the refusal is a warning of the session's."""
    from types import SimpleNamespace

    from advisor.advice import AdviceLoop
    from advisor.records.events import SAID_BY_ADVICE
    from advisor.records.samples import StepSample
    from advisor.state import LiveState

    live, sent, warned = LiveState(), [], []
    session = SimpleNamespace(live=live, options=None, send_command=lambda c: sent.append(c) or 1,
                              warn=lambda message, source=None: warned.append((source, message)))
    loop = AdviceLoop(session, budget_bytes=None, apply="x", apply_at_step=5)
    loop.close()
    loop.apply = lambda rec_id, at_step=None: "refused for the test"  # type: ignore[method-assign]
    live.update(recommendations=[recommendation("x", "t")])
    live.add(StepSample(index=0, time_s=0.1))
    loop._advised_step = 0  # before step K-2 = 3
    loop._maybe_auto_apply()
    assert sent == [{"type": "release"}]
    assert warned == [(SAID_BY_ADVICE, "not applied: refused for the test")]  # printed once, by the loop


def test_the_before_window_takes_every_settled_light_step_it_is_given() -> None:
    """Three light steps of a noisy job read its speed 10-20% off (hf_clm, 4-6 ms steps): the
    before window takes every settled light step the executor hands it (the last 8), not the
    last ``measure_steps``; a deep window keeps the last ``measure_steps``."""
    times = [5.9, 4.8, 4.2, 4.6, 4.0, 4.3]
    before = [_s(1, True, 9.0), *(_s(i, False, t) for i, t in zip(range(3, 9), times))]  # step 2: a light one after deep
    before.insert(1, _s(2, False, 7.0))
    after = [_s(i, False, 6.0) for i in range(9, 14)]
    b, _ = pair(before, after, measure_steps=3)
    assert b.time_steps == (3, 4, 5, 6, 7, 8) and b.step_time_s == pytest.approx(sum(times) / 6)
    deep_before = [_s(i, True, float(i)) for i in range(1, 6)]
    b, _ = pair(deep_before, [_s(i, True, 6.0) for i in range(6, 10)], measure_steps=3)
    assert b.time_steps == (3, 4, 5)
