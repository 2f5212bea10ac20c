"""One time base: module times and collective waits are shown against the step they belong to."""

from __future__ import annotations

import pytest

from advisor.records.samples import CollectiveStat, ModuleStat, StepSample
from advisor.sections.comm import build_collectives_section, wait_per_step
from advisor.sections.memory import build_memory_section, render_memory_section
from advisor.state import LiveState


def test_module_times_are_normalised_to_an_ordinary_step() -> None:
    live = LiveState()
    for index, deep, fwd in ((0, False, 1.0), (1, True, 0.4), (2, False, 0.1), (3, False, 0.1)):
        live.add(StepSample(index=index, time_s=2 * fwd, deep=deep,
                            phases={"forward_s": fwd, "backward_s": fwd}))
    live.add(ModuleStat(step=1, name="", type="GPT", depth=0, forward_s=0.4, backward_s=0.2))
    live.add(ModuleStat(step=1, name="blocks.0", type="Block", depth=2, activation_bytes=10,
                        forward_s=0.2, backward_s=0.1))
    section = build_memory_section(live.snapshot(), budget_bytes=None)
    assert section["module_time_scale"] == pytest.approx({"forward": 0.25, "backward": 0.5})
    block = next(m for m in section["modules"] if m["name"] == "blocks.0")
    assert block["forward_s"] == pytest.approx(0.2)  # as measured on the deep step, for the solver
    assert block["light_forward_s"] == pytest.approx(0.05)
    assert block["light_backward_s"] == pytest.approx(0.05)
    table = render_memory_section(section)[1]
    assert "ordinary step" in str(table.caption) and "4.0x" in str(table.caption)



def test_a_module_forward_timed_on_ordinary_steps_replaces_the_scaled_one() -> None:
    """Where the agent timed a module on light steps (``module_forward_s``), the report shows
    that median and marks it measured; the others stay scaled from the deep step."""
    live = LiveState()
    timed = {2: {"blocks.0": 0.03}, 3: {"blocks.0": 0.01}, 4: {"blocks.0": 0.02}}
    spans = {2: {"blocks.0": 0.024}, 3: {"blocks.0": 0.008}, 4: {"blocks.0": 0.016}}  # up to the last save
    for index, deep, fwd in ((0, False, 1.0), (1, True, 0.4), (2, False, 0.1), (3, False, 0.1), (4, False, 0.1)):
        live.add(StepSample(index=index, time_s=2 * fwd, deep=deep, phases={"forward_s": fwd, "backward_s": fwd},
                            module_forward_s=timed.get(index, {}), module_recompute_s=spans.get(index, {})))
    live.add(ModuleStat(step=1, name="", type="GPT", depth=0, forward_s=0.4, backward_s=0.2))
    for name in ("blocks.0", "blocks.1"):
        live.add(ModuleStat(step=1, name=name, type="Block", depth=2, activation_bytes=10, forward_s=0.2,
                            backward_s=0.1))
    rows = {m["name"]: m for m in build_memory_section(live.snapshot(), budget_bytes=None)["modules"]}
    assert rows["blocks.0"]["light_forward_s"] == pytest.approx(0.02) and rows["blocks.0"]["light_forward_measured"]
    assert rows["blocks.1"]["light_forward_s"] == pytest.approx(0.05) and not rows["blocks.1"]["light_forward_measured"]
    # What checkpointing it runs again: the median span where measured, null where not.
    assert rows["blocks.0"]["light_recompute_s"] == pytest.approx(0.016)
    assert rows["blocks.1"]["light_recompute_s"] is None

def test_a_block_timed_on_a_slow_step_is_taken_at_an_ordinary_steps_speed() -> None:
    """hf_clm in the zoo: blocks timed on steps whose whole forward ran 1.3-3x an ordinary one
    (the machine loaded, the job still warming) priced a checkpoint's recompute that much too
    high. A timed step's figures are scaled by the ordinary steps' median forward over its own:
    the block keeps its share of the forward. The report's row and the recommender's profile read
    the same figure."""
    from advisor.recommend.profile import profile_from_records

    live = LiveState()
    steps = []
    # step 6's forward ran 3x the ordinary 0.1 s: its block's 0.06 s is 0.02 s at ordinary speed
    for index, fwd, timed in ((0, 1.0, None), (5, 0.1, 0.02), (6, 0.3, 0.06), (7, 0.1, None), (8, 0.1, None)):
        sample = StepSample(index=index, time_s=2 * fwd, phases={"forward_s": fwd, "backward_s": fwd},
                            module_forward_s={"blocks.0": timed} if timed else {},
                            module_recompute_s={"blocks.0": timed * 0.8} if timed else {})
        live.add(sample)
        steps.append(sample)
    module = ModuleStat(step=1, name="blocks.0", type="Block", depth=2, activation_bytes=10, forward_s=0.2,
                        backward_s=0.1)
    live.add(module)
    row = next(m for m in build_memory_section(live.snapshot(), budget_bytes=None)["modules"] if m["name"] == "blocks.0")
    assert row["light_forward_s"] == pytest.approx(0.02) and row["light_recompute_s"] == pytest.approx(0.016)
    profile = profile_from_records(steps=steps, modules=[module])
    assert profile.light_forward_s == {"blocks.0": pytest.approx(0.02)}
    assert profile.light_recompute_s == {"blocks.0": pytest.approx(0.016)}


def test_a_wait_never_exceeds_its_call_nor_its_step() -> None:
    live = LiveState()
    for index in range(2):
        live.add(StepSample(index=index, time_s=0.3))
    # A wait of 0.9 s recorded against calls of 0.5 s in steps of 0.3 s: the rank cannot have
    # waited longer than the call, nor longer than the step.
    for step in range(2):
        for _ in range(2):
            live.add(CollectiveStat(step=step, op="all_reduce", group_size=2, bytes=1024, time_s=0.5, wait_s=0.9))
    state = live.snapshot()
    waits = wait_per_step(state, {})
    assert waits[0] == pytest.approx(0.3)
    rows = build_collectives_section(state)
    assert rows[0]["wait_s"] == pytest.approx(4 * 0.5)


def test_the_baseline_step_time_excludes_the_warm_up_step() -> None:
    from advisor.recommend.profile import profile_from_records

    steps = [StepSample(index=0, rank=0, time_s=1.73, deep=False),
             StepSample(index=1, rank=0, time_s=0.5, deep=True),
             StepSample(index=2, rank=0, time_s=0.08, deep=False),
             StepSample(index=3, rank=0, time_s=0.09, deep=False),
             StepSample(index=4, rank=0, time_s=0.07, deep=False)]
    # steps 3 and 4: step 2 follows the deep step 1 (it pays for the probes' teardown)
    assert profile_from_records(steps=steps).step_time_s == pytest.approx(0.08)
    assert profile_from_records(steps=steps[:3]).step_time_s == pytest.approx(0.08)  # the only light one
    # nothing light after step 0 yet: the profiled step, as the report's base (``ordinary_steps``)
    assert profile_from_records(steps=steps[:2]).step_time_s == pytest.approx(0.5)
