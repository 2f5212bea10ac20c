"""What ``advisor fit`` plans for: the target device and the job's shape, as the controller and the
fitting process both read them (``AgentSettings.fit``).

Torch-free. ``TARGETS`` names the devices a fit can impersonate: the name PyTorch would report
(the device spec table matches its ceilings by it), its compute capability and multiprocessor
count, the bytes ``torch.cuda.get_device_properties().total_memory`` reports on it, and its
nominal link bandwidths for the collectives' time. Figures are datasheet or measured values, each
said where it comes from; none of them is measured by a fit.
"""

from __future__ import annotations

from dataclasses import dataclass

GB = 10**9
MIB = 2**20
# The optimizer steps a fit runs: step 0 builds the optimizer's state, step 1 is the steady step
# the memory probe tracks, step 2 the one the compute probe counts (advisor.records.schedule).
FIT_STEPS = 3


@dataclass(frozen=True, kw_only=True)
class TargetDevice:
    """One device a fit can plan for."""

    key: str  # what ``--target`` takes
    name: str  # ``torch.cuda.get_device_name()`` on the part
    capability: tuple[int, int]
    multiprocessors: int
    total_memory: int  # bytes, as ``get_device_properties().total_memory`` reports them
    # Nominal bandwidth per GPU and direction, bytes/s: between the GPUs of a node (NVLink or
    # PCIe) and between nodes (one network port per GPU).
    link_bandwidth: float
    network_bandwidth: float
    host_link_bandwidth: float  # nominal PCIe x16 per direction: the offload plans' copies


# total_memory: measured where this project recorded the part (an H100 80GB HBM3 session under
# tests/data: 85,017,493,504 bytes of 80 GiB), else the datasheet's GiB scaled by that H100's share.
_H100_BYTES = 85_017_493_504
_REPORTED_SHARE = _H100_BYTES / (80 * 2**30)


def _reported(gib: float) -> int:
    return int(gib * 2**30 * _REPORTED_SHARE)


TARGETS: dict[str, TargetDevice] = {t.key: t for t in (
    TargetDevice(key="h100", name="NVIDIA H100 80GB HBM3", capability=(9, 0), multiprocessors=132,
                 total_memory=_H100_BYTES, link_bandwidth=450 * GB, network_bandwidth=50 * GB,
                 host_link_bandwidth=64 * GB),
    TargetDevice(key="h100-pcie", name="NVIDIA H100 PCIe", capability=(9, 0), multiprocessors=114,
                 total_memory=_H100_BYTES, link_bandwidth=64 * GB, network_bandwidth=50 * GB,
                 host_link_bandwidth=64 * GB),
    TargetDevice(key="h200", name="NVIDIA H200", capability=(9, 0), multiprocessors=132,
                 total_memory=_reported(141), link_bandwidth=450 * GB, network_bandwidth=50 * GB,
                 host_link_bandwidth=64 * GB),
    TargetDevice(key="a100-80gb", name="NVIDIA A100-SXM4-80GB", capability=(8, 0), multiprocessors=108,
                 total_memory=_reported(80), link_bandwidth=300 * GB, network_bandwidth=25 * GB,
                 host_link_bandwidth=32 * GB),
    TargetDevice(key="a100-40gb", name="NVIDIA A100-SXM4-40GB", capability=(8, 0), multiprocessors=108,
                 total_memory=_reported(40), link_bandwidth=300 * GB, network_bandwidth=25 * GB,
                 host_link_bandwidth=32 * GB),
    TargetDevice(key="a10", name="NVIDIA A10", capability=(8, 6), multiprocessors=72,
                 total_memory=_reported(24), link_bandwidth=32 * GB, network_bandwidth=12.5 * GB,
                 host_link_bandwidth=32 * GB),
    TargetDevice(key="l4", name="NVIDIA L4", capability=(8, 9), multiprocessors=58,
                 total_memory=_reported(24), link_bandwidth=32 * GB, network_bandwidth=12.5 * GB,
                 host_link_bandwidth=32 * GB),
    TargetDevice(key="v100", name="Tesla V100-SXM2-32GB", capability=(7, 0), multiprocessors=80,
                 total_memory=_reported(32), link_bandwidth=150 * GB, network_bandwidth=12.5 * GB,
                 host_link_bandwidth=16 * GB),
    TargetDevice(key="t4", name="Tesla T4", capability=(7, 5), multiprocessors=40,
                 total_memory=_reported(16), link_bandwidth=16 * GB, network_bandwidth=12.5 * GB,
                 host_link_bandwidth=16 * GB),
)}
CPU = "cpu"


def target_names() -> list[str]:
    return [CPU, *TARGETS]


@dataclass(frozen=True, kw_only=True)
class FitSettings:
    """A fit's job: its target (``--target``), ranks per node and nodes; the fitting process is
    rank 0 of that world, alone, on fake tensors."""

    target: str = CPU
    nproc_per_node: int = 1
    nnodes: int = 1

    def __post_init__(self) -> None:
        if self.target not in target_names():
            raise ValueError(f"unknown target {self.target!r}; valid: {', '.join(target_names())}")
        if self.nproc_per_node < 1 or self.nnodes < 1:
            raise ValueError("nproc_per_node and nnodes must be at least 1")

    @property
    def world_size(self) -> int:
        return self.nproc_per_node * self.nnodes

    def environment(self) -> dict[str, str]:
        """What torchrun would set for rank 0 of the fit's world (none for a job of one process:
        the script runs as under python)."""
        if self.world_size == 1:
            return {}
        return {"RANK": "0", "LOCAL_RANK": "0", "GROUP_RANK": "0", "NODE_RANK": "0",
                "WORLD_SIZE": str(self.world_size), "LOCAL_WORLD_SIZE": str(self.nproc_per_node),
                "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "29500", "TORCHELASTIC_RUN_ID": "advisor-fit"}

    @property
    def device(self) -> TargetDevice | None:
        """The GPU planned for (None for the CPU)."""
        return TARGETS.get(self.target)
