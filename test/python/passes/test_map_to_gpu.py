"""kf-tile + kf-map-to-gpu end to end: kernel functions built by hand with
kf.dialects.builders (a ``func.func private`` with ``kf.kernel``, called by a host
function, as kf-fuse makes them) are planned, written as gpu.funcs by the generic and
elementwise strategies and run against torch on fresh random inputs, with outputs
poisoned beforehand, on every back end present (the ``run`` fixture): kf-to-spirv on the
Vulkan device (lavapipe on CPU-only machines) and kf-to-cuda through runtime/cuda.py on
a CUDA GPU. Without a GPU, the CUDA side is checked by assembling PTX with ptxas (sm_90).

Shapes are not multiples of the block size (3×257, 1000, 7) so tails are exercised.
Low-precision results are compared with torch computing in f32 and rounding once, kf's
precision policy.
"""

from __future__ import annotations

import math
import re
import shutil

import numpy as np
import pytest
import torch
from kf.dialects import TensorSpec, make_context, mlir_type
from kf.dialects import builders as kb
from kf.passes.map_to_gpu import MapToGpuPass
from kf.passes.tile import TilePass, attr_to_plan, plan_to_attr
from kf.passes.to_cuda import assemble, compile_to_ptx, ptxas_path
from kf.passes.to_spirv import compile_spirv
from kf.runtime import cuda as kcuda
from kf.runtime import vulkan
from kf.runtime.abi import KernelABI
from mlir import ir
from mlir.dialects import func

needs_ptxas = pytest.mark.skipif(ptxas_path() is None, reason="ptxas not installed")

ELEM = {torch.float32: "f32", torch.float16: "f16", torch.bfloat16: "bf16", torch.float64: "f64",
        torch.int64: "i64", torch.int32: "i32", torch.bool: "i1", torch.float8_e4m3fn: "f8E4M3FN",
        torch.float8_e5m2: "f8E5M2"}
TORCH = {v: k for k, v in ELEM.items()}
TOL = {torch.float32: (2e-5, 2e-5), torch.float16: (2e-3, 2e-3), torch.bfloat16: (1.6e-2, 1.6e-2)}
LOW = [torch.float16, torch.bfloat16]
FLOATS = [torch.float32, *LOW]


# ----------------------------------------------------------------------------- harness


def build_module(build, specs, kind="generic", plan_edit=None, target="spirv"):
    """A module holding kernel function @k (kind) of ``build(*values)`` and host @main
    calling it, after kf-tile and kf-map-to-gpu for target. Returns (ctx, module)."""
    ctx = make_context()
    with ctx, ir.Location.unknown():
        module = ir.Module.create()
        types = [mlir_type(s) for s in specs]
        with ir.InsertionPoint(module.body):
            @func.FuncOp.from_py_func(*types, name="k")
            def k(*args):
                out = build(*args)
                return tuple(out) if isinstance(out, (tuple, list)) else out

            kernel = k.func_op
            kernel.attributes["sym_visibility"] = ir.StringAttr.get("private")
            kernel.attributes["kf.kernel"] = ir.StringAttr.get(kind)
            kernel.attributes["kf.fused_lines"] = ir.ArrayAttr.get([ir.StringAttr.get("test.py:1")])

            @func.FuncOp.from_py_func(*types, name="main")
            def main(*args):
                return func.CallOp(kernel, list(args)).results

        TilePass(target=target).run(module.operation)
        if plan_edit is not None:
            plan = attr_to_plan(kernel.attributes["kf.plan"])
            plan_edit(plan)
            kernel.attributes["kf.plan"] = plan_to_attr(plan)
        MapToGpuPass(target=target).run(module.operation)
    return ctx, module


def gpu_func(module):
    [gm] = [op for op in module.body.operations if op.operation.name == "gpu.module"]
    [f] = [op.operation for op in gm.regions[0].blocks[0].operations]
    return f


def run_vulkan(build, *inputs, kind="generic", plan_edit=None, flag=None):
    """Compile build for the inputs' shapes and dtypes and run it on Vulkan. A kernel
    that checks indices gets a zeroed error flag, last; it must stay 0 unless ``flag``
    (a list) is given, which then receives the flag's words."""
    specs = [TensorSpec(tuple(t.shape), ELEM[t.dtype]) for t in inputs]
    ctx, module = build_module(build, specs, kind, plan_edit)
    with ctx:
        f = gpu_func(module)
        grid = tuple(ir.DenseI64ArrayAttr(f.attributes["kf.grid"]))
        ftype = ir.FunctionType(ir.TypeAttr(f.attributes["function_type"]).value)
        flagged = "kf.index_sites" in f.attributes
        outs = [ir.MemRefType(t) for t in ftype.inputs[len(inputs):len(ftype.inputs) - flagged]]
        out_specs = [(tuple(t.shape), str(t.element_type)) for t in outs]
        [binary] = compile_spirv(module)
    [kernel] = binary.kernels.values()
    outputs = [_sentinel(shape, TORCH[e]) for shape, e in out_specs]
    words = [torch.zeros(4, dtype=torch.int32)] if flagged else []
    abi = KernelABI(kernel.entry, tuple(range(len(inputs) + len(outputs) + len(words))), grid=grid,
                    block=kernel.workgroup_size, extra=kernel.abi_extra())
    args = [t.contiguous() for t in inputs] + outputs + words
    vulkan.launch(binary.binary, abi, args, written=list(range(len(inputs), len(args))))
    _flag_words(words, flag)
    return tuple(outputs)


def _flag_words(words, flag):
    if flag is not None:
        flag.extend(words[0].tolist() if words else [])
    elif words:
        assert not any(words[0].tolist()), f"a kernel reported a bad index: {words[0].tolist()}"


def has_cuda() -> bool:
    return kcuda._drv is not None and torch.cuda.is_available()


def run_cuda(build, *inputs, kind="generic", plan_edit=None, flag=None):
    """Compile build with kf-to-cuda and launch it through runtime/cuda.py on the GPU
    (the error flag as run_vulkan's)."""
    specs = [TensorSpec(tuple(t.shape), ELEM[t.dtype]) for t in inputs]
    ctx, module = build_module(build, specs, kind, plan_edit, target="cuda")
    with ctx:
        f = gpu_func(module)
        flagged = "kf.index_sites" in f.attributes
        grid = tuple(ir.DenseI64ArrayAttr(f.attributes["kf.grid"]))
        block = tuple(ir.DenseI64ArrayAttr(f.attributes["kf.block"]))
        [decl] = [op.operation for op in module.body.operations if op.operation.name == "func.func"
                  and "kf.kernel" in op.operation.attributes]
        results = ir.FunctionType(ir.TypeAttr(decl.attributes["function_type"]).value).results
        out_specs = [(tuple(ir.RankedTensorType(t).shape), str(ir.RankedTensorType(t).element_type)) for t in results]
        ptx = compile_to_ptx(module)["kf_kernels"]
    outputs = [_sentinel(shape, TORCH[e]).cuda() for shape, e in out_specs]
    words = [torch.zeros(4, dtype=torch.int32, device="cuda")] if flagged else []
    kernel = kcuda.CudaKernel(kcuda.CudaModule(ptx), "k", grid, block, 0,
                              args=len(inputs) + len(outputs) + len(words))
    kernel(*[t.contiguous().cuda() for t in inputs], *outputs, *words)
    torch.cuda.synchronize()
    _flag_words([w.cpu() for w in words], flag)
    return tuple(o.cpu() for o in outputs)


@pytest.fixture(params=["vulkan", "cuda"])
def run(request):
    """The runner of one back end: SPIR-V on Vulkan (lavapipe here), PTX on a CUDA GPU."""
    if request.param == "vulkan":
        if not vulkan.is_available():
            pytest.skip("no Vulkan device (install mesa-vulkan-drivers)")
        return run_vulkan
    if not has_cuda():
        pytest.skip("no CUDA device (or cuda-python missing)")
    return run_cuda


def _sentinel(shape, dtype):
    """Outputs start as garbage, so an element the kernel forgets to write fails."""
    if dtype.is_floating_point:
        return torch.full(shape, float("nan"), dtype=dtype)
    if dtype == torch.bool:
        return torch.ones(shape, dtype=dtype) if len(shape) else torch.tensor(True)
    return torch.full(shape, -12345, dtype=dtype)


def check(got, want):
    assert got.dtype == want.dtype and got.shape == want.shape, (got.dtype, got.shape, want.dtype, want.shape)
    if want.dtype in TOL:
        rtol, atol = TOL[want.dtype]
        torch.testing.assert_close(got.double(), want.double(), rtol=rtol, atol=atol, equal_nan=True)
    else:
        assert torch.equal(got, want), (got, want)


def rand(*shape, dtype=torch.float32, positive=False):
    x = torch.randn(tuple(shape), dtype=torch.float32)
    if positive:
        x = x.abs() + 0.25
    return x.to(dtype)


def in_f32(fn, *xs, out_dtype=None):
    ys = fn(*[x.float() if x.is_floating_point() else x for x in xs])
    dtype = out_dtype or xs[0].dtype
    return tuple(y.to(dtype) if y.is_floating_point() else y for y in ys) if isinstance(ys, tuple) else (
        ys.to(dtype) if ys.is_floating_point() else ys)


# ----------------------------------------------------------------------------- plans and IR


def test_plans():
    ctx, m = build_module(lambda a, b: kb.add(a, b), [TensorSpec((1000,), "f32")] * 2, "elementwise")
    with ctx:
        decl = next(op.operation for op in m.body.operations if op.operation.name == "func.func")
        plan = attr_to_plan(decl.attributes["kf.plan"])
        assert plan == {"strategy": "elementwise", "target": "spirv", "block": 256, "vector_width": 4,
                        "numel": 1000, "grid": 1, "grid_stride": False}
        assert len(decl.regions[0].blocks) == 0  # a declaration now
        assert str(decl.attributes["kf.gpu_func"]) == "@kf_kernels::@k"
        f = gpu_func(m)
        assert list(ir.DenseI64ArrayAttr(f.attributes["kf.block"])) == [256, 1, 1]
        assert str(f.attributes["kf.fused_lines"]) == '["test.py:1"]'
    # A kernel of another kind that the elementwise strategy refuses falls back to generic.
    ctx, m = build_module(lambda a: kb.sum(a, dims=[1]), [TensorSpec((3, 257), "f32")], "elementwise")
    with ctx:
        assert ir.StringAttr(gpu_func(m).attributes["kf.strategy"]).value == "generic"


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


# ----------------------------------------------------------------------------- DAGs, geometry


@pytest.mark.parametrize("dtype", FLOATS)
def test_layer_norm_dag(run, dtype):
    x, w, b = rand(3, 257, dtype=dtype), rand(257, dtype=dtype), rand(257, dtype=dtype)

    def build(x_, w_, b_):
        mean = kb.mean(x_, dims=[-1], keepdim=True)
        var = kb.var(x_, dims=[-1], correction=0.0, keepdim=True)
        y = kb.div(kb.sub(x_, mean), kb.sqrt(kb.add(var, kb.scalar(1e-5, ELEM[dtype]))))
        return kb.add(kb.mul(y, w_), b_)

    (got,) = run(build, x, w, b)
    want = torch.nn.functional.layer_norm(x.float(), (257,), w.float(), b.float(), eps=1e-5).to(dtype)
    rtol, atol = TOL[dtype]
    torch.testing.assert_close(got.double(), want.double(), rtol=rtol * 4, atol=atol * 4)


def test_attention_dag_with_results_of_two_shapes(run):
    q, k, v = rand(2, 37, 16), rand(2, 37, 16), rand(2, 37, 16)
    mask = torch.rand(37, 37) > 0.8
    mask[:, 0] = False

    def build(q_, k_, v_, m_):
        s = kb.div(kb.matmul(q_, kb.transpose(k_, perm=[0, 2, 1])), kb.scalar(4.0, "f32"))
        p = kb.softmax(kb.masked_fill(s, m_, value=-math.inf), dim=-1)
        return kb.matmul(p, v_), kb.reduce_max(s, dims=[-1])

    out, smax = run(build, q, k, v, mask)
    s = q @ k.transpose(-1, -2) / 4.0
    torch.testing.assert_close(out, torch.softmax(s.masked_fill(mask, -math.inf), -1) @ v, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(smax, s.amax(-1))


def test_grid_stride_from_an_edited_plan(run):
    """A recorded plan is what kf-map-to-gpu follows: 2 blocks striding over 1000 elements."""
    a = rand(1000)

    def edit(plan):
        plan.update(grid=2, grid_stride=True)

    for kind in ("generic", "elementwise"):
        (got,) = run(lambda x: kb.exp(kb.neg(x)), a, kind=kind, plan_edit=edit)
        check(got, torch.exp(-a))


def test_returned_input_and_value_returned_twice(run):
    a = rand(3, 257)
    got = run(lambda x: (kb.relu(x), x, kb.relu(x)), a)
    check(got[0], a.relu())
    check(got[1], a)
    check(got[2], a.relu())


def test_plan_for_another_target_is_remade(run):
    """A plan recorded for the other target (here: 16 f16 lanes, which neither takes) is
    not followed."""
    a = rand(4, 64, dtype=torch.float16)

    def edit(plan):
        plan.update(target="spirv" if plan["target"] == "cuda" else "cuda", vector_width=16)

    (got,) = run(lambda x: kb.tanh(x), a, kind="elementwise", plan_edit=edit)
    check(got, in_f32(torch.tanh, a))


# ----------------------------------------------------------------------------- elementwise strategy

CHAINS = {
    "silu_bias": (lambda x, b: kb.mul(kb.add(x, b), kb.sigmoid(kb.add(x, b))),
                  lambda x, b: torch.nn.functional.silu(x + b), [(3, 256), (256,)]),
    "gelu_scale": (lambda x, s: kb.mul(kb.gelu(x), s), lambda x, s: torch.nn.functional.gelu(x) * s,
                   [(7, 64), (7, 1)]),
    "tail": (lambda x, y: kb.sub(kb.exp(x), kb.tanh(y)), lambda x, y: torch.exp(x) - torch.tanh(y),
             [(1000,), (1000,)]),
    "scalar": (lambda x, y: kb.relu(kb.mul(x, y)), lambda x, y: torch.relu(x * y), [(5, 3, 8), ()]),
}


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("chain", sorted(CHAINS))
def test_elementwise_chain(run, chain, dtype):
    build, ref, shapes = CHAINS[chain]
    xs = [rand(*s, dtype=dtype) for s in shapes]
    (got,) = run(build, *xs, kind="elementwise")
    want = in_f32(ref, *xs)
    rtol, atol = TOL[dtype]
    torch.testing.assert_close(got.double(), want.double(), rtol=rtol * 2, atol=atol * 2)


def test_elementwise_several_results_and_masks(run):
    x, y = rand(3, 257), rand(3, 257)
    m = torch.rand(3, 257) > 0.5
    got = run(lambda a, b, c: (kb.select(c, a, b), kb.cmp(a, b, predicate="gt"), kb.add(a, b)), x, y, m,
                     kind="elementwise")
    check(got[0], torch.where(m, x, y))
    check(got[1], x > y)
    check(got[2], x + y)


def _plan_of(m):
    decl = next(op.operation for op in m.body.operations if op.operation.name == "func.func")
    return attr_to_plan(decl.attributes["kf.plan"])


def test_elementwise_items_per_thread_plans():
    """On CUDA a thread takes two vectors (ITEMS_PER_THREAD) where there are two blocks'
    worth; elsewhere, without vectors or with little work, one."""
    specs = [TensorSpec((64, 8192), "bf16"), TensorSpec((8192,), "bf16")]
    ctx, m = build_module(lambda a, b: kb.gelu(kb.add(a, b)), specs, "elementwise", target="cuda")
    with ctx:
        plan = _plan_of(m)
        assert plan["vector_width"] == 8 and plan["items_per_thread"] == 2 and plan["grid"] == 64 * 8192 // 8 // 2 // 256
        assert ir.StringAttr(gpu_func(m).attributes["kf.strategy"]).value == "elementwise"
    for target, shape, elem in (("spirv", (64, 8192), "f32"), ("cuda", (1000,), "f32"), ("cuda", (3, 1001), "f32")):
        ctx, m = build_module(lambda a: kb.exp(a), [TensorSpec(shape, elem)], "elementwise", target=target)
        with ctx:
            assert "items_per_thread" not in _plan_of(m), (target, shape)


@pytest.mark.parametrize("per,shape", [(2, (5, 1000)), (3, (5, 1000)), (2, (4, 1024)), (4, (3, 2048))],
                         ids=["tail", "tail-after-two", "exact", "exact4"])
def test_elementwise_items_per_thread(run, per, shape):
    """Several vectors a thread, from an edited plan (CUDA makes two itself): every element
    written once (the outputs start as NaN), passes past the end guarded, the stores of
    the unguarded passes after all of them, a broadcast operand and two outputs."""
    x, b = rand(*shape), rand(shape[-1])

    def edit(plan):
        items = plan["numel"] // plan["vector_width"]
        plan.update(items_per_thread=per, grid=-(-items // (per * plan["block"])), grid_stride=False)

    got = run(lambda a, c: (kb.gelu(kb.add(a, c)), kb.mul(a, c)), x, b, kind="elementwise", plan_edit=edit)
    check(got[0], torch.nn.functional.gelu(x + b))
    check(got[1], x * b)
    xh, bh = x.to(torch.float16), b.to(torch.float16)
    (got,) = run(lambda a, c: kb.sigmoid(kb.add(a, c)), xh, bh, kind="elementwise", plan_edit=edit)
    check(got, in_f32(lambda u, v: torch.sigmoid(u + v), xh, bh))


def test_passes_leave_declarations_alone():
    """Running kf-tile and kf-map-to-gpu again finds no kernel function left to write."""
    ctx, m = build_module(lambda a: kb.exp(a), [TensorSpec((1000,), "f32")], "elementwise")
    with ctx:
        before = str(m)
        TilePass(target="spirv").run(m.operation)
        MapToGpuPass(target="spirv").run(m.operation)
        assert str(m) == before


@pytest.mark.parametrize("build,ref", [
    (lambda x, w: kb.var(kb.mul(x, w), dims=[1], correction=1.0), lambda x, w: (x * w).var(1)),
    (lambda x, w: kb.softmax(kb.add(x, w), dim=-1), lambda x, w: torch.softmax(x + w, -1)),
], ids=["var", "softmax"])
def test_f64(run, build, ref):
    if run is run_vulkan:
        pytest.skip("kf-to-spirv does not ask Vulkan for Float64")
    x, w = torch.randn(3, 257, dtype=torch.float64), torch.randn(257, dtype=torch.float64)
    (got,) = run(build, x, w)
    torch.testing.assert_close(got, ref(x, w), rtol=1e-12, atol=1e-12)


# ----------------------------------------------------------------------------- fp8 (CUDA only)

FP8 = [torch.float8_e4m3fn, torch.float8_e5m2]


def check_fp8(got, want):
    """Bit for bit, except that any NaN matches any NaN."""
    assert got.dtype == want.dtype and got.shape == want.shape
    g, w = got.view(torch.uint8), want.view(torch.uint8)
    nan = got.float().isnan() & want.float().isnan()
    bad = (g != w) & ~nan
    assert not bad.any(), (got.float()[bad][:8], want.float()[bad][:8], g[bad][:8], w[bad][:8])


def saturating_fp8(a: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """torch's conversion to fp8, with e4m3fn saturating past its largest finite value
    as torch 2.13 does (and kf, and the hardware's satfinite conversion); torch 2.11's
    c10 encoder gives NaN there instead."""
    want = a.to(dtype)
    if dtype != torch.float8_e4m3fn:
        return want
    fmax = torch.finfo(dtype).max
    past = (a.isinf() | (a.abs() >= 464)) & ~a.isnan()
    return torch.where(past, torch.sign(a) * fmax, want.float()).to(dtype)


def _skip_spirv(run):
    if run is run_vulkan:
        pytest.skip("kf-to-spirv stores no fp8 (no Vulkan storage type for it)")


@pytest.mark.parametrize("chip", ["sm_80", "sm_90"])
@pytest.mark.parametrize("dtype", FP8, ids=str)
def test_fp8_store_is_one_cvt_from_sm_89(dtype, chip):
    """kf-to-cuda lowers a store's f32 -> f8E4M3FN to cvt.rn.satfinite.e4m3x2.f32 on
    sm_89+ (the integer encoder made fp8's quantization integer-bound); e5m2 (torch lets
    it overflow to inf, satfinite would not) and older chips keep the encoder. The
    elementwise kernel of a bf16 quantization takes 16-byte loads: its f32 scale, rank 0,
    does not narrow the vector."""
    from kf.passes.to_cuda import compile_to_ptx

    def quantize(x, s):
        return kb.cast(kb.min(kb.max(kb.mul(kb.cast(x, "f32"), s), kb.scalar(-448.0, "f32")),
                              kb.scalar(448.0, "f32")), ELEM[dtype])

    ctx, module = build_module(quantize, [TensorSpec((64, 256), "bf16"), TensorSpec((), "f32")], "elementwise",
                               target="cuda")
    with ctx:
        ptx = compile_to_ptx(module, chip=chip)["kf_kernels"]
    cvts = ptx.count("cvt.rn.satfinite.e4m3x2.f32")
    fast = dtype == torch.float8_e4m3fn and chip == "sm_90"
    # the encoder's subnormal alignment adds 2^14 (e4m3) or 2^7 (e5m2)
    encoder = {torch.float8_e4m3fn: "0f46800000", torch.float8_e5m2: "0f43000000"}[dtype] in ptx
    assert (cvts > 0) == fast and encoder != fast, (cvts, encoder)
    assert "ld.global.v4.b32" in ptx  # 8 bf16 lanes


@pytest.mark.parametrize("kind", ["generic", "elementwise"])
@pytest.mark.parametrize("dtype", FP8, ids=str)
def test_fp8_rounds_like_torch(run, dtype, kind):
    _skip_spirv(run)
    fmax = torch.finfo(dtype).max
    tiny = torch.finfo(dtype).tiny
    specials = torch.tensor([0.0, -0.0, math.inf, -math.inf, math.nan, fmax, fmax * 1.03, fmax * 1.07, fmax * 2, 1e30,
                             tiny, tiny / 3, tiny / 8, tiny / 16, -tiny / 7, 1.0625, 1.1875, 3.0e-3, 1e-9])
    a = torch.cat([torch.randn(1000) * 4, torch.randn(500) * tiny * 4, specials, -specials])
    (got,) = run(lambda x: kb.cast(x, ELEM[dtype]), a, kind=kind)
    check_fp8(got, saturating_fp8(a, dtype))


@pytest.mark.parametrize("dtype", FP8, ids=str)
def test_fp8_rounding_inside_a_chain(run, dtype):
    """cast to fp8 and back, between f32 tensors: no fp8 buffer, so it runs on every back
    end, and the encoder and decoder meet torch's on every kind of value."""
    fmax, tiny = torch.finfo(dtype).max, torch.finfo(dtype).tiny
    specials = torch.tensor([0.0, -0.0, math.inf, -math.inf, math.nan, fmax, fmax * 1.03, fmax * 1.07, fmax * 2, 1e30,
                             tiny, tiny / 3, tiny / 8, tiny / 16, 1.0625, 1.1875, 3.0e-3, 1e-9])
    a = torch.cat([torch.randn(2000) * 4, torch.randn(1000) * tiny * 4, torch.linspace(fmax * 0.9, fmax * 1.2, 999),
                   specials, -specials])
    (got,) = run(lambda x: kb.cast(kb.cast(x, ELEM[dtype]), "f32"), a)
    torch.testing.assert_close(got, saturating_fp8(a, dtype).float(), rtol=0, atol=0, equal_nan=True)


@pytest.mark.parametrize("dtype", FP8, ids=str)
def test_fp8_every_value_widens_exactly(run, dtype):
    _skip_spirv(run)
    a = torch.arange(256, dtype=torch.uint8).view(dtype).reshape(16, 16)
    got = run(lambda x: (kb.cast(x, "f32"), kb.cast(x, "f16")), a)
    torch.testing.assert_close(got[0], a.float(), rtol=0, atol=0, equal_nan=True)
    torch.testing.assert_close(got[1], a.half(), rtol=0, atol=0, equal_nan=True)


@pytest.mark.parametrize("kind", ["elementwise", "generic"])
@pytest.mark.parametrize("dtype", FP8, ids=str)
def test_fp8_chain_computes_in_f32(run, dtype, kind):
    _skip_spirv(run)
    x, b = (torch.randn(7, 64) * 3).to(dtype), torch.randn(64).to(dtype)
    (got,) = run(lambda u, v: kb.mul(kb.add(u, v), kb.sigmoid(u)), x, b, kind=kind)
    check_fp8(got, ((x.float() + b.float()) * torch.sigmoid(x.float())).to(dtype))


# ----------------------------------------------------------------------------- CUDA (ptxas, no GPU)

PTX_CASES = {
    "elementwise_vec": (lambda x, b: kb.mul(kb.add(x, b), kb.sigmoid(x)), [((3, 256), "f32"), ((256,), "f32")],
                        "elementwise"),
    "elementwise_bf16": (lambda x, b: kb.gelu(kb.add(x, b)), [((3, 256), "bf16"), ((256,), "bf16")], "elementwise"),
    "elementwise_bool": (lambda x, y: kb.cmp(x, y, predicate="lt"), [((1000,), "f16"), ((1000,), "f16")],
                         "elementwise"),
    "softmax": (lambda x: kb.softmax(x, dim=-1), [((3, 257), "f16")], "generic"),
    "var_argmax": (lambda x: (kb.var(x, dims=[1]), kb.argmax(x, dim=0)), [((3, 257), "f32")], "generic"),
    "matmul": (kb.matmul, [((4, 1, 3, 7), "bf16"), ((5, 7, 6), "bf16")], "generic"),
    "topk": (lambda x: kb.topk(x, k=3, dim=-1), [((3, 257), "f32")], "generic"),
    "layout": (lambda x, y: kb.concat([kb.transpose(x, perm=[1, 0]), kb.reshape(kb.slice(y, dim=0, start=1, end=7,
               step=2), [7, 3])], dim=1), [((3, 7), "f32"), ((7, 7), "f32")], "generic"),
    "indexing": (lambda x, i, s: (kb.gather(x, i, dim=1), kb.scatter_add(x, i, s, dim=1),
                                  kb.index_select(x, kb.reshape(kb.slice(i, dim=1, start=0, end=1), [3]), dim=0)),
                 [((3, 20), "f32"), ((3, 11), "i64"), ((3, 11), "f32")], "generic"),
    "index_add": (lambda x, i, s: kb.index_add(x, i, s, dim=0), [((7, 33), "f16"), ((5,), "i64"), ((5, 33), "f16")],
                  "generic"),
    "mask_constant": (lambda x: kb.masked_fill(x, kb.constant(ir.DenseElementsAttr.get(
        np.array([True, False, True]))), value=0.0), [((4, 3), "f32")], "generic"),
    "grid_stride": (lambda x: kb.exp(x), [((8192, 4096), "f32")], "generic"),
    "fp8": (lambda x, y: kb.cast(kb.add(kb.cast(x, "f32"), y), "f8E5M2"), [((4, 64), "f8E4M3FN"), ((64,), "f32")],
            "elementwise"),
}


@needs_ptxas
@pytest.mark.parametrize("case", sorted(PTX_CASES))
def test_ptxas_sm90(case):
    build, specs, kind = PTX_CASES[case]
    ctx, module = build_module(build, [TensorSpec(s, e) for s, e in specs], kind, target="cuda")
    with ctx:
        ptx = compile_to_ptx(module)["kf_kernels"]
    assert ".entry k(" in ptx
    report = assemble(ptx, "sm_90")
    assert report.kernels["k"]["spill_store_bytes"] == 0
    if case == "elementwise_vec":
        assert re.search(r"ld\.global\.v4\.[bf]32", ptx) and re.search(r"st\.global\.v4\.[bf]32", ptx)


# ---- the transpose strategy (passes/strategies/transpose.py)

TRANSPOSES = [((3, 70, 130), "bf16", "f8E4M3FN"), ((64, 128), "f32", "f32"), ((2, 2, 129, 64), "f16", "bf16"),
              ((1, 5, 200), "f32", "f16")]


def _swap_last_two(x):
    r = len(x.type.shape)
    return kb.transpose(x, perm=list(range(r - 2)) + [r - 1, r - 2])


@pytest.mark.parametrize("shape,elem,out", TRANSPOSES, ids=str)
def test_transpose_kernel_matches_torch(run, shape, elem, out):
    """x^T * s cast to out, fresh random values, shapes that are not multiples of the
    tile included (the guarded edges); the tiled kernel on CUDA (64x64) and on Vulkan
    (32x32). Bit for bit: both compute x * s in f32, rounded once."""
    if out.startswith("f8"):
        _skip_spirv(run)
    x, s = (torch.randn(*shape) * 3).to(TORCH[elem]), torch.tensor(1.7)
    (got,) = run(lambda a, c: kb.cast(kb.mul(kb.cast(_swap_last_two(a), "f32"), c), out), x, s, kind="transpose")
    want = (x.float().transpose(-1, -2) * s).to(TORCH[out])
    if out.startswith("f8"):
        check_fp8(got, want)
    else:
        torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_transpose_kernel_goes_through_workgroup_memory():
    """On CUDA the tile: coalesced global loads and stores (pairs: the input is bf16 and
    both dims even), one barrier, the rank-0 scale loaded once, e4m3 by cvt; ptxas: no
    spills, the 64x65 f32 tile. On SPIR-V (16 KiB guaranteed) a 32x33 tile."""
    from kf.passes.to_cuda import assemble, compile_to_ptx

    def build(a, c):
        return kb.cast(kb.mul(kb.cast(_swap_last_two(a), "f32"), c), "f8E4M3FN")

    specs = [TensorSpec((4, 300, 128), "bf16"), TensorSpec((), "f32")]
    ctx, module = build_module(build, specs, "transpose", target="cuda")
    with ctx:
        ptx = compile_to_ptx(module, chip="sm_90")["kf_kernels"]
    assert "bar.sync" in ptx and ptx.count("ld.global.b32") == 1, ptx.count("ld.global.b32")
    assert ptx.count("ld.shared.b32") == 16 and ptx.count("cvt.rn.satfinite.e4m3x2.f32") == 16
    # bf16 pairs in (4 bytes), e4m3 pairs out (2 bytes): 8 passes each way
    assert ptx.count("ld.global.v2.b16") == 8 and ptx.count("st.global.v2.b8") == 8
    if shutil.which("ptxas"):
        [r] = assemble(ptx, "sm_90").kernels.values()
        assert r["spill_store_bytes"] == 0 and r["shared_bytes"] == 64 * 65 * 4, r
    ctx, module = build_module(build, [TensorSpec((4, 300, 128), "f32"), specs[1]], "transpose")
    with ctx:  # SPIR-V: the 32x33 tile (4.2 KiB of Vulkan's 16 guaranteed)
        text = str(gpu_func(module))
        assert "memref<32x33xf32, #gpu.address_space<workgroup>>" in text and "gpu.barrier" in text


@pytest.mark.parametrize("shape", [(2, 100, 72), (128, 64)], ids=str)
def test_transpose_kernel_with_a_chain_before(run, shape):
    """An elementwise chain of the input before the transpose (the caller's fp8 V
    widened, scaled, and stored K-major as E4M3FN): the tile holds the input, the chain
    runs at the output index; bit for bit."""
    _skip_spirv(run)
    x = (torch.randn(*shape) * 40).to(torch.float8_e4m3fn)
    s = torch.tensor(0.5)
    (got,) = run(lambda a, c: kb.cast(_swap_last_two(kb.mul(kb.cast(a, "f32"), c)), "f8E4M3FN"), x, s,
                 kind="transpose")
    check_fp8(got, (x.float() * s).transpose(-1, -2).to(torch.float8_e4m3fn))
