"""The fused-optimizer remedy: a second remedy added as two files, applied live, reverted."""

from __future__ import annotations

import pytest
import torch
from fakes import FakeContext
from recommendations import wire

from advisor.apply import registry
from advisor.apply.executor import Executor
from advisor.apply.remedies.fused_optimizer import apply_fused_optimizer
from advisor.apply.target import Target
from advisor.recommend.advise import advise
from advisor.recommend.profile import Profile
from advisor.recommend.remedies import check_params, spec
from advisor.records.samples import StepSample

STEPS, AT = 12, 5


@pytest.fixture(autouse=True)
def _one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def make() -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.GELU(), torch.nn.Linear(64, 4))
    return model, torch.optim.AdamW(model.parameters(), lr=1e-2, foreach=True)


def train(model, opt, *, ex: Executor | None = None, ctx: FakeContext | None = None,
          commands: dict[int, dict] | None = None) -> tuple[list[float], list[bool]]:
    gen = torch.Generator().manual_seed(1)
    losses, fused = [], []
    for i in range(STEPS):
        if ex is not None and ctx is not None:
            ctx.step = i
            if i in (commands or {}):
                ex.submit(commands[i])
            ex.on_boundary(i)
        fused.append(bool(opt.param_groups[0]["fused"]))
        x, y = torch.randn(8, 16, generator=gen), torch.randn(8, 4, generator=gen)
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
        if ex is not None:
            ex.on_step_end(StepSample(index=i, time_s=0.1, deep=False))
    return losses, fused


def test_applied_live_at_step_5_keeps_the_losses_and_revert_restores_foreach(monkeypatch) -> None:
    bare, _ = train(*make())
    fused_calls = []
    kernel = torch._fused_adamw_

    def counting(*args, **kwargs):
        fused_calls.append(1)
        return kernel(*args, **kwargs)

    monkeypatch.setattr(torch, "_fused_adamw_", counting)
    model, opt = make()
    ctx = FakeContext([model], [opt])
    ex = Executor(ctx)
    rec = wire("fused-optimizer", "fused_optimizer", params={"optimizers": None}, apply_class="live-equivalent")
    losses, fused = train(model, opt, ex=ex, ctx=ctx, commands={
        0: {"type": "apply", "recommendation": rec, "at_step": AT, "measure_steps": 1},
        10: {"type": "revert"},
    })
    assert fused == [False] * AT + [True] * (10 - AT) + [False] * 2
    assert [r.status for r in ex.results] == ["kept"]
    # The same optimizer object ran fused kernels from step 5: reassociation only.
    assert losses[:AT] == bare[:AT]
    assert len(fused_calls) == 10 - AT  # the fused kernel ran exactly on the steps it was in force
    assert losses == pytest.approx(bare, rel=1e-5, abs=1e-7)
    group = opt.param_groups[0]
    assert group["foreach"] is True and group["fused"] is None
    assert opt.state[model[0].weight]["step"].dtype == torch.float32


def test_apply_is_atomic_and_refuses_what_it_cannot_switch() -> None:
    model, _ = make()
    lbfgs = torch.optim.LBFGS(model.parameters())
    with pytest.raises(ValueError, match="no fused implementation"):
        apply_fused_optimizer(Target(wrapped_models=[model], optimizers=[lbfgs]))
    with pytest.raises(ValueError, match="no optimizer to switch"):
        apply_fused_optimizer(Target(wrapped_models=[model]))
    with pytest.raises(ValueError, match="indexes"):
        apply_fused_optimizer(Target(wrapped_models=[model], optimizers=[lbfgs]), optimizers=[3])


def test_the_rule_proposes_it_for_an_optimizer_bound_step_and_the_spec_checks_params() -> None:
    profile = Profile(peak_bytes=0, step_time_s=0.1, phases={"optimizer_s": 0.05, "forward_s": 0.02, "backward_s": 0.03})
    diagnosis, recs = advise(profile)
    assert diagnosis.bottleneck == "launch_overhead"
    [rec] = recs
    assert rec.remedy == "fused_optimizer" and rec.apply_class == "live-equivalent" and rec.live
    assert rec.predicted.step_time_s == pytest.approx(0.075)
    registry.check_params(rec.remedy, rec.params)  # the applier takes what the predictor proposes
    check_params(rec.remedy, rec.params)
    with pytest.raises(ValueError, match="indexes"):
        check_params("fused_optimizer", {"optimizers": "all"})
    with pytest.raises(ValueError, match=r"takes keywords \['optimizers'\]"):
        check_params("fused_optimizer", {"lr": 1})
    assert spec("fused_optimizer").phase == "optimizer"
    quiet = Profile(peak_bytes=0, step_time_s=0.1, phases={"optimizer_s": 0.01})
    assert advise(quiet)[0].bottleneck == "none"


@pytest.mark.gpu
def test_on_cuda_the_step_counters_move_to_the_device_and_back() -> None:
    model = torch.nn.Linear(8, 8).cuda()
    opt = torch.optim.Adam(model.parameters(), foreach=True)
    model(torch.ones(2, 8, device="cuda")).sum().backward()
    opt.step()
    assert opt.state[model.weight]["step"].device.type == "cpu"
    handle = apply_fused_optimizer(Target(wrapped_models=[model], optimizers=[opt]))
    assert opt.state[model.weight]["step"].device.type == "cuda"  # fused kernels read it on the device
    opt.step()
    handle.revert()
    assert opt.param_groups[0]["foreach"] is True and opt.state[model.weight]["step"].device.type == "cpu"
    assert float(opt.state[model.weight]["step"]) == 2.0


def test_the_memory_bottlenecks_remedy_ranks_before_a_faster_optimizer() -> None:
    """Found on examples/gpt.py under load: the optimizer share passed 25% while memory was over
    budget, and `--apply auto` took the fused optimizer (faster predicted step) over checkpointing."""
    from profiles import records_profile
    from test_recommend_advise import gpt_report

    report = gpt_report(budget_share=0.95)
    for step in report["steps"]:
        step["phases"]["optimizer_s"] = 0.3  # 60% of the 0.5 s step
    diagnosis, recs = advise(records_profile(**report))
    assert diagnosis.bottleneck == "memory"
    assert [r.remedy for r in recs] == ["activation_checkpointing", "fused_optimizer"]
