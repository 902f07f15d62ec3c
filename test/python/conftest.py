"""Shared pytest setup: the examples directory is importable (seed_examples, moe); the
recorded Vulkan devices (test/python/devices/) are a fixture."""

import json
import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "examples"))


def _recorded_device(name: str) -> dict:
    with open(os.path.join(os.path.dirname(__file__), "devices", f"{name}.json")) as f:
        return json.load(f)


@pytest.fixture
def recorded_device():
    """``recorded_device(name)``: a Vulkan device's properties as recorded in
    test/python/devices/<name>.json (lavapipe, nvidia-h200), under Vulkan's names: what
    ``kf.runtime.abi.DeviceLimits.from_vulkan`` reads."""
    return _recorded_device
