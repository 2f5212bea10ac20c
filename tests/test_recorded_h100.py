"""A session recorded on an NVIDIA H100 (torch 2.11, bf16 GPT; tests/data/README.md): what the
report and the rules make of real CUDA measurements, checked on every machine.

Kernel times are not slowed by the profiler; only the host that launches them is. Before this
was taken into account, the report scaled 17.6 ms of kernels down to 1 ms of a 31 ms step and
the host-overhead rule diagnosed launch overhead ("6% op time") on a job whose kernels fill more
than half of every step.
"""

import pytest
import recorded
from test_recommend_recorded import profile_of

from advisor.recommend.rules.host_overhead import host_overhead_rule
from advisor.report import build_report


@pytest.fixture(scope="module")
def state():
    return recorded.load_state("gpt_h100")


def test_kernel_times_are_taken_as_measured_against_an_ordinary_step(state) -> None:
    compute = build_report(state)["compute"]
    assert compute["op_time_base"] == "device kernels"
    assert compute["op_time_s"] == compute["profiled_op_time_s"] == pytest.approx(0.0176, abs=5e-4)
    assert compute["step_time_s"] == pytest.approx(0.0307, abs=5e-4)
    assert compute["profiled_step_time_s"] > 10 * compute["step_time_s"]  # the host under the profiler
    assert compute["unaccounted_share"] == pytest.approx(1 - 0.0176 / 0.0307, abs=0.02)
    assert compute["mfu"] == pytest.approx(0.21, abs=0.01)


def test_no_launch_overhead_is_diagnosed_where_kernels_fill_the_step(state) -> None:
    assert host_overhead_rule(profile_of(state)) is None
