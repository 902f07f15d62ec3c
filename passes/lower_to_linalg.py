"""kf-lower-to-linalg: rewrite every kf op into linalg, tensor, arith, math and scf on
tensors (linalg-on-tensors, the level torch-mlir hands over), so that upstream tiling,
fusion, bufferization and the target pipelines apply to kf programs.

How each family is lowered (test/passes/kf-lower-to-linalg.mlir shows representative
cases; test/python/passes/test_lower_to_linalg_cpu.py runs every op against torch):
- elementwise ops: one ``linalg.generic`` whose indexing maps do torch broadcasting
  (a size-1 operand dim reads index 0, missing leading dims are dropped, rank-0
  operands map to ``()``); the scalar body comes from ``scalar_math.emit``;
- reductions (sum, mean, reduce_max/min, var, argmax): a ``linalg.generic`` with
  reduction iterators into a filled accumulator, then a parallel generic that
  finishes (divides, rounds) and ``tensor.expand_shape`` for ``keepdim``;
- softmax/log_softmax: max, then sum of ``exp(x - max)``, then the normalized value,
  so that large inputs do not overflow;
- matmul: ``linalg.matmul`` / ``linalg.batch_matmul`` when the ranks allow, otherwise
  a generic contraction whose maps broadcast the batch dims;
- layout: ``linalg.transpose``, ``tensor.collapse_shape``/``expand_shape``,
  ``tensor.extract_slice``, ``tensor.insert_slice`` into ``tensor.empty`` (concat);
- topk: an ``scf.for`` over k that runs a masked arg-best reduction and marks the
  element it picked; gather/index_select: a generic that ``tensor.extract``s;
  index_add/scatter_add: ``scf.for`` loops over the index with extract/insert;
- rand: a parallel generic computing each element's sample from its Philox block, found
  from its linear index (``linalg.index``) and the state's two words (``passes/philox.py``).

Index checks: an op that indexes through a tensor (gather, index_select, index_add,
scatter_add) reads its indices through a copy in which each one outside the dimension
it indexes is 0 (so no extract or insert leaves the tensor), and one reduction over the
indices (their minimum and maximum) tells whether any was outside. The function gets
one more result, last: the index error flag of runtime/abi.py (``tensor<4xi32>``: set,
which op, the value), and the attribute ``kf.index_sites`` listing the ops in the
flag's numbering (op, the user's file:line, dim, bound), from which the driver makes
``ProgramABI.index_sites``.

Precision policy: f16, bf16 and fp8 elementwise math is computed in f32 and rounded
once to the result type; a bf16/f16 result that only elementwise ops read is not rounded
at all but stays an f32 tensor (``keeps_wide``: rounded once, where something else reads
it, as in a fused GPU kernel); reductions and matmul accumulate in f32 (f64 stays f64,
integers accumulate in their own type). torch-mlir's functions (the ATen ops kf has no op
for) compute bf16/f16 in f32 and round where they return (``compute_in_f32``), as torch's
CPU kernels do.
"""

from __future__ import annotations

import array
import contextvars
import dataclasses
import math
import re
from typing import Callable, Sequence

from mlir import ir
from mlir.dialects import arith, linalg, scf, tensor

from kf.dialects.attrs import op_attrs
from kf.dialects.elements import LOW_PRECISION
from kf.dialects.types import TensorSpec, normalize_dim, spec_of

from . import philox
from . import scalar_math as sm
from .base import KfPass, PassError


Body = Callable[[list[ir.Value]], list[ir.Value]]


# --------------------------------------------------------------------------- types


def _type(elem: str) -> ir.Type:
    return ir.Type.parse(elem)


def _tensor_type(shape: Sequence[int], elem: str | ir.Type) -> ir.RankedTensorType:
    t = elem if isinstance(elem, ir.Type) else _type(elem)
    return ir.RankedTensorType.get(list(shape), t)


def compute_elem(elem: str) -> str:
    """The element type kf computes and accumulates in for tensors of ``elem``."""
    return "f32" if elem in LOW_PRECISION else elem


def _widen(v: ir.Value) -> ir.Value:
    """A scalar extended to its compute type (f16/bf16/fp8 to f32, others unchanged)."""
    return sm.convert(v, _type(compute_elem(str(v.type))))


def _shape(v: ir.Value) -> tuple[int, ...]:
    return tuple(ir.RankedTensorType(v.type).shape)


def _elem(v: ir.Value) -> str:
    return spec_of(v.type).elem


def _loop_index(dim: int) -> ir.Value:
    """linalg.index: the current iteration along loop dim of the enclosing generic."""
    return linalg.IndexOp(_i64_attr(dim)).result


def _i64_attr(value: int) -> ir.Attribute:
    return ir.IntegerAttr.get(ir.IntegerType.get_signless(64), value)


def _index(value: int) -> ir.Value:
    return arith.constant(ir.IndexType.get(), value)


# --------------------------------------------------------------------------- affine maps


def _identity(rank: int) -> ir.AffineMap:
    return ir.AffineMap.get_identity(rank) if rank else ir.AffineMap.get(0, 0, [])


def _broadcast_map(in_shape: Sequence[int], out_shape: Sequence[int]) -> ir.AffineMap:
    """Torch broadcasting of an operand of in_shape into a loop nest over out_shape."""
    rank, lead = len(out_shape), len(out_shape) - len(in_shape)
    exprs = []
    for i, size in enumerate(in_shape):
        j = lead + i
        exprs.append(ir.AffineConstantExpr.get(0) if size == 1 and out_shape[j] != 1 else ir.AffineDimExpr.get(j))
    return ir.AffineMap.get(rank, 0, exprs)


def _projection(rank: int, kept: Sequence[int]) -> ir.AffineMap:
    return ir.AffineMap.get(rank, 0, [ir.AffineDimExpr.get(d) for d in kept])


# --------------------------------------------------------------------------- builders


def empty(shape: Sequence[int], elem: str | ir.Type) -> ir.Value:
    return tensor.empty(list(shape), elem if isinstance(elem, ir.Type) else _type(elem))


def filled(shape: Sequence[int], elem: str | ir.Type, value: float) -> ir.Value:
    """A tensor of shape with every element equal to value (linalg.fill)."""
    t = elem if isinstance(elem, ir.Type) else _type(elem)
    return linalg.fill(sm.const(t, value), outs=[empty(shape, t)])


def generic(ins: Sequence[ir.Value], outs: Sequence[ir.Value], maps: Sequence[ir.AffineMap],
            iterators: Sequence[str], body: Body) -> list[ir.Value]:
    """A linalg.generic; ``body`` gets the block's scalars (ins, then outs) and returns
    the values to yield."""
    op = linalg.GenericOp(
        [o.type for o in outs], list(ins), list(outs),
        ir.ArrayAttr.get([ir.AffineMapAttr.get(m) for m in maps]),
        ir.ArrayAttr.get([ir.Attribute.parse(f"#linalg.iterator_type<{it}>") for it in iterators]))
    block = op.regions[0].blocks.append(*[ir.RankedTensorType(v.type).element_type for v in [*ins, *outs]])
    with ir.InsertionPoint(block):
        linalg.YieldOp(body(list(block.arguments)))
    return list(op.results)


def map_elements(ins: Sequence[ir.Value], out_shape: Sequence[int], out_elem: str | ir.Type,
                 fn: Callable[[list[ir.Value]], ir.Value],
                 maps: Sequence[ir.AffineMap] | None = None) -> ir.Value:
    """A parallel generic over out_shape computing ``fn(scalars of ins)``; ins broadcast
    like torch unless explicit maps are given."""
    rank = len(out_shape)
    maps = list(maps) if maps is not None else [_broadcast_map(_shape(v), out_shape) for v in ins]
    init = empty(out_shape, out_elem)
    return generic(ins, [init], [*maps, _identity(rank)], ["parallel"] * rank,
                   lambda args: [fn(args[:-1])])[0]


def convert_tensor(v: ir.Value, elem: str) -> ir.Value:
    """v with its elements converted to elem (v itself when it already is)."""
    if _elem(v) == elem:
        return v
    t = _type(elem)
    return map_elements([v], _shape(v), t, lambda a: sm.convert(a[0], t))


def expand_keepdim(v: ir.Value, shape: Sequence[int], red: Sequence[int]) -> ir.Value:
    """v (the kept dims of a reduction) reshaped to shape, which has size 1 at each dim
    of red; v itself when shape has no reduced dims (keepdim=False)."""
    if len(_shape(v)) == len(shape):
        return v
    kept = [d for d in range(len(shape)) if d not in red]
    groups: list[list[int]] = [[d] for d in kept]
    for d in red:
        # A reduced dim joins the group of the kept dim before it (the first group when
        # it leads).
        owner = max((i for i, k in enumerate(kept) if k < d), default=0)
        if groups:
            groups[owner].append(d)
    elem = ir.RankedTensorType(v.type).element_type
    return tensor.expand_shape(_tensor_type(shape, elem), v, _reassoc([sorted(g) for g in groups]), [], list(shape))


def _reassoc(groups: Sequence[Sequence[int]]) -> ir.ArrayAttr:
    return ir.ArrayAttr.get([ir.ArrayAttr.get([_i64_attr(d) for d in g]) for g in groups])


def reshape(v: ir.Value, shape: Sequence[int]) -> ir.Value:
    """v with the same elements in a new static shape: collapse to 1-D, then expand.

    Going through 1-D is always valid for static shapes, and the canonicalizer folds a
    collapse/expand pair into one reassociation when one exists.
    """
    src, elem = _shape(v), ir.RankedTensorType(v.type).element_type
    shape = list(shape)
    if list(src) == shape:
        return v
    numel = math.prod(src)
    if len(src) == 0:
        flat = tensor.expand_shape(_tensor_type([1], elem), v, _reassoc([]), [], [1])
    elif len(src) == 1:
        flat = v
    else:
        flat = tensor.collapse_shape(_tensor_type([numel], elem), v, _reassoc([list(range(len(src)))]))
    if len(shape) == 0:
        return tensor.collapse_shape(_tensor_type([], elem), flat, _reassoc([]))
    if len(shape) == 1:
        return flat
    return tensor.expand_shape(_tensor_type(shape, elem), flat, _reassoc([list(range(len(shape)))]), [], shape)


def extract_slice(v: ir.Value, offsets: Sequence[int | ir.Value], sizes: Sequence[int],
                  strides: Sequence[int] | None = None, result_shape: Sequence[int] | None = None) -> ir.Value:
    """tensor.extract_slice with static sizes and static or dynamic offsets."""
    strides = list(strides or [1] * len(sizes))
    dyn = [o for o in offsets if isinstance(o, ir.Value)]
    static = [ir.ShapedType.get_dynamic_size() if isinstance(o, ir.Value) else int(o) for o in offsets]
    out = _tensor_type(result_shape if result_shape is not None else sizes,
                       ir.RankedTensorType(v.type).element_type)
    return tensor.extract_slice(out, v, dyn, [], [], static, list(sizes), strides)


def insert_slice(src: ir.Value, dest: ir.Value, offsets: Sequence[int | ir.Value], sizes: Sequence[int],
                 strides: Sequence[int] | None = None) -> ir.Value:
    """tensor.insert_slice with static sizes and static or dynamic offsets."""
    strides = list(strides or [1] * len(sizes))
    dyn = [o for o in offsets if isinstance(o, ir.Value)]
    static = [ir.ShapedType.get_dynamic_size() if isinstance(o, ir.Value) else int(o) for o in offsets]
    return tensor.insert_slice(src, dest, dyn, [], [], static, list(sizes), strides)


def for_loop(lb: int, ub: int, iter_args: Sequence[ir.Value],
             body: Callable[[ir.Value, list[ir.Value]], list[ir.Value]]) -> list[ir.Value]:
    """scf.for from lb to ub (step 1) carrying iter_args; body returns the next values."""
    loop = scf.ForOp(_index(lb), _index(ub), _index(1), list(iter_args))
    with ir.InsertionPoint(loop.body):
        scf.YieldOp(body(loop.induction_variable, list(loop.inner_iter_args)))
    return list(loop.results)


# --------------------------------------------------------------------------- reductions


def _reduced_dims(rank: int, dims: Sequence[int]) -> list[int]:
    if rank == 0:
        return []
    return sorted({normalize_dim(int(d), rank) for d in dims}) if dims else list(range(rank))


def reduce(x: ir.Value, red: Sequence[int], acc_elem: str, init: float,
           combine: Callable[[list[ir.Value], ir.Value], ir.Value],
           extra: Sequence[ir.Value] = ()) -> ir.Value:
    """Reduce x over dims red into a tensor of the kept dims, of element acc_elem.

    ``combine(scalars, acc)`` gets the scalars of x and of each ``extra`` operand (which
    have the kept dims only, like the result) and the accumulator, and returns the new
    accumulator.
    """
    shape = _shape(x)
    rank = len(shape)
    kept = [d for d in range(rank) if d not in red]
    init_t = filled([shape[d] for d in kept], acc_elem, init)
    proj = _projection(rank, kept)
    iterators = ["reduction" if d in red else "parallel" for d in range(rank)]
    return generic([x, *extra], [init_t], [_identity(rank), *[proj] * len(extra), proj], iterators,
                   lambda a: [combine(a[:-1], a[-1])])[0]


def _finish(v: ir.Value, fn: Callable[[ir.Value], ir.Value] | None, out: TensorSpec,
            red: Sequence[int] = ()) -> ir.Value:
    """Apply fn to each accumulated element, round to out's element type and restore
    the reduced dims red as size 1 when out keeps them."""
    t = _type(out.elem)
    if fn is not None or _elem(v) != out.elem:
        v = map_elements([v], _shape(v), t, lambda a: sm.convert(fn(a[0]) if fn else a[0], t))
    return expand_keepdim(v, out.shape, red)


def _min_value(elem: str) -> float:
    if elem in ("i32", "i64"):
        return -(2 ** (int(elem[1:]) - 1))
    return 0 if elem == "i1" else -math.inf


def _max_value(elem: str) -> float:
    if elem in ("i32", "i64"):
        return 2 ** (int(elem[1:]) - 1) - 1
    return 1 if elem == "i1" else math.inf


def _better(x: ir.Value, best: ir.Value, largest: bool) -> ir.Value:
    """x should replace best: strictly greater (smaller), NaN counting as the greatest."""
    if sm.is_float(x.type):
        pred = arith.CmpFPredicate.OGT if largest else arith.CmpFPredicate.OLT
        strict = arith.cmpf(pred, x, best)
        x_nan = arith.cmpf(arith.CmpFPredicate.UNO, x, x)
        best_nan = arith.cmpf(arith.CmpFPredicate.UNO, best, best)
        one = sm.const(ir.IntegerType.get_signless(1), 1)
        nan_wins = (arith.andi(x_nan, arith.xori(best_nan, one)) if largest
                    else arith.andi(best_nan, arith.xori(x_nan, one)))
        return arith.ori(strict, nan_wins)
    if ir.IntegerType(x.type).width == 1:  # false < true: unsigned
        return arith.cmpi(arith.CmpIPredicate.ugt if largest else arith.CmpIPredicate.ult, x, best)
    return arith.cmpi(arith.CmpIPredicate.sgt if largest else arith.CmpIPredicate.slt, x, best)


def arg_best(x: ir.Value, dim: int, largest: bool, taken: ir.Value | None = None) -> tuple[ir.Value, ir.Value]:
    """(best value, its first index) along dim, skipping elements where taken is true.

    The index accumulator starts at -1 (nothing seen), so no sentinel value is needed and
    an all -inf (or all NaN) row still yields its first element.
    """
    shape = _shape(x)
    rank = len(shape)
    kept = [d for d in range(rank) if d != dim]
    acc_elem = compute_elem(_elem(x))
    vals = filled([shape[d] for d in kept], acc_elem, 0)
    idxs = filled([shape[d] for d in kept], "i64", -1)
    ins = [x] if taken is None else [x, taken]
    proj = _projection(rank, kept)
    i64 = ir.IntegerType.get_signless(64)

    def body(a):
        v = _widen(a[0])
        best, best_i = a[-2], a[-1]
        i = arith.index_cast(i64, _loop_index(dim))
        none = arith.cmpi(arith.CmpIPredicate.eq, best_i, sm.const(i64, -1))
        take = arith.ori(none, _better(v, best, largest))
        if taken is not None:
            take = arith.andi(take, arith.xori(a[1], sm.const(ir.IntegerType.get_signless(1), 1)))
        return [arith.select(take, v, best), arith.select(take, i, best_i)]

    iterators = ["reduction" if d == dim else "parallel" for d in range(rank)]
    v, i = generic(ins, [vals, idxs], [_identity(rank)] * len(ins) + [proj, proj], iterators, body)
    return v, i


# --------------------------------------------------------------------------- op lowerings


def _elementwise(op: ir.Operation, args: list[ir.Value], attrs: dict, out: list[TensorSpec],
                 wide: bool = False) -> list[ir.Value]:
    """One elementwise kf op. Its operands may be tensors of their compute type (f32 for a
    bf16/f16 value another elementwise op left unrounded); with ``wide`` its result is one
    too: the f32 value before rounding (a cast still rounds to its target type)."""
    name = op.name
    t = _type(out[0].elem)
    store = _type(compute_elem(out[0].elem)) if wide else t
    # select/masked_fill only move values: no widening (no rounding at all) unless their
    # operands are of two types (one of them left unrounded)
    moves = name in ("kf.select", "kf.masked_fill")
    values = args[1:] if name == "kf.select" else args[:1]
    widen = not moves or wide or any(_elem(v) != out[0].elem for v in values)

    def fn(a):
        scalars = [_widen(s) for s in a] if widen else a
        if name == "kf.cast":
            return sm.convert(sm.convert(a[0], t), store)
        if moves and widen:
            return sm.convert(sm.emit(name, scalars, attrs), store)
        return sm.convert(sm.emit(name, scalars, attrs, stored_as=t), store)

    return [map_elements(args, out[0].shape, store, fn)]


def _sum_like(op, args, attrs, out):
    (x,) = args
    red = _reduced_dims(len(_shape(x)), attrs.get("dims", []))
    acc_elem = compute_elem(out[0].elem)
    acc_t = _type(acc_elem)
    name = op.name
    if name == "kf.sum" and out[0].elem == "i1":
        raise PassError("kf.sum of booleans needs an integer result type (torch counts them in i64)",
                        op.location)
    if name in ("kf.sum", "kf.mean"):
        s = reduce(x, red, acc_elem, 0, lambda a, acc: sm.emit("add", [sm.convert(a[0], acc_t), acc]))
        n = math.prod(_shape(x)[d] for d in red)
        fn = (lambda v: arith.divf(v, sm.const(acc_t, n))) if name == "kf.mean" else None
        return [_finish(s, fn, out[0], red)]
    largest = name == "kf.reduce_max"
    init = _min_value(acc_elem) if largest else _max_value(acc_elem)
    s = reduce(x, red, acc_elem, init, lambda a, acc: sm.emit("max" if largest else "min", [_widen(a[0]), acc]))
    return [_finish(s, None, out[0], red)]


def _var(op, args, attrs, out):
    (x,) = args
    red = _reduced_dims(len(_shape(x)), attrs.get("dims", []))
    acc_elem = compute_elem(out[0].elem)
    acc_t = _type(acc_elem)
    n = math.prod(_shape(x)[d] for d in red)
    # Two passes (mean, then squared deviations) rather than E[x²] - E[x]²: the one-pass
    # formula loses all precision when the mean is large relative to the spread.
    total = reduce(x, red, acc_elem, 0, lambda a, acc: arith.addf(_widen(a[0]), acc))
    mean = map_elements([total], _shape(total), acc_t, lambda a: arith.divf(a[0], sm.const(acc_t, n)))

    def sq(a, acc):
        d = arith.subf(_widen(a[0]), a[1])
        return arith.addf(acc, arith.mulf(d, d))

    m2 = reduce(x, red, acc_elem, 0, sq, extra=[mean])
    corr = float(attrs.get("correction", 1.0))
    return [_finish(m2, lambda v: sm.variance(v, n, corr), out[0], red)]


def _logsumexp(op, args, attrs, out):
    """max + log(sum(exp(x - max))): the sum never overflows. A row whose max is +-inf
    shifts by 0 instead (torch.logsumexp's rule): an all -inf row gives -inf, not NaN."""
    (x,) = args
    red = _reduced_dims(len(_shape(x)), attrs.get("dims", []))
    acc_elem = compute_elem(out[0].elem)
    acc_t = _type(acc_elem)
    mx = reduce(x, red, acc_elem, -math.inf, lambda a, acc: arith.maximumf(_widen(a[0]), acc))

    def finite(a):
        inf = arith.cmpf(arith.CmpFPredicate.OEQ, sm.emit("abs", [a[0]]), sm.const(acc_t, math.inf))
        return arith.select(inf, sm.const(acc_t, 0.0), a[0])

    shift = map_elements([mx], _shape(mx), acc_t, finite)
    total = reduce(x, red, acc_elem, 0,
                   lambda a, acc: arith.addf(acc, sm.emit("exp", [arith.subf(_widen(a[0]), a[1])])), extra=[shift])
    lse = map_elements([total, shift], _shape(total), acc_t, lambda a: arith.addf(sm.emit("log", [a[0]]), a[1]))
    return [_finish(lse, None, out[0], red)]


def _argmax(op, args, attrs, out):
    (x,) = args
    rank = len(_shape(x))
    if rank == 0:
        return [filled(out[0].shape, "i64", 0)]
    dim = normalize_dim(int(attrs["dim"]), rank)
    _, idx = arg_best(x, dim, largest=True)
    return [expand_keepdim(idx, out[0].shape, [dim])]


def _softmax(op, args, attrs, out):
    (x,) = args
    shape = _shape(x)
    rank = len(shape)
    if rank == 0:
        return [filled((), out[0].elem, 0.0 if op.name == "kf.log_softmax" else 1.0)]
    dim = normalize_dim(int(attrs["dim"]), rank)
    acc_elem = compute_elem(out[0].elem)
    kept = [d for d in range(rank) if d != dim]
    proj = _projection(rank, kept)
    mx = reduce(x, [dim], acc_elem, -math.inf, lambda a, acc: arith.maximumf(_widen(a[0]), acc))
    total = reduce(x, [dim], acc_elem, 0,
                   lambda a, acc: arith.addf(acc, sm.emit("exp", [arith.subf(_widen(a[0]), a[1])])), extra=[mx])
    t = _type(out[0].elem)
    if op.name == "kf.softmax":
        def fn(a):
            return sm.convert(arith.divf(sm.emit("exp", [arith.subf(_widen(a[0]), a[1])]), a[2]), t)
    else:
        def fn(a):
            return sm.convert(arith.subf(arith.subf(_widen(a[0]), a[1]), sm.emit("log", [a[2]])), t)
    return [map_elements([x, mx, total], shape, t, fn, maps=[_identity(rank), proj, proj])]


def _matmul(op, args, attrs, out):
    a, b = args
    sa, sb, so = _shape(a), _shape(b), out[0].shape
    acc_elem = compute_elem(out[0].elem)
    # fp8 operands (torch._scaled_mm, precision="fp8") are widened to the accumulator
    # type first: the CPU has no fp8 arithmetic, and linalg's contraction lowering takes
    # no fp8 extension in its body. That costs one f32 copy of each operand.
    a, b = (map_elements([v], _shape(v), acc_elem, lambda x: _widen(x[0]))
            if ir.RankedTensorType(v.type).element_type != _type(acc_elem) and
            str(ir.RankedTensorType(v.type).element_type).startswith("f8") else v for v in (a, b))
    acc = filled(so, acc_elem, 0)
    if len(sa) == 2 and len(sb) == 2:
        r = linalg.matmul(a, b, outs=[acc])
    elif len(sa) == 3 and len(sb) == 3 and sa[0] == sb[0]:
        r = linalg.batch_matmul(a, b, outs=[acc])
    else:
        r = _batched_contraction(a, b, acc)
    return [_finish(r, None, out[0])]


def _batched_contraction(a: ir.Value, b: ir.Value, acc: ir.Value) -> ir.Value:
    """out[B, m, n] += a[B', m, k] * b[B'', k, n] where B', B'' broadcast to B."""
    so = _shape(acc)
    nb = len(so) - 2
    rank = nb + 3  # batch dims, m, n, k
    m, n, k = (ir.AffineDimExpr.get(nb + i) for i in range(3))

    def operand_map(shape, last_two):
        lead = nb - (len(shape) - 2)
        exprs = [ir.AffineConstantExpr.get(0) if size == 1 and so[lead + i] != 1 else ir.AffineDimExpr.get(lead + i)
                 for i, size in enumerate(shape[:-2])]
        return ir.AffineMap.get(rank, 0, exprs + list(last_two))

    batch = [ir.AffineDimExpr.get(i) for i in range(nb)]
    maps = [operand_map(_shape(a), (m, k)), operand_map(_shape(b), (k, n)), ir.AffineMap.get(rank, 0, batch + [m, n])]
    acc_t = ir.RankedTensorType(acc.type).element_type

    def body(s):
        x, y = sm.convert(s[0], acc_t), sm.convert(s[1], acc_t)
        return [sm.emit("add", [s[2], sm.emit("mul", [x, y])])]

    return generic([a, b], [acc], maps, ["parallel"] * (nb + 2) + ["reduction"], body)[0]


def _one_result(built) -> ir.Value:
    """The single result of what a bindings helper returned (an op, a list or a value)."""
    if isinstance(built, ir.Value):
        return built
    results = built.results if hasattr(built, "results") else built
    return results[0]


def _transpose(op, args, attrs, out):
    init = empty(out[0].shape, out[0].elem)
    return [_one_result(linalg.transpose(args[0], outs=[init], permutation=[int(p) for p in attrs["perm"]]))]


def _reshape(op, args, attrs, out):
    return [reshape(args[0], out[0].shape)]


def _broadcast_to(op, args, attrs, out):
    return [map_elements(args, out[0].shape, out[0].elem, lambda a: a[0])]


def _slice(op, args, attrs, out):
    (x,) = args
    rank = len(_shape(x))
    dim = normalize_dim(int(attrs["dim"]), rank)
    offsets, strides = [0] * rank, [1] * rank
    offsets[dim], strides[dim] = int(attrs["start"]), int(attrs.get("step", 1))
    return [extract_slice(x, offsets, out[0].shape, strides)]


def _concat(op, args, attrs, out):
    rank = len(out[0].shape)
    dim = normalize_dim(int(attrs["dim"]), rank)
    result, at = empty(out[0].shape, out[0].elem), 0
    for v in args:
        offsets = [0] * rank
        offsets[dim] = at
        result = insert_slice(v, result, offsets, _shape(v))
        at += _shape(v)[dim]
    return [result]


def _topk(op, args, attrs, out):
    (x,) = args
    shape = _shape(x)
    rank = len(shape)
    dim = normalize_dim(int(attrs["dim"]), rank)
    k, largest = int(attrs["k"]), bool(attrs.get("largest", True))
    kept = [d for d in range(rank) if d != dim]
    row = [1 if d == dim else shape[d] for d in range(rank)]
    i1 = ir.IntegerType.get_signless(1)

    def step(i, carried):
        vals, idxs, taken = carried
        best, best_i = arg_best(x, dim, largest, taken)
        best = convert_tensor(best, out[0].elem)
        offsets = [i if d == dim else 0 for d in range(rank)]
        vals = insert_slice(best, vals, offsets, row)
        idxs = insert_slice(best_i, idxs, offsets, row)
        i64 = ir.IntegerType.get_signless(64)

        def mark(a):
            here = arith.cmpi(arith.CmpIPredicate.eq, arith.index_cast(i64, _loop_index(dim)), a[0])
            return [arith.ori(a[1], here)]

        # The mask is updated in place (it is the generic's init), so that the loop
        # carries one buffer after bufferization instead of a new one per iteration.
        (taken,) = generic([best_i], [taken], [_projection(rank, kept), _identity(rank)], ["parallel"] * rank, mark)
        return [vals, idxs, taken]

    init = [empty(out[0].shape, out[0].elem), empty(out[1].shape, "i64"), filled(shape, i1, 0)]
    vals, idxs, _ = for_loop(0, k, init, step)
    return [vals, idxs]


def _as_index(v: ir.Value) -> ir.Value:
    return arith.index_cast(ir.IndexType.get(), v)


class _Sites:
    """The index checks of one function being lowered: per op, whether an index was
    out of range and the first such value (i1, i64 scalars); ``finish`` makes the flag."""

    def __init__(self) -> None:
        self.checks: list[tuple[dict, ir.Value, ir.Value]] = []

    def finish(self, f: ir.Operation) -> None:
        """Return the flag from f (last result) and record ``kf.index_sites`` on it."""
        from mlir.dialects import func

        i1, i32, i64 = (ir.IntegerType.get_signless(w) for w in (1, 32, 64))
        ret = list(f.regions[0].blocks[0].operations)[-1].operation
        with ir.InsertionPoint(ret), ret.location:
            hit, site, value = arith.constant(i1, 0), arith.constant(i32, 0), arith.constant(i64, 0)
            for n, (_, bad, v) in enumerate(self.checks):
                take = arith.andi(bad, arith.xori(hit, arith.constant(i1, 1)))
                site = arith.select(take, arith.constant(i32, n), site)
                value = arith.select(take, v, value)
                hit = arith.ori(hit, bad)
            words = [arith.extui(i32, hit), site, arith.trunci(i32, value),
                     arith.trunci(i32, arith.shrsi(value, arith.constant(i64, 32)))]
            flag = tensor.from_elements(_tensor_type([len(words)], i32), words)
            func.ReturnOp([*ret.operands, flag])
        ret.erase()
        ftype = ir.FunctionType(ir.TypeAttr(f.attributes["function_type"]).value)
        f.attributes["function_type"] = ir.TypeAttr.get(
            ir.FunctionType.get(list(ftype.inputs), [*ftype.results, flag.type]))
        if "res_attrs" in f.attributes:
            f.attributes["res_attrs"] = ir.ArrayAttr.get([*ir.ArrayAttr(f.attributes["res_attrs"]),
                                                          ir.DictAttr.get({})])
        f.attributes["kf.index_sites"] = ir.ArrayAttr.get([ir.DictAttr.get({
            "op": ir.StringAttr.get(s["op"]), "where": ir.StringAttr.get(s["where"]),
            "dim": _i64_attr(s["dim"]), "bound": _i64_attr(s["bound"])}) for s, _, _ in self.checks])


#: The sites of the function the running kf-lower-to-linalg is lowering (per thread).
_SITES: contextvars.ContextVar[_Sites | None] = contextvars.ContextVar("kf_index_sites", default=None)


def checked_index(op: ir.Operation, index: ir.Value, bound: int, dim: int) -> ir.Value:
    """``index`` with every element outside [0, bound) replaced by 0, and a check of it
    recorded for the function's error flag (see the module docstring)."""
    sites = _SITES.get()
    if sites is None:
        raise PassError(f"{op.name} needs its indices checked; lower it with kf-lower-to-linalg", op.location)
    i64 = ir.IntegerType.get_signless(64)
    shape, t = _shape(index), ir.RankedTensorType(index.type).element_type
    rank = len(shape)

    def lowest_highest(a):
        v = sm.convert(a[0], i64) if t != i64 else a[0]
        return [arith.minsi(v, a[1]), arith.maxsi(v, a[2])]

    inits = [linalg.fill(arith.constant(i64, ext), outs=[empty([], i64)]) for ext in (2 ** 63 - 1, -2 ** 63)]
    lo, hi = generic([index], inits, [_identity(rank), _projection(rank, []), _projection(rank, [])],
                     ["reduction"] * rank, lowest_highest)
    lo, hi = tensor.extract(lo, []), tensor.extract(hi, [])
    below = arith.cmpi(arith.CmpIPredicate.slt, lo, arith.constant(i64, 0))
    above = arith.cmpi(arith.CmpIPredicate.sge, hi, arith.constant(i64, bound))
    where = re.search(r'loc\("([^"]+)":(\d+)', str(op.location))
    site = {"op": op.name, "where": f"{where.group(1)}:{where.group(2)}" if where else "", "dim": dim,
            "bound": bound}
    sites.checks.append((site, arith.ori(below, above), arith.select(below, lo, hi)))

    def clamp(a):
        bad = arith.cmpi(arith.CmpIPredicate.uge, a[0], arith.constant(t, bound))
        return arith.select(bad, arith.constant(t, 0), a[0])

    return map_elements([index], shape, t, clamp, maps=[_identity(rank)])


def _gather(op, args, attrs, out):
    x, index = args
    rank = len(_shape(x))
    dim = normalize_dim(int(attrs["dim"]), rank)
    bound = _shape(x)[dim]
    index = checked_index(op, index, bound, dim)
    if bound == 0:  # no index is valid: the flag is set, nothing may be read
        return [filled(out[0].shape, out[0].elem, 0.0)]

    def fn(a):
        coords = [_as_index(a[0]) if d == dim else _loop_index(d) for d in range(rank)]
        return tensor.extract(x, coords)

    return [map_elements([index], out[0].shape, out[0].elem, fn, maps=[_identity(rank)])]


def _index_select(op, args, attrs, out):
    x, index = args
    rank = len(_shape(x))
    dim = normalize_dim(int(attrs["dim"]), rank)
    bound = _shape(x)[dim]
    index = checked_index(op, index, bound, dim)
    if bound == 0:
        return [filled(out[0].shape, out[0].elem, 0.0)]

    def fn(a):
        coords = [_as_index(a[0]) if d == dim else _loop_index(d) for d in range(rank)]
        return tensor.extract(x, coords)

    return [map_elements([index], out[0].shape, out[0].elem, fn, maps=[_projection(rank, [dim])])]


def _add_scalars(a: ir.Value, b: ir.Value) -> ir.Value:
    return sm.convert(sm.emit("add", [_widen(a), _widen(b)]), a.type)


def _index_add(op, args, attrs, out):
    x, index, src = args
    shape = _shape(x)
    rank = len(shape)
    dim = normalize_dim(int(attrs["dim"]), rank)
    row = [1 if d == dim else shape[d] for d in range(rank)]
    index = checked_index(op, index, shape[dim], dim)
    if shape[dim] == 0:
        return [x]

    def step(i, carried):
        (acc,) = carried
        j = _as_index(tensor.extract(index, [i]))
        at_i = [i if d == dim else 0 for d in range(rank)]
        at_j = [j if d == dim else 0 for d in range(rank)]
        summed = map_elements([extract_slice(acc, at_j, row), extract_slice(src, at_i, row)], row, _elem(x),
                              lambda a: _add_scalars(a[0], a[1]))
        return [insert_slice(summed, acc, at_j, row)]

    return for_loop(0, _shape(index)[0], [x], step)


def _scatter_add(op, args, attrs, out):
    x, index, src = args
    ishape = _shape(index)
    rank = len(ishape)
    dim = normalize_dim(int(attrs["dim"]), rank)
    index = checked_index(op, index, _shape(x)[dim], dim)
    if _shape(x)[dim] == 0:
        return [x]

    def nest(depth: int, coords: list[ir.Value], acc: ir.Value) -> ir.Value:
        if depth == rank:
            target = [_as_index(tensor.extract(index, coords)) if d == dim else coords[d] for d in range(rank)]
            value = _add_scalars(tensor.extract(acc, target), tensor.extract(src, coords))
            return tensor.insert(value, acc, target)
        return for_loop(0, ishape[depth], [acc], lambda i, c: [nest(depth + 1, coords + [i], c[0])])[0]

    return [nest(0, [], x)]


def _constant(op, args, attrs, out):
    value = attrs["value"]
    if out[0].elem != "i1":
        return [arith.constant(_tensor_type(out[0].shape, out[0].elem), value)]
    # Booleans become bytes in memory (see kf-to-cpu), so a bool constant is an i8
    # constant compared with zero; that compare fuses into the constant's users.
    dense = ir.DenseIntElementsAttr(value)
    if dense.is_splat:
        return [filled(out[0].shape, "i1", float(dense[0] != 0))]
    i8 = ir.IntegerType.get_signless(8)
    data = array.array("b", [int(dense[i] != 0) for i in range(len(dense))])
    c = arith.constant(_tensor_type(out[0].shape, i8), ir.DenseElementsAttr.get(data, type=i8, shape=list(out[0].shape)))
    i1 = _type("i1")
    rank = len(out[0].shape)
    return [map_elements([c], out[0].shape, i1, lambda a: sm.convert(a[0], i1), maps=[_identity(rank)])]


def _fill(op, args, attrs, out):
    value = float(attrs["value"])
    if out[0].elem == "i1":
        value = float(value != 0)
    elif not out[0].is_float:
        value = float(int(value))
    return [filled(out[0].shape, out[0].elem, value)]


def _rand(op, args, attrs, out):
    """A parallel generic whose element at linear index i is its sample of Philox block
    offset + i // n (passes/philox.py); the state's two words are read once, outside it."""
    (state,) = args
    shape = out[0].shape
    rank = len(shape)
    seed, offset = (tensor.extract(state, [_index(k)]) for k in (0, 1))

    def body(a):
        lin = _loop_index(0) if shape else _index(0)
        for d in range(1, rank):
            lin = arith.addi(arith.muli(lin, _index(shape[d])), _loop_index(d))
        return [philox.sample(seed, offset, int(attrs["offset"]), lin, attrs["distribution"])]

    return generic([], [empty(shape, "f32")], [_identity(rank)], ["parallel"] * rank, body)


Lowering = Callable[[ir.Operation, list[ir.Value], dict, list[TensorSpec]], list[ir.Value]]

LOWERINGS: dict[str, Lowering] = {
    **{f"kf.{n}": _elementwise for n in (
        "add", "sub", "mul", "div", "pow", "max", "min", "neg", "abs", "exp", "log", "sqrt", "rsqrt",
        "reciprocal", "tanh", "erf", "sigmoid", "relu", "gelu", "cmp", "select", "masked_fill", "cast")},
    "kf.sum": _sum_like, "kf.mean": _sum_like, "kf.reduce_max": _sum_like, "kf.reduce_min": _sum_like,
    "kf.var": _var, "kf.logsumexp": _logsumexp, "kf.argmax": _argmax, "kf.softmax": _softmax, "kf.log_softmax": _softmax,
    "kf.matmul": _matmul, "kf.transpose": _transpose, "kf.reshape": _reshape, "kf.broadcast_to": _broadcast_to,
    "kf.slice": _slice, "kf.concat": _concat, "kf.topk": _topk, "kf.gather": _gather,
    "kf.index_select": _index_select, "kf.index_add": _index_add, "kf.scatter_add": _scatter_add,
    "kf.constant": _constant, "kf.fill": _fill, "kf.rand": _rand,
}


#: the elementwise kf ops: a bf16/f16 result that only they use stays f32 between them
ELEMENTWISE = frozenset(name for name, lowering in LOWERINGS.items() if lowering is _elementwise)


def keeps_wide(op: ir.Operation) -> bool:
    """Whether op's low-precision float result is left unrounded (an f32 tensor): op is
    elementwise and every user is too, so the value is rounded once, where a user that is
    not elementwise (or the function's return) reads it. This is the GPU strategies' policy
    (values stay in f32 within a fused kernel and round at the store) and torch's own for
    one op (its CPU kernels compute bf16/f16 in f32)."""
    if op.name not in ELEMENTWISE or len(op.results) != 1:
        return False
    result = op.results[0]
    if spec_of(result.type).elem not in _NARROW_FLOATS or op.name == "kf.cmp":
        return False
    uses = list(result.uses)
    return bool(uses) and all(u.owner.name in ELEMENTWISE for u in uses)


def lower_op(op: ir.Operation, wide: bool = False) -> None:
    """Replace one kf op by its linalg-on-tensors lowering (with ``wide``, an elementwise
    op's low-precision result as an f32 tensor: see keeps_wide)."""
    lowering = LOWERINGS.get(op.name)
    if lowering is None:
        raise PassError(f"no lowering to linalg for '{op.name}'", op.location)
    if op.name == "kf.div" and not all(spec_of(v.type).is_float for v in op.operands):
        raise PassError("kf.div needs floating-point operands", op.location)
    out = [spec_of(r.type) for r in op.results]
    with ir.InsertionPoint(op), op.location:
        try:
            if wide:
                values = _elementwise(op, list(op.operands), op_attrs(op), out, wide=True)
            else:
                values = lowering(op, list(op.operands), op_attrs(op), out)
        except ValueError as e:  # scalar_math's refusals: arithmetic it does not define
            raise PassError(f"cannot lower {op.name}: {e}", op.location) from None
    for result, value in zip(op.results, values):
        if value.type != result.type and not wide:
            raise PassError(f"lowering of {op.name} produced {value.type}, expected {result.type}", op.location)
        result.replace_all_uses_with(value)
    op.erase()


# --------------------------------------------------------------------------- torch-mlir's functions

#: ops whose bf16/f16 results and region arguments may simply become f32: arithmetic, math,
#: structure and data movement, none of whose meaning depends on the float width
_RETYPED_OPS = frozenset({
    "arith.addf", "arith.subf", "arith.mulf", "arith.divf", "arith.remf", "arith.negf", "arith.maximumf",
    "arith.minimumf", "arith.maxnumf", "arith.minnumf", "arith.select", "arith.cmpf", "arith.fptosi",
    "arith.fptoui", "linalg.generic", "linalg.yield", "linalg.index", "tensor.empty", "tensor.extract",
    "tensor.insert", "tensor.extract_slice", "tensor.insert_slice", "tensor.collapse_shape",
    "tensor.expand_shape", "tensor.cast", "tensor.pad", "tensor.concat", "tensor.from_elements",
    "tensor.splat", "tensor.reshape", "tensor.yield", "scf.for", "scf.if", "scf.yield", "scf.while",
    "scf.condition"})
_NARROW_FLOATS = ("bf16", "f16")


def _narrow(t: ir.Type) -> bool:
    elem = ir.ShapedType(t).element_type if isinstance(t, ir.ShapedType) else t
    return str(elem) in _NARROW_FLOATS


def _widened_type(t: ir.Type) -> ir.Type:
    f32 = ir.F32Type.get()
    if isinstance(t, ir.RankedTensorType):
        return ir.RankedTensorType.get(t.shape, f32, t.encoding)
    return f32


def _convert_value(v: ir.Value, to: ir.Type) -> ir.Value:
    """v (a scalar or a ranked tensor) with its elements converted to to's element type."""
    if isinstance(to, ir.RankedTensorType):
        return map_elements([v], _shape(v), to.element_type, lambda a: sm.convert(a[0], to.element_type))
    return sm.convert(v, to)


def compute_in_f32(func_op: ir.Operation) -> None:
    """Make a torch-mlir function of one ATen op compute bf16/f16 in f32 and round once,
    where it returns, as torch's CPU kernels do (bf16/f16 math and accumulation in float).

    torch-mlir lowers an op on bf16 tensors to linalg on bf16: every add of a sum rounds to
    bf16 (avg_pool2d, sum_to_size, bilinear's contractions), expm1 is computed in bf16.
    Here named linalg ops become generics, and every value of bf16/f16 type (scalars and
    tensors: results, region arguments, constants) becomes f32 where its op's meaning does
    not depend on the width (``_RETYPED_OPS``); the function's arguments are extended at
    its entry and its results rounded at its return; an op outside that list (a bitcast,
    an int-to-float conversion, an explicit truncf) keeps its narrow type and is converted
    at its edges, so the roundings torch-mlir asks for stay."""
    _run_on(func_op, "func.func(linalg-generalize-named-ops)")
    entry = func_op.regions[0].blocks[0]
    original: dict = {}  # widened value -> its narrow type

    def widen_in_place(v: ir.Value) -> None:
        if _narrow(v.type):
            original[v] = v.type
            v.set_type(_widened_type(v.type))

    def extend_after(v: ir.Value, ip: ir.InsertionPoint) -> None:
        with ip:
            wide = _convert_value(v, _widened_type(v.type))
        v.replace_all_uses_except(wide, _generic_of(wide))
        original[wide] = v.type

    with func_op.context, func_op.location:
        ops = _ops_of(entry)  # before any conversion is inserted: those are not revisited
        for a in list(entry.arguments):
            if _narrow(a.type):
                extend_after(a, ir.InsertionPoint.at_block_begin(entry))
        for op in ops:
            name = op.name
            with op.location:
                if name == "arith.constant" and _narrow(op.results[0].type):
                    _widen_constant(op, original)
                    continue
                if name == "arith.extf" and op.operands[0] in original:
                    if str(op.results[0].type) == "f32":
                        op.results[0].replace_all_uses_with(op.operands[0])
                        op.erase()
                    continue
                if name in _RETYPED_OPS or name.startswith("math."):
                    for r in op.results:
                        widen_in_place(r)
                    for region in op.regions:
                        for block in region.blocks:
                            for a in block.arguments:
                                widen_in_place(a)
                    continue
                # kept as it is: narrow operands rounded back before it, narrow results extended after it
                for i, v in enumerate(list(op.operands)):
                    if v in original:
                        with ir.InsertionPoint(op):
                            op.operands[i] = _convert_value(v, original[v])
                for r in op.results:
                    if _narrow(r.type) and list(r.uses):
                        extend_after(r, ir.InsertionPoint.after(op))


def _generic_of(v: ir.Value) -> ir.Operation:
    """The op that made v (the conversion whose own use of the converted value stays)."""
    owner = v.owner
    return getattr(owner, "operation", owner)


def _widen_constant(op: ir.Operation, original: dict) -> None:
    """A bf16/f16 constant as the f32 constant of the same values (each is exactly an f32)."""
    result = op.results[0]
    narrow_t = result.type
    attr = op.attributes["value"]
    wide_t = _widened_type(narrow_t)
    with ir.InsertionPoint(op):
        if isinstance(attr, ir.FloatAttr):
            new = arith.constant(wide_t, ir.FloatAttr.get(wide_t, attr.value))
        elif isinstance(attr, ir.DenseElementsAttr) and attr.is_splat:
            value = ir.FloatAttr(attr.get_splat_value()).value
            new = arith.constant(wide_t, ir.DenseElementsAttr.get_splat(wide_t, ir.FloatAttr.get(ir.F32Type.get(),
                                                                                              value)))
        else:  # a dense constant of many values: converted where it stands
            new = None
    if new is None:
        with ir.InsertionPoint.after(op):
            new = _convert_value(result, wide_t)
        result.replace_all_uses_except(new, _generic_of(new))
    else:
        result.replace_all_uses_with(new)
        op.erase()
    original[new] = narrow_t


def _ops_of(block: ir.Block) -> list[ir.Operation]:
    """Every op in block and the regions under it, parents before children (a snapshot)."""
    out = []
    for op in block.operations:
        out.append(op.operation)
        for region in op.operation.regions:
            for b in region.blocks:
                out.extend(_ops_of(b))
    return out


def _run_on(op: ir.Operation, pipeline: str) -> None:
    from mlir.passmanager import PassManager

    PassManager.parse(pipeline, context=op.context).run(op)


@dataclasses.dataclass(frozen=True)
class LowerToLinalgPass(KfPass):
    NAME = "kf-lower-to-linalg"
    DESCRIPTION = "rewrite kf ops into linalg/tensor/arith/math/scf on tensors"

    def run(self, module: ir.Operation) -> None:
        ops: list[ir.Operation] = []

        def visit(op):
            if op.name.startswith("kf."):
                ops.append(op.operation)
            return ir.WalkResult.ADVANCE

        module.walk(visit)
        for op in module.regions[0].blocks[0].operations:
            op = op.operation
            if op.name == "func.func" and "kf.aten" in op.attributes:
                compute_in_f32(op)
        # Decided before any op is lowered (lowering replaces the users' operands).
        wide = {id(op) for op in ops if keeps_wide(op)}
        # Producers before users is the walk's order; each op's operands are already
        # lowered values (or block arguments) when its turn comes.
        by_function: dict = {}
        for op in ops:
            by_function.setdefault(_function_of(op), []).append(op)
        for f, members in by_function.items():
            sites = _Sites()
            token = _SITES.set(sites)
            try:
                for op in members:
                    lower_op(op, wide=id(op) in wide)
            finally:
                _SITES.reset(token)
            if sites.checks:
                if f is None or f.name != "func.func":
                    raise PassError("index checks need the indexing op inside a func.func", members[0].location)
                sites.finish(f)


def _function_of(op: ir.Operation) -> ir.Operation | None:
    """The func.func (or other top-level op) that holds op."""
    parent = op.parent
    while parent is not None and parent.name not in ("func.func", "builtin.module"):
        parent = parent.parent
    return parent
