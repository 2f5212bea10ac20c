"""DeviceSpec: spec table, measured/spec choice, overrides, the CPU micro-benchmark cache."""

from __future__ import annotations

import json

import pytest
import torch

from advisor.probes.device import cpu_ceilings, microbench
from advisor.probes.device.hostlink import measure_cuda as measure_link
from advisor.probes.device.microbench import Measured
from advisor.probes.device.spec import DeviceSpec, combine, detect_device_spec
from advisor.probes.device.spec_table import lookup


@pytest.mark.parametrize(("name", "part"), [
    ("NVIDIA H200", "H200 SXM"), ("NVIDIA H100 80GB HBM3", "H100 SXM"), ("NVIDIA H100 PCIe", "H100 PCIe"),
    ("NVIDIA A100-SXM4-80GB", "A100 SXM 80GB"), ("NVIDIA A100-SXM4-40GB", "A100 40GB"),
    ("NVIDIA A100 80GB PCIe", "A100 80GB PCIe"), ("NVIDIA L4", "L4"), ("Tesla V100-SXM2-32GB", "V100"),
    ("NVIDIA A10", "A10"), ("NVIDIA L40S", None), ("NVIDIA A10G", None), ("Radeon", None),
])
def test_spec_table_lookup(name: str, part: str | None) -> None:
    found = lookup(name)
    assert (found.name if found else None) == part


def test_measured_wins_only_when_it_disagrees() -> None:
    part = lookup("NVIDIA H200")
    close = combine(type="cuda", name="NVIDIA H200", part=part,
                    measured=Measured(peak_flops={"bf16": 790e12, "fp32": 30e12}, memory_bandwidth=4.3e12))
    assert close.peak_flops["bf16"] == 989e12  # within 25%: the datasheet stays
    assert close.peak_flops["fp32"] == 30e12  # 55% below: the measurement wins
    assert close.memory_bandwidth == 4.8e12 and close.source == "measured"
    assert close.peak_flops["fp8"] == 1979e12 and close.measured_peak_flops["bf16"] == 790e12
    agree = combine(type="cuda", name="NVIDIA H200", part=part,
                    measured=Measured(peak_flops={"bf16": 900e12}, memory_bandwidth=4.5e12))
    assert agree.source == "spec"


def test_overrides() -> None:
    spec = combine(type="cuda", name="NVIDIA L4", part=lookup("NVIDIA L4"), measured=None,
                   peak_flops=100e12, peak_bandwidth=250e9)
    assert spec.source == "override" and set(spec.peak_flops.values()) == {100e12}
    assert spec.memory_bandwidth == 250e9 and spec.spec_memory_bandwidth == 300e9
    with pytest.raises(ValueError, match="peak-flops"):
        combine(type="cpu", name="cpu", part=None, measured=None, peak_flops=-1.0)


def test_cpu_spec_is_measured_per_dtype_and_cached(tmp_path, monkeypatch) -> None:
    spec = detect_device_spec("cpu")
    assert spec.type == "cpu" and spec.source == "measured"
    assert spec.peak_flops["fp32"] > 1e8 and spec.memory_bandwidth > 1e8
    assert {"fp64", "bf16", "fp16"} <= set(spec.peak_flops)  # float64 and low-precision work: own peaks
    cache = json.loads(microbench.cache_path().read_text())
    assert len(cache) == 1 and next(iter(cache.values()))["samples"] == 1

    # Once enough runs have measured, the cache is read (after a quick plausibility check).
    monkeypatch.setattr(cpu_ceilings, "SAMPLES", 1)
    monkeypatch.setattr(cpu_ceilings, "quick_fp32_flops", lambda: 0.0)

    def boom(**_):
        raise AssertionError("measured again instead of reading the cache")

    monkeypatch.setattr(microbench, "measure_cpu", boom)
    again = detect_device_spec("cpu", peak_bandwidth=1e9)
    assert again.peak_flops == spec.peak_flops and again.memory_bandwidth == 1e9
    assert DeviceSpec.from_dict(json.loads(json.dumps(again.to_dict()))) == again


def _measured(fp32: float, bandwidth: float) -> Measured:
    return Measured(peak_flops={"fp32": fp32, "fp64": fp32 / 2}, memory_bandwidth=bandwidth)


def test_a_figure_measured_under_load_does_not_stay_cached() -> None:
    """The first runs each measure and the best of each ceiling is kept; afterwards a quick
    check that beats the cached peak by far sends it back to the bench."""
    runs = iter([_measured(24e9, 5e9), _measured(48e9, 4e9), _measured(40e9, 6e9)])
    for _ in range(cpu_ceilings.SAMPLES):
        best = cpu_ceilings.cached_best("cpu|test", lambda: next(runs), check=lambda: 1e12)
    assert best.peak_flops == {"fp32": 48e9, "fp64": 24e9} and best.memory_bandwidth == 6e9

    def boom() -> Measured:
        raise AssertionError("measured again although the cache is plausible")

    plausible = cpu_ceilings.cached_best("cpu|test", boom, check=lambda: 50e9)  # within 25%
    assert plausible.peak_flops["fp32"] == 48e9
    faster = cpu_ceilings.cached_best("cpu|test", lambda: _measured(96e9, 6e9), check=lambda: 90e9)
    assert faster.peak_flops["fp32"] == 96e9
    stored = json.loads(microbench.cache_path().read_text())["cpu|test"]
    assert stored["peak_flops"]["fp32"] == 96e9 and stored["samples"] == cpu_ceilings.SAMPLES + 1


def test_cached_only_reads_the_cache_and_measures_nothing() -> None:
    """Under an enforced CUDA budget the agent asks for cached ceilings only: the benchmarks'
    2.3 GiB ran an H200 job's capped allocator out and the planned run failed after it."""
    assert microbench.cached_measure("cuda|test", None) is None
    microbench.cached_measure("cuda|test", lambda: _measured(5e14, 3e12))
    hit = microbench.cached_measure("cuda|test", None)
    assert hit is not None and hit.peak_flops["fp32"] == 5e14


def test_matmul_peak_touches_no_global_random_state() -> None:
    before = torch.get_rng_state()
    assert cpu_ceilings.matmul_flops(torch.float64, target_s=0.0, max_n=128) > 0
    assert torch.equal(before, torch.get_rng_state())


def test_datasheet_lists_fp64_only_where_sure() -> None:
    assert lookup("NVIDIA H100 80GB HBM3").peak_flops["fp64"] == 67e12
    assert lookup("NVIDIA A100-SXM4-80GB").peak_flops["fp64"] == 19.5e12
    assert "fp64" not in lookup("NVIDIA L4").peak_flops  # no guess: MFU of fp64 work stays unknown


def test_unknown_device_type_names_valid_options() -> None:
    with pytest.raises(ValueError, match="'cpu', 'cuda'"):
        detect_device_spec("mps", measure=False)


@pytest.mark.gpu
def test_measured_ceilings_match_the_spec_table() -> None:
    spec = detect_device_spec("cuda")
    if spec.part is None:
        pytest.skip(f"{spec.name} is not in the spec table")
    assert spec.measured_peak_flops["bf16"] == pytest.approx(spec.spec_peak_flops["bf16"], rel=0.25)
    assert spec.measured_memory_bandwidth == pytest.approx(spec.spec_memory_bandwidth, rel=0.25)
    assert spec.memory_capacity and spec.memory_capacity > 0


@pytest.mark.gpu
def test_measuring_the_ceilings_leaves_the_allocators_reserve_as_it_was() -> None:
    """The micro-benchmarks' buffers (GiBs) must not stay cached: the memory probe would read
    them as the job's own unused reserve (seen on an H100 before the fix: 3.1 GiB)."""
    keep = torch.empty(64 << 20, dtype=torch.uint8, device="cuda")  # the job's own tensor stays
    # The agent measures at a step boundary, after the job's own matmuls: cuBLAS's workspace (a
    # block of the caching allocator, kept per handle and stream: 64 MiB on an H200) is the
    # job's by then. Without these the workspace read as a leak of ours.
    for dtype in (torch.float32, torch.bfloat16, torch.float16):
        torch.mm(torch.ones(64, 64, device="cuda", dtype=dtype), torch.ones(64, 64, device="cuda", dtype=dtype))
    torch.cuda.synchronize()
    torch.cuda.empty_cache()
    reserved = torch.cuda.memory_reserved()
    microbench.measure_cuda(torch.device("cuda"), n=2048, copy_bytes=256 << 20)
    measure_link(torch.device("cuda"), nbytes=64 << 20)
    assert torch.cuda.memory_reserved() <= reserved
    assert keep.untyped_storage().nbytes() == 64 << 20
