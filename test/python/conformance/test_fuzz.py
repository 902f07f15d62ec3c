"""Seeded fuzz tests: kf against torch on generated shapes, dtypes and memory layouts,
one test per strategy family (elementwise, reductions, row-wise, matmul, attention,
transpose and views, gather, index_add and index) and for the rules every family follows (integer
division and remainder signs, bool/int/float promotion, broadcasting of size-1 dims,
reductions over a million elements), each on the ``cpu`` and ``vulkan`` targets.

The shapes take sizes 0, 1, primes and 257 (tiles never divide them evenly); the dtypes
are f32, f16 and bf16 (and bool, int32, int64 where the rule is about them); inputs
arrive contiguous, transposed, sliced with a step, expanded (stride 0), at a storage
offset (a "misaligned" start) or with odd strides at an offset. Each result is checked against
torch in float64 on the same inputs: kf may differ from that reference by at most twice
eager's own error plus a tolerance of a few units of the dtype's precision (of the value
and of the tensor's mean magnitude; for sums and products also of the same computation on
the inputs' magnitudes), so a kernel that
rounds once passes and a wrong index, a lost tail or a missed stride does not.

Examples are derandomized (the same ones on every run, as CI needs). More of them, or
fresh ones:

    KF_FUZZ_EXAMPLES=300 pytest test/python/conformance/test_fuzz.py          # more, still seeded
    KF_FUZZ_EXAMPLES=300 KF_FUZZ_RANDOM=1 pytest test/python/conformance/test_fuzz.py   # new ones each run

A failure prints the falsifying example (hypothesis shrinks it to a small one) and, with
``KF_FUZZ_RANDOM=1``, the ``@reproduce_failure`` line that replays it.
"""

from __future__ import annotations

import functools
import math

import pytest
import torch
import torch.nn.functional as F
from hypothesis import assume, given
from hypothesis import strategies as st

import kf
from fuzzing import FUZZ, TARGETS

SIZES = st.sampled_from([0, 1, 2, 3, 5, 7, 13, 31, 257])
NONZERO = st.sampled_from([1, 2, 3, 5, 7, 13, 31, 257])
DTYPES = st.sampled_from([torch.float32, torch.float16, torch.bfloat16])
LAYOUTS = st.sampled_from(["contiguous", "transposed", "stepped", "expanded", "offset", "odd_stepped"])
#: relative tolerance in units of the dtype's epsilon
ULPS = 8


@pytest.fixture(autouse=True)
def _cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("KF_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "kf-fuzz-cache"))


@functools.lru_cache(maxsize=None)
def compiled(fn, target: str):
    """fn as a kf function for target (one per pair, so its dispatch table is kept)."""
    return kf.jit(target=target)(fn)


# ----------------------------------------------------------------------------- inputs


def make(shape, dtype, layout: str, gen: torch.Generator, low: float = -3.0, high: float = 3.0,
         positive: bool = False) -> torch.Tensor:
    """A tensor of the given shape and dtype in the given memory layout:
    contiguous; transposed (the last two dims swapped in memory); stepped (every other
    element of a tensor twice as long in dim 0); expanded (dim 0 of size 1 broadcast,
    stride 0); offset (starting 3 elements into its storage); odd_stepped (every third
    element of the last dim, from the second, and every fifth row of dim 0 of a larger
    tensor: odd strides at a storage offset). Integer dtypes take integers in [low, high)."""
    shape = tuple(shape)

    def rand(s):
        if not dtype.is_floating_point:
            return torch.randint(int(low), int(high), s, generator=gen).to(dtype)
        t = torch.rand(s, generator=gen, dtype=torch.float64) * (high - low) + low
        return (t.abs() + 0.1 if positive else t).to(dtype)

    if layout == "odd_stepped" and len(shape) >= 1:
        big = rand((5 * shape[0],) + shape[1:-1] + (3 * shape[-1] + 1,) if len(shape) >= 2 else (3 * shape[0] + 1,))
        return big[1::3] if len(shape) == 1 else big[::5][..., 1::3]

    if layout == "transposed" and len(shape) >= 2:
        return rand(shape[:-2] + (shape[-1], shape[-2])).transpose(-1, -2)
    if layout == "stepped" and len(shape) >= 1:
        return rand((2 * shape[0],) + shape[1:])[::2]
    if layout == "expanded" and len(shape) >= 1:
        return rand((1,) + shape[1:]).expand(shape)
    if layout == "offset":
        n = math.prod(shape)
        return rand((n + 3,))[3:].view(shape)
    return rand(shape)


@st.composite
def tensors(draw, rank_min=1, rank_max=3, sizes=SIZES, dtype=None):
    """(shape, dtype, layout, generator) for one input."""
    rank = draw(st.integers(rank_min, rank_max))
    shape = tuple(draw(sizes) for _ in range(rank))
    assume(math.prod(shape) <= 70_000)
    dt = dtype if dtype is not None else draw(DTYPES)
    return shape, dt, draw(LAYOUTS)


def generator(seed: int) -> torch.Generator:
    return torch.Generator().manual_seed(seed)


SEEDS = st.integers(0, 2**31 - 1)


# ----------------------------------------------------------------------------- checks


#: Inputs kf gets wrong today, each pending its own fix: kept out of the fuzzed space so
#: that the tests guard everything else. Each has a strict expected failure below
#: (test_pending_*), which starts to pass, and so fails, when the fix lands: then the
#: entry goes.
PENDING: list = []


def check(target: str, fn, args: tuple, consts: tuple = (), *, scaled: bool = False, ulps: float = ULPS,
          exact: bool = False, refusable: bool = False):
    """Run fn through kf on target and check it against torch (see the module's docstring).
    scaled: the tolerance scales with fn on the inputs' magnitudes (sums, products).
    refusable: kf may refuse the example with its error for an op a target lacks (then
    the example says nothing)."""
    if any(pending(target, args) for pending, _ in PENDING):
        assume(False)
    try:
        out = compiled(fn, target)(*args, *consts)
    except (kf.UnsupportedOpError, kf.TargetError):
        if not refusable:
            raise
        assume(False)
    eager = fn(*args, *consts)
    outs, eagers = (out, eager) if isinstance(eager, tuple) else ((out,), (eager,))
    refs = fn(*(a.double() if a.is_floating_point() else a for a in args), *consts)
    refs = refs if isinstance(refs, tuple) else (refs,)
    mags = None
    if scaled:
        mags = fn(*(a.double().abs() if a.is_floating_point() else a for a in args), *consts)
        mags = mags if isinstance(mags, tuple) else (mags,)
    assert len(outs) == len(eagers)
    for i, (o, e, r) in enumerate(zip(outs, eagers, refs)):
        assert o.dtype == e.dtype, f"result {i}: dtype {o.dtype} != torch's {e.dtype}"
        assert o.shape == e.shape, f"result {i}: shape {list(o.shape)} != torch's {list(e.shape)}"
        if exact or not o.dtype.is_floating_point:
            assert torch.equal(o, e), f"result {i}: {int((o != e).sum())} of {e.numel()} values differ"
            continue
        o64, e64, r64 = o.double(), e.double(), r.double()
        assert torch.equal(o64.isnan(), e64.isnan()), f"result {i}: NaN where torch has none or the other way"
        ok = ~o64.isnan()
        eps = torch.finfo(o.dtype).eps
        # near-zero results of a cancellation are judged at the tensor's own scale
        typical = r64[ok].abs().mean() if ok.any() else 0.0
        scale = r64.abs() + typical + (mags[i].double() if mags is not None else 0) + 1e-3
        bound = 2 * (e64 - r64).abs() + ulps * eps * scale
        err = (o64 - r64).abs()
        bad = (err > bound) & ok
        if bad.any():
            at = bad.nonzero()[0].tolist()
            raise AssertionError(
                f"result {i}: {int(bad.sum())} of {o.numel()} values off ({o.dtype}); first at {at}: "
                f"kf {o64[tuple(at)].item():.7g}, torch {e64[tuple(at)].item():.7g}, "
                f"float64 {r64[tuple(at)].item():.7g}")


# ----------------------------------------------------------------------------- elementwise


def unary_chain(x):
    return torch.where(x > 0, torch.exp(-x) * torch.sigmoid(x), torch.tanh(x) + F.gelu(x)) + F.silu(x).abs()


def binary(x, y, op: str):
    return {"add": torch.add, "sub": torch.sub, "mul": torch.mul, "max": torch.maximum,
            "div": torch.div}[op](x, y)


def binary_scalar(x, op: str, s: float):
    return {"add": lambda: x + s, "mul": lambda: x * s, "rsub": lambda: s - x, "pow": lambda: x ** s,
            "clamp": lambda: x.clamp(min=-s, max=s)}[op]()


@pytest.mark.parametrize("target", TARGETS)
@FUZZ
@given(spec=tensors(rank_max=4), seed=SEEDS)
def test_elementwise_unary(target, spec, seed):
    shape, dtype, layout = spec
    check(target, unary_chain, (make(shape, dtype, layout, generator(seed)),), ulps=16)


@pytest.mark.parametrize("target", TARGETS)
@FUZZ
@given(spec=tensors(rank_max=3), seed=SEEDS, op=st.sampled_from(["add", "sub", "mul", "max", "div"]),
       broadcast=st.sampled_from(["same", "row", "column", "scalar"]), other_layout=LAYOUTS)
def test_elementwise_binary(target, spec, seed, op, broadcast, other_layout):
    shape, dtype, layout = spec
    g = generator(seed)
    x = make(shape, dtype, layout, g)
    y_shape = {"same": shape, "row": shape[-1:], "column": shape[:-1] + (1,), "scalar": ()}[broadcast]
    y = make(y_shape, dtype, other_layout, g, positive=op == "div")
    check(target, binary, (x, y), (op,))


@pytest.mark.parametrize("target", TARGETS)
@FUZZ
@given(spec=tensors(rank_max=3), seed=SEEDS, op=st.sampled_from(["add", "mul", "rsub", "pow", "clamp"]),
       s=st.sampled_from([0.5, 2.0, 3.0, -1.0, 1.5]))
def test_elementwise_scalar(target, spec, seed, op, s):
    shape, dtype, layout = spec
    positive = op == "pow"  # a negative base with a fractional exponent is NaN; pow's sign is its own test
    check(target, binary_scalar, (make(shape, dtype, layout, generator(seed), positive=positive),), (op, s),
          ulps=16)


def int_divide(x, y, op: str):
    return {"floor": lambda: torch.div(x, y, rounding_mode="floor"), "floordiv": lambda: x // y,
            "trunc": lambda: torch.div(x, y, rounding_mode="trunc"), "true": lambda: x / y,
            "remainder": lambda: x % y, "fmod": lambda: torch.fmod(x, y)}[op]()


INT_DTYPES = st.sampled_from([torch.int32, torch.int64])
DIVISIONS = st.sampled_from(["floor", "floordiv", "trunc", "true", "remainder", "fmod"])


@pytest.mark.parametrize("target", TARGETS)
@FUZZ
@given(spec=tensors(rank_max=3, dtype=torch.int64), dtype=INT_DTYPES, seed=SEEDS, op=DIVISIONS,
       divisor=st.sampled_from(["tensor", "row", "scalar"]), scalar=st.sampled_from([-7, -3, -1, 1, 2, 5]),
       other_layout=LAYOUTS)
def test_integer_division_signs(target, spec, dtype, seed, op, divisor, scalar, other_layout):
    """Integer division and remainder round as torch does for every sign of both
    operands: floor and Python's % toward negative infinity, trunc and fmod toward zero."""
    shape, _, layout = spec
    g = generator(seed)
    x = make(shape, dtype, layout, g, low=-50, high=50)
    if divisor == "scalar":
        check(target, int_divide, (x,), (scalar, op), refusable=True)
        return
    y = make(shape if divisor == "tensor" else shape[-1:], dtype, other_layout, g, low=-9, high=9)
    y = torch.where(y == 0, torch.full_like(y, 3), y)  # integer division by zero is undefined
    check(target, int_divide, (x, y), (op,), refusable=True)


def promote(x, y, op: str, s):
    return {"add": lambda: x + y, "mul": lambda: x * y, "sub_scalar": lambda: x - s, "mul_scalar": lambda: y * s,
            "where": lambda: torch.where(x > 0, x, y), "max": lambda: torch.maximum(x, y),
            "div": lambda: x / (y * y + 1), "and": lambda: (x > 0) & (y <= 0), "sum": lambda: (x + y).sum(-1),
            "cmp": lambda: x > y}[op]()


MIXED_DTYPES = st.sampled_from([torch.bool, torch.int32, torch.int64, torch.float32, torch.float16,
                                torch.bfloat16])


@pytest.mark.parametrize("target", TARGETS)
@FUZZ
@given(spec=tensors(rank_max=3), x_dtype=MIXED_DTYPES, y_dtype=MIXED_DTYPES, seed=SEEDS,
       op=st.sampled_from(["add", "mul", "sub_scalar", "mul_scalar", "where", "max", "div", "and", "sum", "cmp"]),
       s=st.sampled_from([2, -3, 1.5, True]), y_layout=LAYOUTS, broadcast=st.booleans())
def test_mixed_promotion(target, spec, x_dtype, y_dtype, seed, op, s, y_layout, broadcast):
    """bool, int and float operands (tensors and Python numbers) promote to torch's
    result dtype, and the values follow."""
    shape, _, layout = spec
    g = generator(seed)

    def operand(dtype, lay, shp):
        t = make(shp, torch.float32 if dtype == torch.bool else dtype, lay, g, low=-5, high=5)
        return t > 0 if dtype == torch.bool else t

    x = operand(x_dtype, layout, shape)
    y = operand(y_dtype, y_layout, shape[-1:] if broadcast else shape)
    try:
        promote(x, y, op, s)
    except RuntimeError:  # torch refuses some mixes itself (a bool minus anything)
        assume(False)
    check(target, promote, (x, y), (op, s), refusable=True)


def broadcast_binary(x, y, op: str):
    return {"add": x + y, "mul": x * y, "sub": x - y, "max": torch.maximum(x, y), "where": torch.where(x > y, x, y)}[op]


@pytest.mark.parametrize("target", TARGETS)
@FUZZ
@given(spec=tensors(rank_min=2, rank_max=4), seed=SEEDS, op=st.sampled_from(["add", "mul", "sub", "max", "where"]),
       x_ones=st.integers(0, 15), y_ones=st.integers(0, 15), y_rank_drop=st.integers(0, 2), y_layout=LAYOUTS)
def test_broadcast_size_1_dims(target, spec, seed, op, x_ones, y_ones, y_rank_drop, y_layout):
    """Binary ops whose operands have size-1 dims anywhere (not only leading or
    trailing), each broadcast against the other's, and fewer dims on one side."""
    shape, dtype, layout = spec
    x_shape = tuple(1 if x_ones >> d & 1 else n for d, n in enumerate(shape))
    y_shape = tuple(1 if y_ones >> d & 1 else n for d, n in enumerate(shape))[min(y_rank_drop, len(shape) - 1):]
    g = generator(seed)
    check(target, broadcast_binary, (make(x_shape, dtype, layout, g), make(y_shape, dtype, y_layout, g)), (op,))


# ----------------------------------------------------------------------------- reductions


def reduce(x, op: str, dim, keepdim: bool):
    if dim is None:
        return {"sum": torch.sum, "mean": torch.mean, "amax": torch.amax, "amin": torch.amin}[op](x)
    return {"sum": torch.sum, "mean": torch.mean, "amax": torch.amax, "amin": torch.amin}[op](
        x, dim=dim, keepdim=keepdim)


@pytest.mark.parametrize("target", TARGETS)
@FUZZ
@given(spec=tensors(rank_max=3), seed=SEEDS, op=st.sampled_from(["sum", "mean", "amax", "amin"]),
       dim_choice=st.integers(-1, 2), keepdim=st.booleans())
def test_reductions(target, spec, seed, op, dim_choice, keepdim):
    shape, dtype, layout = spec
    dim = None if dim_choice == -1 else dim_choice % len(shape)
    n = math.prod(shape) if dim is None else shape[dim]
    assume(op in ("sum", "mean") or n > 0)  # max of nothing is an error in torch too
    assume(not (op == "mean" and n == 0))  # NaN either way; nothing to compare
    x = make(shape, dtype, layout, generator(seed))
    check(target, reduce, (x,), (op, dim, keepdim), scaled=op in ("sum", "mean"))


def var_mean(x, dim: int, correction: int):
    return torch.var(x, dim=dim, correction=correction), x.mean(dim=dim)


@pytest.mark.parametrize("target", TARGETS)
@FUZZ
@given(spec=tensors(rank_max=3, sizes=NONZERO), seed=SEEDS, dim_choice=st.integers(0, 2),
       correction=st.sampled_from([0, 1]))
def test_variance(target, spec, seed, dim_choice, correction):
    shape, dtype, layout = spec
    dim = dim_choice % len(shape)
    assume(shape[dim] > correction)
    x = make(shape, dtype, layout, generator(seed))
    check(target, var_mean, (x,), (dim, correction), ulps=32)


def total(x):
    return x.sum()


def column_sums(x):
    return x.sum(dim=0)


BIG = 3 * 2**23  # above 2^24 elements: f32 accumulation in one chain stalls at 2^24


@pytest.mark.parametrize("target", TARGETS)
def test_sum_above_2_24_elements(target):
    x = torch.ones(BIG)
    torch.testing.assert_close(compiled(total, target)(x), x.sum())


MILLION = 10**6 + 3  # a prime: no block divides it


def reduce_million(x, op: str):
    return {"sum": lambda: x.sum(), "mean": lambda: x.mean(), "amax": lambda: x.amax(), "amin": lambda: x.amin(),
            "sum_rows": lambda: x.view(-1, 1000).sum(0), "sum_cols": lambda: x.view(1000, -1).sum(1),
            "var": lambda: x.float().var()}[op]()


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize("op", ["sum", "mean", "amax", "amin", "sum_rows", "sum_cols", "var"])
def test_reductions_over_a_million_elements(target, dtype, op):
    n = 10**6 if op in ("sum_rows", "sum_cols") else MILLION
    x = make((n,), dtype, "contiguous", generator(n), low=-1.0, high=3.0)
    check(target, reduce_million, (x,), (op,), scaled=op in ("sum", "mean", "sum_rows", "sum_cols", "var"))


@pytest.mark.parametrize("target", TARGETS)
def test_sum_with_prime_factor_above_65535(target):
    """No block length divides 2 * 65537: blocks and a tail (and lavapipe ends an
    invocation after 65535 loop iterations: no thread may walk it all)."""
    x = torch.rand(2 * 65537, generator=generator(0))
    check(target, total, (x,), scaled=True)


@pytest.mark.parametrize("target", TARGETS)
def test_long_column_sums(target):
    """Reductions over a non-innermost dimension of 65536 elements."""
    check(target, column_sums, (torch.ones(65536, 3),), scaled=True)


@pytest.mark.parametrize("target", TARGETS)
def test_column_sums_above_2_24_elements(target):
    """Many long reductions over a tensor of more than 2^24 elements."""
    x = torch.rand(BIG // 3, 3, generator=generator(0))
    check(target, column_sums, (x,), scaled=True)


# ----------------------------------------------------------------------------- row-wise


def softmax(x, dim: int):
    return torch.softmax(x, dim=dim)


def log_softmax(x, dim: int):
    return torch.log_softmax(x, dim=dim)


def layer_norm(x, w, b):
    return F.layer_norm(x, x.shape[-1:], w, b, eps=1e-5)


def rms_norm(x, w):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + 1e-6) * w


@pytest.mark.parametrize("target", TARGETS)
@FUZZ
@given(spec=tensors(rank_max=3, sizes=NONZERO), seed=SEEDS, which=st.sampled_from(["softmax", "log_softmax"]),
       last=st.booleans())
def test_rowwise_softmax(target, spec, seed, which, last):
    shape, dtype, layout = spec
    x = make(shape, dtype, layout, generator(seed))
    check(target, softmax if which == "softmax" else log_softmax, (x,), (-1 if last else 0,), ulps=16)


@pytest.mark.parametrize("target", TARGETS)
@FUZZ
@given(spec=tensors(rank_min=2, rank_max=3, sizes=NONZERO), seed=SEEDS, which=st.sampled_from(["layer", "rms"]))
def test_rowwise_norms(target, spec, seed, which):
    shape, dtype, layout = spec
    g = generator(seed)
    x = make(shape, dtype, layout, g)
    w = make(shape[-1:], dtype, "contiguous", g)
    if which == "layer":
        check(target, layer_norm, (x, w, make(shape[-1:], dtype, "stepped", g)), ulps=32)
    else:
        check(target, rms_norm, (x, w), ulps=32)


# ----------------------------------------------------------------------------- matmul


def matmul(a, b):
    return a @ b


def linear(x, w, b):
    return F.linear(x, w, b)


@pytest.mark.parametrize("target", TARGETS)
@FUZZ
@given(m=SIZES, k=SIZES, n=SIZES, batch=st.sampled_from([0, 1, 2, 3]), dtype=DTYPES, a_layout=LAYOUTS,
       b_layout=LAYOUTS, seed=SEEDS)
def test_matmul(target, m, k, n, batch, dtype, a_layout, b_layout, seed):
    g = generator(seed)
    a_shape = ((batch,) if batch else ()) + (m, k)
    assume(m * k * max(batch, 1) <= 70_000 and k * n <= 70_000)
    a, b = make(a_shape, dtype, a_layout, g), make((k, n), dtype, b_layout, g)
    check(target, matmul, (a, b), scaled=True)


@pytest.mark.parametrize("target", TARGETS)
@FUZZ
@given(m=NONZERO, k=NONZERO, n=NONZERO, dtype=DTYPES, layout=LAYOUTS, seed=SEEDS)
def test_linear(target, m, k, n, dtype, layout, seed):
    g = generator(seed)
    assume(m * k <= 70_000 and k * n <= 70_000)
    x, w, b = make((m, k), dtype, layout, g), make((n, k), dtype, "transposed", g), make((n,), dtype, layout, g)
    check(target, linear, (x, w, b), scaled=True)


# ----------------------------------------------------------------------------- attention


def attention(q, k, v):
    scores = torch.matmul(q, k.transpose(-2, -1)) / (q.shape[-1] ** 0.5)
    return torch.matmul(torch.softmax(scores, dim=-1), v)


def masked_attention(q, k, v, mask):
    scores = torch.matmul(q, k.transpose(-2, -1)) / (q.shape[-1] ** 0.5)
    scores = scores.masked_fill(mask == 0, -1e4)  # -1e9 overflows f16 in eager
    return torch.matmul(torch.softmax(scores, dim=-1), v)


@pytest.mark.parametrize("target", TARGETS)
@FUZZ
@given(batch=st.sampled_from([1, 2]), heads=st.sampled_from([1, 3]), seq=NONZERO,
       kv=st.sampled_from([1, 5, 64, 100]), dim=st.sampled_from([8, 16, 31, 64]),
       dtype=DTYPES, masked=st.booleans(), layout=LAYOUTS, seed=SEEDS)
def test_attention(target, batch, heads, seq, kv, dim, dtype, masked, layout, seed):
    g = generator(seed)
    q = make((batch, heads, seq, dim), dtype, layout, g)
    k, v = make((batch, heads, kv, dim), dtype, "contiguous", g), make((batch, heads, kv, dim), dtype, layout, g)
    if masked:
        mask = (torch.rand(seq, kv, generator=g) > 0.3).to(dtype)
        mask[:, 0] = 1  # every row keeps a key
        check(target, masked_attention, (q, k, v, mask), ulps=32)
    else:
        check(target, attention, (q, k, v), ulps=32)


# ----------------------------------------------------------------------------- transpose and views


def permute_scale(x, perm: tuple):
    return x.permute(perm).contiguous() * 2


def view_ops(x):
    return x[..., ::2].transpose(0, -1) + x[..., 1::2].sum(-1, keepdim=True).transpose(0, -1)


@pytest.mark.parametrize("target", TARGETS)
@FUZZ
@given(spec=tensors(rank_min=2, rank_max=4), seed=SEEDS, perm_seed=st.integers(0, 23))
def test_transpose(target, spec, seed, perm_seed):
    shape, dtype, layout = spec
    perm = tuple(torch.randperm(len(shape), generator=generator(perm_seed)).tolist())
    check(target, permute_scale, (make(shape, dtype, layout, generator(seed)),), (perm,), exact=True)


@pytest.mark.parametrize("target", TARGETS)
@FUZZ
@given(spec=tensors(rank_min=2, rank_max=3), seed=SEEDS)
def test_views(target, spec, seed):
    shape, dtype, layout = spec
    check(target, view_ops, (make(shape, dtype, layout, generator(seed)),), scaled=True)


# ----------------------------------------------------------------------------- gather and index


def index_select(x, idx, dim: int):
    return torch.index_select(x, dim, idx)


def gather(x, idx, dim: int):
    return torch.gather(x, dim, idx)


def embedding(idx, w):
    return F.embedding(idx, w)


@pytest.mark.parametrize("target", TARGETS)
@FUZZ
@given(spec=tensors(rank_max=3, sizes=NONZERO), seed=SEEDS, n=SIZES, dim_choice=st.integers(0, 2))
def test_index_select(target, spec, seed, n, dim_choice):
    shape, dtype, layout = spec
    dim = dim_choice % len(shape)
    g = generator(seed)
    idx = torch.randint(0, shape[dim], (n,), generator=g)
    check(target, index_select, (make(shape, dtype, layout, g), idx), (dim,), exact=True)


@pytest.mark.parametrize("target", TARGETS)
@FUZZ
@given(spec=tensors(rank_min=2, rank_max=3, sizes=NONZERO), seed=SEEDS, dim_choice=st.integers(0, 2),
       width=NONZERO)
def test_gather(target, spec, seed, dim_choice, width):
    shape, dtype, layout = spec
    dim = dim_choice % len(shape)
    g = generator(seed)
    idx_shape = tuple(width if d == dim else s for d, s in enumerate(shape))
    assume(math.prod(idx_shape) <= 70_000)
    idx = torch.randint(0, shape[dim], idx_shape, generator=g)
    check(target, gather, (make(shape, dtype, layout, g), idx), (dim,), exact=True)


@pytest.mark.parametrize("target", TARGETS)
@FUZZ
@given(rows=NONZERO, width=NONZERO, n=SIZES, batch=st.sampled_from([1, 2]), dtype=DTYPES, layout=LAYOUTS,
       seed=SEEDS)
def test_embedding(target, rows, width, n, batch, dtype, layout, seed):
    g = generator(seed)
    idx = torch.randint(0, rows, (batch, n), generator=g)
    check(target, embedding, (idx, make((rows, width), dtype, layout, g)), exact=True)


def index_add(x, idx, src, dim: int):
    return x.index_add(dim, idx, src)


@pytest.mark.parametrize("target", TARGETS)
@FUZZ
@given(spec=tensors(rank_max=3, sizes=NONZERO), seed=SEEDS, n=st.sampled_from([0, 1, 5, 63, 64, 257, 1000]),
       dim_choice=st.integers(0, 2), src_layout=LAYOUTS, spread=st.sampled_from(["all", "few"]))
def test_index_add(target, spec, seed, n, dim_choice, src_layout, spread):
    """index_add along any dim from n sources: a short index walked, a long one (64 and
    up) sorted into segments first; indices spread over the whole dim or piled on a few
    rows (long segments, one summed in index order)."""
    shape, dtype, layout = spec
    dim = dim_choice % len(shape)
    src_shape = tuple(n if d == dim else size for d, size in enumerate(shape))
    assume(math.prod(src_shape) <= 70_000)
    g = generator(seed)
    top = shape[dim] if spread == "all" else min(shape[dim], 2)
    idx = torch.randint(0, top, (n,), generator=g)
    check(target, index_add, (make(shape, dtype, layout, g), idx, make(src_shape, dtype, src_layout, g)), (dim,),
          scaled=True)


# ----------------------------------------------------------------------------- pending


@pytest.mark.parametrize("target", TARGETS)
def test_single_element_strided(target):
    # a one-element view whose stride is not 1 (x[::2] of length 2) uploads as its one element
    x = torch.rand(2, generator=generator(0))[::2]
    torch.testing.assert_close(compiled(unary_chain, target)(x), unary_chain(x))


@pytest.mark.parametrize("target", TARGETS)
def test_size_zero(target):
    out = compiled(view_ops, target)(torch.rand(0, 0))
    assert out.shape == view_ops(torch.rand(0, 0)).shape
