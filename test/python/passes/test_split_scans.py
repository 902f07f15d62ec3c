"""kf-split-scans on the GPU path, run by Vulkan (lavapipe here) and on a CUDA GPU where
there is one, against torch in f64 on fresh random inputs: scans along more elements
than one thread walks (``MAX_LENGTH``) come out right in every kind (cumsum, cumprod,
cummax's values and indices, logcumsumexp), along any dim, with a tail beside the blocks
(primes), with the totals' scan split again, in integers (exact) and bf16 (f32 inside).
The IR the pass writes is in test/passes/kf-split-scans.mlir.

Before the pass, a scan was one thread's loop along the whole dim: lavapipe refused a
cumsum over 100,003 elements (it stops a shader invocation after 65535 loop
iterations), and on a GPU one thread walked it.
"""

from __future__ import annotations

import pytest
import torch

import kf
from kf.passes import split_scans
from kf.runtime import vulkan


def rel(out, ref) -> float:
    ref = ref.double()
    return ((out.double() - ref).abs().max() / ref.abs().max().clamp(min=1.0)).item()


@pytest.mark.parametrize("shape,dim", [((3, 100003), -1), ((5000, 3), 0), ((2, 2304, 2), 1), ((2049,), 0)])
def test_cumsum_along_long_dims(kf_run, shape, dim):
    """Blocks with a tail (100003, 5000, 2049 are not multiples of the block), without one
    (2304 = 9 blocks), along the last, first and a middle dim."""
    x = torch.randn(shape, generator=torch.Generator().manual_seed(len(shape)))
    assert rel(kf_run(lambda x: torch.cumsum(x, dim), x), torch.cumsum(x.double(), dim)) < 1e-5


def test_totals_scanned_in_blocks_again(tmp_path, monkeypatch):
    """A dim of more than MAX_LENGTH blocks: the totals' scan is split too (two levels).
    Integers, so the result is exact."""
    n = split_scans.BLOCK * (split_scans.MAX_LENGTH + 3) + 7
    if not vulkan.is_available():
        pytest.skip("no Vulkan device (install mesa-vulkan-drivers)")
    monkeypatch.setenv("KF_CACHE_DIR", str(tmp_path))
    x = torch.randint(-3, 4, (n,), generator=torch.Generator().manual_seed(1))
    out = kf.jit(lambda x: torch.cumsum(x, 0), target="vulkan")(x)
    assert torch.equal(out, torch.cumsum(x, 0))


def test_each_kind(kf_run):
    gen = torch.Generator().manual_seed(3)
    x = torch.randn(2, 9001, generator=gen)
    p = 1 + 1e-3 * torch.randn(2, 3001, generator=gen)
    values, indices = kf_run(lambda x: torch.cummax(x, -1), x.round(decimals=1))  # ties: the last wins
    want = torch.cummax(x.round(decimals=1), -1)
    assert torch.equal(values, want.values) and torch.equal(indices, want.indices)
    low = kf_run(lambda x: torch.cummin(x, -1), x)
    assert torch.equal(low[0], torch.cummin(x, -1).values) and torch.equal(low[1], torch.cummin(x, -1).indices)
    assert rel(kf_run(lambda p: torch.cumprod(p, -1), p), torch.cumprod(p.double(), -1)) < 1e-5
    assert rel(kf_run(lambda x: torch.logcumsumexp(x, -1), x), torch.logcumsumexp(x.double(), -1)) < 1e-5


def test_logcumsumexp_of_infinities(kf_run):
    """-inf everywhere stays -inf (no NaN from -inf - -inf where blocks combine); a +inf
    in an early block makes every later element +inf."""
    x = torch.full((2, 4099), float("-inf"))
    x[1, 300] = float("inf")
    want = torch.logcumsumexp(x, -1)
    assert torch.equal(kf_run(lambda x: torch.logcumsumexp(x, -1), x), want)


def test_integers_and_bf16(kf_run):
    """Integer sums are exact in any order; int64 running minima and maxima (whose bounds
    no fill holds: the first block starts from the row's first element); a bf16 scan is
    computed in f32 and rounded once."""
    gen = torch.Generator().manual_seed(4)
    i = torch.randint(-1000, 1000, (70001,), generator=gen, dtype=torch.int32)
    assert torch.equal(kf_run(lambda i: torch.cumsum(i, 0), i), torch.cumsum(i, 0))
    w = torch.randint(-1000, 1000, (2, 5003), generator=gen)
    for fn in (lambda w: torch.cummin(w, -1), lambda w: torch.cummax(w, -1)):
        got, want = kf_run(fn, w), fn(w)
        assert torch.equal(got[0], want.values) and torch.equal(got[1], want.indices)
    h = torch.randn(2, 5000, generator=gen).bfloat16()
    out = kf_run(lambda h: torch.cumsum(h, -1), h)
    assert out.dtype == torch.bfloat16
    assert rel(out, torch.cumsum(h.double(), -1)) < 8e-3


def test_short_scans_stay_one_loop(tmp_path, monkeypatch):
    """At MAX_LENGTH and below, the scan is left as it is: one kf.scan in the fused IR;
    above it, the blocks' and their totals'."""
    monkeypatch.setenv("KF_CACHE_DIR", str(tmp_path))

    def scans(n):
        x = torch.randn(3, n)
        return kf.inspect(kf.jit(lambda x: torch.cumsum(x, -1), target="vulkan"), x).stages["fused"].count('"kf.scan"')

    assert scans(split_scans.MAX_LENGTH) == 1
    assert scans(split_scans.MAX_LENGTH + 1) == 2
