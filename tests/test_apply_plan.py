"""Plan files: round trip, validation, and application before the first forward."""

from __future__ import annotations

import json

import pytest
import torch
from fakes import FakeContext
from test_apply_checkpoint import make, saved_tensor_count, train

from advisor.apply.remedies.activation_checkpointing import is_checkpointed
from advisor.apply.executor import Executor
from advisor.apply.plan import apply_plan_before_first_step, check_entry, install_plan_hook, load_plan
from advisor.records.plan import PLAN_VERSION, Plan, PlanEntry, PlanError, parse_plan, save_plan
from advisor.records.samples import StepSample

PLAN = Plan(remedies=(PlanEntry(remedy="activation_checkpointing", params={"modules": ["blocks.0", "blocks.2"]},
                                recommendation_id="r1"),))


@pytest.fixture(autouse=True)
def _one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def test_round_trip(tmp_path) -> None:
    path = tmp_path / "plan.json"
    save_plan(PLAN, path)
    assert json.loads(path.read_text())["version"] == PLAN_VERSION
    assert load_plan(path) == PLAN


@pytest.mark.parametrize("data, message", [
    ([], "expected a JSON object"),
    ({"version": "advisor.plan/9", "remedies": []}, "advisor.plan/1"),
    ({"version": PLAN_VERSION, "remedies": {}}, "must be a list"),
    ({"version": PLAN_VERSION, "remedies": [{"remedy": "teleport"}]}, r"remedies\[0\].*activation_checkpointing"),
    ({"version": PLAN_VERSION, "remedies": [{"remedy": "activation_checkpointing"}]}, "missing.*modules"),
    ({"version": PLAN_VERSION, "remedies": [{"remedy": "activation_checkpointing", "params": {"modules": [],
                                             "policy": "x"}}]}, "unknown.*policy"),
    ({"version": PLAN_VERSION, "remedies": [{"remedy": "activation_checkpointing", "extra": 1}]}, "unknown keys"),
])
def test_validation_errors(data, message) -> None:
    with pytest.raises(PlanError, match=message):
        parse_plan(data, check=check_entry)


def test_load_errors(tmp_path) -> None:
    with pytest.raises(PlanError, match="cannot read"):
        load_plan(tmp_path / "missing.json")
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(PlanError, match="not JSON"):
        load_plan(tmp_path / "bad.json")


def test_plan_applies_in_first_forward_pre_hook_and_is_exact() -> None:
    base_model, base_opt = make()
    baseline = train(base_model, base_opt, 5)
    plain_saved = saved_tensor_count(make()[0])

    model, opt = make()
    ctx = FakeContext([model], [opt])
    ex = Executor(ctx)
    install_plan_hook(model, ctx, PLAN, executor=ex)
    assert not is_checkpointed(model.blocks[0])  # nothing happens before the first forward
    # The very first forward already runs checkpointed: fewer tensors saved than the plain model.
    assert saved_tensor_count(model)[0] < plain_saved[0]
    assert is_checkpointed(model.blocks[0]) and is_checkpointed(model.blocks[2])
    assert [e.name for e in ctx.of_kind("event")] == ["apply_started"]

    model2, opt2 = make()
    ctx2 = FakeContext([model2], [opt2])
    ex2 = Executor(ctx2)
    install_plan_hook(model2, ctx2, PLAN, executor=ex2)

    def boundary(i: int) -> None:
        ctx2.step = i
        ex2.on_boundary(i)
        if i > 0:
            ex2.on_step_end(StepSample(index=i - 1, time_s=0.1, peak_memory_bytes=1000))

    assert train(model2, opt2, 5, boundary) == baseline
    [result] = [e.data for e in ctx2.of_kind("event") if e.name == "apply_result"]
    assert result["status"] == "kept" and result["at_step"] == 0 and result["recommendation_id"] == "r1"
    assert result["measured"]["after"]["steps"] == [0, 1, 2, 3]
    assert result["measured"]["after"]["peak_memory_bytes"] == 1000


def test_failing_entry_reported_others_applied() -> None:
    model, _ = make()
    ctx = FakeContext([model])
    plan = Plan(remedies=(PlanEntry(remedy="activation_checkpointing", params={"modules": ["nope"]}),
                          PlanEntry(remedy="activation_checkpointing", params={"modules": ["blocks.1"]})))
    results = apply_plan_before_first_step(ctx, plan)
    assert [r.status for r in results] == ["failed", "kept"]
    assert "blocks" in (results[0].error or "")
    assert is_checkpointed(model.blocks[1]) and not is_checkpointed(model.blocks[0])
    assert [e.data["status"] for e in ctx.of_kind("event") if e.name == "apply_result"] == ["failed", "kept"]
