"""kf-recognize-moe and the moe strategies, end to end: examples/moe.py's
``moe_layer_fused`` (unchanged) compiled for Vulkan and run on lavapipe against torch
eager, its schedule checked for the grouped kernels (route, two grouped GEMMs, combine;
no per-expert dense matmul), its expert FLOPs checked to be K/E of the dense form's, and
its CUDA build assembled by ptxas for sm_90 (no GPU needed).

Token counts are not multiples of the GEMM tiles (37 tokens, 2x19, 300: more slots than
the routing workgroup has threads). A second function takes the top-k indices as an
input, so that indices outside [0, E) and repeated indices (which the dense form gives
zero weight and summed weight) are exercised.
"""

from __future__ import annotations

import re

import kf
import moe
import pytest
import torch
import torch.nn.functional as F
from kf.passes.to_cuda import assemble, ptxas_path
from kf.runtime import vulkan

needs_vulkan = pytest.mark.skipif(not vulkan.is_available(), reason="no Vulkan device (install mesa-vulkan-drivers)")
needs_ptxas = pytest.mark.skipif(ptxas_path() is None, reason="ptxas not installed")

TOL = {torch.float32: 2e-5, torch.float16: 3e-3, torch.bfloat16: 2e-2}


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("KF_CACHE_DIR", str(tmp_path))


def _inputs(batch, seq, dtype, hidden=64, ffn=96, experts=4, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(batch, seq, hidden, generator=g)
    gate = torch.randn(experts, hidden, generator=g)
    w_in = torch.randn(experts, hidden, ffn, generator=g) / 8
    w_out = torch.randn(experts, ffn, hidden, generator=g) / 10
    return [t.to(dtype) for t in (x, gate, w_in, w_out)]


def _rel(out, ref):
    return ((out.double() - ref.double()).norm() / ref.double().norm()).item()


def _kernel_kinds(fused: str) -> list[str]:
    """The kinds of the kernels the schedule calls, in call order."""
    kinds = dict(re.findall(r'func\.func private @(\w+)\(.*?kf\.kernel = "(\w+)"', fused))
    body = fused[fused.index("func.func @moe_layer_fused("):]
    return [kinds[name] for name in re.findall(r"call @(\w+)\(", body)]


@needs_vulkan
@pytest.mark.parametrize("batch,seq", [(1, 37), (2, 19), (1, 300)])
@pytest.mark.parametrize("top_k", [2, 1])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_moe_layer_on_vulkan(batch, seq, top_k, dtype):
    x, gate, w_in, w_out = _inputs(batch, seq, dtype)
    out = moe.moe_layer_fused.with_options(target="vulkan")(x, gate, [w_in, w_out], top_k=top_k)
    ref = moe.moe_layer_fused.fn(x, gate, [w_in, w_out], top_k=top_k)
    assert out.dtype == dtype and out.shape == x.shape
    # Eager in the same dtype rounds after every expert; kf accumulates in f32. Both are
    # measured against eager in f64 on the same (rounded) inputs: kf may not be worse.
    exact = moe.moe_layer_fused.fn(x.double(), gate.double(), [w_in.double(), w_out.double()], top_k=top_k)
    assert _rel(out, ref) < TOL[dtype]
    assert _rel(out, exact) <= max(2 * _rel(ref, exact), 1e-6)


@pytest.mark.parametrize("top_k", [2, 1])
def test_schedule_has_grouped_kernels(top_k):
    x, gate, w_in, w_out = _inputs(1, 37, torch.float32)
    stages = kf.inspect(moe.moe_layer_fused.with_options(target="vulkan"), x, gate, [w_in, w_out],
                        top_k=top_k).stages
    kinds = _kernel_kinds(stages["fused"])
    # The gate's matmul (reading the gate weights transposed in place), topk, softmax,
    # then the grouped MoE; nothing per expert.
    assert kinds == ["matmul", "generic", "rowwise", "moe_route", "moe_gemm", "moe_gemm", "moe_combine"], kinds
    strategies = re.findall(r'kf\.strategy = "(\w+)"', stages["gpu"])
    assert sorted(s for s in strategies if s.startswith("moe")) == ["moe_combine", "moe_gemm", "moe_gemm",
                                                                   "moe_route"]


def _matmul_flops(kf_ir: str, pipeline: str) -> int:
    """Matrix-product FLOPs of every kernel function after pipeline, as costs.py counts
    them from the kernel functions' kf bodies (what kf.profile and kf.explain report)."""
    from kf.costs import kernel_flops
    from kf.dialects import make_context
    from kf.passes import pipeline as kp
    from mlir import ir

    with make_context() as ctx:
        module = ir.Module.parse(kf_ir)
        pm, _ = kp.build(f"builtin.module({pipeline})", ctx)
        pm.run(module.operation)
        return sum(kernel_flops(op.operation)[1] for op in module.body.operations
                   if op.operation.name == "func.func" and "kf.kernel" in op.operation.attributes)


@pytest.mark.parametrize("top_k", [2, 1])
def test_flops_are_top_k_over_experts(top_k):
    """The grouped schedule's expert FLOPs are K/E of the dense schedule's (the one
    kf-fuse makes without kf-recognize-moe); the gate's matmul is the same in both."""
    tokens, hidden, ffn, experts = 37, 64, 96, 4
    x, gate, w_in, w_out = _inputs(1, tokens, torch.float32, hidden, ffn, experts)
    kf_ir = kf.inspect(moe.moe_layer_fused.with_options(target="vulkan"), x, gate, [w_in, w_out],
                       top_k=top_k).kf_ir
    gate_flops = 2 * tokens * hidden * experts
    dense = _matmul_flops(kf_ir, "kf-canonicalize, kf-fuse") - gate_flops
    grouped = _matmul_flops(kf_ir, "kf-canonicalize, kf-recognize-moe, kf-fuse") - gate_flops
    assert dense == experts * 2 * tokens * (hidden * ffn + ffn * hidden)
    assert grouped * experts == dense * top_k


#: The grouped GEMMs' K loops, as kernel variants (the option ``variants``): one staged
#: tile with register prefetch, and the cp.async pipeline.
LOOPS = {"prefetch": "moe_gemm.stages=1", "cp.async4": "moe_gemm.stages=4"}


@pytest.fixture(params=list(LOOPS))
def k_loop(request):
    return request.param


@needs_ptxas
@pytest.mark.parametrize("dtype,top_k", [(torch.bfloat16, 2), (torch.float32, 1), (torch.float16, 2)])
def test_cuda_build_assembles(dtype, top_k, k_loop):
    x, gate, w_in, w_out = _inputs(1, 37, dtype)
    fn = moe.moe_layer_fused.with_options(target="cuda", arch="sm_90", variants=LOOPS[k_loop])
    stages = kf.inspect(fn, x, gate, [w_in, w_out], top_k=top_k).stages
    ptx = stages["ptx"]
    entries = re.findall(r"\.entry (\w+)", ptx)
    for role in ("route", "up", "down", "combine"):
        assert f"moe_layer_fused_moe0_{role}" in entries
    if dtype != torch.float32:  # the grouped GEMMs are on tensor cores
        for role in ("up", "down"):
            body = ptx[ptx.index(f".entry moe_layer_fused_moe0_{role}"):]
            body = body[:body.index("\n}")]
            assert "mma.sync.aligned.m16n8k16" in body
            assert ("cp.async.cg.shared.global" in body) == (k_loop == "cp.async4")
    report = assemble(ptx, "sm_90").kernels
    for role in ("route", "up", "down", "combine"):
        info = report[f"moe_layer_fused_moe0_{role}"]
        assert info["registers"] > 0 and info["spill_store_bytes"] == 0 and info["stack_bytes"] == 0, info


def routed_experts(x, idx, wt, w_in, w_out):
    """examples/moe.py's expert step with the routing given: idx may hold anything."""
    num_experts = w_in.shape[0]
    experts = torch.arange(num_experts, device=x.device)
    combine = torch.zeros(*x.shape[:-1], num_experts, dtype=x.dtype, device=x.device)
    for k in range(idx.shape[-1]):
        routed = (idx[..., k].unsqueeze(-1) == experts).to(x.dtype)
        combine = combine + routed * wt[..., k].unsqueeze(-1)
    output = torch.zeros_like(x)
    for e in range(num_experts):
        h = F.gelu(torch.matmul(x, w_in[e]))
        output = output + combine[..., e:e + 1] * torch.matmul(h, w_out[e])
    return output


@needs_vulkan
def test_out_of_range_and_repeated_indices():
    g = torch.Generator().manual_seed(1)
    x, w_in, w_out = torch.randn(1, 45, 32, generator=g), torch.randn(3, 32, 40, generator=g) / 6, \
        torch.randn(3, 40, 32, generator=g) / 6
    idx = torch.randint(-1, 4, (1, 45, 3), generator=g)  # -1 and 3 are out of range for 3 experts
    idx[0, :5] = torch.tensor([1, 1, 2])  # repeated: combine sums the two weights
    wt = torch.rand(1, 45, 3, generator=g)
    f = kf.jit(target="vulkan")(routed_experts)
    kinds = re.findall(r'kf\.kernel = "(\w+)"', kf.inspect(f, x, idx, wt, w_in, w_out).stages["fused"])
    assert "moe_route" in kinds and "matmul" not in kinds
    out = f(x, idx, wt, w_in, w_out)
    assert _rel(out, routed_experts(x, idx, wt, w_in, w_out)) < 2e-5


@needs_vulkan
@pytest.mark.parametrize("batch,seq,top_k", [(1, 37, 2), (2, 32, 1)])
def test_cuda_staging_runs_on_vulkan(batch, seq, top_k):
    """The CUDA plans stage tiles with 128-bit loads (VectorStaging, the gathered rows of
    _GatherStaging); kf-to-spirv splits vectors into scalars, so with the variant
    moe_gemm.staging_bytes=16 the same index arithmetic runs on lavapipe (f32: SPIR-V
    takes no f16/bf16 vectors here). 2x32 slots fill whole 64-row tiles while a bucket's
    tiles start anywhere: the row guard of every load is needed."""
    x, gate, w_in, w_out = _inputs(batch, seq, torch.float32)
    f = moe.moe_layer_fused.with_options(target="vulkan", variants="moe_gemm.staging_bytes=16")
    gpu = kf.inspect(f, x, gate, [w_in, w_out], top_k=top_k).stages["gpu"]
    up = gpu[gpu.index("gpu.func @moe_layer_fused_moe0_up"):gpu.index("gpu.func @moe_layer_fused_moe0_down")]
    assert "vector.load" in up
    out = f(x, gate, [w_in, w_out], top_k=top_k)
    assert _rel(out, moe.moe_layer_fused.fn(x, gate, [w_in, w_out], top_k=top_k)) < TOL[torch.float32]


@needs_vulkan
@pytest.mark.parametrize("batch,seq,hidden,ffn,experts,top_k", [
    (1, 2000, 64, 96, 8, 2),  # 4000 slots: 16 a routing thread
    (3, 7, 40, 24, 5, 3),  # top-3 of 5, nothing a multiple of a tile
    (1, 9, 64, 96, 1, 1),  # one expert: the sum over experts is one term, no add
])
def test_other_shapes(batch, seq, hidden, ffn, experts, top_k):
    x, gate, w_in, w_out = _inputs(batch, seq, torch.float32, hidden, ffn, experts)
    out = moe.moe_layer_fused.with_options(target="vulkan")(x, gate, [w_in, w_out], top_k=top_k)
    assert _rel(out, moe.moe_layer_fused.fn(x, gate, [w_in, w_out], top_k=top_k)) < TOL[torch.float32]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device (the PTX is assembled above)")
@pytest.mark.parametrize("batch,seq,top_k", [(1, 37, 2), (2, 32, 1), (1, 1000, 2)])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_moe_layer_on_cuda(batch, seq, top_k, dtype, k_loop):
    """On a CUDA GPU: the tensor-core grouped GEMMs (f16, bf16) and the SIMT ones (f32)
    against eager, token by token: cuBLAS and kf may round a gate logit differently, and
    where two experts' logits are that close the top-k choice (so the token's output)
    can differ, for at most a few tokens of a thousand. Each tensor-core K loop (LOOPS)."""
    x, gate, w_in, w_out = (t.cuda() for t in _inputs(batch, seq, dtype))
    out = moe.moe_layer_fused.with_options(variants=LOOPS[k_loop])(x, gate, [w_in, w_out], top_k=top_k)
    ref = moe.moe_layer_fused.fn(x, gate, [w_in, w_out], top_k=top_k)
    err = (out.double() - ref.double()).norm(dim=-1) / ref.double().norm(dim=-1).clamp_min(1e-6)
    assert (err > 4 * TOL[dtype]).double().mean().item() <= 0.01, err.max().item()
