"""The memory tracker's walk of parameters, gradients and optimizer state (``refresh_roles``)
runs again only when something went through it since the last walk: at 5001 modules a walk is
50 ms, and a deep step asked for one at each phase, after its optimizer step and at its end."""

from __future__ import annotations

import torch

from advisor.probes.memory import tracker as tracker_module
from advisor.probes.memory.tracker import StorageTracker


def test_a_walk_with_nothing_new_since_the_last_is_skipped_and_anything_new_walks_again(monkeypatch):
    walks = []
    real = tracker_module.role_tensors

    def counted(models, optimizers):
        walks.append(1)
        return real(models, optimizers)

    monkeypatch.setattr(tracker_module, "role_tensors", counted)
    model = torch.nn.Linear(4, 2)
    opt = torch.optim.Adam(model.parameters())
    tracker = StorageTracker(device_type="cpu")
    tracker.start()
    try:
        tracker.refresh_roles([model], [opt])
        tracker.refresh_roles([model], [opt])
        assert len(walks) == 1  # nothing ran between
        model(torch.randn(3, 4)).sum().backward()
        opt.step()  # the states Adam made are walked, and named
        tracker.refresh_roles([model], [opt])
        assert len(walks) == 2
        state = opt.state[model.weight]["exp_avg"]
        assert tracker.roles[state.untyped_storage()._cdata] == "optimizer_state"
        tracker.refresh_roles([model], [])  # another set of optimizers: walked
        assert len(walks) == 3
        tracker.pause()
        tracker.resume()  # light steps ran between, unseen
        tracker.refresh_roles([model], [])
        assert len(walks) == 4
    finally:
        tracker.stop()
