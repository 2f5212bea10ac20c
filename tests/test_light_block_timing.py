"""Recompute cost from light steps (issue 14): the agent times its numbered modules' forward on
one light step in N, the record carries it, and the checkpointing cost model reads it."""

from __future__ import annotations

import itertools

import pytest
import torch
from profiles import records_profile
from torch.utils.checkpoint import checkpoint

from advisor.agent import block_timer
from advisor.agent.agent import Agent
from advisor.agent.hooks import install
from advisor.intake import RecordError, parse_record
from advisor.recommend.memory_model import chain_from_profile, recompute_seconds
from advisor.recommend.profile import ModuleProfile, Profile
from advisor.records.samples import StepSample
from advisor.records.settings import AgentSettings
from fakes import Emitted


class Block(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.inner = torch.nn.Linear(8, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.relu(self.inner(x))


class Net(torch.nn.Module):
    def __init__(self, *, checkpointed: bool = False) -> None:
        super().__init__()
        self.blocks = torch.nn.ModuleList(Block() for _ in range(3))
        self.head = torch.nn.Linear(8, 1)
        self.checkpointed = checkpointed

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for i, block in enumerate(self.blocks):
            if self.checkpointed and i == 1:
                x = checkpoint(block, x, use_reentrant=False)
            else:
                x = block(x)
        return self.head(x)


@pytest.fixture
def clock(monkeypatch: pytest.MonkeyPatch) -> None:
    """A clock that advances by exactly 1 s per read: each timed call adds 1.0 to its module."""
    ticks = itertools.count()
    monkeypatch.setattr(block_timer.time, "perf_counter", lambda: float(next(ticks)))


def _run(config: dict, steps: int, model: torch.nn.Module, *, calls: int = 1) -> list[StepSample]:
    emitted = Emitted()
    agent = Agent(emit=emitted.append, settings=AgentSettings(**{"deep_steps": (), **config}))
    hooks = install(agent)
    try:
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        for _ in range(steps):
            loss = sum(model(torch.randn(4, 8)).sum() for _ in range(calls))
            loss.backward()
            opt.step()
            opt.zero_grad()
        agent.flush(sync=True)
    finally:
        hooks.remove()
    return [r for r in emitted if isinstance(r, StepSample)]


def test_one_light_step_in_n_times_the_numbered_modules(clock: None) -> None:
    steps = _run({"light_timing_every": 3}, 7, Net())
    timed = {s.index: s.module_forward_s for s in steps if s.module_forward_s}
    assert sorted(timed) == [2, 5]  # steps every-1, 2*every-1: every other step carries nothing
    # Only the container's numbered members: not "head", not the blocks' "inner" Linear; one
    # call each. Between its pre and post hooks a call reads the clock once per tensor autograd
    # saves (the recompute spans' marks; the inner module's look-up reads none; a module without
    # pre-hooks of its own starts its forward at the call's start, no read of its own): blocks.0
    # saves its input and the ReLU's output, the later blocks the weight too (their input needs a
    # gradient).
    assert timed[2] == {"blocks.0": 3.0, "blocks.1": 4.0, "blocks.2": 4.0}
    # A recompute span runs from the forward's start to the call's last save: here the ReLU's
    # output, the last op.
    assert steps[2].module_recompute_s == {"blocks.0": 2.0, "blocks.1": 3.0, "blocks.2": 3.0}


def test_calls_add_up_and_recomputation_in_backward_is_not_counted(clock: None) -> None:
    steps = _run({"light_timing_every": 2}, 2, Net(checkpointed=True), calls=2)
    # Two forwards in the step: each block's two calls add up. blocks.1 is checkpointed: its
    # forward runs again inside backward, which is recompute, not the training forward. Its own
    # checkpoint's hooks hide its saves: no recompute span (the forward stands for it).
    assert steps[1].module_forward_s == {"blocks.0": 6.0, "blocks.1": 2.0, "blocks.2": 8.0}
    assert steps[1].module_recompute_s == {"blocks.0": 4.0, "blocks.2": 6.0}


class Projected(torch.nn.Module):
    """A transformer MLP's shape: the last matmul's input is saved, its output is not."""

    def __init__(self) -> None:
        super().__init__()
        self.up, self.down = torch.nn.Linear(8, 32), torch.nn.Linear(32, 8)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.down(torch.relu(self.up(x)))


def test_the_recompute_span_is_what_a_checkpoint_recomputes(monkeypatch: pytest.MonkeyPatch) -> None:
    """The clock counts aten ops. The span the timer reports for a block equals the ops PyTorch's
    checkpoint runs again in backward: it stops at the last saved tensor, so the last matmul and
    the residual add are not recomputed. The forward span counts them."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class OpClock(TorchDispatchMode):
        ops = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            if func is not torch.ops.aten.detach.default:  # the checkpoint's own bookkeeping
                OpClock.ops += 1
            return func(*args, **(kwargs or {}))

    monkeypatch.setattr(block_timer.time, "perf_counter", lambda: float(OpClock.ops))

    class Net(torch.nn.Module):
        def __init__(self, checkpointed: bool = False) -> None:
            super().__init__()
            self.blocks = torch.nn.ModuleList([Projected(), Projected()])
            self.checkpointed = checkpointed
            self.spans: list[int] = []

        def _counted(self, x: torch.Tensor) -> torch.Tensor:
            start = OpClock.ops
            try:
                return self.blocks[1](x)
            finally:  # the recomputation ends in an exception at the last save
                self.spans.append(OpClock.ops - start)

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            x = self.blocks[0](x)
            return checkpoint(self._counted, x, use_reentrant=False) if self.checkpointed else self.blocks[1](x)

    torch.manual_seed(0)
    plain = Net()
    with OpClock():
        step = _run({"light_timing_every": 2}, 2, plain)[1]  # step 1 is the timed one
    reference = Net(checkpointed=True)
    reference.load_state_dict(plain.state_dict())
    with OpClock():
        reference(torch.randn(4, 8)).sum().backward()
    forward, recomputed = reference.spans
    assert (forward, recomputed) == (6, 4)  # t addmm relu t [addmm add]: the early stop skipped the tail
    assert step.module_recompute_s["blocks.1"] == recomputed
    assert step.module_forward_s["blocks.1"] == forward


def test_a_modules_own_pre_hook_is_in_its_forward_not_in_its_recompute(monkeypatch: pytest.MonkeyPatch) -> None:
    """A checkpoint runs a module's forward again, not its hooks: FSDP2's pre-forward hook (put
    first, ``prepend=True``) waits for the layer's all-gather, and the recomputation inside the
    layer's backward does not repeat it. The clock counts aten ops: the hook's ops are in the
    block's forward time and not in its recompute span (the zoo's FSDP2 layers' recompute read 3x
    what checkpointing them cost when they were)."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class OpClock(TorchDispatchMode):
        ops = 0

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            OpClock.ops += 1
            return func(*args, **(kwargs or {}))

    monkeypatch.setattr(block_timer.time, "perf_counter", lambda: float(OpClock.ops))

    def gather(module: torch.nn.Module, args: tuple) -> None:  # three ops, like an unshard's copy-out
        torch.zeros(64).add_(1).mul_(2)

    def spans(hooked: bool) -> tuple[float, float]:
        torch.manual_seed(0)
        model = torch.nn.Sequential(Projected(), Projected())
        if hooked:
            model[1].register_forward_pre_hook(gather, prepend=True)
        with OpClock():
            step = _run({"light_timing_every": 2}, 2, model)[1]
        return step.module_forward_s["1"], step.module_recompute_s["1"]

    (forward, recompute), (hooked_forward, hooked_recompute) = spans(False), spans(True)
    assert hooked_forward == forward + 3
    assert hooked_recompute == recompute > 0


def test_deep_steps_and_disabled_sampling_carry_nothing() -> None:
    emitted = Emitted()
    agent = Agent(emit=emitted.append, settings=AgentSettings(deep_steps=(4,), light_timing_every=5))
    assert agent.deep.light_timing_due(4) and not agent.deep.light_timing_due(5)
    off = Agent(emit=emitted.append, settings=AgentSettings(light_timing_every=0))
    assert not any(off.deep.light_timing_due(i) for i in range(20))
    steps = _run({"light_timing_every": 5, "deep_steps": (4,)}, 6, Net())
    assert all(not s.module_forward_s for s in steps)  # step 4 was deep: no light timing


def test_a_due_timing_right_after_deep_steps_moves_to_the_next_light_step() -> None:
    """The step after deep ones pays for their teardown (1.3-3x an ordinary step on 2 cores):
    blocks timed there priced a checkpoint's recompute up to 3x what it cost. Step 4 is due
    but follows the deep steps 1-3, so step 5 times; step 9, after light steps, times as due."""
    steps = _run({"light_timing_every": 5, "deep_steps": (1, 2, 3)}, 11, Net())
    assert [s.index for s in steps if s.module_forward_s] == [5, 9]


def test_intake_accepts_the_field_and_rejects_a_negative_time() -> None:
    good = parse_record("step", {"index": 4, "time_s": 0.1, "module_forward_s": {"blocks.0": 0.01}})
    assert good.module_forward_s == {"blocks.0": 0.01}
    assert parse_record("step", {"index": 3, "time_s": 0.1}).module_forward_s == {}  # older agents
    with pytest.raises(RecordError, match="negative"):
        parse_record("step", {"index": 4, "time_s": 0.1, "module_forward_s": {"blocks.0": -0.01}})
    with pytest.raises(RecordError):
        parse_record("step", {"index": 4, "time_s": 0.1, "module_forward_s": {"blocks.0": "1"}})


def _module(name: str, forward_s: float) -> dict:
    return {"name": name, "activation_bytes": 1000, "input_bytes": 100, "output_bytes": 100, "forward_s": forward_s}


def _steps(light: list[dict[str, float]]) -> list[dict]:
    deep = [{"index": i, "time_s": 0.4, "deep": True, "phases": {"forward_s": 0.2}} for i in (1, 2)]
    first = {"index": 0, "time_s": 0.9, "phases": {"forward_s": 0.5}, "module_forward_s": {"blocks.0": 9.0}}
    rest = [{"index": 4 + 5 * k, "time_s": 0.2, "phases": {"forward_s": 0.1}, "module_forward_s": timing}
            for k, timing in enumerate(light)]
    return [first, *deep, *rest]


def test_profile_takes_the_median_of_light_steps_and_the_chain_uses_it() -> None:
    modules = [_module("", 0.2), _module("blocks.0", 0.05), _module("blocks.1", 0.05)]
    light = [{"blocks.0": 0.010, "blocks.1": 0.020}, {"blocks.0": 0.012, "blocks.1": 0.030},
             {"blocks.0": 0.020}]
    profile = records_profile(peak_bytes=10_000, modules=modules, steps=_steps(light))
    # Step 0 (warm-up) is left out; blocks.1 was timed on two steps only.
    assert profile.light_forward_s == {"blocks.0": 0.012, "blocks.1": 0.025}
    assert profile.time_scale == pytest.approx(0.5)  # light forward 0.1 / probed root 0.2
    chain = chain_from_profile(profile)
    assert chain is not None
    assert [b.forward_s for b in chain.blocks] == [0.012, 0.025]
    # Without light timings (an older agent's records) the deep step's module time is scaled.
    bare = records_profile(peak_bytes=10_000, modules=modules, steps=[s for s in _steps([{}]) if s["index"] != 0])
    assert bare.light_forward_s == {}
    assert [b.forward_s for b in chain_from_profile(bare).blocks] == [pytest.approx(0.025)] * 2


def test_recompute_seconds_falls_back_per_module() -> None:
    profile = Profile(peak_bytes=1, time_scale=0.25, light_forward_s={"blocks.0": 0.003, "blocks.2": 0.004},
                      light_recompute_s={"blocks.2": 0.003})
    assert recompute_seconds(profile, ModuleProfile(name="blocks.0", forward_s=0.1)) == 0.003
    assert recompute_seconds(profile, ModuleProfile(name="blocks.1", forward_s=0.1)) == pytest.approx(0.025)
    assert recompute_seconds(profile, ModuleProfile(name="blocks.2", forward_s=0.1)) == 0.003  # the span


def test_the_chain_costs_a_checkpoint_by_the_recompute_span_and_keeps_the_forward() -> None:
    """The steps' recompute spans reach the chain: the checkpointing cost sums them, while the
    forward (what an offloaded block's copy hides behind) stays the forward."""
    from advisor.recommend.memory_model import recompute_s

    modules = [_module("", 0.2), _module("blocks.0", 0.05), _module("blocks.1", 0.05)]
    steps = _steps([{"blocks.0": 0.010, "blocks.1": 0.020}])
    steps[-1]["module_recompute_s"] = {"blocks.0": 0.008}
    chain = chain_from_profile(records_profile(peak_bytes=10_000, modules=modules, steps=steps))
    assert [(b.forward_s, b.recompute_s) for b in chain.blocks] == [(0.010, 0.008), (0.020, 0.020)]
    assert recompute_s(chain, {0, 1}) == pytest.approx(0.028)


@pytest.mark.gpu
def test_cuda_times_the_kernels_not_the_launches() -> None:
    """On CUDA the timer records events on the stream: a block that sleeps on the device for
    20 ms (torch.cuda._sleep) reads about 20 ms although its launch returns at once, and the
    sample is emitted without a synchronisation the script did not make."""
    torch.cuda.init()
    cycles = 20_000_000
    # Each sleep's own events are the reference: _sleep counts clock cycles, and the clock rises
    # under load (a sleep timed once beforehand read 19.4 ms, the same sleep in the step 10.1 ms).
    references: list[tuple[torch.cuda.Event, torch.cuda.Event]] = []

    class Sleepy(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            torch.cuda._sleep(cycles)
            end.record()
            references.append((start, end))
            return x * 1.0

    class Net(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.blocks = torch.nn.ModuleList([Sleepy(), torch.nn.Linear(8, 8)])

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.blocks[1](self.blocks[0](x))

    model = Net().cuda()
    emitted = Emitted()
    agent = Agent(emit=emitted.append, settings=AgentSettings(deep_steps=(), light_timing_every=2))
    hooks = install(agent)
    try:
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        for _ in range(4):
            model(torch.randn(4, 8, device="cuda")).sum().backward()
            opt.step()
            opt.zero_grad()
        agent.flush(sync=True)
    finally:
        hooks.remove()
    torch.cuda.synchronize()
    sleeps = [start.elapsed_time(end) / 1e3 for start, end in references]
    samples = [s for s in emitted if isinstance(s, StepSample) and s.module_forward_s]
    timed = [(s.index, s.module_forward_s) for s in samples]
    assert [index for index, _ in timed] == [1, 3]
    for index, t in timed:
        assert t["blocks.0"] == pytest.approx(sleeps[index], rel=0.2), (t, sleeps)
        assert t["blocks.1"] < sleeps[index] / 10
    for s in samples:  # the sleep saves nothing (no span); the Linear saves its input before its matmul
        assert "blocks.0" not in s.module_recompute_s, s.module_recompute_s
        assert 0 <= s.module_recompute_s["blocks.1"] <= s.module_forward_s["blocks.1"]


def test_the_first_timed_light_step_follows_the_deep_ones() -> None:
    from advisor.records.schedule import first_timed_light_step, light_timing_due

    # the default: step 4 is due but follows the deep steps; step 5 times (what an apply at step 7 reads)
    assert first_timed_light_step([1, 2, 3]) == 5
    assert first_timed_light_step([4]) == 9  # a deep step 4 is not timed: the next one is
    assert first_timed_light_step([1]) == 4 and first_timed_light_step([]) is None
    assert first_timed_light_step([1, 2, 3, 5]) == 7  # owed past a later deep step and the one after it
    assert first_timed_light_step([1, 2, 3], every=0) is None
    assert [k for k in range(12) if light_timing_due(k)] == [4, 9]


def test_block_timing_backs_off_as_the_run_grows() -> None:
    """Ten timings at the period asked for, then the period doubles after each ten more, up to 16
    times it: a timed step costs more than another, and a long run does not pay for it for good."""
    from advisor.records.schedule import light_timing_due

    due = [k for k in range(2000) if light_timing_due(k)]
    assert due[:10] == list(range(4, 50, 5))  # the first ten: one step in five, as before
    assert due[10:20] == list(range(59, 150, 10)) and due[20:30] == list(range(169, 350, 20))
    gaps = [b - a for a, b in zip(due, due[1:])]
    assert max(gaps) == 80 and gaps[-5:] == [80] * 5  # capped at 16 x 5
    assert len(due) == 55  # against 400 at one step in five
    assert [k for k in range(40) if light_timing_due(k, 3)][:10] == list(range(2, 30, 3))
    assert not any(light_timing_due(k, 0) for k in range(100))


def test_a_long_run_times_its_blocks_on_the_backed_off_steps() -> None:
    steps = _run({"light_timing_every": 2}, 80, Net())
    timed = [s.index for s in steps if s.module_forward_s]
    # every 2nd step ten times (1..19), then every 4th ten times (23..59), then every 8th
    assert timed == [*range(1, 20, 2), *range(23, 60, 4), 67, 75]


def test_closing_the_agent_in_a_timed_step_takes_the_saved_tensor_hooks_off() -> None:
    """A script that ends inside a timed light step, or a caller that uninstalls the hooks there,
    leaves no hook of the advisor's on autograd (the full suite once found another test's timer
    still on the stack)."""
    top = torch._C._autograd._top_saved_tensors_default_hooks  # (pack, unpack) on top, or None
    for ending in ("close", "uninstall"):
        before = top(False)
        model = Net()
        agent = Agent(emit=lambda record: None, settings=AgentSettings(deep_steps=(), light_timing_every=2))
        hooks = install(agent)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        try:
            model(torch.randn(4, 8)).sum().backward()
            opt.step()  # the boundary starts the timed step 1
            assert agent.boundaries.timer.active and top(False) != before
            if ending == "close":
                agent.close()
        finally:
            hooks.remove()
        assert not agent.boundaries.timer.active
        assert top(False) == before, ending


def test_a_timed_step_keeps_no_graph_that_no_backward_freed_and_changes_no_gradient() -> None:
    """The timer's hooks pack a detached alias: a forward with gradients on that never ran backward
    (a metric) leaves nothing alive (a tensor packed as itself, a saved output, holds its own
    graph in a cycle), and the gradients of a timed step, double backward included, are bit for
    bit an untimed step's."""
    import gc
    import weakref

    def penalty_grads(model: torch.nn.Module, x: torch.Tensor) -> list[torch.Tensor]:
        out = torch.sigmoid(model(x)).pow(2).sum()
        (g,) = torch.autograd.grad(out, x, create_graph=True)
        g.pow(2).sum().backward()
        return [p.grad.clone() for p in model.parameters()]

    torch.manual_seed(0)
    model, x = Net(), torch.randn(4, 8, requires_grad=True)
    reference = penalty_grads(model, x)
    model.zero_grad()
    timer = block_timer.BlockTimer(counting=lambda: True)
    names = {id(m): (name, weakref.ref(m)) for name, m in model.named_modules() if block_timer.numbered(name)}
    handles = []

    def subscribe(pre, post, modules=None):
        handles.extend([torch.nn.modules.module.register_module_forward_pre_hook(pre),
                        torch.nn.modules.module.register_module_forward_hook(post)])
        return lambda: [h.remove() for h in handles]

    timer.start(names, subscribe)
    try:
        metric = torch.sigmoid(model(torch.randn(4, 8)))  # gradients on, never backward
        alive = weakref.ref(metric)
        del metric
        gc.collect()
        assert alive() is None
        timed = penalty_grads(model, x)
    finally:
        timer.stop()
    assert all(torch.equal(a, b) for a, b in zip(timed, reference))


def test_a_timed_step_hooks_its_blocks_only(monkeypatch: pytest.MonkeyPatch) -> None:
    """The global pair is lifted on a timed step too: the blocks' inner modules run unhooked (as on
    any light step, so a block's time is what it costs there), the blocks through hooks of their
    own for the forward's length; none is left on them after it."""
    from torch.nn.modules import module as nn_module

    seen: dict[int, list[str]] = {}
    model = Net()
    names = {id(m): name for name, m in model.named_modules()}
    original = Agent.forward_pre

    def forward_pre(self, module):
        seen.setdefault(self.clock.step, []).append(names.get(id(module), "?"))
        return original(self, module)

    monkeypatch.setattr(Agent, "forward_pre", forward_pre)
    from test_forward_hooks import forget_compiles

    forget_compiles()  # an earlier test's compile would keep the pair on
    from advisor.agent.forward_hooks import ForwardHooks

    monkeypatch.setattr(ForwardHooks, "MIN_MODULES", 2)  # this Net is small
    inner: list[tuple[int, int]] = []
    model.blocks[1].inner.register_forward_pre_hook(
        lambda module, args: inner.append((len(nn_module._global_forward_pre_hooks), len(model.blocks[1]._forward_hooks))))
    before = len(nn_module._global_forward_pre_hooks)
    steps = _run({"light_timing_every": 2}, 3, model)
    assert steps[1].module_forward_s and not steps[0].module_forward_s and not steps[2].module_forward_s
    assert seen[0] == seen[2] == [""]  # light steps: the top-level forward only
    assert seen[1] == ["", "blocks.0", "blocks.1", "blocks.2"]  # the timed step: and its blocks
    assert inner[1] == (before, 1)  # inside the timed block: no global pair, the block's own hook
    assert not any(m._forward_hooks or m._forward_pre_hooks for m in model.blocks)
