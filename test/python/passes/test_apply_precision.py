"""kf-apply-precision on functions built with kf.dialects.builders: what each precision
may and may not change in the IR (function types never, only matmul operands under
bf16/fp16/fp8, every low-precision value under fp32), and the fp8 scaling's numbers
against torch doing the same steps, on the CPU target and in the interpreter.

test/passes/kf-apply-precision.mlir shows the rewritten IR; end-to-end accuracy per
precision on the CPU and Vulkan targets is in test/python/compiler/test_precision.py.
"""

from __future__ import annotations

import tempfile
from collections import Counter

import pytest
import torch
from mlir import ir
from mlir.dialects import func

from kf.cpu_codegen import compile_module
from kf.dialects import TensorSpec, make_context, mlir_type, spec_of, verify
from kf.dialects import builders as kb
from kf.interpreter import Interpreter
from kf.passes import registry
from kf.passes.apply_precision import INPUT_PRECISION, LOW_PRECISION, PRECISIONS, ApplyPrecisionPass
from kf.runtime.cpu import load

torch.manual_seed(0)

ELEM = {torch.float32: "f32", torch.float16: "f16", torch.bfloat16: "bf16", torch.float64: "f64",
        torch.int64: "i64", torch.float8_e4m3fn: "f8E4M3FN"}


def build(body, specs) -> tuple[ir.Context, ir.Module]:
    """A module with one function ``@f`` of arguments ``specs`` ((shape, elem) pairs)."""
    ctx = make_context()
    with ctx, ir.Location.unknown():
        module = ir.Module.create()
        with ir.InsertionPoint(module.body):
            @func.FuncOp.from_py_func(*[mlir_type(TensorSpec(tuple(s), e)) for s, e in specs], name="f")
            def f(*args):
                out = body(*args)
                return tuple(out) if isinstance(out, (tuple, list)) else out
    return ctx, module


def apply(ctx, module, precision: str, **options) -> None:
    with ctx, ir.Location.unknown():
        ApplyPrecisionPass(precision=precision, **options).run(module.operation)


def the_func(module) -> ir.Operation:
    return next(op.operation for op in module.body.operations if op.operation.name == "func.func")


def kf_ops(module) -> list[ir.Operation]:
    return [op.operation for op in the_func(module).regions[0].blocks[0].operations
            if op.operation.name.startswith("kf.")]


# ----------------------------------------------------------------------------- functions

def _mixed(x, w):
    """bf16 statistics beside an f32 matmul of the widened input."""
    y = kb.gelu(kb.matmul(kb.cast(x, "f32"), w))
    return y, kb.mean(x, dims=[-1], keepdim=True)


def _layout(x, w):
    """x @ x^T, and x @ w through a reshape and a broadcast of w."""
    xt = kb.transpose(x, perm=[0, 2, 1])
    wb = kb.broadcast_to(kb.reshape(w, [8, 3]), [2, 8, 3])
    return kb.matmul(x, xt), kb.matmul(x, wb)


def _int(a, b):
    return kb.matmul(a, b)


def _f64(a, b):
    return kb.matmul(a, b)


def _fp8_in(a, b):
    return kb.build("matmul", [a, b], None, [TensorSpec((4, 3), "f32")]).result


CASES = {
    "mixed": (_mixed, [((4, 8), "bf16"), ((8, 3), "f32")]),
    "layout": (_layout, [((2, 5, 8), "f32"), ((24,), "f32")]),
    "int": (_int, [((4, 8), "i64"), ((8, 3), "i64")]),
    "f64": (_f64, [((4, 8), "f64"), ((8, 3), "f64")]),
    "fp8_in": (_fp8_in, [((4, 8), "f8E4M3FN"), ((8, 3), "f8E4M3FN")]),
}


@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("case", list(CASES))
def test_function_types_never_change(case, precision):
    body, specs = CASES[case]
    ctx, module = build(body, specs)
    before = str(the_func(module).attributes["function_type"])
    apply(ctx, module, precision)
    assert str(the_func(module).attributes["function_type"]) == before
    with ctx:
        assert verify(module.operation) == []
    assert module.operation.verify()


def test_auto_changes_nothing():
    for body, specs in CASES.values():
        ctx, module = build(body, specs)
        before = str(module)
        apply(ctx, module, "auto")
        assert str(module) == before


@pytest.mark.parametrize("precision", ["fp32", "tf32"])
def test_fp32_computes_every_low_precision_value_in_f32(precision):
    ctx, module = build(*CASES["mixed"])
    apply(ctx, module, precision)
    ops = kf_ops(module)
    # low-precision values are left only as the arguments and the rounding at the return
    for op in ops:
        if op.name != "kf.cast":
            assert all(spec_of(r.type).elem == "f32" for r in op.results), op
    ret = [op.operation for op in the_func(module).regions[0].blocks[0].operations][-1]
    rounding = [v.owner.operation for v in ret.operands if spec_of(v.type).elem in LOW_PRECISION]
    assert [op.name for op in rounding] == ["kf.cast"]
    assert spec_of(rounding[0].operands[0].type).elem == "f32"


def test_tf32_marks_float_matmuls_only():
    for case, marked in (("mixed", 1), ("layout", 2), ("int", 0), ("f64", 0)):
        ctx, module = build(*CASES[case])
        apply(ctx, module, "tf32")
        mms = [op for op in kf_ops(module) if op.name == "kf.matmul"]
        got = [str(op.attributes[INPUT_PRECISION]) for op in mms if INPUT_PRECISION in op.attributes]
        assert got == ['"tf32"'] * marked, case
        ctx, module = build(*CASES[case])
        apply(ctx, module, "fp32")
        assert not any(INPUT_PRECISION in op.attributes for op in kf_ops(module))


def _signature_without_casts(module) -> Counter:
    """What every op other than a cast or a matmul computes: its name and result types."""
    return Counter((op.name, tuple(str(r.type) for r in op.results)) for op in kf_ops(module)
                   if op.name not in ("kf.cast", "kf.matmul", "kf.transpose", "kf.reshape", "kf.broadcast_to"))


@pytest.mark.parametrize("precision,elem", [("bf16", "bf16"), ("fp16", "f16")])
@pytest.mark.parametrize("case", ["mixed", "layout", "f64"])
def test_bf16_fp16_change_only_matmul_operands(case, precision, elem):
    ctx, module = build(*CASES[case])
    ctx0, module0 = build(*CASES[case])
    results = [str(op.result.type) for op in kf_ops(module0) if op.name == "kf.matmul"]
    apply(ctx, module, precision)
    assert _signature_without_casts(module) == _signature_without_casts(module0)
    mms = [op for op in kf_ops(module) if op.name == "kf.matmul"]
    assert [str(op.result.type) for op in mms] == results  # f32 (f64) results: wide accumulation
    for op in mms:
        assert [spec_of(v.type).elem for v in op.operands] == [elem, elem]


def test_bf16_converts_each_source_once():
    """x feeds two matmuls and a transpose: one cast of x, and w is cast before its
    reshape and broadcast (they then move bf16)."""
    ctx, module = build(*CASES["layout"])
    apply(ctx, module, "bf16")
    casts = [op for op in kf_ops(module) if op.name == "kf.cast"]
    assert sorted(str(op.operands[0].type) for op in casts) == ["tensor<24xf32>", "tensor<2x5x8xf32>"]
    for op in kf_ops(module):
        if op.name in ("kf.transpose", "kf.reshape", "kf.broadcast_to"):
            assert spec_of(op.result.type).elem == "bf16"


def test_fp8_quantizes_each_source_once():
    ctx, module = build(*CASES["layout"])
    apply(ctx, module, "fp8")
    names = Counter(op.name for op in kf_ops(module))
    assert names["kf.reduce_max"] == 2  # x (three uses) and w
    mms = [op for op in kf_ops(module) if op.name == "kf.matmul"]
    assert all(spec_of(v.type).elem == "f8E4M3FN" for op in mms for v in op.operands)
    assert all(spec_of(op.result.type).elem == "f32" for op in mms)


@pytest.mark.parametrize("precision", ["bf16", "fp16", "fp8"])
def test_narrow_precisions_leave_integer_and_fp8_matmuls(precision):
    for case in ("int", "fp8_in"):
        ctx, module = build(*CASES[case])
        before = str(module)
        apply(ctx, module, precision)
        assert str(module) == before


# ----------------------------------------------------------------------------- fp8 numbers


def _scale(x: torch.Tensor) -> torch.Tensor:
    """448 / amax, correctly rounded as kf's division is. (``448.0 / t`` in torch is
    ``t.reciprocal() * 448``, one f32 rounding more: the scale can be an ulp off, which
    moves elements near an E4M3FN rounding boundary to the next code.)"""
    amax = x.abs().amax().clamp_min(1e-12)
    return torch.div(torch.full_like(amax, 448.0), amax)


def emulate_fp8(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """torch doing the policy's steps: per-tensor scale to 448, E4M3FN, f32 product, unscale."""
    def q(x):
        s = _scale(x)
        return (x * s).clamp(-448, 448).to(torch.float8_e4m3fn).float(), s
    (qa, sa), (qb, sb) = q(a.float()), q(b.float())
    return (qa @ qb) * (1.0 / (sa * sb))


def _fp8_module(a, b, storage: bool):
    ctx, module = build(kb.matmul, [(tuple(a.shape), ELEM[a.dtype]), (tuple(b.shape), ELEM[b.dtype])])
    apply(ctx, module, "fp8", fp8_storage=storage)
    return ctx, module


def _run_cpu(ctx, module, *inputs):
    with ctx, ir.Location.unknown():
        directory = tempfile.mkdtemp(prefix="kf-test-precision-")
        artifact = compile_module(module, "f", directory)
    return load(artifact.abi, directory)(*inputs)[0]


def _rel(x, y):
    return ((x.double() - y.double()).norm() / y.double().norm()).item()


@pytest.mark.parametrize("scale", [1.0, 1e3, 1e-3])
def test_fp8_matmul_is_the_scaled_e4m3_product(scale):
    """The f32 -> E4M3FN steps and the unscaling, as torch computes them, whatever the
    inputs' magnitude (per-tensor scaling takes it out)."""
    a, b = torch.randn(77, 131) * scale, torch.randn(131, 45)
    want = emulate_fp8(a, b)
    ctx, module = _fp8_module(a, b, storage=False)
    got = _run_cpu(ctx, module, a, b)
    assert got.dtype == torch.float32
    assert _rel(got, want) < 1e-6
    # the quantization is what makes the result differ from the f32 product
    assert 5e-3 < _rel(got, a.double() @ b.double()) < 8e-2
    # fp8 tensors (the CUDA form) and E4M3FN values in f32 give the same numbers
    interp = [Interpreter(_fp8_module(a, b, storage)[1], "f").run(a, b)[0] for storage in (True, False)]
    assert _rel(interp[0], want) < 1e-6 and _rel(interp[1], want) < 1e-6


def test_fp8_bf16_operands_keep_their_result_type():
    a, b = torch.randn(33, 70).bfloat16(), torch.randn(70, 20).bfloat16()
    ctx, module = build(kb.matmul, [((33, 70), "bf16"), ((70, 20), "bf16")])
    apply(ctx, module, "fp8", fp8_storage=False)
    got = _run_cpu(ctx, module, a, b)
    assert got.dtype == torch.bfloat16
    assert _rel(got, emulate_fp8(a, b).bfloat16()) < 2e-3


def test_fp8_zero_operand_stays_finite():
    a, b = torch.zeros(9, 16), torch.randn(16, 5)
    ctx, module = _fp8_module(a, b, storage=False)
    got = _run_cpu(ctx, module, a, b)
    assert torch.equal(got, torch.zeros(9, 5))


def test_registered():
    assert registry.is_kf_pass("kf-apply-precision")
    p = registry.create("kf-apply-precision", {"precision": "fp8", "fp8-storage": "false"})
    assert (p.precision, p.fp8_storage) == ("fp8", False)
    assert p.textual() == "kf-apply-precision{precision=fp8 fp8-storage=false}"


# ----------------------------------------------------------------------------- fp8 attention

#: q [2, 5, 8], k [2, 7, 8], v [2, 7, 6]: Sq, Sk, D and Dv all different
ATTENTION_SPECS = [((2, 5, 8), "f32"), ((2, 7, 8), "f32"), ((2, 7, 6), "f32")]


def _attention(q, k, v):
    s = kb.div(kb.matmul(q, kb.transpose(k, perm=[0, 2, 1])), kb.scalar(8 ** 0.5, "f32"))
    return kb.matmul(kb.softmax(s, dim=-1), v)


def _defining(v):
    return None if isinstance(v.owner, ir.Block) else v.owner.operation


@pytest.mark.parametrize("storage", [True, False], ids=["fp8-storage", "f32-storage"])
def test_fp8_probabilities_take_the_fixed_scale(storage):
    """P = softmax(...) is quantized as cast(P * 256 -> E4M3FN), no amax over it (only q,
    k and v have one); the product is rescaled by 1 / (256 s_v). With fp8 storage V is
    quantized from its transpose ([2, 6, 7]: K-major) and P @ V reads it through a
    transpose; without it V is quantized as it lies."""
    ctx, module = build(_attention, ATTENTION_SPECS)
    apply(ctx, module, "fp8", fp8_storage=storage)
    with ctx:
        assert verify(module.operation) == []
    ops = kf_ops(module)
    assert Counter(op.name for op in ops)["kf.reduce_max"] == 3
    [sm] = [op for op in ops if op.name == "kf.softmax"]
    [use] = [u.owner for u in sm.result.uses]
    assert use.name == "kf.mul"
    scale = _defining(use.operands[1])
    assert scale.name == "kf.fill" and float(ir.FloatAttr(scale.attributes["value"]).value) == 256.0
    [p8] = [u.owner for u in use.result.uses]
    assert p8.name == "kf.cast" and spec_of(p8.result.type).elem == "f8E4M3FN"
    mm2 = [op for op in ops if op.name == "kf.matmul"][-1]
    a, b = mm2.operands
    assert spec_of(a.type).elem == ("f8E4M3FN" if storage else "f32")
    assert spec_of(b.type) == TensorSpec((2, 7, 6), "f8E4M3FN" if storage else "f32")
    vt = _defining(b)
    if storage:
        assert vt.name == "kf.transpose" and list(ir.DenseI64ArrayAttr(vt.attributes["perm"])) == [0, 2, 1]
        assert spec_of(vt.operands[0].type) == TensorSpec((2, 6, 7), "f8E4M3FN")
        assert _defining(vt.operands[0]).name == "kf.cast"  # written by the quantization
        # ... of transpose(v): the amax and the scaling read V^T
        t = [op for op in ops if op.name == "kf.transpose" and op.operands[0] == the_func(module).regions[0].blocks[0].arguments[2]]
        assert len(t) == 1 and spec_of(t[0].result.type).shape == (2, 6, 7)
    else:
        assert vt.name == "kf.cast" and not any(op.name == "kf.transpose" and op.operands[0] ==
                                                the_func(module).regions[0].blocks[0].arguments[2] for op in ops)
    [rescale] = [u.owner for u in mm2.result.uses]
    inv = _defining(rescale.operands[1])  # 1 / (256 * s_v)
    assert inv.name == "kf.div" and _defining(inv.operands[1]).name == "kf.mul"
    assert _defining(_defining(inv.operands[1]).operands[0]).name == "kf.fill"


def emulate_fp8_attention(q, k, v):
    """torch doing the policy's steps for attention: q, k, v per-tensor scaled to 448,
    P with the fixed scale 256."""
    def quant(x):
        s = _scale(x)
        return (x * s).clamp(-448, 448).to(torch.float8_e4m3fn).float(), s
    (q8, sq), (k8, sk), (v8, sv) = quant(q), quant(k), quant(v)
    s = (q8 @ k8.transpose(-1, -2)) * (1.0 / (sq * sk)) / torch.tensor(8 ** 0.5, dtype=torch.float32)
    p8 = (torch.softmax(s, -1) * 256.0).to(torch.float8_e4m3fn).float()
    return (p8 @ v8) * (1.0 / (256.0 * sv))


def test_fp8_attention_numbers():
    """The CPU target (E4M3FN values in f32) and the interpreter (fp8 tensors, V^T
    stored, and f32 ones) compute the emulated steps."""
    g = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn(s, generator=g) for s, _ in ATTENTION_SPECS)
    want = emulate_fp8_attention(q, k, v)
    ctx, module = build(_attention, ATTENTION_SPECS)
    apply(ctx, module, "fp8", fp8_storage=False)
    assert _rel(_run_cpu(ctx, module, q, k, v), want) < 1e-5
    for storage in (True, False):
        ctx, module = build(_attention, ATTENTION_SPECS)
        apply(ctx, module, "fp8", fp8_storage=storage)
        assert _rel(Interpreter(module, "f").run(q, k, v)[0], want) < 1e-5
    ref = torch.softmax(q.double() @ k.double().transpose(-1, -2) / 8 ** 0.5, -1) @ v.double()
    assert 5e-3 < _rel(want, ref) < 8e-2


# ---- the caller's fp8 tensors (_e4m3_source): the fp8 attention kernel takes them as they are

from fp8_caller import caller_attention, caller_attention_vt  # noqa: E402  (examples/)
from fp8_inputs import caller_inputs  # noqa: E402  (this directory's conftest)
from kf.passes.to_cuda import ptxas_path  # noqa: E402

needs_ptxas = pytest.mark.skipif(ptxas_path() is None, reason="ptxas not installed")
needs_hopper = pytest.mark.skipif(not torch.cuda.is_available() or torch.cuda.get_device_capability() != (9, 0),
                                  reason="fp8 wgmma needs an sm_90 device")


def test_caller_fp8_attention_cpu():
    """Under precision="fp8" the caller's E4M3FN tensors are the products' operands as
    they are (no amax, no second rounding): the error is the probabilities' rounding to
    E4M3FN alone (2-3%); under "auto" the f32 attention of the same values."""
    import kf

    args, ref = caller_inputs(2, 3, 200, 64)
    auto = kf.jit(caller_attention, target="cpu")(*args)
    fp8 = kf.jit(caller_attention, target="cpu", precision="fp8")(*args)
    assert _rel(auto, ref) < 4e-3  # the bf16 result's rounding
    assert 4e-3 < _rel(fp8, ref) < 4e-2


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
    assert _rel(out.cpu(), ref.cpu()) < 4e-2


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
    assert 4e-3 < _rel(cpu, ref) < 4e-2


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
