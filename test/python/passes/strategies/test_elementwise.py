"""The elementwise strategy (passes/strategies/elementwise.py) through kf-tile and
kf-map-to-gpu, run on every back end present against torch (gpu_harness.py): chains of
ops, several results, masks, and several items per thread."""


from __future__ import annotations


import pytest
import torch
from kf.dialects import TensorSpec
from kf.dialects import builders as kb
from kf.passes.tile import attr_to_plan
from mlir import ir

from gpu_harness import FLOATS, TOL, build_module, check, gpu_func, in_f32, rand


# ----------------------------------------------------------------------------- elementwise strategy

CHAINS = {
    "silu_bias": (lambda x, b: kb.mul(kb.add(x, b), kb.sigmoid(kb.add(x, b))),
                  lambda x, b: torch.nn.functional.silu(x + b), [(3, 256), (256,)]),
    "gelu_scale": (lambda x, s: kb.mul(kb.gelu(x), s), lambda x, s: torch.nn.functional.gelu(x) * s,
                   [(7, 64), (7, 1)]),
    "tail": (lambda x, y: kb.sub(kb.exp(x), kb.tanh(y)), lambda x, y: torch.exp(x) - torch.tanh(y),
             [(1000,), (1000,)]),
    "scalar": (lambda x, y: kb.relu(kb.mul(x, y)), lambda x, y: torch.relu(x * y), [(5, 3, 8), ()]),
}


@pytest.mark.parametrize("dtype", FLOATS)
@pytest.mark.parametrize("chain", sorted(CHAINS))
def test_elementwise_chain(run, chain, dtype):
    build, ref, shapes = CHAINS[chain]
    xs = [rand(*s, dtype=dtype) for s in shapes]
    (got,) = run(build, *xs, kind="elementwise")
    want = in_f32(ref, *xs)
    rtol, atol = TOL[dtype]
    torch.testing.assert_close(got.double(), want.double(), rtol=rtol * 2, atol=atol * 2)


def test_elementwise_several_results_and_masks(run):
    x, y = rand(3, 257), rand(3, 257)
    m = torch.rand(3, 257) > 0.5
    got = run(lambda a, b, c: (kb.select(c, a, b), kb.cmp(a, b, predicate="gt"), kb.add(a, b)), x, y, m,
                     kind="elementwise")
    check(got[0], torch.where(m, x, y))
    check(got[1], x > y)
    check(got[2], x + y)


def _plan_of(m):
    decl = next(op.operation for op in m.body.operations if op.operation.name == "func.func")
    return attr_to_plan(decl.attributes["kf.plan"])


def test_elementwise_items_per_thread_plans():
    """On CUDA a thread takes two vectors (items_per_thread) where there are two blocks'
    worth; elsewhere, without vectors or with little work, one."""
    specs = [TensorSpec((64, 8192), "bf16"), TensorSpec((8192,), "bf16")]
    ctx, m = build_module(lambda a, b: kb.gelu(kb.add(a, b)), specs, "elementwise", target="cuda")
    with ctx:
        plan = _plan_of(m)
        assert plan["vector_width"] == 8 and plan["items_per_thread"] == 2 and plan["grid"] == 64 * 8192 // 8 // 2 // 256
        assert ir.StringAttr(gpu_func(m).attributes["kf.strategy"]).value == "elementwise"
    for target, shape, elem in (("spirv", (64, 8192), "f32"), ("cuda", (1000,), "f32"), ("cuda", (3, 1001), "f32")):
        ctx, m = build_module(lambda a: kb.exp(a), [TensorSpec(shape, elem)], "elementwise", target=target)
        with ctx:
            assert "items_per_thread" not in _plan_of(m), (target, shape)


@pytest.mark.parametrize("per,shape", [(2, (5, 1000)), (3, (5, 1000)), (2, (4, 1024)), (4, (3, 2048))],
                         ids=["tail", "tail-after-two", "exact", "exact4"])
def test_elementwise_items_per_thread(run, per, shape):
    """Several vectors a thread, from an edited plan (CUDA makes two itself): every element
    written once (the outputs start as NaN), passes past the end guarded, the stores of
    the unguarded passes after all of them, a broadcast operand and two outputs."""
    x, b = rand(*shape), rand(shape[-1])

    def edit(plan):
        items = plan["numel"] // plan["vector_width"]
        plan.update(items_per_thread=per, grid=-(-items // (per * plan["block"])), grid_stride=False)

    got = run(lambda a, c: (kb.gelu(kb.add(a, c)), kb.mul(a, c)), x, b, kind="elementwise", plan_edit=edit)
    check(got[0], torch.nn.functional.gelu(x + b))
    check(got[1], x * b)
    xh, bh = x.to(torch.float16), b.to(torch.float16)
    (got,) = run(lambda a, c: kb.sigmoid(kb.add(a, c)), xh, bh, kind="elementwise", plan_edit=edit)
    check(got, in_f32(lambda u, v: torch.sigmoid(u + v), xh, bh))


def test_elementwise_variants_are_plan_fields():
    """``elementwise.items_per_thread`` and ``elementwise.short_forms`` are kf-tile options:
    the plan records them (so the IR and the cache key say which kernel it is), and the
    accurate forms replace the short sigmoid's ex2.approx/rcp.approx in the PTX."""
    import kf

    def bias_sigmoid(x, b):
        return torch.sigmoid(x + b)

    x, b = torch.randn(64, 8192, dtype=torch.bfloat16), torch.randn(8192, dtype=torch.bfloat16)
    ptx = {}
    for name, variants in (("default", ""), ("one", "elementwise.items_per_thread=1"),
                           ("accurate", "elementwise.items_per_thread=1 elementwise.short_forms=false")):
        f = kf.jit(bias_sigmoid, target="cuda", variants=variants)
        k = kf.explain(f, x, b, file=None).kernels[0]
        assert k.plan["strategy"] == "elementwise"
        assert k.plan.get("items_per_thread", 1) == (2 if name == "default" else 1), (name, k.plan)
        assert k.plan["variant"]["short_forms"] == (name != "accurate")
        ptx[name] = f.inspect(x, b).ptx
    assert "ex2.approx" in ptx["one"] and "rcp.approx" in ptx["one"]
    assert ptx["accurate"] != ptx["one"] and "rcp.approx" not in ptx["accurate"]
    with pytest.raises(Exception, match="items_per_thread"):
        kf.explain(kf.jit(bias_sigmoid, target="cuda", variants="elementwise.items_per_thread=0"), x, b, file=None)
