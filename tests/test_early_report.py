"""The final report, made while the training process tears down (advisor/early_report.py).

It is handed over only when it is the report the finished state gives: the same JSON, byte for
byte, as one made after the process; anything that changes the state after it was made (a
warning of the controller's own), or a failing job, and the report is made as before."""

from __future__ import annotations

import contextlib
from pathlib import Path

from advisor.controller import AttachOptions, Session
from advisor.early_report import EarlyReport, make

TRAIN = """\
import sys
import torch
torch.manual_seed(0)
model = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.1)
x, y = torch.randn(32, 8), torch.randn(32, 1)
for step in range(6):
    loss = torch.nn.functional.mse_loss(model(x), y)
    opt.zero_grad()
    loss.backward()
    opt.step()
sys.exit(int(sys.argv[1]))
"""


@contextlib.contextmanager
def _finished(tmp_path: Path, code: int, *, before_finish=None):
    """The training script run to its end under a session with an early report; yields (session,
    early report, its (code, reason)). ``before_finish(session, early)`` runs between the process's
    exit and ``Session.finish``."""
    script = tmp_path / "train.py"
    script.write_text(TRAIN)
    session = Session(AttachOptions(script=str(script), args=[str(code)]))
    early = EarlyReport(session, None, with_json=True)
    try:
        session.launch()
        returncode = session.wait()
        if before_finish is not None:
            before_finish(session, early)
        yield session, early, session.finish(returncode)
    finally:
        session.close()


def test_a_job_that_exits_0_gets_the_report_made_early_and_it_is_the_report(tmp_path):
    with _finished(tmp_path, 0) as (session, early, (code, reason)):
        made = early.take(code, reason)
        assert made is not None
        fresh = make(session.live.snapshot(), None, with_json=True)
        assert made.json == fresh.json
        assert made.report["run"]["exit"]["code"] == 0


def test_a_change_after_it_was_made_and_the_report_is_made_again(tmp_path):
    def warn_after_it_was_made(session, early):
        early._thread.join()  # made from the state before the warning below (white-box: the race made certain)
        session.warn("a warning that came after the early report")

    with _finished(tmp_path, 0, before_finish=warn_after_it_was_made) as (session, early, (code, reason)):
        assert early.take(code, reason) is None
        assert "a warning that came after the early report" in make(session.live.snapshot(), None,
                                                                      with_json=True).json


def test_a_failing_job_is_never_predicted(tmp_path):
    with _finished(tmp_path, 3) as (session, early, (code, reason)):
        assert code == 3
        assert early.take(code, reason) is None
