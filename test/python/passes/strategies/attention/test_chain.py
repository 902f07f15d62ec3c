"""Attention under a precision policy (passes/strategies/attention/chain.py): the P chain
and the epilogue, as the SIMT and mma.sync kernels apply them."""

from __future__ import annotations

import pytest
import torch
from kf.dialects import builders as kb
from kf.dialects.types import TensorSpec
from kf.passes.strategies.base import TargetInfo
from strategy_kernels import (CUDA, SPIRV, Built, cuda_report, cuda_run, needs_cuda, needs_ptxas, needs_vulkan, randn,
                     spirv_run)


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


# ---- the row logsumexp, the kernels' second output under kf's autograd

def _causal_attention(q, k, v):
    """Attention with its causal mask made inside the function (a tril of ones)."""
    s = q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5
    mask = torch.ones(q.shape[-2], k.shape[-2], device=q.device).tril()
    return torch.softmax(s.masked_fill(mask == 0, -1e9), dim=-1) @ v


def _autograd_call(mask_kind, target, args):
    """(the kf function, its arguments) of the seed attention with the mask kind: None,
    "given" (a causal mask tensor), "dead" (one with rows masked everywhere), "causal"
    (made inside the function)."""
    import kf
    import seed_examples as se

    if mask_kind == "causal":
        return kf.jit(_causal_attention, target=target), list(args)
    return se.fused_attention.with_options(target=target), [*args, _mask(mask_kind, args[0], args[1])]


def _mask(mask_kind, q, k):
    """None, or the causal mask of q and k's lengths (f32, on q's device); "dead": with
    the first and last query rows masked everywhere."""
    if mask_kind is None:
        return None
    mask = torch.ones(q.shape[-2], k.shape[-2], dtype=torch.float32, device=q.device).tril()
    if mask_kind == "dead":
        mask[0] = mask[-1] = 0
    return mask


def _split_forward(kfn, args):
    """The forward kf's autograd runs for this call (O, then the row logsumexp)."""
    from kf import autograd, torch_ops

    autograd.backward_of(kfn, *args)
    tensors, structure = torch_ops.flatten_call(kfn, args, {})
    return torch_ops.training_of(kfn, structure, [t.detach() for t in tensors])[0].forward


@needs_ptxas
@pytest.mark.parametrize("arch", ["sm_90a", "sm_80"])
@pytest.mark.parametrize("seq,d", [(257, 40), (257, 64), (257, 128), (2048, 64), (2048, 128)])
@pytest.mark.parametrize("mask_kind", [None, "given", "causal"])
def test_forward_under_autograd_is_the_attention_kernels(arch, seq, d, mask_kind):
    """Under autograd the seed attention's forward (bf16) is the kernels of the forward
    alone -- the attention kernel, after its block table where a mask is given or made
    on sm_90a --, which writes the row logsumexp beside O: no matmul or logsumexp kernel
    beside it; ptxas assembles every kernel without spills."""
    import re

    from kf.passes import to_cuda

    qkv = [torch.randn(1, 2, seq, d, dtype=torch.bfloat16, requires_grad=True) for _ in range(3)]
    kfn, args = _autograd_call(mask_kind, "cpu", qkv)
    fwd = _split_forward(kfn, args)
    info = fwd.with_options(target="cuda", arch=arch).inspect(*(a.detach() for a in args if a is not None))
    ptx = info.stages["ptx"]
    entries = [re.sub(r"^\w+?_k0_", "", e) for e in re.findall(r"\.entry (\w+)", ptx)]
    hopper = arch == "sm_90a" and d % 64 == 0
    assert entries == (["attention_blocks", "attention"] if hopper and mask_kind else ["attention"]), entries
    assert '"kf.logsumexp"' in info.stages["fused"]
    for name, r in to_cuda.assemble(ptx, arch).kernels.items():
        if (arch, seq, d, mask_kind) == ("sm_90a", 257, 128, "causal") and name.endswith("_attention"):
            # the warp-specialized walk of a causal mask made inside the function, with
            # tails: its producer warpgroup (24 registers, setmaxnreg) spills without the
            # logsumexp too (8 bytes; 40 with it, in the producer's copy loop too, by the
            # SASS): a register budget of the producer, which writes no logsumexp
            continue
        assert r["spill_store_bytes"] == 0 and r["spill_load_bytes"] == 0, (name, r)


@pytest.mark.parametrize("target", ["vulkan", "metal"])
@pytest.mark.parametrize("mask_kind", [None, "given", "causal"])
def test_forward_under_autograd_is_one_simt_kernel(target, mask_kind):
    """On Vulkan and Metal the forward under autograd (f32, seq 257, head dim 40) is the
    SIMT attention kernel alone, which writes O and the row logsumexp (codegen only:
    SPIR-V, and MSL through SPIRV-Cross)."""
    import re

    qkv = [torch.randn(1, 2, 257, 40, requires_grad=True) for _ in range(3)]
    kfn, args = _autograd_call(mask_kind, "cpu", qkv)
    info = _split_forward(kfn, args).with_options(target=target).inspect(*(a.detach() for a in args if a is not None))
    calls = re.findall(r"call @(\w+)", info.stages["fused"])
    assert len(calls) == 1 and calls[0].endswith("_attention"), calls
    assert re.search(r"-> \(tensor<1x2x257x40xf32>, tensor<1x2x257x1xf32>\)", info.stages["fused"])
    if target == "metal":
        assert len(re.findall(r"kernel void", info.stages["msl"])) == 1


@needs_vulkan
def test_forward_under_autograd_past_the_grid_limit_on_vulkan():
    """70001 batch elements, past the attention kernel's grid: the generic strategy takes
    the attention kernel function, its logsumexp included, and gives torch's values."""
    import re

    q = torch.randn(70001, 1, 3, 8)
    k, v = torch.randn(70001, 1, 5, 8), torch.randn(70001, 1, 5, 8)
    kfn, args = _autograd_call(None, "vulkan", [t.clone().requires_grad_() for t in (q, k, v)])
    fwd = _split_forward(kfn, args)
    out, lse = fwd(q, k, v)
    s = q.double() @ k.double().transpose(-2, -1) / 8 ** 0.5
    torch.testing.assert_close(lse.double(), torch.logsumexp(s, -1, keepdim=True), rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(out.double(), torch.softmax(s, -1) @ v.double(), rtol=1e-5, atol=1e-5)
    assert set(re.findall(r'strategy = "(\w+)"', fwd.inspect(q, k, v).stages["gpu"])) == {"generic"}


#: (element type, seq_q, seq_k, head dim): the wgmma kernels (64, 128 on sm_90a), mma.sync
#: (sm_80/89, multiples of 16), SIMT (40, 65, f32); one query, cross lengths, 2048 keys
_LSE_CUDA_CASES = [(e, *c) for e in ("bf16", "f16") for c in ((1, 1, 40), (7, 257, 65), (257, 7, 64), (257, 257, 128))] + \
    [("bf16", 2048, 2048, 64), ("bf16", 2048, 2048, 128), ("f32", 257, 257, 64), ("f32", 7, 257, 65)]


@needs_cuda
@pytest.mark.parametrize("elem,sq,sk,d", _LSE_CUDA_CASES)
@pytest.mark.parametrize("mask_kind", [None, "given", "dead", "causal"])
def test_lse_and_gradients_cuda(elem, sq, sk, d, mask_kind):
    """On a CUDA device (the wgmma kernels at head dims 64 and 128 on sm_90a, mma.sync on
    sm_80/89, SIMT for the rest and f32): the forward's row logsumexp and O, and the
    gradients through kf's autograd, against torch in float64."""
    dtype = {"bf16": torch.bfloat16, "f16": torch.float16, "f32": torch.float32}[elem]
    gen = torch.Generator().manual_seed(sq + sk + d)
    q = torch.randn(1, 2, sq, d, generator=gen)
    k, v = (torch.randn(1, 2, sk, d, generator=gen) for _ in range(2))
    qkv = [t.to(dtype).cuda().requires_grad_() for t in (q, k, v)]
    kfn, args = _autograd_call(mask_kind, "cuda", qkv)
    out, lse = _split_forward(kfn, args)(*(a.detach() for a in args if a is not None))
    ref = [t.detach().cpu().double().requires_grad_() for t in qkv]
    s = ref[0] @ ref[1].transpose(-2, -1) / d ** 0.5
    if mask_kind is not None:
        s = s.masked_fill(_mask("dead" if mask_kind == "dead" else "given", ref[0], ref[1]) == 0, -1e9)
    want_o = torch.softmax(s, -1) @ ref[2]
    tol = 3e-2 if elem != "f32" else 5e-3  # f32: the backward's matmuls may round to TF32
    assert lse.dtype == torch.float32 and lse.shape == (1, 2, sq)
    torch.testing.assert_close(lse.cpu().double(), torch.logsumexp(s, -1).detach(), rtol=tol, atol=tol)
    torch.testing.assert_close(out.cpu().double(), want_o.detach(), rtol=tol, atol=tol)
    g = torch.randn(1, 2, sq, d, generator=gen)
    got = torch.autograd.grad(kfn(*args), qkv, g.to(dtype).cuda())
    want = torch.autograd.grad(want_o, ref, g.to(dtype).double())
    for a, e in zip(got, want):
        # (all zeros where every row is masked: the gradients of a uniform softmax's scores)
        assert (a.cpu().double() - e).norm().item() <= tol * e.norm().item() + 1e-6, (a, e)
