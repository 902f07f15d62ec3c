"""torch.combinations (compiler/aten/indexing.py): the r-element combinations of a 1-d
tensor's positions as a constant index of an index_select, against torch on cpu and
vulkan, with and without replacement, for r of 0 to past the length, at lengths 0, 1,
a prime and through a non-contiguous view."""

from __future__ import annotations

import pytest
import torch

import kf
from kf.runtime import vulkan

TARGETS = ["cpu", pytest.param("vulkan", marks=pytest.mark.skipif(not vulkan.is_available(),
                                                                   reason="no Vulkan device"))]


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("KF_CACHE_DIR", str(tmp_path))


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("n", [0, 1, 7, 13])
@pytest.mark.parametrize("r", [0, 1, 2, 3, 8])
@pytest.mark.parametrize("with_replacement", [False, True])
def test_combinations_match_torch(target, n, r, with_replacement):
    if with_replacement and n == 13 and r == 8:
        pytest.skip("125970 combinations: large for a unit test")
    x = torch.randn(2 * n, generator=torch.Generator().manual_seed(n))[::2]  # non-contiguous

    def fn(x):
        return torch.combinations(x, r, with_replacement)

    got = kf.jit(fn, target=target)(x)
    want = fn(x)
    assert got.dtype == want.dtype and got.shape == want.shape
    assert torch.equal(got, want)


@pytest.mark.parametrize("target", TARGETS)
def test_combinations_of_integers(target):
    x = torch.arange(6, dtype=torch.int64) * 3 - 7
    got = kf.jit(lambda x: torch.combinations(x, 3), target=target)(x)
    assert torch.equal(got, torch.combinations(x, 3))


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("shape, k, dim", [((), 1, 0), ((1,), 1, 0), ((7,), 3, 0), ((4, 13), 13, 1), ((4, 13), 2, 0),
                                           ((3, 257), 100, -1), ((2, 3, 5), 5, 2)], ids=str)
@pytest.mark.parametrize("keepdim", [False, True])
def test_kthvalue_matches_torch(target, shape, k, dim, keepdim):
    """torch.kthvalue's value and index (distinct values: which of equal values torch
    names is its own choice), through a non-contiguous view."""
    n = max(1, int(torch.tensor(shape).prod()))
    x = (torch.randperm(n, generator=torch.Generator().manual_seed(n)).float() - n / 2).reshape(shape)
    if len(shape) >= 2:
        x = x.transpose(0, 1).contiguous().transpose(0, 1)
    fn = lambda x: torch.kthvalue(x, k, dim, keepdim)  # noqa: E731
    got, want = kf.jit(fn, target=target)(x), fn(x)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and g.shape == w.shape
        assert torch.equal(g, w)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("xs, ms", [((3, 4), (4,)), ((1,), (1,)), ((7,), (7,)), ((257,), (257,)), ((0, 3), (3,)),
                                    ((2, 5), (2, 5)), ((5,), (3, 5))], ids=str)
def test_masked_scatter_matches_torch(target, xs, ms):
    """torch.masked_scatter: the source's elements in order where the (broadcast) mask is
    set, through a non-contiguous source."""
    gen = torch.Generator().manual_seed(sum(xs) + sum(ms))
    shape = torch.broadcast_shapes(xs, ms)
    x = torch.randn(xs, generator=gen)
    mask = torch.rand(ms, generator=gen) > 0.4
    source = torch.randn(tuple(shape)[::-1], generator=gen)
    source = source.permute(*reversed(range(source.dim())))
    fn = lambda x, m, s: torch.masked_scatter(x, m, s)  # noqa: E731
    got, want = kf.jit(fn, target=target)(x, mask, source), fn(x, mask, source)
    assert got.shape == want.shape and torch.equal(got, want)


def test_masked_scatter_with_a_smaller_source_is_refused():
    x, mask, source = torch.randn(6), torch.rand(6) > 0.5, torch.randn(3)
    with pytest.raises(kf.CompileError):
        kf.jit(lambda x, m, s: torch.masked_scatter(x, m, s), target="cpu")(x, mask, source)
