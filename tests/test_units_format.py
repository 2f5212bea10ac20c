"""One unit style: a single byte and duration formatter behind every surface."""

from __future__ import annotations

import pytest

from advisor.records import units
from advisor.records.units import MISSING, fmt_bytes, fmt_quantity, fmt_seconds


@pytest.mark.parametrize(
    ("value", "text"),
    [
        (34407204, "32.8 MiB"),  # the raw byte count the evidence used to show
        (258 * 1024, "258 KiB"),
        (1023.9 * 1024, "1.00 MiB"),  # rounds up into the next unit, never "1024 KiB"
        (0.02 * 2**30, "20.5 MiB"),
        (999, "999 B"),
    ],
)
def test_bytes_three_significant_figures(value: float, text: str) -> None:
    assert fmt_bytes(value) == text


@pytest.mark.parametrize(
    ("value", "text"),
    [(0.0999, "99.9 ms"), (0.99999, "1.00 s"), (5e-7, "500 ns"), (0.000125, "125 µs")],
)
def test_seconds_three_significant_figures(value: float, text: str) -> None:
    assert fmt_seconds(value) == text


def test_quantity_uses_the_unit_formatters() -> None:
    assert fmt_quantity(34407204, "bytes") == "32.8 MiB"
    assert fmt_quantity(0.0123, "s") == "12.3 ms"
    assert fmt_quantity(0.95, None) == "0.95"
    assert fmt_quantity(None, "bytes") == MISSING


def test_every_surface_shares_the_formatter() -> None:
    from advisor import diff_render, progress, report_blocks
    from advisor.sections import comm, memory
    from advisor.tui import format as tui_format

    assert tui_format.fmt_bytes is units.fmt_bytes and tui_format.fmt_seconds is units.fmt_seconds
    assert report_blocks.fmt_bytes is units.fmt_bytes and diff_render.fmt_seconds is units.fmt_seconds
    assert memory.fmt_bytes is units.fmt_bytes and comm.fmt_bytes is units.fmt_bytes
    assert progress.fmt_seconds is units.fmt_seconds
    assert units.format_size(3 * 2**30) == fmt_bytes(3 * 2**30)


def test_evidence_line_formats_bytes() -> None:
    from advisor.records.advice import Evidence
    from advisor.tui.recommendations_view import _evidence_line

    line = _evidence_line(Evidence(what="peak memory", value=34407204, unit="bytes", threshold=24_000_000))
    assert line == "peak memory: 32.8 MiB (threshold 22.9 MiB)"
    assert "bytes" not in line


def test_titles_do_not_repeat_columns_nor_cite_missing_files() -> None:
    from advisor.recommend.advise import advise
    from advisor.recommend.profile import ModuleProfile, Profile

    blocks = tuple(
        ModuleProfile(name=f"blocks.{i}", type="Block", depth=2, parameter_bytes=1 << 20,
                      activation_bytes=8 << 20, input_bytes=1 << 20, output_bytes=1 << 20,
                      forward_s=0.01, backward_s=0.02)
        for i in range(4)
    )
    profile = Profile(peak_bytes=40 << 20, budget_bytes=30 << 20,
                      categories_at_peak={"activation": 32 << 20, "parameter": 4 << 20},
                      categories_max={"activation": 32 << 20, "parameter": 4 << 20},
                      modules=blocks, step_time_s=0.1, phases={"forward_s": 0.03})
    diagnosis, recommendations = advise(profile)
    recs = [r for r in recommendations if r.remedy == "activation_checkpointing"]
    assert recs, (diagnosis, recommendations)
    for rec in recs:
        assert "GiB" not in rec.title and "MiB" not in rec.title and "ms" not in rec.title
        assert "REFERENCE.md" not in rec.cost_model
        assert not any("REFERENCE.md" in str(e) for e in rec.evidence)


def test_rates_read_in_decimal_prefixes_as_bandwidths_are_quoted():
    from advisor.records.units import fmt_rate

    # A diagnosis's evidence printed "2292183937.5 B/s" before rates had a formatter.
    assert fmt_quantity(2292183937.5, "B/s") == "2.29 GB/s"
    assert fmt_rate(850e6) == "850 MB/s"
    assert fmt_rate(999.6e6) == "1.00 GB/s"
    assert fmt_rate(206e12, "FLOP/s") == "206 TFLOP/s"
    assert fmt_rate(None) == MISSING
