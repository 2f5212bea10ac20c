"""Chain members a failed forward never reached are sized from the last member it completed
(recommend/unreached.py), so a plan made from an OOM covers the whole chain."""

from __future__ import annotations

from advisor.recommend.profile import profile_from_records
from advisor.recommend.unreached import extrapolate
from advisor.records.samples import Event, MemorySample, ModelInfo, ModuleStat

STRUCTURE = [{"name": "emb", "type": "Embedding"}, {"name": "blocks", "type": "ModuleList"}] + [
    {"name": f"blocks.{i}{part}", "type": kind}
    for i in range(4) for part, kind in (("", "Block"), (".attn", "Attention"), (".mlp", "MLP"))]


def _row(name: str, activation: int) -> ModuleStat:
    return ModuleStat(step=0, name=name, activation_bytes=activation, input_bytes=10, output_bytes=10, forward_s=0.1)


def test_the_partial_and_the_unreached_members_copy_the_last_completed_one() -> None:
    rows = [_row("emb", 5), _row("blocks.0", 1), _row("blocks.0.attn", 100), _row("blocks.0.mlp", 200),
            _row("blocks.1", 1), _row("blocks.1.attn", 100), _row("blocks.1.mlp", 200),
            _row("blocks.2", 1), _row("blocks.2.attn", 100)]  # blocks.2 failed in its mlp
    out, filled = extrapolate(rows, STRUCTURE, "blocks.2.mlp")
    assert filled == ["blocks.2", "blocks.3"]
    by_name = {r.name: r.activation_bytes for r in out}
    assert by_name == {"emb": 5, **{f"blocks.{i}": 1 for i in range(4)}, **{f"blocks.{i}.attn": 100 for i in range(4)},
                       **{f"blocks.{i}.mlp": 200 for i in range(4)}}


def test_a_complete_chain_a_mixed_chain_and_no_completed_member_are_left_alone() -> None:
    rows = [_row(f"blocks.{i}", 1) for i in range(4)]
    assert extrapolate(rows, STRUCTURE, None) == (rows, [])
    mixed = [dict(m, type="Other") if m["name"] == "blocks.3" else m for m in STRUCTURE]
    assert extrapolate(rows[:2], mixed, "blocks.2")[1] == []
    assert extrapolate([_row("blocks.0.attn", 100)], STRUCTURE, "blocks.0.mlp")[1] == []


def test_the_profile_of_a_forward_oom_fills_in_the_chain_and_says_so() -> None:
    stats = [ModuleStat(step=0, name=name, activation_bytes=act) for name, act in
             (("blocks.0", 300), ("blocks.1", 300), ("blocks.2", 120))]
    oom = Event(step=0, name="oom", data={"phase": "forward", "module": "blocks.2", "categories": {"activation": 720}})
    model = ModelInfo(name="Net", modules=STRUCTURE)
    memory = [MemorySample(step=0, time=0.0, total_bytes=720, categories={"activation": 720})]
    profile = profile_from_records(steps=[], memory=memory, modules=stats, events=[oom], models=[model])
    assert profile.unreached_modules == ("blocks.2", "blocks.3")
    assert sorted((m.name, m.activation_bytes) for m in profile.modules) == [
        ("blocks.0", 300), ("blocks.1", 300), ("blocks.2", 300), ("blocks.3", 300)]
    backward = Event(step=0, name="oom", data={"phase": "backward", "module": None, "categories": {}})
    assert profile_from_records(steps=[], memory=memory, modules=stats, events=[backward],
                                models=[model]).unreached_modules == ()
