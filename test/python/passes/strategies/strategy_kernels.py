"""Kernel functions built by hand as kf-fuse makes them (a ``func.func private`` with
``kf.kernel`` and a host function calling it), and the ways the strategies' tests write,
compile and run them: on the Vulkan device (lavapipe on CPU-only machines) against torch,
assembled by ptxas, or launched where a CUDA GPU is."""

from __future__ import annotations

import pytest
import torch
from kf import dialects as kd
from kf.dialects import builders as kb
from kf.dialects.types import TensorSpec
from kf.passes.strategies.base import TargetInfo, strategy_for
from mlir import ir
from mlir.dialects import func


TORCH = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}
SPIRV, CUDA = TargetInfo.for_target("spirv"), TargetInfo.for_target("cuda")
HOPPER = TargetInfo.for_target("cuda", chip="sm_90a")  # wgmma


def vulkan_runtime():
    from kf.runtime import vulkan

    return vulkan


needs_vulkan = pytest.mark.skipif(not vulkan_runtime().is_available(), reason="no Vulkan device (mesa-vulkan-drivers)")


def _has_ptxas() -> bool:
    from kf.passes.to_cuda import ptxas_path

    return ptxas_path() is not None


needs_ptxas = pytest.mark.skipif(not _has_ptxas(), reason="ptxas not installed")


needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")


class Built:
    """A module holding one kernel function (and a host function calling it) in its own
    context, with an empty ``gpu.module @kf_kernels`` for the strategy to write into."""

    def __init__(self, kind: str, arg_specs, body):
        self.ctx = kd.make_context()
        with self.ctx, ir.Location.unknown():
            self.module = ir.Module.parse("module attributes {gpu.container_module} { gpu.module @kf_kernels {} }")
            types = [kd.mlir_type(s) for s in arg_specs]
            with ir.InsertionPoint.at_block_begin(self.module.body):
                self.kernel = func.FuncOp(f"k_{kind}", ir.FunctionType.get(types, []), visibility="private")
                block = self.kernel.add_entry_block()
                with ir.InsertionPoint(block):
                    outs = body(*block.arguments)
                    func.ReturnOp(outs)
                out_types = [o.type for o in outs]
                self.kernel.attributes["function_type"] = ir.TypeAttr.get(ir.FunctionType.get(types, out_types))
                self.kernel.attributes["kf.kernel"] = ir.StringAttr.get(kind)
                host = func.FuncOp("host", ir.FunctionType.get(types, out_types))
                with ir.InsertionPoint(host.add_entry_block()):
                    call = func.CallOp(out_types, ir.FlatSymbolRefAttr.get(f"k_{kind}"),
                                       list(host.entry_block.arguments))
                    func.ReturnOp(list(call.results))
            self.gpu_module = next(op.operation for op in self.module.body.operations
                                   if op.operation.name == "gpu.module")

    def emit(self, target: TargetInfo, variant=None):
        """The strategy's plan and report; the kernel function is left in place.
        ``variant``: the strategy's VARIANT to plan with (its defaults where None)."""
        with self.ctx, ir.Location.unknown():
            strategy = strategy_for(ir.StringAttr(self.kernel.attributes["kf.kernel"]).value)
            plan = strategy.plan(self.kernel.operation, target, *([variant] if variant is not None else []))
            emitted = strategy.emit(self.kernel.operation, plan, self.gpu_module, target)
        return plan, emitted

    def gpu_text(self) -> str:
        """The module as the back ends take it: container module and gpu.module only."""
        with self.ctx:
            return ("module attributes {gpu.container_module} {\n" + str(self.gpu_module) + "\n}\n")


def randn(shape, elem, gen):
    return torch.randn(shape, generator=gen).to(TORCH[elem])


def attention(b, h, sq, sk, d, elem, mask_shape=None, dv=None, scale_op="div", mask_elem="f32"):
    """matmul(q, k^T) -> scale -> masked_fill(cmp(mask, 0, eq), -1e9) -> softmax -> matmul(., v),
    with the argument order kf-fuse may give (k before q)."""
    dv = dv or d
    specs = [TensorSpec((b, h, sk, d), elem), TensorSpec((b, h, sq, d), elem), TensorSpec((b, h, sk, dv), elem)]
    if mask_shape is not None:
        specs.append(TensorSpec(tuple(mask_shape), mask_elem))

    def body(k, q, v, *mask):
        s = kb.matmul(q, kb.transpose(k, perm=[0, 1, 3, 2]))
        s = kb.div(s, kb.scalar(d ** 0.5, elem)) if scale_op == "div" else kb.mul(s, kb.scalar(d ** -0.5, elem))
        if mask:
            s = kb.masked_fill(s, kb.cmp(mask[0], kb.scalar(0.0, mask_elem), predicate="eq"), value=-1e9)
        return [kb.matmul(kb.softmax(s, dim=-1), v)]

    return Built("attention", specs, body)


def attention_reference(k, q, v, mask, scale_op="div"):
    d = q.shape[-1]
    s = q.float() @ k.float().transpose(-1, -2)
    s = s / d ** 0.5 if scale_op == "div" else s * d ** -0.5
    if mask is not None:
        s = s.masked_fill(mask == 0, -1e9)
    return torch.softmax(s, -1) @ v.float()


def attention_fp8(b, h, sq, sk, d, elem="f8E4M3FN", out="bf16", p_scale=256.0):
    """k8, q8, vt8 ([.., d, sk]), the scores' and the output's dequantization factors."""
    specs = [TensorSpec((b, h, sk, d), elem), TensorSpec((b, h, sq, d), elem), TensorSpec((b, h, d, sk), elem),
             TensorSpec((), "f32"), TensorSpec((), "f32")]

    def body(k, q, vt, s_qk, s_v):
        s = kb.build("matmul", [q, kb.transpose(k, perm=[0, 1, 3, 2])], None,
                     [TensorSpec((b, h, sq, sk), "f32")]).result
        s = kb.div(kb.cast(kb.mul(s, s_qk), out), kb.scalar(d ** 0.5, out))
        p = kb.softmax(s, dim=-1)
        p8 = kb.cast(kb.mul(kb.cast(p, "f32"), kb.scalar(p_scale, "f32")), elem)
        o = kb.build("matmul", [p8, kb.transpose(vt, perm=[0, 1, 3, 2])], None,
                     [TensorSpec((b, h, sq, d), "f32")]).result
        return [kb.cast(kb.mul(o, kb.div(s_v, kb.scalar(p_scale, "f32"))), out)]

    return Built("attention", specs, body)


def matmul_bias_gelu(m, k, n, elem):
    return Built("matmul", [TensorSpec((m, k), elem), TensorSpec((k, n), elem), TensorSpec((n,), elem)],
                 lambda a, b, bias: [kb.gelu(kb.add(kb.matmul(a, b), bias))])


def matmul_batched(elem, transpose_b=False, mkn=(100, 70, 50)):
    """[2,1,M,K] @ [3,K,N] (or [3,N,K]^T) broadcast to [2,3,M,N], scaled by a rank-0
    argument and cast to f32."""
    m, k, n = mkn
    bshape = (3, n, k) if transpose_b else (3, k, n)

    def body(a, b, s):
        rhs = kb.transpose(b, perm=[0, 2, 1]) if transpose_b else b
        return [kb.cast(kb.mul(kb.matmul(a, rhs), s), "f32")]

    return Built("matmul", [TensorSpec((2, 1, m, k), elem), TensorSpec(bshape, elem), TensorSpec((), elem)], body), \
        (m, k, n, bshape)


def matmul_nt(m, k, n, elem):
    """a @ b.T with b stored [n, k] (nn.Linear's weight): both operands K-major."""
    return Built("matmul", [TensorSpec((m, k), elem), TensorSpec((n, k), elem)],
                 lambda a, b: [kb.matmul(a, kb.transpose(b, perm=[1, 0]))])


def emit_with(built: Built, target: TargetInfo, **changes):
    """Emit with plan entries changed (what a tuning pass may do to a recorded plan)."""
    with built.ctx, ir.Location.unknown():
        strategy = strategy_for(ir.StringAttr(built.kernel.attributes["kf.kernel"]).value)
        plan = {**strategy.plan(built.kernel.operation, target), **changes}
        return plan, strategy.emit(built.kernel.operation, plan, built.gpu_module, target)


def spirv_run(built: Built, emitted, args, out_shape, out_elem, **options):
    """Compile (kf-to-spirv ``options``: the device's shared memory and subgroup size) and
    launch the strategy's kernel on the Vulkan device; returns the output and the kernel."""
    from kf.passes.to_spirv import compile_spirv
    from kf.runtime.abi import KernelABI

    vulkan = vulkan_runtime()
    [binary] = compile_spirv(built.gpu_text(), **options)
    [k] = binary.kernels.values()
    out = torch.full(out_shape, float("nan"), dtype=TORCH[out_elem])
    abi = KernelABI(k.entry, tuple(range(len(k.bindings))), grid=emitted.grid, block=k.workgroup_size,
                    extra=k.abi_extra())
    vulkan.launch(binary.binary, abi, list(args) + [out], written=[len(args)])
    return out, k


def cuda_report(built: Built, chip: str = "sm_90", log: bool = False):
    from kf.passes import to_cuda

    ptx = to_cuda.compile_to_ptx(built.gpu_text(), chip=chip)["kf_kernels"]
    assembled = to_cuda.assemble(ptx, chip)
    # the kernel itself, not a prelude it launches first (the attention block table)
    [report] = [r for name, r in assembled.kernels.items() if not name.endswith("_blocks")]
    return (ptx, report, assembled.log) if log else (ptx, report)


def ptx_entries(ptx: str) -> dict[str, str]:
    """The PTX text of each .entry (a kernel), by name."""
    out, name = {}, None
    for line in ptx.splitlines():
        if ".entry" in line:
            name = line.split(".entry")[1].split("(")[0].strip()
            out[name] = ""
        if name is not None:
            out[name] += line + "\n"
    return out


def cuda_compile(built: Built, emitted):
    """Compile the strategy's kernel (and its prelude) for the device's chip; returns
    ``run(args, out_shape, out_elem) -> (out, table or None)``, which launches them on
    torch tensors, and the PTX."""
    from kf.passes import to_cuda
    from kf.runtime import cuda as kcuda

    cap = torch.cuda.get_device_capability()
    chip = "sm_90a" if cap == (9, 0) else "sm_{}{}".format(*cap)  # as kf's driver picks it
    ptx = to_cuda.compile_to_ptx(built.gpu_text(), chip=chip)["kf_kernels"]
    module = kcuda.CudaModule(ptx)

    def run(args, out_shape, out_elem):
        out = torch.full(out_shape, float("nan"), dtype=TORCH[out_elem], device="cuda")
        ins = [a.cuda() for a in args]
        table = None
        if emitted.prelude is not None:  # the block table, written first as kf's schedule does
            p = emitted.prelude
            table = torch.full(ir.RankedTensorType(emitted.prelude_output).shape, -1, dtype=torch.int32,
                               device="cuda")
            kcuda.CudaKernel(module, p.name, p.grid, p.block, p.shared_bytes, len(ins) + 1)(*ins, table)
            ins.append(table)
        k = kcuda.CudaKernel(module, emitted.name, emitted.grid, emitted.block, emitted.shared_bytes, len(ins) + 1)
        k(*ins, out)
        torch.cuda.synchronize()
        return out.cpu(), None if table is None else table.cpu()

    return run, ptx


def cuda_run(built: Built, plan, emitted, args, out_shape, out_elem):
    """Compile the strategy's kernel for the device's chip and launch it on torch tensors."""
    run, ptx = cuda_compile(built, emitted)
    return run(args, out_shape, out_elem)[0], ptx


def hopper_only():
    if torch.cuda.is_available() and torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("wgmma needs an sm_90 device")
    return HOPPER


needs_hopper = pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0),
                                  reason="fp8 wgmma needs an sm_90 device")


def attention_backward(b, h, sq, sk, d, elem, mask_shape=None, dv=None, mask_form="select", scale_op="div",
                       dk_form="direct", results=("dq", "dk", "dv")):
    """An attention backward kernel function as kf-fuse makes it (kind
    ``attention_backward``): q, k, v, [mask], o, lse ([b, h, sq, 1], f32), dO ->
    dq, dk, dv, with P = exp(x - lse), D = rowsum(dO * O) in f32 and the softmax
    backward in f32 (16-bit products rounded to their type, as the decomposed ATen graph
    does). ``mask_form``: ``select`` (masked_fill as ATen decomposes it) or
    ``masked_fill``; ``dk_form``: ``direct`` (dS^T @ q) or ``swapped`` ((q^T @ dS)^T);
    ``results``: which gradients it returns, in that order."""
    dv = dv or d
    specs = [TensorSpec((b, h, sq, d), elem), TensorSpec((b, h, sk, d), elem), TensorSpec((b, h, sk, dv), elem)]
    if mask_shape is not None:
        specs.append(TensorSpec(tuple(mask_shape), "f32"))
    specs += [TensorSpec((b, h, sq, dv), elem), TensorSpec((b, h, sq, 1), "f32"), TensorSpec((b, h, sq, dv), elem)]
    f32 = "f32"

    def body(q, k, v, *rest):
        mask, (o, lse, do) = (rest[0], rest[1:]) if mask_shape is not None else (None, rest)
        s = kb.matmul(q, kb.transpose(k, perm=[0, 1, 3, 2]))
        x = kb.div(s, kb.scalar(d ** 0.5, elem)) if scale_op == "div" else kb.mul(s, kb.scalar(d ** -0.5, elem))
        cond = None
        if mask is not None:
            cond = kb.cmp(mask, kb.scalar(0.0, "f32"), predicate="eq")
            x = kb.select(cond, kb.scalar(-1e9, elem), x) if mask_form == "select" else \
                kb.masked_fill(x, cond, value=-1e9)
        p = kb.exp(kb.sub(kb.cast(x, f32) if elem != f32 else x, lse))
        p_e = kb.cast(p, elem) if elem != f32 else p
        dv_ = kb.matmul(kb.transpose(p_e, perm=[0, 1, 3, 2]), do)
        dp = kb.matmul(do, kb.transpose(v, perm=[0, 1, 3, 2]))
        wide = (lambda t: kb.cast(t, f32)) if elem != f32 else (lambda t: t)
        dsum = kb.sum(kb.mul(wide(do), wide(o)), dims=[3], keepdim=True)
        ds = kb.mul(p, kb.sub(wide(dp), dsum))
        ds = kb.cast(ds, elem) if elem != f32 else ds
        if cond is not None:
            ds = kb.select(cond, kb.scalar(0.0, elem), ds)
        ds = kb.div(ds, kb.scalar(d ** 0.5, elem)) if scale_op == "div" else kb.mul(ds, kb.scalar(d ** -0.5, elem))
        dq = kb.matmul(ds, k)
        if dk_form == "direct":
            dk = kb.matmul(kb.transpose(ds, perm=[0, 1, 3, 2]), q)
        else:
            dk = kb.transpose(kb.matmul(kb.transpose(q, perm=[0, 1, 3, 2]), ds), perm=[0, 1, 3, 2])
        grads = {"dq": dq, "dk": dk, "dv": dv_}
        return [grads[r] for r in results]

    return Built("attention_backward", specs, body)


def attention_backward_inputs(b, h, sq, sk, d, elem, mask_shape=None, dv=None, gen=None, dead_row=None,
                              causal=False):
    """Random q, k, v, [mask], dO and the forward's O and logsumexp (from float64), and
    the float64 gradients (dq, dk, dv) of softmax(masked_fill(q k^T / sqrt(d), mask == 0,
    -1e9)) @ v: the kernel function's arguments in order, and the reference. The mask is
    random (70% kept), or with ``causal`` 1 where the key is not past the query;
    ``dead_row``: a query row it masks everywhere."""
    dv = dv or d
    gen = gen or torch.Generator().manual_seed(sq * 7 + sk + d)
    q, k = randn((b, h, sq, d), elem, gen), randn((b, h, sk, d), elem, gen)
    v, do = randn((b, h, sk, dv), elem, gen), randn((b, h, sq, dv), elem, gen)
    mask = None
    if mask_shape is not None:
        mask = (torch.rand(mask_shape, generator=gen) > 0.3).float()
        if causal:
            mask = torch.ones(mask_shape).tril()
        if dead_row is not None:
            mask[..., dead_row, :] = 0
    qd, kd, vd = (t.double().requires_grad_() for t in (q, k, v))
    x = qd @ kd.transpose(-1, -2) / d ** 0.5
    if mask is not None:
        x = x.masked_fill(mask == 0, -1e9)
    lse = torch.logsumexp(x, -1, keepdim=True)
    o = torch.softmax(x, -1) @ vd
    o.backward(do.double())
    args = [q, k, v] + ([mask] if mask is not None else []) + [o.detach().to(TORCH[elem]), lse.detach().float(), do]
    return args, (qd.grad, kd.grad, vd.grad)


def spirv_run_program(built: Built, emitted, args, out_specs):
    """Run a strategy's kernel and its prelude (written first, into a buffer the kernel
    then takes after its inputs) on the Vulkan device; returns the outputs."""
    from kf.passes.to_spirv import compile_spirv
    from kf.runtime.abi import KernelABI

    vulkan = vulkan_runtime()
    [binary] = compile_spirv(built.gpu_text())
    args = list(args)
    if emitted.prelude is not None:
        t = ir.RankedTensorType(emitted.prelude_output)
        elem = {"f32": torch.float32, "i32": torch.int32}[str(t.element_type)]
        buf = torch.zeros(list(t.shape), dtype=elem)
        k = binary.kernels[emitted.prelude.name]
        abi = KernelABI(k.entry, tuple(range(len(k.bindings))), grid=emitted.prelude.grid, block=k.workgroup_size,
                        extra=k.abi_extra())
        vulkan.launch(binary.binary, abi, args + [buf], written=[len(args)])
        args.append(buf)
    outs = [torch.full(s.shape, float("nan"), dtype=TORCH[s.elem]) for s in out_specs]
    k = binary.kernels[emitted.name]
    abi = KernelABI(k.entry, tuple(range(len(k.bindings))), grid=emitted.grid, block=k.workgroup_size,
                    extra=k.abi_extra())
    vulkan.launch(binary.binary, abi, args + outs, written=list(range(len(args), len(args) + len(outs))))
    return outs


def cuda_run_program(built: Built, emitted, args, out_specs):
    """Compile a strategy's kernels for the device's chip and launch them on torch tensors
    as kf's schedule does: the prelude into a buffer the kernel then takes after its
    inputs, the kernel, and the postlude (writing the results ``emitted.postlude_results``,
    which the kernel does not take). Returns the outputs (on the CPU) and the PTX."""
    from kf.passes import to_cuda
    from kf.runtime import cuda as kcuda

    cap = torch.cuda.get_device_capability()
    chip = "sm_90a" if cap == (9, 0) else "sm_{}{}".format(*cap)
    ptx = to_cuda.compile_to_ptx(built.gpu_text(), chip=chip)["kf_kernels"]
    module = kcuda.CudaModule(ptx)
    ins = [a.cuda() for a in args]
    if emitted.prelude is not None:
        t = ir.RankedTensorType(emitted.prelude_output)
        buf = torch.full(list(t.shape), float("nan"), dtype=torch.float32, device="cuda")
        p = emitted.prelude
        kcuda.CudaKernel(module, p.name, p.grid, p.block, p.shared_bytes, len(ins) + 1)(*ins, buf)
        ins.append(buf)
    outs = [torch.full(s.shape, float("nan"), dtype=TORCH[s.elem], device="cuda") for s in out_specs]
    taken = set(emitted.postlude_results)
    mine = [o for n, o in enumerate(outs) if n not in taken]
    kcuda.CudaKernel(module, emitted.name, emitted.grid, emitted.block, emitted.shared_bytes,
                     len(ins) + len(mine))(*ins, *mine)
    if emitted.postlude is not None:
        p = emitted.postlude
        theirs = [outs[n] for n in emitted.postlude_results]
        kcuda.CudaKernel(module, p.name, p.grid, p.block, p.shared_bytes, len(ins) + len(theirs))(*ins, *theirs)
    torch.cuda.synchronize()
    return [o.cpu() for o in outs], ptx


def ptxas_reports(built: Built, chip: str = "sm_90a"):
    """Every kernel's ptxas report (registers, spills), by name, and ptxas's log."""
    from kf.passes import to_cuda

    ptx = to_cuda.compile_to_ptx(built.gpu_text(), chip=chip)["kf_kernels"]
    assembled = to_cuda.assemble(ptx, chip)
    return ptx, assembled.kernels, assembled.log
