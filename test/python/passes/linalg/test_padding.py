"""Negative padding (passes/linalg/padding.py): F.pad / constant_pad_nd with amounts that
crop the input, mixed with ones that pad it, against torch on cpu and vulkan at odd sizes
and through non-contiguous views."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F

import kf
from kf.runtime import vulkan

TARGETS = ["cpu", pytest.param("vulkan", marks=pytest.mark.skipif(not vulkan.is_available(),
                                                                   reason="no Vulkan device"))]

CASES = [
    ((1, 3, 4, 4), (-1, 1, -2, 1)),  # crop and pad in each of the last two dims
    ((5, 7), (-2, -3)),  # crop only
    ((257,), (-256, 3)),  # keep one element, then pad
    ((3, 11), (2, -1, -1, 0)),
    ((2, 3, 13), (0, -12, 1, 1, -1, 0)),
]


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("KF_CACHE_DIR", str(tmp_path))


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("shape, pad", CASES, ids=lambda v: "x".join(map(str, v)))
@pytest.mark.parametrize("contiguous", [True, False])
def test_negative_padding_matches_torch(target, shape, pad, contiguous):
    gen = torch.Generator().manual_seed(len(shape))
    if contiguous:
        x = torch.randn(shape, generator=gen)
    elif len(shape) == 1:
        x = torch.randn(2 * shape[0], generator=gen)[::2]
    else:
        x = torch.randn(shape[::-1], generator=gen).permute(*reversed(range(len(shape))))
    assert x.is_contiguous() == contiguous
    fn = lambda x: F.pad(x, pad, value=1.5)  # noqa: E731
    got = kf.jit(fn, target=target)(x)
    want = fn(x)
    assert got.shape == want.shape and torch.equal(got, want)
