"""The paths a model of thousands of modules runs tens of thousands of times per deep step keep
their answers when made cheaper (issue 37): the controller's field checks, the store's batched
inserts, the report's encoding, the role walk and the counter's key."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch import nn

from advisor.intake import RecordError, parse_record
from advisor.paths import DB_NAME, new_session_dir
from advisor.probes.compute.counter import count_ops
from advisor.probes.memory.categories import role_tensors
from advisor.records.samples import MemorySample, OpStat
from advisor.report import INDENTED_MAX, write_json
from advisor.store import SessionStore, load_state

MEMORY = {"rank": 0, "step": 1, "time": 0.5, "event": "aten.addmm", "module": "3",
          "categories": {"activation": 10, "temporary": 2}, "total_bytes": 12, "op_bytes": 2}
OP = {"rank": 0, "step": 2, "name": "aten.mm", "module": "0", "phase": "forward", "input_shapes": [[16, 16], [16]],
      "dtype": "float32", "count": 1, "flops": 10, "bytes": 20, "time_s": 1e-5, "inline": True}


@pytest.mark.parametrize(("kind", "base", "field", "value", "said"), [
    ("memory", MEMORY, "categories", {"activation": "10"}, "expected an integer"),
    ("memory", MEMORY, "categories", {"activation": 2**64}, "64-bit"),
    ("memory", MEMORY, "categories", [1, 2], "expected an object"),
    ("memory", MEMORY, "module", 3, "expected a string"),
    ("memory", MEMORY, "total_bytes", -1, "negative"),
    ("op", OP, "input_shapes", [[16, "16"]], "expected an integer"),
    ("op", OP, "input_shapes", [16], "expected a list"),
    ("op", OP, "input_shapes", [[2**63]], "64-bit"),
    ("op", OP, "inline", 1, "true/false"),
    ("op", OP, "time_s", float("nan"), "not a finite number"),
])
def test_the_direct_field_checks_refuse_what_the_general_one_refused(kind, base, field, value, said) -> None:
    assert parse_record(kind, base).to_dict()[field] == base[field]  # the good record passes
    with pytest.raises(RecordError, match=said):
        parse_record(kind, {**base, field: value})


def test_a_record_sqlite_cannot_hold_is_left_out_of_its_batch_alone(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("ADVISOR_HOME", str(tmp_path))
    folder = new_session_dir("t.py")
    store = SessionStore(folder / DB_NAME)
    store.put(MemorySample(step=1, time=0.0, total_bytes=1))
    store.put(MemorySample(rank=2**70, step=1, time=0.0, total_bytes=2))  # no SQLite integer holds its rank
    store.put(MemorySample(step=1, time=0.0, total_bytes=3))
    store.close()
    assert store.failed == 1
    assert [s.total_bytes for s in load_state(folder / DB_NAME).memory] == [1, 3]


def test_a_large_report_is_written_on_one_line_and_reads_the_same(tmp_path) -> None:
    small = {"schema": 1, "ops": [OP] * 3}
    large = {"schema": 1, "ops": [OP] * (INDENTED_MAX // len(json.dumps(OP)) + 1)}
    for report, name in ((small, "small.json"), (large, "large.json")):
        write_json(report, str(tmp_path / name))
        assert json.loads((tmp_path / name).read_text()) == report
    assert (tmp_path / "small.json").read_text().count("\n") > 3  # indented for a reader
    assert (tmp_path / "large.json").read_text().count("\n") == 0


def test_each_parameter_is_walked_once_though_model_and_optimizer_both_name_it() -> None:
    model = nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4))
    opt = torch.optim.Adam(model.parameters())
    model(torch.randn(2, 4)).sum().backward()
    opt.step()
    roles = [(role, id(t)) for role, t in role_tensors([model], [opt])]
    assert len(roles) == len(set(roles))
    assert sum(role == "parameter" for role, _ in roles) == 4 and sum(role == "gradient" for role, _ in roles) == 4


def test_the_counter_keys_plain_tensors_and_still_counts_a_subclass_by_its_local_part() -> None:
    class Local(torch.Tensor):  # a subclass without a local part: counted, never keyed
        pass

    a, b = torch.randn(8, 16), torch.randn(16, 4)
    plain = count_ops(lambda: torch.mm(a, b))
    wrapped = count_ops(lambda: torch.mm(a.as_subclass(Local), b))
    assert [(c.name, c.flops, c.input_shapes) for c in plain] == [("aten.mm", 2 * 8 * 16 * 4, ((8, 16), (16, 4)))]
    assert [(c.name, c.flops) for c in wrapped if c.name == "aten.mm"] == [("aten.mm", 2 * 8 * 16 * 4)]


def test_ops_of_one_shape_share_its_list_form_and_serialise_as_lists() -> None:
    from advisor.probes.compute.probe import aggregate

    calls = count_ops(lambda: [torch.mm(torch.randn(4, 4), torch.randn(4, 4)) for _ in range(3)])
    calls = [c._replace(module=str(i)) for i, c in enumerate(calls)]
    stats = [s for s in aggregate(calls, [0.0] * len(calls), rank=0, step=1) if s.name == "aten.mm"]
    assert len(stats) == 3 and stats[0].input_shapes == [[4, 4], [4, 4]]
    assert all(isinstance(s, OpStat) and s.to_dict()["input_shapes"] == [[4, 4], [4, 4]] for s in stats)


def test_attach_advises_once_for_its_report(monkeypatch, tmp_path: Path) -> None:
    import advisor.advice as advice_module
    import advisor.early_report as early_report
    from advisor.report import build_report
    from advisor.state import LiveState
    from advisor.records.samples import StepSample

    live = LiveState()
    for index in range(6):
        live.add(StepSample(index=index, time_s=0.1, end_time=100.0 + index, deep=index in (1, 2, 3),
                            phases={"forward_s": 0.1}))
    live.add(MemorySample(step=1, time=0.0, categories={"activation": 900}, total_bytes=900))
    calls = []
    real = advice_module.advise_state

    def counted(*args, **kwargs):
        calls.append(1)
        return real(*args, **kwargs)

    monkeypatch.setattr(early_report, "advise_state", counted)
    monkeypatch.setattr("advisor.sections.advise_state", counted)
    state, advice = early_report.advised(live.snapshot(), 960)
    report = build_report(state, budget_bytes=960, advice=advice)
    assert len(calls) == 1
    assert report["diagnosis"] == state.diagnosis.to_dict()
