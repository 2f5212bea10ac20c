"""The agent's records on their way to the controller.

Everything the agent and its parts report goes through one ``Outbox``: ``emit`` hands a record
to the channel (``AgentChannel.emit``, which buffers and never blocks) and swallows any error,
because reporting must never break training. Step samples wait here until their loss is
readable: on CUDA the losses are copied to the host asynchronously and read once an event says
the copy is done, so the agent adds no device synchronisation to the user's loop.
"""

from __future__ import annotations

from collections import deque
from typing import Any, Callable

import torch

from advisor.agent.block_timer import DeviceTimes
from advisor.apply.executor import HISTORY
from advisor.records.samples import Event, Record, StepSample

NOW: Any = object()  # ``Outbox.event``'s default step: the step in progress

Losses = list[tuple[torch.Tensor, bool]]  # each backward's loss, and whether it is part of the objective


class Outbox:
    """Records to the controller: events, warnings, and step samples held until their loss is readable."""

    def __init__(self, send: Callable[[Record], None], *, rank: int, step: Callable[[], int],
                 drain: Callable[[], object] | None = None) -> None:
        self._send = send
        self._drain = drain  # waits until the channel has sent what was emitted (AgentChannel.drain)
        self.rank = rank
        self._step = step  # the step in progress, for events and warnings
        # The last steps' samples as they closed (loss not read yet), for an executor created after them.
        self.recent_steps: deque[StepSample] = deque(maxlen=HISTORY)
        self._pending: list[tuple[StepSample, Losses, Any, DeviceTimes | None, tuple[Any, Any] | None]] = []
        # CUDA: the recent steps' device_time_s by index, as flush resolves them.
        self._device_times: dict[int, float] = {}

    def drain(self) -> None:
        """Wait, bounded, until what was emitted so far is sent (nothing without a channel)."""
        if self._drain is not None:
            self._drain()

    def emit(self, record: Record) -> None:
        try:
            self._send(record)
        except Exception:  # emitting must never break training
            pass

    def event(self, name: str, data: dict[str, Any], *, step: int | None = NOW) -> None:
        """An ``Event`` of the step in progress, or of ``step`` (None: it holds in every regime)."""
        self.emit(Event(rank=self.rank, step=self._step() if step is NOW else step, name=name, data=data))

    def warn(self, message: str, **data: Any) -> None:
        self.event("warning", {"message": message, **data})

    def queue_sample(self, sample: StepSample, losses: Losses, device_times: DeviceTimes | None = None,
                     step_events: tuple[Any, Any] | None = None) -> None:
        """A closed step's sample, emitted by ``flush`` once its losses (and its device times) are readable."""
        self.recent_steps.append(sample)
        event = None
        on_cuda = bool(losses) and losses[0][0].is_cuda
        if on_cuda:
            # Copy to host asynchronously and read when the copy is done, so the
            # agent never adds a device synchronisation to the user's loop.
            losses = [(t.to("cpu", non_blocking=True), counted) for t, counted in losses]
        if on_cuda or device_times is not None or step_events is not None:
            event = torch.cuda.Event()
            # After the loss copy, the step's timed modules and its end event: done means all are.
            event.record()
        self._pending.append((sample, losses, event, device_times, step_events))

    def flush(self, *, sync: bool) -> None:
        """Emit queued step samples whose loss is readable (all of them if ``sync``)."""
        while self._pending:
            sample, losses, event, device_times, step_events = self._pending[0]
            if event is not None and not sync and not event.query():
                return
            if event is not None and sync:
                event.synchronize()
            self._pending.pop(0)
            values = [float(t.item()) for t, _ in losses]  # (a Python float for any floating dtype)
            counted = [v for v, (_, c) in zip(values, losses) if c]
            # The objective whose gradient the step applied: gradients of several backward
            # calls add up, so the losses do too (nanoGPT divides each micro-batch's by K).
            loss = float(sum(counted)) if counted else None
            extra: dict[str, Any] = {}
            if device_times is not None:
                extra["module_forward_s"], extra["module_recompute_s"] = device_times.resolve()
            if step_events is not None:
                start, end = step_events
                end.synchronize()  # done already (``event`` was recorded after it)
                extra["device_time_s"] = max(0.0, start.elapsed_time(end) / 1e3 - sample.eval_s)
                self._device_times[sample.index] = extra["device_time_s"]
                if len(self._device_times) > HISTORY:
                    del self._device_times[min(self._device_times)]
            # A new sample (``recent_steps`` keeps the one without its loss); the channel encodes it
            # on its sender thread (``encoded_later``): no field of either is changed after this.
            self.emit(sample.with_fields(loss=loss, losses=values or None, **extra))

    def device_step_times(self) -> dict[int, float]:
        """The recent steps' times on the device's timeline by index (CUDA steps only). Resolving
        the steps still pending waits for the device once: a decision's cost, never a light step's."""
        self.flush(sync=True)
        return dict(self._device_times)
