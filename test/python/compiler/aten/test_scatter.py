"""The scatter family (compiler/aten/indexing.py, kf.scatter_reduce; index_copy and
index_fill in writes.py): scatter with a source or a value, scatter's reduce=,
scatter_reduce (sum, prod, amax, amin, mean; include_self), index_reduce, segment_reduce
(lengths, offsets, initial, batched) against torch on fresh random
inputs -- repeated indices, every dim, integer types, odd sizes, 0-d and empty tensors,
non-contiguous views -- on cpu and vulkan (deterministic: no atomics), out-of-range
indices an error, and PTX that ptxas assembles for sm_90a."""

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
REDUCTIONS = ["sum", "prod", "amax", "amin", "mean"]


def _check(fn, args, target, tol=1e-5):
    got = kf.jit(fn, target=target)(*args)
    want = fn(*args)
    assert got.dtype == want.dtype and got.shape == want.shape
    torch.testing.assert_close(got, want, rtol=tol, atol=tol, equal_nan=True)


def _values(shape, dtype, gen):
    if dtype.is_floating_point:
        return torch.randn(shape, generator=gen).to(dtype)
    return torch.randint(-9, 10, shape, generator=gen, dtype=dtype)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("include_self", [True, False])
@pytest.mark.parametrize("reduce", REDUCTIONS)
@pytest.mark.parametrize("dim", [0, 1, -1])
def test_scatter_reduce_matches_torch(dim, reduce, include_self, target):
    gen = torch.Generator().manual_seed(hash((dim, reduce, include_self)) % 1000)
    x = torch.randn(7, 5, generator=gen)
    size = x.shape[dim]
    index = torch.randint(0, size, (4, 3) if dim == 0 else (6, 4), generator=gen)  # repeats
    src = torch.randn(5, 5, generator=gen) if dim == 0 else torch.randn(7, 6, generator=gen)

    def fn(x, index, src):
        return x.scatter_reduce(dim, index, src, reduce, include_self=include_self)

    _check(fn, (x, index, src), target)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("dtype", [torch.int32, torch.int64], ids=str)
@pytest.mark.parametrize("reduce", REDUCTIONS)
def test_integer_scatter_reduce(reduce, dtype, target):
    """Integer means divide with floor, as torch's."""
    gen = torch.Generator().manual_seed(2)
    x, src = _values((1, 257), dtype, gen), _values((3, 257), dtype, gen)
    index = torch.randint(0, 1, (3, 257), generator=gen)

    def fn(x, index, src):
        return x.scatter_reduce(0, index, src, reduce, include_self=reduce != "mean")

    _check(fn, (x, index, src), target)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.int64, torch.bool], ids=str)
def test_scatter_source_and_value(dtype, target):
    gen = torch.Generator().manual_seed(3)
    x = _values((7, 5), dtype, gen) if dtype != torch.bool else torch.rand(7, 5, generator=gen) > 0.5
    src = _values((7, 5), dtype, gen) if dtype != torch.bool else torch.rand(7, 5, generator=gen) > 0.5
    # distinct indices along dim (torch leaves the winner of repeats unspecified)
    index = torch.stack([torch.randperm(7, generator=gen)[:4] for _ in range(5)], 1)
    _check(lambda x, i, s: x.scatter(0, i, s), (x, index, src), target)
    if dtype != torch.bool:
        _check(lambda x, i: torch.scatter(x, 0, i, 2), (x, index), target)


@pytest.mark.parametrize("target", TARGETS)
def test_scatter_repeated_indices_last_write_wins(target):
    """torch's CPU kernel writes in index order; kf's loop over the index does the same."""
    x, index, src = torch.zeros(5), torch.tensor([1, 3, 1, 1]), torch.tensor([1.0, 2.0, 3.0, 4.0])
    _check(lambda x, i, s: x.scatter(0, i, s), (x, index, src), target)


@pytest.mark.filterwarnings("ignore:The reduce argument of torch.scatter")
@pytest.mark.parametrize("target", TARGETS)
def test_scatter_deprecated_reduce_argument(target):
    gen = torch.Generator().manual_seed(4)
    x, src = torch.randn(5, 7, generator=gen), torch.randn(5, 7, generator=gen)
    index = torch.randint(0, 5, (3, 7), generator=gen)
    _check(lambda x, i, s: x.scatter(0, i, s, reduce="multiply"), (x, index, src), target)
    _check(lambda x, i: x.scatter(0, i, 1.5, reduce="add"), (x, index), target)


@pytest.mark.parametrize("target", TARGETS)
def test_scatter_of_0d_empty_and_views(target):
    gen = torch.Generator().manual_seed(5)
    _check(lambda x, i, s: x.scatter_reduce(0, i, s, "amax"), (torch.randn(()), torch.tensor(0), torch.randn(())),
           target)
    _check(lambda x, i, s: x.scatter(1, i, s), (torch.randn(3, 4), torch.zeros(3, 0, dtype=torch.long),
                                               torch.randn(3, 2)), target)
    x = torch.randn(5, 9, generator=gen)[:, ::2]  # a strided view
    src = torch.randn(9, 5, generator=gen).t()
    index = torch.randint(0, 5, (4, 5), generator=gen)
    _check(lambda x, i, s: x.scatter_reduce(0, i, s, "sum", include_self=False), (x, index, src), target)


@pytest.mark.parametrize("target", TARGETS)
def test_scatter_index_out_of_range_is_an_error(target):
    x, src = torch.randn(5, 7), torch.randn(5, 7)
    index = torch.randint(0, 5, (3, 7))
    index[1, 2] = 5
    with pytest.raises(kf.IndexOutOfRange, match="index 5 is out of range"):
        kf.jit(lambda x, i, s: x.scatter_reduce(0, i, s, "amin"), target=target)(x, index, src)


@pytest.mark.parametrize("target", TARGETS)
def test_index_copy_and_fill_of_a_0d_tensor(target):
    x = torch.randn(())
    _check(lambda x, i, s: x.index_copy(0, i, s), (x, torch.tensor([0]), torch.tensor(3.0)), target)
    _check(lambda x, i: x.index_fill(0, i, -2.0), (x, torch.tensor(0)), target)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("include_self", [True, False])
@pytest.mark.parametrize("reduce", ["prod", "mean", "amax", "amin"])
@pytest.mark.parametrize("shape,dim,n", [((7, 5), 0, 9), ((3, 257), 1, 4), ((2, 5, 3), -2, 1), ((1,), 0, 3)],
                         ids=str)
def test_index_reduce_matches_torch(shape, dim, n, reduce, include_self, target):
    gen = torch.Generator().manual_seed(sum(shape) + n + len(reduce))
    x = torch.randn(shape, generator=gen)
    src_shape = list(shape)
    src_shape[dim] = n
    index = torch.randint(0, shape[dim], (n,), generator=gen)  # repeats
    src = torch.randn(src_shape, generator=gen)
    _check(lambda x, i, s: x.index_reduce(dim, i, s, reduce, include_self=include_self), (x, index, src), target)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("dtype", [torch.int32, torch.int64, torch.float16], ids=str)
def test_index_reduce_of_other_types_nothing_and_views(dtype, target):
    gen = torch.Generator().manual_seed(6)
    x, src = _values((6, 9), dtype, gen)[:, ::2], _values((5, 4), dtype, gen).t()
    index = torch.tensor([5, 0, 5, 2], dtype=torch.int32)
    for reduce in ("prod", "mean", "amax"):
        _check(lambda x, i, s: x.index_reduce(0, i, s, reduce), (x, index, src), target,
               tol=2e-3 if dtype == torch.float16 else 1e-5)
    _check(lambda x, i, s: x.index_reduce(1, i, s, "amax"), (torch.randn(3, 4), torch.zeros(0, dtype=torch.long),
                                                           torch.randn(3, 0)), target)


@pytest.mark.parametrize("target", TARGETS)
def test_index_reduce_index_out_of_range_is_an_error(target):
    with pytest.raises(kf.IndexOutOfRange, match="index -1 is out of range"):
        kf.jit(lambda x, i, s: x.index_reduce(0, i, s, "amax"), target=target)(
            torch.randn(5, 3), torch.tensor([0, -1]), torch.randn(2, 3))


@pytest.mark.skipif(not _PTXAS, reason="needs ptxas")
def test_scatter_family_assembles_for_cuda():
    def fn(x, i, s):
        return (x.scatter(0, i, s), x.scatter_reduce(0, i, s, "mean", include_self=False),
                x.index_reduce(0, i[:, 0], s[:3], "prod"), torch.segment_reduce(x, "max", lengths=i[:2, 0]))

    x, s = torch.randn(7, 257), torch.randn(7, 257)
    i = torch.randint(0, 7, (3, 257))
    assert ".entry" in kf.inspect(kf.jit(fn, target="cuda"), x, i, s).stages["ptx"]


def _segments(lead, n, s, gen, cover=True):
    """Random lengths of s segments per leading index, summing to n (or less)."""
    cuts = torch.sort(torch.randint(0, n + 1, (*lead, s - 1), generator=gen), dim=-1).values
    ends = torch.cat([cuts, torch.full((*lead, 1), n if cover else max(n - 2, 0))], -1)
    starts = torch.cat([torch.zeros(*lead, 1, dtype=torch.long), cuts], -1)
    return (ends - starts).clamp(min=0)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("reduce", ["sum", "mean", "prod", "max", "min"])
@pytest.mark.parametrize("initial", [None, 1.5])
def test_segment_reduce_matches_torch(reduce, initial, target):
    gen = torch.Generator().manual_seed(len(reduce) + (initial is None))
    data = torch.randn(12, 3, generator=gen)
    lengths = torch.tensor([3, 0, 4, 1, 4])  # an empty segment
    kw = {} if initial is None else {"initial": initial}
    _check(lambda d, l: torch.segment_reduce(d, reduce, lengths=l, **kw), (data, lengths), target)
    offsets = torch.tensor([2, 2, 5, 11])  # elements before the first and past the last start are in none
    _check(lambda d, o: torch.segment_reduce(d, reduce, offsets=o, unsafe=True, **kw), (data, offsets), target)
    batched = torch.randn(2, 257, generator=gen)
    lens = _segments((2,), 257, 7, gen)
    _check(lambda d, l: torch.segment_reduce(d, reduce, lengths=l, axis=1, **kw), (batched, lens), target)
    _check(lambda d, l: torch.segment_reduce(d, reduce, lengths=l, axis=0, **kw),
           (torch.randn(5, 1, generator=gen).t().t(), torch.tensor([5])), target)
    _check(lambda d, l: torch.segment_reduce(d, reduce, lengths=l, **kw), (torch.randn(0, 2), torch.tensor([0, 0])),
           target)


@pytest.mark.parametrize("target", TARGETS)
def test_segment_reduce_bad_segments_are_errors(target):
    data = torch.randn(6)
    with pytest.raises(kf.IndexOutOfRange, match="index -1 is out of range"):
        kf.jit(lambda d, l: torch.segment_reduce(d, "sum", lengths=l, unsafe=True), target=target)(
            data, torch.tensor([2, -1, 3]))
    with pytest.raises(kf.IndexOutOfRange, match="index 9 is out of range"):  # past the data: torch reads on
        kf.jit(lambda d, o: torch.segment_reduce(d, "max", offsets=o, unsafe=True), target=target)(
            data, torch.tensor([0, 4, 9]))
