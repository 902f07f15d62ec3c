"""index_add by sorted segments (passes/strategies/segments.py) through kf.jit, on vulkan
and, where a GPU is, cuda: an embedding's gradient and index_add along other dims
against torch in float64 on fresh random inputs (many repeated indices, odd sizes, a
transposed source, an index computed in the function), one program for run-time numbers
of tokens, a bad index an IndexError naming the user's line, and the plan: segments for a
long index, the walk for a short one."""

from __future__ import annotations

import pytest
import torch

import kf
from kf.passes.strategies import segments
from kf.runtime import vulkan

TARGETS = [pytest.param("vulkan", marks=pytest.mark.skipif(not vulkan.is_available(), reason="no Vulkan device")),
           pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU"))]
DEVICE = {"vulkan": "cpu", "cuda": "cuda"}


def _embedding_grad(idx, g, rows: int):
    return torch.zeros(rows, g.shape[-1], dtype=g.dtype, device=g.device).index_put((idx,), g, accumulate=True)


def _want(fn, *args):
    """fn in float64 (the kernel adds in f32 and rounds once), rounded to the args' type."""
    wide = [a.double() if a.is_floating_point() else a for a in args]
    return fn(*wide).to(next(a.dtype for a in args if a.is_floating_point()))


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("rows,cols,n", [(1, 33, 64), (7, 1, 257), (257, 33, 1000), (97, 16, 300)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_embedding_gradient(target, rows, cols, n, dtype):
    gen = torch.Generator().manual_seed(rows * n + cols)
    idx = torch.randint(0, rows, (n,), generator=gen)
    g = torch.randn(n, cols, generator=gen).to(dtype)
    dev = DEVICE[target]
    fn = kf.jit(target=target)(lambda i, s: _embedding_grad(i, s, rows))
    got = fn(idx.to(dev), g.to(dev)).cpu()
    torch.testing.assert_close(got, _want(lambda i, s: _embedding_grad(i, s, rows), idx, g),
                               rtol=1e-5 if dtype == torch.float32 else 8e-3, atol=1e-5)


@pytest.mark.parametrize("target", TARGETS)
def test_index_add_along_a_middle_dim_with_alpha_and_a_transposed_source(target):
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(5, 50, 3, generator=gen)
    src = torch.randn(3, 200, 5, generator=gen).transpose(0, 2)
    idx = torch.randint(0, 50, (200,), generator=gen)
    dev = DEVICE[target]
    fn = kf.jit(target=target)(lambda x, i, s: x.index_add(1, i, s, alpha=2.5))
    got = fn(x.to(dev), idx.to(dev), src.to(dev)).cpu()
    torch.testing.assert_close(got, _want(lambda x, s: x.index_add(1, idx, s, alpha=2.5), x, src))


@pytest.mark.parametrize("target", TARGETS)
def test_rows_of_an_earlier_call_are_not_taken_again(target):
    """The table's row entries are written only for the rows a call's index names; a
    row named by the call before (whose entry may still be in a reused buffer) and not
    by this one gets nothing."""
    dev = DEVICE[target]
    fn = kf.jit(target=target)(lambda i, s: _embedding_grad(i, s, 100))
    gen = torch.Generator().manual_seed(11)
    for low, high in ((0, 50), (50, 100), (0, 100), (99, 100)):
        idx = torch.randint(low, high, (300,), generator=gen)
        g = torch.randn(300, 8, generator=gen)
        got = fn(idx.to(dev), g.to(dev)).cpu()
        torch.testing.assert_close(got, _want(lambda i, s: _embedding_grad(i, s, 100), idx, g))


@pytest.mark.parametrize("target", TARGETS)
def test_negative_indices_are_normalized_before_the_sort(target):
    gen = torch.Generator().manual_seed(5)
    idx = torch.randint(-40, 40, (129,), generator=gen)
    g = torch.randn(129, 8, generator=gen)
    dev = DEVICE[target]
    got = kf.jit(target=target)(lambda i, s: _embedding_grad(i, s, 40))(idx.to(dev), g.to(dev)).cpu()
    torch.testing.assert_close(got, _want(lambda i, s: _embedding_grad(i, s, 40), idx, g))


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("bad", [40, 10 ** 6, -41])
def test_a_bad_index_is_an_index_error_naming_the_line(target, bad):
    idx = torch.arange(100) % 40
    idx[57] = bad
    dev = DEVICE[target]
    fn = kf.jit(target=target)(lambda i, s: _embedding_grad(i, s, 40))
    with pytest.raises(IndexError, match=r"out of range.*test_segments\.py"):
        fn(idx.to(dev), torch.randn(100, 8, device=dev))


def test_embedding_backward_through_autograd_matches_torch():
    if not vulkan.is_available():
        pytest.skip("no Vulkan device")
    gen = torch.Generator().manual_seed(7)
    w = torch.randn(97, 16, generator=gen, requires_grad=True)
    tokens = torch.randint(0, 97, (4, 65), generator=gen)
    kf.jit(target="vulkan")(torch.nn.functional.embedding)(tokens, w).square().sum().backward()
    got, w.grad = w.grad, None
    torch.nn.functional.embedding(tokens, w).square().sum().backward()
    torch.testing.assert_close(got, w.grad)


def _entries(n: int) -> list[str]:
    fn = kf.jit(target="cuda")(lambda i, s: _embedding_grad(i, s, 32000))
    ptx = kf.inspect(fn, torch.randint(0, 32000, (n,)), torch.randn(n, 64, dtype=torch.bfloat16)).stages["ptx"]
    return [line.split()[-1].rstrip("(") for line in ptx.splitlines() if ".entry" in line]


def test_a_long_index_is_sorted_by_a_prelude_and_a_short_one_walked():
    """The embedding gradient of 2048 tokens: a sorting kernel before the sum; of a few
    tokens: the generic walk alone."""
    long, short = _entries(2048), _entries(segments.MIN_INDICES - 1)
    assert any(e.endswith("_segments") for e in long), long
    assert not any(e.endswith("_segments") for e in short), short


def _spread_rows(s):
    """An embedding's gradient whose tokens are computed from the source's length, so
    the two share one run-time size."""
    i = (torch.arange(s.shape[0], device=s.device) * 7919) % 300
    return _embedding_grad(i, s, 300)


@pytest.mark.parametrize("target", TARGETS)
def test_one_program_sorts_indices_of_run_time_lengths(target):
    """dynamic=True: one program for 257, 1000, 1, 7 and 64 tokens, the table sized at
    the bound and filled up to each call's length."""
    dev = DEVICE[target]
    fn = kf.jit(target=target, dynamic=True)(_spread_rows)
    for n in (257, 1000, 1, 7, 64):
        g = torch.randn(n, 24, generator=torch.Generator().manual_seed(n))
        torch.testing.assert_close(fn(g.to(dev)).cpu(), _want(_spread_rows, g))
    assert fn.compiles == 1
    if target == "cuda":
        return
    gpu = kf.inspect(fn, torch.randn(100, 24)).stages["gpu"]
    assert "_generic_segments(" in gpu
