"""passes/linalg/build.py: how a reshape with several run-time sizes is grouped into a
collapse and an expand."""

from __future__ import annotations

import pytest

from kf.dialects.types import DYN
from kf.passes.linalg.build import _reshape_groups, paired_runtime_dims

D = DYN


@pytest.mark.parametrize("src, dst, want", [
    # repeat_interleave: unsqueeze of [b, hk, s, d], then the merge of the expanded heads
    ([2, 2, D, D], [2, 2, 1, D, D], ([[0], [1], [2], [3]], [[0], [1], [2, 3], [4]])),
    ([D, 2, 2, D, D], [D, 4, D, D], ([[0], [1, 2], [3], [4]], [[0], [1], [2], [3]])),
    ([D, 1, D, 1], [D, D], ([[0], [1, 2, 3]], [[0], [1]])),
    ([6, D, D], [2, 3, D, D], ([[0], [1], [2]], [[0, 1], [2], [3]])),
])
def test_paired_run_time_dims_group_one_each(src, dst, want):
    assert paired_runtime_dims(src, dst)
    assert _reshape_groups(src, dst) == want


@pytest.mark.parametrize("src, dst", [([D, 3, D], [D, D, 3]), ([D, D], [D, 2, D])])
def test_run_time_dims_that_share_elements_are_refused(src, dst):
    assert not paired_runtime_dims(src, dst)
    assert _reshape_groups(src, dst) is None
