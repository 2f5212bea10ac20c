"""Every rank of a single-node job starts a controller command at the same step boundary.

Why: the controller sends each rank its own copy of a command over that rank's socket, and asks
for the boundary two steps past the latest step it has heard of. What it has heard of lags the
ranks by the channel's batching (tens of milliseconds: many steps of a fast job), so the asked-for
step is often past by the time a copy arrives, and each rank then saw the command at whichever
boundary came first after its own copy arrived: rank 0 at step 694, rank 1 at 695. The votes that
follow an apply are collectives; paired with a different collective on the other rank they hung
both ranks until the vote's timeout, and after it the job's own collectives were mismatched for
good (seen on CPU under load: both ranks stuck until torchrun SIGKILLed them at shutdown).
Multi-node jobs do not need this: their commands reach every rank through one broadcast at a
boundary (advisor/agent/relay.py).

How, without a collective per step: when a rank's reader thread receives the ``index``-th command,
it writes to the job's key-value store the earliest boundary it may start at, ``earliest``: two
past the step it is in (the first boundary its training thread can see the command at is at most
one past), plus any lead it needs, and never before the command's own ``at_step``. At that first
boundary the training thread waits until every rank has written its value and takes the maximum:
the same number on every rank, and past every rank's first boundary, so no rank has passed it.
The wait needs nothing from the other ranks' training threads (their reader threads write), so it
cannot deadlock with a collective the others are blocked in; it is bounded by ``timeout_s``, after
which the command is not enacted on this rank (and the other ranks, which wait for the same
missing value, time out alike).

The store is the one the job's process group already uses (a client of our own, no listener).
"""

from __future__ import annotations

import logging
import os
from datetime import timedelta
from typing import Any

import torch.distributed as dist

logger = logging.getLogger("advisor.apply")


def own_store_client(timeout_s: float = 10.0) -> Any:
    """A client of our own to the process group's TCPStore (its own connection and timeout, so our
    calls never wait behind the script's); the default store itself when it is not a TCPStore, None
    without a default process group."""
    try:
        store = dist.distributed_c10d._get_default_store()
    except Exception:  # noqa: BLE001 - no default group
        return None
    inner = store
    while hasattr(inner, "underlying_store"):
        inner = inner.underlying_store
    if isinstance(inner, dist.TCPStore):
        try:
            return dist.TCPStore(inner.host, inner.port, is_master=False, timeout=timedelta(seconds=timeout_s),
                                 wait_for_workers=False)
        except Exception:  # noqa: BLE001 - fall back to the shared client
            return store
    return store


class StepAlign:
    """The boundary every rank starts a command at (see the module docstring)."""

    def __init__(self, *, rank: int, world_size: int, timeout_s: float, store: Any = None) -> None:
        self.rank, self.world_size, self.timeout_s = rank, world_size, float(timeout_s)
        self._store = store
        # Keys live as long as the store: a restarted worker (torchrun --max-restarts) starts over.
        self._prefix = f"advisor/align/{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}/"

    def _client(self) -> Any:
        if self._store is None:
            self._store = own_store_client(self.timeout_s)
        return self._store

    def post(self, index: int, earliest: int) -> None:
        """Reader thread: this rank received command ``index`` and can start it at ``earliest``."""
        store = self._client()
        if store is None:
            return  # ``agreed`` says so
        try:
            store.set(f"{self._prefix}{index}/{self.rank}", str(int(earliest)))
        except Exception as exc:  # noqa: BLE001 - the store is gone: the wait below fails and says so
            logger.warning("Could not post command %d's step to the job's store: %s", index, exc)

    def agreed(self, index: int) -> int:
        """Training thread: the boundary all ranks start command ``index`` at. Raises
        ``TimeoutError`` when some rank's value did not come within ``timeout_s``."""
        store = self._client()
        if store is None:
            raise TimeoutError("no key-value store of the job's process group to agree on a step with")
        keys = [f"{self._prefix}{index}/{r}" for r in range(self.world_size)]
        try:
            store.wait(keys, timedelta(seconds=self.timeout_s))
            return max(int(store.get(key)) for key in keys)
        except Exception as exc:  # noqa: BLE001 - a rank that never received it, or the store is gone
            raise TimeoutError(f"not every rank received the command within {self.timeout_s:g} s "
                               f"({type(exc).__name__})") from exc
