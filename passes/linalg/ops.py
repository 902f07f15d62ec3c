"""How each kf op is lowered (``lower_op``, the table ``LOWERINGS``), and which bf16/f16
results stay f32 tensors (``keeps_wide``)."""

from __future__ import annotations

import array
import math
from typing import Callable

from mlir import ir
from mlir.dialects import arith, linalg, tensor

from kf.dialects.attrs import SIZES_FROM, op_attrs, sizes_from
from kf.dialects.ops import slice_bounds
from kf.dialects.types import DYN, TensorSpec, normalize_dim, spec_of

from .. import philox
from .. import scalar_math as sm
from ..base import PassError
from .build import (DynamicSizeError, arg_best, compute_elem, convert_tensor, count, dim, elem_of, elem_type, empty,
                    expand_keepdim, extract_slice, filled, finish_reduction, for_loop, generic, identity_map,
                    index_const, insert_slice, loop_index, map_elements, max_value, min_value, projection_map,
                    reduce, reduced_dims, reshape, scalar, shape_of, sizes_of, sizes_or_dims, tensor_type,
                    widen_value)
from .build import dim as size_of_dim
from .index_checks import as_index, checked_index
from .narrow import NARROW_FLOATS


def _elementwise(op: ir.Operation, args: list[ir.Value], attrs: dict, out: list[TensorSpec],
                 wide: bool = False) -> list[ir.Value]:
    """One elementwise kf op. Its operands may be tensors of their compute type (f32 for a
    bf16/f16 value another elementwise op left unrounded); with ``wide`` its result is one
    too: the f32 value before rounding (a cast still rounds to its target type)."""
    name = op.name
    t = elem_type(out[0].elem)
    store = elem_type(compute_elem(out[0].elem)) if wide else t
    # select/masked_fill only move values: no widening (no rounding at all) unless their
    # operands are of two types (one of them left unrounded)
    moves = name in ("kf.select", "kf.masked_fill")
    values = args[1:] if name == "kf.select" else args[:1]
    widen = not moves or wide or any(elem_of(v) != out[0].elem for v in values)

    def fn(a):
        scalars = [widen_value(s) for s in a] if widen else a
        if name == "kf.cast":
            return sm.convert(sm.convert(a[0], t, unsigned=attrs.get(UNSIGNED_SOURCE, False)), store)
        if moves and widen:
            return sm.convert(sm.emit(name, scalars, attrs), store)
        return sm.convert(sm.emit(name, scalars, attrs, stored_as=t), store)

    return [map_elements(args, out[0].shape, store, fn)]


def _sum_like(op, args, attrs, out):
    (x,) = args
    red = reduced_dims(len(shape_of(x)), attrs.get("dims", []))
    acc_elem = compute_elem(out[0].elem)
    acc_t = elem_type(acc_elem)
    name = op.name
    if name == "kf.sum" and out[0].elem == "i1":
        raise PassError("kf.sum of booleans needs an integer result type (torch counts them in i64)",
                        op.location)
    if name in ("kf.sum", "kf.mean"):
        s = reduce(x, red, acc_elem, 0, lambda a, acc: sm.emit("add", [sm.convert(a[0], acc_t), acc]))
        n = count(x, red, acc_t) if name == "kf.mean" else None
        fn = (lambda v: arith.divf(v, scalar(n, acc_t))) if name == "kf.mean" else None
        return [finish_reduction(s, fn, out[0], red)]
    largest = name == "kf.reduce_max"
    init = min_value(acc_elem) if largest else max_value(acc_elem)
    s = reduce(x, red, acc_elem, init, lambda a, acc: sm.emit("max" if largest else "min", [widen_value(a[0]), acc]))
    return [finish_reduction(s, None, out[0], red)]


def _var(op, args, attrs, out):
    (x,) = args
    red = reduced_dims(len(shape_of(x)), attrs.get("dims", []))
    acc_elem = compute_elem(out[0].elem)
    acc_t = elem_type(acc_elem)
    n = count(x, red, acc_t)
    # Two passes (mean, then squared deviations) rather than E[x²] - E[x]²: the one-pass
    # formula loses all precision when the mean is large relative to the spread.
    total = reduce(x, red, acc_elem, 0, lambda a, acc: arith.addf(widen_value(a[0]), acc))
    mean = map_elements([total], shape_of(total), acc_t, lambda a: arith.divf(a[0], scalar(n, acc_t)))

    def sq(a, acc):
        d = arith.subf(widen_value(a[0]), a[1])
        return arith.addf(acc, arith.mulf(d, d))

    m2 = reduce(x, red, acc_elem, 0, sq, extra=[mean])
    corr = float(attrs.get("correction", 1.0))
    if any(shape_of(x)[d] == DYN for d in red):
        # a run-time size is at least 2 (compiler/dynamic.py): n - correction > 0 for
        # corrections up to 1; a larger one may leave no degrees of freedom
        if corr > 1:
            raise DynamicSizeError(f"a variance with correction {corr} over a run-time size")
        return [finish_reduction(m2, lambda v: arith.divf(v, arith.subf(n, sm.const(acc_t, corr))), out[0], red)]
    n = math.prod(shape_of(x)[d] for d in red)
    return [finish_reduction(m2, lambda v: sm.variance(v, n, corr), out[0], red)]


def _logsumexp(op, args, attrs, out):
    """max + log(sum(exp(x - max))): the sum never overflows. A row whose max is +-inf
    shifts by 0 instead (torch.logsumexp's rule): an all -inf row gives -inf, not NaN."""
    (x,) = args
    red = reduced_dims(len(shape_of(x)), attrs.get("dims", []))
    acc_elem = compute_elem(out[0].elem)
    acc_t = elem_type(acc_elem)
    mx = reduce(x, red, acc_elem, -math.inf, lambda a, acc: arith.maximumf(widen_value(a[0]), acc))

    def finite(a):
        inf = arith.cmpf(arith.CmpFPredicate.OEQ, sm.emit("abs", [a[0]]), sm.const(acc_t, math.inf))
        return arith.select(inf, sm.const(acc_t, 0.0), a[0])

    shift = map_elements([mx], shape_of(mx), acc_t, finite)
    total = reduce(x, red, acc_elem, 0,
                   lambda a, acc: arith.addf(acc, sm.emit("exp", [arith.subf(widen_value(a[0]), a[1])])), extra=[shift])
    lse = map_elements([total, shift], shape_of(total), acc_t, lambda a: arith.addf(sm.emit("log", [a[0]]), a[1]))
    return [finish_reduction(lse, None, out[0], red)]


def _argmax(op, args, attrs, out):
    (x,) = args
    rank = len(shape_of(x))
    if rank == 0:
        return [filled(out[0].shape, "i64", 0)]
    dim = normalize_dim(int(attrs["dim"]), rank)
    _, idx = arg_best(x, dim, largest=True)
    return [expand_keepdim(idx, out[0].shape, [dim])]


def _softmax(op, args, attrs, out):
    (x,) = args
    shape = shape_of(x)
    rank = len(shape)
    t = elem_type(out[0].elem)
    if rank == 0:
        # one element: x - max is x - x, 0 for a finite x and NaN for +-inf or NaN (as in
        # torch: a fully masked row of masked.softmax is NaN), so neither is a constant
        def one(a):
            shifted = arith.subf(widen_value(a[0]), widen_value(a[0]))
            return sm.convert(shifted if op.name == "kf.log_softmax" else sm.emit("exp", [shifted]), t)
        return [map_elements([x], (), t, one)]
    dim = normalize_dim(int(attrs["dim"]), rank)
    acc_elem = compute_elem(out[0].elem)
    kept = [d for d in range(rank) if d != dim]
    proj = projection_map(rank, kept)
    mx = reduce(x, [dim], acc_elem, -math.inf, lambda a, acc: arith.maximumf(widen_value(a[0]), acc))
    total = reduce(x, [dim], acc_elem, 0,
                   lambda a, acc: arith.addf(acc, sm.emit("exp", [arith.subf(widen_value(a[0]), a[1])])), extra=[mx])
    if op.name == "kf.softmax":
        def fn(a):
            return sm.convert(arith.divf(sm.emit("exp", [arith.subf(widen_value(a[0]), a[1])]), a[2]), t)
    else:
        def fn(a):
            return sm.convert(arith.subf(arith.subf(widen_value(a[0]), a[1]), sm.emit("log", [a[2]])), t)
    return [map_elements([x, mx, total], shape, t, fn, maps=[identity_map(rank), proj, proj])]


def _matmul(op, args, attrs, out):
    a, b = args
    sa, sb, so = shape_of(a), shape_of(b), out[0].shape
    acc_elem = compute_elem(out[0].elem)
    # fp8 operands (torch._scaled_mm, precision="fp8") are widened to the accumulator
    # type first: the CPU has no fp8 arithmetic, and linalg's contraction lowering takes
    # no fp8 extension in its body. That costs one f32 copy of each operand.
    a, b = (map_elements([v], shape_of(v), acc_elem, lambda x: widen_value(x[0]))
            if ir.RankedTensorType(v.type).element_type != elem_type(acc_elem) and
            str(ir.RankedTensorType(v.type).element_type).startswith("f8") else v for v in (a, b))
    acc = filled(so, acc_elem, 0, _matmul_sizes(a, b, so))
    if len(sa) == 2 and len(sb) == 2:
        r = linalg.matmul(a, b, outs=[acc])
    elif len(sa) == 3 and len(sb) == 3 and sa[0] == sb[0]:
        r = linalg.batch_matmul(a, b, outs=[acc])
    else:
        r = _batched_contraction(a, b, acc)
    return [finish_reduction(r, None, out[0])]


def _matmul_sizes(a: ir.Value, b: ir.Value, so) -> dict:
    """The run-time sizes of a matmul's result: batch dims from the operand that has them
    at run time, rows from a, columns from b."""
    sa, sb, r = shape_of(a), shape_of(b), len(so)
    sizes = {}
    for i in range(r - 2):
        for v, s in ((a, sa), (b, sb)):
            j = i - (r - len(s))
            if j >= 0 and s[j] == DYN and i not in sizes:
                sizes[i] = dim(v, j)
    if sa[-2] == DYN:
        sizes[r - 2] = dim(a, len(sa) - 2)
    if sb[-1] == DYN:
        sizes[r - 1] = dim(b, len(sb) - 1)
    return sizes


def _batched_contraction(a: ir.Value, b: ir.Value, acc: ir.Value) -> ir.Value:
    """out[B, m, n] += a[B', m, k] * b[B'', k, n] where B', B'' broadcast to B."""
    so = shape_of(acc)
    nb = len(so) - 2
    rank = nb + 3  # batch dims, m, n, k
    m, n, k = (ir.AffineDimExpr.get(nb + i) for i in range(3))

    def operand_map(shape, last_two):
        lead = nb - (len(shape) - 2)
        exprs = [ir.AffineConstantExpr.get(0) if size == 1 and so[lead + i] != 1 else ir.AffineDimExpr.get(lead + i)
                 for i, size in enumerate(shape[:-2])]
        return ir.AffineMap.get(rank, 0, exprs + list(last_two))

    batch = [ir.AffineDimExpr.get(i) for i in range(nb)]
    maps = [operand_map(shape_of(a), (m, k)), operand_map(shape_of(b), (k, n)), ir.AffineMap.get(rank, 0, batch + [m, n])]
    acc_t = ir.RankedTensorType(acc.type).element_type

    def body(s):
        x, y = sm.convert(s[0], acc_t), sm.convert(s[1], acc_t)
        return [sm.emit("add", [s[2], sm.emit("mul", [x, y])])]

    return generic([a, b], [acc], maps, ["parallel"] * (nb + 2) + ["reduction"], body)[0]


def _scan(op, args, attrs, out):
    """An scf.for along dim carrying the running row (in the compute type) and the
    result: each step combines the row with the next slice of x and inserts it rounded."""
    (x,) = args
    shape = shape_of(x)
    rank = len(shape)
    axis = normalize_dim(int(attrs["dim"]), rank)
    kind = attrs["kind"]
    elem = compute_elem(out[0].elem)
    ct, t = elem_type(elem), elem_type(out[0].elem)
    row = [1 if d == axis else shape[d] for d in range(rank)]
    # run-time sizes: the row's other dims are x's, the loop runs to x's size along dim
    row_sizes = [1 if d == axis else n for d, n in enumerate(sizes_or_dims(x))]
    kept = sizes_of(x, [-1 if d == axis else d for d in range(rank)])
    start = {"sum": 0.0, "prod": 1.0, "max": min_value(elem), "min": max_value(elem), "logsumexp": -math.inf}[kind]

    def step(i, carried):
        acc, result = carried
        offsets = [i if d == axis else 0 for d in range(rank)]
        # the running row is updated in place (the generic's init), so that the loop
        # carries one buffer after bufferization
        (acc,) = generic([extract_slice(x, offsets, row_sizes, result_shape=row)], [acc], [identity_map(rank)] * 2,
                         ["parallel"] * rank, lambda a: [sm.scan_step(kind, a[1], sm.convert(a[0], ct))])
        rounded = map_elements([acc], row, t, lambda a: sm.convert(a[0], t))
        return [acc, insert_slice(rounded, result, offsets, row_sizes)]

    n = shape[axis] if shape[axis] != DYN else dim(x, axis)
    return [for_loop(0, n, [filled(row, ct, start, kept), empty(out[0].shape, t, sizes_of(x, list(range(rank))))],
                     step)[1]]


def _one_result(built) -> ir.Value:
    """The single result of what a bindings helper returned (an op, a list or a value)."""
    if isinstance(built, ir.Value):
        return built
    results = built.results if hasattr(built, "results") else built
    return results[0]


def _transpose(op, args, attrs, out):
    init = empty(out[0].shape, out[0].elem, sizes_of(args[0], [int(p) for p in attrs["perm"]]))
    return [_one_result(linalg.transpose(args[0], outs=[init], permutation=[int(p) for p in attrs["perm"]]))]


def _reshape(op, args, attrs, out):
    return [reshape(args[0], out[0].shape)]


def _broadcast_to(op, args, attrs, out):
    return [map_elements(args, out[0].shape, out[0].elem, lambda a: a[0])]


def _slice(op, args, attrs, out):
    """tensor.extract_slice; along a run-time dim a bound counted from its end
    (dialects.ops.slice_bounds) is an offset from the dim's run-time size, and a result
    of run-time length is ceil((end - start) / step) at run time."""
    (x,) = args
    rank = len(shape_of(x))
    axis = normalize_dim(int(attrs["dim"]), rank)
    start, end, step = int(attrs["start"]), int(attrs["end"]), int(attrs.get("step", 1))
    offsets, strides = [0] * rank, [1] * rank
    strides[axis] = step
    # the other dims are x's whole dims: a run-time one has x's run-time size
    sizes = sizes_or_dims(x)
    if shape_of(x)[axis] == DYN:
        n = sizes[axis]  # its tensor.dim
        lo, _ = slice_bounds(start, end, None)
        offsets[axis] = lo if lo is not None else arith.addi(n, index_const(start))
        sizes[axis] = out[0].shape[axis]
        if sizes[axis] == DYN:  # from a start to an end counted from the end: (n + end - start) / step
            length = arith.addi(n, index_const(end - lo + step - 1))
            sizes[axis] = length if step == 1 else arith.divui(length, index_const(step))
    else:
        offsets[axis] = start
        sizes[axis] = out[0].shape[axis]
    return [extract_slice(x, offsets, sizes, strides, result_shape=out[0].shape)]


def _concat(op, args, attrs, out):
    """Each operand inserted at its offset along dim: a number, or where an operand before
    it has a run-time size there (a cache grown by a step: ``torch.cat([past, new], 2)``)
    the sum of their sizes at run time."""
    rank = len(out[0].shape)
    axis = normalize_dim(int(attrs["dim"]), rank)
    sizes = sizes_of(args[0], list(range(rank)))
    if out[0].shape[axis] == DYN:
        total = index_const(0)
        for v in args:
            total = arith.addi(total, dim(v, axis))
        sizes[axis] = total
    result, at = empty(out[0].shape, out[0].elem, sizes), 0
    for v in args:
        offsets = [0] * rank
        offsets[axis] = at
        result = insert_slice(v, result, offsets, sizes_or_dims(v))
        n = shape_of(v)[axis]
        if isinstance(at, int) and n != DYN:
            at += n
        else:
            at = arith.addi(at if not isinstance(at, int) else index_const(at), dim(v, axis))
    return [result]


def _topk(op, args, attrs, out):
    (x,) = args
    shape = shape_of(x)
    rank = len(shape)
    dim = normalize_dim(int(attrs["dim"]), rank)
    k, largest = int(attrs["k"]), bool(attrs.get("largest", True))
    kept = [d for d in range(rank) if d != dim]
    row = [1 if d == dim else (tensor.dim(x, index_const(d)) if shape[d] == DYN else shape[d]) for d in range(rank)]
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
            here = arith.cmpi(arith.CmpIPredicate.eq, arith.index_cast(i64, loop_index(dim)), a[0])
            return [arith.ori(a[1], here)]

        # The mask is updated in place (it is the generic's init), so that the loop
        # carries one buffer after bufferization instead of a new one per iteration.
        (taken,) = generic([best_i], [taken], [projection_map(rank, kept), identity_map(rank)], ["parallel"] * rank, mark)
        return [vals, idxs, taken]

    # the results' run-time dims are x's (the top-k dim is k)
    sizes = sizes_of(x, [-1 if d == dim else d for d in range(rank)])
    init = [empty(out[0].shape, out[0].elem, sizes), empty(out[1].shape, "i64", sizes),
            filled(shape, i1, 0, sizes_of(x, range(rank)))]
    vals, idxs, _ = for_loop(0, k, init, step)
    return [vals, idxs]


def _gather(op, args, attrs, out):
    x, index = args
    rank = len(shape_of(x))
    dim = normalize_dim(int(attrs["dim"]), rank)
    bound = shape_of(x)[dim]
    index = checked_index(op, index, bound, dim)
    if bound == 0:  # no index is valid: the flag is set, nothing may be read
        return [filled(out[0].shape, out[0].elem, 0.0)]

    def fn(a):
        coords = [as_index(a[0]) if d == dim else loop_index(d) for d in range(rank)]
        return tensor.extract(x, coords)

    return [map_elements([index], out[0].shape, out[0].elem, fn, maps=[identity_map(rank)])]


def _index_select(op, args, attrs, out):
    x, index = args
    rank = len(shape_of(x))
    dim = normalize_dim(int(attrs["dim"]), rank)
    bound = shape_of(x)[dim]
    index = checked_index(op, index, bound, dim)
    if bound == 0:
        return [filled(out[0].shape, out[0].elem, 0.0)]

    def fn(a):
        coords = [as_index(a[0]) if d == dim else loop_index(d) for d in range(rank)]
        return tensor.extract(x, coords)

    return [map_elements([index], out[0].shape, out[0].elem, fn, maps=[projection_map(rank, [dim])])]


def _add_scalars(a: ir.Value, b: ir.Value) -> ir.Value:
    return sm.convert(sm.emit("add", [widen_value(a), widen_value(b)]), a.type)


def _index_add(op, args, attrs, out):
    x, index, src = args
    shape = shape_of(x)
    rank = len(shape)
    dim = normalize_dim(int(attrs["dim"]), rank)
    row = [1 if d == dim else shape[d] for d in range(rank)]
    index = checked_index(op, index, shape[dim], dim)
    if shape[dim] == 0:
        return [x]

    def step(i, carried):
        (acc,) = carried
        j = as_index(tensor.extract(index, [i]))
        at_i = [i if d == dim else 0 for d in range(rank)]
        at_j = [j if d == dim else 0 for d in range(rank)]
        summed = map_elements([extract_slice(acc, at_j, row), extract_slice(src, at_i, row)], row, elem_of(x),
                              lambda a: _add_scalars(a[0], a[1]))
        return [insert_slice(summed, acc, at_j, row)]

    return for_loop(0, size_of_dim(index, 0), [x], step)


def _scatter_add(op, args, attrs, out):
    x, index, src = args
    ishape = shape_of(index)
    rank = len(ishape)
    dim = normalize_dim(int(attrs["dim"]), rank)
    index = checked_index(op, index, shape_of(x)[dim], dim)
    if shape_of(x)[dim] == 0:
        return [x]

    def nest(depth: int, coords: list[ir.Value], acc: ir.Value) -> ir.Value:
        if depth == rank:
            target = [as_index(tensor.extract(index, coords)) if d == dim else coords[d] for d in range(rank)]
            value = _add_scalars(tensor.extract(acc, target), tensor.extract(src, coords))
            return tensor.insert(value, acc, target)
        return for_loop(0, size_of_dim(index, depth), [acc], lambda i, c: [nest(depth + 1, coords + [i], c[0])])[0]

    return [nest(0, [], x)]


def _scatter_reduce(op, args, attrs, out):
    """Loops over the index's positions carrying the result (in the compute type) and,
    where it matters (mean, or without include_self), how many sources landed on each
    element; the first source to land replaces the input's element unless include_self."""
    x, index, src = args
    ishape = shape_of(index)
    rank = len(ishape)
    dim = normalize_dim(int(attrs["dim"]), rank)
    reduce, include = attrs["reduce"], bool(attrs["include_self"])
    index = checked_index(op, index, shape_of(x)[dim], dim)
    if shape_of(x)[dim] == 0:
        return [x]
    elem = compute_elem(out[0].elem)
    ct, i64 = elem_type(elem), ir.IntegerType.get_signless(64)
    counted = reduce == "mean" or (reduce != "none" and not include)
    acc = map_elements([x], shape_of(x), ct, lambda a: sm.convert(a[0], ct))
    count = filled(shape_of(x), i64, 1 if include else 0, sizes_of(x, range(rank)))

    def land(coords, acc, count):
        target = [as_index(tensor.extract(index, coords)) if d == dim else coords[d] for d in range(rank)]
        v = sm.convert(tensor.extract(src, coords), ct)
        cur = tensor.extract(acc, target)
        new = sm.scatter_step(reduce, cur, v)
        if not counted:
            return [tensor.insert(new, acc, target), count]
        n = tensor.extract(count, target)
        if not include:
            new = arith.select(arith.cmpi(arith.CmpIPredicate.eq, n, sm.const(i64, 0)), v, new)
        return [tensor.insert(new, acc, target), tensor.insert(arith.addi(n, sm.const(i64, 1)), count, target)]

    def nest(depth: int, coords: list, carried: list) -> list:
        if depth == rank:
            return land(coords, *carried)
        return for_loop(0, size_of_dim(index, depth), carried, lambda i, c: nest(depth + 1, coords + [i], c))

    acc, count = nest(0, [], [acc, count])
    t = elem_type(out[0].elem)
    if reduce == "mean":
        return [map_elements([acc, count], shape_of(x), t, lambda a: sm.convert(sm.scatter_mean(a[0], a[1]), t))]
    return [map_elements([acc], shape_of(x), t, lambda a: sm.convert(a[0], t))]


def _constant(op, args, attrs, out):
    value = attrs["value"]
    if out[0].elem != "i1":
        return [arith.constant(tensor_type(out[0].shape, out[0].elem), value)]
    # Booleans become bytes in memory (see kf-to-cpu), so a bool constant is an i8
    # constant compared with zero; that compare fuses into the constant's users.
    dense = ir.DenseIntElementsAttr(value)
    if dense.is_splat:
        return [filled(out[0].shape, "i1", float(dense[0] != 0))]
    i8 = ir.IntegerType.get_signless(8)
    data = array.array("b", [int(dense[i] != 0) for i in range(len(dense))])
    c = arith.constant(tensor_type(out[0].shape, i8), ir.DenseElementsAttr.get(data, type=i8, shape=list(out[0].shape)))
    i1 = elem_type("i1")
    rank = len(out[0].shape)
    return [map_elements([c], out[0].shape, i1, lambda a: sm.convert(a[0], i1), maps=[identity_map(rank)])]


def _source_sizes(op: ir.Operation, shape) -> dict[int, ir.Value] | None:
    """The run-time sizes of a result without operands, from its SIZES_FROM; None where
    it has none (every dim static)."""
    if DYN not in shape:
        return None
    pairs = sizes_from(op)
    if pairs is None:
        raise PassError(f"{op.name} takes no run-time sizes (no argument dim gives them)", op.location)
    parent = op.parent
    while parent is not None and parent.name != "func.func":
        parent = parent.parent
    if parent is None or len(pairs) != len(shape):
        raise PassError(f"{op.name}: {SIZES_FROM} does not fit its result", op.location)
    args = parent.regions[0].blocks[0].arguments
    sizes = {}
    for i, n in enumerate(shape):
        if n == DYN:
            a, d = pairs[i]
            if not 0 <= a < len(args) or not 0 <= d < spec_of(args[a].type).rank or \
                    spec_of(args[a].type).shape[d] != DYN:
                raise PassError(f"{op.name}: {SIZES_FROM} names no run-time argument dim", op.location)
            sizes[i] = dim(args[a], d)
    return sizes


def _fill(op, args, attrs, out):
    value = float(attrs["value"])
    if out[0].elem == "i1":
        value = float(value != 0)
    elif not out[0].is_float:
        value = float(int(value))
    return [filled(out[0].shape, out[0].elem, value, _source_sizes(op, out[0].shape))]


def _iota(op, args, attrs, out):
    """A parallel generic whose element is its loop index along dim."""
    shape = out[0].shape
    rank = len(shape)
    dim = int(attrs["dim"]) % rank
    t = elem_type(out[0].elem)
    return generic([], [empty(shape, out[0].elem, _source_sizes(op, shape))], [identity_map(rank)],
                   ["parallel"] * rank, lambda a: [arith.index_cast(t, loop_index(dim))])


def _rand(op, args, attrs, out):
    """A parallel generic whose element at linear index i is its sample of Philox block
    offset + i // n (passes/philox.py); the state's two words are read once, outside it."""
    (state,) = args
    shape = out[0].shape
    rank = len(shape)
    seed, offset = (tensor.extract(state, [index_const(k)]) for k in (0, 1))

    def body(a):
        lin = loop_index(0) if shape else index_const(0)
        for d in range(1, rank):
            lin = arith.addi(arith.muli(lin, index_const(shape[d])), loop_index(d))
        return [philox.sample(seed, offset, int(attrs["offset"]), lin, attrs["distribution"])]

    return generic([], [empty(shape, "f32")], [identity_map(rank)], ["parallel"] * rank, body)


Lowering = Callable[[ir.Operation, list[ir.Value], dict, list[TensorSpec]], list[ir.Value]]


LOWERINGS: dict[str, Lowering] = {
    **{f"kf.{n}": _elementwise for n in (
        "add", "sub", "mul", "div", "pow", "fmod", "max", "min", "neg", "abs", "exp", "log", "sqrt", "rsqrt",
        "reciprocal", "tanh", "erf", "erfc", "sin", "cos", "trunc", "round", "signbit", "sigmoid", "relu", "gelu", "cmp", "bitwise", "select", "masked_fill", "cast")},
    "kf.sum": _sum_like, "kf.mean": _sum_like, "kf.reduce_max": _sum_like, "kf.reduce_min": _sum_like,
    "kf.var": _var, "kf.logsumexp": _logsumexp, "kf.argmax": _argmax, "kf.softmax": _softmax, "kf.log_softmax": _softmax,
    "kf.matmul": _matmul, "kf.transpose": _transpose, "kf.reshape": _reshape, "kf.broadcast_to": _broadcast_to,
    "kf.slice": _slice, "kf.concat": _concat, "kf.topk": _topk, "kf.gather": _gather,
    "kf.index_select": _index_select, "kf.index_add": _index_add, "kf.scatter_add": _scatter_add,
    "kf.constant": _constant, "kf.fill": _fill, "kf.rand": _rand,
    "kf.iota": _iota, "kf.scan": _scan, "kf.scatter_reduce": _scatter_reduce,
}


#: the elementwise kf ops: a bf16/f16 result that only they use stays f32 between them
ELEMENTWISE = frozenset(name for name, lowering in LOWERINGS.items() if lowering is _elementwise)

#: the ops whose lowerings take run-time (DYN) sizes; any other op with one is refused
DYNAMIC = ELEMENTWISE | {"kf.sum", "kf.mean", "kf.reduce_max", "kf.reduce_min", "kf.var", "kf.logsumexp",
                         "kf.argmax", "kf.softmax", "kf.log_softmax", "kf.matmul", "kf.transpose", "kf.reshape",
                         "kf.broadcast_to", "kf.iota", "kf.fill", "kf.scan", "kf.slice"}
#: ops whose lowerings take run-time sizes in some operands only: the test of the op
DYNAMIC_WHERE = {
    # a gather of a static table's rows (an embedding) by an index of run-time length
    "kf.index_select": lambda op: spec_of(op.operands[0].type).is_static,
    # a gather along a static dim (cross entropy's pick of each row's target class): the
    # index bound is a number, the result's sizes the index's
    "kf.gather": lambda op: spec_of(op.operands[0].type).shape[normalize_dim(
        int(op_attrs(op)["dim"]), spec_of(op.operands[0].type).rank)] != DYN,
    # a concatenation along a static dim of tensors with run-time dims
    "kf.concat": lambda op: True,
    # the k best along a static dim (a router's experts) of rows of run-time number
    "kf.topk": lambda op: spec_of(op.operands[0].type).shape[normalize_dim(
        int(op_attrs(op)["dim"]), spec_of(op.operands[0].type).rank)] != DYN,
    # sums into a static table's rows (an embedding's gradient) from a run-time number of
    # indices; scatters along a static dim (a loss's one-hot gradient) of rows of
    # run-time number: the indices' bound is a number
    "kf.index_add": lambda op: spec_of(op.operands[0].type).is_static,
    "kf.scatter_add": lambda op: _written_dim_static(op),
    "kf.scatter_reduce": lambda op: _written_dim_static(op),
}


def _written_dim_static(op: ir.Operation) -> bool:
    x = spec_of(op.operands[0].type)
    return x.shape[normalize_dim(int(op_attrs(op)["dim"]), x.rank)] != DYN


def keeps_wide(op: ir.Operation) -> bool:
    """Whether op's low-precision float result is left unrounded (an f32 tensor): op is
    elementwise and every user is too, so the value is rounded once, where a user that is
    not elementwise (or the function's return) reads it. This is the GPU strategies' policy
    (values stay in f32 within a fused kernel and round at the store) and torch's own for
    one op (its CPU kernels compute bf16/f16 in f32)."""
    if op.name not in ELEMENTWISE or len(op.results) != 1:
        return False
    result = op.results[0]
    if spec_of(result.type).elem not in NARROW_FLOATS or op.name == "kf.cmp":
        return False
    uses = list(result.uses)
    return bool(uses) and all(u.owner.name in ELEMENTWISE for u in uses)


#: the attribute a lowering finds set on a kf.cast of uint8 values (lower_op's
#: ``unsigned_source``): their i8 elements are zero-extended
UNSIGNED_SOURCE = "unsigned_source"


def lower_op(op: ir.Operation, wide: bool = False, unsigned_source: bool = False) -> None:
    """Replace one kf op by its linalg-on-tensors lowering (with ``wide``, an elementwise
    op's low-precision result as an f32 tensor: see keeps_wide). ``unsigned_source``: a
    kf.cast whose operand was uint8 before kf-lower-to-linalg retyped it to i8."""
    lowering = LOWERINGS.get(op.name)
    if lowering is None:
        raise PassError(f"no lowering to linalg for '{op.name}'", op.location)
    out = [spec_of(r.type) for r in op.results]
    if op.name not in DYNAMIC and not DYNAMIC_WHERE.get(op.name, lambda _: False)(op) and \
            not all(spec_of(v.type).is_static for v in [*op.operands, *op.results]):
        raise PassError(f"{op.name} takes no run-time sizes", op.location)
    with ir.InsertionPoint(op), op.location:
        try:
            attrs = op_attrs(op)
            if unsigned_source:
                attrs[UNSIGNED_SOURCE] = True
            if wide:
                values = _elementwise(op, list(op.operands), attrs, out, wide=True)
            else:
                values = lowering(op, list(op.operands), attrs, out)
        except ValueError as e:  # scalar_math's refusals: arithmetic it does not define
            raise PassError(f"cannot lower {op.name}: {e}", op.location) from None
    for result, value in zip(op.results, values):
        if value.type != result.type and not wide:
            raise PassError(f"lowering of {op.name} produced {value.type}, expected {result.type}", op.location)
        result.replace_all_uses_with(value)
    op.erase()
