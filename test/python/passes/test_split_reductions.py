"""kf-split-reductions on the GPU path, run by Vulkan (lavapipe here) and on a CUDA GPU
where there is one, against torch in f64 on fresh random inputs: reductions over more
elements than one thread may walk (``ROW`` for a generic thread, ``ROWWISE_ROW`` for a
row) come out right whatever their dims and sizes (primes: a tail beside the blocks),
and f32 sums of many elements keep their precision. The IR the pass writes is in
test/passes/kf-split-reductions.mlir.

lavapipe stops a shader invocation after 65535 loop iterations in all, so before the
pass split them these reductions dropped elements there (``ones(65537).sum()`` gave
65535, a mean of 2^25 ones 0.00195).
"""

from __future__ import annotations

import pytest
import torch


def rel(out, ref) -> float:
    ref = ref.double()
    return ((out.double() - ref).abs().max() / ref.abs().max().clamp(min=1e-30)).item()


def test_sums_and_means_of_many_ones_are_exact(kf_run):
    """Full reductions of 2^25 ones (every f32 partial sum exact), and of a prime count,
    which has no row length: its blocks leave a tail."""
    ones = torch.ones(2 ** 25)
    assert kf_run(lambda x: x.sum(), ones).item() == 2 ** 25
    assert kf_run(lambda x: x.mean(), ones).item() == 1.0
    assert kf_run(lambda x: (x.sum(), x.amax(), x.amin()), torch.ones(65537))[0].item() == 65537


def test_f32_sum_of_2_25_randn_against_f64(kf_run):
    """A sequential f32 sum of these 2^25 values is off by 5e-5 of the result."""
    x = torch.randn(2 ** 25, generator=torch.Generator().manual_seed(0))
    assert rel(kf_run(lambda x: x.sum(), x), x.double().sum()) < 1e-6


@pytest.mark.parametrize("n", [40000, 65537, 131074])
def test_var_and_std_of_all_elements(kf_run, n):
    """Two staged sums (the mean, then squared deviations), mean far from 0."""
    x = torch.randn(n, generator=torch.Generator().manual_seed(n)) * 2 + 3
    var, std = kf_run(lambda x: (x.var(), x.std(correction=0)), x)
    assert rel(var, x.double().var()) < 1e-5 and rel(std, x.double().std(correction=0)) < 1e-5


@pytest.mark.parametrize("shape,dims,keepdim", [((100003, 3), (0,), False), ((3, 100003, 2), (1,), True),
                                                ((300, 5, 401), (0, 2), False), ((70001, 3), (0, 1), True)])
@pytest.mark.parametrize("op", ["sum", "mean", "var", "amax", "amin"])
def test_reductions_over_leading_and_middle_dims(kf_run, shape, dims, keepdim, op):
    """Dims other than the trailing ones (a thread per output element walks them) and
    primes (100003, 70001, 401): blocks along the largest reduced dim, a tail beside."""
    x = torch.randn(shape, generator=torch.Generator().manual_seed(sum(shape))) + 1
    fn = {"sum": lambda x: x.sum(dims, keepdim=keepdim), "mean": lambda x: x.mean(dims, keepdim=keepdim),
          "var": lambda x: x.var(dims, keepdim=keepdim), "amax": lambda x: x.amax(dims, keepdim=keepdim),
          "amin": lambda x: x.amin(dims, keepdim=keepdim)}[op]
    out = kf_run(fn, x)
    assert out.shape == fn(x).shape
    assert rel(out, fn(x.double())) <= (0 if op in ("amax", "amin") else 1e-5)


def test_long_rows(kf_run):
    """Rows of more than 2^24 elements (blocks of ROWWISE_ROW, then the row of partials);
    a transposed view of them reduced over its leading dim."""
    x = torch.ones(1, 3 * 2 ** 23)
    assert kf_run(lambda x: x.sum(-1), x).item() == 3 * 2 ** 23
    y = torch.randn(2, 2 ** 20 + 7, generator=torch.Generator().manual_seed(1))
    out = kf_run(lambda y: (y.mean(-1, keepdim=True), y.t().sum(0)), y)
    assert rel(out[0], y.double().mean(-1, keepdim=True)) < 1e-5 and rel(out[1], y.double().sum(-1)) < 1e-5


def test_integer_bool_and_bf16_sums(kf_run):
    """Integers and booleans (generic threads: blocks of ROW) sum exactly into int64;
    bf16 sums into f32 partials and rounds once."""
    gen = torch.Generator().manual_seed(2)
    i = torch.randint(-100, 100, (3, 100003), generator=gen, dtype=torch.int32)
    b = torch.randn(100003, generator=gen)
    out_i, out_b = kf_run(lambda i, b: (i.sum(-1), (b > 0).sum()), i, b)
    assert torch.equal(out_i, i.sum(-1)) and out_b.item() == (b > 0).sum().item()
    h = torch.randn(70001, 3, generator=gen).bfloat16()
    out = kf_run(lambda h: (h.sum(0), h.mean()), h)
    assert out[0].dtype == torch.bfloat16
    assert rel(out[0], h.double().sum(0)) < 8e-3 and rel(out[1], h.double().mean()) < 8e-3


@pytest.mark.parametrize("shape,dim,keepdim", [((3, 100003), -1, False), ((70001, 2), 0, True), ((2 ** 17,), 0, False)])
def test_argmax_along_long_dims(kf_run, shape, dim, keepdim):
    """argmax along more than ROW elements: block argmaxes, then the argmax of the blocks'
    maxima; the first occurrence wins (ties planted in two blocks and in the tail), and
    the first NaN (in the tail of one row, in a block of another)."""
    x = torch.randn(shape, generator=torch.Generator().manual_seed(len(shape))).round(decimals=1)
    n = x.shape[dim]
    top = x.max() + 1
    for pos in (n - 3, 9000, 20000 % n):  # the tail's, then earlier blocks': the earliest wins
        x.narrow(dim, pos, 1).fill_(top)
    fn = lambda x: x.argmax(dim, keepdim=keepdim)  # noqa: E731
    assert torch.equal(kf_run(fn, x), fn(x))
    if x.dim() == 2 and dim == -1:
        x[1, n - 2] = float("nan")
        x[1, n - 1] = float("nan")
        x[2, 10000] = float("nan")
        assert torch.equal(kf_run(fn, x), fn(x))
