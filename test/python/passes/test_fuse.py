"""kf-fuse's attention chain around what the precision policy writes (passes/fuse.py,
``_attention_chains``), and the attention strategy's reading of it (``_Chain`` in
passes/strategies/attention.py): under bf16, fp16 and fp8 the seed's attention is one
attention kernel, and hand-written P chains and epilogues (casts and rank-0 scales
around P @ V) join it while anything else keeps the chain apart.

test/passes/kf-fuse-precision.mlir shows the fused IR; the kernels' numbers are in
test/python/passes/strategies/ (hand-built kernels) and test/python/compiler/test_precision.py.
"""

from __future__ import annotations

import sys
from collections import Counter
from pathlib import Path

import pytest
import torch
from mlir import ir

from kf.dialects import TensorSpec, spec_of
from kf.dialects import builders as kb
from kf.passes import pipeline
from kf.passes.to_cuda import assemble, ptxas_path
from kf.passes.strategies.attention import _Chain, _transposed_source

sys.path.insert(0, str(Path(__file__).resolve().parent))
from test_apply_precision import build  # noqa: E402  (a module of one function @f)


def fused(body, specs, passes: str = "kf-fuse"):
    """(ctx, module, {kernel kind: [kernel functions]}) of ``@f(specs) = body`` after passes."""
    ctx, module = build(body, specs)
    with ctx, ir.Location.unknown():
        pm, _ = pipeline.build(f"builtin.module({passes})", ctx)
        pm.run(module.operation)
    kinds: dict = {}
    for op in module.body.operations:
        op = op.operation
        if "kf.kernel" in op.attributes:
            kinds.setdefault(ir.StringAttr(op.attributes["kf.kernel"]).value, []).append(op)
    return ctx, module, kinds


def counts(kinds) -> Counter:
    return Counter({k: len(v) for k, v in kinds.items()})


def seed_attention(masked: bool):
    """The seed's fused_attention as kf ops (q, k, v [, mask])."""
    def body(q, k, v, *mask):
        d = spec_of(q.type).shape[-1]
        elem = spec_of(q.type).elem
        s = kb.div(kb.matmul(q, kb.transpose(k, perm=[0, 1, 3, 2])), kb.scalar(d ** 0.5, elem))
        if mask:
            s = kb.masked_fill(s, kb.cmp(mask[0], kb.scalar(0.0, elem), predicate="eq"), value=-1e9)
        return kb.matmul(kb.softmax(s, dim=-1), v)

    return body


def precision_passes(precision: str, storage: bool = True) -> str:
    extra = "" if storage else " fp8-storage=false"
    return f"kf-apply-precision{{precision={precision}{extra}}}, kf-canonicalize, kf-fuse"


CASES = [  # precision, fp8 storage, element type, seq, head dim, masked
    ("bf16", True, "f32", 100, 64, False), ("bf16", True, "f32", 257, 128, True),
    ("fp16", True, "f32", 100, 128, True), ("bf16", True, "bf16", 257, 64, True),
    ("fp8", True, "f32", 100, 64, False), ("fp8", True, "bf16", 257, 128, True),
    ("fp8", False, "f32", 257, 64, True), ("fp8", False, "bf16", 100, 128, False),
]


@pytest.mark.parametrize("precision,storage,elem,seq,d,masked", CASES)
def test_seed_attention_is_one_kernel_under_precision(precision, storage, elem, seq, d, masked):
    """One attention kernel; the other kernels are the operand casts (bf16, fp16) or the
    amax and quantization of q, k and v (fp8; V's through a transpose kernel with fp8
    storage): elementwise, transpose and generic ones, never a
    matmul or a softmax of its own. What _Chain reads off the kernel is the contract the
    kernels (and the Hopper kernel's fp8 plan) are written against."""
    specs = [((1, 2, seq, d), elem)] * 3 + ([((seq, seq), elem)] if masked else [])
    ctx, _, kinds = fused(seed_attention(masked), specs, precision_passes(precision, storage))
    n = counts(kinds)
    assert n["attention"] == 1 and not n["matmul"] and not n["rowwise"], n
    assert set(n) <= {"attention", "elementwise", "generic", "transpose"}, n
    assert n["transpose"] == (precision == "fp8" and storage), n  # V quantized K-major
    with ctx, ir.Location.unknown():
        [kernel] = kinds["attention"]
        ch = _Chain(kernel)
        assert len([o for o in kernel.regions[0].blocks[0].operations if o.operation.name == "kf.matmul"]) == 2
        if precision == "fp8":
            assert ch.p_scale == 256.0 and ch.p_value != ch.sm.result
            assert ch.p_elem == ("f8E4M3FN" if storage else "f32")
            assert ch.epilogue_value != ch.mm2.result  # * 1 / (256 s_v) [, cast]
            rank0 = [s for s in ch.view.arg_specs if not s.shape]
            # the amaxes of q, k and v: the kernel computes the scores' and the output's
            # dequantization factors from them (kf-fuse's free scalars)
            assert len(rank0) == 3
            if storage:  # V K-major: the argument is [.., Dv, Sk]
                vt = _transposed_source(ch.v)
                assert vt != ch.v and ch.view.arg_index(vt) is not None
                assert spec_of(vt.type) == TensorSpec((1, 2, d, seq), "f8E4M3FN")
            else:
                assert ch.view.arg_index(ch.v) is not None and spec_of(ch.v.type).elem == "f32"
        elif elem == "f32":  # the probabilities cast for the second product
            narrow = "bf16" if precision == "bf16" else "f16"
            assert ch.p_elem == narrow and ch.p_scale == 1.0 and ch.p_value != ch.sm.result
            assert ch.epilogue_value == ch.mm2.result
        else:  # bf16 inputs under bf16: nothing to change
            assert ch.p_value == ch.sm.result and ch.p_elem == "bf16" and n == Counter(attention=1)


SPEC = [((2, 3, 40, 16), "f32"), ((2, 3, 48, 16), "f32"), ((2, 3, 48, 24), "f32"), ((), "f32")]


def chain(p_chain, epilogue):
    """q, k, v, a rank-0 argument c: softmax(q k^T) -> p_chain -> @ v -> epilogue."""
    def body(q, k, v, c):
        p = p_chain(kb.softmax(kb.mul(kb.matmul(q, kb.transpose(k, perm=[0, 1, 3, 2])), kb.scalar(0.25, "f32")),
                               dim=-1), c)
        return epilogue(product(p, v), c)

    return body


def product(p, v):
    """p @ v with v cast to p's type, accumulated in f32 (as the policy writes it)."""
    elem = spec_of(p.type).elem
    vv = v if spec_of(v.type).elem == elem else kb.cast(v, elem)
    shape = spec_of(p.type).shape[:-1] + spec_of(v.type).shape[-1:]
    return kb.build("matmul", [p, vv], None, [TensorSpec(shape, "f32")]).result


def ident(x, c):
    return x


P_CHAINS = {  # name: (P chain, p_scale, p_elem)
    "none": (ident, 1.0, "f32"),
    "cast": (lambda p, c: kb.cast(p, "bf16"), 1.0, "bf16"),
    "scale_first": (lambda p, c: kb.cast(kb.mul(kb.scalar(4.0, "f32"), p), "f16"), 4.0, "f16"),
    "div": (lambda p, c: kb.div(kb.cast(p, "bf16"), kb.scalar(0.5, "bf16")), 2.0, "bf16"),
    "fp8": (lambda p, c: kb.cast(kb.cast(kb.mul(p, kb.scalar(256.0, "f32")), "f8E4M3FN"), "f32"), 256.0, "f32"),
    "argument": (lambda p, c: kb.mul(p, c), None, "f32"),
}
EPILOGUES = {
    "none": ident,
    "scale": lambda o, c: kb.mul(o, kb.scalar(0.5, "f32")),
    "scale_first_cast": lambda o, c: kb.cast(kb.mul(kb.scalar(0.5, "f32"), o), "bf16"),
    "argument_cast": lambda o, c: kb.cast(kb.div(o, c), "f16"),
}


@pytest.mark.parametrize("epilogue", list(EPILOGUES))
@pytest.mark.parametrize("p_chain", list(P_CHAINS))
def test_p_chains_and_epilogues_join_the_kernel(p_chain, epilogue):
    """Casts and muls/divs by rank-0 values (fills, or an argument, which the kernel
    takes as one) between the softmax and P @ V and after it: one attention kernel,
    with p_value, p_scale (c of c * P, None where a factor is not a constant), p_elem
    and epilogue_value as _Chain documents."""
    pc, scale, p_elem = P_CHAINS[p_chain]
    body = chain(pc, EPILOGUES[epilogue])
    ctx, _, kinds = fused(body, SPEC)
    n = counts(kinds)
    assert n["attention"] == 1 and set(n) <= {"attention", "elementwise"}, n  # v's cast is elementwise
    with ctx, ir.Location.unknown():
        ch = _Chain(kinds["attention"][0])
        assert (ch.p_value == ch.sm.result) == (p_chain == "none")
        assert ch.p_scale == scale and ch.p_elem == p_elem
        assert (ch.epilogue_value == ch.mm2.result) == (epilogue == "none")
        assert ch.epilogue_value == ch.view.results[0]
        if "argument" in (p_chain, epilogue):
            assert TensorSpec((), "f32") in ch.view.arg_specs


def _not_attention(body, specs=SPEC):
    ctx, _, kinds = fused(body, specs)
    n = counts(kinds)
    assert not n["attention"], n
    assert n["matmul"] == 2  # both products are kernels of their own, as before
    return n


def test_p_chains_that_are_not_a_scale_keep_the_chain_apart():
    """A factor that varies over P (a tensor), an op that is not linear in P (exp), or
    P used outside the chain: no attention kernel (the kernels could not apply it to
    unnormalized probabilities)."""
    def tensor_factor(q, k, v, w):
        p = kb.softmax(kb.matmul(q, kb.transpose(k, perm=[0, 1, 3, 2])), dim=-1)
        return kb.matmul(kb.mul(p, w), v)

    def nonlinear(q, k, v, c):
        p = kb.softmax(kb.matmul(q, kb.transpose(k, perm=[0, 1, 3, 2])), dim=-1)
        return kb.matmul(kb.exp(kb.cast(p, "bf16")), kb.cast(v, "bf16"))

    def reused(q, k, v, c):
        p = kb.softmax(kb.matmul(q, kb.transpose(k, perm=[0, 1, 3, 2])), dim=-1)
        pb = kb.cast(p, "bf16")
        return kb.matmul(pb, kb.cast(v, "bf16")), pb

    def divided_by_p(q, k, v, c):
        p = kb.softmax(kb.matmul(q, kb.transpose(k, perm=[0, 1, 3, 2])), dim=-1)
        return kb.matmul(kb.div(c, p), v)

    _not_attention(tensor_factor, SPEC[:3] + [((40, 48), "f32")])
    for body in (nonlinear, reused, divided_by_p):
        _not_attention(body)


def test_epilogue_stops_where_its_value_is_used_twice():
    """o * c feeds the result and a second output: the attention kernel returns o * c
    (the epilogue ends there) and the add is a kernel of its own."""
    def body(q, k, v, c):
        p = kb.softmax(kb.matmul(q, kb.transpose(k, perm=[0, 1, 3, 2])), dim=-1)
        o = kb.mul(product(kb.cast(p, "bf16"), v), c)
        return o, kb.add(o, kb.scalar(1.0, "f32"))

    ctx, _, kinds = fused(body, SPEC)
    assert counts(kinds)["attention"] == 1
    with ctx, ir.Location.unknown():
        ch = _Chain(kinds["attention"][0])
        assert ch.epilogue_value != ch.mm2.result and defining_name(ch.epilogue_value) == "kf.mul"


def defining_name(v) -> str:
    return v.owner.operation.name


def test_scores_through_a_scale_written_first():
    """``c * (q k^T)`` (the scale as the first operand) is followed to q k^T."""
    def body(q, k, v, c):
        s = kb.mul(c, kb.matmul(q, kb.transpose(k, perm=[0, 1, 3, 2])))
        return kb.matmul(kb.softmax(kb.cast(s, "bf16"), dim=-1), kb.cast(v, "bf16"))

    _, _, kinds = fused(body, SPEC)
    assert counts(kinds)["attention"] == 1


def test_other_fusions_are_unchanged_under_precision():
    """A matmul with its bias and GELU is one matmul kernel under bf16 (the operand
    casts before it), and the seed's layer norm one rowwise kernel."""
    def mlp(x, w, b):
        return kb.gelu(kb.add(kb.matmul(x, w), b))

    _, _, kinds = fused(mlp, [((77, 131), "f32"), ((131, 45), "f32"), ((45,), "f32")], precision_passes("bf16"))
    assert counts(kinds)["matmul"] == 1 and not counts(kinds)["attention"]
    [mm] = kinds["matmul"]
    names = [o.operation.name for o in mm.regions[0].blocks[0].operations]
    assert "kf.add" in names and "kf.gelu" in names

    def layer_norm(x, w, b):
        mean = kb.mean(x, dims=[-1], keepdim=True)
        c = kb.sub(x, mean)
        var = kb.mean(kb.mul(c, c), dims=[-1], keepdim=True)
        return kb.add(kb.mul(w, kb.div(c, kb.sqrt(kb.add(var, kb.scalar(1e-5, "f32"))))), b)

    _, _, kinds = fused(layer_norm, [((4, 1000), "f32"), ((1000,), "f32"), ((1000,), "f32")], precision_passes("fp8"))
    assert counts(kinds) == Counter(rowwise=1)


# ---------------------------------------------------------------- backward graphs


needs_ptxas = pytest.mark.skipif(ptxas_path() is None, reason="ptxas not installed")


def _f_layer_norm(x, w, b):
    return torch.nn.functional.layer_norm(x, x.shape[-1:], w, b, 1e-5)


def _hand_layer_norm(x, w, b):
    mean = x.mean(-1, keepdim=True)
    return w * (x - mean) * torch.rsqrt(((x - mean) ** 2).mean(-1, keepdim=True) + 1e-5) + b


def _f_rms_norm(x, w):
    return torch.nn.functional.rms_norm(x, x.shape[-1:], w, 1e-6)


def _hand_rms_norm(x, w):
    return x * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-6).to(x.dtype) * w


def _softmax(x):
    return torch.softmax(x, -1)


def _log_softmax(x):
    return torch.log_softmax(x, -1)


def _bias_gelu(x, b):
    return torch.nn.functional.gelu(x + b)


def _swiglu(gate, up):
    return torch.nn.functional.silu(gate) * up



@needs_ptxas
@pytest.mark.parametrize("fn,weights,kinds", [
    (_f_layer_norm, 2, ["generic", "rowwise"]),
    (_hand_layer_norm, 2, ["generic", "rowwise"]),
    (_f_rms_norm, 1, ["generic", "rowwise"]),
    (_hand_rms_norm, 1, ["generic", "rowwise"]),
    (_softmax, 0, ["rowwise"]),
    (_log_softmax, 0, ["rowwise"]),
    (_bias_gelu, 1, ["elementwise", "generic"]),
    (_swiglu, -1, ["elementwise"]),
], ids=lambda v: getattr(v, "__name__", None))
def test_row_backward_kernels_in_sm90a_ptx(fn, weights, kinds):
    """The backward of a norm is a row kernel (dx, reading the saved statistics) and one
    column kernel computing the weight's and the bias's gradients from the inputs (no
    f32 product written between them); softmax's is the row kernel alone; an elementwise
    chain's is one kernel (bias + GELU: and the bias gradient's column sum of it).
    Counted as ``.entry`` lines of the PTX for sm_90a, as it assembles without a GPU."""
    import re

    import kf
    import kf.autograd

    rows, cols = 257, 1024
    x = torch.randn(rows, cols, dtype=torch.bfloat16)
    args = [x] + ([torch.randn(rows, cols, dtype=torch.bfloat16)] if weights < 0 else
                  [torch.randn(cols, dtype=torch.bfloat16) for _ in range(weights)])
    kfn = kf.jit(fn, target="cuda", arch="sm_90a")
    bwd = kf.autograd.backward_of(kfn, *args)
    info = bwd.inspect()
    entries = re.findall(r"\.entry\s+(\w+)", info.stages["ptx"])
    assert sorted(e.rsplit("_", 1)[-1] for e in entries) == kinds, entries
    assert set(assemble(info.stages["ptx"], "sm_90a").kernels) == set(entries)


def _seed_layer_norm(x, w, b):
    mean = x.mean(dim=-1, keepdim=True)
    var = x.var(dim=-1, keepdim=True)
    return w * ((x - mean) / torch.sqrt(var + 1e-5)) + b


@needs_ptxas
@pytest.mark.parametrize("fn,weights", [(_seed_layer_norm, 2), (_f_layer_norm, 2), (_hand_layer_norm, 2),
                                        (_hand_rms_norm, 1), (_f_rms_norm, 1)],
                         ids=lambda v: getattr(v, "__name__", None))
def test_norm_backward_partials_in_the_row_kernel(fn, weights):
    """At 8192 rows the weight's and bias's gradients are blocks of rows summed by the
    row kernel beside dx (kf-split-reductions' column blocks, joined by kf-fuse): two
    kernels in the sm_90a PTX, and the second reads the [256, 4096] f32 partial sums,
    never the 8192 rows."""
    import re

    import kf
    import kf.autograd

    rows, cols = 8192, 4096
    args = [torch.randn(rows, cols, dtype=torch.bfloat16)] + [torch.randn(cols, dtype=torch.bfloat16)
                                                              for _ in range(weights)]
    bwd = kf.autograd.backward_of(kf.jit(fn, target="cuda", arch="sm_90a"), *args)
    info = bwd.inspect()
    entries = re.findall(r"\.entry\s+(\w+)", info.stages["ptx"])
    assert len(entries) == 2 and sorted(e.rsplit("_", 1)[-1] for e in entries) == ["generic", "rowwise"], entries
    assert set(assemble(info.stages["ptx"], "sm_90a").kernels) == set(entries)
    fused = info.stages["fused"]
    kernels = re.findall(r"func\.func private @(\w+)\((.*?)\) -> (.*?) attributes", fused)
    by_kind = {name.rsplit("_", 1)[-1]: (ins, outs) for name, ins, outs in kernels}
    row_ins, row_outs = by_kind["rowwise"]
    col_ins, col_outs = by_kind["generic"]
    assert row_outs.count("tensor<256x4096xf32>") == weights
    assert re.findall(r"tensor<[0-9x]+x(?:bf16|f32)>", col_ins) == ["tensor<256x4096xf32>"] * weights
    assert f"{rows}x" not in col_ins


def _mlp(x, w1, b1, w2):
    return torch.nn.functional.gelu(x @ w1 + b1) @ w2


@needs_ptxas
def test_gemm_backward_reads_transposed_operands_in_place():
    """An MLP's backward: dA = dC B^T and dB = A^T dC are matmul kernels that read the
    transposed operand in place (the transpose inside the matmul kernel, no transpose
    kernel, no copy), GELU's derivative is the epilogue of the first, and the bias's
    gradient is one column kernel."""
    import re

    import kf
    import kf.autograd

    dt = torch.bfloat16
    args = [torch.randn(*s, dtype=dt) for s in [(256, 128), (128, 512), (512,), (512, 128)]]
    bwd = kf.autograd.backward_of(kf.jit(_mlp, target="cuda", arch="sm_90a"), *args)
    info = bwd.inspect()
    kinds = sorted(e.rsplit("_", 1)[-1] for e in re.findall(r"\.entry\s+(\w+)", info.stages["ptx"]))
    assert kinds == ["generic"] + ["matmul"] * 4, kinds
    fused = info.stages["fused"]
    kernels = fused.split("func.func private @")[1:]
    for k in kernels:
        if '"kf.transpose"' in k:
            assert '"kf.matmul"' in k, k  # only as a matmul's operand
    assert sum('"kf.transpose"' in k for k in kernels) == 4


def _lse_times_mask(x, m):
    return (torch.logsumexp(x, dim=-1, keepdim=True).squeeze(1) * m).sum()


def _lse_and_softmax(x):
    lse = torch.logsumexp(x, -1)
    return lse.sum(), torch.exp(x - lse[:, None])


@pytest.mark.parametrize("target", ["cpu", "vulkan", "cuda"])
@pytest.mark.parametrize("fn", [_lse_times_mask, _lse_and_softmax])
def test_a_reshaped_row_statistic_read_by_its_own_kernel(fn, target):
    """A row statistic reshaped and then read by the same kernel's epilogue: the
    reshape, as a view between two ops of one kernel, closed a cycle in the schedule
    (kf-fuse asserted on GPU targets); it is computed inside the kernel instead."""
    import kf
    from kf.runtime import vulkan

    if target == "vulkan" and not vulkan.is_available():
        pytest.skip("no Vulkan device")
    gen = torch.Generator().manual_seed(0)
    for n in (1, 7, 257):
        x = torch.randn(n, 33, generator=gen)
        args = (x,) if fn is _lse_and_softmax else (x, torch.randn(n, generator=gen))
        f = kf.jit(fn, target=target)
        if target == "cuda":
            assert kf.inspect(f, *args).ptx.count(".entry") >= 1
            continue
        got, want = f(*args), fn(*args)
        for a, b in zip(got if isinstance(got, tuple) else (got,), want if isinstance(want, tuple) else (want,)):
            # a sum of 257 terms of either sign: f32's rounding is relative to the terms
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-4)


def _pairwise_distances(a):
    m = a @ a.t()
    d = torch.diagonal(m).clone()  # a kernel of its own (an index_select) between the GEMM and its epilogue
    return (d + d[:, None] - 2 * m).clamp(min=0).sqrt()


@pytest.mark.parametrize("target", ["vulkan", "cuda"])
def test_an_epilogue_reading_its_kernel_through_another_kernel(target):
    """A GEMM's epilogue reads, besides the product, a value computed from the product by
    another kernel or call (pairwise distances: the product's diagonal): the path through
    it is a path, so the epilogue stays out of the GEMM (a cyclic schedule otherwise)."""
    import kf
    from kf.runtime import vulkan

    if target == "vulkan" and not vulkan.is_available():
        pytest.skip("no Vulkan device")
    for n in (1, 9, 257):
        a = torch.randn(n, 4)
        f = kf.jit(_pairwise_distances, target=target)
        if target == "cuda":
            assert kf.inspect(f, a).ptx.count(".entry") >= 2
            continue
        torch.testing.assert_close(f(a), _pairwise_distances(a), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("shape", [(), (1,), (7,), (257,), (0,)])
def test_ops_cloned_into_a_kernel_may_read_its_members(shape):
    """Dropout of a 0-d tensor fuses kf.rand with the multiply, and clones the comparison
    and select between them (cheap ops) into that kernel: the clones read the rand, so
    the kernel's ops are written in program order (a KeyError in kf-fuse before)."""
    import kf
    from kf.runtime import vulkan

    if not vulkan.is_available():
        pytest.skip("no Vulkan device")
    x = torch.randn(shape) + 5
    got = kf.jit(lambda x: torch.nn.functional.dropout(x, 0.5, training=True), target="vulkan")(x)
    assert got.shape == x.shape and got.dtype == x.dtype
    assert bool(((got == 0) | (got == 2 * x)).all())


def _attention_and_lse(keepdim):
    def fn(q, k, v):
        s = q @ k.transpose(-2, -1) * 0.125
        return torch.softmax(s, -1) @ v, torch.logsumexp(s, -1, keepdim=keepdim)
    return fn


@pytest.mark.parametrize("keepdim", [False, True])
@pytest.mark.parametrize("sq,sk", [(1, 1), (7, 9), (257, 33)])
def test_attention_returning_its_scores_logsumexp_is_one_kernel(sq, sk, keepdim):
    """A function that returns attention and the row logsumexp of its scores (as kf's
    autograd saves it, or written by the user; [..., Sq] or [..., Sq, 1]) is one
    attention kernel on vulkan, which writes both (``attention_lse``); torch's values."""
    import kf
    from kf.runtime import vulkan

    if not vulkan.is_available():
        pytest.skip("no Vulkan device")
    fn = _attention_and_lse(keepdim)
    q, k, v = torch.randn(2, 3, sq, 64), torch.randn(2, 3, sk, 64), torch.randn(2, 3, sk, 64)
    f = kf.jit(fn, target="vulkan")
    (o, lse), (want_o, want_lse) = f(q, k, v), fn(q.double(), k.double(), v.double())
    torch.testing.assert_close(o.double(), want_o, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(lse.double(), want_lse, rtol=1e-5, atol=1e-5)
    calls = [line for line in kf.inspect(f, q, k, v).stages["fused"].splitlines() if "call @" in line]
    assert len(calls) == 1 and "_attention(" in calls[0], calls


def _logits_loss(h, w, t):
    """A chunk of a language model's loss as kf.nn's fused cross-entropy writes it: bf16
    logits widened, their row logsumexp, the target's logit by a one-hot, the gradient."""
    z = (h @ w.t()).float()
    onehot = torch.nn.functional.one_hot(t, z.shape[1]).float()
    lse = torch.logsumexp(z, dim=-1, keepdim=True)
    loss = (lse - (z * onehot).sum(dim=-1, keepdim=True)).sum()
    return loss, (torch.exp(z - lse) - onehot).to(h.dtype)


def test_epilogue_leaves_a_row_kernel_what_it_recomputes():
    """Logits that a row kernel reads: the GEMM writes them once in their own type; the
    widening cast, the one-hot (targets[:, None] == arange, cloned where it is read) and
    the product with it are computed in the row kernel, not written in f32 beside the
    logits (``_trim_epilogues``, ``_thin`` operands in ``_free_scalars``)."""
    import kf

    rows, vocab, width = 64, 1000, 32
    h, w = torch.randn(rows, width).bfloat16(), torch.randn(vocab, width).bfloat16()
    t = torch.randint(0, vocab, (rows,))
    fused_ir = kf.inspect(kf.jit(_logits_loss, target="cuda"), h, w, t).fused
    kernels = [line for line in fused_ir.splitlines() if "func.func private" in line]
    (gemm,) = [k for k in kernels if "_matmul" in k]
    assert "-> tensor<64x1000xbf16>" in gemm and "f32" not in gemm.split("->")[1].split("attributes")[0]
    assert not any("x1000xf32>" in k.split("->")[1] for k in kernels), kernels


@pytest.mark.parametrize("target", ["cpu", "vulkan"])
@pytest.mark.parametrize("rows,vocab", [(1, 17), (7, 257), (64, 1000)])
def test_logits_loss_with_its_epilogue_in_the_row_kernel(rows, vocab, target):
    """The same function's values against torch's at odd sizes (f32 inputs: the logits
    are f32 throughout, as in torch)."""
    import kf
    from kf.runtime import vulkan

    if target == "vulkan" and not vulkan.is_available():
        pytest.skip("no Vulkan device")
    torch.manual_seed(rows + vocab)
    h, w = torch.randn(rows, 32), torch.randn(vocab, 32)
    t = torch.randint(0, vocab, (rows,))
    loss, g = kf.jit(_logits_loss, target=target)(h, w, t)
    want_loss, want_g = _logits_loss(h, w, t)
    torch.testing.assert_close(loss, want_loss, rtol=1e-4, atol=1e-3)
    torch.testing.assert_close(g, want_g, rtol=1e-4, atol=1e-5)


def _rotate_half(x):
    half = x.shape[-1] // 2
    return torch.cat((-x[..., half:], x[..., :half]), dim=-1)


def _rope(q, cos, sin):
    """Rotary embedding as Hugging Face's Llama writes it."""
    return q * cos + _rotate_half(q) * sin


def _strided_slices(x, y):
    return x[:, 1::2] * y[:, :, 3:11] + 1


def _heads_first(x, b):
    """[B, S, H, D] -> [B, H, S, D], computed on both sides of the transpose."""
    return (x * 2).transpose(1, 2) + b


def _concat_computed(x, y):
    return torch.cat([x.exp(), y * 2], dim=0).sigmoid()


def _slice_of_a_result(x):
    a = x * 2
    return a[..., :4] + 1, a


_MOVES = {
    "rope": (_rope, lambda g, n: (torch.randn(2, 3, n, 10, generator=g), torch.randn(n, 10, generator=g),
                                  torch.randn(n, 10, generator=g))),
    "strided_slices": (_strided_slices, lambda g, n: (torch.randn(3, 2 * n, 8, generator=g),
                                                      torch.randn(3, n, 18, generator=g))),
    "heads_first": (_heads_first, lambda g, n: (torch.randn(2, n, 3, 8, generator=g),
                                                torch.randn(n, 8, generator=g))),
    "concat_computed": (_concat_computed, lambda g, n: (torch.randn(n, 6, generator=g),
                                                        torch.randn(3, 6, generator=g))),
    "slice_of_a_result": (_slice_of_a_result, lambda g, n: (torch.randn(n, 12, generator=g),)),
}


def test_moved_elements_are_read_by_one_elementwise_kernel():
    """Slices, concats and transposes that keep the last dim (``remaps`` in kf-fuse) join
    the elementwise kernel that reads them: rotary embedding's ``cat((-x2, x1))`` and
    products is one kernel, not a kernel per slice, negation, concat and product."""
    import kf

    expected = {"rope": 1, "strided_slices": 1, "heads_first": 1, "concat_computed": 1, "slice_of_a_result": 2}
    for name, (fn, make) in _MOVES.items():
        args = make(torch.Generator().manual_seed(0), 33)
        fused_ir = kf.inspect(kf.jit(fn, target="cuda"), *args).fused
        kernels = [line for line in fused_ir.splitlines() if "func.func private" in line]
        assert len(kernels) == expected[name], (name, kernels)
        assert all("_elementwise" in k for k in kernels), (name, kernels)


@pytest.mark.parametrize("target", ["cpu", "vulkan", "cuda"])
@pytest.mark.parametrize("name", list(_MOVES))
def test_moved_elements_against_torch(name, target):
    """Their values against torch's at odd lengths (1, 7, 33, 257; rotary's half row of 5
    straddles a vector of 4), size 0, non-contiguous inputs and bf16."""
    import kf
    from kf.runtime import vulkan

    if target == "vulkan" and not vulkan.is_available():
        pytest.skip("no Vulkan device")
    fn, make = _MOVES[name]
    run = target != "cuda" or torch.cuda.is_available()
    device = "cuda" if target == "cuda" and run else "cpu"
    gen = torch.Generator().manual_seed(1)
    cases = [make(gen, n) for n in (1, 7, 33, 257, 0)]
    cases.append(tuple(a.transpose(0, -1).contiguous().transpose(0, -1) for a in make(gen, 7)))  # strided
    dtypes = [torch.float32] + ([torch.bfloat16] if target == "cuda" else [])
    for dtype in dtypes:
        for args in cases:
            args = tuple(a.to(device=device, dtype=dtype) for a in args)
            f = kf.jit(fn, target=target)
            if not run:  # assembled for sm_90a here (a size-0 call launches nothing)
                assert any(a.numel() == 0 for a in args) or kf.inspect(f, *args).ptx.count(".entry") >= 1
                continue
            got, want = f(*args), fn(*args)
            for a, b in zip(got if isinstance(got, tuple) else (got,), want if isinstance(want, tuple) else (want,)):
                tol = {"rtol": 1.6e-2, "atol": 1e-2} if dtype == torch.bfloat16 else {"rtol": 1e-5, "atol": 1e-5}
                torch.testing.assert_close(a, b, **tol)


def _saves_views(x, w):
    """What AOTAutograd's forward returns: activations and views of them (a product
    viewed as [B, S, N], a value viewed back to rows for the next product)."""
    h = x.reshape(-1, x.shape[-1]) @ w
    y = h.reshape(x.shape[0], x.shape[1], -1)
    z = (y * 2).reshape(-1, w.shape[1])
    return h, z, (z @ w.t()).sigmoid()


def _two_views_returned(x):
    a = x * 3
    return a.reshape(-1), a.reshape(x.shape[1], x.shape[0]), a + 1


def test_returned_views_are_no_copy_kernels():
    """A reshape whose operand or result the function returns is a view of the output's
    buffer (``returned_view``), not a copy kernel; two returned views of one value are
    two tensors, so one of them is still a copy."""
    import kf

    x, w = torch.randn(2, 5, 8), torch.randn(8, 6)
    fused_ir = kf.inspect(kf.jit(_saves_views, target="cuda"), x, w).fused
    kernels = [line for line in fused_ir.splitlines() if "func.func private" in line]
    assert not any("generic" in k for k in kernels), kernels
    fused_ir = kf.inspect(kf.jit(_two_views_returned, target="cuda"), torch.randn(3, 4)).fused
    kernels = [line for line in fused_ir.splitlines() if "func.func private" in line]
    assert sum("generic" in k for k in kernels) == 1, kernels


@pytest.mark.parametrize("target", ["vulkan", "cuda"])
def test_returned_views_against_torch(target):
    import kf
    from kf.runtime import vulkan

    if target == "vulkan" and not vulkan.is_available():
        pytest.skip("no Vulkan device")
    if target == "cuda" and not torch.cuda.is_available():
        pytest.skip("no CUDA device")
    gen = torch.Generator().manual_seed(3)
    for b, s in ((1, 1), (2, 7), (3, 257)):
        x, w = torch.randn(b, s, 8, generator=gen), torch.randn(8, 6, generator=gen)
        args = [(x.to(target if target == "cuda" else "cpu"), w.to(target if target == "cuda" else "cpu"))]
        for fn, a in ((_saves_views, args[0]), (_two_views_returned, (args[0][0][0],))):
            got, want = kf.jit(fn, target=target)(*a), fn(*a)
            for g, e in zip(got, want):
                assert g.shape == e.shape
                torch.testing.assert_close(g, e, rtol=1e-4, atol=1e-4)
            if fn is _two_views_returned:  # two tensors, as torch's are two views
                got[0].zero_()
                assert got[1].abs().sum() > 0 or got[1].numel() == 0


def _shifted_rows(x, y):
    return torch.cat([x[:, 1:], y[:, :1]], dim=1)


def _picked_halves(x, y):
    return torch.where(x[:, :3] > 0, x[:, -3:], y[:, 2:5])


@pytest.mark.parametrize("target", ["vulkan", "cuda"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.int32, torch.int64, torch.bool], ids=str)
def test_moved_elements_of_other_element_types(dtype, target):
    """Moved reads in kernels of 16-bit floats, integers and booleans (stored as bytes)."""
    import kf
    from kf.runtime import vulkan

    if target == "vulkan" and not vulkan.is_available():
        pytest.skip("no Vulkan device")
    gen = torch.Generator().manual_seed(5)
    for fn in (_shifted_rows, _picked_halves):
        for n in (1, 7, 257):
            x, y = torch.randn(n, 8, generator=gen) * 5, torch.randn(n, 8, generator=gen) * 5
            x, y = (x > 0, y > 0) if dtype == torch.bool else (x.to(dtype), y.to(dtype))
            f = kf.jit(fn, target=target)
            if target == "cuda" and not torch.cuda.is_available():
                assert kf.inspect(f, x, y).ptx.count(".entry") >= 1
                continue
            if target == "cuda":
                x, y = x.cuda(), y.cuda()
            got, want = f(x, y), fn(x, y)
            assert got.dtype == want.dtype and torch.equal(got, want)
