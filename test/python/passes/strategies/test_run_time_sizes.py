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


MASK_KERNEL = """
func.func private @k(%m: tensor<{a}xf32>) -> tensor<{r}x1xf32> attributes {{kf.kernel = "rowwise"}} {{
  %0 = "kf.reduce_max"(%m) {{dims = array<i64: 3>, keepdim = true}} : (tensor<{a}xf32>) -> tensor<{r}x1xf32>
  return %0 : tensor<{r}x1xf32>
}}
"""


def _mask_kernel(ctx, a: str) -> tuple[ir.Module, ir.Operation]:
    """A row maximum of a [.., queries, keys] input (SDPA's rows a mask keeps)."""
    module = ir.Module.parse(MASK_KERNEL.format(a=a, r=a.rsplit("x", 1)[0]), ctx)
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
        assert R.slots_of(k) == [(0, 0), (0, 1), (2, 0), (2, 1)]
        for kind in ("elementwise", "attention", "generic"):  # a result with two: no strategy's
            with pytest.raises(ValueError, match="more than one run-time size"):
                R.check_several(k, kind)
        _, k = _mask_kernel(ctx, "2x1x?x?")
        R.check_several(k, "attention")  # an input with two: attention's mask, generic's
        R.check_several(k, "generic")
        with pytest.raises(ValueError, match="more than one run-time size"):
            R.check_several(k, "rowwise")
        _, k = _mask_kernel(ctx, "64x64x?x?")  # past SEVERAL_SIZE_ELEMENTS at the bound
        with pytest.raises(ValueError, match="elements at the bound"):
            R.check_several(k, "attention")
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
        # a mask [2, 1, queries, keys]: each run-time dim its own slot's size
        st = sizes.strides_at([2, 1, R.BOUND, R.BOUND], {2: 0, 3: 1})
        assert st[3] == 1 and all(isinstance(x, ir.Value) for x in st[:3])
        assert R.dims_of([(0, 2), (3, 2), (3, 3)], 3) == {2: 1, 3: 2}
        assert isinstance(sizes.extent(R.BOUND * 5, 0), ir.Value)
        with pytest.raises(ValueError, match="does not hold a run-time dim"):
            sizes.extent(100)
        text = str(module)
        assert text.count("memref.load") == 2 and text.count("arith.minui") == 2
        assert module.operation.verify()
    assert R.grid_text(0, 5, 256) == "FloorDiv(k0*5 + 255, 256)"


CHAIN = """
func.func private @k(%x: tensor<1x?x4x8xf32>, %b: tensor<8xf32>) -> (tensor<1x4x?x8xf32>, tensor<?x32xf32>, tensor<1x4x?x16xf32>) attributes {kf.kernel = "generic"} {
  %0 = "kf.add"(%x, %b) : (tensor<1x?x4x8xf32>, tensor<8xf32>) -> tensor<1x?x4x8xf32>
  %1 = "kf.transpose"(%0) {perm = array<i64: 0, 2, 1, 3>} : (tensor<1x?x4x8xf32>) -> tensor<1x4x?x8xf32>
  %2 = "kf.reshape"(%0) : (tensor<1x?x4x8xf32>) -> tensor<?x32xf32>
  %3 = "kf.concat"(%1, %1) {dim = 3 : i64} : (tensor<1x4x?x8xf32>, tensor<1x4x?x8xf32>) -> tensor<1x4x?x16xf32>
  return %1, %2, %3 : tensor<1x4x?x8xf32>, tensor<?x32xf32>, tensor<1x4x?x16xf32>
}
"""


def test_size_texts_name_each_result_over_the_inputs():
    """SizeTexts follows lined-up ops, transposes, reshapes and concats along other dims
    from the inputs' slots to every result."""
    with make_context() as ctx, ir.Location.unknown():
        module = ir.Module.parse(CHAIN, ctx)
        k = next(op.operation for op in module.body.operations)
        assert R.SizeTexts(k).result_texts() == ["a0d1", "a0d1", "a0d1"]


def test_run_time_shapes_of_a_bounded_kernel():
    """RunTimeShapes gives every tensor of the bounded copy its run-time extent: the
    transposed result's is the input's slot, the reshaped one's too (its static dims
    are those of the input's rows)."""
    with make_context() as ctx, ir.Location.unknown():
        module = ir.Module.parse(CHAIN, ctx)
        k = next(op.operation for op in module.body.operations)
        with R.bounded(k) as (copy, slots):
            assert R.RUN_TIME_DIMS in copy.attributes
            holder = ir.Module.create()
            with ir.InsertionPoint(holder.body):
                f = func.FuncOp("f", ir.FunctionType.get([R.slot_type(len(slots))], []))
                entry = f.add_entry_block()
                with ir.InsertionPoint(entry):
                    func.ReturnOp([])
            shapes = R.RunTimeShapes(copy, R.SizeSlots(entry, entry.arguments[0], slots))
            ops = [op.operation for op in copy.regions[0].blocks[0].operations]
            transposed = shapes.shape(ops[1].results[0])
            assert transposed[:2] == [1, 4] and transposed[3] == 8 and isinstance(transposed[2], ir.Value)
            assert isinstance(shapes.shape(ops[2].results[0])[0], ir.Value)
            assert shapes.shape(copy.regions[0].blocks[0].arguments[1]) == [8]
