"""The harness of the kf-map-to-gpu tests: kernel functions built by hand with
kf.dialects.builders (a ``func.func private`` with ``kf.kernel``, called by a host
function, as kf-fuse makes them) are planned by kf-tile, written as gpu.funcs by
kf-map-to-gpu and run on every back end present (the ``run`` fixture of conftest.py):
kf-to-spirv on the Vulkan device (lavapipe on CPU-only machines) and kf-to-cuda through
runtime/cuda.py on a CUDA GPU, with outputs poisoned beforehand.

Low-precision results are compared with torch computing in f32 and rounding once, kf's
precision policy; fp8 bit for bit.
"""


from __future__ import annotations


import pytest
import torch
from kf.dialects import TensorSpec, make_context, mlir_type
from kf.passes.map_to_gpu import MapToGpuPass
from kf.passes.tile import TilePass, attr_to_plan, plan_to_attr
from kf.passes.to_cuda import compile_to_ptx, ptxas_path
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


def skip_spirv(run):
    if run is run_vulkan:
        pytest.skip("kf-to-spirv stores no fp8 (no Vulkan storage type for it)")


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
    outputs = [sentinel(shape, TORCH[e]) for shape, e in out_specs]
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
    outputs = [sentinel(shape, TORCH[e]).cuda() for shape, e in out_specs]
    words = [torch.zeros(4, dtype=torch.int32, device="cuda")] if flagged else []
    kernel = kcuda.CudaKernel(kcuda.CudaModule(ptx), "k", grid, block, 0,
                              args=len(inputs) + len(outputs) + len(words))
    kernel(*[t.contiguous().cuda() for t in inputs], *outputs, *words)
    torch.cuda.synchronize()
    _flag_words([w.cpu() for w in words], flag)
    return tuple(o.cpu() for o in outputs)


def sentinel(shape, dtype):
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
