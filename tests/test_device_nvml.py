"""advisor.probes.device.nvml in the four states, with a fake NVML module."""

from __future__ import annotations

from types import SimpleNamespace

from advisor.probes.device.nvml import Nvml


class FakeNVMLError(Exception):
    pass


def _fake(*, init_error: str | None = None, devices: list[dict] | None = None) -> SimpleNamespace:
    devices = devices or []

    def init() -> None:
        if init_error:
            raise FakeNVMLError(init_error)

    def handle(index: int) -> dict:
        if index >= len(devices):
            raise FakeNVMLError("Invalid Argument")
        return devices[index]

    def field(name: str):
        def get(h: dict):
            if name not in h:
                raise FakeNVMLError("Not Supported")
            return h[name]
        return get

    return SimpleNamespace(
        nvmlInit=init, nvmlDeviceGetCount=lambda: len(devices), nvmlDeviceGetHandleByIndex=handle,
        nvmlDeviceGetHandleByUUID=lambda u: next(d for d in devices if d.get("uuid") == u),
        nvmlDeviceGetName=field("name"), nvmlDeviceGetMemoryInfo=field("memory"),
        nvmlSystemGetDriverVersion=lambda: b"580.65.06",
    )


def test_package_missing() -> None:
    def missing():
        raise ImportError("No module named 'pynvml'")

    nv = Nvml(loader=missing)
    assert nv.device_name(0) is None and nv.device_count() is None and nv.driver_version() is None
    assert not nv.available() and "not installed" in (nv.error or "")


def test_no_driver() -> None:
    nv = Nvml(loader=lambda: _fake(init_error="Driver Not Loaded"))
    assert nv.device_name(0) is None and nv.memory_total(0) is None
    assert not nv.available() and "Driver Not Loaded" in (nv.error or "")


def test_no_devices() -> None:
    nv = Nvml(loader=lambda: _fake(devices=[]))
    assert nv.available() and nv.device_count() == 0
    assert nv.device_name(0) is None and nv.memory_total(0) is None


def test_field_not_supported_leaves_the_others() -> None:
    nv = Nvml(loader=lambda: _fake(devices=[{"name": b"NVIDIA H200", "uuid": "GPU-1"}]))
    assert nv.device_name(0) == "NVIDIA H200"
    assert nv.device_name(3, "GPU-1") == "NVIDIA H200"  # the UUID wins over the index
    assert nv.memory_total(0) is None
    assert nv.driver_version() == "580.65.06"


def test_initialises_once() -> None:
    calls = []

    def loader():
        calls.append(1)
        return _fake(devices=[{"name": "L4", "memory": SimpleNamespace(total=24 * 2**30)}])

    nv = Nvml(loader=loader)
    assert nv.memory_total(0) == 24 * 2**30 and nv.device_name(0) == "L4"
    assert len(calls) == 1


def test_real_pynvml_never_raises() -> None:
    nv = Nvml()
    name = nv.device_name(0)
    assert name is None or isinstance(name, str)
