"""Which steps are deep-sampled, and by which probes.

Deep steps are the steps in ``deep_steps`` (default 1, 2, 3), every ``deep_every``-th step (the
period doubling after every ten of them, ``advisor.records.schedule.periodic_deep_due``), and
the steps asked for with ``request_deep`` (by the executor for its windows, by a probe for a step
of its own). Probes' ``start_deep`` runs at the boundary before the step and ``stop_deep`` at the
boundary after it, in reverse order (dispatch modes and saved-tensor hooks stack).

A probe with ``deep_solo`` (the compute probe) has steps of its own: with the memory tracker
under it, the profiler's op times held the tracker's dispatch-mode Python (79 ms of ops in a
46 ms GPT step), and its counter and the tracker on one step (two dispatch modes, every op
through both) made that step 3.6-5.6x a light GPT step with two threads. The first step of a run
of scheduled deep steps runs the shared probes and books the solo probes' ``solo_steps`` (the
compute probe: 2, its counting step and the timed step it then asks for with
``request_deep(1, probes=("compute",))``) right after it; they take the places of the next
shared ones, so the default steps 1-3 run: 1 the memory and comm probes, 2 the compute probe's
counting, 3 its timing. Steps requested without names (an apply's window) run the shared probes.
A solo probe that needs no more of its booked steps (the compute probe, when it timed a step too
large to profile where it counted it) releases them (``release``): they are light steps.

A deep step far slower than the light ones (a Python-loop RNN under the dispatch modes) ends
scheduled deep sampling (``bound_cost``); requests are still honoured.

A ``torch.compile``'d model (a model wrapped in ``OptimizedModule``, or any module compiled in
place with ``module.compile()``) is not deep-sampled by probes with ``dispatch_mode_deep``: under
their dispatch modes it runs other code than its compiled graph, and the script's numerics change.
One warning and one ``deep_probes_left_off`` event say so; ``--deep-compiled`` lets them run.
"""

from __future__ import annotations

import statistics
from typing import Callable, Iterable

import torch

from advisor.agent.gc_pace import GcPace
from advisor.agent.outbox import Outbox
from advisor.agent.probeset import ProbeSet
from advisor.apply.compiled import compiled_model, dynamo_graphs
from advisor.probes.probe import Probe
from advisor.records.samples import StepSample
from advisor.records.schedule import light_timing_now, periodic_deep_due
from advisor.records.settings import AgentSettings


class DeepSchedule:
    """The deep steps to come, the probes sampling the step in progress, and the cost bound."""

    def __init__(self, settings: AgentSettings, probes: ProbeSet, outbox: Outbox, *, step: Callable[[], int]) -> None:
        self._probes = probes
        self._outbox = outbox
        self._step = step  # the step in progress
        self.steps: set[int] = set(settings.deep_steps)
        self.every = settings.deep_every
        # One light step in this many (steps every-1, 2*every-1, ...) times its numbered modules'
        # forward (advisor/agent/block_timer.py): the recompute cost of checkpointing them. 0: never.
        self.light_timing_every = settings.light_timing_every
        self._timing_owed = False  # a due block timing fell on a step right after a deep one
        # A deep step slower than this many light steps (and than min_s) ends deep sampling.
        self.max_slowdown, self.min_s = settings.deep_max_slowdown, settings.deep_min_s
        self._extra = 0  # steps requested without probe names
        self._solo_extra, self._solo_names = 0, frozenset[str]()  # steps asked for by solo probes
        self._solo_ran = False  # the solo probes had their step in this run of deep steps
        self._released: set[int] = set()  # scheduled deep steps whose solo probes needed them no more
        self._active = False
        self._running: list[Probe] = []  # the probes deep-sampling the step in progress
        self._limited = False
        self.count = 0  # deep steps run
        self._light_times: list[float] = []
        self._deep_compiled = settings.deep_compiled
        self._left_off: list[str] | None = None  # the probes kept off a compiled model, once found
        self._graphs_before = dynamo_graphs()  # graphs made before the agent (another test's, in-process)
        self._compiled_checked = False  # the first deep step found no compiled code: not asked again
        self.gc_pace = GcPace()  # the collector at the script's pace while deep probes run (gc_pace.py)

    @property
    def active(self) -> bool:
        """Whether a deep-sampled step is under way (its probes may run a profiler of their own)."""
        return self._active

    def is_deep(self, step: int) -> bool:
        """Whether ``step`` is one of the scheduled deep steps (and not one a solo probe released)."""
        if step in self._released:
            return False
        if step in self.steps:
            return True
        return periodic_deep_due(step, self.every)

    def light_timing_due(self, step: int, *, after_deep: bool = False) -> bool:
        """Whether light step ``step`` times its numbered modules' forward: due at step every-1
        and each ``every`` after, or the first light step after that follows a light one
        (``after_deep``: the step before was deep; step 5 after the default deep steps 1-3)."""
        if self.light_timing_every <= 0:
            return False
        timed, self._timing_owed = light_timing_now(step, owed=self._timing_owed, after_deep=after_deep,
                                                    every=self.light_timing_every)
        return timed

    def request_deep(self, steps: int, probes: Iterable[str] | None = None) -> None:
        """Deep-sample the next ``steps`` steps; with ``probes``, for those probes alone."""
        if probes is None:
            self._extra = max(self._extra, int(steps))
        else:
            self._solo_extra = max(self._solo_extra, int(steps))
            self._solo_names = self._solo_names | frozenset(probes)

    def release(self, probes: Iterable[str]) -> None:
        """The steps still booked for the solo probes ``probes`` are not needed: they are light
        (a scheduled deep step they had taken the place of is not given back to the shared probes,
        which sampled this run of deep steps already). A model of 5001 modules had a deep step
        that sampled nothing after its compute probe timed its 85,000 ops where it counted them."""
        if self._solo_extra <= 0 or not self._solo_names <= frozenset(probes):
            return
        step = self._step()
        self._released.update(range(step + 1, step + 1 + self._solo_extra))
        self._solo_extra = 0

    def deep_next(self) -> bool:
        """Whether the shared probes deep-sample the next step, or the one after the solo steps
        asked for now (as known now: a boundary's stop_deep calls run before it is decided; the
        compute probe's stop, which asks for its timed step, runs before the memory probe's)."""
        step = self._step() + 1
        solo, shared = self._probes.split()
        if solo and shared:
            step += self._solo_extra  # the solo probes' own steps come first
        return self._extra > 0 or self.is_deep(step)

    def start(self, step: int) -> bool:
        """At the boundary that starts ``step``: start its deep probes if it is deep; whether it is."""
        full = self._extra > 0 or self.is_deep(step)
        self._running, shared_step = self._schedule(full, step)
        if self._running and not self._deep_compiled:
            self._running = self._off_compiled(self._running, step)
        if self._extra > 0 and (shared_step or not self._probes):
            self._extra -= 1
        self._active = bool(self._running) or (full and not self._probes)
        if self._active:
            self.count += 1
            self.gc_pace.slow()
            for probe in self._running:
                self._probes.call(probe, "start_deep", step)
        return self._active

    def stop(self, step: int) -> list[str]:
        """At the boundary that ends ``step``: stop its deep probes; their names ([] for a light step)."""
        if not self._active:
            self._running = []
            return []
        # Reverse order: probes push dispatch modes and saved-tensor hooks, which pop LIFO.
        for probe in reversed(self._running):
            self._probes.call(probe, "stop_deep", step)
        self._active = False
        self.gc_pace.restore()
        names, self._running = [p.name for p in self._running], []
        return names

    def postpone(self, step: int, *, was_deep: bool) -> None:
        """A step found to have begun earlier (at a snapshot) is already under way: no deep probe
        can start in its middle, so a deep step due now runs one step later."""
        if self._extra > 0 or self.is_deep(step) or was_deep:
            self._extra += 1

    def _schedule(self, full: bool, step: int) -> tuple[list[Probe], bool]:
        """The probes to deep-sample the step that begins now, and whether it is one of the
        shared probes' deep steps (a request without names counts it); see the module docstring."""
        if not full and self._solo_extra == 0:  # a light step, the common case: nothing to split
            self._solo_ran = False
            return [], False
        probes = list(self._probes)
        solo, shared = self._probes.split()
        named = [p for p in probes if p.name in self._solo_names]  # the solo steps' probes
        if not (solo and shared):  # nothing to keep apart
            if full:
                self._solo_extra = max(0, self._solo_extra - 1)  # the solo probes run on this one
                return probes, True
            self._solo_extra -= 1
            return named, False
        if self._solo_extra > 0:
            self._solo_extra -= 1
            self._solo_ran = True
            return named, False
        if self.is_deep(step) and not self._solo_ran:
            self._solo_extra = max(getattr(p, "solo_steps", 1) for p in solo)
            self._solo_names = self._solo_names | frozenset(p.name for p in solo)
        return shared, True

    def _off_compiled(self, probes: list[Probe], step: int) -> list[Probe]:
        """``probes`` less the dispatch-mode ones where a captured model is compiled; said once."""
        intrusive = [p for p in probes if getattr(p, "dispatch_mode_deep", False)]
        context = self._probes.context
        if not intrusive or context is None:
            return probes
        if self._left_off is None:
            # Decided once, at the first deep step: compiled code that appears later is a remedy's
            # (compile_blocks, live-equivalent), whose window the memory probe must still measure.
            if self._compiled_checked or not any_compiled(context.wrapped_models(), self._graphs_before):
                self._compiled_checked = True
                return probes
            self._left_off = sorted({p.name for p in self._probes if getattr(p, "dispatch_mode_deep", False)})
            data = {"probes": self._left_off, "reason": "compiled model", "step": step}
            self._outbox.event("deep_probes_left_off", data, step=step)
            self._outbox.warn(f"compiled code runs in this job (torch.compile): the {' and '.join(self._left_off)} probes do "
                              "not deep-sample it, since their dispatch modes would run it outside its compiled code "
                              "and change its numerics (--deep-compiled to sample it anyway)", **data)
        return [p for p in probes if not getattr(p, "dispatch_mode_deep", False)]

    def bound_cost(self, sample: StepSample) -> None:
        """Deep probes cost a few light steps; a deep step far slower ends scheduled deep
        sampling, said in one event and a warning."""
        if not sample.deep:
            self._light_times = [*self._light_times[-31:], sample.time_s]
            return
        if self._limited or not self._light_times:
            return
        steady = self._light_times[1:] or self._light_times  # step 0 carries one-off costs
        light = statistics.median(steady)
        limit = max(self.max_slowdown * light, self.min_s)
        if sample.time_s <= limit:
            return
        self._limited = True
        self.steps, self.every = set(), 0
        data = {"step": sample.index, "deep_s": sample.time_s, "light_s": light,
                "slowdown": sample.time_s / light if light > 0 else None, "limit_s": limit}
        self._outbox.event("deep_sampling_stopped", data, step=sample.index)
        self._outbox.warn(f"deep step {sample.index} took {sample.time_s:.1f} s, {data['slowdown'] or 0:.0f}x a "
                          f"light step ({light:.3g} s): no more scheduled deep steps (limit {limit:.1f} s)", **data)

    def warn_if_none_ran(self, steps: int) -> None:
        """At exit: a run whose probes never had a deep step says what was not measured."""
        if steps > 0 and self.count == 0 and self._probes:
            self._outbox.warn(f"no step was deep-sampled ({steps} step(s) ran; deep steps: "
                              f"{sorted(self.steps) or 'none'}): memory by category, FLOPs and module "
                              "figures were not measured")


def any_compiled(models: Iterable[torch.nn.Module], graphs_before: int = 0) -> bool:
    """Whether compiled code runs in this job: a compiled model (``compiled_model``), or any graph
    dynamo made since its count was ``graphs_before``. A module compiled in place runs the global
    hooks inside dynamo's frame, where they return at once: it is never captured, but its graphs
    are counted."""
    return compiled_model(models) or dynamo_graphs() > graphs_before
