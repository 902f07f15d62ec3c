"""compiler/trace_tensor.py: the layout the light tracer assumes for a tensor agrees with
torch's own strides and is_contiguous() (odd sizes, size 1, size 0, permuted views)."""

import itertools

import pytest
import torch

from kf.trace_tensor import Fallback, contiguous_strides, is_contiguous, need

SHAPES = [(), (1,), (7,), (0,), (3, 1, 5), (2, 0, 3), (257, 2), (1, 1), (5, 13, 3)]


@pytest.mark.parametrize("shape", SHAPES, ids=str)
def test_contiguous_strides_are_torchs(shape):
    assert contiguous_strides(shape) == torch.empty(shape).stride()


@pytest.mark.parametrize("shape", [s for s in SHAPES if len(s) >= 2], ids=str)
def test_is_contiguous_matches_torch_on_permuted_views(shape):
    base = torch.empty(shape)
    for perm in itertools.permutations(range(len(shape))):
        view = base.permute(perm)
        assert is_contiguous(tuple(view.shape), tuple(view.stride())) == view.is_contiguous(), perm
    step = base[..., ::2] if shape[-1] > 1 else base
    assert is_contiguous(tuple(step.shape), tuple(step.stride())) == step.is_contiguous()


def test_unknown_strides_are_not_contiguous():
    assert not is_contiguous((3, 4), None)


def test_need_raises_fallback_with_the_reason():
    need(True, "never raised")
    with pytest.raises(Fallback, match="dim 3 out of range"):
        need(False, "dim 3 out of range")
