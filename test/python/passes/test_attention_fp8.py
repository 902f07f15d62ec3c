"""The fp8 wgmma attention kernel (passes/strategies/attention/hopper/) and the
key loop's score overlap and linear-score softmax, which the bf16 kernel shares.

The kernel function is the one kf-fuse makes of the seed's attention under
``precision="fp8"`` on CUDA: q and k quantized row-major, v quantized transposed
([.., Dv, Sk], K-major for fp8 wgmma), the scores dequantized by a rank-0 factor and
cast back to the input type, the probabilities scaled by 256 and cast to fp8, and the
product dequantized by a rank-0 factor (passes/apply_precision.py)."""

from __future__ import annotations

import math
import sys
from pathlib import Path

import pytest
import torch
from kf.dialects import builders as kb
from kf.dialects.types import TensorSpec

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the attention tests' builders
from test_attention_matmul import HOPPER, Built, attention, cuda_compile, cuda_report, needs_ptxas

needs_hopper = pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0),
                                  reason="fp8 wgmma needs an sm_90 device")

F8 = {"f8E4M3FN": (torch.float8_e4m3fn, 448.0), "f8E5M2": (torch.float8_e5m2, 57344.0)}


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


def test_fp8_key_order_makes_scores_the_a_fragment():
    """Stage row j = 8s + 2t + e of each 16 holds key 4t + 2s + e: a thread's f32 score
    accumulators (columns 2t, 2t+1, 8+2t, 9+2t of each 16, mma's C layout) are then
    the keys 4t .. 4t+3 that fp8 wgmma's register A fragment gives lane t (k32: columns
    4t..4t+3 and 16+4t..16+4t+3), in register order."""
    from kf.passes.strategies.attention.hopper.mma import fp8_key_of

    assert sorted(fp8_key_of(j) for j in range(128)) == list(range(128))
    for t in range(4):
        for half in (0, 16):
            held = [half + c for c in (2 * t, 2 * t + 1, 8 + 2 * t, 9 + 2 * t)]
            assert [fp8_key_of(c) for c in held] == [half + 4 * t + i for i in range(4)]


@needs_ptxas
@pytest.mark.parametrize("elem", ["f8E4M3FN", "f8E5M2"])
@pytest.mark.parametrize("d", [128, 256])
@pytest.mark.parametrize("sk", [256, 1024])
def test_attention_fp8_wgmma_ptxas(elem, d, sk):
    """fp8 q/k/v on sm_90a: both products m64nNk32 fp8 wgmmas (the second with P from
    registers, rounded by cvt.rn.satfinite), three stages of K and V (224 KiB at head dim 256), the dequantization
    factors loaded once; ptxas neither spills nor serializes the wgmmas. Head dim 256
    over 1024 keys spilled 80 bytes before wgmma.LEAN_COPIES."""
    built = attention_fp8(2, 4, 300, sk, d, elem)
    plan, emitted = built.emit(HOPPER)
    t = {"f8E4M3FN": "e4m3", "f8E5M2": "e5m2"}[elem]
    assert plan["wgmma"] and plan["elem"] == elem and plan["stages"] == 3, plan
    assert emitted.notes["tensor_cores"] == f"wgmma.m64n128k32+m64n{d}k32.{t}"
    ptx, r, log = cuda_report(built, "sm_90a", log=True)
    wgmma = [ln.split()[0] for ln in ptx.splitlines() if "wgmma.mma_async.sync" in ln]
    assert f"wgmma.mma_async.sync.aligned.m64n128k32.f32.{t}.{t}" in wgmma
    assert f"wgmma.mma_async.sync.aligned.m64n{d}k32.f32.{t}.{t}" in wgmma
    assert f"cvt.rn.satfinite.{t}x2.f32" in ptx
    assert ptx.count("ld.global.f32") + ptx.count("ld.global.b32") <= 2  # the two factors, once
    assert r["spill_store_bytes"] == 0 and r["spill_load_bytes"] == 0, r
    assert "serialized" not in log, log


def test_fp8_plan_needs_kmajor_v_and_whole_key_blocks():
    """fp8 attention keeps the SIMT kernel where the fp8 kernel does not apply: keys not
    whole blocks of 128 (key order is permuted within blocks), head dim 64 (rows of 64
    bytes are not 128-byte swizzled rows)."""
    for args in ((1, 2, 128, 200, 128), (1, 2, 128, 256, 64)):
        plan, _ = attention_fp8(*args).emit(HOPPER)
        assert not plan.get("wgmma") and not plan["mma"], (args, plan)


@needs_ptxas
@pytest.mark.parametrize("d", [64, 128])
def test_linear_scores_and_overlap_bf16(d):
    """The seed's bf16 attention: the scale folded into one FFMA a score (no subtract,
    no multiply per score in the softmax), and at head dim 128 the next block's S
    issued before the softmax, with K and V in three stages (64 keeps two: one
    workgroup an SM fewer with three). At 64 two workgroups share an SM, so ptxas is
    held to 128 registers a thread (.maxnreg), without spilling."""
    built = attention(2, 8, 2048, 2048, d, "bf16")
    plan, _ = built.emit(HOPPER)
    assert plan["stages"] == (3 if d == 128 else 2), plan
    assert plan["max_registers"] == (128 if d == 64 else 0), plan
    ptx, r = cuda_report(built, "sm_90a")
    assert ptx.count("fma.rn.f32") >= 64 and ptx.count("sub.rn.f32") < 8, ptx.count("sub.rn.f32")
    assert r["spill_store_bytes"] == 0 and r["registers"] <= (128 if d == 64 else 255), r


@needs_ptxas
@pytest.mark.parametrize("kind,sk", [("bf16", 2048), ("bf16", 333), ("fp8", 2048), ("fp8", 384), ("fp8", 256)])
def test_pipelined_key_loop(kind, sk):
    """OVERLAP_PV (FlashAttention-3's intra-warpgroup pipeline) where it applies: three
    stages, head dim (V's) up to 128 and more than two key blocks. Block j's S and
    block j - 1's P V are issued together; the loop waits for S alone (wait_group 1,
    groups complete in order) and later for both (0). The first block's softmax is
    peeled off the loop, so the kernel has two, each one FFMA and one ex2 a score.
    ptxas does not serialize the wgmmas, nor spill but for fp8's 24 bytes with
    LAZY_RESCALE (test_lazy_rescale)."""
    built = attention_fp8(2, 4, 256, sk, 128) if kind == "fp8" else attention(2, 4, 256, sk, 128, "bf16")
    plan, _ = built.emit(HOPPER)
    assert plan["stages"] == 3 and plan["overlap_pv"] == (sk > 256), plan
    ptx, r, log = cuda_report(built, "sm_90a", log=True)
    waits = [ln.split()[-1] for ln in ptx.splitlines() if "wgmma.wait_group.sync.aligned" in ln]
    assert ("1;" in waits) == plan["overlap_pv"], waits
    if plan["overlap_pv"]:
        assert ptx.count("ex2.approx.ftz.f32") == 2 * (64 + 2), ptx.count("ex2.approx.ftz.f32")
    assert r["spill_store_bytes"] <= (24 if kind == "fp8" and plan["overlap_pv"] else 0), r
    assert "serialized" not in log, log  # C7513, C7520


@needs_ptxas
@pytest.mark.parametrize("kind,sk", [("bf16", 2048), ("bf16", 333), ("f16", 1000), ("fp8", 384)])
def test_warp_specialized_key_loop(kind, sk):
    """WARP_SPECIALIZED: a third warpgroup copies, the first two compute. The producer
    gives up registers (setmaxnreg.dec to 24) and issues cp.async copies only, each
    block's arrival on its full mbarrier (noinc: counted as one of its 128); the
    consumers take 240, wait on full mbarriers, fence the async proxy before wgmma
    reads, and give stages back on empty ones, with no barrier of the whole workgroup
    in the loop. ptxas neither spills (at 24 registers the producer's per-copy addresses
    spilled 528 bytes at 333 keys before its copies took per-slot edge tests) nor
    serializes; fp8 with LAZY_RESCALE spills 24 bytes (measured faster anyway)."""
    built = attention_fp8(2, 4, 256, sk, 128) if kind == "fp8" else attention(2, 4, 256, sk, 128, kind)
    plan, emitted = built.emit(HOPPER)
    assert plan["warp_specialized"] and plan["threads"] == 384 and emitted.block == (384, 1, 1), plan
    ptx, r, log = cuda_report(built, "sm_90a", log=True)
    assert ptx.count("setmaxnreg.dec.sync.aligned.u32 \t24;") == 1, "the producer"
    assert ptx.count("setmaxnreg.inc.sync.aligned.u32 \t240;") == 1, "the consumers"
    # full and empty, three stages (PERSISTENT: one more, on which the consumers give Q back)
    assert ptx.count("mbarrier.init.shared.b64") == 6 + bool(plan["persistent"])
    assert "cp.async.mbarrier.arrive.noinc.shared.b64" in ptx and "mbarrier.arrive.shared.b64" in ptx
    assert "fence.proxy.async.shared::cta" in ptx
    assert ptx.count("bar.sync \t0;") == 1, "the workgroup meets once, after the mbarriers' initialization"
    assert "bar.arrive" not in ptx
    assert r["spill_store_bytes"] <= (24 if kind == "fp8" else 0), r
    assert "serialized" not in log, log


def test_persistent_plan():
    """PERSISTENT: the unmasked producer/consumer kernel starts one workgroup a
    multiprocessor of the target (not where it does not know them, 0), and takes the
    (query block, batch) tiles in turn; not where the keys and values of the tiles in
    flight pass PERSISTENT_WINDOW_BYTES (2048 queries, 4096 keys: 16.5 MiB). With a mask
    the block table's walk is persistent instead (PERSISTENT_WALK: tiles claimed from a
    counter), where queries and keys fill whole blocks."""
    from dataclasses import replace

    from kf.passes.strategies.attention.hopper.plan import PERSISTENT_WINDOW_BYTES

    def plan_of(built, target=HOPPER):
        return built.emit(target)[0]

    p = plan_of(attention(4, 32, 2048, 2048, 128, "bf16"))
    assert p["persistent"] == [16, 128] and p["grid"] == [132, 1, 1], p
    assert plan_of(attention(4, 32, 2048, 2048, 128, "bf16"), replace(HOPPER, multiprocessors=114))["grid"] == [114, 1, 1]
    p = plan_of(attention(4, 32, 2048, 2048, 128, "bf16"), replace(HOPPER, multiprocessors=0))
    assert not p["persistent"] and p["grid"] == [16, 128, 1], p
    assert 132 / 16 * 4096 * 256 * 2 > PERSISTENT_WINDOW_BYTES
    p = plan_of(attention(4, 32, 2048, 4096, 128, "bf16"))
    assert p["warp_specialized"] and not p["persistent"] and p["grid"] == [16, 128, 1], p
    # the block table's walk: PERSISTENT_WALK, tiles claimed in groups of heads whose keys
    # and values fit the window (8 of 512 KiB here, 12 of 1 MiB, 6 of 2 MiB) and that
    # divide the heads (WALK_EVEN_GROUPS: 8 and 4 of those)
    p = plan_of(attention(2, 4, 1024, 1024, 128, "bf16", mask_shape=(1024, 1024)))
    assert p["warp_specialized"] and not p["persistent"] and p["persistent_walk"] == [8, 8, 8], p
    assert p["grid"] == [64, 1, 1] and not p["reverse_q_blocks"], p
    p = plan_of(attention(4, 32, 2048, 2048, 128, "bf16", mask_shape=(2048, 2048)))
    assert p["persistent_walk"] == [16, 128, 8] and p["grid"] == [132, 1, 1], p
    assert plan_of(attention(2, 32, 4096, 4096, 128, "bf16", mask_shape=(4096, 4096)))["persistent_walk"] == [32, 64, 4]
    assert plan_of(attention(3, 11, 1024, 1024, 128, "bf16", mask_shape=(1024, 1024)))["persistent_walk"] == [8, 33, 11]
    assert plan_of(attention(1, 37, 1024, 1024, 128, "bf16", mask_shape=(1024, 1024)))["persistent_walk"] == [8, 37, 1]
    for built, target in ((attention(2, 4, 1000, 1000, 128, "bf16", mask_shape=(1000, 1000)), HOPPER),  # tails
                          (attention(2, 4, 1024, 1024, 128, "bf16", mask_shape=(1024, 1024)),
                           replace(HOPPER, multiprocessors=0)),
                          (attention(1, 4, 1024, 16384, 128, "bf16", mask_shape=(1024, 16384)), HOPPER)):  # window
        p = plan_of(built, target)
        assert not p["persistent_walk"] and p["grid"][1] > 1, p
    p = plan_of(attention(2, 4, 1024, 1000, 128, "bf16"))  # keys ending inside a block
    assert p["warp_specialized"] and not p["persistent"], p
    assert plan_of(attention_fp8(4, 8, 2048, 2048, 128))["persistent"] == [16, 32]


@needs_ptxas
@pytest.mark.parametrize("elem", ["bf16", "f16"])
def test_lazy_rescale(elem):
    """O's rescale is a branch on a warp vote, taken where a row maximum of the warp
    moved by more than 2^8 (fp8, whose P is scaled by 256 towards e4m3's 448: 2^0.75);
    ptxas neither spills nor serializes the wgmmas around it (the vote makes the branch
    uniform to it). fp8 spills 24 bytes (measured faster all the same)."""
    from kf.passes.strategies.attention.hopper.softmax import lazy_threshold

    assert lazy_threshold(elem, 1.0, 0.0) == 8.0 and lazy_threshold("f8E4M3FN", 256.0, 8.0) == 0.75
    assert lazy_threshold("f8E5M2", 256.0, 8.0) == 7.75
    for built in (attention(2, 4, 256, 2048, 128, elem), attention_fp8(2, 4, 256, 2048, 128)):
        plan, _ = built.emit(HOPPER)
        assert plan["overlap_pv"], plan
        ptx, r, log = cuda_report(built, "sm_90a", log=True)
        assert "vote.sync.ballot" in ptx
        fp8 = plan["elem"].startswith("f8")
        assert r["spill_store_bytes"] <= (24 if fp8 else 0) and "serialized" not in log, (r, log)


@needs_ptxas
@pytest.mark.parametrize("caller", [False, True], ids=["amax", "caller"])
def test_fp8_scores_one_ffma_and_ex2_ftz(caller):
    """The seed's attention under precision="fp8": the scores' factor, which the kernel
    computes from the amaxes (1 / ((448 / max(a_q, eps)) (448 / max(a_k, eps))) / sqrt(d)),
    is non-negative by construction, so the row maximum is taken on the raw scores and a
    score costs one FFMA before its ex2 (64 a key block a thread), as with the bf16
    kernel's constant. The caller's own scales are arguments of unknown sign: their
    scores are scaled first (no FFMA). Either way 2^x is ex2.approx.ftz.f32, one
    MUFU.EX2 (FTZ_EXP2), never the non-ftz form that ptxas wraps in three more
    instructions."""
    import re

    import kf
    from fp8_caller import caller_attention_vt
    from seed_examples import fused_attention

    if caller:
        (q8, k8, v8, *scales), _ = caller_inputs(1, 2, 256, 128)
        fn, args = kf.jit(caller_attention_vt, target="cuda", arch="sm_90a", precision="fp8"), \
            (q8, k8, v8.transpose(-1, -2).contiguous(), *scales)
    else:
        fn = fused_attention.with_options(target="cuda", arch="sm_90a", precision="fp8")
        args = [torch.randn(1, 2, 256, 128, dtype=torch.bfloat16) for _ in range(3)]
    ptx = kf.inspect(fn, *args).stages["ptx"]
    entry = next(m for m in re.findall(r"\.entry (\w+)", ptx) if m.endswith("_attention"))
    body = ptx[ptx.index(".entry " + entry):]
    assert body.count("fma.rn.f32") == (0 if caller else 64), body.count("fma.rn.f32")
    assert body.count("ex2.approx.ftz.f32") == 66 and "ex2.approx.f32" not in body


def quantize(x, elem):
    dt, mx = F8[elem]
    s = mx / x.abs().amax().float()
    return (x.float() * s).clamp(-mx, mx).to(dt), (1 / s).reshape(())


@needs_hopper
@pytest.mark.parametrize("b,h,sq,sk,d,elem,tol", [
    (2, 4, 256, 256, 128, "f8E4M3FN", 3e-2), (1, 2, 300, 384, 128, "f8E4M3FN", 3e-2),
    (2, 2, 129, 128, 256, "f8E4M3FN", 3e-2), (1, 3, 64, 1024, 128, "f8E4M3FN", 3e-2),
    (1, 2, 200, 256, 128, "f8E5M2", 6e-2)])
def test_attention_fp8_cuda(b, h, sq, sk, d, elem, tol):
    """Against float64 attention of the same fp8 values: P rounded to fp8 (3 bits of
    mantissa for e4m3, 2 for e5m2) before the row sums divide it is what the error
    is; measured on the H200 2.2-2.4% for e4m3 and 4.5% for e5m2 (relative, Frobenius)."""
    built = attention_fp8(b, h, sq, sk, d, elem)
    plan, emitted = built.emit(HOPPER)
    assert plan["wgmma"]
    run, _ = cuda_compile(built, emitted)
    gen = torch.Generator().manual_seed(sq + sk + d)
    q, k, v = (torch.randn(b, h, n, d, generator=gen, dtype=torch.bfloat16) for n in (sq, sk, sk))
    q8, iq = quantize(q, elem)
    k8, ik = quantize(k, elem)
    v8, iv = quantize(v, elem)
    out, _ = run([k8, q8, v8.transpose(-1, -2).contiguous(), (iq * ik).reshape(()), iv], (b, h, sq, d), "bf16")
    qd, kd, vd = q8.double() * iq.double(), k8.double() * ik.double(), v8.double() * iv.double()
    ref = torch.softmax(qd @ kd.transpose(-1, -2) / math.sqrt(d), -1) @ vd
    err = ((out.double() - ref).norm() / ref.norm()).item()
    assert err < tol, err


# ---- the caller's fp8 tensors (passes/apply_precision.py, _e4m3_source)

from fp8_caller import caller_attention, caller_attention_vt  # noqa: E402  (examples/)


def caller_inputs(b, h, s, d, device="cpu"):
    """q8, k8, v8 (E4M3FN, per-tensor scaled to 448) and their dequantization factors,
    and the float64 attention of the values they hold."""
    out, deq = [], []
    for _ in range(3):
        x = torch.randn(b, h, s, d, device=device)
        scale = 448 / x.abs().max()
        x8 = (x * scale).to(torch.float8_e4m3fn)
        out.append(x8)
        deq.append((1 / scale).reshape(()).float())
    qd, kd, vd = (x8.double() * f.double() for x8, f in zip(out, deq))
    ref = torch.softmax(qd @ kd.transpose(-1, -2) / math.sqrt(d), -1) @ vd
    return (*out, *deq), ref


def rel(a, b) -> float:
    return ((a.double() - b).norm() / b.norm()).item()


def test_caller_fp8_attention_cpu():
    """Under precision="fp8" the caller's E4M3FN tensors are the products' operands as
    they are (no amax, no second rounding): the error is the probabilities' rounding to
    E4M3FN alone (2-3%); under "auto" the f32 attention of the same values."""
    import kf

    args, ref = caller_inputs(2, 3, 200, 64)
    auto = kf.jit(caller_attention, target="cpu")(*args)
    fp8 = kf.jit(caller_attention, target="cpu", precision="fp8")(*args)
    assert rel(auto, ref) < 4e-3  # the bf16 result's rounding
    assert 4e-3 < rel(fp8, ref) < 4e-2


@needs_ptxas
def test_caller_fp8_attention_is_the_fp8_kernel():
    """On sm_90a: the fp8 wgmma attention kernel reads the caller's q8 and k8 and a
    transpose kernel makes v8 K-major (the widening fused into it) -- no amax, no
    quantization, and no kernel for the scores' rank-0 factor, which the attention
    kernel computes from sq and sk (kf-fuse's free scalars). No spills."""
    import kf
    from kf.passes.to_cuda import assemble

    args, _ = caller_inputs(2, 4, 256, 128)
    info = kf.inspect(kf.jit(caller_attention, target="cuda", arch="sm_90a", precision="fp8"), *args)
    kinds = sorted(ln.split('kf.kernel = "')[1].split('"')[0] for ln in info.stages["fused"].splitlines()
                   if 'kf.kernel = "' in ln)
    assert kinds == ["attention", "transpose"], kinds
    ptx = info.stages["ptx"]
    assert "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3" in ptx
    for name, r in assemble(ptx, "sm_90a").kernels.items():
        assert r["spill_store_bytes"] == 0 and r["spill_load_bytes"] == 0, (name, r)


@needs_hopper
@pytest.mark.parametrize("v_kmajor", [False, True], ids=["v", "vt"])
@pytest.mark.parametrize("b,h,s,d", [(2, 4, 256, 128), (1, 3, 384, 256)])
def test_caller_fp8_attention_cuda(b, h, s, d, v_kmajor):
    """The same on the H200, fresh random values, against float64 of the fp8 values;
    V row-major (a transpose kernel) or K-major (read as it is)."""
    import kf

    args, ref = caller_inputs(b, h, s, d, device="cuda")
    fn = caller_attention
    if v_kmajor:
        args = (*args[:2], args[2].transpose(-1, -2).contiguous(), *args[3:])
        fn = caller_attention_vt
    out = kf.jit(fn, precision="fp8")(*args)
    assert out.dtype == torch.bfloat16 and out.shape == (b, h, s, d)
    assert rel(out.cpu(), ref.cpu()) < 4e-2


@needs_ptxas
def test_caller_fp8_v_transposed_needs_no_copy():
    """V given K-major: the fp8 kernel reads it as it is (no transpose kernel): the
    call is that one kernel, and the CPU result is the one of V row-major."""
    import kf

    (q8, k8, v8, *scales), ref = caller_inputs(2, 4, 256, 128)
    vt = v8.transpose(-1, -2).contiguous()
    info = kf.inspect(kf.jit(caller_attention_vt, target="cuda", arch="sm_90a", precision="fp8"), q8, k8, vt, *scales)
    kinds = sorted(ln.split('kf.kernel = "')[1].split('"')[0] for ln in info.stages["fused"].splitlines()
                   if 'kf.kernel = "' in ln)
    assert kinds == ["attention"], kinds
    assert "wgmma.mma_async.sync.aligned.m64n128k32.f32.e4m3.e4m3" in info.stages["ptx"]
    cpu = kf.jit(caller_attention_vt, target="cpu", precision="fp8")(q8, k8, vt, *scales)
    assert 4e-3 < rel(cpu, ref) < 4e-2


@needs_ptxas
@pytest.mark.parametrize("v_kmajor", [False, True], ids=["v", "vt"])
def test_caller_fp8_at_head_dim_64_is_bf16_attention(v_kmajor):
    """Head dim 64, which the fp8 kernel does not take: under precision="fp8" on sm_90a
    the attention stays 16-bit (kf-apply-precision's fp8-attention=kernel), the caller's
    E4M3FN values widened to bf16 (exactly) for the bf16 wgmma kernel. V given K-major
    goes through a transpose kernel of its own, so that the attention reads V as it lies:
    read through the transpose inside the attention kernel, it had kept the bf16 wgmma
    plan from applying (1.18 ms against 0.33 for the bf16 call on the H200, 4x32x2048x64)."""
    import kf

    (q8, k8, v8, *scales), _ = caller_inputs(2, 4, 256, 64)
    fn, v = (caller_attention_vt, v8.transpose(-1, -2).contiguous()) if v_kmajor else (caller_attention, v8)
    info = kf.inspect(kf.jit(fn, target="cuda", arch="sm_90a", precision="fp8"), q8, k8, v, *scales)
    kinds = [ln.split('kf.kernel = "')[1].split('"')[0] for ln in info.stages["fused"].splitlines()
             if 'kf.kernel = "' in ln]
    assert kinds.count("attention") == 1 and kinds.count("transpose") == v_kmajor, kinds
    ptx = info.stages["ptx"]
    assert "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16" in ptx and "e4m3.e4m3" not in ptx

