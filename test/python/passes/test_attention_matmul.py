"""The attention and matmul strategies on kernel functions built by hand, as kf-fuse makes
them (a ``func.func private`` with ``kf.kernel`` and a host function calling it).

Each kernel is emitted into ``gpu.module @kf_kernels``, compiled with kf-to-spirv and run
on the Vulkan device (lavapipe on CPU-only machines) against torch on fresh random
inputs; the same kernels are compiled with kf-to-cuda and assembled by ptxas for sm_90,
whose report must show no spills. Sizes are small (lavapipe is a CPU) but every size
that matters is not a multiple of the block sizes (257, 129, 65).
"""

from __future__ import annotations

import json
import math

import pytest
import torch
from kf import dialects as kd
from kf.dialects import builders as kb
from kf.dialects.types import TensorSpec
from kf.passes.strategies.base import NotApplicable, TargetInfo, strategy_for
from mlir import ir
from mlir.dialects import func

TORCH = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}
SPIRV, CUDA = TargetInfo.for_target("spirv"), TargetInfo.for_target("cuda")
HOPPER = TargetInfo.for_target("cuda", chip="sm_90a")  # wgmma


def _vulkan():
    from kf.runtime import vulkan

    return vulkan


needs_vulkan = pytest.mark.skipif(not _vulkan().is_available(), reason="no Vulkan device (mesa-vulkan-drivers)")


def _has_ptxas() -> bool:
    from kf.passes.to_cuda import ptxas_path

    return ptxas_path() is not None


needs_ptxas = pytest.mark.skipif(not _has_ptxas(), reason="ptxas not installed")


# ---- kernel functions as kf-fuse makes them ---------------------------------------------


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

    def emit(self, target: TargetInfo):
        """The strategy's plan and report; the kernel function is left in place."""
        with self.ctx, ir.Location.unknown():
            strategy = strategy_for(ir.StringAttr(self.kernel.attributes["kf.kernel"]).value)
            plan = strategy.plan(self.kernel.operation, target)
            emitted = strategy.emit(self.kernel.operation, plan, self.gpu_module, target)
        return plan, emitted

    def gpu_text(self) -> str:
        """The module as the back ends take it: container module and gpu.module only."""
        with self.ctx:
            return ("module attributes {gpu.container_module} {\n" + str(self.gpu_module) + "\n}\n")


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


def spirv_run(built: Built, emitted, args, out_shape, out_elem):
    from kf.passes.to_spirv import compile_spirv
    from kf.runtime.abi import KernelABI

    vulkan = _vulkan()
    [binary] = compile_spirv(built.gpu_text())
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


def randn(shape, elem, gen):
    return torch.randn(shape, generator=gen).to(TORCH[elem])


# ---- attention ---------------------------------------------------------------------------

ATTENTION_CASES = [
    # b, h, seq, d, elem, mask shape
    (1, 2, 256, 64, "f32", None),
    (2, 2, 257, 64, "f32", None),
    (2, 2, 257, 64, "f32", (257, 257)),
    (2, 2, 257, 64, "f32", (2, 1, 257, 257)),
    (1, 1, 130, 128, "f32", (130, 130)),
    (1, 2, 257, 64, "f16", (257, 257)),
    (1, 2, 130, 64, "bf16", None),
]


@needs_vulkan
@pytest.mark.parametrize("b,h,seq,d,elem,mask_shape", ATTENTION_CASES)
def test_attention_vulkan(b, h, seq, d, elem, mask_shape):
    built = attention(b, h, seq, seq, d, elem, mask_shape)
    plan, emitted = built.emit(SPIRV)
    gen = torch.Generator().manual_seed(seq * d + b)
    k, q, v = (randn((b, h, seq, d), elem, gen) for _ in range(3))
    args = [k, q, v]
    mask = None
    if mask_shape is not None:
        mask = (torch.rand(mask_shape, generator=gen) > 0.3).float()
        mask[..., 5, :] = 0  # one query row fully masked: torch gives it uniform weights
        args.append(mask)
    out, kernel = spirv_run(built, emitted, args, (b, h, seq, d), elem)
    assert kernel.workgroup_bytes == plan["shared_bytes"] <= SPIRV.max_shared_bytes
    want = attention_reference(k, q, v, mask)
    tol = {"f32": 2e-5, "f16": 2e-3, "bf16": 2e-2}[elem]
    torch.testing.assert_close(out.float(), want.to(TORCH[elem]).float(), rtol=tol, atol=tol)


@needs_vulkan
def test_attention_mul_scale_and_cross_lengths():
    """seq_q != seq_k (keys 70, queries 33), head dims of v and q differ, scale by mul."""
    built = attention(1, 3, 33, 70, 64, "f32", (33, 70), dv=32, scale_op="mul")
    _, emitted = built.emit(SPIRV)
    gen = torch.Generator().manual_seed(3)
    k, q, v = randn((1, 3, 70, 64), "f32", gen), randn((1, 3, 33, 64), "f32", gen), randn((1, 3, 70, 32), "f32", gen)
    mask = (torch.rand(33, 70, generator=gen) > 0.5).float()
    out, _ = spirv_run(built, emitted, [k, q, v, mask], (1, 3, 33, 32), "f32")
    torch.testing.assert_close(out, attention_reference(k, q, v, mask, "mul"), rtol=2e-5, atol=2e-5)


def bool_mask_attention(b, h, s, d, elem):
    """masked_fill(scores, mask, -inf-ish) with a boolean [b, 1, s, s] argument (torch's
    ``attn_mask`` convention inverted: true = masked), and an additive bias [s, s]."""
    specs = [TensorSpec((b, h, s, d), elem)] * 3 + [TensorSpec((b, 1, s, s), "i1"), TensorSpec((s, s), elem)]

    def body(q, k, v, mask, bias):
        sc = kb.add(kb.mul(kb.matmul(q, kb.transpose(k, perm=[0, 1, 3, 2])), kb.scalar(d ** -0.5, elem)), bias)
        return [kb.matmul(kb.softmax(kb.masked_fill(sc, mask, value=-1e4), dim=-1), v)]

    return Built("attention", specs, body)


def bool_mask_inputs(b, h, s, d, elem, seed):
    gen = torch.Generator().manual_seed(seed)
    q, k, v = (randn((b, h, s, d), elem, gen) for _ in range(3))
    mask = torch.rand((b, 1, s, s), generator=gen) > 0.7
    bias = randn((s, s), elem, gen)
    sc = (q.float() @ k.float().transpose(-1, -2)) * d ** -0.5 + bias.float()
    want = torch.softmax(sc.masked_fill(mask, -1e4), -1) @ v.float()
    return [q, k, v, mask, bias], want


@needs_vulkan
def test_attention_bool_mask_and_bias_vulkan():
    built = bool_mask_attention(2, 2, 100, 64, "f32")
    _, emitted = built.emit(SPIRV)
    args, want = bool_mask_inputs(2, 2, 100, 64, "f32", 21)
    out, _ = spirv_run(built, emitted, args, (2, 2, 100, 64), "f32")
    torch.testing.assert_close(out, want, rtol=2e-5, atol=2e-5)


def emit_with(built: Built, target: TargetInfo, **changes):
    """Emit with plan entries changed (what a tuning pass may do to a recorded plan)."""
    with built.ctx, ir.Location.unknown():
        strategy = strategy_for(ir.StringAttr(built.kernel.attributes["kf.kernel"]).value)
        plan = {**strategy.plan(built.kernel.operation, target), **changes}
        return plan, strategy.emit(built.kernel.operation, plan, built.gpu_module, target)


@needs_vulkan
@pytest.mark.parametrize("elem", ["f32", "f16"])
def test_vector_staging_on_vulkan(elem):
    """The 128-bit staging path (CUDA's) run on lavapipe, where kf-to-spirv splits the
    vector accesses into scalars: checks its index arithmetic for a transposed k, a
    transposed weight and whole-vector tails (seq 136, N 72, K 64: multiples of 8).
    Four lanes (SPIR-V has no vector<8xf16>), so 8 bytes for f16."""
    vb = 16 if elem == "f32" else 8
    built = attention(1, 2, 136, 136, 64, elem, (136, 136))
    _, emitted = emit_with(built, SPIRV, vector_bytes=vb)
    assert "vector.load" in built.gpu_text()
    gen = torch.Generator().manual_seed(8)
    k, q, v = (randn((1, 2, 136, 64), elem, gen) for _ in range(3))
    mask = (torch.rand(136, 136, generator=gen) > 0.3).float()
    out, _ = spirv_run(built, emitted, [k, q, v, mask], (1, 2, 136, 64), elem)
    tol = {"f32": 2e-5, "f16": 2e-3}[elem]
    torch.testing.assert_close(out.float(), attention_reference(k, q, v, mask).to(TORCH[elem]).float(),
                               rtol=tol, atol=tol)

    m, kk, n = 100, 64, 72
    mm = Built("matmul", [TensorSpec((m, kk), elem), TensorSpec((n, kk), elem)],
               lambda a, w: [kb.matmul(a, kb.transpose(w, perm=[1, 0]))])
    _, emitted = emit_with(mm, SPIRV, vector_bytes=vb)
    assert "vector.load" in mm.gpu_text()
    a, w = randn((m, kk), elem, gen), randn((n, kk), elem, gen)
    out, _ = spirv_run(mm, emitted, [a, w], (m, n), elem)
    torch.testing.assert_close(out.float(), (a.float() @ w.float().t()).to(TORCH[elem]).float(), rtol=tol, atol=tol)


@needs_vulkan
@pytest.mark.parametrize("b,h,sq,sk,d", [(2, 3, 1, 257, 64), (1, 2, 33, 40, 80)])
def test_attention_decode_and_odd_head_dim_vulkan(b, h, sq, sk, d):
    """One query row against 257 keys (decoding), and head dim 80 with short sequences."""
    built = attention(b, h, sq, sk, d, "f32", (sq, sk))
    _, emitted = built.emit(SPIRV)
    gen = torch.Generator().manual_seed(sq + sk)
    k, q, v = randn((b, h, sk, d), "f32", gen), randn((b, h, sq, d), "f32", gen), randn((b, h, sk, d), "f32", gen)
    mask = (torch.rand(sq, sk, generator=gen) > 0.3).float()
    out, _ = spirv_run(built, emitted, [k, q, v, mask], (b, h, sq, d), "f32")
    torch.testing.assert_close(out, attention_reference(k, q, v, mask), rtol=2e-5, atol=2e-5)


@needs_vulkan
def test_attention_rank3_vulkan():
    """q, k, v of rank 3 ([batch, seq, dim]) and the scale as a mul."""
    built = Built("attention", [TensorSpec((3, 50, 32), "f32")] * 3, lambda q, k, v: [
        kb.matmul(kb.softmax(kb.mul(kb.matmul(q, kb.transpose(k, perm=[0, 2, 1])), kb.scalar(0.2, "f32")), dim=-1),
                  v)])
    _, emitted = built.emit(SPIRV)
    gen = torch.Generator().manual_seed(2)
    q, k, v = (randn((3, 50, 32), "f32", gen) for _ in range(3))
    out, _ = spirv_run(built, emitted, [q, k, v], (3, 50, 32), "f32")
    torch.testing.assert_close(out, torch.softmax(q @ k.transpose(1, 2) * 0.2, -1) @ v, rtol=2e-5, atol=2e-5)


def test_attention_gpu_func_structure():
    """Workgroup Q, K/V, P and row-exchange buffers; barriers in the key loop; the only
    global buffers are the inputs and the output (no score matrix)."""
    built = attention(2, 2, 257, 257, 64, "f32", (257, 257))
    plan, emitted = built.emit(SPIRV)
    text = built.gpu_text()
    bm, bn = plan["block_m"], plan["block_n"]
    assert f"memref<{bm}x65xf32, #gpu.address_space<workgroup>>" in text  # Q, padded rows
    assert f"memref<{bn}x65xf32, #gpu.address_space<workgroup>>" in text  # K then V
    assert f"memref<{bm}x{bn + 1}xf32, #gpu.address_space<workgroup>>" in text  # P
    assert text.count("gpu.barrier") == 6  # five per key block, one for the final row sums
    assert f"step %c{bn}" in text  # the key-block loop
    args = text.split("gpu.func @k_attention(")[1].split(")")[0]
    assert args.count("memref<") == 5 and "257x257xf32>, %arg4: memref<2x2x257x64xf32>" in args
    assert emitted.grid == (math.ceil(257 / bm), 4, 1) and emitted.block == (plan["threads"], 1, 1)


@pytest.mark.parametrize("target", [SPIRV, CUDA], ids=["spirv", "cuda"])
@pytest.mark.parametrize("d", [64, 128])
def test_attention_plan(target, d):
    built = attention(2, 8, 256, 256, d, "f16", (256, 256))
    with built.ctx:
        plan = strategy_for("attention").plan(built.kernel.operation, target)
    assert json.loads(json.dumps(plan)) == plan
    assert plan["shared_bytes"] <= target.max_shared_bytes and plan["threads"] <= target.max_threads
    if plan["mma"]:  # f16 on CUDA: 4 warps of 16 query rows, K and V tiles in f16
        assert target is CUDA and (plan["threads"], plan["block_m"]) == (128, 64)
        assert plan["shared_bytes"] == 2 * plan["block_n"] * 2 * (d + 8)
    else:
        assert plan["threads"] == plan["block_m"] * plan["lanes_per_row"]
        assert d % plan["lanes_per_row"] == 0 and plan["block_n"] % plan["lanes_per_row"] == 0
    assert plan["grid"] == [math.ceil(256 / plan["block_m"]), 16, 1]


def test_attention_not_applicable():
    # softmax over another dim
    specs = [TensorSpec((1, 1, 16, 8), "f32")] * 3
    bad = Built("attention", specs, lambda q, k, v: [
        kb.matmul(kb.softmax(kb.matmul(q, kb.transpose(k, perm=[0, 1, 3, 2])), dim=2), v)])
    with bad.ctx, pytest.raises(NotApplicable, match="last dimension"):
        strategy_for("attention").plan(bad.kernel.operation, SPIRV)
    # a reduction between the matmuls
    bad = Built("attention", specs, lambda q, k, v: [
        kb.matmul(kb.softmax(kb.log_softmax(kb.matmul(q, kb.transpose(k, perm=[0, 1, 3, 2])), dim=-1), dim=-1), v)])
    with bad.ctx, pytest.raises(NotApplicable):
        strategy_for("attention").plan(bad.kernel.operation, SPIRV)
    # no softmax at all
    bad = Built("attention", specs, lambda q, k, v: [kb.matmul(kb.matmul(q, kb.transpose(k, perm=[0, 1, 3, 2])), v)])
    with bad.ctx, pytest.raises(NotApplicable, match="softmax"):
        strategy_for("attention").plan(bad.kernel.operation, SPIRV)


@needs_ptxas
@pytest.mark.parametrize("d,elem,sq", [(64, "f32", 257), (128, "f32", 257), (128, "f32", 2), (65, "f32", 1),
                                       (40, "bf16", 3), (1, "f32", 17), (8, "bf16", 1)])
def test_attention_ptxas(d, elem, sq):
    """The SIMT kernel (f32 on CUDA; bf16 where the head dim is no multiple of 16), also
    with a short query block and head dims that the lanes of a row do not divide (where
    the head dim is no multiple of 4 the kernel does not unroll the dot products; ptxas
    does, into up to 255 registers)."""
    built = attention(2, 8, sq, 257, d, elem, (sq, 257))
    plan, _ = built.emit(CUDA)
    ptx, r = cuda_report(built)
    assert r["spill_store_bytes"] == 0 and r["spill_load_bytes"] == 0 and r["stack_bytes"] == 0, r
    assert r["shared_bytes"] == plan["shared_bytes"] and r["registers"] <= (128 if sq == 257 else 255), r
    assert "bar.sync" in ptx and "ex2.approx" in ptx  # barriers; exp through libdevice's exp2


@needs_ptxas
@pytest.mark.parametrize("d,elem", [(64, "f16"), (64, "bf16"), (80, "f16"), (128, "f16"), (128, "bf16")])
def test_attention_tensor_cores_ptxas(d, elem):
    """On CUDA, f16/bf16 attention takes the mma.sync m16n8k16 kernel."""
    built = attention(2, 8, 257, 257, d, elem, (257, 257))
    plan, emitted = built.emit(CUDA)
    assert plan["mma"] and plan["block_m"] == 64 and emitted.notes["tensor_cores"] == "mma.sync.m16n8k16"
    ptx, r = cuda_report(built)
    assert f"mma.sync.aligned.m16n8k16.row.col.f32.{elem}.{elem}.f32" in ptx
    assert "shfl.sync.bfly" in ptx  # row statistics over the quad
    assert r["spill_store_bytes"] == 0 and r["spill_load_bytes"] == 0 and r["stack_bytes"] == 0, r
    assert r["shared_bytes"] == plan["shared_bytes"], r
    # K and V fragments by ldmatrix (V transposed), masked blocks skipped by a workgroup OR
    assert ("ldmatrix.sync.aligned.m8n8.x4.shared.b16" in ptx) == (d % 16 == 0) == plan["ldmatrix"]
    assert ".trans" in ptx if plan["ldmatrix"] else True
    assert plan["skip_masked_blocks"] and "bar.red.or.pred" in ptx


@needs_ptxas
@pytest.mark.parametrize("d", [64, 128])
def test_unmasked_attention_has_no_block_skipping(d):
    """Without a mask nothing is skipped, and K and V are double-buffered by cp.async
    instead (two stacked stages)."""
    built = attention(2, 8, 257, 257, d, "bf16")
    plan, emitted = built.emit(CUDA)
    ptx, r = cuda_report(built)
    assert not plan["skip_masked_blocks"] and "bar.red" not in ptx
    assert plan["stages"] == 2 and "cp.async.cg.shared.global" in ptx and "cp.async.wait_group" in ptx
    assert r["spill_store_bytes"] == 0 and r["shared_bytes"] + emitted.shared_bytes >= plan["shared_bytes"], r


@needs_ptxas
@pytest.mark.parametrize("mask_shape,staged", [((2048, 2048), True), ((1, 1, 2048, 2048), True),
                                               ((2, 1, 2048, 2048), False)])
def test_attention_wgmma_stages_the_mask(mask_shape, staged, monkeypatch):
    """Without the block table (BLOCK_TABLE off), with a mask shared by every head (a
    causal mask), the skipping wgmma kernel stages each block's mask tile in shared
    memory by cp.async (swizzled), and
    double-buffers K and V as the unmasked kernel does; a mask per batch stays in global
    memory. Both read the mask twice a block (the test, then the masked softmax of the
    blocks the mask does not leave whole)."""
    from kf.passes.strategies import attention_wgmma

    monkeypatch.setattr(attention_wgmma, "BLOCK_TABLE", False)
    built = attention(2, 8, 2048, 2048, 128, "bf16", mask_shape, mask_elem="bf16")
    plan, emitted = built.emit(HOPPER)
    assert plan["wgmma"] and plan["skip_masked_blocks"] and plan["stages"] == 2 and not plan["block_table"]
    mask_arg = 3
    assert plan["staged_masks"] == ([mask_arg] if staged else [])
    unstaged = 2 * (128 * 128 + 2 * 128 * 256) + 1024  # Q, two stages of K and V
    assert plan["shared_bytes"] == unstaged + (2 * 128 * 128 * 2 if staged else 0) and plan["mask_stages"] == staged * 2
    ptx, r = cuda_report(built, "sm_90a")
    # at 255 registers ptxas spills a little with the double-buffered mask (80 bytes on
    # ptxas 12.x); that variant measured fastest all the same (see attention_wgmma.py)
    assert r["spill_store_bytes"] <= (128 if staged else 0) and r["registers"] <= 255, r
    loads = [ln.split()[0] for ln in ptx.splitlines() if ln.strip().startswith(("ld.global", "ld.shared"))]
    assert loads and all(ld.startswith("ld.shared" if staged else "ld.global") for ld in loads), set(loads)
    assert "bar.red.or.pred" in ptx


def test_attention_tensor_cores_only_where_they_apply():
    for target, elem, d, mma in [(CUDA, "f32", 64, False), (SPIRV, "f16", 64, False), (CUDA, "f16", 72, False),
                                 (CUDA, "bf16", 64, True)]:
        built = attention(1, 1, 40, 40, d, elem)
        with built.ctx:
            assert strategy_for("attention").plan(built.kernel.operation, target)["mma"] is mma, (target, elem, d)


# ---- matmul ------------------------------------------------------------------------------


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


@needs_vulkan
@pytest.mark.parametrize("elem", ["f32", "f16", "bf16"])
def test_matmul_bias_gelu_vulkan(elem):
    m, k, n = 257, 65, 129
    built = matmul_bias_gelu(m, k, n, elem)
    plan, emitted = built.emit(SPIRV)
    gen = torch.Generator().manual_seed(11)
    a, b, bias = randn((m, k), elem, gen), randn((k, n), elem, gen), randn((n,), elem, gen)
    out, kernel = spirv_run(built, emitted, [a, b, bias], (m, n), elem)
    assert kernel.workgroup_bytes == plan["shared_bytes"]
    want = torch.nn.functional.gelu(a.float() @ b.float() + bias.float())
    tol = {"f32": 1e-5, "f16": 1e-2, "bf16": 5e-2}[elem]
    torch.testing.assert_close(out.float(), want.to(TORCH[elem]).float(), rtol=tol, atol=tol)


@needs_vulkan
@pytest.mark.parametrize("elem,transpose_b", [("f32", False), ("f16", True), ("bf16", False)])
def test_matmul_batched_broadcast_vulkan(elem, transpose_b):
    built, (m, k, n, bshape) = matmul_batched(elem, transpose_b)
    _, emitted = built.emit(SPIRV)
    assert emitted.grid[2] == 6
    gen = torch.Generator().manual_seed(5)
    a, b, s = randn((2, 1, m, k), elem, gen), randn(bshape, elem, gen), torch.tensor(0.7).to(TORCH[elem])
    out, _ = spirv_run(built, emitted, [a, b, s], (2, 3, m, n), "f32")
    bb = b.float().transpose(-1, -2) if transpose_b else b.float()
    torch.testing.assert_close(out, (a.float() @ bb) * s.float(), rtol=1e-5, atol=1e-4)


@needs_vulkan
@pytest.mark.parametrize("m,k,n", [(5, 1, 7), (1, 33, 300)])
def test_matmul_degenerate_vulkan(m, k, n):
    """K = 1 and a single row, with a relu epilogue."""
    built = Built("matmul", [TensorSpec((m, k), "f32"), TensorSpec((k, n), "f32")],
                  lambda a, b: [kb.relu(kb.matmul(a, b))])
    _, emitted = built.emit(SPIRV)
    gen = torch.Generator().manual_seed(m * n)
    a, b = randn((m, k), "f32", gen), randn((k, n), "f32", gen)
    out, _ = spirv_run(built, emitted, [a, b], (m, n), "f32")
    torch.testing.assert_close(out, torch.relu(a @ b), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("target", [SPIRV, CUDA], ids=["spirv", "cuda"])
def test_matmul_plan(target):
    built = matmul_bias_gelu(257, 65, 129, "f16")
    with built.ctx:
        plan = strategy_for("matmul").plan(built.kernel.operation, target)
    assert json.loads(json.dumps(plan)) == plan
    assert plan["shared_bytes"] <= target.max_shared_bytes and plan["threads"] <= target.max_threads
    assert plan["grid"] == [math.ceil(129 / plan["block_n"]), math.ceil(257 / plan["block_m"]), 1]
    assert plan["mma"] is (target is CUDA)  # f16 operands: tensor cores on CUDA only
    if plan["mma"]:  # a small problem: 64x64 tiles of 4 warps
        assert (plan["block_m"], plan["block_n"], plan["threads"]) == (64, 64, 128)


def test_matmul_not_applicable():
    two = Built("matmul", [TensorSpec((8, 8), "f32")] * 2, lambda a, b: [kb.matmul(kb.matmul(a, b), b)])
    with two.ctx, pytest.raises(NotApplicable, match="2 matmuls"):
        strategy_for("matmul").plan(two.kernel.operation, SPIRV)
    red = Built("matmul", [TensorSpec((8, 8), "f32")] * 2, lambda a, b: [kb.softmax(kb.matmul(a, b), dim=-1)])
    with red.ctx, pytest.raises(NotApplicable):
        strategy_for("matmul").plan(red.kernel.operation, SPIRV)


@needs_ptxas
@pytest.mark.parametrize("elem", ["f32", "f16", "bf16"])
def test_matmul_ptxas(elem):
    """f32: the SIMT GEMM (FFMA); f16/bf16: the mma.sync m16n8k16 GEMM."""
    built = matmul_bias_gelu(2048, 512, 1024, elem)
    plan, emitted = built.emit(CUDA)
    assert (plan["block_m"], plan["block_n"], plan["mma"]) == (128, 128, elem != "f32")
    ptx, r = cuda_report(built)
    assert r["spill_store_bytes"] == 0 and r["spill_load_bytes"] == 0, r
    # static shared memory (ptxas's figure) plus the dynamic window the launch gives
    assert r["shared_bytes"] + emitted.shared_bytes >= plan["shared_bytes"], (r, emitted)
    assert "bar.sync" in ptx
    if elem == "f32":
        assert "fma.rn.f32" in ptx and "mma.sync" not in ptx
    else:
        assert f"mma.sync.aligned.m16n8k16.row.col.f32.{elem}.{elem}.f32" in ptx
        # the default tensor-core plan is a 4-stage cp.async pipeline past 48 KiB
        assert plan["stages"] == 4 and plan["dynamic_shared"] and emitted.shared_bytes > 48 * 1024
        assert "cp.async.cg.shared.global" in ptx and "cp.async.wait_group" in ptx
        assert ".extern .shared .align 16 .b8 __dynamic_shmem__0[];" in ptx


@needs_ptxas
@pytest.mark.parametrize("switches", [{"MMA_STAGES": 1}, {"MMA_STAGES": 2}, {"MMA_STAGES": 3, "MMA_WARP_TILES": (4, 4)},
                                      {"MMA_STAGES": 4, "MMA_WARP_TILES": (4, 8)}, {"MMA_GROUP_M": 0}])
def test_matmul_plan_variants_assemble(switches, monkeypatch):
    """The GEMM plan variants bench/variants.py times assemble without spills: one staged
    tile with register prefetch (no cp.async), 2-4 pipeline stages, 64 x 64 warp tiles,
    workgroups in grid order."""
    from kf.passes.strategies import matmul as mm

    for k, v in switches.items():
        monkeypatch.setattr(mm, k, v)
    built = matmul_bias_gelu(4096, 4096, 1024, "bf16")
    plan, emitted = built.emit(CUDA)
    ptx, r = cuda_report(built)
    assert r["spill_store_bytes"] == 0 and r["spill_load_bytes"] == 0, r
    assert plan["stages"] == switches.get("MMA_STAGES", mm.MMA_STAGES)
    assert ("cp.async.cg" in ptx) == (plan["stages"] > 1)
    assert (plan["block_m"], plan["block_n"]) == (128, 32 * tuple(mm.MMA_WARP_TILES)[1])


def matmul_nt(m, k, n, elem):
    """a @ b.T with b stored [n, k] (nn.Linear's weight): both operands K-major."""
    return Built("matmul", [TensorSpec((m, k), elem), TensorSpec((n, k), elem)],
                 lambda a, b: [kb.matmul(a, kb.transpose(b, perm=[1, 0]))])


@needs_ptxas
@pytest.mark.parametrize("layout,elem", [("nn", "bf16"), ("nt", "bf16"), ("nn", "f16"), ("nt", "f8E4M3FN"),
                                         ("nt", "f8E5M2")])
def test_matmul_wgmma_ptxas(layout, elem):
    """On sm_90a the GEMM is wgmma: m64n256 (k16, k32 for fp8) from 128-byte swizzled
    tiles, B transposed by the instruction when it lies k-by-n, a cp.async pipeline whose
    copies are fenced for the async proxy; ptxas neither spills nor serializes the wgmmas."""
    built = matmul_bias_gelu(8192, 4096, 8192, elem) if layout == "nn" else matmul_nt(8192, 4096, 8192, elem)
    plan, emitted = built.emit(HOPPER)
    assert plan["wgmma"] and (plan["block_m"], plan["block_n"], plan["threads"]) == (128, 256, 256)
    assert plan["block_k"] * (1 if elem.startswith("f8") else 2) == 128 and plan["b_k_major"] == (layout == "nt")
    ptx, r, log = cuda_report(built, "sm_90a", log=True)
    assert r["spill_store_bytes"] == 0 and r["spill_load_bytes"] == 0, r
    ptx_t = {"f8E4M3FN": "e4m3", "f8E5M2": "e5m2"}.get(elem, elem)
    k = 32 if elem.startswith("f8") else 16
    inst = [ln.split()[0] for ln in ptx.splitlines() if ln.startswith("wgmma.mma_async")]
    assert inst and set(inst) == {f"wgmma.mma_async.sync.aligned.m64n256k{k}.f32.{ptx_t}.{ptx_t}"}
    # the immediates after the descriptors: scale-d predicate, scale-a, scale-b, trans-a, trans-b
    mma = next(ln for ln in ptx.splitlines() if ln.startswith("wgmma.mma_async"))
    tail = "p,1,1;" if elem.startswith("f8") else f"p,1,1,0,{int(layout == 'nn')};"  # fp8: no transposes
    assert mma.replace(" ", "").endswith(tail)
    assert "fence.proxy.async.shared::cta" in ptx and "wgmma.wait_group.sync.aligned \t1" in ptx
    assert "cp.async.cg.shared.global" in ptx and "serialized" not in log
    assert emitted.shared_bytes == plan["shared_bytes"] == plan["stages"] * (128 + 256) * 128 + 1024


def test_matmul_wgmma_only_where_it_applies():
    """mma.sync stays for sm_90 (not sm_90a), rows that are not 16-byte pieces (cp.async),
    a transposed A, fp8 with a k-by-n B (wgmma transposes 16-bit types only), and f32."""
    def plan(built, target=HOPPER):
        with built.ctx, ir.Location.unknown():
            return strategy_for("matmul").plan(built.kernel.operation, target)

    assert plan(matmul_bias_gelu(512, 512, 512, "bf16"))["wgmma"]
    assert "wgmma" not in plan(matmul_bias_gelu(512, 512, 512, "bf16"), CUDA)
    assert "wgmma" not in plan(matmul_bias_gelu(512, 65, 512, "bf16"))
    assert "wgmma" not in plan(matmul_bias_gelu(512, 512, 500, "bf16"))  # B's rows: 1000 bytes
    assert plan(matmul_bias_gelu(512, 512, 504, "bf16"))["wgmma"]
    assert "wgmma" not in plan(matmul_bias_gelu(512, 512, 516, "f8E4M3FN"))
    assert plan(matmul_nt(512, 512, 512, "f8E4M3FN"))["wgmma"]
    assert not plan(matmul_bias_gelu(512, 512, 512, "f32"))["mma"]
    ta = Built("matmul", [TensorSpec((64, 512), "bf16"), TensorSpec((64, 512), "bf16")],
               lambda a, b: [kb.matmul(kb.transpose(a, perm=[1, 0]), b)])
    assert "wgmma" not in plan(ta)
    # small outputs narrow the tile until the grid is about a wave
    assert plan(matmul_bias_gelu(512, 512, 512, "bf16"))["block_n"] == 64


# ---- from the seed through kf-fuse and kf-map-to-gpu -------------------------------------


@needs_vulkan
def test_seed_attention_through_the_pipeline():
    """The seed's fused_attention captured, fused, tiled and mapped by the kf passes for
    SPIR-V: the attention strategy writes its kernel, which runs against torch with the
    buffers in the order the host function's call passes them."""
    import kf
    import seed_examples
    from kf.passes import pipeline
    from kf.passes.to_spirv import compile_spirv
    from kf.runtime.abi import KernelABI

    gen = torch.Generator().manual_seed(1)
    q, k, v = (torch.randn(1, 2, 65, 64, generator=gen) for _ in range(3))
    mask = (torch.rand(65, 65, generator=gen) > 0.2).float()
    text = str(kf.inspect(seed_examples.fused_attention.fn, q, k, v, mask).kf_ir)
    ctx = kd.make_context()
    with ctx, ir.Location.unknown():
        module = ir.Module.parse(text)
        pm, _ = pipeline.build("builtin.module(kf-fuse, kf-tile{target=spirv}, kf-map-to-gpu{target=spirv})", ctx)
        pm.run(module.operation)
        host = next(op for op in module.body.operations if op.operation.name == "func.func"
                    and "kf.kernel" not in op.operation.attributes)
        [call] = [op for op in host.regions[0].blocks[0].operations if op.operation.name == "func.call"]
        order = [ir.BlockArgument(x).arg_number for x in call.operation.operands]
        gmod = next(op.operation for op in module.body.operations if op.operation.name == "gpu.module")
        [gfunc] = [op.operation for op in gmod.regions[0].blocks[0].operations]
        assert ir.StringAttr(gfunc.attributes["kf.strategy"]).value == "attention"
        grid = tuple(ir.DenseI64ArrayAttr(gfunc.attributes["kf.grid"]))
        text = "module attributes {gpu.container_module} {\n" + str(gmod) + "\n}\n"
    [binary] = compile_spirv(text)
    [kernel] = binary.kernels.values()
    user = [q, k, v, mask]
    out = torch.full((1, 2, 65, 64), float("nan"))
    abi = KernelABI(kernel.entry, tuple(range(len(kernel.bindings))), grid=grid, block=kernel.workgroup_size,
                    extra=kernel.abi_extra())
    _vulkan().launch(binary.binary, abi, [user[i] for i in order] + [out], written=[4])
    torch.testing.assert_close(out, seed_examples.fused_attention.fn(q, k, v, mask), rtol=2e-5, atol=2e-5)


@needs_ptxas
def test_block_table_kernel_in_the_schedule():
    """On sm_90a the seed's attention with a causal mask tensor gets the block table: a
    kernel of its own, launched first with the attention kernel's inputs, whose i32
    table the attention kernel takes as one more input; the ABI numbers it as a
    temporary between the two launches. With PERSISTENT_WALK (queries and keys fill
    whole blocks) the table is 4 x 21: 4 key blocks' codes, 4 live-row words a block and
    the tile counter."""
    import kf
    import seed_examples
    from kf import gpu_codegen
    from kf.passes import pipeline

    q, k, v = (torch.randn(2, 4, 512, 128).to(torch.bfloat16) for _ in range(3))
    mask = torch.tril(torch.ones(512, 512)).to(torch.bfloat16)
    captured = kf.inspect(seed_examples.fused_attention.with_options(target="cuda"), q, k, v, mask)
    ctx = kd.make_context()
    with ctx, ir.Location.unknown():
        module = ir.Module.parse(str(captured.kf_ir))
        pm, _ = pipeline.build("builtin.module(kf-fuse, kf-tile{target=cuda chip=sm_90a}, "
                               "kf-map-to-gpu{target=cuda chip=sm_90a})", ctx)
        pm.run(module.operation)
        abi, _, _ = gpu_codegen.schedule_abi(module, "fused_attention", ["q", "k", "v", "mask"], "cuda")
    blocks, attn = abi.kernels
    assert blocks.entry.endswith("_attention_blocks") and attn.entry.endswith("_attention")
    [table] = abi.temporaries
    assert table.shape == (4, 21) and table.elem == "i32"
    n_in = len(abi.inputs)
    table_buffer = n_in + len(abi.outputs)
    assert blocks.args == attn.args[:n_in] + (table_buffer,) and blocks.grid == (4, 4, 1)
    assert attn.args[n_in] == table_buffer and attn.args[n_in + 1] == n_in  # then the output


def _ptx_entries(ptx: str) -> dict[str, str]:
    """The PTX text of each .entry (a kernel), by name."""
    out, name = {}, None
    for line in ptx.splitlines():
        if ".entry" in line:
            name = line.split(".entry")[1].split("(")[0].strip()
            out[name] = ""
        if name is not None:
            out[name] += line + "\n"
    return out


def _nested_ops(op: ir.Operation):
    for region in op.regions:
        for block in region.blocks:
            for inner in block.operations:
                yield inner.operation
                yield from _nested_ops(inner.operation)


def _causal_branches(gfunc: ir.Operation, mask_arg: ir.Value) -> list[tuple[int, int, int]]:
    """(causal compares, mask loads in the then-region, mask loads in the else-region) of
    each scf.if that chooses between the computed causal mask (i32 ``slt`` compares of
    the row offsets, attention.online_softmax) and the mask read from memory."""
    def counts(ops):
        slt = sum(1 for o in ops if o.name == "arith.cmpi"  # predicate 2: slt
                  and ir.IntegerAttr(o.attributes["predicate"]).value == 2 and str(o.operands[0].type) == "i32")
        loads = sum(1 for o in ops if o.name == "memref.load" and o.operands[0] == mask_arg)
        return slt, loads

    def region_ops(region):
        return [o for b in region.blocks for x in b.operations for o in [x.operation, *_nested_ops(x.operation)]]

    found = []
    for op in _nested_ops(gfunc):
        if op.name != "scf.if" or len(op.regions[1].blocks) == 0:
            continue
        (slt, then_loads), (_, else_loads) = counts(region_ops(op.regions[0])), counts(region_ops(op.regions[1]))
        if slt and else_loads:
            found.append((slt, then_loads, else_loads))
    return found


#: Switch sets of the block-table kernel (attention_wgmma.py) and what ptxas gives for
#: them at 4x32x2048x128 with a causal mask: spilled bytes allowed, and whether ptxas
#: serializes the wgmmas. The per-block loop (no walk) at 255 registers spills a little;
#: it is kept as a variant to time and for more than 64 key blocks. All without the
#: producer warpgroup: the two-stage walk, which head dims over 128 keep
#: (test_block_table_walk_warp_specialized: the walk with one).
_TWO_STAGES = {"WARP_SPECIALIZED": False}
TABLE_SWITCHES = {
    "default": (_TWO_STAGES, 0, False),
    "no-walk": ({**_TWO_STAGES, "TABLE_WALK": False}, 64, False),
    "no-causal-class": ({**_TWO_STAGES, "CAUSAL_BLOCKS": False}, 0, False),
    "divergent-branches": ({**_TWO_STAGES, "UNIFORM_BRANCHES": False}, 0, True),
    "session-4": ({**_TWO_STAGES, "CAUSAL_BLOCKS": False, "TABLE_WALK": False, "UNIFORM_BRANCHES": False}, 0, True),
}


@needs_ptxas
@pytest.mark.parametrize("name", list(TABLE_SWITCHES))
def test_block_table_causal_class_and_walk(name, monkeypatch):
    """The block table's fourth class, the walk over live blocks and uniform branches,
    on the shape the benchmark times (4x32x2048x128 bf16, a [2048, 2048] causal mask).

    CAUSAL_BLOCKS: the table kernel ANDs a third predicate (the mask equals key > query
    on the block: a second bar.red.and), and the attention kernel has a branch that
    computes the mask from the row offsets (64 i32 compares a thread) and reads no mask
    element, beside the branch that reads them. TABLE_WALK: the kernel reads its row of
    the table once (ballots, popc) and loops over the live blocks with one barrier a
    block; without it every block loads its table entries and passes two barriers.
    UNIFORM_BRANCHES: without it ptxas serializes the wgmmas (C7520), as it did in
    session 4's kernel. ptxas: no spills in the default kernel."""
    from kf.passes.strategies import attention_wgmma

    switches, spill, serialized = TABLE_SWITCHES[name]
    for k, v in switches.items():
        monkeypatch.setattr(attention_wgmma, k, v)
    causal, walk = attention_wgmma.CAUSAL_BLOCKS, attention_wgmma.TABLE_WALK
    built = attention(4, 32, 2048, 2048, 128, "bf16", (2048, 2048), mask_elem="bf16")
    plan, emitted = built.emit(HOPPER)
    assert plan["block_table"] == [16, 16] and plan["mask_stages"] == 0 and not plan["staged_masks"]
    ptx, r, log = cuda_report(built, "sm_90a", log=True)
    entries = _ptx_entries(ptx)
    attn, blocks = entries[emitted.name], entries[emitted.prelude.name]
    assert r["spill_store_bytes"] <= spill and r["registers"] <= 255, r
    assert ("C7520" in log) == serialized, log
    assert blocks.count("bar.red.and") == (2 if causal else 1) and blocks.count("bar.red.or") == 1
    assert ("popc.b64" in attn) == walk
    # barriers in the loop: the walk's one (after fence.proxy), or the per-block loop's two
    assert attn.count("bar.sync") == (1 if walk else 2), attn.count("bar.sync")
    with built.ctx:
        gfunc = next(op.operation for op in built.gpu_module.regions[0].blocks[0].operations
                     if ir.StringAttr(op.operation.attributes["sym_name"]).value == emitted.name)
        branches = _causal_branches(gfunc, gfunc.regions[0].blocks[0].arguments[3])
    if causal:  # 2 rows x 16 tiles x 2 columns a thread; no mask element read there
        assert branches == [(64, 0, 64)], branches
    else:
        assert branches == []


@needs_ptxas
@pytest.mark.parametrize("overlap,persistent", [(True, True), (True, False), (False, False)],
                         ids=["persistent", "overlap-pv", "serial"])
@pytest.mark.parametrize("d", [128, 64])
def test_block_table_walk_warp_specialized(d, overlap, persistent, monkeypatch):
    """The walk over the table's live blocks with a producer warpgroup (WARP_SPECIALIZED,
    the benchmark's causal shape): both warpgroup kinds walk the same bit mask (popc,
    and the next block by cttz: brev + bfind in PTX); the producer copies Q under a
    barrier of its own and each live block into stage i % 3; the consumers take
    linear_softmax in whole and causal blocks (LINEAR_MASKED_BLOCKS: ex2.approx.ftz)
    beside the online softmax of the partial ones. Not persistent (7 mbarriers), the
    consumers reduce their rare second pass's test over their own 256 threads (bar.red
    on named barrier 1, which the workgroup-wide NVVM op cannot); ptxas spills a little
    (84 bytes with WALK_OVERLAP_PV at 128, 56 at 64, 20 without), measured faster anyway.
    PERSISTENT_WALK: 132 workgroups; the producer claims a tile by one atomic add and
    hands it round on named barrier 3 (its 128 threads), ORs the table's live-row words
    (four redux.sync) instead of a second pass, and gives the consumers the tile on Q's
    barrier; an eighth mbarrier for Q's release; no spill and no second pass."""
    from kf.passes.strategies import attention_wgmma

    monkeypatch.setattr(attention_wgmma, "WALK_OVERLAP_PV", overlap)
    monkeypatch.setattr(attention_wgmma, "PERSISTENT_WALK", persistent)
    built = attention(4, 32, 2048, 2048, d, "bf16", (2048, 2048), mask_elem="bf16")
    plan, emitted = built.emit(HOPPER)
    assert plan["warp_specialized"] and plan["stages"] == 3 and plan["threads"] == 384, plan
    assert bool(plan["persistent_walk"]) == persistent and emitted.grid == ((132, 1, 1) if persistent else (16, 128, 1))
    ptx, r, log = cuda_report(built, "sm_90a", log=True)
    attn = _ptx_entries(ptx)[emitted.name]
    assert "serialized" not in log, log
    assert r["spill_store_bytes"] <= (0 if persistent else 96 if overlap else 24), r
    assert attn.count("mbarrier.init.shared.b64") == (8 if persistent else 7) and attn.count("popc.b64") >= 2
    assert ("bar.red.or.pred p, 1, 256, q" in attn) != persistent
    assert attn.count("atom.global.add.u32") == persistent and attn.count("bar.sync \t3, 128") == persistent
    assert attn.count("redux.sync.or.b32") == 4 * persistent
    assert attn.count("ex2.approx.ftz.f32") >= 64 and "setmaxnreg.inc.sync.aligned.u32 \t240" in attn
    waits = [ln.split()[-1] for ln in attn.splitlines() if "wgmma.wait_group.sync.aligned" in ln]
    assert ("1;" in waits) == overlap, waits


@needs_ptxas
@pytest.mark.parametrize("seq,d,mask_shape,mask_elem,switches", [
    (2048, 64, (2048, 2048), "bf16", {}), (4096, 128, (4096, 4096), "bf16", {}), (300, 128, (300, 300), "bf16", {}),
    (513, 128, (2, 1, 513, 513), "f32", {}), (2048, 128, (2048, 2048), "bf16", {"BLOCK_TABLE": False}),
    (8300, 64, (8300, 8300), "f32", {})],
    ids=["2048-d64", "4096", "300-tails", "mask-per-batch", "no-table", "8300-per-block-loop"])
def test_masked_wgmma_attention_keeps_wgmma_async(seq, d, mask_shape, mask_elem, switches, monkeypatch):
    """Every skipping loop of the wgmma kernel (the walk, the per-block loop with the
    table beyond 64 key blocks, the in-kernel test without a table or for a mask per
    batch) branches on warp votes, so ptxas neither serializes the wgmmas (C7520) nor
    spills."""
    from kf.passes.strategies import attention_wgmma

    for k, v in switches.items():
        monkeypatch.setattr(attention_wgmma, k, v)
    built = attention(2, 2, seq, seq, d, "bf16", mask_shape, mask_elem=mask_elem)
    plan, _ = built.emit(HOPPER)
    assert plan["wgmma"] and plan["skip_masked_blocks"]
    _, r, log = cuda_report(built, "sm_90a", log=True)
    assert "serialized" not in log, log
    # without the table the mask tile's staging costs registers: ptxas spilled 84 bytes
    # there in session 4 already. The walk with a producer warpgroup (WARP_SPECIALIZED,
    # consumers at 240 registers, WALK_OVERLAP_PV) spills 84 bytes at head dim 128, 56 at
    # 64, and 16 with tails (the walk without the overlap); measured faster all the same.
    allowed = 128 if switches else {True: 96 if seq % 128 == 0 else 16, False: 0}[plan["warp_specialized"]]
    assert r["spill_store_bytes"] <= allowed, r


# ---- CUDA: run where a GPU is (the H200 device machine) -------------------------------------

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")


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


#: The tensor-core attention's key loops (AttentionStrategy switches): K and V staged
#: synchronously, with register prefetch, or double-buffered by cp.async.
ATTENTION_LOOPS = {"sync": {"PIPELINE": False, "PREFETCH": False}, "prefetch": {"PIPELINE": False, "PREFETCH": True},
                   "cp.async": {"PIPELINE": True, "PREFETCH": False},
                   "cp.async-8warps": {"PIPELINE": True, "PREFETCH": False, "MMA_WARPS": 8},
                   "wgmma": {}, "wgmma-3warpgroups": {"WARPGROUPS": 3}}


def hopper_only():
    if torch.cuda.is_available() and torch.cuda.get_device_capability() != (9, 0):
        pytest.skip("wgmma needs an sm_90 device")
    return HOPPER


@pytest.fixture(params=list(ATTENTION_LOOPS))
def attention_loop(request, monkeypatch) -> TargetInfo:
    """The target to plan for with the loop's switches set: sm_90 (mma.sync) or, for
    the wgmma loops, sm_90a."""
    from kf.passes.strategies import attention_wgmma
    from kf.passes.strategies.attention import AttentionStrategy

    for k, v in ATTENTION_LOOPS[request.param].items():
        monkeypatch.setattr(attention_wgmma if k == "WARPGROUPS" else AttentionStrategy, k, v)
    return hopper_only() if request.param.startswith("wgmma") else CUDA


@needs_cuda
@pytest.mark.parametrize("b,h,seq,d,elem,mask_shape", ATTENTION_CASES + [
    (2, 8, 1000, 64, "f16", (2, 1, 1000, 1000)), (2, 4, 513, 128, "bf16", (513, 513)), (1, 2, 257, 128, "f16", None),
    (1, 2, 100, 80, "f16", (100, 100)), (2, 2, 1, 64, "bf16", None)])
def test_attention_cuda(b, h, seq, d, elem, mask_shape, attention_loop):
    built = attention(b, h, seq, seq, d, elem, mask_shape)
    plan, emitted = built.emit(attention_loop)
    assert plan.get("wgmma", False) == (attention_loop is HOPPER and d % 64 == 0 and elem != "f32")
    gen = torch.Generator().manual_seed(seq * d + b + 1)
    k, q, v = (randn((b, h, seq, d), elem, gen) for _ in range(3))
    args, mask = [k, q, v], None
    if mask_shape is not None:
        mask = (torch.rand(mask_shape, generator=gen) > 0.3).float()
        mask[..., 5, :] = 0
        args.append(mask)
    out, ptx = cuda_run(built, plan, emitted, args, (b, h, seq, d), elem)
    assert ("mma.sync" in ptx or "wgmma.mma_async" in ptx) == plan["mma"]
    want = attention_reference(k, q, v, mask)
    # The tensor-core kernel rounds P to the input type before P @ V, as FlashAttention does.
    tol = {"f32": 2e-5, "f16": 4e-3, "bf16": 3e-2}[elem]
    torch.testing.assert_close(out.float(), want.to(TORCH[elem]).float(), rtol=tol, atol=tol)


@needs_cuda
@pytest.mark.parametrize("switches", [{}, {"PINGPONG": True}, {"LAZY_RESCALE": 0.0}, {"WARP_SPECIALIZED": False},
                                      {"SPLIT_KV_BARRIERS": True}, {"SPLIT_KV_BARRIERS": False},
                                      {"PERSISTENT": False}],
                         ids=["default", "pingpong", "no-lazy", "no-producer", "split-kv", "one-pair",
                              "not-persistent"])
@pytest.mark.parametrize("b,h,sq,sk,elem", [(2, 3, 1000, 1000, "bf16"), (1, 2, 333, 1024, "f16"),
                                             (1, 4, 2048, 2048, "bf16"), (3, 1, 64, 4096, "bf16"),
                                             (4, 8, 2048, 512, "bf16"), (2, 40, 1000, 384, "f16")])
def test_warp_specialized_attention_cuda(b, h, sq, sk, elem, switches, monkeypatch):
    """The unmasked head-dim-128 kernel with its producer warpgroup (WARP_SPECIALIZED),
    with and without the consumers' turns (PINGPONG) and LAZY_RESCALE, persistent or not,
    and without the producer: ragged and whole key blocks, fewer tiles than SMs, several
    tiles a persistent workgroup (512 and 640 tiles, the latter with the queries ending
    inside a block: the stages' and Q's mbarriers run on across them), and many key
    blocks per query block (4096 keys: each stage's mbarriers through 10 phases)."""
    from kf.passes.strategies import attention_wgmma

    hopper_only()
    for k, v in switches.items():
        monkeypatch.setattr(attention_wgmma, k, v)
    built = attention(b, h, sq, sk, 128, elem)
    plan, emitted = built.emit(HOPPER)
    assert plan["warp_specialized"] == switches.get("WARP_SPECIALIZED", True), plan
    # persistent where the keys and values of the tiles in flight fit the window
    window = HOPPER.multiprocessors / -(-sq // 128) * sk * 256 * 2 <= attention_wgmma.PERSISTENT_WINDOW_BYTES
    persistent = window and sk % 128 == 0 and plan["warp_specialized"] and (
        not set(switches) & {"PINGPONG", "SPLIT_KV_BARRIERS", "PERSISTENT"} or switches == {"SPLIT_KV_BARRIERS": False})
    assert bool(plan["persistent"]) == persistent, plan
    if persistent:
        assert plan["grid"] == [min(-(-sq // 128) * b * h, HOPPER.multiprocessors), 1, 1]
    gen = torch.Generator().manual_seed(sq + sk + b)
    q = randn((b, h, sq, 128), elem, gen)
    k, v = (randn((b, h, sk, 128), elem, gen) for _ in range(2))
    out, _ = cuda_run(built, plan, emitted, [k, q, v], (b, h, sq, 128), elem)
    want = attention_reference(k, q, v, None)
    tol = {"f16": 4e-3, "bf16": 3e-2}[elem]
    torch.testing.assert_close(out.float(), want.to(TORCH[elem]).float(), rtol=tol, atol=tol)


def causal_mask(shape, kind: str, gen) -> torch.Tensor:
    """Masks whose blocks the tensor-core kernel skips: causal (the upper triangle),
    causal with fully masked query rows (uniform weights in torch: the rerun path),
    block-diagonal, and a random mask with whole zero column blocks."""
    s = shape[-1]
    m = torch.tril(torch.ones(s, s))
    if kind == "causal_dead_rows":
        m[3] = 0
        m[s - 1] = 0
    elif kind == "block_diagonal":
        m = torch.block_diag(*[torch.ones(96, 96)] * (s // 96 + 1))[:s, :s]
    elif kind == "random_dead_columns":
        m = (torch.rand(s, s, generator=gen) > 0.2).float()
        m[:, 64:256] = 0
    return m.expand(shape).contiguous()


@needs_cuda
@pytest.mark.parametrize("skip", [True, False], ids=["skip", "noskip"])
@pytest.mark.parametrize("kind", ["causal", "causal_dead_rows", "block_diagonal", "random_dead_columns"])
@pytest.mark.parametrize("b,h,seq,d,elem,mask_shape,mask_elem", [
    (1, 2, 1000, 64, "f16", (1000, 1000), "f32"), (2, 2, 513, 128, "bf16", (2, 1, 513, 513), "f32"),
    (1, 1, 300, 64, "bf16", (300, 300), "f32"), (1, 2, 1000, 128, "bf16", (1000, 1000), "bf16")])
@pytest.mark.parametrize("chip", ["sm_90", "sm_90a", "sm_90a-in-kernel-test"],
                         ids=["mma.sync", "wgmma", "wgmma-no-table"])
def test_attention_masked_blocks_cuda(b, h, seq, d, elem, mask_shape, mask_elem, kind, skip, chip, monkeypatch):
    """Exact block skipping, on masks of several patterns: by the block table (a head-
    shared mask, on wgmma) or by the kernel's own test of each block (f32 masks staged a
    block at a time by the wgmma kernel, bf16 ones double-buffered, a mask per batch read
    from global memory)."""
    from kf.passes.strategies import attention_wgmma

    monkeypatch.setattr(attention_wgmma, "BLOCK_TABLE", chip == "sm_90a")
    built = attention(b, h, seq, seq, d, elem, mask_shape, mask_elem=mask_elem)
    plan, emitted = emit_with(built, CUDA if chip == "sm_90" else hopper_only(), skip_masked_blocks=skip)
    assert plan.get("wgmma", False) == chip.startswith("sm_90a")
    assert bool(emitted.prelude) == (chip == "sm_90a" and skip and len(mask_shape) == 2)
    gen = torch.Generator().manual_seed(seq + d)
    k, q, v = (randn((b, h, seq, d), elem, gen) for _ in range(3))
    mask = causal_mask(mask_shape, kind, gen).to(TORCH[mask_elem])
    out, ptx = cuda_run(built, plan, emitted, [k, q, v, mask], (b, h, seq, d), elem)
    assert ("bar.red.or" in ptx) == skip
    want = attention_reference(k, q, v, mask)
    tol = {"f16": 4e-3, "bf16": 3e-2}[elem]
    torch.testing.assert_close(out.float(), want.to(TORCH[elem]).float(), rtol=tol, atol=tol)


def block_classes(mask: torch.Tensor, bm: int, bn: int, causal_class: bool) -> torch.Tensor:
    """The block table a [sq, sk] mask (nonzero: kept) must get, from its definition:
    DEAD (nothing kept), WHOLE (all kept and the block inside both sequences), CAUSAL
    (kept exactly where key <= query, absolute indices, over the block's positions inside
    the sequences) or PARTIAL."""
    from kf.passes.strategies.attention_wgmma import CAUSAL, DEAD, PARTIAL, WHOLE

    keep = mask != 0
    sq, sk = keep.shape
    agree = keep == (torch.arange(sk)[None, :] <= torch.arange(sq)[:, None])
    out = torch.empty(-(-sq // bm), -(-sk // bn), dtype=torch.int32)
    for i in range(out.shape[0]):
        for j in range(out.shape[1]):
            blk = keep[i * bm:(i + 1) * bm, j * bn:(j + 1) * bn]
            ok = agree[i * bm:(i + 1) * bm, j * bn:(j + 1) * bn]
            out[i, j] = DEAD if not blk.any() else WHOLE if blk.shape == (bm, bn) and blk.all() else \
                CAUSAL if causal_class and ok.all() else PARTIAL
    return out


def table_mask(s: int, kind: str, gen) -> torch.Tensor:
    """[s, s] masks for the block table's classes: the causal pattern; tril with offsets
    (+-1, +-128: not causal, and +-128 is causal relative to a block corner, which must
    not count); causal with one position flipped below or above the diagonal; fully
    masked rows; random; whole zero column blocks; block-diagonal; all kept; none kept."""
    ones = torch.ones(s, s)
    if kind.startswith("tril"):
        return torch.tril(ones, diagonal=int(kind[4:]))
    m = torch.tril(ones)
    if kind == "flip_below":
        m[s // 2 + 3, s // 2 + 1] = 0
    elif kind == "flip_above":
        m[5, 9] = 1
    elif kind == "dead_rows":
        m[3] = 0
        m[s - 1] = 0
    elif kind == "random":
        m = (torch.rand(s, s, generator=gen) > 0.3).float()
    elif kind == "random_dead_columns":
        m = (torch.rand(s, s, generator=gen) > 0.2).float()
        m[:, 64:256] = 0
    elif kind == "block_diagonal":
        m = torch.block_diag(*[torch.ones(96, 96)] * (s // 96 + 1))[:s, :s]
    elif kind in ("ones", "zeros"):
        m = ones if kind == "ones" else torch.zeros(s, s)
    else:
        assert kind == "causal", kind
    return m


TABLE_MASKS = ["causal", "tril1", "tril-1", "tril128", "tril-128", "flip_below", "flip_above", "dead_rows", "random",
               "random_dead_columns", "block_diagonal", "ones", "zeros"]


def live_row_words(mask: torch.Tensor, bm: int, bn: int) -> torch.Tensor:
    """The block table's live-row words (PERSISTENT_WALK) a [sq, sk] mask must get: per
    (query block, key block), bit e of word 2p + h set where row 2 (32 h + e) + p of the
    block keeps a key of the block (rows past the queries count as kept), as int32."""
    from kf.passes.strategies.attention_wgmma import ROW_WORDS

    keep = mask != 0
    sq, sk = keep.shape
    nq, nk = -(-sq // bm), -(-sk // bn)
    out = torch.zeros(nq, nk * ROW_WORDS, dtype=torch.int64)
    for i in range(nq):
        for j in range(nk):
            for r in range(bm):
                row = i * bm + r
                if row >= sq or keep[row, j * bn:(j + 1) * bn].any():
                    e, p = r // 2, r % 2
                    out[i, ROW_WORDS * j + 2 * p + e // 32] |= 1 << (e % 32)
    return torch.where(out >= 1 << 31, out - (1 << 32), out).to(torch.int32)


@needs_cuda
@pytest.mark.parametrize("switches", [{}, {"TABLE_WALK": False}, {"CAUSAL_BLOCKS": False}, {"WHOLE_BLOCKS": False},
                                      {"WALK_OVERLAP_PV": False}, {"LINEAR_MASKED_BLOCKS": False},
                                      {"WARP_SPECIALIZED": False}, {"PERSISTENT_WALK": False},
                                      {"multiprocessors": 5}],
                         ids=["default", "no-walk", "no-causal-class", "no-whole-blocks", "walk-serial",
                              "walk-online-softmax", "no-producer", "not-persistent", "5-workgroups"])
@pytest.mark.parametrize("b,h,seq,d,elem,mask_shape,mask_elem", [
    (1, 2, 300, 128, "bf16", (300, 300), "bf16"), (2, 2, 1000, 64, "f16", (1, 1, 1000, 1000), "f32"),
    (1, 2, 2048, 128, "bf16", (2048, 2048), "bf16"), (1, 1, 4160, 64, "bf16", (4160, 4160), "bf16"),
    (1, 1, 8300, 64, "f16", (8300, 8300), "f32"), (3, 11, 1024, 128, "bf16", (1024, 1024), "bf16")],
    ids=["300-tails", "1000-4d-mask", "2048", "4160-two-words", "8300-per-block-loop", "3x11-heads-264-tiles"])
def test_block_table_classes_cuda(b, h, seq, d, elem, mask_shape, mask_elem, switches, monkeypatch):
    """The wgmma kernel with the block table on head-shared masks of every class
    (``table_mask``), with the walk over live blocks (a second ballot word at 4160; more
    than 64 key blocks at 8300 take the per-block loop) or without, with and without the
    causal class, persistent (PERSISTENT_WALK where the blocks are whole: 2048 and the
    264 tiles of 3 x 11 heads, several a workgroup; with 5 workgroups, dozens) or not: the table the prelude writes is ``block_classes`` of the mask exactly (and
    ``live_row_words`` where persistent), and the result matches torch on fresh random
    inputs, rows masked everywhere included. One compile a shape and switch set; the
    masks only change the inputs."""
    import dataclasses

    from kf.passes.strategies import attention_wgmma

    hopper = hopper_only()
    for k, v in switches.items():
        if k == "multiprocessors":
            hopper = dataclasses.replace(hopper, multiprocessors=v)
        else:
            monkeypatch.setattr(attention_wgmma, k, v)
    built = attention(b, h, seq, seq, d, elem, mask_shape, mask_elem=mask_elem)
    plan, emitted = built.emit(hopper)
    assert plan["wgmma"] and plan["block_table"] and emitted.prelude is not None
    whole = seq % plan["block_m"] == 0 and plan["warp_specialized"] and attention_wgmma.TABLE_WALK and seq <= 8192
    persistent = whole and attention_wgmma.PERSISTENT_WALK and attention_wgmma.WALK_OVERLAP_PV
    assert bool(plan["persistent_walk"]) == persistent, plan
    if persistent:
        assert emitted.grid[0] == min(b * h * seq // plan["block_m"], hopper.multiprocessors), emitted.grid
    run, _ = cuda_compile(built, emitted)
    gen = torch.Generator().manual_seed(seq * 31 + d + len(switches))
    tol = {"f16": 4e-3, "bf16": 3e-2}[elem]
    nk = plan["block_table"][1]
    for kind in TABLE_MASKS:
        k, q, v = (randn((b, h, seq, d), elem, gen) for _ in range(3))
        mask = table_mask(seq, kind, gen)
        want_table = block_classes(mask, plan["block_m"], plan["block_n"], attention_wgmma.CAUSAL_BLOCKS)
        want_rows = live_row_words(mask, plan["block_m"], plan["block_n"]) if persistent else None
        mask = mask.expand(mask_shape).contiguous().to(TORCH[mask_elem])
        out, table = run([k, q, v, mask], (b, h, seq, d), elem)
        assert torch.equal(table[:, :nk], want_table), (kind, table[:, :nk], want_table)
        if persistent:  # the rows' words, and the counter at the tiles claimed: one past the last a workgroup
            assert torch.equal(table[:, nk:-1], want_rows), (kind, table[:, nk:-1], want_rows)
            assert table[0, -1].item() == b * h * plan["block_table"][0] + emitted.grid[0], table[0, -1]
        else:
            assert table.shape[1] == nk
        want = attention_reference(*(x.cuda() for x in (k, q, v, mask))).cpu()
        torch.testing.assert_close(out.float(), want.to(TORCH[elem]).float(), rtol=tol, atol=tol,
                                   msg=lambda m, kind=kind: f"{kind}: {m}")


#: The tensor-core GEMM's K loops, as module switches of passes/strategies/matmul.py: one
#: staged tile (synchronous, or with register prefetch), the cp.async pipeline, and the
#: pipeline with 64 x 64 warp tiles (128 x 256 workgroup tiles on large outputs).
GEMM_LOOPS = {"sync": {"MMA_STAGES": 1, "MMA_PREFETCH": False}, "prefetch": {"MMA_STAGES": 1},
              "cp.async3-64x32": {"MMA_STAGES": 3, "MMA_WARP_TILES": (4, 4)},
              "cp.async4-64x64": {"MMA_STAGES": 4, "MMA_WARP_TILES": (4, 8)},
              "wgmma": {}, "wgmma3-n128": {"WGMMA_STAGES": 3, "WGMMA_MAX_N": 128}}


@pytest.fixture(params=list(GEMM_LOOPS))
def gemm_loop(request, monkeypatch) -> TargetInfo:
    """The target to plan for, with the loop's switches set: sm_90 for the mma.sync
    loops, sm_90a (and a Hopper device) for wgmma."""
    from kf.passes.strategies import matmul as mm
    from kf.passes.strategies import wgmma as wg

    for k, v in GEMM_LOOPS[request.param].items():
        monkeypatch.setattr(wg if k.startswith("WGMMA") else mm, k, v)
    if request.param.startswith("wgmma"):
        if torch.cuda.is_available() and torch.cuda.get_device_capability() != (9, 0):
            pytest.skip("wgmma needs an sm_90 device")
        return HOPPER
    return CUDA


@needs_cuda
@pytest.mark.parametrize("elem", ["f32", "f16", "bf16"])
@pytest.mark.parametrize("m,k,n", [(257, 65, 129), (2048, 512, 1024), (200, 64, 72), (1000, 336, 776),
                                   (2000, 200, 2296)])
def test_matmul_bias_gelu_cuda(elem, m, k, n, gemm_loop):
    """Sizes off the tile grid in every dim, K tails inside the pipeline (336, 200), rows
    that are not whole 16-byte pieces (K 65: no cp.async) and a grid big enough for the
    large plans (2000 x 2296)."""
    built = matmul_bias_gelu(m, k, n, elem)
    plan, emitted = built.emit(gemm_loop)
    assert plan.get("wgmma", False) == (gemm_loop is HOPPER and elem != "f32" and k % 8 == 0 and n % 8 == 0)
    gen = torch.Generator().manual_seed(m + k)
    a, b, bias = randn((m, k), elem, gen), randn((k, n), elem, gen), randn((n,), elem, gen)
    out, _ = cuda_run(built, plan, emitted, [a, b, bias], (m, n), elem)
    want = torch.nn.functional.gelu(a.float() @ b.float() + bias.float())
    tol = {"f32": 1e-4, "f16": 1e-2, "bf16": 5e-2}[elem]
    torch.testing.assert_close(out.float(), want.to(TORCH[elem]).float(), rtol=tol, atol=tol)


@needs_cuda
@pytest.mark.parametrize("mkn", [(100, 70, 50), (100, 72, 56)])  # rows of 16-byte pieces or not
@pytest.mark.parametrize("elem,transpose_b", [("f32", False), ("f16", True), ("bf16", False)])
def test_matmul_batched_broadcast_cuda(elem, transpose_b, mkn, gemm_loop):
    built, (m, k, n, bshape) = matmul_batched(elem, transpose_b, mkn)
    plan, emitted = built.emit(gemm_loop)
    gen = torch.Generator().manual_seed(9)
    a, b, s = randn((2, 1, m, k), elem, gen), randn(bshape, elem, gen), torch.tensor(0.7).to(TORCH[elem])
    out, _ = cuda_run(built, plan, emitted, [a, b, s], (2, 3, m, n), "f32")
    bb = b.float().transpose(-1, -2) if transpose_b else b.float()
    torch.testing.assert_close(out, (a.float() @ bb) * s.float(), rtol=1e-4, atol=1e-4)


@needs_cuda
@pytest.mark.parametrize("elem", ["f32", "f16"])
def test_attention_bool_mask_and_bias_cuda(elem):
    """Booleans reach CUDA kernels as bytes; the additive bias rides the score epilogue."""
    built = bool_mask_attention(2, 2, 100, 64, elem)
    plan, emitted = built.emit(CUDA)
    args, want = bool_mask_inputs(2, 2, 100, 64, elem, 22)
    out, _ = cuda_run(built, plan, emitted, args, (2, 2, 100, 64), elem)
    tol = {"f32": 2e-5, "f16": 4e-3}[elem]
    torch.testing.assert_close(out.float(), want.to(TORCH[elem]).float(), rtol=tol, atol=tol)


@needs_vulkan
@pytest.mark.parametrize("ta,tb", [(False, False), (True, False), (False, True), (True, True)],
                         ids=["nn", "tn", "nt", "tt"])
@pytest.mark.parametrize("m,k,n", [(64, 128, 128), (100, 64, 72)])
def test_batched_matmul_transposed_operands_vector_staging_vulkan(ta, tb, m, k, n):
    """matmul(a or a^T, b or b^T) over a batch with CUDA's 128-bit staging (f32 SIMT, as
    kf-fuse now folds operand transposes into the matmul kernel): the shapes of the
    GPT attention backward (dS^T @ Q and friends)."""
    ashape = (4, k, m) if ta else (4, m, k)
    bshape = (4, n, k) if tb else (4, k, n)

    def body(a, b):
        lhs = kb.transpose(a, perm=[0, 2, 1]) if ta else a
        rhs = kb.transpose(b, perm=[0, 2, 1]) if tb else b
        return [kb.matmul(lhs, rhs)]

    built = Built("matmul", [TensorSpec(ashape, "f32"), TensorSpec(bshape, "f32")], body)
    _, emitted = emit_with(built, SPIRV, vector_bytes=16)
    gen = torch.Generator().manual_seed(m + k + n)
    a, b = randn(ashape, "f32", gen), randn(bshape, "f32", gen)
    out, _ = spirv_run(built, emitted, [a, b], (4, m, n), "f32")
    want = (a.transpose(1, 2) if ta else a) @ (b.transpose(1, 2) if tb else b)
    torch.testing.assert_close(out, want, rtol=1e-4, atol=1e-4)


# ---- attention under a precision policy: the P chain and the epilogue ---------------------


def attention_chain(b, h, sq, sk, d, elem, kind, mask=False):
    """The attention kernel kf-fuse makes under a precision policy
    (passes/apply_precision.py), arguments k, q, v [, mask] [, factors]:

    - ``bf16``: q, k, v of ``elem`` (the policy's casts are kernels before this one),
      f32 scores, the P chain ``cast(P -> elem)``, P V accumulated to an f32 result;
    - ``fp8``: q, k, v f32 tensors of E4M3FN values (fp8 without fp8 storage), the
      scores times the rank-0 argument s_qk, the P chain ``cast(cast(P * 256 -> E4M3FN)
      -> f32)``, the epilogue ``* s_o`` (a rank-0 argument);
    - ``scaled``: f16 q, k, v, the P chain ``cast(0.5 * P -> f16)`` (scale written
      first), the epilogue ``cast(2 * O -> f16)``."""
    specs = [TensorSpec((b, h, sk, d), elem), TensorSpec((b, h, sq, d), elem), TensorSpec((b, h, sk, d), elem)]
    if mask:
        specs.append(TensorSpec((sq, sk), "f32"))
    if kind == "fp8":
        specs += [TensorSpec((), "f32"), TensorSpec((), "f32")]

    def body(k, q, v, *rest):
        s = kb.build("matmul", [q, kb.transpose(k, perm=[0, 1, 3, 2])], None,
                     [TensorSpec((b, h, sq, sk), "f32")]).result
        if kind == "fp8":
            s = kb.mul(s, rest[-2])
        s = kb.div(s, kb.scalar(d ** 0.5, "f32"))
        if mask:
            s = kb.masked_fill(s, kb.cmp(rest[0], kb.scalar(0.0, "f32"), predicate="eq"), value=-1e9)
        p = kb.softmax(s, dim=-1)
        if kind == "bf16":
            p = kb.cast(p, elem)
        elif kind == "fp8":
            p = kb.cast(kb.cast(kb.mul(p, kb.scalar(256.0, "f32")), "f8E4M3FN"), "f32")
        else:
            p = kb.cast(kb.mul(kb.scalar(0.5, "f32"), p), "f16")
        o = kb.build("matmul", [p, v], None, [TensorSpec((b, h, sq, d), "f32")]).result
        if kind == "fp8":
            o = kb.mul(o, rest[-1])
        elif kind == "scaled":
            o = kb.cast(kb.mul(kb.scalar(2.0, "f32"), o), "f16")
        return [o]

    return Built("attention", specs, body)


def chain_inputs(b, h, sq, sk, d, elem, kind, mask, seed):
    gen = torch.Generator().manual_seed(seed)
    k, q, v = randn((b, h, sk, d), elem, gen), randn((b, h, sq, d), elem, gen), randn((b, h, sk, d), elem, gen)
    args = [k, q, v]
    if kind == "fp8":  # E4M3FN values (the quantized q, k, v of the policy), f32 tensors
        args = [(x * 64).to(torch.float8_e4m3fn).float() for x in args]
    if mask:
        m = (torch.rand(sq, sk, generator=gen) > 0.3).float()
        args.append(m)
    if kind == "fp8":
        args += [torch.tensor(1 / 64 ** 2), torch.tensor(1 / (256 * 64))]
    return args


def chain_reference(kind, args, d, block_n=None):
    """float64 attention with the P chain applied as the kernels apply it: to the
    unnormalized probabilities of each key block, ``p = exp(s - m)`` in f32 with m the
    row's running maximum after the block (online softmax), later rescaled by
    ``exp(m - m_final)``; the row sums add the unrounded p. Without ``block_n``: as the
    IR reads, the chain applied to the normalized P."""
    k, q, v = (x.double() for x in args[:3])
    s = q @ k.transpose(-1, -2)
    if kind == "fp8":
        s = s * args[-2].double()
    s = (s / d ** 0.5).float()
    if len(args) in (4, 6):
        s = s.masked_fill(args[3] == 0, -1e9)
    chain = {"bf16": lambda x: x.to(args[0].dtype), "fp8": lambda x: (x * 256).to(torch.float8_e4m3fn),
             "scaled": lambda x: (0.5 * x).half()}[kind]
    final = s.amax(-1, keepdim=True)
    if block_n is None:
        o = chain(torch.softmax(s.double(), -1).float()).double() @ v
    else:
        sk = s.shape[-1]
        o = torch.zeros(*s.shape[:-1], v.shape[-1], dtype=torch.float64)
        for n0 in range(0, sk, block_n):
            m = s[..., :n0 + block_n].amax(-1, keepdim=True)  # the running max after the block
            p = torch.exp(s[..., n0:n0 + block_n] - m)
            o += (chain(p).double() @ v[..., n0:n0 + block_n, :]) * torch.exp((m - final).double())
        o = o / torch.exp((s - final).double()).sum(-1, keepdim=True)
    if kind == "fp8":
        o = o * args[-1].double()
    elif kind == "scaled":
        o = 2 * o
    return o


CHAIN_CASES = [  # b, h, sq, sk, d, elem, kind, mask
    (1, 2, 100, 100, 64, "bf16", "bf16", False), (1, 2, 257, 257, 64, "bf16", "bf16", True),
    (2, 1, 65, 130, 128, "f16", "bf16", True), (1, 2, 100, 100, 64, "f32", "fp8", False),
    (1, 2, 257, 257, 128, "f32", "fp8", True), (1, 2, 100, 257, 64, "f16", "scaled", True),
]


@needs_vulkan
@pytest.mark.parametrize("b,h,sq,sk,d,elem,kind,mask", CHAIN_CASES)
def test_attention_p_chain_and_epilogue_vulkan(b, h, sq, sk, d, elem, kind, mask):
    """The SIMT kernel applies the P chain to the unnormalized probabilities of each key
    block (the rounding before the division by the row sums, as FlashAttention-3 rounds
    to fp8) and the epilogue at the store: it is that computation up to f32 rounding,
    and far from the IR's order (the normalized P rounded)."""
    built = attention_chain(b, h, sq, sk, d, elem, kind, mask)
    plan, emitted = built.emit(SPIRV)
    assert not plan["mma"]
    args = chain_inputs(b, h, sq, sk, d, elem, kind, mask, sq + sk + d)
    out_elem = "f16" if kind == "scaled" else "f32"
    out, _ = spirv_run(built, emitted, args, (b, h, sq, d), out_elem)
    ref = chain_reference(kind, args, d, plan["block_n"]).to(out.dtype).double()
    other = chain_reference(kind, args, d).to(out.dtype).double()
    err = ((out.double() - ref).norm() / ref.norm()).item()
    err_other = ((out.double() - other).norm() / other.norm()).item()
    # measured: 1e-7 .. 1.2e-5 against the kernels' order, 2.5e-4 .. 3.4e-2 against the IR's
    assert err < 5e-5 and err_other > 10 * err, (err, err_other)


def attention_fp8_storage(b, h, sq, sk, d, mask=False):
    """The CUDA form of fp8 attention (fp8 storage): q, k E4M3FN row-major, v stored
    K-major ([.., d, sk]) and read through a transpose, rank-0 factors, a bf16 output."""
    specs = [TensorSpec((b, h, sk, d), "f8E4M3FN"), TensorSpec((b, h, sq, d), "f8E4M3FN"),
             TensorSpec((b, h, d, sk), "f8E4M3FN"), TensorSpec((), "f32"), TensorSpec((), "f32")]
    if mask:
        specs.append(TensorSpec((sq, sk), "bf16"))

    def body(k, q, vt, s_qk, s_v, *m):
        s = kb.build("matmul", [q, kb.transpose(k, perm=[0, 1, 3, 2])], None,
                     [TensorSpec((b, h, sq, sk), "f32")]).result
        s = kb.div(kb.cast(kb.mul(s, s_qk), "bf16"), kb.scalar(d ** 0.5, "bf16"))
        if m:
            s = kb.masked_fill(s, kb.cmp(m[0], kb.scalar(0.0, "bf16"), predicate="eq"), value=-1e9)
        p8 = kb.cast(kb.mul(kb.cast(kb.softmax(s, dim=-1), "f32"), kb.scalar(256.0, "f32")), "f8E4M3FN")
        o = kb.build("matmul", [p8, kb.transpose(vt, perm=[0, 1, 3, 2])], None,
                     [TensorSpec((b, h, sq, d), "f32")]).result
        return [kb.cast(kb.mul(o, s_v), "bf16")]

    return Built("attention", specs, body)


@needs_ptxas
@pytest.mark.parametrize("chip,mask", [("sm_90", False), ("sm_90", True), ("sm_90a", True)])
def test_attention_fp8_storage_simt_ptxas(chip, mask):
    """fp8 q, k, v where no fp8 tensor-core plan applies (sm_90; a mask on sm_90a): the
    SIMT kernel reads the E4M3FN bytes and widens them (V through its transpose) with
    cvt.rn.f16x2.e4m3x2, rounds 256 p to E4M3FN with cvt.rn.satfinite (sm_89+: see
    emit.lower_fp8_conversions), and assembles without spills."""
    built = attention_fp8_storage(1, 2, 200, 257, 64, mask)
    plan, _ = built.emit(TargetInfo.for_target("cuda", chip=chip))
    assert not plan["mma"] and not plan.get("wgmma"), plan
    ptx, r = cuda_report(built, chip)
    assert any(f"ld.global.{t}8" in ptx for t in "sub")
    assert "cvt.rn.f16x2.e4m3x2" in ptx and "cvt.rn.satfinite.e4m3x2.f32" in ptx
    assert r["spill_store_bytes"] == 0 and r["spill_load_bytes"] == 0, r


@needs_ptxas
@pytest.mark.parametrize("d,elem,kind", [(64, "bf16", "bf16"), (128, "bf16", "bf16"), (64, "f16", "scaled")])
def test_attention_p_chain_and_epilogue_mma_ptxas(d, elem, kind):
    """The mma.sync kernel (sm_90) takes the P chain (rounded to the mma's type, which a
    chain ending in a cast to it gives exactly) and the epilogue; no spills."""
    built = attention_chain(2, 4, 257, 257, d, elem, kind, mask=True)
    plan, emitted = built.emit(CUDA)
    assert plan["mma"] and not plan.get("wgmma"), plan
    assert emitted.notes["tensor_cores"] == "mma.sync.m16n8k16"
    ptx, r = cuda_report(built)
    assert "mma.sync.aligned.m16n8k16" in ptx
    assert r["spill_store_bytes"] == 0 and r["spill_load_bytes"] == 0, r


@needs_cuda
@pytest.mark.parametrize("b,h,sq,sk,d,elem,kind,mask", [c for c in CHAIN_CASES if c[6] != "fp8"])
def test_attention_p_chain_and_epilogue_cuda(b, h, sq, sk, d, elem, kind, mask):
    built = attention_chain(b, h, sq, sk, d, elem, kind, mask)
    plan, emitted = built.emit(CUDA)
    args = chain_inputs(b, h, sq, sk, d, elem, kind, mask, sq + sk + d)
    out, _ = cuda_run(built, plan, emitted, [x.cuda() for x in args], (b, h, sq, d),
                      "f16" if kind == "scaled" else "f32")
    ref = chain_reference(kind, args, d, plan["block_n"])
    assert ((out.double().cpu() - ref).norm() / ref.norm()).item() < 1e-2


# ---- attention sweep: every head dim, query and key count ------------------------------

SWEEP_HEAD_DIMS = (1, 8, 40, 64, 65, 128)
SWEEP_QUERIES = (1, 2, 3, 17, 128, 257)
SWEEP_KEYS = (1, 31, 255, 256, 257, 300)


def _sweep_case(d, sq, sk, elem, masked, seed):
    """(built, args, reference in f64) of one sweep case: bf16 inputs at scale 10 (scores
    in the hundreds: the online softmax's rescaling matters), f32 at scale 1; the mask
    (where there is one) keeps about 70% of the keys and masks one query row entirely."""
    built = attention(1, 2, sq, sk, d, elem, (sq, sk) if masked else None)
    gen = torch.Generator().manual_seed(seed)
    scale = 10.0 if elem == "bf16" else 1.0
    k, q, v = ((torch.randn(shape, generator=gen) * scale).to(TORCH[elem])
               for shape in ((1, 2, sk, d), (1, 2, sq, d), (1, 2, sk, d)))
    args, mask = [k, q, v], None
    if masked:
        mask = (torch.rand(sq, sk, generator=gen) > 0.3).float()
        mask[sq // 2] = 0
        args.append(mask)
    s = q.double() @ k.double().transpose(-1, -2) / d ** 0.5
    if mask is not None:
        s = s.masked_fill(mask == 0, -1e9)
    return built, args, torch.softmax(s, -1) @ v.double()


SWEEP_VARIANTS = (("f32", False), ("f32", True), ("bf16", False), ("bf16", True))


@pytest.mark.parametrize("target,elem,masked", [(SPIRV, "f32", True), (CUDA, "bf16", False)], ids=["spirv", "cuda"])
def test_attention_sweep_plans(target, elem, masked):
    """Every shape of the sweep has an attention plan (none falls back to the generic
    strategy, whose per-thread work grows as keys^2 x head dim): the SIMT kernel within
    the shared-memory budget wherever the tensor-core kernel does not apply (every
    SPIR-V plan, and CUDA's head dims that are not multiples of 16)."""
    for d in SWEEP_HEAD_DIMS:
        for sq in SWEEP_QUERIES:
            for sk in SWEEP_KEYS:
                built = attention(1, 2, sq, sk, d, elem, (sq, sk) if masked else None)
                with built.ctx:
                    plan = strategy_for("attention").plan(built.kernel.operation, target)
                assert plan["mma"] == (target is CUDA and d % 16 == 0), (d, sq, sk)
                if not plan["mma"]:
                    assert plan["threads"] == plan["block_m"] * plan["lanes_per_row"]
                    assert plan["shared_bytes"] <= target.max_shared_bytes
                    assert plan["block_n"] % plan["lanes_per_row"] == 0


@needs_vulkan
@pytest.mark.parametrize("d", SWEEP_HEAD_DIMS)
def test_attention_sweep_vulkan(d):
    """The SIMT kernel at every query and key count of the sweep against torch in f64,
    each shape in one of the four variants (f32 or bf16 at scale 10, with or without a
    mask; the variant rotates with the shape and the head dim, so every variant meets
    every query count and key count): the error is that of the output's rounding."""
    bad = []
    shapes = [(sq, sk) for sq in SWEEP_QUERIES for sk in SWEEP_KEYS]
    for i, (sq, sk) in enumerate(shapes):
        elem, masked = SWEEP_VARIANTS[(i + i // len(SWEEP_KEYS) + SWEEP_HEAD_DIMS.index(d)) % 4]
        built, args, want = _sweep_case(d, sq, sk, elem, masked, seed=1000 * d + i)
        plan, emitted = built.emit(SPIRV)
        out, _ = spirv_run(built, emitted, args, (1, 2, sq, d), elem)
        err = (out.double() - want).abs().max().item()
        tol = (2e-5 if elem == "f32" else 8e-3) * max(1.0, want.abs().max().item())
        if not err <= tol:
            bad.append((sq, sk, elem, masked, err))
    assert not bad, bad


@needs_cuda
@pytest.mark.parametrize("d", SWEEP_HEAD_DIMS)
def test_attention_sweep_cuda(d):
    """The sweep on a CUDA GPU, every shape in all four variants: the SIMT kernel for f32
    and for bf16 at head dims no multiple of 16, the tensor-core kernels for the rest."""
    bad = []
    cap = torch.cuda.get_device_capability()
    target = TargetInfo.for_target("cuda", chip="sm_90a" if cap == (9, 0) else "sm_{}{}".format(*cap))
    for i, (sq, sk) in enumerate((sq, sk) for sq in SWEEP_QUERIES for sk in SWEEP_KEYS):
        for elem, masked in SWEEP_VARIANTS:
            built, args, want = _sweep_case(d, sq, sk, elem, masked, seed=1000 * d + i)
            plan, emitted = built.emit(target)
            out, _ = cuda_run(built, plan, emitted, args, (1, 2, sq, d), elem)
            err = (out.double() - want).abs().max().item()
            # the tensor-core kernels round P to bf16 before P @ V, as FlashAttention does
            tol = (2e-5 if elem == "f32" else 3e-2 if plan["mma"] else 8e-3) * max(1.0, want.abs().max().item())
            if not err <= tol:
                bad.append((sq, sk, elem, masked, err))
    assert not bad, bad
