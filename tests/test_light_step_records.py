"""A light step's records leave the training thread as cheaply as they can: the step sample is
encoded by the channel's sender, it gets its loss by a dict copy, and a model already found is
recognised at the top of its forward by identity."""

from __future__ import annotations

import json

import pytest
import torch

from advisor.agent.channel import AgentChannel, encoded_later
from advisor.agent.models import ModelRegistry
from advisor.records.samples import Event, MemorySample, StepSample


class _Broken(StepSample):
    def to_dict(self):
        raise RuntimeError("cannot say its fields")


def test_the_sender_encodes_a_step_sample_as_the_training_thread_did(tmp_path) -> None:
    spill = tmp_path / "spill-rank0.jsonl"
    channel = AgentChannel(None, b"secret", spill_path=str(spill))  # no controller: every record spills
    sample = StepSample(index=4, time_s=0.02, phases={"forward_s": 0.01}, loss=1.5, losses=[1.5])
    event = Event(step=4, name="warning", data={"message": "m"})
    memory = MemorySample(step=4, time=0.001, event="optimizer_start", categories={"parameter": 8}, total_bytes=8)
    assert encoded_later(sample) and encoded_later(memory) and not encoded_later(event)
    channel.emit(sample)  # the record itself: the sender turns it into its message
    channel.emit(_Broken(index=5, time_s=0.02))  # fails on the sender: dropped and counted, no more
    channel.emit({"kind": event.KIND, "data": event.to_dict()})
    channel.close(5)
    lines = [json.loads(line) for line in spill.read_text().splitlines()]
    assert lines == [{"kind": "step", "data": sample.to_dict()}, {"kind": "event", "data": event.to_dict()}]
    assert channel.dropped == 1


def test_with_fields_copies_the_record_with_the_changes() -> None:
    sample = StepSample(index=1, time_s=0.5, phases={"data_s": 0.1})
    done = sample.with_fields(loss=2.0, losses=[2.0])
    assert type(done) is StepSample and done == StepSample(index=1, time_s=0.5, phases={"data_s": 0.1},
                                                          loss=2.0, losses=[2.0])
    assert sample.loss is None and sample.losses is None  # the original is unchanged
    with pytest.raises(TypeError, match="no field 'lose'"):
        sample.with_fields(lose=2.0)


def _trained(width: int) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    model = torch.nn.Linear(width, width)
    return model, torch.optim.SGD(model.parameters(), lr=0.1)


def test_a_found_model_is_known_by_identity_and_a_new_one_is_still_found() -> None:
    registry = ModelRegistry()
    a, opt_a = _trained(2)
    [(found, _)] = registry.see(a, [opt_a])
    assert found is a
    assert registry.see(a, [opt_a]) == []  # every later forward of it: nothing to find
    b, opt_b = _trained(3)  # a second model (a GAN's other network) is not hidden by the first
    [(found, _)] = registry.see(b, [opt_a, opt_b])
    assert found is b and registry.models() == [a, b]
    assert registry.see(a, [opt_a, opt_b]) == [] and registry.see(b, [opt_a, opt_b]) == []
    loss_fn = torch.nn.MSELoss()  # nothing to train: never a model, however often it runs first
    assert registry.see(loss_fn, [opt_a, opt_b]) == [] and registry.models() == [a, b]
