"""No advisor code may draw from a global random generator (issue 21, item 1).

A user's script seeds the global streams and expects the very same numbers under the advisor as
without it, on the first run on a machine too (when the device micro-benchmark runs).
"""

from __future__ import annotations

import random

import numpy as np
import torch

from advisor.probes.device import microbench
from advisor.probes.device.spec import detect_device_spec


def _global_states() -> tuple:
    return (torch.get_rng_state(), random.getstate(), np.random.get_state()[1].copy())


def _same(a: tuple, b: tuple) -> bool:
    return torch.equal(a[0], b[0]) and a[1] == b[1] and bool((a[2] == b[2]).all())


def test_cpu_micro_benchmark_leaves_the_global_streams_alone():
    torch.manual_seed(1234)
    before = _global_states()
    microbench.measure_cpu(n=64, copy_bytes=2**16)
    assert _same(before, _global_states())


def test_device_spec_on_a_fresh_cache_leaves_the_global_streams_alone(tmp_path, monkeypatch):
    monkeypatch.setenv("ADVISOR_HOME", str(tmp_path / "fresh"))
    original = microbench.measure_cpu
    def small(n: int = 64) -> microbench.Measured:
        return original(n=min(n, 64), copy_bytes=2**16)

    monkeypatch.setattr(microbench, "measure_cpu", small)
    torch.manual_seed(99)
    before = _global_states()
    spec = detect_device_spec("cpu")
    assert spec.measured_peak_flops  # it did measure (the cache was empty)
    assert _same(before, _global_states())
