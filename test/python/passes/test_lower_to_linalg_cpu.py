"""kf-lower-to-linalg and the CPU target, end to end: every kf op (and the seed models'
chains) is built with kf.dialects.builders, lowered to linalg, compiled to a shared
object by kf.cpu_codegen, run by kf.runtime.cpu on fresh random tensors and compared
with torch.

Shapes are deliberately not powers of two (3×257, 1000, 7) so that no tail is hidden,
and inputs are random (never zeros) so that a kernel that forgets to write passes
nothing. Low-precision results are compared with torch computing the same formula in
f32 and rounding once, which is kf's precision policy.
"""

from __future__ import annotations

import math
import tempfile

import numpy as np
import pytest
import torch
from mlir import ir
from mlir.dialects import func

from kf.cpu_codegen import compile_module
from kf.dialects import TensorSpec, make_context, mlir_type
from kf.dialects import builders as kb
from kf.runtime.cpu import CpuLaunchError, load

ELEM = {torch.float32: "f32", torch.float16: "f16", torch.bfloat16: "bf16", torch.float64: "f64",
        torch.int64: "i64", torch.int32: "i32", torch.bool: "i1"}
TOL = {torch.float32: (2e-5, 2e-5), torch.float64: (1e-10, 1e-10), torch.float16: (2e-3, 2e-3),
       torch.bfloat16: (1.6e-2, 1.6e-2)}
LOW = [torch.float16, torch.bfloat16]
FLOATS = [torch.float32, *LOW]

torch.manual_seed(0)


def compile_kf(build, inputs):
    """Compile ``build(*kf values) -> value or tuple`` for the inputs' shapes and dtypes."""
    ctx = make_context()
    with ctx, ir.Location.unknown():
        module = ir.Module.create()
        types = [mlir_type(TensorSpec(tuple(t.shape), ELEM[t.dtype])) for t in inputs]
        with ir.InsertionPoint(module.body):
            @func.FuncOp.from_py_func(*types, name="kernel")
            def kernel(*args):
                out = build(*args)
                return tuple(out) if isinstance(out, (tuple, list)) else out
        directory = tempfile.mkdtemp(prefix="kf-test-cpu-")
        artifact = compile_module(module, "kernel", directory)
    return load(artifact.abi, directory)


def run_kf(build, *inputs):
    return compile_kf(build, inputs)(*inputs)


def check(got, want, dtype=None):
    dtype = dtype or want.dtype
    assert got.dtype == want.dtype and got.shape == want.shape, (got.dtype, got.shape, want.dtype, want.shape)
    if dtype in TOL:
        rtol, atol = TOL[dtype]
        torch.testing.assert_close(got.double(), want.double(), rtol=rtol, atol=atol, equal_nan=True)
    else:
        assert torch.equal(got, want), (got, want)


def rand(*shape, dtype=torch.float32, positive=False):
    x = torch.randn(tuple(shape), dtype=torch.float32)
    if positive:
        x = x.abs() + 0.25
    return x.to(dtype)


def in_f32(fn, *xs, out_dtype=None):
    """torch's answer under kf's policy: compute in f32 from the inputs, round once."""
    ys = fn(*[x.float() if x.is_floating_point() else x for x in xs])
    dtype = out_dtype or xs[0].dtype
    return tuple(y.to(dtype) if y.is_floating_point() else y for y in ys) if isinstance(ys, tuple) else (
        ys.to(dtype) if ys.is_floating_point() else ys)


# ----------------------------------------------------------------------------- elementwise

BINARY = {
    "add": torch.add, "sub": torch.sub, "mul": torch.mul, "div": torch.div, "max": torch.maximum,
    "min": torch.minimum, "pow": torch.pow,
}
SHAPES = [((3, 257), (257,)), ((3, 1), (1, 257)), ((1000,), ()), ((2, 3, 7), (3, 1))]


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("shapes", SHAPES, ids=str)
@pytest.mark.parametrize("name", sorted(BINARY))
def test_binary_broadcast(name, shapes, dtype):
    a = rand(*shapes[0], dtype=dtype, positive=name == "pow")
    b = rand(*shapes[1], dtype=dtype)
    (got,) = run_kf(lambda x, y: getattr(kb, name)(x, y), a, b)
    check(got, in_f32(BINARY[name], a, b))


@pytest.mark.parametrize("name", ["add", "sub", "mul", "max", "min"])
@pytest.mark.parametrize("dtype", [torch.int64, torch.int32])
def test_binary_integer(name, dtype):
    a = torch.randint(-50, 50, (3, 257), dtype=dtype)
    b = torch.randint(-50, 50, (257,), dtype=dtype)
    (got,) = run_kf(lambda x, y: getattr(kb, name)(x, y), a, b)
    check(got, BINARY[name](a, b))


UNARY = {
    "neg": torch.neg, "abs": torch.abs, "exp": torch.exp, "log": torch.log, "sqrt": torch.sqrt,
    "rsqrt": torch.rsqrt, "reciprocal": torch.reciprocal, "tanh": torch.tanh, "erf": torch.erf,
    "sigmoid": torch.sigmoid, "relu": torch.relu,
}


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("name", sorted(UNARY))
def test_unary(name, dtype):
    a = rand(3, 257, dtype=dtype, positive=name in ("log", "sqrt", "rsqrt", "reciprocal"))
    (got,) = run_kf(lambda x: getattr(kb, name)(x), a)
    check(got, in_f32(UNARY[name], a))


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_gelu(approximate, dtype):
    a = rand(1000, dtype=dtype) * 3
    (got,) = run_kf(lambda x: kb.gelu(x, approximate=approximate), a)
    check(got, in_f32(lambda x: torch.nn.functional.gelu(x, approximate=approximate), a))


@pytest.mark.parametrize("name", ["neg", "abs", "relu"])
def test_unary_integer(name):
    a = torch.randint(-50, 50, (1000,), dtype=torch.int32)
    (got,) = run_kf(lambda x: getattr(kb, name)(x), a)
    check(got, UNARY[name](a))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.int64])
@pytest.mark.parametrize("pred", ["eq", "ne", "lt", "le", "gt", "ge"])
def test_cmp(pred, dtype):
    a = torch.randint(-3, 3, (3, 257)).to(dtype)  # small integers: equal elements occur
    b = torch.randint(-3, 3, (257,)).to(dtype)
    (got,) = run_kf(lambda x, y: kb.cmp(x, y, predicate=pred), a, b)
    check(got, getattr(torch, pred)(a, b))


@pytest.mark.parametrize("dtype", FLOATS)
def test_select_and_masked_fill(dtype):
    c = torch.rand(3, 257) > 0.5
    a, b = rand(3, 257, dtype=dtype), rand(257, dtype=dtype)
    m = torch.rand(3, 1) > 0.5
    got_sel, got_fill = run_kf(lambda c_, x, y, m_: (kb.select(c_, x, y), kb.masked_fill(x, m_, value=-math.inf)),
                               c, a, b, m)
    check(got_sel, torch.where(c, a, b))
    check(got_fill, a.masked_fill(m, -math.inf))


CASTS = [(torch.float32, torch.float16), (torch.float16, torch.float32), (torch.float32, torch.bfloat16),
         (torch.bfloat16, torch.float16), (torch.float32, torch.int64), (torch.int64, torch.float32),
         (torch.bool, torch.float32), (torch.float32, torch.bool), (torch.int32, torch.int64),
         (torch.float32, torch.float64)]


@pytest.mark.parametrize("src,dst", CASTS, ids=str)
def test_cast(src, dst):
    if src == torch.bool:
        a = torch.rand(1000) > 0.5
    elif src.is_floating_point:
        a = (rand(1000) * 10).to(src)
    else:
        a = torch.randint(-1000, 1000, (1000,), dtype=src)
    (got,) = run_kf(lambda x: kb.cast(x, ELEM[dst]), a)
    check(got, a.to(dst))


# ----------------------------------------------------------------------------- reductions

REDUCE_DIMS = [([1], False), ([1], True), ([0], True), ([0, 1], False), ([0, 1], True), ([-1], False)]


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("dims,keepdim", REDUCE_DIMS, ids=str)
@pytest.mark.parametrize("name", ["sum", "mean", "reduce_max", "reduce_min"])
def test_reduction(name, dims, keepdim, dtype):
    a = rand(3, 257, dtype=dtype)
    (got,) = run_kf(lambda x: getattr(kb, name)(x, dims=dims, keepdim=keepdim), a)
    ref = {"sum": lambda x: x.sum(dims, keepdim=keepdim), "mean": lambda x: x.mean(dims, keepdim=keepdim),
           "reduce_max": lambda x: x.amax(dims, keepdim=keepdim),
           "reduce_min": lambda x: x.amin(dims, keepdim=keepdim)}[name]
    check(got, in_f32(ref, a))


def test_sum_all_and_integers():
    a = rand(7, 11, 13)
    (got,) = run_kf(lambda x: kb.sum(x, dims=[]), a)
    check(got, a.sum())
    i = torch.randint(-100, 100, (1000,), dtype=torch.int64)
    (got,) = run_kf(lambda x: kb.reduce_max(x, dims=[0]), i)
    check(got, i.amax(0))


def test_rank0_reductions():
    a = rand()
    got = run_kf(lambda x: (kb.sum(x, dims=[]), kb.mean(x, dims=[]), kb.softmax(x, dim=0), kb.argmax(x, dim=0)), a)
    check(got[0], a.sum())
    check(got[1], a.mean())
    check(got[2], torch.softmax(a, 0))
    check(got[3], a.argmax(0))


def test_sum_of_bools_counts():
    m = torch.rand(3, 257) > 0.3
    (got,) = run_kf(lambda x: kb.sum(x, dims=[1], elem="i64"), m)
    check(got, m.sum(1))


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("correction", [0.0, 1.0])
@pytest.mark.parametrize("dims,keepdim", [([1], True), ([0, 1], False), ([0], False)], ids=str)
def test_var(dims, keepdim, correction, dtype):
    a = rand(3, 257, dtype=dtype) * 2 + 100  # a large mean: the one-pass formula would fail here
    (got,) = run_kf(lambda x: kb.var(x, dims=dims, correction=correction, keepdim=keepdim), a)
    check(got, in_f32(lambda x: x.var(dims, correction=correction, keepdim=keepdim), a))


@pytest.mark.parametrize("dtype", [*FLOATS, torch.int64])
@pytest.mark.parametrize("dim,keepdim", [(1, False), (0, True), (-1, True)], ids=str)
def test_argmax(dim, keepdim, dtype):
    a = torch.randperm(3 * 257).reshape(3, 257).to(dtype)  # distinct values: a unique answer
    (got,) = run_kf(lambda x: kb.argmax(x, dim=dim, keepdim=keepdim), a)
    check(got, a.argmax(dim, keepdim=keepdim))


def test_argmax_first_maximum_and_nan():
    a = torch.tensor([[1.0, 5.0, 5.0, 2.0], [1.0, float("nan"), 3.0, float("nan")], [-math.inf] * 4])
    (got,) = run_kf(lambda x: kb.argmax(x, dim=1), a)
    check(got, torch.tensor([1, 1, 0]))


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("dim", [-1, 0])
@pytest.mark.parametrize("name", ["softmax", "log_softmax"])
def test_softmax(name, dim, dtype):
    a = rand(3, 257, dtype=dtype) * 40  # exp would overflow without the max subtraction
    (got,) = run_kf(lambda x: getattr(kb, name)(x, dim=dim), a)
    check(got, in_f32(lambda x: getattr(torch, name)(x, dim), a))


# ----------------------------------------------------------------------------- matmul

MATMUL_SHAPES = [((3, 257), (257, 5)), ((2, 3, 7), (2, 7, 5)), ((4, 1, 3, 7), (5, 7, 6)), ((3, 7), (2, 7, 5)),
                 ((2, 3, 7), (7, 5))]


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("shapes", MATMUL_SHAPES, ids=str)
def test_matmul(shapes, dtype):
    a, b = rand(*shapes[0], dtype=dtype), rand(*shapes[1], dtype=dtype)
    (got,) = run_kf(kb.matmul, a, b)
    rtol, atol = TOL[dtype]
    want = in_f32(torch.matmul, a, b)
    torch.testing.assert_close(got.double(), want.double(), rtol=rtol, atol=atol * 10)


def test_matmul_integer():
    a = torch.randint(-9, 9, (3, 7), dtype=torch.int64)
    b = torch.randint(-9, 9, (7, 5), dtype=torch.int64)
    (got,) = run_kf(kb.matmul, a, b)
    check(got, a @ b)


# ----------------------------------------------------------------------------- layout


def test_transpose_reshape_broadcast():
    a = rand(2, 3, 7)
    got = run_kf(lambda x: (kb.transpose(x, perm=[2, 0, 1]), kb.reshape(x, [7, 6]), kb.reshape(x, [42]),
                            kb.broadcast_to(kb.slice(x, dim=1, start=0, end=1), [5, 2, 3, 7])), a)
    check(got[0], a.permute(2, 0, 1))
    check(got[1], a.reshape(7, 6))
    check(got[2], a.reshape(42))
    check(got[3], a[:, 0:1].expand(5, 2, 3, 7).contiguous())


def test_reshape_rank0():
    a = rand(1, 1)
    got = run_kf(lambda x: (kb.reshape(x, []), kb.reshape(kb.reshape(x, []), [1, 1, 1])), a)
    check(got[0], a.reshape(()))
    check(got[1], a.reshape(1, 1, 1))


@pytest.mark.parametrize("dim,start,end,step", [(1, 3, 250, 1), (1, 1, 257, 3), (0, 1, 3, 1), (-1, 0, 257, 256)])
def test_slice(dim, start, end, step):
    a = rand(3, 257)
    (got,) = run_kf(lambda x: kb.slice(x, dim=dim, start=start, end=end, step=step), a)
    idx = [slice(None)] * 2
    idx[dim] = slice(start, end, step)
    check(got, a[tuple(idx)].contiguous())


@pytest.mark.parametrize("dim", [0, 1, -1])
def test_concat(dim):
    shapes = {0: [(3, 7), (1, 7), (5, 7)], 1: [(3, 7), (3, 1), (3, 5)], -1: [(3, 7), (3, 1), (3, 5)]}[dim]
    xs = [rand(*s) for s in shapes]
    (got,) = run_kf(lambda *vs: kb.concat(vs, dim=dim), *xs)
    check(got, torch.cat(xs, dim))


# ----------------------------------------------------------------------------- selection, indexing


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("k,dim,largest", [(3, -1, True), (1, 1, True), (2, 0, True), (4, -1, False)], ids=str)
def test_topk(k, dim, largest, dtype):
    a = (torch.randperm(3 * 257).reshape(3, 257).float() / 7).to(dtype)
    if dtype != torch.float32:
        a = torch.randperm(3 * 257).reshape(3, 257).to(dtype) if dtype == torch.float16 else \
            torch.randperm(200)[: 3 * 50].reshape(3, 50).to(dtype)  # bf16 holds integers to 256 exactly
    vals, idxs = run_kf(lambda x: kb.topk(x, k=k, dim=dim, largest=largest), a)
    want = torch.topk(a, k, dim, largest=largest)
    check(vals, want.values)
    check(idxs, want.indices)


def test_gather_and_index_select():
    a = rand(3, 257)
    gi = torch.randint(0, 257, (3, 100))
    si = torch.randint(0, 3, (5,), dtype=torch.int32)
    got = run_kf(lambda x, g, s: (kb.gather(x, g, dim=1), kb.index_select(x, s, dim=0)), a, gi, si)
    check(got[0], torch.gather(a, 1, gi))
    check(got[1], torch.index_select(a, 0, si))


def test_indexing_along_inner_dims():
    a = rand(4, 9, 5)
    si = torch.tensor([8, 0, 3, 3])
    gi = torch.randint(0, 4, (2, 9, 5))
    src = rand(4, 9, 5)
    got = run_kf(lambda x, s, g, u: (kb.index_select(x, s, dim=1), kb.gather(x, g, dim=0), kb.scatter_add(x, g, u, dim=0)),
                 a, si, gi, src)
    check(got[0], a.index_select(1, si))
    check(got[1], torch.gather(a, 0, gi))
    check(got[2], a.scatter_add(0, gi, src))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_index_add(dtype):
    a = rand(7, 33, dtype=dtype)
    index = torch.tensor([1, 6, 1, 0, 3])  # 1 twice: the second add sees the first
    src = rand(5, 33, dtype=dtype)
    (got,) = run_kf(lambda x, i, s: kb.index_add(x, i, s, dim=0), a, index, src)
    check(got, a.index_add(0, index, src))


def test_scatter_add():
    a = rand(3, 20)
    index = torch.randint(0, 20, (3, 11))  # random: repeated targets accumulate
    src = rand(3, 11)
    (got,) = run_kf(lambda x, i, s: kb.scatter_add(x, i, s, dim=1), a, index, src)
    check(got, a.scatter_add(1, index, src))


def test_constant_and_fill():
    value = np.arange(21, dtype=np.float32).reshape(3, 7) / 3
    a = rand(3, 7)

    def build(x):
        c = kb.constant(ir.DenseElementsAttr.get(value))
        return kb.add(x, c), kb.fill([3, 7], "f16", 2.5), kb.mul(x, kb.scalar(-1.5, "f32"))

    got = run_kf(build, a)
    check(got[0], a + torch.from_numpy(value))
    check(got[1], torch.full((3, 7), 2.5, dtype=torch.float16))
    check(got[2], a * -1.5)


# ----------------------------------------------------------------------------- seed chains


@pytest.mark.parametrize("dtype", FLOATS)
def test_layer_norm_chain(dtype):
    x, w, b = rand(3, 257, dtype=dtype), rand(257, dtype=dtype), rand(257, dtype=dtype)

    def build(x_, w_, b_):
        mean = kb.mean(x_, dims=[-1], keepdim=True)
        var = kb.var(x_, dims=[-1], correction=0.0, keepdim=True)
        eps = kb.scalar(1e-5, ELEM[dtype])
        y = kb.div(kb.sub(x_, mean), kb.sqrt(kb.add(var, eps)))
        return kb.add(kb.mul(y, w_), b_)

    (got,) = run_kf(build, x, w, b)
    want = torch.nn.functional.layer_norm(x.float(), (257,), w.float(), b.float(), eps=1e-5).to(dtype)
    rtol, atol = TOL[dtype]
    # Each kf op rounds to the tensor dtype (as torch's own op-by-op chain would).
    torch.testing.assert_close(got.double(), want.double(), rtol=rtol * 4, atol=atol * 4)


@pytest.mark.parametrize("dtype", FLOATS)
def test_attention_chain(dtype):
    q, k, v = rand(2, 5, 37, 16, dtype=dtype), rand(2, 5, 37, 16, dtype=dtype), rand(2, 5, 37, 16, dtype=dtype)
    mask = torch.rand(37, 37) > 0.8
    mask[:, 0] = False  # no fully masked row

    def build(q_, k_, v_, m_):
        s = kb.div(kb.matmul(q_, kb.transpose(k_, perm=[0, 1, 3, 2])), kb.scalar(4.0, ELEM[dtype]))
        p = kb.softmax(kb.masked_fill(s, m_, value=-math.inf), dim=-1)
        return kb.matmul(p, v_)

    (got,) = run_kf(build, q, k, v, mask)
    ref = torch.softmax((q.float() @ k.float().transpose(-1, -2) / 4.0).masked_fill(mask, -math.inf), -1) @ v.float()
    rtol, atol = TOL[dtype]
    torch.testing.assert_close(got.double(), ref.to(dtype).double(), rtol=rtol * 4, atol=atol * 4)


@pytest.mark.parametrize("d", [1, 8, 40, 64, 65, 128])
def test_attention_sweep(d):
    """The seed's attention (scale, masked_fill(mask == 0, -1e9), softmax) at the head
    dims, query and key counts of the GPU targets' sweep (test_attention_matmul.py), each
    shape in one of four variants: f32 against torch in f64; bf16 at scale 10 against
    torch eager in bf16, which rounds each op's result as this path does."""
    shapes = [(1, 255), (2, 257), (3, 31), (17, 256), (128, 1), (257, 300)]
    variants = [(torch.float32, False), (torch.float32, True), (torch.bfloat16, False), (torch.bfloat16, True)]
    for i, (sq, sk) in enumerate(shapes):
        dtype, masked = variants[(i + d) % 4]
        gen = torch.Generator().manual_seed(d * 100 + i)
        scale = 10.0 if dtype == torch.bfloat16 else 1.0
        q, k, v = ((torch.randn(1, 2, n, d, generator=gen) * scale).to(dtype) for n in (sq, sk, sk))
        mask = (torch.rand(sq, sk, generator=gen) > 0.3).float()
        mask[sq // 2] = 0

        def build(q_, k_, v_, m_):
            s = kb.div(kb.matmul(q_, kb.transpose(k_, perm=[0, 1, 3, 2])), kb.scalar(d ** 0.5, ELEM[dtype]))
            if masked:
                s = kb.masked_fill(s, kb.cmp(m_, kb.scalar(0.0, "f32"), predicate="eq"), value=-1e9)
            return kb.matmul(kb.softmax(s, dim=-1), v_)

        (got,) = run_kf(build, q, k, v, mask)

        def seed(q, k, v):  # the scale as the kernel has it: a scalar of q's type
            s = q @ k.transpose(-2, -1) / torch.tensor(d ** 0.5, dtype=q.dtype)
            return torch.softmax(s.masked_fill(mask == 0, -1e9) if masked else s, -1) @ v

        want = seed(q.double(), k.double(), v.double()) if dtype == torch.float32 else seed(q, k, v)
        tol = (2e-5 if dtype == torch.float32 else 1e-2) * max(1.0, want.double().abs().max().item())
        assert (got.double() - want.double()).abs().max().item() <= tol, (d, sq, sk, dtype, masked)


def test_topk_softmax_gate():
    logits = rand(1000, 7)

    def build(x):
        vals, idx = kb.topk(x, k=2, dim=-1)
        return kb.softmax(vals, dim=-1), idx

    w, idx = run_kf(build, logits)
    want = torch.topk(logits, 2, -1)
    check(w, torch.softmax(want.values, -1))
    check(idx, want.indices)


# ----------------------------------------------------------------------------- the launcher


def test_launcher_checks_and_layouts():
    a = rand(257, 3).t()  # not contiguous: the launcher makes a dense copy
    program = compile_kf(lambda x: (kb.exp(x), x), [a.contiguous()])
    got, same = program(a)
    check(got, torch.exp(a))
    check(same, a.contiguous())  # a returned input is copied into the output buffer
    assert same.data_ptr() != a.data_ptr()
    with pytest.raises(CpuLaunchError, match="compiled for"):
        program(rand(3, 256))
    out = [torch.empty(3, 257), torch.empty(3, 257)]
    got, _ = program(a, out=out)
    assert got is out[0]
    check(out[0], torch.exp(a))


def test_booleans_follow_torch():
    a, b = torch.rand(3, 257) > 0.5, torch.rand(257) > 0.5
    got = run_kf(lambda x, y: (kb.add(x, y), kb.mul(x, y), kb.cmp(x, y, predicate="lt"),
                               kb.reduce_max(x, dims=[1]), kb.argmax(x, dim=1)), a, b)
    check(got[0], a + b)
    check(got[1], a * b)
    check(got[2], a < b)
    check(got[3], a.amax(1))
    check(got[4], a.to(torch.uint8).argmax(1))


def test_bool_constant_and_f64():
    mask = np.array([[True, False, True, True, False, False, True]] * 3)
    a = rand(3, 7, dtype=torch.float64)

    def build(x):
        m = kb.constant(ir.DenseElementsAttr.get(mask))
        return kb.masked_fill(kb.exp(x), m, value=0.5), kb.var(x, dims=[1], correction=1.0)

    got = run_kf(build, a)
    check(got[0], torch.exp(a).masked_fill(torch.from_numpy(mask), 0.5))
    check(got[1], a.var(1))


def test_one_value_returned_twice():
    a = rand(1000)
    got = run_kf(lambda x: (kb.relu(x), kb.relu(x), x), a)
    for g, w in zip(got, (a.relu(), a.relu(), a)):
        check(g, w)
    assert len({g.data_ptr() for g in got}) == 3


FP8 = [torch.float8_e4m3fn, torch.float8_e5m2]
ELEM.update({torch.float8_e4m3fn: "f8E4M3FN", torch.float8_e5m2: "f8E5M2"})


def _hard_floats() -> torch.Tensor:
    """Random magnitudes over the whole fp8 range and past it, exact ties, subnormals,
    zeros of both signs, infinities and NaN."""
    mags = torch.exp2(torch.empty(4000).uniform_(-20, 18)) * torch.randn(4000).sign()
    e4m3_ties = torch.arange(0, 255, dtype=torch.uint8).view(torch.float8_e4m3fn).float()
    mids = (e4m3_ties[1:] + e4m3_ties[:-1]) / 2
    special = torch.tensor([0.0, -0.0, math.inf, -math.inf, math.nan, 448.0, 464.0, 479.9, 480.0, 57344.0,
                            61439.0, 61440.0, 2.0 ** -9, 2.0 ** -10, 3 * 2.0 ** -11, 2.0 ** -16, 2.0 ** -17])
    return torch.cat([mags, mids, -mids, special])


def _fp8(x: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """torch's cast to an 8-bit float as kf encodes it (and torch 2.13 casts): E4M3FN
    saturates past its largest finite value, 448, and at infinity; torch 2.11 gives NaN
    there, so the expectation clamps first (rounding below 464 gives 448 either way)."""
    if dtype == torch.float8_e4m3fn:
        x = x.clamp(-448.0, 448.0)  # NaN stays NaN
    return x.to(dtype)


@pytest.mark.parametrize("dtype", FP8, ids=str)
def test_fp8_conversions_match_torch_bit_for_bit(dtype):
    x = _hard_floats()
    every = torch.arange(256, dtype=torch.int32).to(torch.uint8).view(dtype)
    got = run_kf(lambda a, b: (kb.cast(a, ELEM[dtype]), kb.cast(b, "f32"), kb.cast(b, "f16"),
                               kb.cast(kb.cast(a, "f64"), ELEM[dtype])), x, every)
    assert torch.equal(got[0].view(torch.uint8), _fp8(x, dtype).view(torch.uint8))
    torch.testing.assert_close(got[1], every.float(), rtol=0, atol=0, equal_nan=True)
    torch.testing.assert_close(got[2], every.to(torch.float16), rtol=0, atol=0, equal_nan=True)
    assert torch.equal(got[3].view(torch.uint8), _fp8(x, dtype).view(torch.uint8))


@pytest.mark.parametrize("dtype", FP8, ids=str)
def test_fp8_math_in_f32(dtype):
    a, b = rand(3, 257).to(dtype), rand(257).to(dtype)
    got = run_kf(lambda x, y: (kb.add(kb.mul(x, y), x), kb.sum(x, dims=[1]), kb.softmax(x, dim=-1),
                               kb.cast(x, "f8E5M2" if dtype == torch.float8_e4m3fn else "f8E4M3FN")), a, b)
    for g, w in zip(got, [(a.float() * b.float()).to(dtype).float().add(a.float()).to(dtype),
                          a.float().sum(1).to(dtype), torch.softmax(a.float(), -1).to(dtype),
                          a.float().to(torch.float8_e5m2 if dtype == torch.float8_e4m3fn else torch.float8_e4m3fn)]):
        assert g.dtype == w.dtype
        assert torch.equal(g.view(torch.uint8), w.view(torch.uint8)), (g, w)


def test_launch_needs_no_mlir(tmp_path):
    """A cache hit in a fresh process: the ABI JSON and the .so, no mlir import."""
    import subprocess
    import sys

    ctx = make_context()
    with ctx, ir.Location.unknown():
        module = ir.Module.create()
        with ir.InsertionPoint(module.body):
            @func.FuncOp.from_py_func(mlir_type(TensorSpec((3, 257), "f32")), name="k")
            def k(x):
                return kb.softmax(x, dim=-1)
        artifact = compile_module(module, "k", str(tmp_path))
    (tmp_path / "k.json").write_text(artifact.abi.to_json())
    script = f"""
import sys, torch
from kf.runtime.abi import ProgramABI
from kf.runtime.cpu import load
abi = ProgramABI.from_json(open({str(tmp_path / "k.json")!r}).read())
x = torch.randn(3, 257)
(y,) = load(abi, {str(tmp_path)!r})(x)
assert torch.allclose(y, torch.softmax(x, -1), atol=1e-6)
assert not any(m == "mlir" or m.startswith("mlir.") for m in sys.modules), "mlir was imported"
print("ok")
"""
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr


def test_bool_and_integer_tensors_through_layout_ops():
    m = torch.rand(3, 257) > 0.5
    i = torch.randint(-99, 99, (3, 257))
    idx = torch.tensor([2, 0, 2])

    def build(m_, i_, idx_):
        return (kb.transpose(m_, perm=[1, 0]), kb.concat([m_, kb.slice(m_, dim=1, start=1, end=257, step=2)], dim=1),
                kb.reshape(m_, [257, 3]), kb.broadcast_to(kb.slice(m_, dim=0, start=1, end=2), [4, 3, 257]),
                kb.index_select(m_, idx_, dim=0), kb.topk(i_, k=3, dim=1)[0], kb.transpose(i_, perm=[1, 0]))

    got = run_kf(build, m, i, idx)
    want = (m.t(), torch.cat([m, m[:, 1::2]], 1), m.reshape(257, 3), m[1:2].expand(4, 3, 257),
            m.index_select(0, idx), torch.topk(i, 3, 1).values, i.t())
    for g, w in zip(got, want):
        check(g, w.contiguous())


# ----------------------------------------------------------------------------- bf16/f16 precision


@pytest.mark.parametrize("dtype", LOW)
def test_elementwise_chain_rounds_once(dtype):
    """A bf16/f16 value that only elementwise ops read stays f32 between them (as in a
    fused GPU kernel): exp(x) - 1 near 0 keeps its digits, where rounding exp(x) to bf16
    first would leave 1.0625 - 1."""
    x, y = rand(3, 257, dtype=dtype) / 8, rand(257, dtype=dtype)

    def build(x_, y_):
        one = kb.scalar(1.0, ELEM[dtype])
        return kb.sub(kb.exp(x_), one), kb.add(kb.tanh(kb.mul(x_, y_)), kb.reciprocal(kb.add(y_, kb.scalar(3.0, ELEM[dtype]))))

    got = run_kf(build, x, y)
    want = [(torch.exp(x.float()) - 1).to(dtype), (torch.tanh(x.float() * y.float()) + 1 / (y.float() + 3)).to(dtype)]
    eps = torch.finfo(dtype).eps
    for g, w in zip(got, want):
        assert g.dtype == dtype
        # kf's f32 tanh/exp may differ from torch's by an f32 ulp, which can round to the
        # neighbouring bf16/f16 value; rounding between the ops differs in many elements
        torch.testing.assert_close(g.double(), w.double(), rtol=eps, atol=0)
        assert (g != w).double().mean() <= 0.01, f"{int((g != w).sum())} of {g.numel()} values differ"


def _bilinear_weight(dtype):
    return torch.randn(5, 7, 11, dtype=dtype)


#: ATen ops that kf lowers through torch-mlir: on bf16/f16 they compute in f32 and round
#: once, as torch's CPU kernels do (torch-mlir's own linalg accumulates and computes in bf16)
TORCH_MLIR_OPS = {
    "expm1": (lambda x, y, w: torch.expm1(x), (3, 257)),
    "log1p": (lambda x, y, w: torch.log1p(x.abs()), (3, 257)),
    "logaddexp2": (lambda x, y, w: torch.logaddexp2(x, y), (3, 257)),
    "avg_pool1d": (lambda x, y, w: torch.nn.functional.avg_pool1d(x, 3, stride=2), (2, 5, 37)),
    "avg_pool2d": (lambda x, y, w: torch.nn.functional.avg_pool2d(x, 3), (1, 3, 13, 11)),
    "l1_loss": (lambda x, y, w: torch.nn.functional.l1_loss(x, y), (7, 257)),
    "sum_to_size": (lambda x, y, w: x.sum_to_size(1, 257), (61, 257)),
    "bilinear": (lambda x, y, w: torch.nn.functional.bilinear(x[..., :7], y[..., :11], w), (3, 13)),
}
#: ops of the list that kf lowers itself (its own handlers, or torch's decompositions into
#: kf ops): the same precision is asked of them
KF_OPS = {"avg_pool1d", "avg_pool2d", "expm1", "log1p", "l1_loss", "logaddexp2", "sum_to_size"}
#: ops whose eager kernel rounds an intermediate to bf16/f16 (bilinear: x1 W, then the
#: product with x2): kf's one rounding is then only no further from float64 than eager
ROUNDS_INSIDE = {"bilinear"}


@pytest.mark.parametrize("dtype", LOW)
@pytest.mark.parametrize("name", sorted(TORCH_MLIR_OPS))
def test_torch_mlir_ops_compute_in_f32(name, dtype, tmp_path, monkeypatch):
    import kf

    if name not in KF_OPS:
        pytest.importorskip("torch_mlir", reason="the op lowers through torch-mlir (the fallback extra)")
    monkeypatch.setenv("KF_CACHE_DIR", str(tmp_path))
    fn, shape = TORCH_MLIR_OPS[name]
    x, y = torch.randn(shape).to(dtype), torch.randn(shape).to(dtype)
    w = _bilinear_weight(dtype)
    if name not in KF_OPS:
        assert "kf.aten" in kf.inspect(kf.jit(fn, target="cpu"), x, y, w).kf_ir  # it is a torch-mlir op
    got = kf.jit(fn, target="cpu")(x, y, w)
    want = fn(x, y, w)  # torch's CPU kernels: f32 math and accumulation, one rounding
    exact = fn(x.double(), y.double(), w.double())
    assert got.dtype == want.dtype and got.shape == want.shape
    # within one ulp of eager, and no further from float64 than eager is plus one ulp
    ulp = torch.finfo(dtype).eps * want.double().abs().clamp_min(torch.finfo(dtype).tiny)
    if name not in ROUNDS_INSIDE:
        assert ((got.double() - want.double()).abs() <= ulp * 1.01).all(), (got, want)
    assert ((got.double() - exact).abs() <= (want.double() - exact).abs() + ulp * 1.01).all(), (got, want)
