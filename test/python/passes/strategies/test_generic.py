"""The generic strategy (passes/strategies/generic.py) through kf-tile and kf-map-to-gpu,
run on every back end present against torch on fresh random inputs (gpu_harness.py):
elementwise ops, casts, reductions, softmax, matmul, layout ops, selection and indexing
(bad indices clamped and flagged), constants.

Shapes are not multiples of the block size (3×257, 1000, 7) so tails are exercised.
"""


from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from kf.dialects import TensorSpec, make_context, mlir_type
from kf.dialects import builders as kb
from kf.passes.map_to_gpu import MapToGpuPass
from kf.passes.tile import TilePass
from mlir import ir
from mlir.dialects import func

from gpu_harness import ELEM, FLOATS, TOL, check, in_f32, rand


# ----------------------------------------------------------------------------- elementwise ops (generic)

BINARY = {"add": torch.add, "sub": torch.sub, "mul": torch.mul, "div": torch.div, "max": torch.maximum,
          "min": torch.minimum, "pow": torch.pow}
SHAPES = [((3, 257), (257,)), ((3, 1), (1, 257)), ((1000,), ())]


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("shapes", SHAPES, ids=str)
@pytest.mark.parametrize("name", sorted(BINARY))
def test_binary_broadcast(run, name, shapes, dtype):
    a = rand(*shapes[0], dtype=dtype, positive=name == "pow")
    b = rand(*shapes[1], dtype=dtype)
    (got,) = run(lambda x, y: getattr(kb, name)(x, y), a, b)
    check(got, in_f32(BINARY[name], a, b))


@pytest.mark.parametrize("name", ["add", "sub", "mul", "max", "min"])
@pytest.mark.parametrize("dtype", [torch.int64, torch.int32])
def test_binary_integer(run, name, dtype):
    a = torch.randint(-50, 50, (3, 257), dtype=dtype)
    b = torch.randint(-50, 50, (257,), dtype=dtype)
    (got,) = run(lambda x, y: getattr(kb, name)(x, y), a, b)
    check(got, BINARY[name](a, b))


UNARY = {"neg": torch.neg, "abs": torch.abs, "exp": torch.exp, "log": torch.log, "sqrt": torch.sqrt,
         "rsqrt": torch.rsqrt, "reciprocal": torch.reciprocal, "tanh": torch.tanh, "erf": torch.erf,
         "sigmoid": torch.sigmoid, "relu": torch.relu}


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("name", sorted(UNARY))
def test_unary(run, name, dtype):
    a = rand(3, 257, dtype=dtype, positive=name in ("log", "sqrt", "rsqrt", "reciprocal"))
    (got,) = run(lambda x: getattr(kb, name)(x), a)
    check(got, in_f32(UNARY[name], a))


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_gelu(run, approximate):
    a = rand(1000) * 3
    (got,) = run(lambda x: kb.gelu(x, approximate=approximate), a)
    check(got, torch.nn.functional.gelu(a, approximate=approximate))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.int64])
@pytest.mark.parametrize("pred", ["eq", "ne", "lt", "le", "gt", "ge"])
def test_cmp(run, pred, dtype):
    a = torch.randint(-3, 3, (3, 257)).to(dtype)  # small integers: equal elements occur
    b = torch.randint(-3, 3, (257,)).to(dtype)
    (got,) = run(lambda x, y: kb.cmp(x, y, predicate=pred), a, b)
    check(got, getattr(torch, pred)(a, b))


@pytest.mark.parametrize("dtype", FLOATS)
def test_select_and_masked_fill(run, dtype):
    c = torch.rand(3, 257) > 0.5
    a, b = rand(3, 257, dtype=dtype), rand(257, dtype=dtype)
    m = torch.rand(3, 1) > 0.5
    sel, fill = run(lambda c_, x, y, m_: (kb.select(c_, x, y), kb.masked_fill(x, m_, value=-math.inf)),
                           c, a, b, m)
    check(sel, torch.where(c, a, b))
    check(fill, a.masked_fill(m, -math.inf))


CASTS = [(torch.float32, torch.float16), (torch.float16, torch.float32), (torch.float32, torch.bfloat16),
         (torch.bfloat16, torch.float16), (torch.float32, torch.int64), (torch.int64, torch.float32),
         (torch.bool, torch.float32), (torch.float32, torch.bool), (torch.int32, torch.int64)]


@pytest.mark.parametrize("src,dst", CASTS, ids=str)
def test_cast(run, src, dst):
    if src == torch.bool:
        a = torch.rand(1000) > 0.5
    elif src.is_floating_point:
        a = (rand(1000) * 10).to(src)
    else:
        a = torch.randint(-1000, 1000, (1000,), dtype=src)
    (got,) = run(lambda x: kb.cast(x, ELEM[dst]), a)
    check(got, a.to(dst))


def test_cast_rounds_inside_a_chain(run):
    """cast(x, f16) then back to f32 must round, even though values stay in f32 between ops."""
    a = rand(1000) * 1000
    (got,) = run(lambda x: kb.cast(kb.cast(x, "f16"), "f32"), a)
    check(got, a.half().float())


def test_booleans_follow_torch(run):
    a, b = torch.rand(3, 257) > 0.5, torch.rand(257) > 0.5
    got = run(lambda x, y: (kb.add(x, y), kb.mul(x, y), kb.cmp(x, y, predicate="lt"),
                                   kb.reduce_max(x, dims=[1]), kb.argmax(x, dim=1)), a, b)
    check(got[0], a + b)
    check(got[1], a * b)
    check(got[2], a < b)
    check(got[3], a.amax(1))
    check(got[4], a.to(torch.uint8).argmax(1))


# ----------------------------------------------------------------------------- reductions

REDUCE_DIMS = [([1], False), ([1], True), ([0], True), ([0, 1], False), ([-1], False)]


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("dims,keepdim", REDUCE_DIMS, ids=str)
@pytest.mark.parametrize("name", ["sum", "mean", "reduce_max", "reduce_min"])
def test_reduction(run, name, dims, keepdim, dtype):
    a = rand(3, 257, dtype=dtype)
    (got,) = run(lambda x: getattr(kb, name)(x, dims=dims, keepdim=keepdim), a)
    ref = {"sum": lambda x: x.sum(dims, keepdim=keepdim), "mean": lambda x: x.mean(dims, keepdim=keepdim),
           "reduce_max": lambda x: x.amax(dims, keepdim=keepdim),
           "reduce_min": lambda x: x.amin(dims, keepdim=keepdim)}[name]
    want = in_f32(ref, a)
    if name == "sum" and dims == [0, 1]:
        torch.testing.assert_close(got.double(), want.double(), rtol=1e-4, atol=1e-3)
    else:
        check(got, want)


def test_integer_and_bool_reductions_and_rank0(run):
    i = torch.randint(-100, 100, (1000,), dtype=torch.int64)
    m = torch.rand(3, 257) > 0.3
    s = rand()
    got = run(lambda x, y, z: (kb.reduce_max(x, dims=[0]), kb.sum(x, dims=[0]), kb.sum(y, dims=[1], elem="i64"),
                                      kb.sum(z, dims=[]), kb.softmax(z, dim=0), kb.argmax(z, dim=0)), i, m, s)
    check(got[0], i.amax(0))
    check(got[1], i.sum(0))
    check(got[2], m.sum(1))
    check(got[3], s.sum())
    check(got[4], torch.softmax(s, 0))
    check(got[5], s.argmax(0))


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("correction", [0.0, 1.0])
@pytest.mark.parametrize("dims,keepdim", [([1], True), ([0, 1], False), ([0], False)], ids=str)
def test_var(run, dims, keepdim, correction, dtype):
    a = rand(3, 257, dtype=dtype) * 2 + 100  # a large mean: the one-pass formula would fail here
    (got,) = run(lambda x: kb.var(x, dims=dims, correction=correction, keepdim=keepdim), a)
    check(got, in_f32(lambda x: x.var(dims, correction=correction, keepdim=keepdim), a))


@pytest.mark.parametrize("dtype", [*FLOATS, torch.int64])
@pytest.mark.parametrize("dim,keepdim", [(1, False), (0, True), (-1, True)], ids=str)
def test_argmax(run, dim, keepdim, dtype):
    a = torch.randperm(3 * 257).reshape(3, 257).to(dtype)
    if dtype == torch.bfloat16:
        a = torch.randperm(200)[:150].reshape(3, 50).to(dtype)  # bf16 holds integers to 256 exactly
    (got,) = run(lambda x: kb.argmax(x, dim=dim, keepdim=keepdim), a)
    check(got, a.argmax(dim, keepdim=keepdim))


def test_argmax_first_maximum_and_nan(run):
    a = torch.tensor([[1.0, 5.0, 5.0, 2.0], [1.0, float("nan"), 3.0, float("nan")], [-math.inf] * 4])
    (got,) = run(lambda x: kb.argmax(x, dim=1), a)
    check(got, torch.tensor([1, 1, 0]))


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("dim", [-1, 0])
@pytest.mark.parametrize("name", ["softmax", "log_softmax"])
def test_softmax(run, name, dim, dtype):
    a = rand(3, 257, dtype=dtype) * 40  # exp would overflow without the max subtraction
    (got,) = run(lambda x: getattr(kb, name)(x, dim=dim), a)
    check(got, in_f32(lambda x: getattr(torch, name)(x, dim), a))


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("dims,keepdim", [([-1], False), ([0], True), ([0, 1], False)])
def test_logsumexp(run, dims, keepdim, dtype):
    """torch.logsumexp, in f32 for 16-bit inputs: large values (the max subtracted), a row
    of -inf (-inf), a row holding +inf (+inf)."""
    a = rand(3, 257, dtype=dtype) * 40
    a[1] = -math.inf
    a[2, 5] = math.inf
    (got,) = run(lambda x: kb.logsumexp(x, dims=dims, keepdim=keepdim), a)
    check(got, torch.logsumexp(a.float(), dims, keepdim=keepdim))


# ----------------------------------------------------------------------------- matmul

MATMUL_SHAPES = [((3, 257), (257, 5)), ((2, 3, 7), (2, 7, 5)), ((4, 1, 3, 7), (5, 7, 6)), ((3, 7), (2, 7, 5))]


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("shapes", MATMUL_SHAPES, ids=str)
def test_matmul(run, shapes, dtype):
    a, b = rand(*shapes[0], dtype=dtype), rand(*shapes[1], dtype=dtype)
    (got,) = run(kb.matmul, a, b)
    rtol, atol = TOL[dtype]
    torch.testing.assert_close(got.double(), in_f32(torch.matmul, a, b).double(), rtol=rtol, atol=atol * 10)


def test_matmul_integer(run):
    a = torch.randint(-9, 9, (3, 7), dtype=torch.int64)
    b = torch.randint(-9, 9, (7, 5), dtype=torch.int64)
    (got,) = run(kb.matmul, a, b)
    check(got, a @ b)


# ----------------------------------------------------------------------------- layout


def test_transpose_reshape_broadcast(run):
    a = rand(2, 3, 7)
    got = run(lambda x: (kb.transpose(x, perm=[2, 0, 1]), kb.reshape(x, [7, 6]), kb.reshape(x, [42]),
                                kb.broadcast_to(kb.slice(x, dim=1, start=0, end=1), [5, 2, 3, 7]),
                                kb.reshape(x, [1, 42, 1])), a)
    check(got[0], a.permute(2, 0, 1))
    check(got[1], a.reshape(7, 6))
    check(got[2], a.reshape(42))
    check(got[3], a[:, 0:1].expand(5, 2, 3, 7).contiguous())
    check(got[4], a.reshape(1, 42, 1))


@pytest.mark.parametrize("dim,start,end,step", [(1, 3, 250, 1), (1, 1, 257, 3), (0, 1, 3, 1), (-1, 0, 257, 256)])
def test_slice(run, dim, start, end, step):
    a = rand(3, 257)
    (got,) = run(lambda x: kb.slice(x, dim=dim, start=start, end=end, step=step), a)
    idx = [slice(None)] * 2
    idx[dim] = slice(start, end, step)
    check(got, a[tuple(idx)].contiguous())


@pytest.mark.parametrize("dim", [0, 1, -1])
def test_concat(run, dim):
    shapes = {0: [(3, 7), (1, 7), (5, 7)], 1: [(3, 7), (3, 1), (3, 5)], -1: [(3, 7), (3, 1), (3, 5)]}[dim]
    xs = [rand(*s) for s in shapes]
    (got,) = run(lambda *vs: kb.concat(vs, dim=dim), *xs)
    check(got, torch.cat(xs, dim))


# ----------------------------------------------------------------------------- selection, indexing


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("k,dim,largest", [(3, -1, True), (1, 1, True), (2, 0, True), (4, -1, False)], ids=str)
def test_topk(run, k, dim, largest, dtype):
    a = (torch.randperm(3 * 257).reshape(3, 257).float() / 7).to(dtype)
    if dtype != torch.float32:
        a = torch.randperm(3 * 257).reshape(3, 257).to(dtype) if dtype == torch.float16 else \
            torch.randperm(200)[: 3 * 50].reshape(3, 50).to(dtype)
    vals, idxs = run(lambda x: kb.topk(x, k=k, dim=dim, largest=largest), a)
    want = torch.topk(a, k, dim, largest=largest)
    check(vals, want.values)
    check(idxs, want.indices)


def test_topk_ties_and_nan(run):
    a = torch.tensor([[1.0, 5.0, 5.0, 2.0, 5.0], [float("nan"), 1.0, float("nan"), 3.0, 0.0]])
    vals, idxs = run(lambda x: kb.topk(x, k=4, dim=1), a)
    assert idxs.tolist() == [[1, 2, 4, 3], [0, 2, 3, 1]]
    check(vals, torch.gather(a, 1, idxs))


def test_gather_and_index_select(run):
    a = rand(3, 257)
    gi = torch.randint(0, 257, (3, 100))
    si = torch.randint(0, 3, (5,), dtype=torch.int32)
    got = run(lambda x, g, s: (kb.gather(x, g, dim=1), kb.index_select(x, s, dim=0)), a, gi, si)
    check(got[0], torch.gather(a, 1, gi))
    check(got[1], torch.index_select(a, 0, si))


def test_indexing_along_inner_dims(run):
    a = rand(4, 9, 5)
    si = torch.tensor([8, 0, 3, 3])
    gi = torch.randint(0, 4, (2, 9, 5))
    src = rand(4, 9, 5)
    got = run(lambda x, s, g, u: (kb.index_select(x, s, dim=1), kb.gather(x, g, dim=0),
                                         kb.scatter_add(x, g, u, dim=0)), a, si, gi, src)
    check(got[0], a.index_select(1, si))
    check(got[1], torch.gather(a, 0, gi))
    check(got[2], a.scatter_add(0, gi, src))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16])
def test_index_add(run, dtype):
    a = rand(7, 33, dtype=dtype)
    index = torch.tensor([1, 6, 1, 0, 3])  # 1 twice: both sources land
    src = rand(5, 33, dtype=dtype)
    (got,) = run(lambda x, i, s: kb.index_add(x, i, s, dim=0), a, index, src)
    check(got, in_f32(lambda x, s: x.index_add(0, index, s), a, src))


def test_scatter_add(run):
    a = rand(3, 20)
    index = torch.randint(0, 20, (2, 11))  # fewer rows than a: rows past the index get nothing
    src = rand(3, 11)
    (got,) = run(lambda x, i, s: kb.scatter_add(x, i, s, dim=1), a, index, src)
    check(got, a.scatter_add(1, index, src))


@pytest.mark.parametrize("itype", [torch.int64, torch.int32])
@pytest.mark.parametrize("op", ["gather", "index_select", "index_add", "scatter_add"])
@pytest.mark.parametrize("bad", [7, -1, 2 ** 31 - 1, -(2 ** 31)])
def test_bad_index_is_clamped_and_sets_the_flag(run, op, itype, bad):
    """An index outside its dimension sets the error flag (set; site; value low, high) and
    is clamped: the kernel writes every output and touches nothing outside the input
    (an index of 2**31 - 1 would land far outside it)."""
    a = rand(7, 5)
    good = torch.tensor([[1, 6, 0, 2, 3]], dtype=itype)
    worse = good.clone()
    worse[0, 2] = bad
    builds = {
        "gather": lambda x, i: kb.gather(x, i, dim=0),
        "index_select": lambda x, i: kb.index_select(x, kb.reshape(i, [5]), dim=0),
        "index_add": lambda x, i: kb.index_add(x, kb.reshape(i, [5]), kb.slice(x, dim=0, start=0, end=5), dim=0),
        "scatter_add": lambda x, i: kb.scatter_add(x, i, x, dim=0),
    }
    flag: list = []
    (clean,) = run(builds[op], a, good)
    (got,) = run(builds[op], a, worse, flag=flag)
    wide = bad if itype == torch.int64 else int(torch.tensor(bad, dtype=torch.int32))
    assert flag == [1, 0, wide & 0xFFFFFFFF if wide & 0x80000000 == 0 else (wide & 0xFFFFFFFF) - 2 ** 32,
                    wide >> 32], flag
    assert not torch.isnan(got).any()  # written everywhere, from inside the input
    if op in ("gather", "index_select"):  # the bad index read row 0, the others their own
        want = clean.clone()
        if op == "index_select":
            want[2] = a[0]
        else:
            want[0, 2] = a[0, 2]
        check(got, want)


def test_empty_dimension_sets_the_flag_and_reads_nothing(run):
    a = torch.empty(0, 5)
    flag: list = []
    (got,) = run(lambda x, i: kb.index_select(x, i, dim=0), a, torch.tensor([0, 0]), flag=flag)
    assert flag[:3] == [1, 0, 0] and got.shape == (2, 5) and not torch.isnan(got).any()


def test_index_sites_are_numbered_across_kernels():
    """Two kernels of one module: the second's sites continue the first's numbers, and
    each gpu.func records its own (kf.index_sites) with the op, line, dim and bound."""
    specs = [TensorSpec((7, 5), "f32"), TensorSpec((3,), "i64")]
    ctx = make_context()
    with ctx, ir.Location.unknown():
        module = ir.Module.create()
        types = [mlir_type(s) for s in specs]
        kernels = []
        with ir.InsertionPoint(module.body):
            for name, dim in (("k0", 0), ("k1", 1)):
                @func.FuncOp.from_py_func(*types, name=name)
                def k(x, i, dim=dim):
                    loc = ir.Location.file("user.py", 10 + dim, 1)
                    return kb.index_select(x, i, dim=dim, loc=loc), kb.gather(x, kb.broadcast_to(
                        kb.reshape(i, [3, 1]), [3, 5]), dim=0, loc=loc)

                k.func_op.attributes["kf.kernel"] = ir.StringAttr.get("generic")
                k.func_op.attributes["sym_visibility"] = ir.StringAttr.get("private")
                kernels.append(k.func_op)
        TilePass(target="spirv").run(module.operation)
        MapToGpuPass(target="spirv").run(module.operation)
        [gm] = [op for op in module.body.operations if op.operation.name == "gpu.module"]
        sites = [[{a[j].name: a[j].attr for j in range(len(ir.DictAttr(a)))} for a in
                  ir.ArrayAttr(f.operation.attributes["kf.index_sites"])] for f in gm.regions[0].blocks[0].operations]
        assert [[int(ir.IntegerAttr(d["id"]).value) for d in fs] for fs in sites] == [[0, 1], [2, 3]]
        assert [ir.StringAttr(d["where"]).value for d in sites[1]] == ["user.py:11", "user.py:11"]
        assert [int(ir.IntegerAttr(d["bound"]).value) for d in sites[1]] == [5, 7]


def test_constant_and_fill(run):
    value = np.arange(21, dtype=np.float32).reshape(3, 7) / 3
    mask = np.array([[True, False, True, True, False, False, True]] * 3)
    a = rand(3, 7)

    def build(x):
        c = kb.constant(ir.DenseElementsAttr.get(value))
        m = kb.constant(ir.DenseElementsAttr.get(mask))
        return (kb.add(x, c), kb.fill([3, 7], "f16", 2.5), kb.mul(x, kb.scalar(-1.5, "f32")),
                kb.masked_fill(x, m, value=0.5))

    got = run(build, a)
    check(got[0], a + torch.from_numpy(value))
    check(got[1], torch.full((3, 7), 2.5, dtype=torch.float16))
    check(got[2], a * -1.5)
    check(got[3], a.masked_fill(torch.from_numpy(mask), 0.5))


# ---- run-time sizes (run_time_sizes.py): one program for every size, against torch --------

import kf  # noqa: E402
import kf.runtime.vulkan  # noqa: E402

_RUN_TIME_TARGETS = ["cpu", pytest.param("vulkan", marks=pytest.mark.skipif(
    not kf.runtime.vulkan.is_available(), reason="no Vulkan device"))]


def _rope_heads(x, cos, sin):
    x = x.transpose(1, 2)  # [1, S, H, D] -> [1, H, S, D]: the sequence after the heads
    half = x.shape[-1] // 2
    rot = torch.cat((-x[..., half:], x[..., :half]), dim=-1)
    return x * cos + rot * sin


def _column_sums(x, y):
    return (x * y).sum(0), x.t().contiguous(), x.mean(0)


def _broadcast_transpose(x, b):
    return (x + b).transpose(0, 1) * 2.0


RUN_TIME_CASES = {
    "rope": (_rope_heads, lambda s: (torch.randn(1, s, 4, 16), torch.randn(s, 16), torch.randn(s, 16)),
             {"x": [1], "cos": [0], "sin": [0]}),
    "columns": (_column_sums, lambda s: (torch.randn(s, 24), torch.randn(s, 24)), {"x": [0], "y": [0]}),
    "broadcast": (_broadcast_transpose, lambda s: (torch.randn(s, 3, 8), torch.randn(3, 8)), {"x": [0]}),
}


@pytest.mark.parametrize("target", _RUN_TIME_TARGETS)
@pytest.mark.parametrize("case", sorted(RUN_TIME_CASES))
def test_run_time_sizes_one_program(target, case, tmp_path, monkeypatch):
    """The generic strategy with run-time sizes: transposes that put the run-time dim
    after the heads (run-time strides, flat buffers), the rotary embedding's slices and
    cat, column sums and means over run-time rows, broadcasts: one program for 7, 257,
    300 and 2, against torch."""
    monkeypatch.setenv("KF_CACHE_DIR", str(tmp_path / "cache"))
    fn, make, dyn = RUN_TIME_CASES[case]
    f = kf.jit(fn, target=target, dynamic=dyn)
    for s in (7, 257, 300, 2):
        args = make(s)
        got, want = f(*args), fn(*args)
        for g, w in zip(got if isinstance(got, tuple) else (got,), want if isinstance(want, tuple) else (want,)):
            torch.testing.assert_close(g, w, atol=1e-4, rtol=1e-4)
    fresh = [c for c in f.compiles if not c.cached]
    assert len(fresh) == 1 and "?" in fresh[0].signature, [c.signature for c in f.compiles]


@pytest.mark.parametrize("case", ["rope", "columns"])
def test_run_time_kernels_assemble_for_sm_90a(case):
    """The generic strategy's kernels with run-time sizes lower to PTX that ptxas
    assembles for sm_90a, with size slots and a grid over them, without spills."""
    from kf.driver import build
    from kf.options import Options
    from kf.passes.to_cuda import assemble, ptxas_path
    from kf.runtime.abi import ProgramABI
    from kf.signature import bind

    if not ptxas_path():
        pytest.skip("needs ptxas")
    fn, make, dyn = RUN_TIME_CASES[case]
    sig, tensors = bind(fn, make(7), {})
    sig = sig.generalize({(name, d) for name, dims in dyn.items() for d in dims}, 16)
    meta, artifacts = build(fn, sig, tensors, Options(target="cuda"), "sm_90a")
    abi = ProgramABI.from_json(meta["abi"])
    assert not abi.is_static and any(k.extra.get("strategy") == "generic" for k in abi.kernels)
    assert all(k.sizes and k.grid_sizes for k in abi.kernels)
    ptx = next(v for k, v in artifacts.items() if k.endswith(".ptx")).decode()
    assert all(k["spill_store_bytes"] == 0 for k in assemble(ptx, "sm_90a").kernels.values())
