"""Indexing handlers (compiler/aten/indexing.py, writes.py) against torch on fresh random
inputs, on cpu and vulkan: the unsafe masked indexing ops (``_unsafe_masked_index``,
``_unsafe_masked_index_put_accumulate``; torch's decompositions of padding and upsampling
make them) -- indices out of range where the mask is false (never read), negative indices,
trailing dims not indexed, odd sizes, non-contiguous inputs; an unmasked index out of
range an error (torch clamps it); PTX that ptxas assembles for sm_90a --, torch.combinations
(a constant index of an index_select, with and without replacement, r of 0 to past the
length), kthvalue and masked_scatter."""

from __future__ import annotations

import os
import shutil

import pytest
import torch

import kf
from kf.runtime import vulkan

TARGETS = ["cpu", pytest.param("vulkan", marks=pytest.mark.skipif(not vulkan.is_available(),
                                                                   reason="no Vulkan device"))]
_PTXAS = shutil.which("ptxas") is not None or os.path.exists("/usr/local/cuda/bin/ptxas")
aten = torch.ops.aten





def _check(fn, args, target):
    got, want = kf.jit(fn, target=target)(*args), fn(*args)
    assert got.dtype == want.dtype and got.shape == want.shape
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def _masked_case(shape, rows, cols, gen):
    """x, a mask over (rows, cols), and row / column indices in range where the mask is
    true, anywhere in [-2 * size, 2 * size) where it is false."""
    x = torch.randn(shape, generator=gen)
    mask = torch.rand(rows, cols, generator=gen) > 0.5
    i = torch.randint(-shape[0], shape[0], (rows, 1), generator=gen)
    j = torch.randint(-shape[1], shape[1], (1, cols), generator=gen)
    wild_i = torch.randint(-2 * shape[0], 2 * shape[0], (rows, 1), generator=gen)
    wild_j = torch.randint(-2 * shape[1], 2 * shape[1], (1, cols), generator=gen)
    i = torch.where(mask.any(1, keepdim=True), i, wild_i)
    j = torch.where(mask.any(0, keepdim=True), j, wild_j)
    return x, mask, i, j


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("shape,rows,cols", [((5, 7), 4, 6), ((1, 1), 1, 1), ((7, 9, 3), 5, 257)], ids=str)
def test_unsafe_masked_index(shape, rows, cols, target):
    gen = torch.Generator().manual_seed(sum(shape) + rows + cols)
    x, mask, i, j = _masked_case(shape, rows, cols, gen)
    trailing = (1,) * (len(shape) - 2)  # dims not indexed: the mask broadcasts over them
    _check(lambda x, m, i, j: aten._unsafe_masked_index(x, m, [i, j], -1.5),
           (x, mask.reshape(rows, cols, *trailing), i, j), target)
    rows_read = mask.any(1).reshape(rows, 1, 1, *trailing)  # one index: the result is (rows, 1, *shape[1:])
    _check(lambda x, m, i: aten._unsafe_masked_index(x, m, [i], 0.0), (x, rows_read, i), target)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("shape,rows,cols", [((5, 7), 4, 6), ((1, 1), 1, 1), ((7, 9, 3), 5, 257)], ids=str)
def test_unsafe_masked_index_put_accumulate(shape, rows, cols, target):
    gen = torch.Generator().manual_seed(sum(shape) * rows + cols)
    x, mask, i, j = _masked_case(shape, rows, cols, gen)
    values = torch.randn(rows, cols, *shape[2:], generator=gen)
    mask = mask.reshape(rows, cols, *(1,) * (len(shape) - 2))
    _check(lambda x, m, i, j, v: aten._unsafe_masked_index_put_accumulate(x, m, [i, j], v),
           (x, mask, i, j, values), target)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("ishape", [(2, 9), (3, 1, 4), (1, 1)], ids=str)
def test_index_put_with_a_k_d_index(ishape, target):
    """``x[tokens] += dy`` with tokens of several dims (an embedding's gradient, as
    ``embedding_dense_backward`` decomposes: index_put with a [batch, seq] index), and
    ``=`` with values that broadcast; repeated and negative tokens included."""
    gen = torch.Generator().manual_seed(len(ishape))
    x = torch.randn(31, 6, generator=gen)
    index = torch.randint(-31, 31, ishape, generator=gen)
    v = torch.randn((*ishape, 6), generator=gen)
    _check(lambda x, i, v: torch.index_put(x, [i], v, accumulate=True), (x, index, v), target)
    unique = torch.randperm(31, generator=gen)[:index.numel()].reshape(ishape)
    _check(lambda x, i, v: torch.index_put(x, [i], v[..., :1, :]), (x, unique, v[..., :1, :].expand(*ishape, 6)), target)
    _check(lambda x, i: torch.index_put(x, [i], torch.tensor(2.0)), (x, unique), target)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("shape,n,dim", [((11, 6), 7, 0), ((5, 257), 4, 1), ((7,), 1, 0)], ids=str)
def test_index_put_with_negative_and_repeated_indices(shape, n, dim, target):
    """``x[index] = v`` and ``+=`` with a 1-D index along one dim, negative and repeated
    indices included (the last write wins, as in torch's CPU kernel)."""
    gen = torch.Generator().manual_seed(sum(shape) + n)
    x = torch.randn(shape, generator=gen)
    index = torch.randint(-shape[dim], shape[dim], (n,), generator=gen)
    index[-1] = -1
    v = torch.randn((*shape[:dim], n, *shape[dim + 1:]), generator=gen)
    at = (slice(None),) * dim

    def put(x, i, v):
        y = x.clone()
        y[at + (i,)] = v
        return y

    if dim == 0:
        for accumulate in (True, False):
            _check(lambda x, i, v: torch.index_put(x, [i], v, accumulate=accumulate), (x, index, v), target)
    _check(put, (x, index, v), target)


@pytest.mark.parametrize("target", TARGETS)
def test_unsafe_masked_ops_of_views(target):
    gen = torch.Generator().manual_seed(7)
    x, mask, i, j = _masked_case((9, 5), 3, 4, gen)
    x = torch.randn(5, 9, generator=gen).t()
    _check(lambda x, m, i, j: aten._unsafe_masked_index(x, m, [i, j], 2.0), (x, mask.t().t(), i, j), target)
    v = torch.randn(4, 3, generator=gen).t()
    _check(lambda x, m, i, j, v: aten._unsafe_masked_index_put_accumulate(x, m, [i, j], v), (x, mask, i, j, v),
           target)


@pytest.mark.parametrize("target", TARGETS)
def test_unmasked_index_out_of_range_is_an_error(target):
    x = torch.randn(5, 7)
    mask = torch.tensor([[True, False], [False, False]])
    i, j = torch.tensor([[1], [40]]), torch.tensor([[9, 2]])  # (1, 9) is read: 9 is outside 7 columns
    with pytest.raises(kf.IndexOutOfRange, match="index 9 is out of range"):
        kf.jit(lambda x, m, i, j: aten._unsafe_masked_index(x, m, [i, j], 0.0), target=target)(x, mask, i, j)
    with pytest.raises(kf.IndexOutOfRange, match="index 9 is out of range"):
        kf.jit(lambda x, m, i, j, v: aten._unsafe_masked_index_put_accumulate(x, m, [i, j], v), target=target)(
            x, mask, i, j, torch.randn(2, 2))


@pytest.mark.skipif(not _PTXAS, reason="needs ptxas")
def test_unsafe_masked_ops_assemble_for_cuda():
    x, mask, i, j = _masked_case((9, 5), 3, 4, torch.Generator().manual_seed(8))

    def fn(x, m, i, j):
        return (aten._unsafe_masked_index(x, m, [i, j], 0.0),
                aten._unsafe_masked_index_put_accumulate(x, m, [i, j], torch.ones(3, 4)))

    assert ".entry" in kf.inspect(kf.jit(fn, target="cuda"), x, mask, i, j).stages["ptx"]


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


# ---------------------------------------------------------------- cross_entropy: soft targets, smoothing

F = torch.nn.functional


def _probabilities(shape, gen, class_dim):
    return torch.softmax(torch.randn(shape, generator=gen), dim=class_dim)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("shape", [(7, 5), (5,), (3, 4, 2, 5), (0, 4), (1, 257)], ids=str)
@pytest.mark.parametrize("weighted", [False, True], ids=["", "weight"])
@pytest.mark.parametrize("smoothing", [0.0, 0.3])
def test_cross_entropy_with_class_probabilities(shape, reduction, weighted, smoothing, target):
    gen = torch.Generator().manual_seed(sum(shape) + len(reduction))
    class_dim = 0 if len(shape) == 1 else 1
    x = torch.randn(shape, generator=gen)
    t = _probabilities(shape, gen, class_dim)
    w = torch.rand(shape[class_dim], generator=gen) if weighted else None

    def fn(x, t):
        return F.cross_entropy(x, t, weight=w, reduction=reduction, label_smoothing=smoothing)

    got, want = kf.jit(fn, target=target)(x, t), fn(x, t)
    assert got.shape == want.shape
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5, equal_nan=True)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("reduction", ["mean", "sum", "none"])
@pytest.mark.parametrize("weighted", [False, True], ids=["", "weight"])
def test_cross_entropy_label_smoothing_with_class_indices(reduction, weighted, target):
    gen = torch.Generator().manual_seed(len(reduction) + weighted)
    x = torch.randn(6, 7, 3, generator=gen).transpose(0, 2)  # [3, 7, 6], strided
    t = torch.randint(0, 7, (3, 6), generator=gen)
    t[0, 1] = t[2, 5] = -100  # ignored
    w = torch.rand(7, generator=gen) if weighted else None

    def fn(x, t):
        return F.cross_entropy(x, t, weight=w, reduction=reduction, label_smoothing=0.25)

    _check(fn, (x, t), target)
    one = torch.randn(7, generator=gen), torch.tensor(3)  # one sample, no batch dim
    _check(fn, one, target)
