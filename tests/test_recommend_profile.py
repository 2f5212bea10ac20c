"""Profile building from a session's records and the calibrated memory model on it."""

from __future__ import annotations

import pytest

from profiles import records_profile

from advisor.records.samples import ModuleStat, StepSample
from advisor.recommend.memory_model import Block, Chain, chain_from_profile, find_chain, kept_bytes, measured_peak, predicted_peak
from advisor.recommend.profile import profile_from_records


def _memory(**extra) -> dict:
    modules = [
        {"name": "", "depth": 0, "forward_s": 0.4, "step": 2},
        {"name": "stem", "depth": 1, "activation_bytes": 50, "input_bytes": 8, "output_bytes": 10, "forward_s": 0.1, "step": 2},
        {"name": "layers.0", "depth": 1, "activation_bytes": 30, "input_bytes": 10, "output_bytes": 10, "forward_s": 0.1, "step": 2},
        {"name": "layers.0.fc", "depth": 2, "activation_bytes": 70, "input_bytes": 10, "output_bytes": 10, "forward_s": 0.05, "step": 2},
        {"name": "layers.1", "depth": 1, "activation_bytes": 90, "input_bytes": 10, "output_bytes": 10, "forward_s": 0.1, "step": 2},
        {"name": "layers.1", "depth": 1, "activation_bytes": 100, "input_bytes": 10, "output_bytes": 10, "forward_s": 0.3, "step": 5},
        {"name": "layers.1", "depth": 1, "activation_bytes": 999, "rank": 1, "step": 2},  # other ranks ignored
    ]
    memory = {"peak_bytes": 1000, "categories_at_peak": {"parameter": 600, "activation": 260, "temporary": 140},
              "categories_max": {"activation": 300}, "modules": modules}
    memory.update(extra)
    return memory


def _steps() -> list[dict]:
    light = [{"index": i, "rank": 0, "time_s": t, "phases": {"forward_s": 0.2, "data_s": 0.01}} for i, t in enumerate([1.0, 3.0, 2.0])]
    deep = [{"index": 3, "rank": 0, "time_s": 9.0, "deep": True, "phases": {"forward_s": 0.4}}]
    return light + deep + [{"index": 0, "rank": 1, "time_s": 50.0}]


def test_the_profile_of_a_sessions_records_takes_each_modules_latest_stat_and_the_ordinary_steps() -> None:
    profile = records_profile(**_memory(), steps=_steps(), capacity=4000)
    assert profile.budget_bytes == 4000  # device capacity when no --memory-budget
    assert profile.step_time_s == 2.5  # median of rank 0's ordinary steps: not the deep one, not warm-up step 0
    assert profile.time_scale == pytest.approx(0.5)  # ordinary forward 0.2 s / probed model forward 0.4 s
    layer1 = profile.module("layers.1")  # its latest stat (step 5), of rank 0 only
    assert layer1 is not None and layer1.activation_bytes == 100 and layer1.forward_s == pytest.approx(0.3)
    assert profile.parent("layers.0.fc") == "layers.0" and profile.parent("layers.0") == ""
    assert [m.name for m in profile.children("layers.0")] == ["layers.0.fc"]
    assert profile.subtree_activation("layers.0") == 100
    assert records_profile(**_memory(), steps=_steps(), capacity=4000, budget_bytes=123).budget_bytes == 123


def test_the_profile_reads_records_directly() -> None:
    stats = [ModuleStat(step=1, name="a.0", activation_bytes=5), ModuleStat(step=1, name="a.1", activation_bytes=7)]
    steps = [StepSample(index=0, time_s=0.5, phases={"forward_s": 0.1})]
    profile = profile_from_records(steps=steps, modules=stats, budget_bytes=200)
    assert profile.budget_bytes == 200 and profile.step_time_s == 0.5
    assert [m.name for m in find_chain(profile)] == ["a.0", "a.1"]


def test_chain_calibration_from_measurements() -> None:
    profile = records_profile(**_memory(), steps=_steps())
    chain = chain_from_profile(profile)
    assert chain is not None and chain.names == ("layers.0", "layers.1")
    assert [b.activation_bytes for b in chain.blocks] == [100, 100]  # subtree sums
    assert chain.fixed_bytes == 1000 - 260  # peak minus activation at the peak
    assert chain.other_activation_bytes == 60  # activation at peak not owned by the blocks
    assert chain.contiguous
    assert predicted_peak(chain, set()) == 1000  # reproduces the measured peak
    # Both checkpointed: keeps x0, x1, y1 (30) and recomputes one block (100).
    assert predicted_peak(chain, {0, 1}) == 740 + 60 + 30 + 100


def test_non_contiguous_units_count_input_and_output() -> None:
    blocks = tuple(Block(name=f"m{i}", activation_bytes=100, input_bytes=10, output_bytes=20, forward_s=1.0) for i in range(2))
    chain = Chain(blocks=blocks, contiguous=False)
    assert kept_bytes(chain, {0, 1}) == 60
    assert kept_bytes(chain, [True, False]) == 30 + 100
    with pytest.raises(ValueError, match="valid: 2"):
        kept_bytes(chain, [True])
    with pytest.raises(ValueError, match="valid: 0..1"):
        kept_bytes(chain, {5})


def test_oom_calibration_uses_the_failed_request() -> None:
    memory = _memory(peak_bytes=0, categories_at_peak={}, categories_max={},
                     oom={"op": "aten.mm", "module": "layers.1", "requested_bytes": 500,
                          "categories": {"parameter": 600, "activation": 200}})
    profile = records_profile(**memory, steps=_steps())
    assert measured_peak(profile) == 600 + 200 + 500
