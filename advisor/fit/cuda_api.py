"""``torch.cuda`` answering for the target GPU, for the length of a fit.

The script asks whether CUDA is there, how many devices, their properties, their memory, their
random state, streams and events; each answer is the target's (``TargetDevice``) or does nothing
that a fake tensor would notice. The memory counters answer with the tracked bytes of the device
(``tracked``: what the memory probe's tracker counts when it runs, else 0). What does not exist
here, and is not faked: kernels (a ``torch.cuda.graph`` capture, a Triton kernel), NCCL, NVML.
"""

from __future__ import annotations

import contextlib
from types import SimpleNamespace
from typing import Any, Callable, Iterator

import torch

from advisor.fit.patches import Patches
from advisor.records.fit import TargetDevice


class FakeStream:
    """A stream that orders nothing: fake tensors have no work to order."""

    def __init__(self, device: Any = None, priority: int = 0, **_: Any) -> None:
        self.device = torch.device("cuda", 0) if device is None else torch.device(device) \
            if not isinstance(device, int) else torch.device("cuda", device)
        self.priority = priority
        self.cuda_stream = 0

    def wait_stream(self, stream: Any) -> None:
        pass

    def wait_event(self, event: Any) -> None:
        pass

    def record_event(self, event: Any = None) -> "FakeEvent":
        event = event if event is not None else FakeEvent()
        event.record(self)
        return event

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        pass

    def is_capturing(self) -> bool:
        return False

    def __enter__(self) -> "FakeStream":
        return self

    def __exit__(self, *exc: Any) -> None:
        return None

    def __eq__(self, other: object) -> bool:
        return isinstance(other, FakeStream)

    def __hash__(self) -> int:
        return 0


class FakeEvent:
    """An event that is always complete; no time passes between two of them on a fake device."""

    def __init__(self, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False) -> None:
        self.enable_timing = enable_timing

    def record(self, stream: Any = None) -> None:
        pass

    def wait(self, stream: Any = None) -> None:
        pass

    def query(self) -> bool:
        return True

    def synchronize(self) -> None:
        pass

    def elapsed_time(self, end: Any) -> float:
        return 0.0


_STREAM = FakeStream()


def install_cuda(patches: Patches, target: TargetDevice, *, device_count: int,
                 tracked: Callable[[], int] = lambda: 0) -> None:
    """Patch ``torch.cuda`` (and ``torch.accelerator``) so that the script sees ``device_count``
    devices of ``target``'s kind. Restored by ``patches``."""
    cuda = torch.cuda
    current = [0]
    peak = [0]

    def properties(device: Any = None) -> Any:
        return SimpleNamespace(
            name=target.name, total_memory=target.total_memory, major=target.capability[0],
            minor=target.capability[1], multi_processor_count=target.multiprocessors, is_integrated=False,
            is_multi_gpu_board=False, uuid=None, L2_cache_size=50 * 2**20, warp_size=32,
            max_threads_per_multi_processor=2048, regs_per_multiprocessor=65536,
            shared_memory_per_block=49152, shared_memory_per_multiprocessor=233472,
            shared_memory_per_block_optin=232448, gcnArchName="NONE")

    def allocated(device: Any = None) -> int:
        now = tracked()
        peak[0] = max(peak[0], now)
        return now

    def max_allocated(device: Any = None) -> int:
        return max(peak[0], allocated())

    def reset_peak(device: Any = None) -> None:
        peak[0] = tracked()

    def memory_stats(device: Any = None) -> dict[str, Any]:
        now = allocated()
        return {"allocated_bytes.all.current": now, "allocated_bytes.all.peak": max_allocated(),
                "reserved_bytes.all.current": now, "reserved_bytes.all.peak": max_allocated(),
                "num_alloc_retries": 0, "num_ooms": 0}

    def set_device(device: Any) -> None:
        index = device if isinstance(device, int) else torch.device(device).index
        current[0] = index or 0

    @contextlib.contextmanager
    def device_context(device: Any) -> Iterator[None]:
        yield

    def rng_state(device: Any = "cuda") -> torch.Tensor:
        with torch._subclasses.fake_tensor.unset_fake_temporarily():
            return torch.zeros(16, dtype=torch.uint8)

    def nothing(*args: Any, **kwargs: Any) -> None:
        return None

    answers: dict[str, Any] = {
        "is_available": lambda: True,
        "is_initialized": lambda: True,
        "init": nothing,
        "_lazy_init": nothing,
        "device_count": lambda: device_count,
        "current_device": lambda: current[0],
        "set_device": set_device,
        "device": device_context,
        "device_of": device_context,
        "get_device_name": lambda device=None: target.name,
        "get_device_capability": lambda device=None: target.capability,
        "get_device_properties": properties,
        "get_arch_list": lambda: [f"sm_{target.capability[0]}{target.capability[1]}"],
        "is_bf16_supported": lambda including_emulation=True: target.capability >= (8, 0),
        "synchronize": nothing,
        "empty_cache": nothing,
        "ipc_collect": nothing,
        "mem_get_info": lambda device=None: (target.total_memory - allocated(), target.total_memory),
        "memory_allocated": allocated,
        "max_memory_allocated": max_allocated,
        "memory_reserved": allocated,
        "max_memory_reserved": max_allocated,
        "reset_peak_memory_stats": reset_peak,
        "reset_max_memory_allocated": reset_peak,
        "reset_accumulated_memory_stats": nothing,
        "memory_stats": memory_stats,
        "memory_summary": lambda *a, **k: "advisor fit: no allocator on a fake device",
        "set_per_process_memory_fraction": nothing,
        "get_rng_state": rng_state,
        "get_rng_state_all": lambda: [rng_state() for _ in range(device_count)],
        "set_rng_state": nothing,
        "set_rng_state_all": nothing,
        "manual_seed": nothing,
        "manual_seed_all": nothing,
        "seed": nothing,
        "seed_all": nothing,
        "initial_seed": lambda: 0,
        "Stream": FakeStream,
        "Event": FakeEvent,
        "current_stream": lambda device=None: _STREAM,
        "default_stream": lambda device=None: _STREAM,
        "stream": lambda stream=None: contextlib.nullcontext(),
        "set_stream": nothing,
        "is_current_stream_capturing": lambda: False,
    }
    for name, value in answers.items():
        patches.set(cuda, name, value)
    for name in ("range_push", "range_pop", "mark"):
        patches.set(cuda.nvtx, name, nothing)
    patches.set(cuda.nvtx, "range", lambda *a, **k: contextlib.nullcontext())
    # Python's view of the accelerator (FSDP2's default mesh asks it); C++ keeps the CPU's.
    patches.set(torch._C, "_get_accelerator", lambda *args: torch.device("cuda"))
    accelerator = getattr(torch, "accelerator", None)
    if accelerator is not None:
        for name, value in {
            "is_available": lambda: True,
            "current_accelerator": lambda check_available=False: torch.device("cuda"),
            "device_count": lambda: device_count,
            "current_device_index": lambda: current[0],
            "set_device_index": set_device,
            "synchronize": nothing,
            "current_stream": lambda device=None: _STREAM,
        }.items():
            if hasattr(accelerator, name):
                patches.set(accelerator, name, value)
