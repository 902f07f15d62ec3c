"""runtime/abi.py: DeviceLimits, the device facts the SPIR-V strategies tile for, as the
runtime reads them from a Vulkan device and as the compiler takes them (text)."""

from __future__ import annotations

import pytest

from kf.runtime.abi import DeviceLimits


@pytest.mark.parametrize("name", ["lavapipe", "nvidia-h200"])
def test_limits_of_recorded_devices_survive_their_text(name, recorded_device):
    limits = DeviceLimits.from_vulkan(recorded_device(name))
    assert DeviceLimits.parse(limits.spec()) == limits
    assert " " not in limits.spec() and "{" not in limits.spec()  # a pass option's value


def test_recorded_devices_read_as_vulkan_reports_them(recorded_device):
    lvp = DeviceLimits.from_vulkan(recorded_device("lavapipe"))
    nv = DeviceLimits.from_vulkan(recorded_device("nvidia-h200"))
    assert (lvp.shared_bytes, lvp.invocations, lvp.subgroup_size) == (32768, 1024, 8)
    assert (nv.shared_bytes, nv.invocations, nv.workgroup_size, nv.subgroup_size) == (49152, 1024, (1024, 1024, 64), 32)
    # lavapipe: supportedOperations 0xbf (no clustered), NVIDIA: every one kf names
    assert "shuffle" in lvp.subgroup_ops and "clustered" not in lvp.subgroup_ops
    assert {"arithmetic", "shuffle", "clustered", "quad"} <= set(nv.subgroup_ops)


def test_subgroup_operations_count_only_in_compute_shaders(recorded_device):
    props = recorded_device("lavapipe")
    props["subgroup"]["supportedStages"] = 0x10  # fragment only
    assert DeviceLimits.from_vulkan(props).subgroup_ops == ()
    props["subgroup"] = {}  # Vulkan 1.0: no subgroup properties
    assert DeviceLimits.from_vulkan(props).subgroup_size == 0


def test_defaults_are_the_portable_device():
    d = DeviceLimits()
    assert (d.shared_bytes, d.invocations, d.subgroup_size, d.subgroup_ops) == (16384, 256, 32, ())
    assert DeviceLimits.parse(d.spec()) == d and d.spec().endswith("ops=none")


@pytest.mark.parametrize("text,what", [
    ("shared=1,invocations=2", "must give exactly"),
    ("shared=1,invocations=2,size=3x3x3,subgroup=4,ops=none,extra=1", "must give exactly"),
    ("shared=lots,invocations=2,size=3x3x3,subgroup=4,ops=none", "integers"),
    ("shared=1,invocations=2,size=3x3,subgroup=4,ops=none", "three numbers"),
    ("shared=1,invocations=2,size=3x3x3,subgroup=4,ops=teleport", "teleport"),
    ("shared", "not key=value"),
])
def test_malformed_limits_say_what_is_wrong(text, what):
    with pytest.raises(ValueError, match=what):
        DeviceLimits.parse(text)
