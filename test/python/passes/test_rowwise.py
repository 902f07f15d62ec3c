"""The rowwise strategy end to end: kernel functions built by hand as kf-fuse makes them
(``func.func private`` with ``kf.kernel = "rowwise"`` and a host function calling it),
written as a gpu.func by the strategy, rewritten by kf-promote-shared and kf-vectorize,
then

- compiled by kf-to-spirv and run on Vulkan (lavapipe here) against torch on fresh
  random inputs (rows of 1024, 1000 and 257: full vectors, vectors only, scalar tails);
- compiled by kf-to-cuda and assembled by ptxas for sm_80 and sm_90, checking the PTX
  has 128-bit global accesses and that ptxas reports no spills.

``python test/python/passes/test_rowwise.py`` prints the ptxas report of every kernel.
"""

from __future__ import annotations

import dataclasses
import re

import pytest
import torch
from mlir import ir
from mlir.dialects import func

from kf.dialects import builders as kb
from kf.dialects import make_context
from kf.dialects.types import TensorSpec, mlir_type
from kf.passes import registry
from kf.passes.strategies.base import NotApplicable, TargetInfo
from kf.passes.strategies.rowwise import RowwiseStrategy, RowwiseVariant

TORCH = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}
EPS = 1e-5


# ----------------------------------------------------------------------------- kernels


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


@pytest.fixture(params=list(MODES))
def mode(request):
    """The name of a variant of MODES."""
    return request.param


# ----------------------------------------------------------------------------- Vulkan


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


def _needs_vulkan():
    from kf.runtime import vulkan

    if not vulkan.is_available():
        pytest.skip("no Vulkan device (install mesa-vulkan-drivers)")


@pytest.mark.parametrize("elem", ["f32", "f16", "bf16"])
@pytest.mark.parametrize("shape,name", CASES, ids=[f"{n}-{'x'.join(map(str, s))}" for s, n in CASES])
def test_vulkan_matches_torch(shape, name, elem, mode):
    _needs_vulkan()
    outs, want, plan, _ = run_vulkan(name, shape, elem, seed=hash((name, shape, elem)) % 2 ** 31, variant=MODES[mode])
    if mode == "loop":
        assert plan["mode"] == "loop"
    for o, w in zip(outs, want):
        assert not o.isnan().any(), "an element was not written"
        torch.testing.assert_close(o.float(), w.float(), rtol=TOL[elem], atol=TOL[elem])


# ----------------------------------------------------------------------------- CUDA


def ptx_for(name, shape, elem, chip="sm_90", passes=("kf-promote-shared", "kf-vectorize"), variant=None):
    from kf.passes.to_cuda import compile_to_ptx

    text, plan, emitted = lower(name, shape, elem, TargetInfo.for_target("cuda", chip), passes, variant)
    [ptx] = compile_to_ptx(text, chip=chip).values()
    return ptx, plan


def _ptxas():
    from kf.passes.to_cuda import ptxas_path

    if ptxas_path() is None:
        pytest.skip("ptxas not installed")


CUDA_CASES = [((1, 256, 1024), "layer_norm"), ((3, 1000), "layer_norm"), ((7, 257), "layer_norm"),
              ((3, 4096), "layer_norm"), ((5, 1024), "softmax"), ((4, 4096), "softmax"), ((5, 1024), "log_softmax"),
              ((8, 4096), "rms_norm"), ((7, 257), "rms_norm"), ((2, 3, 1000), "stats")]


@pytest.mark.parametrize("chip", ["sm_80", "sm_90"])
@pytest.mark.parametrize("elem", ["f32", "f16", "bf16"])
@pytest.mark.parametrize("shape,name", CUDA_CASES, ids=[f"{n}-{'x'.join(map(str, s))}" for s, n in CUDA_CASES])
def test_cuda_ptxas(shape, name, elem, chip, mode):
    """PTX for sm_80/sm_90: 128-bit global loads where rows allow them, warp shuffles,
    and no spills."""
    _ptxas()
    if chip == "sm_80" and mode != "default":
        pytest.skip("the variants are checked on sm_90 (the H200's)")
    from kf.passes.to_cuda import assemble

    ptx, plan = ptx_for(name, shape, elem, chip, variant=MODES[mode])
    report = assemble(ptx, chip).kernels[name]
    assert report["spill_store_bytes"] == 0 and report["spill_load_bytes"] == 0, report
    assert "shfl.sync.bfly" in ptx
    if shape[-1] % 8 == 0:
        assert "ld.global.v4" in ptx, "rows of a multiple of 8 elements load 128 bits at a time"
        assert "st.global.v4" in ptx or (name == "stats" and "st.global" in ptx)
    if plan["cache_row"]:
        assert "st.shared" in ptx and report["shared_bytes"] >= shape[-1] * (4 if elem == "f32" else 2)


def cuda_kernel(name, shape, elem, passes=("kf-promote-shared", "kf-vectorize"), variant=None):
    """A runtime/cuda.py launcher for the kernel, from PTX for the device's chip."""
    from kf.passes.to_cuda import compile_to_ptx
    from kf.runtime import cuda as kcuda
    chip = "sm_%d%d" % torch.cuda.get_device_capability()
    text, plan, emitted = lower(name, shape, elem, TargetInfo.for_target("cuda", chip), passes, variant)
    [ptx] = compile_to_ptx(text, chip=chip).values()
    nargs = emitted.notes["inputs"] + emitted.notes["outputs"]
    return kcuda.CudaKernel(kcuda.CudaModule(ptx), name, emitted.grid, emitted.block, 0, nargs, validate=False), plan


def _needs_cuda():
    if not torch.cuda.is_available():
        pytest.skip("no CUDA device")


@pytest.mark.parametrize("elem", ["f32", "f16", "bf16"])
@pytest.mark.parametrize("shape,name", CASES, ids=[f"{n}-{'x'.join(map(str, s))}" for s, n in CASES])
def test_cuda_matches_torch(shape, name, elem, mode):
    """On a CUDA device: the same kernels launched through runtime/cuda.py."""
    _needs_cuda()
    k, plan = cuda_kernel(name, shape, elem, variant=MODES[mode])
    args = [a.cuda() for a in inputs_for(name, shape, elem, hash((name, shape, elem)) % 2 ** 31)]
    want = reference(name, args, elem)
    outs = [torch.full_like(w, float("nan")) for w in want]
    k(*args, *outs)
    torch.cuda.synchronize()
    for o, w in zip(outs, want):
        assert not o.isnan().any(), "an element was not written"
        torch.testing.assert_close(o.float(), w.float(), rtol=TOL[elem], atol=TOL[elem])


TORCH_OPS = {
    "layer_norm": lambda x, w, b: torch.nn.functional.layer_norm(x, x.shape[-1:], w, b, EPS),
    "softmax": lambda x: torch.softmax(x, -1),
    "log_softmax": lambda x: torch.log_softmax(x, -1),
    "rms_norm": lambda x, w: torch.nn.functional.rms_norm(x, x.shape[-1:], w, EPS),
}


def bench(shapes=((8192, 4096), (4096, 1000), (1, 256, 1024)), elems=("f32", "bf16")):
    """CUDA-event times of each kernel with and without kf-promote-shared / kf-vectorize,
    against torch's own op (median of 50 launches after 5 warm-ups)."""
    import statistics

    def ms(fn):
        for _ in range(5):
            fn()
        ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(50)]
        for s, e in ev:
            s.record()
            fn()
            e.record()
        torch.cuda.synchronize()
        return statistics.median(s.elapsed_time(e) for s, e in ev)

    variants = {"scalar": (), "promote": ("kf-promote-shared",), "vectorize": ("kf-vectorize",),
                "both": ("kf-promote-shared", "kf-vectorize")}
    print(f"{'kernel':12s} {'shape':12s} {'elem':5s} " + " ".join(f"{v:>16s}" for v in variants)
          + f" {'torch':>16s}   (µs, GB/s of one read and one write)")
    for name in TORCH_OPS:
        for shape in shapes:
            for elem in elems:
                args = [a.cuda() for a in inputs_for(name, shape, elem, 1)]
                out = torch.empty_like(args[0])
                nbytes = 2 * args[0].numel() * args[0].element_size()
                cells = []
                for v, passes in variants.items():
                    k, _ = cuda_kernel(name, shape, elem, passes)
                    t = ms(lambda: k(*args, out))
                    cells.append(f"{t * 1e3:7.1f} {nbytes / t / 1e6:6.0f}")
                want = reference(name, [a.cpu() for a in args], elem)[0]
                err = (out.cpu().double() - want.double()).abs().max().item()
                t = ms(lambda: TORCH_OPS[name](*args))
                cells.append(f"{t * 1e3:7.1f} {nbytes / t / 1e6:6.0f}")
                print(f"{name:12s} {'x'.join(map(str, shape)):12s} {elem:5s} " + " ".join(f"{c:>16s}" for c in cells)
                      + f"   max err {err:.1e}")


def ptxas_report():
    """Registers, spills and shared memory of every CUDA case (python test_rowwise.py)."""
    from kf.passes.to_cuda import assemble

    for shape, name in CUDA_CASES:
        for elem in ("f32", "f16", "bf16"):
            for chip in ("sm_80", "sm_90"):
                ptx, plan = ptx_for(name, shape, elem, chip)
                r = assemble(ptx, chip).kernels[name]
                print(f"{name:12s} {'x'.join(map(str, shape)):10s} {elem:5s} {chip}: {r['registers']:3d} regs, "
                      f"{r['spill_store_bytes']}/{r['spill_load_bytes']} B spill st/ld, {r['shared_bytes']:6d} B smem, "
                      f"threads {plan['threads']}, lanes {plan['vector_lanes']}, "
                      f"v4 loads {len(re.findall(r'ld[.]global[.]v4', ptx))}, cached {plan['cached_inputs']}")


if __name__ == "__main__":
    import sys

    bench() if "--bench" in sys.argv else ptxas_report()


# ----------------------------------------------------------------------------- edge cases


def _kernel_of(build_body, in_specs):
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


@pytest.mark.parametrize("why,body,specs", [
    ("not the trailing dims", lambda x: [kb.mean(x, dims=[0], keepdim=True)], [((4, 8), "f32")]),
    ("no reduction", lambda x: [kb.exp(x)], [((4, 8), "f32")]),
    ("not a rowwise op", lambda x, y: [kb.matmul(x, y)], [((4, 8), "f32"), ((8, 4), "f32")]),
    ("different row spaces", lambda x: [kb.sum(x, dims=[-1], keepdim=True), kb.sum(x, dims=[-2, -1])],
     [((4, 8), "f32")]),
    ("keepdim=False", lambda x: [kb.sub(x, kb.mean(x, dims=[-1]))], [((8, 8), "f32")]),
    ("reduces floats", lambda x: [kb.sum(x, dims=[-1])], [((4, 8), "i32")]),
])
def test_not_applicable(why, body, specs):
    """What the strategy refuses, so that kf-map-to-gpu falls back to generic."""
    ctx, _, kernel, gm = _kernel_of(body, specs)
    with ctx, ir.Location.unknown(), pytest.raises(NotApplicable, match=why):
        RowwiseStrategy().plan(kernel, TargetInfo.for_target("cuda"))


def _run_kernel(body, specs, args, target="spirv", passes=("kf-promote-shared", "kf-vectorize")):
    from kf.passes.to_spirv import compile_spirv
    from kf.runtime import vulkan
    from kf.runtime.abi import KernelABI

    ctx, module, kernel, gm = _kernel_of(body, specs)
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


def test_variance_is_two_pass():
    """Rows with |mean| / std = 1e4: E[x²] - E[x]² in f32 loses every digit of the
    variance (x² ~ 1e8, its f32 ulp ~ 8); the two-pass variance keeps them."""
    _needs_vulkan()
    gen = torch.Generator().manual_seed(3)
    x = 1e4 + torch.randn(6, 1000, generator=gen, dtype=torch.float64)
    [v], _ = _run_kernel(lambda a: [kb.var(a, dims=[-1], keepdim=False, correction=1.0)], [((6, 1000), "f32")],
                         [x.float()])
    torch.testing.assert_close(v.double(), x.float().double().var(-1), rtol=1e-3, atol=0)


def test_short_rows_and_several_trailing_dims():
    """Rows of 20 (threads with empty slices: the reductions see neutral partials) and a
    reduction over the last two dims (rows of 6 x 50 = 300, not vectorized: the column
    index is not the loop index), with a per-row input of shape [..., 1]."""
    _needs_vulkan()
    gen = torch.Generator().manual_seed(4)
    x, s = torch.randn(5, 20, generator=gen), torch.rand(5, 1, generator=gen) + 0.5
    [y], plan = _run_kernel(lambda a, b: [kb.mul(kb.softmax(a, dim=-1), b)], [((5, 20), "f32"), ((5, 1), "f32")],
                            [x, s])
    assert plan["threads"] == 32
    torch.testing.assert_close(y, torch.softmax(x, -1) * s)
    x = torch.randn(3, 6, 50, generator=gen)
    [y, m], plan = _run_kernel(lambda a: [kb.sub(a, kb.reduce_max(a, dims=[-2, -1], keepdim=True)),
                                          kb.reduce_min(a, dims=[-2, -1], keepdim=False)],
                               [((3, 6, 50), "f32")], [x])
    assert plan["vector_lanes"] == 1 and not plan["cache_row"]
    torch.testing.assert_close(y, x - x.amax((-2, -1), keepdim=True))
    torch.testing.assert_close(m, x.amin((-2, -1)))


def test_shared_memory_limit_is_respected():
    """A 4096-wide f32 row (16 KiB) fits in CUDA's 48 KiB but not in Vulkan's 16 KiB
    beside the reduction scratch: the plan caches it only on CUDA, and
    kf-promote-shared, given a smaller limit than the plan assumed, leaves it in global
    memory."""
    cuda = lower("softmax", (4, 4096), "f32", TargetInfo.for_target("cuda"))
    spirv = lower("softmax", (4, 4096), "f32", TargetInfo.for_target("spirv"))
    assert cuda[1]["cache_row"] and not spirv[1]["cache_row"]
    assert "memref<4096xf32, #gpu.address_space<workgroup>>" in cuda[0]
    assert "memref<4096xf32, #gpu.address_space<workgroup>>" not in spirv[0]
    ctx, module, kernel, gm = build("softmax", (4, 4096), "f32")
    with ctx, ir.Location.unknown():
        t = TargetInfo.for_target("cuda")
        RowwiseStrategy().emit(kernel, RowwiseStrategy().plan(kernel, t), gm, t)
        registry.create("kf-promote-shared", {"max-shared-bytes": "8192"}).run(module.operation)
        assert "4096xf32, #gpu.address_space<workgroup>" not in str(gm)
        registry.create("kf-promote-shared").run(module.operation)
        assert str(gm).count("gpu.barrier") >= 3 and "4096xf32, #gpu.address_space<workgroup>" in str(gm)


def test_markers_and_plan():
    """The plan's choices reach the IR: lanes on the loops, kf.promote on the loads of
    cached rows, the target's shared limit on the gpu.func (the loop kernel)."""
    text, plan, emitted = lower("layer_norm", (3, 1000), "f16", TargetInfo.for_target("cuda"), passes=(),
                                variant=RowwiseVariant(row_registers=0))
    assert plan["vector_lanes"] == 8 and plan["threads"] == 128 and plan["cached_inputs"] == [0]
    assert plan["reduction"] == "shuffle" and emitted.grid == (3, 1, 1) and emitted.block == (128, 1, 1)
    assert text.count("kf.vector_lanes = 8") == 3 and text.count("{kf.promote}") == 3
    assert "kf.max_shared_bytes = 49152" in text and "gpu.shuffle" in text
    text, plan, _ = lower("layer_norm", (3, 1000), "bf16", TargetInfo.for_target("spirv"), passes=())
    assert plan["vector_lanes"] == 1 and plan["reduction"] == "tree" and "gpu.shuffle" not in text
    text, plan, _ = lower("layer_norm", (3, 1000), "f16", TargetInfo.for_target("spirv"))
    assert plan["vector_lanes"] == 4 and "vector<4xf16>" in text and "vector<8xf16>" not in text


@pytest.mark.parametrize("target,shape,elem,want", [
    # 32768 x 8192 bf16: 1024 vectors of 8, 256 threads with 4 each, one row a workgroup
    ("cuda", (32768, 8192), "bf16", {"row_threads": 256, "rows_per_block": 1, "chunks": 4, "vector_lanes": 8}),
    # 8 KiB rows: 128 threads of 32 values, two rows a workgroup of 256
    ("cuda", (8192, 4096), "bf16", {"row_threads": 128, "rows_per_block": 2, "chunks": 4, "vector_lanes": 8}),
    # an odd row: one element a vector, 16 threads a row, 8 rows a workgroup (7 rows: one idle group)
    ("cuda", (7, 257), "f16", {"row_threads": 16, "rows_per_block": 8, "chunks": 17, "vector_lanes": 1}),
    # 1000 = 125 x 8: 4 vectors of the 125 per thread, the last chunk partial
    ("cuda", (7, 1000), "bf16", {"row_threads": 32, "rows_per_block": 8, "chunks": 4, "vector_lanes": 8}),
    # SPIR-V: no bf16 vectors, so 32 scalar values a thread
    ("spirv", (32768, 8192), "bf16", {"row_threads": 256, "rows_per_block": 1, "chunks": 32, "vector_lanes": 1}),
])
def test_registers_plan(target, shape, elem, want):
    """Registers mode's plan: lanes that divide the row, threads a row for at most 32
    values each, and rows sharing a workgroup of 256 threads where a row needs fewer."""
    ctx, module, kernel, gm = build("layer_norm", shape, elem)
    with ctx, ir.Location.unknown():
        plan = RowwiseStrategy().plan(kernel, TargetInfo.for_target(target))
    assert plan["mode"] == "registers" and {k: plan[k] for k in want} == want
    assert plan["threads"] == want["row_threads"] * want["rows_per_block"] and plan["reciprocal"]
    assert plan["chunks"] * plan["vector_lanes"] <= RowwiseVariant().row_registers == 32


def test_registers_plan_falls_back():
    """The loop kernel where registers mode does not apply: f32 rows that share a
    workgroup (no register cap) or on a target without one, rows longer than 32 values
    a thread at the thread cap, reductions over several dims."""
    for target, shape, elem in (("cuda", (64, 4096), "f32"), ("spirv", (64, 8192), "f32"),
                                ("cuda", (4, 65536), "bf16"), ("cuda", (3, 8193), "bf16")):
        ctx, module, kernel, gm = build("softmax", shape, elem)
        with ctx, ir.Location.unknown():
            plan = RowwiseStrategy().plan(kernel, TargetInfo.for_target(target))
        assert plan["mode"] == "loop" and plan["reciprocal"] == (elem != "f32"), (shape, elem, plan)


def test_registers_plan_f32_capped():
    """f32 rows take registers mode on CUDA where one row fills a workgroup and the
    register cap holds it; the division stays a division (f32 outputs)."""
    ctx, module, kernel, gm = build("softmax", (64, 8192), "f32")
    with ctx, ir.Location.unknown():
        plan = RowwiseStrategy().plan(kernel, TargetInfo.for_target("cuda"))
    assert plan["mode"] == "registers" and plan["rows_per_block"] == 1, plan
    assert plan["max_registers"] == RowwiseVariant().row_max_registers == 64 and not plan["reciprocal"]


def test_registers_mode_ir():
    """Registers mode writes straight-line code: no row loops (so kf-promote-shared and
    kf-vectorize leave it alone), one vector load a chunk of each input (bf16 read as
    32-bit words on CUDA), one barrier a reduction, one division a row for
    1 / sqrt(var + eps), and stores guarded only where a chunk or a row can be missing."""
    text, plan, emitted = lower("layer_norm", (4, 8192), "bf16", TargetInfo.for_target("cuda"))
    assert plan["mode"] == "registers" and emitted.grid == (4, 1, 1) and emitted.block == (256, 1, 1)
    assert "scf.for" not in text and "kf.row_loop" not in text and "kf.promote" not in text
    assert text.count("vector.load") == 3 * 4 and text.count("vector.store") == 4
    assert text.count("vector.bitcast") == 3 * 4 and "vector<4xi32>" in text
    assert text.count("gpu.barrier") == 2 and "scf.if" in text  # the warp partials' store
    assert "kf.assumed_alignment = 16" in text
    # sum / R, m2 / (R - 1) and 1 / sqrt(var + eps): none per element
    assert text.count("arith.divf") == 3 and text.count("arith.mulf") >= 3 * 32
    text, plan, emitted = lower("layer_norm", (7, 1000), "bf16", TargetInfo.for_target("cuda"))
    # 125 vectors over 32 threads: chunk 3 exists for threads < 29 only; 7 rows in 8 groups
    assert plan["rows_per_block"] == 8 and text.count("scf.if") >= 4 and "arith.minui" in text
    text, plan, _ = lower("layer_norm", (7, 1000), "bf16", TargetInfo.for_target("spirv"))
    assert "vector.bitcast" not in text and "vector.load" not in text and plan["vector_lanes"] == 1


def test_registers_mode_ptx():
    """In the PTX of registers mode (sm_90): each thread's loads of x are issued before
    any reduction; exp once an element in the softmax (32 a thread), no division an
    element in the layer norm; no spills."""
    _ptxas()
    from kf.passes.to_cuda import assemble

    ptx, plan = ptx_for("layer_norm", (4, 8192), "bf16")
    first_sync = ptx.index("bar.sync")
    assert ptx[:first_sync].count("ld.global.v4") == 4 and ptx.count("ld.global.v4") == 12
    assert ptx.count("st.global.v4") == 4 and ptx.count("div.rn.f32") <= 3
    report = assemble(ptx, "sm_90").kernels["layer_norm"]
    assert report["spill_store_bytes"] == 0 and report["spill_load_bytes"] == 0, report
    ptx, plan = ptx_for("softmax", (4, 8192), "bf16")
    assert ptx.count("ex2.approx") == 32 and "div.rn.f32" not in ptx and ptx.count("bar.sync") == 2
    ptx, plan = ptx_for("rms_norm", (4, 8192), "bf16")
    assert ptx.count("ld.global.v4") == 8 and ptx.count("bar.sync") == 1


def test_register_cap_and_pipelined_weights():
    """row_max_registers reaches the PTX as .maxnreg (one row a workgroup only) and holds
    the bf16 layer norm at 32768 x 8192 to 64 registers without spills; "pipelined"
    issues the weights of chunk c + 1 before chunk c's stores."""
    _ptxas()
    from kf.passes.to_cuda import assemble

    capped = RowwiseVariant(row_max_registers=64, row_preload="pipelined")
    ptx, plan = ptx_for("layer_norm", (4, 8192), "bf16", "sm_90", variant=capped)
    assert plan["max_registers"] == 64 and ".maxnreg 64" in ptx
    report = assemble(ptx, "sm_90").kernels["layer_norm"]
    assert report["registers"] <= 64 and report["spill_store_bytes"] == 0 and report["spill_load_bytes"] == 0
    # after the reductions: w and b of chunks 0 and 1, then a store before chunk 2's
    tail = ptx[ptx.rindex("bar.sync"):]
    assert tail[:tail.index("st.global.v4")].count("ld.global.v4") == 4
    ptx, plan = ptx_for("layer_norm", (7, 1000), "bf16", "sm_90", variant=capped)
    assert plan["rows_per_block"] > 1 and not plan["max_registers"] and ".maxnreg" not in ptx


def test_per_row_values_without_keepdim():
    """keepdim=False results combined with each other and with per-row inputs and
    scalars of any rank stay per-row outputs: (max - min) * scale[row] + 1."""
    _needs_vulkan()
    gen = torch.Generator().manual_seed(5)
    x, s = torch.randn(4, 300, generator=gen), torch.rand(4, generator=gen)
    [y], _ = _run_kernel(lambda a, b: [kb.add(kb.mul(kb.sub(kb.reduce_max(a, dims=[-1]), kb.reduce_min(a, dims=[-1])),
                                                     b), kb.fill((1, 1), "f32", 1.0))],
                         [((4, 300), "f32"), ((4,), "f32")], [x, s])
    torch.testing.assert_close(y, ((x.amax(-1) - x.amin(-1)) * s + 1).view(1, 4))


def _masked_softmax_backward(s, keep, g):
    """The softmax backward of the GPT attention with its bool mask argument (kf-fuse makes
    the mask == 0 compare a kernel of its own, so the rowwise kernel takes an i1 tensor)."""
    p = kb.softmax(kb.masked_fill(s, keep, value=-1e9), dim=-1)
    return [kb.mul(p, kb.sub(g, kb.sum(kb.mul(g, p), dims=[-1], keepdim=True)))]


BOOL_SPECS = [((2, 3, 128, 128), "f32"), ((128, 128), "i1"), ((2, 3, 128, 128), "f32")]


def test_bool_arguments_are_bytes_on_cuda():
    """A regression: the rowwise kernel took i1 memrefs on CUDA, whose 16-lane vector loads
    read 16 bits where torch.bool has 16 bytes (the GPT's attention gradients were off by
    84% on the H200). Booleans are i8 on CUDA like in every other strategy; SPIR-V keeps
    i1 (kf-to-spirv stores it as bytes itself)."""
    for target, want in (("cuda", "memref<128x128xi8>"), ("spirv", "memref<128x128xi1>")):
        ctx, module, kernel, gm = _kernel_of(_masked_softmax_backward, BOOL_SPECS)
        with ctx, ir.Location.unknown():
            t = TargetInfo.for_target(target)
            s = RowwiseStrategy()
            s.emit(kernel, s.plan(kernel, t), gm, t)
            for p in ("kf-promote-shared", "kf-vectorize"):
                registry.create(p).run(module.operation)
            text = str(gm)
        assert want in text.split("gpu.func @k(")[1].split(")")[0]
        if target == "cuda":
            # bytes, never bits: the loop kernel loads 16 of them at a time, the registers
            # mode (the default for a mask this narrow) one at a time
            assert "memref<128x128xi8>, vector<16xi8>" in text or "memref.load %arg1[%4, %8] : memref<128x128xi8>" \
                in text or re.search(r"memref<128x128xi8>, vector<\d+xi8>", text)
            assert not re.search(r"memref<[0-9x]*xi1>, vector<", text) and ": memref<128x128xi1>" not in text


def _bool_mask_inputs(seed):
    gen = torch.Generator().manual_seed(seed)
    s, g = torch.randn(2, 3, 128, 128, generator=gen), torch.randn(2, 3, 128, 128, generator=gen)
    keep = torch.tril(torch.ones(128, 128, dtype=torch.bool)).logical_not()  # True = masked
    p = torch.softmax(s.masked_fill(keep, -1e9), -1)
    return [s, keep, g], p * (g - (g * p).sum(-1, keepdim=True))


def test_bool_argument_vulkan():
    _needs_vulkan()
    args, want = _bool_mask_inputs(3)
    (out,), _ = _run_kernel(_masked_softmax_backward, BOOL_SPECS, args)
    torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-5)


def test_bool_argument_cuda():
    _needs_cuda()
    from kf.passes import to_cuda
    from kf.runtime import cuda as kcuda

    ctx, module, kernel, gm = _kernel_of(_masked_softmax_backward, BOOL_SPECS)
    with ctx, ir.Location.unknown():
        t = TargetInfo.for_target("cuda")
        s = RowwiseStrategy()
        emitted = s.emit(kernel, s.plan(kernel, t), gm, t)
        for p in ("kf-promote-shared", "kf-vectorize"):
            registry.create(p).run(module.operation)
        text = "module attributes {gpu.container_module} {\n" + str(gm) + "\n}\n"
    ptx = to_cuda.compile_to_ptx(text)["kf_kernels"]
    args, want = _bool_mask_inputs(4)
    out = torch.full(want.shape, float("nan"), device="cuda")
    k = kcuda.CudaKernel(kcuda.CudaModule(ptx), emitted.name, emitted.grid, emitted.block, 0, 4)
    k(*[a.cuda() for a in args], out)
    torch.cuda.synchronize()
    torch.testing.assert_close(out.cpu(), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_softmax_over_a_row_of_one(dtype):
    """A regression: softmax over [.., 1] (the MoE's top-1 gate) stores its output after
    the sum's loop, where the exp memoized inside that loop did not dominate
    (kf-map-to-gpu failed); on Vulkan here, and assembled by ptxas for sm_90a."""
    import kf

    def softmax(x):
        return torch.softmax(x, dim=-1)

    x = torch.randn(37, 1, dtype=dtype)
    assert "ld.global" in kf.inspect(kf.jit(softmax, target="cuda", arch="sm_90a"), x).ptx
    _needs_vulkan()
    torch.testing.assert_close(kf.jit(softmax, target="vulkan")(x), torch.softmax(x.float(), -1).to(dtype))


def test_variants_are_plan_data():
    """The rowwise variants are kf-tile options and the option ``variants``: the plan
    records the variant it was made with, so the IR (and the cache key) tells the
    kernels apart; a variant that selects the loop kernel computes what torch does on
    fresh inputs (an odd row of 257 on Vulkan)."""
    import kf
    from kf.passes.strategies.base import variants_by_kind

    v = variants_by_kind({"rowwise.row_registers": "0", "rowwise.row_preload": "all",
                          "rowwise.row_registers_wide_capped": "false"})["rowwise"]
    assert v == RowwiseVariant(row_registers=0, row_preload="all", row_registers_wide_capped=False)
    for fields, message in (({"row_preload": "some"}, "'row_preload' takes rows, pipelined or all, not 'some'"),
                            ({"row_reciprocal": "sometimes"}, "'row_reciprocal' takes narrow, always or never"),
                            ({"row_block": "-1"}, "'row_block' takes an int >= 0"),
                            ({"row_register": "0"}, "no variant 'row_register'")):
        with pytest.raises(ValueError, match=message):
            variants_by_kind({f"rowwise.{k}": t for k, t in fields.items()})

    def softmax(x):
        return torch.softmax(x, dim=-1)

    x = torch.randn(7, 257, dtype=torch.float16)
    plans = {}
    for variants in ("", "rowwise.row_registers=0"):
        f = kf.jit(softmax, target="vulkan", variants=variants)
        [k] = kf.explain(f, x, file=None).kernels
        plans[variants] = k.plan
    assert plans[""]["mode"] == "registers" and plans[""]["variant"] == dataclasses.asdict(RowwiseVariant())
    assert plans["rowwise.row_registers=0"]["mode"] == "loop"
    assert plans["rowwise.row_registers=0"]["variant"]["row_registers"] == 0
    _needs_vulkan()
    y = torch.randn(7, 257, dtype=torch.float16)
    torch.testing.assert_close(kf.jit(softmax, target="vulkan", variants="rowwise.row_registers=0")(y),
                               torch.softmax(y.float(), -1).half(), rtol=1e-2, atol=1e-3)
