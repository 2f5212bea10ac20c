"""torchrun's own restarts (``--max-restarts``) under ``advisor attach``: the restarted workers
start through the same bootstrap, so what they need from the controller must still be there."""

from __future__ import annotations

from pathlib import Path

from advisor.multinode import MultiNode
from advisor.session import AttachOptions, Session

ROOT = Path(__file__).resolve().parents[1]


def _session_after_every_hello(multinode: MultiNode) -> Session:
    session = Session(AttachOptions(script=str(ROOT / "tests" / "scripts" / "tiny_train.py"), nproc_per_node=2,
                                    multinode=multinode))
    for rank in (0, 1):  # what the channel server does on each rank's valid hello
        session.server.ranks.add(rank)
        session._on_hello(rank)
    return session


def test_the_secret_stays_for_restarted_workers_and_goes_at_close() -> None:
    """Removed once every rank had said hello, the secret was gone when torchrun restarted the
    workers, and each new worker died in the bootstrap (FileNotFoundError): under the advisor, the
    restart the user asked for failed where plain torchrun recovered."""
    restarting = _session_after_every_hello(MultiNode(mode="single", options={"max_restarts": 1}))
    try:
        assert (restarting.dir / "secret").exists()
    finally:
        restarting.close()
    assert not (restarting.dir / "secret").exists()
    plain = _session_after_every_hello(MultiNode())
    try:
        assert not (plain.dir / "secret").exists()  # no restart possible: nothing left behind
    finally:
        plain.close()


def test_max_restarts_is_read_from_the_options_as_given() -> None:
    assert MultiNode(mode="torchrun", options={"max_restarts": "3"}).restarts == 3
    assert MultiNode(mode="single", options={"max_restarts": 0}).restarts == 0
    assert MultiNode().restarts == 0
