"""What the views write, from a model built on hand-made states (no app): CUDA memory, the roof."""

from __future__ import annotations

from advisor.records.advice import Diagnosis
from advisor.records.results import ApplyResult
from advisor.records.samples import Event, MemorySample, StepSample
from advisor.state import SessionState
from advisor.tui.view_model import build_view_model
from advisor.tui.views.compute import ridge
from advisor.tui.flow import pack
from advisor.tui.views.memory import summary_lines as memory_lines
from advisor.tui.views.overview import diagnosis_sentence, facts_lines

GIB = 1024**3


def test_memory_summary_shows_allocated_reserved_and_outside_pytorch_on_cuda() -> None:
    state = SessionState(
        steps={0: [StepSample(index=1, time_s=0.1, deep=True)]},
        memory=[MemorySample(step=1, time=t, categories={"activation": n * GIB}, total_bytes=n * GIB,
                             allocated_bytes=n * GIB, reserved_bytes=(n + 1) * GIB) for t, n in ((0.0, 1), (0.05, 3))],
        events=[Event(name="cuda_memory", step=1, data={"reserved_minus_allocated_bytes": GIB,
                                                        "device_used_bytes": 6 * GIB,
                                                        "device_used_outside_torch_bytes": 2 * GIB})])
    model = build_view_model(state, budget_bytes=8 * GIB)
    text = pack(memory_lines(model), 200).plain
    assert "peak 3.00 GiB at step 1 of a 8.00 GiB budget (38%)" in text
    assert "CUDA   allocated 3.00 GiB   reserved 4.00 GiB   outside PyTorch 2.00 GiB" in text
    assert model.traced is not None and model.traced.step == 1
    assert [(p.time_ms, p.total_bytes) for p in model.traced.points] == [(0.0, GIB), (50.0, 3 * GIB)]


def test_overview_sentence_and_facts_name_the_remedies_in_force() -> None:
    state = SessionState(steps={0: [StepSample(index=i, time_s=0.1) for i in range(3)]},
                         diagnosis=Diagnosis(bottleneck="memory", summary="activations are 70% of peak memory"),
                         applied=[ApplyResult(recommendation_id="ac-1", remedy="activation_checkpointing", status="kept")])
    model = build_view_model(state, budget_bytes=GIB, live=True)
    assert diagnosis_sentence(model) == "Bottleneck: memory: activations are 70% of peak memory"
    facts = pack(facts_lines(model), 200).plain
    assert "remedies in force activation_checkpointing" in facts and "budget 1.00 GiB" in facts
    assert "job running" in facts


def test_ridge_is_peak_flops_over_bandwidth() -> None:
    state = SessionState(steps={0: [StepSample(index=0, time_s=0.1)]},
                         events=[Event(name="device_spec", data={"peak_flops": {"fp32": 2e12}, "memory_bandwidth": 1e11})])
    assert ridge(build_view_model(state)) == 20.0
