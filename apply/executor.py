"""Enact remedies in the training process at step boundaries, measure them, keep or revert.

Threads: ``submit`` is called by the agent's socket-reader thread and only
queues the command (under a lock). Everything else (``on_boundary``,
``on_step_end``, ``close``, the model changes, ``ctx.request_deep`` and
``ctx.emit``) runs on the training thread, between optimizer steps, where no
forward or backward is in flight.

Flow of one ``{"type": "apply", ...}`` command:

1. *Before window.* If no deep-sampled step (one with a peak) was seen in the
   last ``max(2 * measure_steps, 8)`` steps, ask for ``measure_steps`` deep steps
   and, when no ``at_step`` was given, wait for them (at most
   ``measure_steps + 1`` boundaries: on CPU deep steps carry no peak).
2. *Apply* at the boundary starting step ``at_step`` (or the next boundary once
   step 1 is done; an ``at_step`` already past means the next boundary, or on
   several ranks the boundary they agree on, below). Emit
   ``Event("apply_started")`` and ``ctx.request_deep(measure_steps + 1)``.
3. *After window*: steps ``at_step .. at_step + measure_steps`` are deep and give
   the peak; the first is a warm-up that counts for the peak (its peak is real;
   a job must fit it) but not for the step time (first-call costs, allocator
   growth). Then ``measure_steps`` light steps give the step time: a deep step
   runs the deep probes and would overstate the remedy's cost several times
   over, and the light step right after the deep ones pays for their teardown,
   so it is not timed either (``_settled``; the same holds in the before
   window). A handle with a ``step_period`` (a loader's workers, which deliver
   batches in turn) gets whole periods of light steps: ``measure_steps``
   rounded up. Deep steps are what is left when no light step comes (a run that
   deep-samples every step); the window never spans more than
   ``measure_steps + 2`` steps plus the light ones.
4. *Decide* with ``decide`` below, emit ``Event("apply_result")``; a revert
   happens at the next boundary, before the result is emitted. A peak over the
   memory budget decides at once, without waiting for the light steps.

Failures: an exception while applying (the apply functions are atomic) gives
status "failed" and training goes on unchanged. An exception raised later *inside*
the remedied forward or backward (e.g. a recomputation that fails during the
measured steps) happens in the user's ``loss.backward()`` and cannot be caught
here: it reaches the script like any training error (the agent's exit record
reports it).

Before and after are compared on the same kind of step: light against light
when both windows have light steps, else deep against deep (``pair``); the
steps each figure comes from are in the result (``Measurement.time_steps``,
``peak_steps``, ``step_kind``).

Multiple ranks: the controller decides once and sends every rank the same
command with an explicit ``at_step`` and a ``digest`` (``command_digest``).
Each copy arrives on its own socket, often after that step: on a single node
the ranks agree through the job's store on the boundary to start it at
(``StepAlign``, a wait at the first boundary that sees the command), across
nodes the command relay hands it to every rank at one boundary. Every rank
applies at that boundary, then all vote (``Agreement``): if any rank
failed to apply, or the digests differ, all revert before a step runs. The
after window then has a fixed length (that bound, the same on every rank, so that
it ends at the same step everywhere) and keep/revert is voted again: any
rank's revert (over budget, too slow) reverts all. A vote that times out
reverts.

Live-opt-in remedies (they change numerics) are refused unless the agent was
started with ``allow_inexact`` (``advisor attach --allow-inexact``) or the
command says the user confirmed (``"confirmed": true``, the TUI's dialog).
"""

from __future__ import annotations

import dataclasses
import logging
import statistics
import threading
from collections import deque
from dataclasses import dataclass, field
from typing import Any, Mapping

from advisor.apply import registry
from advisor.apply.agreement import Agreement
from advisor.apply.command_check import as_command, checked_apply, checked_revert
from advisor.apply.host import ExecutorHost
from advisor.apply.model_names import resolve_model_names
from advisor.apply.step_align import StepAlign
from advisor.apply.user_revert import vote_user_revert
from advisor.apply.target import Target
from advisor.records.advice import Recommendation
from advisor.records.commands import ApplyCommand, Command, RevertCommand
from advisor.records.events import WarningEvent
from advisor.records.payload import Payload
from advisor.records.results import ApplyResult, ApplyStarted, Measurement, RevertResult, rebase_step_time
from advisor.records.samples import StepSample
from advisor.records.settings import TIME_MARGIN
from advisor.records.units import fmt_bytes, fmt_seconds

logger = logging.getLogger("advisor.apply")

DEFAULT_MEASURE_STEPS = 3
# An apply's window takes light steps until their mean is known to SPREAD_SEM of itself (standard
# error over mean), at most LIGHT_CAP times the steps asked for (``_window_done``).
SPREAD_SEM = 0.03
LIGHT_CAP = 4
DEFAULT_TIME_MARGIN = TIME_MARGIN  # AgentSettings.apply_time_margin: tolerated slowdown beyond the reference
HISTORY = 64


def decide(
    *,
    before: Measurement,
    after: Measurement,
    predicted: Measurement,
    budget_bytes: int | None,
    margin: float = DEFAULT_TIME_MARGIN,
    baseline_step_time_s: float | None = None,
) -> tuple[bool, str]:
    """Keep or revert a remedy that applied without error; returns (keep, reason).

    - With a memory budget and a measured peak: keep when the peak fits the budget; also when
      it does not but the job was over the budget before and the remedy brought its peak down,
      within its step-time limit (the alternative, a revert, puts the job back further over).
    - Otherwise keep iff the peak went down, or the step time stayed within
      ``(1 + margin)`` of the reference: the predicted step time when there is
      one (a remedy may be expected to cost time), else the measured before time.
      With the recommendation's ``baseline_step_time_s`` too, the reference is the
      predicted *change* applied to the measured before time: the prediction was made
      on other steps (light ones, at another load) than the window measured here, which
      may be deep steps, several times slower.
    - With nothing measured on either side, keep: there is no evidence against it.
    """
    peak = after.peak_memory_bytes
    reference = (rebase_step_time(before.step_time_s, predicted.step_time_s, baseline_step_time_s)
                 or (predicted.step_time_s if predicted.step_time_s is not None else before.step_time_s))
    limit = reference * (1.0 + margin) if reference is not None else None
    time_ok = after.step_time_s is None or limit is None or after.step_time_s <= limit
    why = _Why(before=before, after=after, predicted=predicted, limit=limit, margin=margin,
               baseline_step_time_s=baseline_step_time_s)
    if budget_bytes is not None and peak is not None:
        fits = peak <= budget_bytes
        verdict = f"peak {fmt_bytes(peak)} {'fits' if fits else 'exceeds'} the budget {fmt_bytes(budget_bytes)}"
        was = before.peak_memory_bytes
        if not fits and was is not None and was > budget_bytes and peak < was:
            closer = f"{verdict}, but is closer to it than before ({fmt_bytes(was)})"
            if not time_ok:
                return False, f"{closer}; {why.time()} exceeds {why.limit_text()}"
            return True, f"{closer}: kept, since a revert would put the job back at {fmt_bytes(was)}"
        return fits, why.lead(verdict)
    peak_down = peak is not None and before.peak_memory_bytes is not None and peak < before.peak_memory_bytes
    if peak_down and not (why.speed and time_ok):
        went = f"peak went down from {fmt_bytes(before.peak_memory_bytes)} to {fmt_bytes(peak)}"
        return True, why.lead(went) if why.speed else went
    if time_ok:
        if after.step_time_s is None or limit is None:
            return True, "no slowdown measurable and no error"
        return True, f"{why.time()}, within {why.limit_text()}"
    return False, f"peak did not go down and {why.time()} exceeds {why.limit_text()}"


@dataclass(frozen=True, kw_only=True)
class _Why:
    """The words of a keep/revert reason, in the one unit style of every surface
    (``fmt_bytes``, ``fmt_seconds``), speaking to what the remedy is for: a speed remedy (its
    prediction is faster than the step it was made on) is kept or reverted for its step time
    first, whatever its peak did (a DataLoader remedy kept "because the peak went down from
    7.75e-05 GiB to 7.74e-05 GiB" while its step went from 140 ms to 34 ms)."""

    before: Measurement
    after: Measurement
    predicted: Measurement
    limit: float | None
    margin: float
    baseline_step_time_s: float | None

    @property
    def speed(self) -> bool:
        base = self.baseline_step_time_s or self.before.step_time_s
        return bool(self.predicted.step_time_s and base and self.predicted.step_time_s < base)

    def time(self) -> str:
        was = f" (was {fmt_seconds(self.before.step_time_s)})" if self.before.step_time_s else ""
        return f"step time {fmt_seconds(self.after.step_time_s)}{was}"

    def limit_text(self) -> str:
        source = "the predicted change" if self.predicted.step_time_s is not None else "the step before"
        return f"the limit {fmt_seconds(self.limit)} ({source} +{self.margin:.0%})"

    def lead(self, verdict: str) -> str:
        """A speed remedy's step time against its limit before the verdict on memory."""
        if not self.speed or self.after.step_time_s is None:
            return verdict
        if self.limit is None:
            return f"{self.time()}; {verdict}"
        side = "within" if self.after.step_time_s <= self.limit else "over"
        return f"{self.time()}, {side} {self.limit_text()}; {verdict}"


def _positive(value: Any) -> float | None:
    """A step time from a recommendation (JSON from the controller): a positive finite number, or None."""
    if isinstance(value, (int, float)) and not isinstance(value, bool) and 0 < value < float("inf"):
        return float(value)
    return None


def _mean(samples: list[StepSample]) -> float | None:
    """The window's mean step time: what the job's throughput is, and what the cost models
    predict. The median of three read a loader whose two workers deliver batches in pairs (a wait
    of 150 ms, then none) as 155 ms or 2 ms by the window's parity: 80 ms predicted and
    measured on average, reverted or kept by chance."""
    return statistics.fmean(s.time_s for s in samples) if samples else None


def _peak(samples: list[StepSample]) -> tuple[int | None, tuple[int, ...]]:
    with_peak = [s for s in samples if s.peak_memory_bytes is not None]
    if not with_peak:
        return None, ()
    return max(s.peak_memory_bytes for s in with_peak), tuple(s.index for s in with_peak)  # type: ignore[type-var]


def _after_deep_left_out(samples: list[StepSample], light: list[StepSample]) -> list[StepSample]:
    """The ``light`` steps that do not follow a deep step of ``samples`` and did not time their
    blocks. The first light step after deep ones pays for the deep probes' teardown: hf_clm's
    read 11.5 ms beside 8.4 ms steady (and 7.3 beside 5.6 before the apply), and a 3-step window
    that counted it measured checkpointing 17% slower than the job ran with it. A block-timed step
    runs the timer's hooks on every saved tensor: minGPT's adder's forward read 7.6 ms there
    beside 5.1 on the steps around it."""
    deep = {s.index for s in samples if s.deep}
    return [s for s in light if s.index - 1 not in deep and not s.module_forward_s]


def _settled(samples: list[StepSample], light: list[StepSample]) -> list[StepSample]:
    """The light steps to time: those that do not follow a deep step, or all when none is left."""
    return _after_deep_left_out(samples, light) or light


def measure(samples: list[StepSample], *, warmup: int = 0, kind: str | None = None) -> Measurement:
    """Peak over all ``samples``; mean step time over those after the first ``warmup``.

    ``kind`` ("light" or "deep") picks the timed steps; by default light ones when there are
    any (deep steps run the deep probes and are slower), else the deep ones. A light step right
    after a deep one is not timed where others are (``_settled``).
    """
    peak, peak_steps = _peak(samples)
    timed = samples[warmup:]
    light = _settled(samples, [s for s in timed if not s.deep])
    deep = [s for s in timed if s.deep]
    if kind is None:
        kind = "light" if light else ("deep" if deep else None)
    use = light if kind == "light" else deep if kind == "deep" else []
    return Measurement(
        peak_memory_bytes=peak,
        step_time_s=_mean(use),
        steps=tuple(s.index for s in samples),
        time_steps=tuple(s.index for s in use),
        peak_steps=peak_steps,
        step_kind=kind if use else None,
    )


def pair(before: list[StepSample], after: list[StepSample], *, measure_steps: int,
         warmup: int = 1) -> tuple[Measurement, Measurement]:
    """Before and after on the same kind of step: light against light, else deep against deep.

    ``before`` is the history ahead of the apply: its last ``measure_steps`` deep steps count, or
    every settled light step in it (the executor passes the last ``max(2 * measure_steps, 8)``
    steps): the after window runs until its mean is known to ``SPREAD_SEM`` of itself, and a
    before window of three 4-6 ms light steps moved the rebased prediction of hf_clm's
    checkpointing by 10-20% from one run to the next (the zoo, 2026-11-29). ``after`` is the steps
    since, whose first ``warmup`` count for the peak only. When one side has no step of the kind
    the other has, its time is None: unlike steps are not compared.
    """
    timed_after = after[warmup:] if len(after) > warmup else after
    kinds = [k for k in ("light", "deep")
             if any((not s.deep) == (k == "light") for s in before)
             and any((not s.deep) == (k == "light") for s in timed_after)]
    kind = kinds[0] if kinds else None
    peak_before = [s for s in before if s.peak_memory_bytes is not None][-measure_steps:]
    if kind is None:
        b_time: list[StepSample] = []
        a = measure(after, warmup=warmup if len(after) > warmup else 0)
    else:
        same = [s for s in before if (not s.deep) == (kind == "light")]
        # Step 0 pays one-off costs (first allocations, lazy initialisation): a time only when
        # no other step of the kind came before the apply.
        same = [s for s in same if s.index > 0] or same
        b_time = _settled(before, same) if kind == "light" else same[-measure_steps:]
        a = measure(after, warmup=warmup if len(after) > warmup else 0, kind=kind)
    peak, peak_steps = _peak(peak_before)
    b = Measurement(
        peak_memory_bytes=peak,
        step_time_s=_mean(b_time),
        steps=tuple(sorted({s.index for s in peak_before} | {s.index for s in b_time})),
        time_steps=tuple(s.index for s in b_time),
        peak_steps=peak_steps,
        step_kind=kind if b_time else None,
    )
    return b, a


def _light_needed(measure_steps: int, period: int) -> int:
    """``measure_steps`` rounded up to whole periods: a loader whose ``period`` workers deliver
    batches in turn waits ~150 ms one step and none the next, and three steps of it average
    100 ms or 50 ms by the window's phase, either side of an 80 ms prediction."""
    period = max(1, period)
    return -(-measure_steps // period) * period


def _steady_enough(light: list[StepSample], period: int = 1) -> bool:
    """Whether the mean of ``light``'s times is known to ``SPREAD_SEM`` of itself: the standard
    error of its whole periods' means (a loader's workers' turn is one period: its steps differ
    by design) over their mean; a single period is taken as it is."""
    times = [s.time_s for s in light]
    means = [statistics.fmean(times[i:i + period]) for i in range(0, len(times) - period + 1, period)]
    if len(means) < 2:
        return True  # one period asked for: no spread to read (``measure_steps`` 1)
    mean = statistics.fmean(means)
    return mean > 0 and statistics.stdev(means) / len(means) ** 0.5 <= SPREAD_SEM * mean


def _window_done(after: list[StepSample], measure_steps: int, budget_bytes: int | None,
                 *, fixed: bool = False, period: int = 1, minimum: bool = False) -> bool:
    """Warm-up and ``measure_steps`` deep steps, then ``measure_steps`` light ones rounded up to
    whole periods of ``period`` steps, not counting a light step right after a deep one
    (``_after_deep_left_out``); more light steps, whole periods at a time, while their mean is not
    yet known to ``SPREAD_SEM`` of itself (``_steady_enough``), up to ``LIGHT_CAP`` times as many.
    A job of 6-16 ms steps on 2 cores moved by 20-30% from one step to the next (mingpt_adder:
    18.8, 14.5, 14.4 ms after its apply, 14.1-14.3 ms from then on): three steps judged it 15%
    slower than it ran. With no light step at all (a run that deep-samples every step), the
    window ends at the bound it always had.

    ``fixed`` (several ranks): always the bound ``2 + measure_steps +`` the light steps needed, so
    the window ends at the same step on every rank (no rank can wait on another's spread).
    ``minimum``: whether the window has what it needs for a verdict, extended or not (the job
    ended while it waited for a steadier mean: it is decided on what it has).
    """
    light_needed = _light_needed(measure_steps, period)
    bound = 2 + measure_steps + light_needed
    if fixed:
        return len(after) >= bound
    if len(after) < measure_steps + 1:
        return False
    if budget_bytes is not None and any((s.peak_memory_bytes or 0) > budget_bytes for s in after):
        return True  # over budget: the step time cannot change the verdict
    light = _after_deep_left_out(after, [s for s in after[1:] if not s.deep])
    if not light:
        return len(after) >= bound
    if len(light) < light_needed:
        return len(after) >= bound + light_needed * (LIGHT_CAP - 1)
    if minimum:
        return True
    if len(light) % period:
        return False
    return _steady_enough(light, period) or len(light) >= light_needed * LIGHT_CAP


def _period(handle: Any) -> int:
    """A handle's optional ``step_period`` (an int >= 1; anything else reads as 1)."""
    value = getattr(handle, "step_period", 1)
    return value if isinstance(value, int) and not isinstance(value, bool) and value >= 1 else 1


def _recent_deep(history: Any, step: int, measure_steps: int) -> bool:
    """A deep step with a peak in the before window of an apply at ``step``."""
    horizon = step - max(2 * measure_steps, 8)
    return any(s.peak_memory_bytes is not None and s.index >= horizon for s in history)


def _prewarm() -> None:
    """Import ``torch._dynamo`` here, on the socket thread, not at the apply boundary.

    ``torch.utils.checkpoint`` is wrapped in ``torch._disable_dynamo``, which
    imports dynamo lazily on the first call: seconds of stall inside the user's
    first checkpointed step otherwise. Best effort; the first call imports it anyway.
    """
    try:
        import torch._dynamo  # noqa: F401
    except Exception:  # pragma: no cover - an import problem shows up at the first call instead
        pass


@dataclass(kw_only=True)
class _Request:
    """An apply command waiting for its boundary."""

    remedy: str
    params: dict[str, Any]
    recommendation_id: str | None
    predicted: Measurement
    at_step: int | None
    measure_steps: int
    digest: str
    deep_requested_at: int | None = None
    baseline_step_time_s: float | None = None  # the step time the prediction was made against
    waiting_since: int | None = None  # the boundary it first waited at for its before window's light steps


@dataclass(kw_only=True)
class _Active:
    """Remedies applied at ``applied_at`` whose after window is being measured."""

    results: list[ApplyResult]  # status "kept" placeholders until decided
    handles: list[registry.RemedyHandle]
    applied_at: int
    measure_steps: int
    from_plan: bool = False
    digest: str | None = None
    baseline_step_time_s: float | None = None
    period: int = 1  # the handles' ``step_period``: step times repeat with it, timed in whole periods
    before: list[StepSample] = field(default_factory=list)
    after: list[StepSample] = field(default_factory=list)


class Executor:
    """Applies, measures and reverts remedies; see the module docstring for who calls what."""

    def __init__(self, ctx: ExecutorHost) -> None:
        self.ctx = ctx
        self._lock = threading.Lock()
        self._inbox: deque[tuple[Command, int | None]] = deque()  # with its StepAlign index, if any
        self._reverts: deque[RevertCommand] = deque()  # user reverts waiting for their boundary
        self._queue: deque[_Request] = deque()
        # The steps before this executor existed too (the agent keeps the recent ones): an apply
        # whose command comes late still has its before window.
        self._history: deque[StepSample] = deque(ctx.recent_steps, maxlen=HISTORY)
        self._active: _Active | None = None
        self._to_revert: _Active | None = None  # decided "revert", done at the next boundary
        self._kept: list[_Active] = []  # applied and kept, newest last (for "revert")
        self.results: list[ApplyResult] = []  # every result emitted, in order
        self.agreement = Agreement(timeout_s=ctx.settings.apply_agree_timeout_s)
        self._align: StepAlign | None = None  # made at the first command of a multi-rank job
        self._received = 0  # commands received: every rank counts the same ones in the same order

    # -- socket thread -------------------------------------------------------------

    def submit(self, command: Command | Mapping[str, Any]) -> None:
        """Queue a controller command, an ``ApplyCommand`` or ``RevertCommand`` (a wire mapping is
        decoded into one first); ``ValueError`` (for the controller's reply) when malformed."""
        typed = as_command(command)
        typed = checked_apply(typed) if isinstance(typed, ApplyCommand) else checked_revert(typed)
        index = self._post_earliest(typed)
        with self._lock:
            self._inbox.append((typed, index))
        if isinstance(typed, ApplyCommand):
            _prewarm()

    def _post_earliest(self, command: Command) -> int | None:
        """A single-node multi-rank job: tell the other ranks the earliest boundary this one can start
        the command at (``StepAlign``); its index, or None where delivery is aligned already."""
        if not self._multi_rank() or self.ctx.relayed:
            return None  # one process, or a multi-node job whose relay delivers at one boundary
        if self._align is None:
            self._align = StepAlign(rank=self.ctx.rank, world_size=self.ctx.world_size,
                                    timeout_s=self.agreement.timeout_s)
        index, self._received = self._received, self._received + 1
        step = self.ctx.step
        lead = 0
        if isinstance(command, ApplyCommand) and command.at_step is None:  # "when ready": as _ready waits
            history = list(self._history)  # a copy: the training thread appends meanwhile
            m = command.measure_steps
            lead = 0 if _recent_deep(history, step, m) else m + 1  # room for the before window's deep steps
        # Two boundaries ahead: another rank may have passed the next one already. Not while the
        # ranks are held for this decision (--apply-at-step K): they all wait at the boundary
        # before K, so K is next everywhere. With two, a decision that came during the hold
        # always slipped to K+1.
        held = self.ctx.holding or (
            isinstance(command, ApplyCommand) and command.at_step is not None and self.ctx.holds_before(command.at_step))
        ahead = 1 if held else 2
        self._align.post(index, max(command.at_step or 0, step + ahead + lead))
        return index

    # -- training thread -----------------------------------------------------------

    def on_step_end(self, sample: StepSample) -> None:
        """Record a finished step's sample (the agent calls this once per step, rank-local)."""
        try:
            self._history.append(sample)
            active = self._active
            if active is None or sample.index < active.applied_at:
                return
            active.after.append(sample)
            if _window_done(active.after, active.measure_steps, self.ctx.settings.memory_budget_bytes,
                            fixed=self._multi_rank() and not active.from_plan, period=active.period):
                self._decide(active, complete=True)
        except Exception as exc:  # the executor must never break training
            self._internal_error("on_step_end", exc)

    def on_boundary(self, step: int) -> None:
        """At the boundary that starts step ``step`` (right after the previous optimizer step)."""
        try:
            self._drain()
            self._due_reverts(step)
            if self._to_revert is not None:
                self._revert_active(self._to_revert, step)
                self._to_revert = None
            if self._queue and self._active is None and self._to_revert is None:
                request = self._queue[0]
                if self._ready(request, step):
                    self._queue.popleft()
                    self._apply(request, step)
        except Exception as exc:
            self._internal_error("on_boundary", exc)

    def adopt(self, results: list[ApplyResult], handles: list[registry.RemedyHandle], *,
              at_step: int, measure_steps: int = DEFAULT_MEASURE_STEPS) -> None:
        """Measure remedies applied outside a boundary (a plan, before step 0); they are always kept."""
        self._active = _Active(results=results, handles=handles, applied_at=at_step,
                               measure_steps=measure_steps, from_plan=True)
        self.ctx.request_deep(measure_steps + 1)

    def close(self) -> None:
        """Training ended: report what is being measured with the steps seen (nothing is reverted)."""
        active = self._active
        if active is not None:
            # A single-rank window that has its light steps and was waiting for a steadier mean
            # is decided on them (several ranks cannot vote at exit: theirs is fixed anyway).
            complete = not self._multi_rank() and not active.from_plan and _window_done(
                active.after, active.measure_steps, self.ctx.settings.memory_budget_bytes,
                period=active.period, minimum=True)
            self._decide(active, complete=complete)
        if self._to_revert is not None:  # decided, but no boundary left to revert at: it stayed in force
            active, self._to_revert = self._to_revert, None
            self._emit_results(active, status="interrupted",
                               reason=f"{active.results[0].reason}; training ended before the revert, "
                                      "so it stayed in force to the end")

    # -- internals -----------------------------------------------------------------

    def _drain(self) -> None:
        with self._lock:
            commands = list(self._inbox)
            self._inbox.clear()
        for command, index in commands:
            if index is not None:
                aligned = self._aligned(command, index)
                if aligned is None:
                    continue
                command = aligned
            if isinstance(command, RevertCommand):
                self._reverts.append(command)  # done at its boundary (_due_reverts)
                continue
            rec = command.recommendation
            refusal = self._opt_in_refusal(rec, command)
            if refusal:
                self._emit(self.ctx.step, ApplyResult(
                    remedy=rec.remedy, recommendation_id=rec.id, params=dict(rec.params),
                    rank=self.ctx.rank, status="failed", error=refusal,
                    reason="not applied: it changes numerics and was not allowed"), record=True)
                continue
            self._queue.append(_Request(
                remedy=rec.remedy,
                params=dict(rec.params),
                recommendation_id=rec.id,
                predicted=Measurement(peak_memory_bytes=rec.predicted.peak_memory_bytes,
                                      step_time_s=rec.predicted.step_time_s),
                at_step=command.at_step,
                measure_steps=command.measure_steps,
                digest=command.digest or "",
                baseline_step_time_s=_positive(rec.baseline.step_time_s),
            ))

    def _aligned(self, command: Command, index: int) -> Command | None:
        """The command with the boundary every rank starts it at; None (reported) when the ranks
        could not agree on one: it is then enacted nowhere."""
        assert self._align is not None
        try:
            return dataclasses.replace(command, at_step=self._align.agreed(index))
        except TimeoutError as exc:
            logger.warning("Not enacting a %s command: %s", command.TYPE, exc)
            if isinstance(command, RevertCommand):
                self._warn(f"revert not done: {exc}")
                return None
            rec = command.recommendation
            self._emit(self.ctx.step, ApplyResult(
                remedy=rec.remedy, recommendation_id=rec.id, params=dict(rec.params),
                rank=self.ctx.rank, status="failed", error=str(exc),
                reason="not applied: the ranks could not agree on a step to apply it at"), record=True)
            return None

    def _due_reverts(self, step: int) -> None:
        """User reverts whose boundary has come: on every rank at the same step, voted like keep/revert."""
        while self._reverts and (self._reverts[0].at_step is None or self._reverts[0].at_step <= step):
            command = self._reverts.popleft()
            if self._queue:  # not applied yet: cancelling it is the revert the user meant
                self._cancel(self._queue.pop())
                continue
            note = None
            if command.at_step is not None and self._multi_rank():
                note = vote_user_revert(self.agreement, in_force=self._in_force_digest(), at_step=command.at_step)
            self._user_revert(note=note)

    def _in_force_digest(self) -> str | None:
        """The digest of the apply a user revert undoes now (what ``_user_revert`` picks)."""
        for active in (self._active, self._to_revert, self._kept[-1] if self._kept else None):
            if active is not None:
                return active.digest
        return None

    def _opt_in_refusal(self, rec: Recommendation, command: ApplyCommand) -> str | None:
        if rec.apply_class != "live-opt-in":
            return None
        if self.ctx.settings.allow_inexact or command.confirmed is True:
            return None
        return (f"{rec.id or rec.remedy} changes numerics (apply class live-opt-in); "
                "pass --allow-inexact to `advisor attach`, or confirm it in the TUI")

    def _ready(self, request: _Request, step: int) -> bool:
        m = request.measure_steps
        need_before = not _recent_deep(self._history, step, m)
        if request.at_step is not None:
            if need_before and request.deep_requested_at is None and request.at_step - step <= m + 1:
                self.ctx.request_deep(m)
                request.deep_requested_at = step
            return step >= request.at_step
        if request.deep_requested_at is None:
            if not need_before:
                # The before window's light steps: wait for them (at most m + 1 boundaries) when
                # the deep steps left fewer (an apply right after the first timed step had one).
                if request.waiting_since is None:
                    request.waiting_since = step
                before = self._before_samples(step, m)
                settled = _after_deep_left_out(before, [s for s in before if not s.deep])
                return len(settled) >= m or step >= request.waiting_since + m + 1
            self.ctx.request_deep(m)
            request.deep_requested_at = step
            return False
        seen = sum(1 for s in self._history if s.deep and s.index >= request.deep_requested_at)
        # Deep steps may carry no peak (CPU), or start a step late: bound the wait.
        return seen >= m or step >= request.deep_requested_at + m + 1

    def _before_samples(self, step: int, measure_steps: int) -> list[StepSample]:
        return [s for s in self._history if step - max(2 * measure_steps, 8) <= s.index < step]

    def _multi_rank(self) -> bool:
        return self.ctx.world_size > 1 and Agreement.distributed()

    def target(self) -> Target:
        """What the remedies act on: the agent's captured objects."""
        return self.ctx.target()

    def _apply(self, request: _Request, step: int) -> None:
        before_samples = self._on_device(self._before_samples(step, request.measure_steps))
        before, _ = pair(before_samples, [], measure_steps=request.measure_steps)
        result = ApplyResult(
            remedy=request.remedy, recommendation_id=request.recommendation_id, params=dict(request.params),
            rank=self.ctx.rank, at_step=step, predicted=request.predicted, before=before, status="kept",
            baseline_step_time_s=request.baseline_step_time_s,
        )
        handle: registry.RemedyHandle | None = None
        error: Exception | None = None
        target = self.target()
        self.agreement.bind(target.process_group)
        try:
            # A multi-model script's names carry the model's label (netG.main.3): relative to it here.
            resolved, params = resolve_model_names(target, request.params)
            handle = registry.apply_remedy(resolved, request.remedy, params)
        except Exception as exc:  # atomic apply: the job is as it was
            error = exc
        if self._multi_rank():
            verdict = self.agreement.vote(revert=error is not None, digest=request.digest)
            if verdict.revert and error is None and handle is not None:
                handle.revert()  # another rank failed: nothing ran with it, so nothing to measure
                self._emit(step, result.with_(
                    status="reverted", reason=verdict.reason or "reverted on every rank"), record=True)
                return
        if error is None and handle is not None and callable(getattr(handle, "commit", None)):
            handle.commit()  # every rank keeps it: drop what only an immediate revert needed
        if error is not None:
            logger.warning("Applying %s failed, training goes on unchanged: %s", request.remedy, error)
            self._emit(step, result.with_(
                status="failed", at_step=None, error=f"{type(error).__name__}: {error}",
                reason="applying raised; nothing was changed"), record=True)
            return
        assert handle is not None
        self._emit(step, ApplyStarted(
            remedy=request.remedy, recommendation_id=request.recommendation_id, params=result.params,
            at_step=step, measure_steps=request.measure_steps, before=before, digest=request.digest))
        self._active = _Active(results=[result], handles=[handle], applied_at=step,
                               measure_steps=request.measure_steps, digest=request.digest,
                               baseline_step_time_s=request.baseline_step_time_s, before=before_samples,
                               period=_period(handle))
        self.ctx.request_deep(request.measure_steps + 1)

    def _measured(self, active: _Active) -> tuple[Measurement, Measurement]:
        """Before and after of the active apply (its before samples were put on the device's
        timeline when it was applied; the after ones are here)."""
        return pair(active.before, self._on_device(active.after), measure_steps=active.measure_steps)

    def _on_device(self, samples: list[StepSample]) -> list[StepSample]:
        """The samples timed on the device's timeline where the job runs on one (CUDA): the
        predictions were made against device time (the recommender's baseline reads
        ``device_time_s``), and a step's host time after a synchronised boundary (a deep step's,
        the hold for a decision) counts its launches, not its kernels."""
        times = self.ctx.device_step_times() if samples else {}
        return [dataclasses.replace(s, time_s=times[s.index]) if s.index in times else s for s in samples]

    def _decide(self, active: _Active, *, complete: bool) -> None:
        self._active = None
        before, after = self._measured(active)
        if active.before:
            active.results = [r.with_(before=before) for r in active.results]
        active.results = [r.with_(after=after) for r in active.results]
        if active.from_plan:
            reason = "applied from the plan before the first step"
            self._finish(active, keep=True, reason=reason if complete else reason + "; training ended early")
            return
        budget = self.ctx.settings.memory_budget_bytes
        margin = self.ctx.settings.apply_time_margin
        first = active.results[0]
        keep, reason = decide(before=first.before, after=after, predicted=first.predicted,
                              budget_bytes=budget, margin=margin,
                              baseline_step_time_s=active.baseline_step_time_s)
        refusals = [r for h in active.handles if (r := getattr(h, "refusal", None))]
        if refusals:  # the applier found on the job's own steps that it cannot work as intended
            keep, reason = False, "; ".join(refusals)
        if not complete:  # not judged: "interrupted", with what the window measured, not "kept"
            self._emit_results(active, status="interrupted",
                               reason=reason + "; training ended before the window completed, not reverted")
            return
        if self._multi_rank():
            verdict = self.agreement.vote(revert=not keep, digest=active.digest)
            if verdict.revert and keep:
                keep, reason = False, verdict.reason or reason
        self._finish(active, keep=keep, reason=reason)

    def _finish(self, active: _Active, *, keep: bool, reason: str) -> None:
        if keep:
            self._kept.append(active)
            self._emit_results(active, status="kept", reason=reason)
        else:
            active.results = [r.with_(reason=reason) for r in active.results]
            self._to_revert = active  # reverted at the next boundary, then reported

    def _revert_active(self, active: _Active, step: int, reason: str | None = None) -> None:
        error = None
        for handle in reversed(active.handles):
            try:
                handle.revert()
            except Exception as exc:  # report it; the other handles still get reverted
                error = f"{type(exc).__name__}: {exc}"
        self._emit_results(active, status="failed" if error else "reverted",
                           reason=reason or active.results[0].reason, error=error)

    def _cancel(self, request: _Request) -> None:
        result = ApplyResult(remedy=request.remedy, recommendation_id=request.recommendation_id,
                             params=dict(request.params), rank=self.ctx.rank, predicted=request.predicted, status="reverted",
                             reason="cancelled on request before it was applied")
        self._emit(self.ctx.step, result, record=True)

    def _user_revert(self, *, note: str | None = None) -> None:
        step = self.ctx.step
        suffix = f"; {note}" if note else ""
        if self._active is not None:
            active, self._active = self._active, None
            before, after = self._measured(active)
            active.results = [r.with_(before=before if active.before else r.before, after=after)
                              for r in active.results]
            self._revert_active(active, step, reason="reverted on request during measurement" + suffix)
        elif self._to_revert is not None:
            active, self._to_revert = self._to_revert, None
            self._revert_active(active, step)
        elif self._kept:
            active = self._kept.pop()
            for handle in reversed(active.handles):
                handle.revert()
            for r in active.results:
                self._emit(step, RevertResult(remedy=r.remedy, recommendation_id=r.recommendation_id,
                                                                at_step=step, reason="reverted on request" + suffix))
        else:
            self._warn("revert requested; nothing is applied" + suffix, step=step)

    def _emit_results(self, active: _Active, *, status: str, reason: str, error: str | None = None) -> None:
        for r in active.results:
            self._emit(self.ctx.step, r.with_(status=status, reason=reason, error=error),
                       record=True)

    def _emit(self, step: int, payload: Payload, *, record: bool = False) -> None:
        if record:
            assert isinstance(payload, ApplyResult)
            self.results.append(payload)
        self.ctx.emit(payload.event(rank=self.ctx.rank, step=step))

    def _warn(self, message: str, *, step: int | None = None) -> None:
        self.ctx.emit(WarningEvent(message=message, source="apply").event(rank=self.ctx.rank, step=step))

    def _internal_error(self, where: str, exc: Exception) -> None:
        logger.exception("advisor apply executor failed in %s", where)
        self._warn(f"executor error in {where}: {exc}")
