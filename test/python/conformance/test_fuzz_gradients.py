"""Seeded fuzz tests of training: the gradients kf's derived backward computes, against
torch's, on generated shapes, dtypes and memory layouts, on the ``cpu`` and ``vulkan``
targets. Each family a model trains through: elementwise chains, layer norm and RMSNorm
(with their weights), softmax and log_softmax along any dim, attention with and without
a mask, linear layers and the cross-entropy loss.

The inputs are those of test_fuzz.py (sizes 1, primes and 257; f32, f16 and bf16;
contiguous, transposed, stepped, expanded, offset and odd-strided views), each a leaf
that requires grad, and the gradient of the output a fresh random tensor. Every input's
gradient is checked against torch's in float64 on the same inputs, with test_fuzz's
bound (twice eager's own error plus a few units of the dtype's precision, of the value
and of the gradient's mean magnitude) widened by the problem's conditioning (how far the
float64 gradient moves for inputs moved by a unit of their precision). The same ``KF_FUZZ_EXAMPLES`` and
``KF_FUZZ_RANDOM`` settings apply.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from fuzzing import FUZZ, TARGETS
from test_fuzz import (DTYPES, LAYOUTS, NONZERO, SEEDS, attention, compiled, generator, layer_norm, log_softmax, make,
                       masked_attention, rms_norm, softmax, tensors)


@pytest.fixture(autouse=True)
def _cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("KF_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "kf-fuzz-cache"))


def check_grads(target: str, fn, args: tuple, consts: tuple = (), *, ulps: float = 32, floor: float = 1e-3,
                compile=compiled):
    """Each floating-point argument's gradient of fn(*args, *consts) under a random output
    gradient: kf's (fn compiled for target by ``compile``: kf.jit, or test_fuzz_backend's
    torch.compile) against float64's, as test_fuzz.check judges
    values, and beyond that within ``ulps`` times how far float64's gradient moves for
    inputs moved by a unit of their precision (the problem's own conditioning);
    ``floor``: the least magnitude a gradient is judged at (cross-entropy's p - 1
    cancels from values of order 1)."""
    leaves = [a.requires_grad_() if a.is_floating_point() else a for a in args]
    wrt = [a for a in leaves if a.is_floating_point()]
    out = compile(fn, target)(*leaves, *consts)
    eager_out = fn(*leaves, *consts)
    assert out.shape == eager_out.shape and out.dtype == eager_out.dtype
    g = torch.randn(out.shape, generator=generator(len(wrt) + out.numel()), dtype=torch.float64)
    got = torch.autograd.grad(out, wrt, g.to(out.dtype))
    eager = torch.autograd.grad(eager_out, wrt, g.to(out.dtype))
    def float64_grads(perturb: int | None):
        """float64's gradients, of the inputs as given or (``perturb``: a seed) each moved
        by up to one unit of its dtype's precision (how much the exact gradient moves for inputs that round
        differently: an ill-conditioned one, layer norm of two close values, moves a lot)."""
        doubles = []
        for j, a in enumerate(args):
            if not a.is_floating_point():
                doubles.append(a)
                continue
            d = a.detach().double()
            if perturb is not None:
                u = torch.rand(d.shape, generator=generator(perturb * 1000 + j), dtype=torch.float64) * 2 - 1
                d = d * (1 + torch.finfo(a.dtype).eps * u)
            doubles.append(d.requires_grad_())
        out64 = fn(*doubles, *consts)
        return torch.autograd.grad(out64, [d for d in doubles if d.is_floating_point()], g)

    refs = float64_grads(None)
    # the most each value moved over a few such moves
    moved = [torch.stack([(m - r).abs() for m in ms]).amax(0)
             for r, *ms in zip(refs, *(float64_grads(k) for k in range(4)))]
    # a gradient that is zero by cancellation (attention over one key: dQ) is judged at
    # the scale of the call's gradients
    overall = max((float(r.abs().mean()) for r in refs if r.numel()), default=0.0)
    for i, (o, e, r, m) in enumerate(zip(got, eager, refs, moved)):
        assert o.dtype == e.dtype and o.shape == e.shape, f"gradient {i}: {o.dtype} {list(o.shape)}"
        o64, e64, r64 = o.double(), e.double(), r
        assert torch.equal(o64.isnan(), e64.isnan()), f"gradient {i}: NaN where torch has none or the other way"
        ok = ~o64.isnan()
        eps = torch.finfo(o.dtype).eps
        typical = max(float(r64[ok].abs().mean()) if ok.any() else 0.0, overall)
        bound = 2 * (e64 - r64).abs() + ulps * (eps * (r64.abs() + typical + floor) + m)
        bad = ((o64 - r64).abs() > bound) & ok
        if bad.any():
            at = bad.nonzero()[0].tolist()
            raise AssertionError(
                f"gradient {i}: {int(bad.sum())} of {o.numel()} values off ({o.dtype}); first at {at}: "
                f"kf {o64[tuple(at)].item():.7g}, torch {e64[tuple(at)].item():.7g}, "
                f"float64 {r64[tuple(at)].item():.7g}")


def chain(x, y):
    return F.gelu(x * y + 1) * torch.sigmoid(y) - torch.tanh(x).square()


def linear_gelu(x, w, b):
    return F.gelu(F.linear(x, w, b))


def cross_entropy(logits, target):
    return F.cross_entropy(logits.float(), target, reduction="none")


@pytest.mark.parametrize("target", TARGETS)
@FUZZ
@given(spec=tensors(rank_max=3, sizes=NONZERO), y_layout=LAYOUTS, seed=SEEDS)
def test_elementwise_chain(target, spec, y_layout, seed):
    shape, dtype, layout = spec
    g = generator(seed)
    check_grads(target, chain, (make(shape, dtype, layout, g), make(shape, dtype, y_layout, g)))


@pytest.mark.parametrize("target", TARGETS)
@FUZZ
@given(spec=tensors(rank_min=2, rank_max=3, sizes=NONZERO), seed=SEEDS, which=st.sampled_from(["layer", "rms"]))
def test_norms(target, spec, seed, which):
    shape, dtype, layout = spec
    g = generator(seed)
    x, w = make(shape, dtype, layout, g), make(shape[-1:], dtype, "contiguous", g)
    if which == "layer":
        check_grads(target, layer_norm, (x, w, make(shape[-1:], dtype, "stepped", g)), ulps=64)
    else:
        check_grads(target, rms_norm, (x, w), ulps=64)


@pytest.mark.parametrize("target", TARGETS)
@FUZZ
@given(spec=tensors(rank_max=3, sizes=NONZERO), seed=SEEDS, which=st.sampled_from(["softmax", "log_softmax"]),
       last=st.booleans())
def test_softmax(target, spec, seed, which, last):
    shape, dtype, layout = spec
    x = make(shape, dtype, layout, generator(seed))
    check_grads(target, softmax if which == "softmax" else log_softmax, (x,), (-1 if last else 0,))


@pytest.mark.parametrize("target", TARGETS)
@settings(FUZZ, max_examples=max(1, FUZZ.max_examples // 2))  # a forward and a backward to compile each
@given(heads=st.sampled_from([1, 3]), seq=NONZERO, kv=st.sampled_from([1, 5, 64, 100]),
       dim=st.sampled_from([8, 16, 31, 64]), dtype=DTYPES, masked=st.booleans(), layout=LAYOUTS, seed=SEEDS)
def test_attention(target, heads, seq, kv, dim, dtype, masked, layout, seed):
    g = generator(seed)
    assume(heads * max(seq, kv) * dim <= 40_000)
    q = make((1, heads, seq, dim), dtype, layout, g)
    k, v = make((1, heads, kv, dim), dtype, "contiguous", g), make((1, heads, kv, dim), dtype, layout, g)
    if masked:
        mask = (torch.rand(seq, kv, generator=g) > 0.3).to(dtype)
        mask[:, 0] = 1  # every row keeps a key
        check_grads(target, masked_attention, (q, k, v), (mask,), ulps=64)
    else:
        check_grads(target, attention, (q, k, v), ulps=64)


@pytest.mark.parametrize("target", TARGETS)
@FUZZ
@given(m=NONZERO, k=NONZERO, n=NONZERO, dtype=DTYPES, layout=LAYOUTS, seed=SEEDS)
def test_linear(target, m, k, n, dtype, layout, seed):
    g = generator(seed)
    assume(m * k <= 40_000 and k * n <= 40_000 and m * n <= 40_000)
    x, w, b = make((m, k), dtype, layout, g), make((n, k), dtype, "transposed", g), make((n,), dtype, layout, g)
    check_grads(target, linear_gelu, (x, w, b), ulps=64)


@pytest.mark.parametrize("target", TARGETS)
@FUZZ
@given(rows=NONZERO, classes=st.sampled_from([2, 5, 31, 257]), dtype=DTYPES, layout=LAYOUTS, seed=SEEDS)
def test_cross_entropy(target, rows, classes, dtype, layout, seed):
    g = generator(seed)
    logits = make((rows, classes), dtype, layout, g)
    labels = torch.randint(0, classes, (rows,), generator=g)
    check_grads(target, cross_entropy, (logits, labels), floor=1.0)
