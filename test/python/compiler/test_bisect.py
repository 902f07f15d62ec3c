"""kf.bisect names the first pass whose result differs from torch eager. Wrong rewrites
are planted at each level bisection runs differently: in kf-canonicalize (kf IR, run by
the interpreter), in kf-lower-to-linalg (tensor-level IR, compiled for the CPU) and in
a test pass inserted into the pipeline."""

import os
import sys
import types

import pytest
import torch
from mlir import ir

import kf
import seed_examples as se
from kf.bisection import CPU_PASSES, compare
from kf.passes import base as pass_base
from kf.passes import canonicalize, lower_to_linalg, registry


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("KF_CACHE_DIR", str(tmp_path))


def diff_tanh(x, y):
    z = x - y
    return torch.tanh(z) * 2


def _swap_sub_for_add(module: ir.Operation) -> bool:
    """The planted bug: every kf.sub becomes a kf.add."""
    swapped = False
    for f in module.regions[0].blocks[0].operations:
        for op in list(f.operation.regions[0].blocks[0].operations):
            op = op.operation
            if op.name == "kf.sub":
                with ir.InsertionPoint(op), op.location:
                    new = ir.Operation.create("kf.add", results=[op.results[0].type], operands=list(op.operands))
                op.results[0].replace_all_uses_with(new.results[0])
                op.erase()
                swapped = True
    return swapped


def test_a_correct_pipeline_passes_every_step():
    r = kf.bisect(diff_tanh, torch.randn(8, 5), torch.randn(8, 5), file=None)
    assert r.first_bad is None and r.reproducer is None
    assert [s.name for s in r.steps] == ["capture"] + CPU_PASSES
    assert [s.how for s in r.steps] == ["interpreted", "interpreted", "interpreted", "compiled for cpu",
                                        "linked for cpu"]
    assert all(s.ok for s in r.steps)


def writes_a_row(x, y):
    y[0] = 5.0
    return x + y


def test_a_function_that_writes_its_argument_bisects_clean():
    x, y = torch.randn(7), torch.randn(7)
    before = y.clone()
    result = kf.bisect(writes_a_row, x, y, file=None)
    assert result.first_bad is None and all(s.ok for s in result.steps)
    assert torch.equal(y, before)  # eager ran on a copy


def test_seed_functions_bisect_clean():
    x, w, b = torch.randn(3, 100), torch.randn(100), torch.randn(100)
    assert kf.bisect(se.metal_layer_norm, x, w, b, file=None).first_bad is None
    q = torch.randn(1, 2, 16, 8)
    assert kf.bisect(se.fused_attention, q, q, q, file=None).first_bad is None


def test_wrong_rewrite_in_kf_canonicalize_is_named(monkeypatch):
    run = canonicalize.CanonicalizePass.run

    def wrong(self, module):
        run(self, module)
        _swap_sub_for_add(module)

    monkeypatch.setattr(canonicalize.CanonicalizePass, "run", wrong)
    x, y = torch.randn(8, 5), torch.randn(8, 5)
    r = kf.bisect(diff_tanh, x, y, file=None)
    assert r.first_bad == "kf-canonicalize"
    assert [s.ok for s in r.steps] == [True, True, False]  # stops at the first bad pass
    before = open(os.path.join(r.reproducer, "before.mlir")).read()
    after = open(os.path.join(r.reproducer, "after.mlir")).read()
    assert "kf.sub" in before and "kf.sub" not in after and "kf.add" in after
    inputs = torch.load(os.path.join(r.reproducer, "inputs.pt"))
    torch.testing.assert_close(inputs, [x, y])
    assert r.command == f"kf-opt {r.reproducer}/before.mlir --pass-pipeline='builtin.module(kf-canonicalize)'"
    assert "first pass whose result differs: kf-canonicalize" in str(r)


def test_wrong_lowering_is_found_in_compiled_tensor_ir(monkeypatch):
    lower_op = lower_to_linalg.lower_op

    def wrong(op, **kwargs):
        if op.name == "kf.sub":
            with ir.InsertionPoint(op), op.location:
                new = ir.Operation.create("kf.add", results=[op.results[0].type], operands=list(op.operands))
            op.results[0].replace_all_uses_with(new.results[0])
            op.erase()
            op = new
        return lower_op(op, **kwargs)

    monkeypatch.setattr(lower_to_linalg, "lower_op", wrong)
    r = kf.bisect(diff_tanh, torch.randn(8, 5), torch.randn(8, 5), file=None)
    assert r.first_bad == "kf-lower-to-linalg"
    assert r.steps[-1].how == "compiled for cpu" and r.steps[-1].max_abs_error > 0.1


class SwapPass(pass_base.KfPass):
    NAME = "test-swap-sub"
    DESCRIPTION = "test only: turns kf.sub into kf.add"

    def run(self, module):
        _swap_sub_for_add(module)


@pytest.fixture
def swap_pass(monkeypatch):
    """Register test-swap-sub as if it were one of kf's passes."""
    mod = types.ModuleType("kf.passes.test_swap")
    mod.SwapPass = SwapPass
    monkeypatch.setitem(sys.modules, "kf.passes.test_swap", mod)
    monkeypatch.setitem(registry.REGISTRY, "test-swap-sub",
                        registry.PassEntry("test-swap-sub", "test_swap", "SwapPass", SwapPass.DESCRIPTION))


def test_a_planted_test_pass_in_a_custom_pipeline_is_named(swap_pass):
    passes = ["kf-canonicalize", "kf-lower-to-linalg", "cse", "test-swap-sub", "kf-to-cpu"]
    # test-swap-sub after lowering finds no kf.sub: harmless there.
    assert kf.bisect(diff_tanh, torch.randn(4, 4), torch.randn(4, 4), passes=passes, file=None).first_bad is None
    passes = ["kf-canonicalize", "test-swap-sub", "kf-lower-to-linalg", "kf-to-cpu"]
    r = kf.bisect(diff_tanh, torch.randn(4, 4), torch.randn(4, 4), passes=passes, file=None)
    assert r.first_bad == "test-swap-sub" and [s.name for s in r.steps][-1] == "test-swap-sub"


def test_kf_level_gpu_passes_are_interpreted_and_gpu_ir_is_skipped():
    passes = ["kf-canonicalize", "kf-fuse", "kf-tile{target=spirv}", "kf-map-to-gpu{target=spirv}"]
    x, w, b = torch.randn(3, 100), torch.randn(100), torch.randn(100)
    r = kf.bisect(se.metal_layer_norm, x, w, b, passes=passes, file=None)
    assert [s.how for s in r.steps] == ["interpreted"] * 4 + ["skipped"]
    assert r.first_bad is None and r.steps[-1].ok is None


def test_a_failing_pass_is_the_answer_with_its_reproducer(monkeypatch):
    def fail(self, module):
        raise pass_base.PassError("planted")

    monkeypatch.setattr(lower_to_linalg.LowerToLinalgPass, "run", fail)
    r = kf.bisect(diff_tanh, torch.randn(4), torch.randn(4), file=None)
    assert r.first_bad == "kf-lower-to-linalg" and r.steps[-1].how == "pass failed"
    assert os.path.exists(r.reproducer) and "kf-lower-to-linalg" in r.command


def test_compare_tolerances_and_nans():
    a = torch.tensor([1.0, float("nan"), 3.0])
    assert compare([a], [a.clone()], 1e-3, 1e-4) == (True, 0.0)
    ok, err = compare([a + 1e-2], [a], 1e-3, 1e-4)
    assert not ok and err == pytest.approx(1e-2, rel=1e-3)
    assert not compare([torch.tensor([1, 2])], [torch.tensor([1, 3])], 0, 0)[0]
    assert not compare([torch.zeros(2)], [torch.zeros(3)], 1, 1)[0]


def test_a_function_that_draws_random_numbers_is_refused():
    # eager draws other numbers than kf: no snapshot could be compared with it
    def drop(x):
        return torch.nn.functional.dropout(x, 0.5, training=True)

    with pytest.raises(kf.CompileError, match="draws random numbers"):
        kf.bisect(drop, torch.randn(8), file=None)
    assert kf.bisect(lambda x: torch.nn.functional.dropout(x, 0.5, training=False) * 2, torch.randn(8),
                     file=None).first_bad is None
