"""A deep step's memory samples and op signatures travel as tables of columns (issue 37): the
controller checks, stores and folds them into the very records the probes made one by one."""

from __future__ import annotations

import json
import time

import pytest
import torch
from fakes import FakeContext
from torch import nn

from advisor.intake import RecordError, parse_record
from advisor.records.jsonable import column_json
from advisor.paths import DB_NAME, new_session_dir
from advisor.probes.compute.probe import ComputeProbe
from advisor.probes.memory.probe import ROW_FIELDS, MemoryProbe
from advisor.records.samples import TABLE_ROWS, MemorySample, ModuleStat, OpStat, RecordTable
from advisor.records.table import TableBuilder
from advisor.state import LiveState
from advisor.store import SessionStore, load_state


def _samples(n: int, step: int = 1) -> list[MemorySample]:
    return [MemorySample(rank=1, step=step, time=i * 1e-4, event="aten.addmm", module=f"layers.{i % 7}",
                         categories={"activation": 8 * i, "parameter": 64}, total_bytes=8 * i + 64,
                         op_bytes=8 if i % 3 else None) for i in range(n)]


def _tabled(records: list) -> list[RecordTable]:
    rows = TableBuilder(type(records[0]))
    names = [n for n in records[0].to_dict() if n not in ("rank", "step")]
    for record in records:
        rows.add(record.rank, record.step, **{n: getattr(record, n) for n in names})
    return rows.take()


def _wire(table: RecordTable) -> RecordTable:
    """Through the wire's JSON and the controller's checks, as a received table."""
    return parse_record("table", json.loads(json.dumps(table.to_dict(), allow_nan=False)))


def test_a_table_arrives_as_the_records_it_stands_for() -> None:
    records = _samples(TABLE_ROWS + 5) + _samples(3, step=2)
    tables = _tabled(records)
    assert [(t.step, t.rows) for t in tables] == [(1, TABLE_ROWS), (1, 5), (2, 3)]  # full, then per step
    live = LiveState()
    for table in tables:
        live.add(_wire(table))
    assert live.snapshot().memory == records


@pytest.mark.parametrize(("column", "row", "value", "said"), [
    ("total_bytes", 3, -1, "negative"),
    ("total_bytes", 0, 2**64, "64-bit"),
    ("time", 2, "0.1", "expected a number"),
    ("categories", 1, {"activation": "8"}, "row 1: .* expected an integer"),
    ("module", 4, 7, "row 4: expected a string"),
])
def test_a_table_with_one_bad_value_is_refused_saying_where(column, row, value, said) -> None:
    data = _tabled(_samples(6))[0].to_dict()
    data["columns"][column][row] = value
    with pytest.raises(RecordError, match=said):
        parse_record("table", data)


@pytest.mark.parametrize(("change", "said"), [
    (lambda d: d.update(of="step"), "not a kind a table holds"),
    (lambda d: d.update(rows=TABLE_ROWS + 1), "rows"),
    (lambda d: d["columns"]["event"].pop(), "not a list of 6 values"),
    (lambda d: d["columns"].pop("total_bytes"), None),  # a field with a default: its default
    (lambda d: d["columns"].pop("time"), "no column 'time'"),
])
def test_a_malformed_table_is_refused(change, said) -> None:
    data = _tabled(_samples(6))[0].to_dict()
    change(data)
    if said is None:
        assert [r.total_bytes for r in parse_record("table", data).records()] == [0] * 6
        return
    with pytest.raises(RecordError, match=said):
        parse_record("table", data)


def test_a_stored_table_reads_back_as_its_records(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("ADVISOR_HOME", str(tmp_path))
    folder = new_session_dir("t.py")
    store = SessionStore(folder / DB_NAME)
    ops = [OpStat(rank=0, step=2, name="aten.mm", module=f"{i}", input_shapes=[[16, 16], [16, 16]], dtype="float32",
                  count=1, flops=8192, bytes=3072, time_s=1e-6 * i, inline=True) for i in range(40)]
    for table in _tabled(ops) + _tabled(_samples(10)):
        store.put(_wire(table))
    store.close()
    state = load_state(folder / DB_NAME)
    assert state.ops == ops and state.memory == _samples(10)


def _deep_step(probe, model: nn.Module) -> FakeContext:
    """Step 1 deep, with the phase calls the agent would make (tests/test_memory_probe.py's way)."""
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    ctx = FakeContext([model], [opt])
    probe.attach(ctx)
    ctx.step, ctx.step_start = 1, time.perf_counter()
    probe.start_deep(ctx, 1)
    for phase in ("data", "forward", "backward", "optimizer", "other"):
        ctx.phase = phase
        if isinstance(probe, MemoryProbe):
            probe.on_phase(ctx, phase, time.perf_counter())
        if phase == "forward":
            loss = model(torch.randn(4, 16)).square().mean()
        elif phase == "backward":
            loss.backward()
        elif phase == "optimizer":
            opt.step()
    probe.stop_deep(ctx, 1)
    probe.detach(ctx)
    return ctx


def test_the_probes_send_a_deep_steps_samples_and_ops_as_tables() -> None:
    assert TableBuilder(MemorySample).names == ROW_FIELDS  # the memory probe's rows are positional
    torch.manual_seed(0)
    model = nn.Sequential(*[nn.Linear(16, 16) for _ in range(4)])
    ctx = _deep_step(MemoryProbe(scan_gc=False), model)
    memory = [r for r in ctx.emitted if isinstance(r, MemorySample) and r.step == 1]
    tabled = sum(t.rows for t in ctx.tables if t.of == "memory")
    # every sample of the step but its end's (sent once the rows are, as it is) came in a table
    assert tabled == len(memory) - 1 > 20 and memory[-1].event == "step_end"
    assert [s.time for s in memory] == sorted(s.time for s in memory)
    modules = [r for r in ctx.emitted if isinstance(r, ModuleStat)]
    assert {m.name for m in modules} >= {"0", "3"} and sum(t.rows for t in ctx.tables if t.of == "module") == len(modules)
    ctx = _deep_step(ComputeProbe(), model)
    ops = [r for r in ctx.emitted if isinstance(r, OpStat)]
    assert ops and sum(t.rows for t in ctx.tables if t.of == "op") == len(ops)
    assert {o.name for o in ops} >= {"aten.addmm", "aten.mm"}


def test_a_tables_wire_form_shares_what_its_rows_share_and_copies_no_plain_column():
    """A deep step's 30,000 op rows name a handful of shape lists: converted row by row they were
    85,000 fresh lists kept alive for the channel's resend window (full garbage collections)."""
    shapes = ((8, 16), (16, 16))
    ops = [OpStat(rank=0, step=2, name="aten.mm", module=f"{i}", phase="forward", input_shapes=shapes,
                  dtype="float32", count=1, flops=4096, bytes=1536, time_s=1e-5 * i) for i in range(50)]
    (table,) = _tabled(ops)
    wire = table.to_dict()
    assert wire["columns"]["module"] is table.columns["module"]  # plain values: the column itself
    converted = wire["columns"]["input_shapes"]
    assert converted[0] == [[8, 16], [16, 16]] and all(c is converted[0] for c in converted)
    assert [r.to_dict() for r in _wire(table).records()] == [op.to_dict() for op in ops]
    assert column_json([1.0, float("nan"), (1, 2)]) == [1.0, None, [1, 2]]  # as to_json


def test_op_rows_come_in_the_field_order_an_op_table_takes():
    from advisor.probes.compute.probe import OP_ROW_FIELDS

    assert TableBuilder(OpStat).names == OP_ROW_FIELDS
