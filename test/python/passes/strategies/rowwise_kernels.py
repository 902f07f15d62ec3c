"""Rowwise kernel functions built by hand as kf-fuse makes them (``func.func private`` with
``kf.kernel = "rowwise"`` and a host function calling it), and the ways the rowwise
tests write, compile and run them: the strategy's gpu.func after kf-promote-shared and
kf-vectorize, compiled by kf-to-spirv and run on Vulkan (lavapipe here) against torch,
compiled by kf-to-cuda for ptxas, or launched where a CUDA GPU is. ``MODES``: the
kernel variants the end-to-end cases run under."""

from __future__ import annotations

import pytest
import torch
from mlir import ir
from mlir.dialects import func

from kf.dialects import builders as kb
from kf.dialects import make_context
from kf.dialects.types import TensorSpec, mlir_type
from kf.passes import registry
from kf.passes.strategies.base import TargetInfo
from kf.passes.strategies.rowwise import RowwiseStrategy, RowwiseVariant


TORCH = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}


EPS = 1e-5


def _layer_norm(x, w, b, elem):
    mu = kb.mean(x, dims=[-1], keepdim=True)
    v = kb.var(x, dims=[-1], keepdim=True, correction=1.0)
    n = kb.div(kb.sub(x, mu), kb.sqrt(kb.add(v, kb.scalar(EPS, elem))))
    return [kb.add(kb.mul(w, n), b)]


def _rms_norm(x, w, elem):
    ms = kb.mean(kb.mul(x, x), dims=[-1], keepdim=True)
    return [kb.mul(kb.mul(x, kb.rsqrt(kb.add(ms, kb.scalar(EPS, elem)))), w)]


def _stats(x, elem):
    """Per-row outputs beside a full row: max, population var (keepdim=False), centred x."""
    mx = kb.reduce_max(x, dims=[-1], keepdim=False)
    v = kb.var(x, dims=[-1], keepdim=False, correction=0.0)
    return [kb.sub(x, kb.mean(x, dims=[-1], keepdim=True)), mx, v]


KERNELS = {
    # name: (builder, extra inputs given the row length, torch reference)
    "layer_norm": (_layer_norm, lambda r: [(r,), (r,)],
                   lambda x, w, b: w * (x - x.mean(-1, keepdim=True)) / (x.var(-1, keepdim=True) + EPS).sqrt() + b),
    "softmax": (lambda x, elem: [kb.softmax(x, dim=-1)], lambda r: [], lambda x: torch.softmax(x, -1)),
    "log_softmax": (lambda x, elem: [kb.log_softmax(x, dim=-1)], lambda r: [], lambda x: torch.log_softmax(x, -1)),
    "rms_norm": (_rms_norm, lambda r: [(r,)], lambda x, w: x * torch.rsqrt((x * x).mean(-1, keepdim=True) + EPS) * w),
    "stats": (_stats, lambda r: [],
              lambda x: [x - x.mean(-1, keepdim=True), x.amax(-1), x.var(-1, unbiased=False)]),
}


def build(name: str, shape: tuple[int, ...], elem: str):
    """A module as kf-fuse leaves it: host @main calling the private kernel function @name
    (kf.kernel = "rowwise"), and an empty gpu.module @kf_kernels."""
    builder, extra, _ = KERNELS[name]
    ctx = make_context()
    with ctx, ir.Location.unknown():
        module = ir.Module.create()
        module.operation.attributes["gpu.container_module"] = ir.UnitAttr.get()
        in_types = [mlir_type(TensorSpec(tuple(shape), elem))] + [mlir_type(TensorSpec(s, elem))
                                                                  for s in extra(shape[-1])]
        with ir.InsertionPoint(module.body):
            kernel = func.FuncOp(name, (in_types, []))
            kernel.attributes["sym_visibility"] = ir.StringAttr.get("private")
            kernel.attributes["kf.kernel"] = ir.StringAttr.get("rowwise")
            body = kernel.add_entry_block()
            with ir.InsertionPoint(body):
                with ir.Location.file("model.py", 10, 1):
                    outs = builder(*body.arguments, elem)
                func.ReturnOp(outs)
            kernel.attributes["function_type"] = ir.TypeAttr.get(
                ir.FunctionType.get(in_types, [o.type for o in outs]))
            host = func.FuncOp("main", (in_types, [o.type for o in outs]))
            hb = host.add_entry_block()
            with ir.InsertionPoint(hb):
                call = func.CallOp([o.type for o in outs], ir.FlatSymbolRefAttr.get(name), list(hb.arguments))
                func.ReturnOp(list(call.results))
            gm = ir.Operation.create("gpu.module", regions=1,
                                     attributes={"sym_name": ir.StringAttr.get("kf_kernels")})
            gm.regions[0].blocks.append()
    return ctx, module, kernel.operation, gm


def lower(name, shape, elem, target: TargetInfo, passes=("kf-promote-shared", "kf-vectorize"),
          variant: RowwiseVariant | None = None):
    """The strategy's gpu.func (planned with ``variant``, the defaults where None) after
    the given kf passes; returns (gpu.module text, plan, emitted)."""
    ctx, module, kernel, gm = build(name, shape, elem)
    with ctx, ir.Location.unknown():
        # The strategy itself rather than strategy_for: that imports every strategy module,
        # and this test is about this one.
        strategy = RowwiseStrategy()
        plan = strategy.plan(kernel, target, variant)
        emitted = strategy.emit(kernel, plan, gm, target)
        for p in passes:
            registry.create(p).run(module.operation)
        assert module.operation.verify()
        text = "module attributes {gpu.container_module} {\n" + str(gm) + "\n}\n"
    return text, plan, emitted


def inputs_for(name, shape, elem, seed):
    gen = torch.Generator().manual_seed(seed)
    x = (torch.randn(shape, generator=gen) * 2 + 0.5).to(TORCH[elem])
    rest = [(torch.randn(s, generator=gen) + 1).to(TORCH[elem]) for s in KERNELS[name][1](shape[-1])]
    return [x] + rest


def reference(name, args, elem):
    out = KERNELS[name][2](*[a.double() for a in args])
    outs = out if isinstance(out, list) else [out]
    return [o.to(TORCH[elem]) for o in outs]


CASES = [((1, 256, 1024), "layer_norm"), ((3, 1000), "layer_norm"), ((7, 257), "layer_norm"),
         ((3, 4096), "layer_norm"), ((3, 8193), "layer_norm"),
         ((5, 1024), "softmax"), ((6, 1000), "softmax"), ((7, 1000), "softmax"), ((7, 257), "softmax"),
         ((4, 4096), "softmax"), ((9, 40), "softmax"),
         ((5, 1024), "log_softmax"), ((7, 257), "log_softmax"),
         ((8, 1024), "rms_norm"), ((3, 1000), "rms_norm"), ((7, 257), "rms_norm"),
         ((2, 3, 1000), "stats"), ((7, 257), "stats")]


TOL = {"f32": 2e-5, "f16": 1e-2, "bf16": 2e-2}


#: Rowwise kernel variants each test case runs under (bench/variants.py times the same
#: ones on a GPU).
MODES = {
    # what kf does by default: registers mode for f16/bf16 rows, the loop kernel for f32
    "default": RowwiseVariant(),
    # the loop kernel everywhere (kf-promote-shared and kf-vectorize do the rest),
    # dividing element by element
    "loop": RowwiseVariant(row_registers=0, row_reciprocal="never"),
    # registers mode for every row that fits 32 values a thread, f32 too, with reciprocals
    "registers": RowwiseVariant(row_registers_widest=8, row_reciprocal="always"),
    # 64 values a thread (3 x 8193 fits, one element a vector), every load up front
    "registers64": RowwiseVariant(row_registers=64, row_registers_widest=8, row_preload="all"),
    # held to 64 registers (.maxnreg) where a row is a workgroup's, weights a chunk ahead
    "capped": RowwiseVariant(row_registers_widest=8, row_max_registers=64, row_preload="pipelined"),
}


def run_vulkan(name, shape, elem, passes=("kf-promote-shared", "kf-vectorize"), seed=0, variant=None):
    from kf.passes.to_spirv import compile_spirv
    from kf.runtime import vulkan
    from kf.runtime.abi import KernelABI

    text, plan, emitted = lower(name, shape, elem, TargetInfo.for_target("spirv"), passes, variant)
    [binary] = compile_spirv(text)
    [k] = binary.kernels.values()
    args = inputs_for(name, shape, elem, seed)
    want = reference(name, args, elem)
    outs = [torch.full_like(w, float("nan")) for w in want]
    abi = KernelABI(k.entry, tuple(range(len(k.bindings))), grid=emitted.grid, block=emitted.block,
                    artifact=f"{k.entry}.spv", extra=k.abi_extra())
    vulkan.launch(binary.binary, abi, args + outs, written=list(range(len(args), len(args) + len(outs))))
    return outs, want, plan, text


def needs_vulkan():
    from kf.runtime import vulkan

    if not vulkan.is_available():
        pytest.skip("no Vulkan device (install mesa-vulkan-drivers)")


def ptx_for(name, shape, elem, chip="sm_90", passes=("kf-promote-shared", "kf-vectorize"), variant=None):
    from kf.passes.to_cuda import compile_to_ptx

    text, plan, emitted = lower(name, shape, elem, TargetInfo.for_target("cuda", chip), passes, variant)
    [ptx] = compile_to_ptx(text, chip=chip).values()
    return ptx, plan


def needs_ptxas():
    from kf.passes.to_cuda import ptxas_path

    if ptxas_path() is None:
        pytest.skip("ptxas not installed")


def cuda_kernel(name, shape, elem, passes=("kf-promote-shared", "kf-vectorize"), variant=None):
    """A runtime/cuda.py launcher for the kernel, from PTX for the device's chip."""
    from kf.passes.to_cuda import compile_to_ptx
    from kf.runtime import cuda as kcuda
    chip = "sm_%d%d" % torch.cuda.get_device_capability()
    text, plan, emitted = lower(name, shape, elem, TargetInfo.for_target("cuda", chip), passes, variant)
    [ptx] = compile_to_ptx(text, chip=chip).values()
    nargs = emitted.notes["inputs"] + emitted.notes["outputs"]
    return kcuda.CudaKernel(kcuda.CudaModule(ptx), name, emitted.grid, emitted.block, 0, nargs, validate=False), plan


def needs_cuda():
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")


def kernel_of(build_body, in_specs):
    """A kernel function from a body builder: (ctx, kernel op, gpu.module)."""
    ctx = make_context()
    with ctx, ir.Location.unknown():
        module = ir.Module.create()
        in_types = [mlir_type(TensorSpec(tuple(s), e)) for s, e in in_specs]
        with ir.InsertionPoint(module.body):
            kernel = func.FuncOp("k", (in_types, []))
            kernel.attributes["kf.kernel"] = ir.StringAttr.get("rowwise")
            body = kernel.add_entry_block()
            with ir.InsertionPoint(body):
                outs = build_body(*body.arguments)
                func.ReturnOp(outs)
            kernel.attributes["function_type"] = ir.TypeAttr.get(
                ir.FunctionType.get(in_types, [o.type for o in outs]))
            gm = ir.Operation.create("gpu.module", regions=1, attributes={"sym_name": ir.StringAttr.get("kf_kernels")})
            gm.regions[0].blocks.append()
    return ctx, module, kernel.operation, gm


def run_kernel(body, specs, args, target="spirv", passes=("kf-promote-shared", "kf-vectorize")):
    from kf.passes.to_spirv import compile_spirv
    from kf.runtime import vulkan
    from kf.runtime.abi import KernelABI

    ctx, module, kernel, gm = kernel_of(body, specs)
    with ctx, ir.Location.unknown():
        t = TargetInfo.for_target(target)
        s = RowwiseStrategy()
        plan = s.plan(kernel, t)
        emitted = s.emit(kernel, plan, gm, t)
        for p in passes:
            registry.create(p).run(module.operation)
        text = "module attributes {gpu.container_module} {\n" + str(gm) + "\n}\n"
        out_specs = [TensorSpec(tuple(ir.RankedTensorType(r).shape), str(ir.RankedTensorType(r).element_type))
                     for r in ir.FunctionType(ir.TypeAttr(kernel.attributes["function_type"]).value).results]
    [binary] = compile_spirv(text)
    [k] = binary.kernels.values()
    outs = [torch.full(o.shape, float("nan"), dtype=TORCH[o.elem]) for o in out_specs]
    abi = KernelABI(k.entry, tuple(range(len(k.bindings))), grid=emitted.grid, block=emitted.block,
                    artifact="k.spv", extra=k.abi_extra())
    vulkan.launch(binary.binary, abi, list(args) + outs, written=list(range(len(args), len(args) + len(outs))))
    return outs, plan
