"""A fit sizes the value-shaped ops of a top-k router from the nonzero count its mask implies, and
runs LBFGS as if it ran to its limits."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from fakes import saved_bytes

from advisor.fit.patches import Patches
from advisor.fit.reads import Reads, install_array_reads
from advisor.fit.tensors import FitTensorMode

TOKENS, EXPERTS, K, WIDTH, HIDDEN = 48, 6, 2, 16, 24


class _Stopped(Exception):
    pass


@pytest.fixture()
def fit():
    """A fit's fake world as ``FitWorld`` wires it: the mode, its reads, the array reads."""
    reads = Reads(steps=3, steps_done=lambda: 1, stop=_Stopped)
    mode = FitTensorMode(target=None, on_unrunnable=reads.unrunnable)
    reads.counted = mode.sparsity.values
    patches = Patches()
    install_array_reads(patches, reads)
    try:
        yield mode, reads
    finally:
        patches.restore()


def _experts() -> list[torch.nn.Module]:
    torch.manual_seed(1)
    return [torch.nn.Sequential(torch.nn.Linear(WIDTH, HIDDEN), torch.nn.ReLU(), torch.nn.Linear(HIDDEN, WIDTH))
            for _ in range(EXPERTS)]


def _scatter_router(experts, x, logits) -> torch.Tensor:
    """The zoo's moe.py dispatcher: gates scattered onto zeros, ``nonzero``, per-expert sizes read."""
    top, index = logits.topk(K, dim=1)
    gates = torch.zeros_like(logits).scatter(1, index, top.softmax(1))
    order, sort_index = torch.nonzero(gates).sort(0)
    batch_index = torch.nonzero(gates)[sort_index[:, 1], 0]
    sizes = (gates > 0).sum(0).tolist()
    parts = torch.split(x[batch_index], sizes, dim=0)
    outs = torch.cat([expert(part) for expert, part in zip(experts, parts)], 0)
    return torch.zeros(x.shape[0], WIDTH).index_add(0, batch_index, outs)


def _one_hot_router(experts, x, logits) -> torch.Tensor:
    """Mixtral's loop: ``one_hot`` of the chosen experts, ``torch.where`` per expert."""
    weights, chosen = logits.softmax(1).topk(K, dim=1)
    mask = F.one_hot(chosen, num_classes=EXPERTS).permute(2, 1, 0)
    out = torch.zeros(x.shape[0], WIDTH)
    for e, expert in enumerate(experts):
        slot, token = torch.where(mask[e])
        out = out.index_add(0, token, expert(x[token]) * weights[token, slot, None])
    return out


@pytest.mark.parametrize("router", [_scatter_router, _one_hot_router])
def test_a_top_k_router_saves_as_much_under_the_fit_as_for_real(fit, router) -> None:
    """Each expert's batch is routing's (an estimate: balanced), but their rows add up to tokens x k
    whatever the routing, and what an expert saves is linear in its rows: the total is exact."""
    mode, reads = fit
    experts = _experts()
    real = saved_bytes(lambda: router(experts, torch.randn(TOKENS, WIDTH), torch.randn(TOKENS, EXPERTS)))
    with mode:
        fakes = _experts()
        fitted = saved_bytes(lambda: router(fakes, torch.empty(TOKENS, WIDTH), torch.empty(TOKENS, EXPERTS)))
    assert fitted == real > TOKENS * K * HIDDEN * 4
    sized = mode.sparsity.sized
    assert sized, "the value-shaped ops were sized and listed by line"
    lines = {code for (_, _, code, op) in sized}
    if router is _scatter_router:
        assert any("torch.nonzero(gates)" in code for code in lines)
        reads_ = [rows for (_, _, code, op), (calls, rows) in sized.items() if op == "read"]
        assert reads_ == [TOKENS * K]  # the per-expert sizes, read once, add up to tokens x k
    else:
        rows = sum(rows for (_, _, code, op), (calls, rows) in sized.items() if op == "aten.nonzero")
        assert rows == TOKENS * K  # each expert's share, the remainder to the first
    assert not reads.log.placeholders


def test_a_mask_the_fit_cannot_count_still_stops_it(fit) -> None:
    mode, reads = fit
    with mode:
        x = torch.empty(8, 4)
        with pytest.raises(_Stopped, match="nonzero"):
            torch.nonzero(x > 0)  # values the model computed: no count
        mask = torch.zeros(8, 4).scatter(1, torch.zeros(8, 1, dtype=torch.long), 1.0)
        assert torch.nonzero(mask).shape == (8, 2)
        mask.add_(x)  # an op the count cannot follow: forgotten
        with pytest.raises(_Stopped, match="nonzero"):
            torch.nonzero(mask)


def _lbfgs_history(make, closure_of) -> int:
    torch.manual_seed(0)
    model = make()
    optimizer = torch.optim.LBFGS(model.parameters(), lr=0.5, max_iter=6, history_size=10)
    closure = closure_of(model, optimizer)
    for _ in range(2):
        optimizer.step(closure)
    state = optimizer.state[optimizer._params[0]]
    return len(state["old_dirs"])


def test_lbfgs_runs_to_its_limits_under_a_fit(fit) -> None:
    """Placeholders answered its curvature test "no pair" and its loss test "no change": every step
    ended after one iteration with an empty history. Answered as a solver that runs to max_iter,
    the history is a real non-converged run's (5 pairs a step here, 10 kept)."""
    mode, reads = fit

    def closure_of(model, optimizer):
        x, y = torch.randn(64, 8), torch.randn(64, 1)

        def closure():
            optimizer.zero_grad()
            loss = F.mse_loss(model(x), y)
            loss.item()  # the script's own read: a placeholder, as before
            loss.backward()
            return loss
        return closure

    def make():
        return torch.nn.Sequential(torch.nn.Linear(8, 32), torch.nn.Tanh(), torch.nn.Linear(32, 1))

    real = _lbfgs_history(make, closure_of)
    with mode:
        fitted = _lbfgs_history(make, closure_of)
    assert fitted == real == 10
    assert reads.solvers.counts["LBFGS"] > 0
    assert sum(reads.log.placeholders.values()) == 2 * 6  # the closure's reads stay the script's
