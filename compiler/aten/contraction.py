"""Handlers of matmul, linear, addmm and scaled fp8 matmul."""

from __future__ import annotations

from kf.dialects import builders as kb

from ..errors import Unsupported
from .core import elem_of, fake_value, handles, rank_of, shape_of
from .reductions import stat_elem


@handles("aten.matmul.default", "aten.mm.default", "aten.bmm.default", "aten.mv.default", "aten.dot.default")
def _matmul(c, node, args, kwargs):
    a, b = args
    elem = c.out_elem(node)
    a, b = c.tensor(a, elem), c.tensor(b, elem)
    ra, rb = rank_of(a), rank_of(b)
    if ra == 1 and rb == 1:
        return kb.sum(kb.mul(a, b), dims=[0], keepdim=False)
    squeeze = []
    if ra == 1:
        a = kb.reshape(a, (1,) + shape_of(a))
        squeeze.append(-2)
    if rb == 1:
        b = kb.reshape(b, shape_of(b) + (1,))
        squeeze.append(-1)
    out = kb.matmul(a, b)
    if squeeze:
        shape = list(shape_of(out))
        for d in sorted(squeeze):
            shape.pop(len(shape) + d if d == -1 else len(shape) - 2)
        out = kb.reshape(out, shape)
    return out


@handles("aten._scaled_mm.default")
def _scaled_mm(c, node, args, kwargs):
    """torch._scaled_mm, torch's fp8 GEMM: ``(a @ b) * scale_a * scale_b (+ bias)`` with the
    products of the fp8 (or 16-bit) operands accumulated in f32 and one rounding to
    out_dtype. The matmul keeps its narrow operands (the CUDA strategy issues fp8
    mma.sync on them; other targets widen them as they load) and an f32 result."""
    from kf.dialects.types import TensorSpec

    names = ("self", "mat2", "scale_a", "scale_b", "bias", "scale_result", "out_dtype", "use_fast_accum")
    p = dict(zip(names, args))
    p.update(kwargs)
    a, b = p["self"], p["mat2"]
    if p.get("scale_result") is not None:
        raise Unsupported("torch._scaled_mm with scale_result (an fp8 output) is not supported by kf",
                          cause="give out_dtype=torch.bfloat16 or torch.float32")
    if elem_of(a) != elem_of(b):
        raise Unsupported(f"torch._scaled_mm of {elem_of(a)} by {elem_of(b)}: kf needs both operands of one type",
                          cause="mixed e4m3 x e5m2 products are not supported yet")
    shape = shape_of(a)[:-1] + shape_of(b)[-1:]
    out = kb.build("matmul", [a, b], None, [TensorSpec(tuple(shape), "f32")]).result
    for s in (p["scale_a"], p["scale_b"]):
        out = kb.mul(out, c.tensor(s, "f32"))
    if p.get("bias") is not None:
        out = kb.add(out, c.tensor(p["bias"], "f32"))
    return c.tensor(out, c.out_elem(node))


def _matmul_plus(c, a, b, bias, elem: str, alpha=1, beta=1, shape=None):
    """alpha * (a @ b) + beta * bias, rounded once to elem: for f16/bf16 the product is
    kept in its f32 accumulator and the bias added in f32 (as torch's GEMM epilogues do),
    not rounded to elem before the addition. ``shape``: the product reshaped to it before
    the bias is added (a matrix-vector product's vector)."""
    from kf.dialects.types import TensorSpec

    st = stat_elem(elem)
    a, b = c.tensor(a, elem), c.tensor(b, elem)
    if st == elem:
        out = kb.matmul(a, b)
    else:
        product = shape_of(a)[:-1] + shape_of(b)[-1:]
        out = kb.build("matmul", [a, b], None, [TensorSpec(tuple(product), st)]).result
    if shape is not None and tuple(shape) != shape_of(out):
        out = kb.reshape(out, tuple(shape))
    if alpha != 1:
        out = kb.mul(out, c.tensor(alpha, st))
    if bias is not None:
        bias = c.tensor(c.tensor(bias, elem), st)
        if beta != 1:
            bias = kb.mul(bias, c.tensor(beta, st))
        out = kb.add(out, bias)
    return c.tensor(out, elem)


@handles("aten.linear.default")
def _linear(c, node, args, kwargs):
    x, w = args[0], args[1]
    bias = args[2] if len(args) > 2 else kwargs.get("bias")
    elem = c.out_elem(node)
    x, w = c.tensor(x, elem), c.tensor(w, elem)
    # F.linear takes a 1-d input (in_features,) and a 1-d weight (in_features,): their
    # dims drop out of the result, as in matmul
    lead = shape_of(x)[:-1]
    tail = shape_of(w)[:-1]
    if rank_of(x) == 1:
        x = kb.reshape(x, (1,) + shape_of(x))
    w = kb.reshape(w, shape_of(w) + (1,)) if rank_of(w) == 1 else kb.transpose(w, perm=[1, 0])
    return _matmul_plus(c, x, w, bias, elem, shape=lead + tail)


@handles("aten.addmm.default", "aten.baddbmm.default")
def _addmm(c, node, args, kwargs):
    bias, a, b = args[:3]
    return _matmul_plus(c, a, b, bias, c.out_elem(node), alpha=kwargs.get("alpha", 1), beta=kwargs.get("beta", 1))


@handles("aten.addbmm.default")
def _addbmm(c, node, args, kwargs):
    """beta * input + alpha * the sum over the batch of a_i @ b_i: one matmul of a's
    batches side by side, (n, B k), with b's stacked, (B k, m)."""
    bias, a, b = args[:3]
    beta, alpha = kwargs.get("beta", 1), kwargs.get("alpha", 1)
    batches, n, k = shape_of(a)
    m = shape_of(b)[2]
    elem = c.out_elem(node)
    if batches * k == 0:
        product = kb.fill((n, m), elem, 0.0)
        return product if beta == 0 else kb.add(product, kb.mul(c.tensor(bias, elem), c.tensor(beta, elem)))
    a = kb.reshape(kb.transpose(c.tensor(a, elem), perm=[1, 0, 2]), (n, batches * k))
    b = kb.reshape(c.tensor(b, elem), (batches * k, m))
    out = _matmul_plus(c, a, b, None if beta == 0 else bias, elem, alpha=alpha, beta=beta)
    shape = tuple(fake_value(node).shape)
    return out if shape_of(out) == shape else kb.broadcast_to(out, shape)
