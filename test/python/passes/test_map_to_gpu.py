"""kf-tile + kf-map-to-gpu end to end, across strategies: the plans kf-tile records, DAGs
of several ops and results of several shapes, launch geometry from an edited plan, a
plan for another target, fp8 stores, f64, and the PTX of each strategy assembled by
ptxas (sm_90) without a GPU. Each strategy's own cases are in
test/python/passes/strategies/test_<strategy>.py; the harness is gpu_harness.py.

Shapes are not multiples of the block size (3×257, 1000, 7) so tails are exercised.
"""


from __future__ import annotations

import math
import re

import numpy as np
import pytest
import torch
from kf.dialects import TensorSpec
from kf.dialects import builders as kb
from kf.passes.map_to_gpu import MapToGpuPass
from kf.passes.tile import TilePass, attr_to_plan
from kf.passes.to_cuda import assemble, compile_to_ptx
from mlir import ir

from gpu_harness import (ELEM, FLOATS, FP8, TOL, build_module, check, check_fp8, gpu_func, in_f32,
                         needs_ptxas, rand, run_vulkan, saturating_fp8, skip_spirv)


# ----------------------------------------------------------------------------- plans and IR


def test_plans():
    ctx, m = build_module(lambda a, b: kb.add(a, b), [TensorSpec((1000,), "f32")] * 2, "elementwise")
    with ctx:
        decl = next(op.operation for op in m.body.operations if op.operation.name == "func.func")
        plan = attr_to_plan(decl.attributes["kf.plan"])
        assert plan == {"strategy": "elementwise", "target": "spirv", "block": 256, "vector_width": 4,
                        "numel": 1000, "grid": 1, "grid_stride": False,
                        "variant": {"items_per_thread": 2, "short_forms": True}}
        assert len(decl.regions[0].blocks) == 0  # a declaration now
        assert str(decl.attributes["kf.gpu_func"]) == "@kf_kernels::@k"
        f = gpu_func(m)
        assert list(ir.DenseI64ArrayAttr(f.attributes["kf.block"])) == [256, 1, 1]
        assert str(f.attributes["kf.fused_lines"]) == '["test.py:1"]'
    # A kernel of another kind that the elementwise strategy refuses falls back to generic.
    ctx, m = build_module(lambda a: kb.sum(a, dims=[1]), [TensorSpec((3, 257), "f32")], "elementwise")
    with ctx:
        assert ir.StringAttr(gpu_func(m).attributes["kf.strategy"]).value == "generic"


# ----------------------------------------------------------------------------- DAGs, geometry


@pytest.mark.parametrize("dtype", FLOATS)
def test_layer_norm_dag(run, dtype):
    x, w, b = rand(3, 257, dtype=dtype), rand(257, dtype=dtype), rand(257, dtype=dtype)

    def build(x_, w_, b_):
        mean = kb.mean(x_, dims=[-1], keepdim=True)
        var = kb.var(x_, dims=[-1], correction=0.0, keepdim=True)
        y = kb.div(kb.sub(x_, mean), kb.sqrt(kb.add(var, kb.scalar(1e-5, ELEM[dtype]))))
        return kb.add(kb.mul(y, w_), b_)

    (got,) = run(build, x, w, b)
    want = torch.nn.functional.layer_norm(x.float(), (257,), w.float(), b.float(), eps=1e-5).to(dtype)
    rtol, atol = TOL[dtype]
    torch.testing.assert_close(got.double(), want.double(), rtol=rtol * 4, atol=atol * 4)


def test_attention_dag_with_results_of_two_shapes(run):
    q, k, v = rand(2, 37, 16), rand(2, 37, 16), rand(2, 37, 16)
    mask = torch.rand(37, 37) > 0.8
    mask[:, 0] = False

    def build(q_, k_, v_, m_):
        s = kb.div(kb.matmul(q_, kb.transpose(k_, perm=[0, 2, 1])), kb.scalar(4.0, "f32"))
        p = kb.softmax(kb.masked_fill(s, m_, value=-math.inf), dim=-1)
        return kb.matmul(p, v_), kb.reduce_max(s, dims=[-1])

    out, smax = run(build, q, k, v, mask)
    s = q @ k.transpose(-1, -2) / 4.0
    torch.testing.assert_close(out, torch.softmax(s.masked_fill(mask, -math.inf), -1) @ v, rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(smax, s.amax(-1))


def test_grid_stride_from_an_edited_plan(run):
    """A recorded plan is what kf-map-to-gpu follows: 2 blocks striding over 1000 elements."""
    a = rand(1000)

    def edit(plan):
        plan.update(grid=2, grid_stride=True)

    for kind in ("generic", "elementwise"):
        (got,) = run(lambda x: kb.exp(kb.neg(x)), a, kind=kind, plan_edit=edit)
        check(got, torch.exp(-a))


def test_returned_input_and_value_returned_twice(run):
    a = rand(3, 257)
    got = run(lambda x: (kb.relu(x), x, kb.relu(x)), a)
    check(got[0], a.relu())
    check(got[1], a)
    check(got[2], a.relu())


def test_plan_for_another_target_is_remade(run):
    """A plan recorded for the other target (here: 16 f16 lanes, which neither takes) is
    not followed."""
    a = rand(4, 64, dtype=torch.float16)

    def edit(plan):
        plan.update(target="spirv" if plan["target"] == "cuda" else "cuda", vector_width=16)

    (got,) = run(lambda x: kb.tanh(x), a, kind="elementwise", plan_edit=edit)
    check(got, in_f32(torch.tanh, a))


def test_passes_leave_declarations_alone():
    """Running kf-tile and kf-map-to-gpu again finds no kernel function left to write."""
    ctx, m = build_module(lambda a: kb.exp(a), [TensorSpec((1000,), "f32")], "elementwise")
    with ctx:
        before = str(m)
        TilePass(target="spirv").run(m.operation)
        MapToGpuPass(target="spirv").run(m.operation)
        assert str(m) == before


@pytest.mark.parametrize("build,ref", [
    (lambda x, w: kb.var(kb.mul(x, w), dims=[1], correction=1.0), lambda x, w: (x * w).var(1)),
    (lambda x, w: kb.softmax(kb.add(x, w), dim=-1), lambda x, w: torch.softmax(x + w, -1)),
], ids=["var", "softmax"])
def test_f64(run, build, ref):
    if run is run_vulkan:
        pytest.skip("kf-to-spirv does not ask Vulkan for Float64")
    x, w = torch.randn(3, 257, dtype=torch.float64), torch.randn(257, dtype=torch.float64)
    (got,) = run(build, x, w)
    torch.testing.assert_close(got, ref(x, w), rtol=1e-12, atol=1e-12)


# ----------------------------------------------------------------------------- fp8 (CUDA only)


@pytest.mark.parametrize("chip", ["sm_80", "sm_90"])
@pytest.mark.parametrize("dtype", FP8, ids=str)
def test_fp8_store_is_one_cvt_from_sm_89(dtype, chip):
    """kf-to-cuda lowers a store's f32 -> f8E4M3FN to cvt.rn.satfinite.e4m3x2.f32 on
    sm_89+ (the integer encoder made fp8's quantization integer-bound); e5m2 (torch lets
    it overflow to inf, satfinite would not) and older chips keep the encoder. The
    elementwise kernel of a bf16 quantization takes 16-byte loads: its f32 scale, rank 0,
    does not narrow the vector."""
    from kf.passes.to_cuda import compile_to_ptx

    def quantize(x, s):
        return kb.cast(kb.min(kb.max(kb.mul(kb.cast(x, "f32"), s), kb.scalar(-448.0, "f32")),
                              kb.scalar(448.0, "f32")), ELEM[dtype])

    ctx, module = build_module(quantize, [TensorSpec((64, 256), "bf16"), TensorSpec((), "f32")], "elementwise",
                               target="cuda")
    with ctx:
        ptx = compile_to_ptx(module, chip=chip)["kf_kernels"]
    cvts = ptx.count("cvt.rn.satfinite.e4m3x2.f32")
    fast = dtype == torch.float8_e4m3fn and chip == "sm_90"
    # the encoder's subnormal alignment adds 2^14 (e4m3) or 2^7 (e5m2)
    encoder = {torch.float8_e4m3fn: "0f46800000", torch.float8_e5m2: "0f43000000"}[dtype] in ptx
    assert (cvts > 0) == fast and encoder != fast, (cvts, encoder)
    assert "ld.global.v4.b32" in ptx  # 8 bf16 lanes


@pytest.mark.parametrize("kind", ["generic", "elementwise"])
@pytest.mark.parametrize("dtype", FP8, ids=str)
def test_fp8_rounds_like_torch(run, dtype, kind):
    skip_spirv(run)
    fmax = torch.finfo(dtype).max
    tiny = torch.finfo(dtype).tiny
    specials = torch.tensor([0.0, -0.0, math.inf, -math.inf, math.nan, fmax, fmax * 1.03, fmax * 1.07, fmax * 2, 1e30,
                             tiny, tiny / 3, tiny / 8, tiny / 16, -tiny / 7, 1.0625, 1.1875, 3.0e-3, 1e-9])
    a = torch.cat([torch.randn(1000) * 4, torch.randn(500) * tiny * 4, specials, -specials])
    (got,) = run(lambda x: kb.cast(x, ELEM[dtype]), a, kind=kind)
    check_fp8(got, saturating_fp8(a, dtype))


@pytest.mark.parametrize("dtype", FP8, ids=str)
def test_fp8_rounding_inside_a_chain(run, dtype):
    """cast to fp8 and back, between f32 tensors: no fp8 buffer, so it runs on every back
    end, and the encoder and decoder meet torch's on every kind of value."""
    fmax, tiny = torch.finfo(dtype).max, torch.finfo(dtype).tiny
    specials = torch.tensor([0.0, -0.0, math.inf, -math.inf, math.nan, fmax, fmax * 1.03, fmax * 1.07, fmax * 2, 1e30,
                             tiny, tiny / 3, tiny / 8, tiny / 16, 1.0625, 1.1875, 3.0e-3, 1e-9])
    a = torch.cat([torch.randn(2000) * 4, torch.randn(1000) * tiny * 4, torch.linspace(fmax * 0.9, fmax * 1.2, 999),
                   specials, -specials])
    (got,) = run(lambda x: kb.cast(kb.cast(x, ELEM[dtype]), "f32"), a)
    torch.testing.assert_close(got, saturating_fp8(a, dtype).float(), rtol=0, atol=0, equal_nan=True)


@pytest.mark.parametrize("dtype", FP8, ids=str)
def test_fp8_every_value_widens_exactly(run, dtype):
    skip_spirv(run)
    a = torch.arange(256, dtype=torch.uint8).view(dtype).reshape(16, 16)
    got = run(lambda x: (kb.cast(x, "f32"), kb.cast(x, "f16")), a)
    torch.testing.assert_close(got[0], a.float(), rtol=0, atol=0, equal_nan=True)
    torch.testing.assert_close(got[1], a.half(), rtol=0, atol=0, equal_nan=True)


@pytest.mark.parametrize("kind", ["elementwise", "generic"])
@pytest.mark.parametrize("dtype", FP8, ids=str)
def test_fp8_chain_computes_in_f32(run, dtype, kind):
    skip_spirv(run)
    x, b = (torch.randn(7, 64) * 3).to(dtype), torch.randn(64).to(dtype)
    (got,) = run(lambda u, v: kb.mul(kb.add(u, v), kb.sigmoid(u)), x, b, kind=kind)
    check_fp8(got, ((x.float() + b.float()) * torch.sigmoid(x.float())).to(dtype))


# ----------------------------------------------------------------------------- CUDA (ptxas, no GPU)

PTX_CASES = {
    "elementwise_vec": (lambda x, b: kb.mul(kb.add(x, b), kb.sigmoid(x)), [((3, 256), "f32"), ((256,), "f32")],
                        "elementwise"),
    "elementwise_bf16": (lambda x, b: kb.gelu(kb.add(x, b)), [((3, 256), "bf16"), ((256,), "bf16")], "elementwise"),
    "elementwise_bool": (lambda x, y: kb.cmp(x, y, predicate="lt"), [((1000,), "f16"), ((1000,), "f16")],
                         "elementwise"),
    "softmax": (lambda x: kb.softmax(x, dim=-1), [((3, 257), "f16")], "generic"),
    "var_argmax": (lambda x: (kb.var(x, dims=[1]), kb.argmax(x, dim=0)), [((3, 257), "f32")], "generic"),
    "matmul": (kb.matmul, [((4, 1, 3, 7), "bf16"), ((5, 7, 6), "bf16")], "generic"),
    "topk": (lambda x: kb.topk(x, k=3, dim=-1), [((3, 257), "f32")], "generic"),
    "layout": (lambda x, y: kb.concat([kb.transpose(x, perm=[1, 0]), kb.reshape(kb.slice(y, dim=0, start=1, end=7,
               step=2), [7, 3])], dim=1), [((3, 7), "f32"), ((7, 7), "f32")], "generic"),
    "indexing": (lambda x, i, s: (kb.gather(x, i, dim=1), kb.scatter_add(x, i, s, dim=1),
                                  kb.index_select(x, kb.reshape(kb.slice(i, dim=1, start=0, end=1), [3]), dim=0)),
                 [((3, 20), "f32"), ((3, 11), "i64"), ((3, 11), "f32")], "generic"),
    "index_add": (lambda x, i, s: kb.index_add(x, i, s, dim=0), [((7, 33), "f16"), ((5,), "i64"), ((5, 33), "f16")],
                  "generic"),
    "mask_constant": (lambda x: kb.masked_fill(x, kb.constant(ir.DenseElementsAttr.get(
        np.array([True, False, True]))), value=0.0), [((4, 3), "f32")], "generic"),
    "grid_stride": (lambda x: kb.exp(x), [((8192, 4096), "f32")], "generic"),
    "fp8": (lambda x, y: kb.cast(kb.add(kb.cast(x, "f32"), y), "f8E5M2"), [((4, 64), "f8E4M3FN"), ((64,), "f32")],
            "elementwise"),
}


@needs_ptxas
@pytest.mark.parametrize("case", sorted(PTX_CASES))
def test_ptxas_sm90(case):
    build, specs, kind = PTX_CASES[case]
    ctx, module = build_module(build, [TensorSpec(s, e) for s, e in specs], kind, target="cuda")
    with ctx:
        ptx = compile_to_ptx(module)["kf_kernels"]
    assert ".entry k(" in ptx
    report = assemble(ptx, "sm_90")
    assert report.kernels["k"]["spill_store_bytes"] == 0
    if case == "elementwise_vec":
        assert re.search(r"ld\.global\.v4\.[bf]32", ptx) and re.search(r"st\.global\.v4\.[bf]32", ptx)
