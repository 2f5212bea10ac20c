"""A user revert on several ranks: every rank reverts at the command's boundary, after a vote
over the keep/revert agreement, however late the command reached it (tests/apply_scripts/user_revert.py
on 2 gloo ranks); and on one process, the revert waits for its boundary too."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from fakes import FakeContext
from ranks import free_port, spawn_ranks
from recommendations import recommendation

from advisor.apply import registry
from advisor.apply.executor import Executor
from advisor.apply.user_revert import vote_user_revert
from advisor.records.commands import ApplyCommand, RevertCommand, command_from_dict
from advisor.records.samples import StepSample


def run(tmp_path: Path, voted: bool) -> list[dict]:
    from apply_scripts.user_revert import worker

    folder = tmp_path / ("voted" if voted else "unvoted")
    folder.mkdir()
    spawn_ranks(worker, (2, free_port(), voted, str(folder)), 2, [folder / f"rank{r}.json" for r in range(2)])
    return [json.loads((folder / f"rank{r}.json").read_text()) for r in range(2)]


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_every_rank_reverts_at_the_commands_boundary_however_late_it_came(tmp_path) -> None:
    from apply_scripts.user_revert import REVERT_AT, SEEN

    ranks = run(tmp_path, voted=True)
    for r in ranks:
        assert r["kept"] == ["kept"]
        assert [(e["at_step"], e["reason"]) for e in r["reverted"]] == [(REVERT_AT, "reverted on request")]
    assert ranks[0]["params"] == ranks[1]["params"]  # the same learning rate at every step on both
    # Without an at_step (what the controller sent before) each rank used to revert where it heard
    # of it, rank 0 at SEEN and rank 1 a step later, and the replicas drifted apart. The ranks now
    # agree on the boundary through the job's store whatever the command says.
    unvoted = run(tmp_path, voted=False)
    [at0], [at1] = ([e["at_step"] for e in r["reverted"]] for r in unvoted)
    assert at0 == at1 > SEEN
    assert unvoted[0]["params"] == unvoted[1]["params"]


def _step(ex: Executor, ctx: FakeContext, i: int) -> None:
    ctx.step = i
    ex.on_boundary(i)
    ex.on_step_end(StepSample(index=i, time_s=0.1))


def test_a_revert_with_a_step_waits_for_its_boundary() -> None:
    applied: list[float] = []

    class Handle:
        def revert(self) -> None:
            applied.append(-1.0)

    def apply_mark(target, *, factor: float) -> Handle:
        applied.append(factor)
        return Handle()

    registry.register("t_mark", apply_mark)
    try:
        ctx = FakeContext([torch.nn.Linear(2, 2)])
        ex = Executor(ctx)
        ex.submit(ApplyCommand(recommendation=recommendation("m", "t_mark", params={"factor": 2.0}),
                               at_step=1, measure_steps=1))
        for i in range(5):
            _step(ex, ctx, i)
        assert applied == [2.0] and [r.status for r in ex.results] == ["kept"]
        ex.submit(command_from_dict(RevertCommand(at_step=7).to_dict()))
        _step(ex, ctx, 5)
        _step(ex, ctx, 6)
        assert applied == [2.0]  # not before step 7
        _step(ex, ctx, 7)
        assert applied == [2.0, -1.0]
        [event] = [e for e in ctx.of_kind("event") if e.name == "apply_reverted"]
        assert event.data["at_step"] == 7
    finally:
        registry.unregister("t_mark")


def test_a_revert_step_must_be_a_step_index() -> None:
    ex = Executor(FakeContext([torch.nn.Linear(2, 2)]))
    with pytest.raises(ValueError, match="at_step"):
        ex.submit({"type": "revert", "at_step": "soon"})
    assert RevertCommand().to_dict() == {"type": "revert"}  # the wire shape older agents read


def test_the_vote_tells_apart_ranks_that_would_undo_different_applies() -> None:
    from advisor.apply.agreement import Verdict

    digests: list[str | None] = []

    class Recording:
        def vote(self, *, revert: bool, digest: str | None) -> Verdict:
            assert revert is True  # every rank was asked to revert
            digests.append(digest)
            return Verdict(revert=True)

    for in_force, at_step in (("abc", 3), ("abc", 3), ("def", 3), ("abc", 4), (None, 3)):
        assert vote_user_revert(Recording(), in_force=in_force, at_step=at_step) is None
    assert digests[0] == digests[1] and len(set(digests)) == 4
