"""Host-link bandwidth: measured once and cached, the override wins, CPU says it is a same-device copy."""

from __future__ import annotations

import json

import pytest

from advisor.probes.device import hostlink


def test_cpu_measures_a_same_device_copy_once(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("ADVISOR_HOME", str(tmp_path))
    calls = []
    real = hostlink.measure_cpu
    monkeypatch.setattr(hostlink, "measure_cpu", lambda: calls.append(1) or real(1 << 20))
    first = hostlink.host_link("cpu")
    assert first["host_link_bandwidth"] > 0 and "same-device" in first["host_link_source"]
    assert hostlink.host_link("cpu") == first and calls == [1]  # the second read the cache
    assert list(json.loads((tmp_path / "hostlink_cache.json").read_text()).values())[0]["host_to_device_bandwidth"] > 0


def test_override_and_bad_override() -> None:
    assert hostlink.host_link("cpu", override=2.5e10) == {"host_link_bandwidth": 2.5e10, "host_link_source": "override"}
    with pytest.raises(ValueError, match="positive"):
        hostlink.host_link("cpu", override=0.0)
