"""Kernels with run-time sizes (passes/strategies/run_time_sizes.py): which dims are slots,
which strategies take run-time strides, the bounded copy a strategy plans on, and the
strides computed from a slot. End to end (against torch, on cpu and vulkan) in
test/python/compiler/test_dynamic.py."""

from __future__ import annotations

import pytest
from kf.dialects import make_context
from kf.passes.strategies import run_time_sizes as R
from mlir import ir
from mlir.dialects import arith, func

KERNEL = """
func.func private @k(%a: tensor<{a}xf32>, %b: tensor<16xf32>) -> tensor<{a}xf32> attributes {{kf.kernel = "elementwise"}} {{
  %0 = "kf.exp"(%a) : (tensor<{a}xf32>) -> tensor<{a}xf32>
  return %0 : tensor<{a}xf32>
}}
"""


def _kernel(ctx, a: str) -> tuple[ir.Module, ir.Operation]:
    module = ir.Module.parse(KERNEL.format(a=a), ctx)
    return module, next(op.operation for op in module.body.operations)


def test_slots_and_strides_by_strategy():
    with make_context() as ctx, ir.Location.unknown():
        _, k = _kernel(ctx, "1x?x16")
        assert R.slots_of(k) == [(0, 1), (2, 1)]
        R.check_strides(k, "elementwise")  # the first dim that is not 1: static strides
        _, k = _kernel(ctx, "3x?x16")
        assert R.slots_of(k) == [(0, 1), (2, 1)]
        R.check_strides(k, "attention")  # attention addresses run-time strides
        with pytest.raises(ValueError, match="strides would take run-time sizes"):
            R.check_strides(k, "rowwise")
        _, k = _kernel(ctx, "?x?x16")
        with pytest.raises(ValueError, match="more than one run-time size"):
            R.slots_of(k)
        _, k = _kernel(ctx, "3x5x16")
        assert R.slots_of(k) == [] and not R.has_run_time_sizes(k)


def test_bounded_copy_is_the_kernel_at_its_largest():
    with make_context() as ctx, ir.Location.unknown():
        module, k = _kernel(ctx, "1x?x16")
        with R.bounded(k) as (copy, slots):
            assert copy is not k and slots == [(0, 1), (2, 1)]
            text = str(copy)
            assert "tensor<1x4096x16xf32>" in text and "?" not in text
            assert R.is_bounded(copy) and not R.is_bounded(k)  # plans made on it hold for every size
        assert "tensor<1x?x16xf32>" in str(module) and len(list(module.body.operations)) == 1
        _, static = _kernel(ctx, "3x5x16")
        with R.bounded(static) as (same, slots):
            assert same is static and slots == [] and not R.is_bounded(same)


def test_ragged_dims_need_tail_guards():
    """A static dim needs them where tiles do not divide it (or it is shorter than one);
    a run-time size always."""
    assert not R.ragged(256, 128) and R.ragged(257, 128) and R.ragged(64, 128) and not R.ragged(128, 128)
    with make_context(), ir.Location.unknown():
        module = ir.Module.create()
        with ir.InsertionPoint(module.body):
            size = arith.constant(ir.IndexType.get(), 256)
        assert R.ragged(size, 128)


def test_strides_and_extent_from_a_slot():
    with make_context() as ctx, ir.Location.unknown():
        module = ir.Module.create()
        with ir.InsertionPoint(module.body):
            f = func.FuncOp("f", ir.FunctionType.get([R.slot_type(2)], []))
            entry = f.add_entry_block()
            with ir.InsertionPoint(entry):
                func.ReturnOp([])
        sizes = R.SizeSlots(entry, entry.arguments[0], [(0, 2), (3, 2)])
        st = sizes.strides([2, 3, R.BOUND, 32], 2, 1)
        assert st[2:] == [32, 1] and all(isinstance(x, ir.Value) for x in st[:2])
        assert isinstance(sizes.extent(R.BOUND * 5, 0), ir.Value)
        with pytest.raises(ValueError, match="does not hold a run-time dim"):
            sizes.extent(100)
        text = str(module)
        assert text.count("memref.load") == 2 and text.count("arith.minui") == 2
        assert module.operation.verify()
    assert R.grid_text(0, 5, 256) == "FloorDiv(k0*5 + 255, 256)"
