"""Typed event payloads (advisor/records/events.py): what the agents send decodes, checked, into the
record the controller and the recommender read by attribute; one that does not is dropped at the
controller's edge (advisor/intake.py) with the field named."""

from __future__ import annotations

import pytest
import recorded

from advisor.intake import RecordError, parse_record
from advisor.records.events import PAYLOADS, DataLoaderSettings, DeviceSpec, Oom, WarningEvent, payload
from advisor.records.jsonable import to_json
from advisor.records.results import ApplyResult, Measurement
from advisor.records.samples import Event

# Every event kind a reader outside the agent and the probes takes apart (grep `name ==` in
# advisor/ and recommend/): each has its payload record.
READ = ("warning", "oom", "apply_result", "apply_started", "apply_reverted", "checkpoint_save", "cuda_memory",
        "dataloader", "deep_sampling_stopped", "device_spec", "module_activations", "job", "peer_lost",
        "peer_exit", "pipeline_stages", "collective_seq", "remedy_checks", "deep_probes_left_off")


def test_every_event_kind_the_controller_reads_has_a_payload() -> None:
    assert set(READ) <= set(PAYLOADS)
    for name, cls in PAYLOADS.items():
        assert cls.NAME == name


@pytest.mark.parametrize("session", ["gpt", "ddp", "oom", "gpt_h100"])
def test_the_recorded_agents_events_decode(session) -> None:
    events = [r for r in recorded.read(session)[1] if isinstance(r, Event)]
    typed = [e for e in events if payload(e) is not None]
    assert typed  # the recordings hold device_spec, module_activations, oom, cuda_memory events
    for event in typed:
        decoded = payload(event)
        assert payload(event) is decoded  # decoded once, kept with the event
        kept = {k: to_json(getattr(decoded, k)) for k in event.data if k in type(decoded).__dataclass_fields__}
        assert kept == {k: event.data[k] for k in kept}  # every field the agent sent, as it sent it
    if session == "oom":
        [oom] = [Oom.of(e).at_rank(e) for e in events if e.name == "oom"]
        assert oom.op == "aten.nll_loss_backward" and oom.requested_bytes == 1048576 and oom.rank == 0


def test_a_payload_names_the_wrong_field_and_the_intake_drops_it() -> None:
    bad = Event(name="dataloader", data={"index": 0, "num_workers": "4"})
    with pytest.raises(ValueError, match=r"DataLoaderSettings\.num_workers: expected an integer"):
        DataLoaderSettings.of(bad)
    with pytest.raises(RecordError, match="event dataloader: .*num_workers"):
        parse_record("event", bad.to_dict())
    with pytest.raises(RecordError, match="event device_spec.memory_capacity: -1 is negative"):
        parse_record("event", DeviceSpec(type="cuda", memory_capacity=-1).event().to_dict())
    with pytest.raises(RecordError, match="checkpoint_save.*api"):
        parse_record("event", {"name": "checkpoint_save", "data": {"api": "pickle.dump", "saves": ["model"]}})
    with pytest.raises(ValueError, match="a 'warning' event has no 'oom' payload"):
        Oom.of(WarningEvent(message="x").event())


def test_emitters_and_readers_meet_in_the_same_record() -> None:
    result = ApplyResult(remedy="zero", recommendation_id="zero-2", params={"stage": 2}, at_step=5, status="kept",
                         before=Measurement(peak_memory_bytes=10, steps=(3, 4)), after=Measurement(step_kind="light"))
    event = result.event(rank=1, step=8)
    assert event.name == "apply_result" and event.data["measured"]["before"]["steps"] == [3, 4]
    assert parse_record("event", event.to_dict()) == event
    assert ApplyResult.of(event) == result
    warning = WarningEvent(message="hello", source="apply").event()
    assert payload(warning) == WarningEvent(message="hello", source="apply")
    assert payload(Event(name="collective_stats", data={"calls": []})) is None  # a kind nobody reads: no payload
    seq = payload(Event(name="collective_seq", data={"calls": [{"op": "all_reduce", "group": "0", "seq": 3,
                                                                "start": 1.5}]}))
    assert seq.calls[0].seq == 3 and seq.calls[0].group == "0"  # read by the straggler analysis


def test_a_decision_the_advice_loop_printed_is_not_printed_again_by_the_progress_lines():
    """--apply auto's "applied nothing" reached stderr twice in headless runs: once as the loop
    decided, once as the warning record came back through the progress printer."""
    import io

    from advisor.progress import ProgressPrinter
    from advisor.records.events import SAID_BY_ADVICE

    out = io.StringIO()
    printer = ProgressPrinter(total=None, stream=out)
    printer(WarningEvent(message="--apply auto applied nothing: x", source=SAID_BY_ADVICE).event(rank=0))
    assert out.getvalue() == ""
    printer(WarningEvent(message="the executor says y", source="apply").event(rank=0))
    printer(WarningEvent(message="the recommender failed", source="advice").event(rank=0))
    assert out.getvalue() == "advisor: warning: the executor says y\nadvisor: warning: the recommender failed\n"
