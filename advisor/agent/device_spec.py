"""The device's ceilings, measured once per training process and sent as one ``device_spec`` event.

The agent calls ``send_device_spec`` at the first boundary (after step 0, before any deep probe
starts): the micro-benchmarks allocate, and must not show up in a tracked step. Only when the
compute probe runs (its roofline needs them); the host link's copy bandwidth rides along, for
the offload remedies.
"""

from __future__ import annotations

import torch

from advisor.agent.outbox import Outbox
from advisor.probes.device.hostlink import host_link
from advisor.probes.device.spec import detect_device_spec
from advisor.records.settings import AgentSettings


def send_device_spec(device: torch.device, settings: AgentSettings, outbox: Outbox) -> None:
    # Under an enforced budget on CUDA the job's allocator is capped: the micro-benchmarks'
    # 2.3 GiB would run it out (an H200 run's planned fit failed so), so only cached figures.
    cached_only = (device.type == "cuda" and settings.enforce_budget
                   and settings.memory_budget_bytes is not None)
    # A fit's CUDA device is the target it plans for, not a device here: its spec table entry.
    cached_only = cached_only or (device.type == "cuda" and settings.fit is not None)
    try:
        spec = detect_device_spec(device, peak_flops=settings.peak_flops,
                                  peak_bandwidth=settings.peak_bandwidth, cached_only=cached_only)
    except Exception as exc:  # noqa: BLE001 - no ceilings is a warning, not a failure
        outbox.event("warning", {"message": f"device ceilings unknown: {type(exc).__name__}: {exc}"}, step=None)
        return
    try:  # host-link copy bandwidth for the offload remedies (additive fields)
        link = host_link(device, override=settings.host_link_bandwidth, cached_only=cached_only)
    except Exception as exc:  # noqa: BLE001 - an unknown link leaves the offload cost assumed
        link = {"host_link_bandwidth": None, "host_link_source": f"unknown: {type(exc).__name__}: {exc}"}
    outbox.event("device_spec", {**spec.to_dict(), **link}, step=None)
    if cached_only and not spec.measured_peak_flops and settings.fit is None:
        outbox.event("warning", {
            "message": "device ceilings from the spec table: they are not measured under an enforced budget "
                       "(the micro-benchmarks take 2.3 GiB of device memory); an attach without "
                       "--enforce-budget measures and caches them"}, step=None)
