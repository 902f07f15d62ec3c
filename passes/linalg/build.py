"""The linalg-on-tensors builders kf-lower-to-linalg writes with: types, indexing maps,
``linalg.generic`` over broadcast operands (``map_elements``), fills, reshapes, slices,
loops, reductions and the masked arg-best reduction (argmax, topk).

A dim may be ``DYN`` (``?``, known at run time). A new tensor (``empty``, ``filled``)
takes each such size as a value, ``tensor.dim`` of the operand it comes from (``dim``);
``map_elements`` and ``reduce`` find them through their operands' indexing maps. Where no
operand gives one, lowering refuses (``DynamicSizeError``), and the driver compiles the
function for static sizes instead.
"""

from __future__ import annotations

import math
from typing import Callable, Sequence

from mlir import ir
from mlir.dialects import arith, linalg, scf, tensor

from kf.dialects.elements import LOW_PRECISION, STORAGE_INTS
from kf.dialects.types import DYN, TensorSpec, normalize_dim, spec_of

from .. import scalar_math as sm


Body = Callable[[list[ir.Value]], list[ir.Value]]
#: sizes of a new tensor's DYN dims: position -> an index value
Sizes = dict[int, ir.Value]


class DynamicSizeError(ValueError):
    """A run-time size that this lowering cannot find among an op's operands."""


def elem_type(elem: str) -> ir.Type:
    """The MLIR type of elem's elements in linalg: elem, but a signless i8 for uint8
    (MLIR's arithmetic takes signless integers; kf-lower-to-linalg zero-extends it)."""
    return ir.Type.parse(STORAGE_INTS.get(elem, elem))


def tensor_type(shape: Sequence[int], elem: str | ir.Type) -> ir.RankedTensorType:
    t = elem if isinstance(elem, ir.Type) else elem_type(elem)
    dyn = ir.ShapedType.get_dynamic_size()
    return ir.RankedTensorType.get([dyn if d == DYN else d for d in shape], t)


def compute_elem(elem: str) -> str:
    """The element type kf computes and accumulates in for tensors of ``elem``."""
    return "f32" if elem in LOW_PRECISION else elem


def widen_value(v: ir.Value) -> ir.Value:
    """A scalar extended to its compute type (f16/bf16/fp8 to f32, others unchanged)."""
    return sm.convert(v, elem_type(compute_elem(str(v.type))))


def shape_of(v: ir.Value) -> tuple[int, ...]:
    """v's shape, ``DYN`` for a size known at run time."""
    t = ir.RankedTensorType(v.type)
    return tuple(DYN if t.is_dynamic_dim(i) else d for i, d in enumerate(t.shape))


def dim(v: ir.Value, d: int) -> ir.Value:
    """The size of v's dim d, an index value (``tensor.dim``; a constant where static)."""
    size = shape_of(v)[d]
    return index_const(size) if size != DYN else tensor.dim(v, index_const(d))


def loop_sizes(ins: Sequence[ir.Value], maps: Sequence[ir.AffineMap], rank: int) -> Sizes:
    """The run-time size of each DYN loop dim of a generic over ins with these maps,
    from an operand whose map reads it (where the operands' sizes are not all static)."""
    out: Sizes = {}
    for v, m in zip(ins, maps):
        shape = shape_of(v)
        for pos, e in enumerate(m.results):
            if isinstance(e, ir.AffineDimExpr) and e.position < rank and shape[pos] == DYN and e.position not in out:
                out[e.position] = dim(v, pos)
    return out


def sizes_of(v: ir.Value, dims: Sequence[int]) -> Sizes:
    """Sizes for a new tensor whose position i has v's dim ``dims[i]`` (-1: none)."""
    shape = shape_of(v)
    return {i: dim(v, d) for i, d in enumerate(dims) if d >= 0 and shape[d] == DYN}


def _dynamic(shape: Sequence[int], sizes: Sizes | None) -> list[ir.Value]:
    """The size values of shape's DYN dims, in order."""
    missing = [i for i, d in enumerate(shape) if d == DYN and i not in (sizes or {})]
    if missing:
        raise DynamicSizeError(f"no operand gives the run-time size of dim {missing[0]} of a "
                               f"{'x'.join('?' if d == DYN else str(d) for d in shape)} tensor")
    return [sizes[i] for i, d in enumerate(shape) if d == DYN]


def elem_of(v: ir.Value) -> str:
    return spec_of(v.type).elem


def loop_index(dim: int) -> ir.Value:
    """linalg.index: the current iteration along loop dim of the enclosing generic."""
    return linalg.IndexOp(i64_attr(dim)).result


def i64_attr(value: int) -> ir.Attribute:
    return ir.IntegerAttr.get(ir.IntegerType.get_signless(64), value)


def index_const(value: int) -> ir.Value:
    return arith.constant(ir.IndexType.get(), value)


def identity_map(rank: int) -> ir.AffineMap:
    return ir.AffineMap.get_identity(rank) if rank else ir.AffineMap.get(0, 0, [])


def broadcast_map(in_shape: Sequence[int], out_shape: Sequence[int]) -> ir.AffineMap:
    """Torch broadcasting of an operand of in_shape into a loop nest over out_shape."""
    rank, lead = len(out_shape), len(out_shape) - len(in_shape)
    exprs = []
    for i, size in enumerate(in_shape):
        j = lead + i
        exprs.append(ir.AffineConstantExpr.get(0) if size == 1 and out_shape[j] != 1 else ir.AffineDimExpr.get(j))
    return ir.AffineMap.get(rank, 0, exprs)


def projection_map(rank: int, kept: Sequence[int]) -> ir.AffineMap:
    return ir.AffineMap.get(rank, 0, [ir.AffineDimExpr.get(d) for d in kept])


def empty(shape: Sequence[int], elem: str | ir.Type, sizes: Sizes | None = None) -> ir.Value:
    """tensor.empty of shape; ``sizes`` gives its DYN dims' sizes."""
    t = elem if isinstance(elem, ir.Type) else elem_type(elem)
    if DYN not in shape:
        return tensor.empty(list(shape), t)
    values = iter(_dynamic(shape, sizes))
    return tensor.empty([next(values) if d == DYN else d for d in shape], t)


def filled(shape: Sequence[int], elem: str | ir.Type, value: float, sizes: Sizes | None = None) -> ir.Value:
    """A tensor of shape with every element equal to value (linalg.fill)."""
    t = elem if isinstance(elem, ir.Type) else elem_type(elem)
    return linalg.fill(sm.const(t, value), outs=[empty(shape, t, sizes)])


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
    maps = list(maps) if maps is not None else [broadcast_map(shape_of(v), out_shape) for v in ins]
    init = empty(out_shape, out_elem, loop_sizes(ins, maps, rank))
    return generic(ins, [init], [*maps, identity_map(rank)], ["parallel"] * rank,
                   lambda args: [fn(args[:-1])])[0]


def convert_tensor(v: ir.Value, elem: str) -> ir.Value:
    """v with its elements converted to elem (v itself when it already is)."""
    if elem_of(v) == elem:
        return v
    t = elem_type(elem)
    return map_elements([v], shape_of(v), t, lambda a: sm.convert(a[0], t))


def expand_keepdim(v: ir.Value, shape: Sequence[int], red: Sequence[int]) -> ir.Value:
    """v (the kept dims of a reduction) reshaped to shape, which has size 1 at each dim
    of red; v itself when shape has no reduced dims (keepdim=False)."""
    if len(shape_of(v)) == len(shape):
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
    # the kept dims' run-time sizes are v's
    sizes = [dim(v, kept.index(d)) for d, size in enumerate(shape) if size == DYN]
    static = [ir.ShapedType.get_dynamic_size() if d == DYN else d for d in shape]
    return tensor.expand_shape(tensor_type(shape, elem), v, reassociation([sorted(g) for g in groups]), sizes, static)


def reassociation(groups: Sequence[Sequence[int]]) -> ir.ArrayAttr:
    return ir.ArrayAttr.get([ir.ArrayAttr.get([i64_attr(d) for d in g]) for g in groups])


def reshape(v: ir.Value, shape: Sequence[int]) -> ir.Value:
    """v with the same elements in a new shape. Static shapes: collapse to 1-D, then
    expand. Going through 1-D is always valid for static shapes, and the canonicalizer
    folds a collapse/expand pair into one reassociation when one exists. Run-time sizes:
    ``_reshape_groups``."""
    src, elem = shape_of(v), ir.RankedTensorType(v.type).element_type
    shape = list(shape)
    if list(src) == shape and DYN not in shape:
        return v
    if DYN in src or DYN in shape:
        return _dynamic_reshape(v, shape)
    numel = math.prod(src)
    if len(src) == 0:
        flat = tensor.expand_shape(tensor_type([1], elem), v, reassociation([]), [], [1])
    elif len(src) == 1:
        flat = v
    else:
        flat = tensor.collapse_shape(tensor_type([numel], elem), v, reassociation([list(range(len(src)))]))
    if len(shape) == 0:
        return tensor.collapse_shape(tensor_type([], elem), flat, reassociation([]))
    if len(shape) == 1:
        return flat
    return tensor.expand_shape(tensor_type(shape, elem), flat, reassociation([list(range(len(shape)))]), [], shape)


def _reshape_groups(src: Sequence[int], dst: Sequence[int]) -> tuple[list, list] | None:
    """(groups of src's dims, groups of dst's dims), one pair per dim of a 1-D-per-group
    intermediate, for a reshape with run-time sizes; None where kf cannot tell them.

    Static dims are grouped from the left and from the right while their products match;
    what is left between is one group that holds every run-time dim and at most one of
    dst's (its size is the group's size over the static rest). Each boundary then splits
    src and dst at the same number of elements whatever the run-time sizes, which is
    what makes collapsing and expanding by these groups the reshape."""
    def side(a: Sequence[int], b: Sequence[int]) -> tuple[list, list]:
        ga, gb, i, j = [], [], 0, 0
        while i < len(a) and j < len(b) and a[i] != DYN and b[j] != DYN:
            ca, cb, pa, pb = [i], [j], a[i], b[j]
            i, j = i + 1, j + 1
            while pa != pb:
                if pa < pb and i < len(a) and a[i] != DYN:
                    ca.append(i); pa *= a[i]; i += 1
                elif pb < pa and j < len(b) and b[j] != DYN:
                    cb.append(j); pb *= b[j]; j += 1
                else:
                    return ga, gb
            ga.append(ca); gb.append(cb)
        return ga, gb

    left_s, left_d = side(src, dst)
    right_s, right_d = side(src[::-1], dst[::-1])
    n_s, n_d = len(src), len(dst)
    right_s = [[n_s - 1 - k for k in reversed(g)] for g in reversed(right_s)]
    right_d = [[n_d - 1 - k for k in reversed(g)] for g in reversed(right_d)]
    lo_s = sum(len(g) for g in left_s)
    lo_d = sum(len(g) for g in left_d)
    # the right groups that do not overlap the left ones
    while right_s and (right_s[0][0] < lo_s or right_d[0][0] < lo_d):
        right_s, right_d = right_s[1:], right_d[1:]
    hi_s = n_s - sum(len(g) for g in right_s)
    hi_d = n_d - sum(len(g) for g in right_d)
    mid_s, mid_d = list(range(lo_s, hi_s)), list(range(lo_d, hi_d))
    if not mid_s or not mid_d:
        return None
    if sum(1 for d in mid_d if dst[d] == DYN) > 1:
        paired = _paired_groups([src[d] for d in mid_s], [dst[d] for d in mid_d])
        if paired is None:
            return None
        return (left_s + [[lo_s + k for k in g] for g in paired[0]] + right_s,
                left_d + [[lo_d + k for k in g] for g in paired[1]] + right_d)
    return left_s + [mid_s] + right_s, left_d + [mid_d] + right_d


def paired_runtime_dims(src: Sequence[int], dst: Sequence[int]) -> bool:
    """Whether a reshape keeps each run-time dim as it is and regroups only the static
    dims between them: as many run-time dims in src as in dst, and the static dims before,
    between and after them of equal products (``unsqueeze``, ``repeat_interleave``'s
    merge of ``[n, 2, 2, s, d]`` into ``[n, 4, s, d]``). Capture checks that such a
    reshape does so for every size (compiler/dynamic.py)."""
    def segments(shape: Sequence[int]) -> list[int]:
        out = [1]
        for n in shape:
            if n == DYN:
                out.append(1)
            else:
                out[-1] *= n
        return out

    return shape_count(src) == shape_count(dst) and segments(src) == segments(dst)


def shape_count(shape: Sequence[int]) -> int:
    return sum(1 for n in shape if n == DYN)


def _paired_groups(src: Sequence[int], dst: Sequence[int]) -> tuple[list, list] | None:
    """Groups for a reshape of paired run-time dims (paired_runtime_dims): each run-time
    dim alone with the static dims of size 1 beside it, each stretch of static dims
    between them one group; None otherwise."""
    if not paired_runtime_dims(src, dst):
        return None

    def stretches(shape: Sequence[int]) -> list[list[int]]:
        out, cur = [], []
        for d, n in enumerate(shape):
            if n == DYN:
                out.append(cur)
                out.append([d])
                cur = []
            else:
                cur.append(d)
        out.append(cur)
        return out

    a, b = stretches(src), stretches(dst)
    gs, gd = [], []
    for i, (x, y) in enumerate(zip(a, b)):
        if i % 2 == 0 and (not x or not y):
            # a stretch of 1s on one side only (its product equals the other's, empty):
            # it joins the run-time dim after it, or the one before at the end
            extra_s, extra_d = x, y
            if i + 1 < len(a):
                a[i + 1], b[i + 1] = extra_s + a[i + 1], extra_d + b[i + 1]
            elif gs:
                gs[-1] += extra_s
                gd[-1] += extra_d
            continue
        gs.append(list(x))
        gd.append(list(y))
    return gs, gd


def _dynamic_reshape(v: ir.Value, shape: Sequence[int]) -> ir.Value:
    """A reshape with run-time sizes: collapse v by ``_reshape_groups``, then expand."""
    src, elem = shape_of(v), ir.RankedTensorType(v.type).element_type
    groups = _reshape_groups(src, shape) if src and shape else None
    if groups is None:
        raise DynamicSizeError(f"a reshape of {list(src)} to {list(shape)} with run-time sizes")
    gs, gd = groups
    mid = [DYN if any(src[d] == DYN for d in g) else math.prod(src[d] for d in g) for g in gs]
    flat = v if len(mid) == len(src) else tensor.collapse_shape(tensor_type(mid, elem), v, reassociation(gs))
    if len(mid) == len(shape) and list(mid) == list(shape):
        return flat
    sizes = []
    for k, g in enumerate(gd):
        for d in g:
            if shape[d] == DYN:
                rest = math.prod(shape[e] for e in g if e != d)
                n = dim(flat, k)
                sizes.append(n if rest == 1 else arith.divui(n, index_const(rest)))
    static = [ir.ShapedType.get_dynamic_size() if d == DYN else d for d in shape]
    return tensor.expand_shape(tensor_type(shape, elem), flat, reassociation(gd), sizes, static)


def _mixed(values: Sequence[int | ir.Value]) -> tuple[list[ir.Value], list[int]]:
    """(the index values, the static list with a dynamic marker at each) of offsets or
    sizes that are numbers or index values."""
    dyn = [o for o in values if isinstance(o, ir.Value)]
    static = [ir.ShapedType.get_dynamic_size() if isinstance(o, ir.Value) else int(o) for o in values]
    return dyn, static


def extract_slice(v: ir.Value, offsets: Sequence[int | ir.Value], sizes: Sequence[int | ir.Value],
                  strides: Sequence[int] | None = None, result_shape: Sequence[int] | None = None) -> ir.Value:
    """tensor.extract_slice with static or dynamic offsets and sizes (a size that is an
    index value is a DYN dim of the result)."""
    strides = list(strides or [1] * len(sizes))
    dyn, static = _mixed(offsets)
    dyn_sizes, static_sizes = _mixed(sizes)
    shape = result_shape if result_shape is not None else [DYN if isinstance(n, ir.Value) else n for n in sizes]
    out = tensor_type(shape, ir.RankedTensorType(v.type).element_type)
    return tensor.extract_slice(out, v, dyn, dyn_sizes, [], static, static_sizes, strides)


def insert_slice(src: ir.Value, dest: ir.Value, offsets: Sequence[int | ir.Value], sizes: Sequence[int | ir.Value],
                 strides: Sequence[int] | None = None) -> ir.Value:
    """tensor.insert_slice with static or dynamic offsets and sizes."""
    strides = list(strides or [1] * len(sizes))
    dyn, static = _mixed(offsets)
    dyn_sizes, static_sizes = _mixed(sizes)
    return tensor.insert_slice(src, dest, dyn, dyn_sizes, [], static, static_sizes, strides)


def sizes_or_dims(v: ir.Value) -> list[int | ir.Value]:
    """v's sizes: a number for a static dim, its run-time size (tensor.dim) for a DYN one."""
    return [dim(v, d) if n == DYN else n for d, n in enumerate(shape_of(v))]


def for_loop(lb: int, ub: int | ir.Value, iter_args: Sequence[ir.Value],
             body: Callable[[ir.Value, list[ir.Value]], list[ir.Value]]) -> list[ir.Value]:
    """scf.for from lb to ub (step 1; ub a number or an index value) carrying iter_args;
    body returns the next values."""
    loop = scf.ForOp(index_const(lb), ub if isinstance(ub, ir.Value) else index_const(ub), index_const(1),
                     list(iter_args))
    with ir.InsertionPoint(loop.body):
        scf.YieldOp(body(loop.induction_variable, list(loop.inner_iter_args)))
    return list(loop.results)


def count(x: ir.Value, red: Sequence[int], t: ir.Type) -> int | ir.Value:
    """The number of elements of x's dims red: a number where their sizes are static, else
    a scalar of float type t computed from their run-time sizes (``scalar``)."""
    shape = shape_of(x)
    if all(shape[d] != DYN for d in red):
        return math.prod(shape[d] for d in red)
    n = index_const(1)
    for d in red:
        n = arith.muli(n, dim(x, d))
    return arith.uitofp(t, arith.index_cast(ir.IntegerType.get_signless(64), n))


def scalar(n: int | ir.Value, t: ir.Type) -> ir.Value:
    """A count of ``count`` as a scalar of type t (a constant made where it is used)."""
    return n if isinstance(n, ir.Value) else sm.const(t, n)


def reduced_dims(rank: int, dims: Sequence[int]) -> list[int]:
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
    shape = shape_of(x)
    rank = len(shape)
    kept = [d for d in range(rank) if d not in red]
    init_t = filled([shape[d] for d in kept], acc_elem, init, sizes_of(x, kept))
    proj = projection_map(rank, kept)
    iterators = ["reduction" if d in red else "parallel" for d in range(rank)]
    return generic([x, *extra], [init_t], [identity_map(rank), *[proj] * len(extra), proj], iterators,
                   lambda a: [combine(a[:-1], a[-1])])[0]


def finish_reduction(v: ir.Value, fn: Callable[[ir.Value], ir.Value] | None, out: TensorSpec,
            red: Sequence[int] = ()) -> ir.Value:
    """Apply fn to each accumulated element, round to out's element type and restore
    the reduced dims red as size 1 when out keeps them."""
    t = elem_type(out.elem)
    if fn is not None or elem_of(v) != out.elem:
        v = map_elements([v], shape_of(v), t, lambda a: sm.convert(fn(a[0]) if fn else a[0], t))
    return expand_keepdim(v, out.shape, red)


def min_value(elem: str) -> float:
    if elem in ("i32", "i64"):
        return -(2 ** (int(elem[1:]) - 1))
    return 0 if elem == "i1" else -math.inf


def max_value(elem: str) -> float:
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
    shape = shape_of(x)
    rank = len(shape)
    kept = [d for d in range(rank) if d != dim]
    acc_elem = compute_elem(elem_of(x))
    vals = filled([shape[d] for d in kept], acc_elem, 0, sizes_of(x, kept))
    idxs = filled([shape[d] for d in kept], "i64", -1, sizes_of(x, kept))
    ins = [x] if taken is None else [x, taken]
    proj = projection_map(rank, kept)
    i64 = ir.IntegerType.get_signless(64)

    def body(a):
        v = widen_value(a[0])
        best, best_i = a[-2], a[-1]
        i = arith.index_cast(i64, loop_index(dim))
        none = arith.cmpi(arith.CmpIPredicate.eq, best_i, sm.const(i64, -1))
        take = arith.ori(none, _better(v, best, largest))
        if taken is not None:
            take = arith.andi(take, arith.xori(a[1], sm.const(ir.IntegerType.get_signless(1), 1)))
        return [arith.select(take, v, best), arith.select(take, i, best_i)]

    iterators = ["reduction" if d == dim else "parallel" for d in range(rank)]
    v, i = generic(ins, [vals, idxs], [identity_map(rank)] * len(ins) + [proj, proj], iterators, body)
    return v, i
