"""The attention strategy (passes/strategies/attention/): its plan, the SIMT kernel
(Vulkan, f32 on CUDA) and the mma.sync kernel, on kernel functions built by hand; the
seed's attention through kf-fuse and kf-map-to-gpu; every kernel run on CUDA where a GPU
is. Sizes are small (lavapipe is a CPU) but every size that matters is not a multiple of
the block sizes (257, 129, 65)."""

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
from strategy_kernels import (CUDA, HOPPER, SPIRV, TORCH, Built, attention, attention_reference, cuda_report, cuda_run,
                     emit_with, hopper_only, needs_cuda, needs_ptxas, needs_vulkan, randn,
                     spirv_run, vulkan_runtime)


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


def test_attention_tensor_cores_only_where_they_apply():
    for target, elem, d, mma in [(CUDA, "f32", 64, False), (SPIRV, "f16", 64, False), (CUDA, "f16", 72, False),
                                 (CUDA, "bf16", 64, True)]:
        built = attention(1, 1, 40, 40, d, elem)
        with built.ctx:
            assert strategy_for("attention").plan(built.kernel.operation, target)["mma"] is mma, (target, elem, d)


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
    vulkan_runtime().launch(binary.binary, abi, [user[i] for i in order] + [out], written=[4])
    torch.testing.assert_close(out, seed_examples.fused_attention.fn(q, k, v, mask), rtol=2e-5, atol=2e-5)


#: The tensor-core attention kernels: mma.sync (sm_90: K and V double-buffered by
#: cp.async without a mask, key blocks skipped with one) and wgmma (sm_90a).
ATTENTION_LOOPS = ["mma.sync", "wgmma"]


@pytest.fixture(params=ATTENTION_LOOPS)
def attention_loop(request) -> TargetInfo:
    """The target to plan for: sm_90 (mma.sync) or sm_90a (wgmma, on a Hopper device)."""
    return hopper_only() if request.param == "wgmma" else CUDA


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
@pytest.mark.parametrize("elem", ["f32", "f16"])
def test_attention_bool_mask_and_bias_cuda(elem):
    """Booleans reach CUDA kernels as bytes; the additive bias rides the score epilogue."""
    built = bool_mask_attention(2, 2, 100, 64, elem)
    plan, emitted = built.emit(CUDA)
    args, want = bool_mask_inputs(2, 2, 100, 64, elem, 22)
    out, _ = cuda_run(built, plan, emitted, args, (2, 2, 100, 64), elem)
    tol = {"f32": 2e-5, "f16": 4e-3}[elem]
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
@pytest.mark.parametrize("chip", ["sm_90", "sm_90a"], ids=["mma.sync", "wgmma"])
def test_attention_masked_blocks_cuda(b, h, seq, d, elem, mask_shape, mask_elem, kind, skip, chip):
    """Exact block skipping, on masks of several patterns: by the block table (a head-
    shared mask, on wgmma) or by the kernel's own test of each block (a mask per batch, and
    mma.sync)."""
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
