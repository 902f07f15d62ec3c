"""What the seeded fuzz tests share: the targets they run on and their hypothesis settings
(``KF_FUZZ_EXAMPLES`` examples a test, derandomized unless ``KF_FUZZ_RANDOM=1``)."""

from __future__ import annotations

import os

import pytest
from hypothesis import HealthCheck, settings

from kf.runtime import vulkan

TARGETS = [pytest.param("cpu"),
           pytest.param("vulkan", marks=pytest.mark.skipif(not vulkan.is_available(),
                                                            reason="no Vulkan device (install mesa-vulkan-drivers)"))]
FUZZ = settings(max_examples=int(os.environ.get("KF_FUZZ_EXAMPLES", "8")),
                derandomize=os.environ.get("KF_FUZZ_RANDOM", "") in ("", "0"),
                deadline=None, database=None,
                # filter_too_much: examples with size-0 inputs that kf refuses are filtered
                # out (test_fuzz.check), many of them on Vulkan
                suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                       HealthCheck.function_scoped_fixture, HealthCheck.filter_too_much])
