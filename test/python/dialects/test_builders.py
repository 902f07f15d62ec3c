"""The kf dialect from Python: one-call loading, builders with inferred types, and
verifier errors as exceptions."""

import pytest
from mlir import ir
from mlir.dialects import func

from kf import dialects as kd
from kf.dialects import builders as kb
from kf.dialects.types import TensorSpec, broadcast_shapes


def _function(arg_specs):
    ctx = kd.make_context()
    ctx.__enter__()
    loc = ir.Location.unknown()
    loc.__enter__()
    module = ir.Module.create()
    with ir.InsertionPoint(module.body):
        f = func.FuncOp("f", ir.FunctionType.get([kd.mlir_type(s) for s in arg_specs], []))
        block = f.add_entry_block()
    return ctx, loc, module, block


@pytest.fixture
def ir_ctx():
    made = []

    def make(*specs):
        ctx, loc, module, block = _function(specs)
        made.append((ctx, loc))
        return module, block

    yield make
    for ctx, loc in reversed(made):
        loc.__exit__(None, None, None)
        ctx.__exit__(None, None, None)


def test_load_is_idempotent_and_registers_every_op():
    ctx = ir.Context()
    kd.load(ctx)
    kd.load(ctx)
    for spec in kd.OPS:
        assert ctx.is_registered_operation(spec.full_name), spec.full_name


def test_builders_infer_types(ir_ctx):
    module, block = ir_ctx(TensorSpec((2, 8, 256, 64), "bf16"), TensorSpec((256,), "bf16"))
    q, bias = block.arguments
    with ir.InsertionPoint(block):
        kt = kb.transpose(q, perm=[0, 1, 3, 2])
        s = kb.matmul(q, kt)
        s = kb.add(s, bias)
        m = kb.reduce_max(s, dims=[-1], keepdim=True)
        p = kb.softmax(kb.sub(s, m), dim=-1)
        v, i = kb.topk(p, k=4, dim=-1)
        c = kb.concat([v, v, v], dim=-1)
        func.ReturnOp([c])
    assert str(kt.type) == "tensor<2x8x64x256xbf16>"
    assert str(s.type) == "tensor<2x8x256x256xbf16>"
    assert str(m.type) == "tensor<2x8x256x1xbf16>"
    assert str(i.type) == "tensor<2x8x256x4xi64>"
    assert str(c.type) == "tensor<2x8x256x12xbf16>"
    assert kd.verify(module.operation) == []


def test_builder_rejects_ill_typed_op_before_creating_it(ir_ctx):
    module, block = ir_ctx(TensorSpec((4, 8), "f32"), TensorSpec((4, 8), "f32"))
    a, b = block.arguments
    with ir.InsertionPoint(block):
        with pytest.raises(kd.KfTypeError, match="contracting dimensions differ"):
            kb.matmul(a, b)
        with pytest.raises(kd.KfTypeError, match="floating-point"):
            kb.exp(kb.cast(a, "i32"))
    names = [op.operation.name for op in block.operations]
    assert "kf.matmul" not in names


@pytest.mark.parametrize("elem", kd.ELEMENT_TYPES)
def test_every_element_type(ir_ctx, elem):
    module, block = ir_ctx(TensorSpec((3, 5), elem))
    (x,) = block.arguments
    with ir.InsertionPoint(block):
        y = kb.reshape(kb.transpose(x, perm=[1, 0]), [15])
        func.ReturnOp([y])
    assert str(y.type) == f"tensor<15x{elem}>"
    assert kd.verify(module.operation) == []


def test_broadcast_shapes():
    assert broadcast_shapes((4, 1, 8), (3, 1), ()) == (4, 3, 8)
    with pytest.raises(kd.KfTypeError, match="do not broadcast"):
        broadcast_shapes((4, 8), (3,))


def test_irdl_text_is_one_dialect_with_every_op():
    text = kd.irdl_text()
    assert text.startswith("irdl.dialect @kf {")
    assert text.count("irdl.operation @") == len(kd.OPS)
