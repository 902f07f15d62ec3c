"""The kf dialect's ops: one table that the IRDL definition, the Python builders and the
semantic verifier are all generated from, so the three cannot disagree.

Every kf op has value semantics on ranked tensors, whose dims are sizes or `?` (known at
run time: dialects/types.DYN). IRDL checks the
structure of an op when it is parsed (tensor operands, attribute kinds); the rules that
need arithmetic on shapes (broadcasting, contraction sizes, reduced dims) live here as
``infer`` functions, run by the builders as ops are made and by ``kf-verify`` (which
``kf-opt`` runs after parsing, as ``mlir-opt`` runs the verifier).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Sequence

from .philox import DISTRIBUTIONS
from .types import (
    DYN,
    KfTypeError,
    TensorSpec,
    broadcast_shapes,
    normalize_dim,
)

# Attribute kinds and the IRDL base attribute that checks each.
ATTR_BASES = {
    "i64_array": "#builtin.dense_array",
    "int": "#builtin.integer",
    "bool": "#builtin.integer",
    "float": "#builtin.float",
    "str": "#builtin.string",
    "elements": "#builtin.dense_int_or_fp_elements",
}

Infer = Callable[[Sequence[TensorSpec], dict, Sequence[TensorSpec]], list[TensorSpec]]


@dataclass(frozen=True)
class OpSpec:
    """One kf op: its operands, results, attributes and typing rule."""

    name: str
    summary: str
    operands: tuple[str, ...]
    results: tuple[str, ...]
    attrs: dict = field(default_factory=dict)  # name -> kind in ATTR_BASES
    infer: Infer | None = None
    variadic: bool = False  # the single operand group is variadic (concat)
    category: str = "other"

    @property
    def full_name(self) -> str:
        return f"kf.{self.name}"


# --------------------------------------------------------------------------- rules


def _same_elem(ops: Sequence[TensorSpec], what: str = "operands") -> str:
    elems = {o.elem for o in ops}
    if len(elems) != 1:
        raise KfTypeError(f"{what} must have one element type, got {', '.join(sorted(elems))}")
    return elems.pop()


def _float_only(t: TensorSpec, what: str = "operand") -> None:
    if not t.is_float:
        raise KfTypeError(f"{what} must have a floating-point element type, got {t.elem}")


def _binary(float_only: bool = False, no_bool: bool = False) -> Infer:
    def infer(ops, attrs, results):
        elem = _same_elem(ops)
        if float_only:
            _float_only(ops[0])
        if no_bool and elem == "i1":
            raise KfTypeError("operands must be numbers, got i1 (booleans)")
        return [TensorSpec(broadcast_shapes(*(o.shape for o in ops)), elem)]

    return infer


def _unary(float_only: bool = True) -> Infer:
    def infer(ops, attrs, results):
        if float_only:
            _float_only(ops[0])
        return [ops[0]]

    return infer


def _signbit(ops, attrs, results):
    _float_only(ops[0])
    return [ops[0].with_elem("i1")]


def _compare(ops, attrs, results):
    if attrs.get("predicate") not in ("eq", "ne", "lt", "le", "gt", "ge"):
        raise KfTypeError(f"predicate must be one of eq, ne, lt, le, gt, ge, got {attrs.get('predicate')!r}")
    _same_elem(ops)
    return [TensorSpec(broadcast_shapes(ops[0].shape, ops[1].shape), "i1")]


#: kf.bitwise's kinds
BITWISE_KINDS = ("and", "or", "xor", "shl", "shr")


def _bitwise(ops, attrs, results):
    kind = attrs.get("kind")
    if kind not in BITWISE_KINDS:
        raise KfTypeError(f"kind must be one of {', '.join(BITWISE_KINDS)}, got {kind!r}")
    elem = _same_elem(ops)
    if ops[0].is_float or kind in ("shl", "shr") and elem == "i1":
        raise KfTypeError(f"bitwise {kind} needs integer operands{' (not booleans)' if elem == 'i1' else ''}, "
                          f"got {elem}")
    return [TensorSpec(broadcast_shapes(ops[0].shape, ops[1].shape), elem)]


def _select(ops, attrs, results):
    cond, a, b = ops
    if cond.elem != "i1":
        raise KfTypeError(f"condition must be a tensor of i1, got {cond.elem}")
    elem = _same_elem([a, b], "the two branches")
    return [TensorSpec(broadcast_shapes(cond.shape, a.shape, b.shape), elem)]


def _masked_fill(ops, attrs, results):
    x, mask = ops
    if mask.elem != "i1":
        raise KfTypeError(f"mask must be a tensor of i1, got {mask.elem}")
    shape = broadcast_shapes(x.shape, mask.shape)
    if shape != x.shape:
        raise KfTypeError(f"mask of shape {list(mask.shape)} does not broadcast to the input's {list(x.shape)}")
    return [x]


def _given_result(what: str) -> Callable[[Sequence[TensorSpec]], TensorSpec]:
    def get(results):
        if not results:
            raise KfTypeError(f"{what} needs its result type to be given")
        return results[0]

    return get


def _cast(ops, attrs, results):
    out = _given_result("kf.cast")(results)
    if out.shape != ops[0].shape:
        raise KfTypeError(f"cast changes the shape from {list(ops[0].shape)} to {list(out.shape)}")
    return [out]


def _reduced_shape(x: TensorSpec, dims: Sequence[int], keepdim: bool) -> tuple[int, ...]:
    nd = sorted({normalize_dim(d, x.rank) for d in dims}) if dims else list(range(x.rank))
    if len(nd) != len(dims) and dims:
        raise KfTypeError(f"dims {list(dims)} name a dimension twice")
    return tuple(1 if i in nd else s for i, s in enumerate(x.shape) if keepdim or i not in nd)


def _reduce(float_only: bool = False) -> Infer:
    def infer(ops, attrs, results):
        x = ops[0]
        if float_only:
            _float_only(x)
        return [x.with_shape(_reduced_shape(x, attrs.get("dims", []), bool(attrs.get("keepdim", False))))]

    return infer


def _sum(ops, attrs, results):
    x = ops[0]
    shape = _reduced_shape(x, attrs.get("dims", []), bool(attrs.get("keepdim", False)))
    # Torch sums booleans into integers; the result element type is given by the builder
    # when it differs from the input's.
    elem = results[0].elem if results else x.elem
    return [TensorSpec(shape, elem)]


def _argmax(ops, attrs, results):
    x = ops[0]
    dim = normalize_dim(int(attrs["dim"]), x.rank)
    return [TensorSpec(_reduced_shape(x, [dim], bool(attrs.get("keepdim", False))), "i64")]


def _logsumexp(ops, attrs, results):
    x = ops[0]
    _float_only(x)
    # a statistic: kept in the type kf computes in (f32; f64 for f64), never rounded to
    # the input's 8 or 11 bits (attention's backward subtracts it from scores)
    elem = "f64" if x.elem == "f64" else "f32"
    return [TensorSpec(_reduced_shape(x, attrs.get("dims", []), bool(attrs.get("keepdim", False))), elem)]


def _softmax(ops, attrs, results):
    x = ops[0]
    _float_only(x)
    normalize_dim(int(attrs["dim"]), x.rank)
    return [x]


def _matmul(ops, attrs, results):
    a, b = ops
    elem = _same_elem(ops)
    if a.rank < 2 or b.rank < 2:
        raise KfTypeError(f"matmul needs operands of rank 2 or more, got ranks {a.rank} and {b.rank}")
    if a.shape[-1] != b.shape[-2] and DYN not in (a.shape[-1], b.shape[-2]):
        raise KfTypeError(
            f"contracting dimensions differ: lhs {list(a.shape)} has {a.shape[-1]}, "
            f"rhs {list(b.shape)} has {b.shape[-2]}"
        )
    batch = broadcast_shapes(a.shape[:-2], b.shape[:-2])
    out_elem = results[0].elem if results else elem
    return [TensorSpec(batch + (a.shape[-2], b.shape[-1]), out_elem)]


def _transpose(ops, attrs, results):
    x = ops[0]
    perm = [int(p) for p in attrs["perm"]]
    if sorted(perm) != list(range(x.rank)):
        raise KfTypeError(f"perm {perm} is not a permutation of the {x.rank} dimensions")
    return [x.with_shape([x.shape[p] for p in perm])]


def _numel(shape) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def _reshape(ops, attrs, results):
    x = ops[0]
    out = _given_result("kf.reshape")(results)
    if (DYN in x.shape) != (DYN in out.shape):  # a run-time size goes somewhere (or comes from nowhere)
        raise KfTypeError(f"cannot reshape {x} into {out}")
    if out.elem != x.elem or (DYN not in x.shape and _numel(out.shape) != _numel(x.shape)):
        raise KfTypeError(f"cannot reshape {x} into {out}")
    return [out]


def _broadcast_to(ops, attrs, results):
    x = ops[0]
    out = _given_result("kf.broadcast_to")(results)
    if out.elem != x.elem or broadcast_shapes(x.shape, out.shape) != out.shape:
        raise KfTypeError(f"cannot broadcast {x} to {out}")
    return [out]


def slice_bounds(start: int, end: int, size: int | None) -> tuple[int | None, int | None]:
    """kf.slice's start and end as offsets from the dim's beginning: for a dim whose size
    is known only at run time (``size`` None), a negative start and an end of 0 or less
    count from its end (``x[:, 1:]`` is start 1, end 0; ``x[:, :-1]`` start 0, end -1);
    None where that needs the size."""
    if size is not None:
        return start, end
    return (start if start >= 0 else None), (end if end > 0 else None)


def slice_length(start: int, end: int, step: int, size: int | None) -> int | None:
    """The number of elements kf.slice takes (slice_bounds), None where it depends on the
    run-time size: both bounds from the beginning or both from the end give a number."""
    lo, hi = slice_bounds(start, end, size)
    if lo is None and hi is None:
        lo, hi = start, end  # both from the end: the size cancels
    elif lo is None or hi is None:
        return None
    return max(0, (hi - lo + step - 1) // step)


def _slice(ops, attrs, results):
    x = ops[0]
    dim = normalize_dim(int(attrs["dim"]), x.rank)
    start, end, step = int(attrs["start"]), int(attrs["end"]), int(attrs.get("step", 1))
    if step < 1:
        raise KfTypeError(f"slice step must be positive, got {step}")
    if x.shape[dim] == DYN:
        lo, hi = slice_bounds(start, end, None)
        if lo is None and hi is not None:
            raise KfTypeError(f"slice [{start}:{end}] of dimension {dim}, whose size is known only at run time, "
                              f"from a start counted from its end to an end counted from its start is not supported")
        length = slice_length(start, end, step, None)
    else:
        if not 0 <= start <= end <= x.shape[dim]:
            raise KfTypeError(f"slice [{start}:{end}] is out of bounds for dimension {dim} of size {x.shape[dim]}")
        length = (end - start + step - 1) // step
    shape = list(x.shape)
    shape[dim] = DYN if length is None else length
    return [x.with_shape(shape)]


def _concat(ops, attrs, results):
    if not ops:
        raise KfTypeError("concat needs at least one operand")
    elem = _same_elem(ops)
    dim = normalize_dim(int(attrs["dim"]), ops[0].rank)
    for o in ops[1:]:
        if o.rank != ops[0].rank or any(a != b for i, (a, b) in enumerate(zip(o.shape, ops[0].shape)) if i != dim):
            raise KfTypeError(f"concat operands {ops[0]} and {o} differ outside dimension {dim}")
    shape = list(ops[0].shape)
    along = [o.shape[dim] for o in ops]
    shape[dim] = DYN if DYN in along else sum(along)
    return [TensorSpec(tuple(shape), elem)]


#: what kf.scan combines along its dim (torch's cumsum, cumprod, cummax/cummin values,
#: logcumsumexp)
SCAN_KINDS = ("sum", "prod", "max", "min", "logsumexp")


def _scan(ops, attrs, results):
    (x,) = ops
    if not x.rank:
        raise KfTypeError("kf.scan needs a tensor of rank 1 or more (reshape a 0-d tensor to [1])")
    normalize_dim(int(attrs["dim"]), x.rank)
    if attrs.get("kind") not in SCAN_KINDS:
        raise KfTypeError(f"kind must be one of {', '.join(SCAN_KINDS)}, got {attrs.get('kind')!r}")
    if attrs["kind"] == "logsumexp" and not x.is_float:
        raise KfTypeError(f"a logsumexp scan needs a float tensor, got {x.elem}")
    if x.elem == "i1":
        raise KfTypeError("kf.scan of booleans: cast them to an integer type first")
    return [x]


def _topk(ops, attrs, results):
    x = ops[0]
    dim = normalize_dim(int(attrs["dim"]), x.rank)
    k = int(attrs["k"])
    if not 0 < k <= x.shape[dim]:
        raise KfTypeError(f"k={k} is out of range for dimension {dim} of size {x.shape[dim]}")
    shape = list(x.shape)
    shape[dim] = k
    return [x.with_shape(shape), TensorSpec(tuple(shape), "i64")]


def _int_index(t: TensorSpec, what: str = "index") -> None:
    if t.elem not in ("i32", "i64"):
        raise KfTypeError(f"{what} must be a tensor of i32 or i64, got {t.elem}")


def _gather(ops, attrs, results):
    x, index = ops
    _int_index(index)
    dim = normalize_dim(int(attrs["dim"]), x.rank)
    if index.rank != x.rank:
        raise KfTypeError(f"gather index must have the input's rank {x.rank}, got {index.rank}")
    for i, (a, b) in enumerate(zip(index.shape, x.shape)):
        if i != dim and a > b:
            raise KfTypeError(f"gather index dimension {i} of size {a} exceeds the input's {b}")
    return [x.with_shape(index.shape)]


def _index_select(ops, attrs, results):
    x, index = ops
    _int_index(index)
    if index.rank != 1:
        raise KfTypeError(f"index_select needs a 1-D index, got rank {index.rank}")
    dim = normalize_dim(int(attrs["dim"]), x.rank)
    shape = list(x.shape)
    shape[dim] = index.shape[0]
    return [x.with_shape(shape)]


def _index_add(ops, attrs, results):
    x, index, src = ops
    _int_index(index)
    _same_elem([x, src], "input and source")
    dim = normalize_dim(int(attrs["dim"]), x.rank)
    if index.rank != 1 or src.rank != x.rank or src.shape[dim] != index.shape[0]:
        raise KfTypeError(f"index_add source {src} and index {index} do not fit input {x} along dimension {dim}")
    if any(a != b for i, (a, b) in enumerate(zip(src.shape, x.shape)) if i != dim):
        raise KfTypeError(f"index_add source {src} differs from input {x} outside dimension {dim}")
    return [x]


def _scatter_add(ops, attrs, results):
    x, index, src = ops
    _int_index(index)
    _same_elem([x, src], "input and source")
    normalize_dim(int(attrs["dim"]), x.rank)
    if index.rank != x.rank or src.rank != x.rank:
        raise KfTypeError("scatter_add input, index and source must have one rank")
    if any(a > b for a, b in zip(index.shape, src.shape)):
        raise KfTypeError(f"scatter_add index {index} is larger than source {src}")
    return [x]


#: how kf.scatter_reduce combines what lands on one element ("none": the last source
#: in index order replaces it, torch.scatter's deterministic reading)
SCATTER_REDUCTIONS = ("none", "sum", "prod", "amax", "amin", "mean")


def _scatter_reduce(ops, attrs, results):
    if attrs.get("reduce") not in SCATTER_REDUCTIONS:
        raise KfTypeError(f"reduce must be one of {', '.join(SCATTER_REDUCTIONS)}, got {attrs.get('reduce')!r}")
    if ops[0].elem == "i1" and attrs["reduce"] != "none":
        raise KfTypeError(f"a {attrs['reduce']} scatter of booleans: cast them to an integer type first")
    return _scatter_add(ops, attrs, results)


def _constant(ops, attrs, results):
    out = _given_result("kf.constant")(results)
    value = attrs.get("value")
    vtype = getattr(value, "type", None)
    if vtype is not None and str(vtype) != str(out):
        raise KfTypeError(f"value of type {vtype} does not match the result type {out}")
    return [out]


def _fill(ops, attrs, results):
    return [_given_result("kf.fill")(results)]


def _iota(ops, attrs, results):
    out = _given_result("kf.iota")(results)
    if out.elem not in ("i32", "i64"):
        raise KfTypeError(f"kf.iota gives i32 or i64 indices (cast them after), got {out.elem}")
    if not out.rank:
        raise KfTypeError("kf.iota needs a result of rank 1 or more (a rank-0 index is a kf.fill)")
    normalize_dim(int(attrs["dim"]), out.rank)
    return [out]


def _rand(ops, attrs, results):
    (state,) = ops
    if state.elem != "i64" or state.shape != (2,):
        raise KfTypeError(f"the random state must be a tensor<2xi64> ([seed, offset]), got {state}")
    out = _given_result("kf.rand")(results)
    if out.elem != "f32":
        raise KfTypeError(f"kf.rand gives f32 samples (cast them after), got {out.elem}")
    if attrs.get("distribution") not in DISTRIBUTIONS:
        raise KfTypeError(f"distribution must be one of {', '.join(DISTRIBUTIONS)}, got {attrs.get('distribution')!r}")
    if int(attrs.get("offset", 0)) < 0:
        raise KfTypeError(f"offset must not be negative, got {attrs.get('offset')}")
    return [out]


def _cmp_dims(ops, attrs, results):
    return [ops[0]]


# --------------------------------------------------------------------------- table

_B = _binary()
_U = _unary()

OPS: tuple[OpSpec, ...] = (
    # elementwise arithmetic, broadcasting like torch
    OpSpec("add", "lhs + rhs", ("lhs", "rhs"), ("result",), infer=_B, category="elementwise"),
    OpSpec("sub", "lhs - rhs", ("lhs", "rhs"), ("result",), infer=_B, category="elementwise"),
    OpSpec("mul", "lhs * rhs", ("lhs", "rhs"), ("result",), infer=_B, category="elementwise"),
    OpSpec("div", "lhs / rhs: true division of floats; of integers, toward zero (C's /), x where rhs is 0 and "
           "-x (wrapping) where rhs is -1", ("lhs", "rhs"), ("result",), infer=_binary(no_bool=True),
           category="elementwise"),
    OpSpec("pow", "lhs ** rhs; of integers, torch's rule for a negative rhs (0, but 1 ** n = 1 and (-1) ** n "
           "= +-1)", ("lhs", "rhs"), ("result",), infer=_binary(no_bool=True), category="elementwise"),
    OpSpec("fmod", "lhs - trunc(lhs / rhs) * rhs, exactly (C's fmod and %: the sign of lhs); of integers, 0 "
           "where rhs is 0 or -1", ("lhs", "rhs"), ("result",), infer=_binary(no_bool=True), category="elementwise"),
    OpSpec("max", "elementwise maximum", ("lhs", "rhs"), ("result",), infer=_B, category="elementwise"),
    OpSpec("min", "elementwise minimum", ("lhs", "rhs"), ("result",), infer=_B, category="elementwise"),
    OpSpec("neg", "-x", ("input",), ("result",), infer=_unary(False), category="elementwise"),
    OpSpec("abs", "|x|", ("input",), ("result",), infer=_unary(False), category="elementwise"),
    OpSpec("exp", "e ** x", ("input",), ("result",), infer=_U, category="elementwise"),
    OpSpec("log", "natural logarithm", ("input",), ("result",), infer=_U, category="elementwise"),
    OpSpec("sqrt", "square root", ("input",), ("result",), infer=_U, category="elementwise"),
    OpSpec("rsqrt", "1 / sqrt(x)", ("input",), ("result",), infer=_U, category="elementwise"),
    OpSpec("reciprocal", "1 / x", ("input",), ("result",), infer=_U, category="elementwise"),
    OpSpec("tanh", "hyperbolic tangent", ("input",), ("result",), infer=_U, category="elementwise"),
    OpSpec("erf", "error function", ("input",), ("result",), infer=_U, category="elementwise"),
    OpSpec("sin", "sine of x (radians)", ("input",), ("result",), infer=_U, category="elementwise"),
    OpSpec("cos", "cosine of x (radians)", ("input",), ("result",), infer=_U, category="elementwise"),
    OpSpec("erfc", "complementary error function 1 - erf(x), accurate where erf(x) is near 1", ("input",),
           ("result",), infer=_U, category="elementwise"),
    OpSpec("trunc", "x rounded toward zero", ("input",), ("result",), infer=_U, category="elementwise"),
    OpSpec("round", "x rounded to the nearest integer, ties to even", ("input",), ("result",), infer=_U,
           category="elementwise"),
    OpSpec("signbit", "whether the sign bit of x is set (true for -0.0 and negative NaNs)", ("input",),
           ("result",), infer=_signbit, category="elementwise"),
    OpSpec("sigmoid", "1 / (1 + e ** -x)", ("input",), ("result",), infer=_U, category="elementwise"),
    OpSpec("relu", "max(x, 0)", ("input",), ("result",), infer=_unary(False), category="elementwise"),
    OpSpec("gelu", "GELU; approximate = \"none\" | \"tanh\"", ("input",), ("result",),
           {"approximate": "str"}, infer=_U, category="elementwise"),
    OpSpec("cmp", "elementwise comparison to i1", ("lhs", "rhs"), ("result",), {"predicate": "str"},
           infer=_compare, category="elementwise"),
    OpSpec("bitwise", "bitwise and, or, xor of integers, or lhs shifted left (shl) or right (shr, arithmetic; "
           "logical for uint8) by rhs bits; a shift by a negative amount or by the type's width or more gives 0 "
           "(shl) or the sign's bits (shr), as torch's", ("lhs", "rhs"), ("result",), {"kind": "str"},
           infer=_bitwise, category="elementwise"),
    OpSpec("select", "cond ? true_value : false_value", ("cond", "true_value", "false_value"), ("result",),
           infer=_select, category="elementwise"),
    OpSpec("masked_fill", "input with value where mask is true", ("input", "mask"), ("result",),
           {"value": "float"}, infer=_masked_fill, category="elementwise"),
    OpSpec("cast", "element type conversion", ("input",), ("result",), infer=_cast, category="elementwise"),
    # reductions
    OpSpec("sum", "sum over dims", ("input",), ("result",), {"dims": "i64_array", "keepdim": "bool"},
           infer=_sum, category="reduction"),
    OpSpec("mean", "mean over dims", ("input",), ("result",), {"dims": "i64_array", "keepdim": "bool"},
           infer=_reduce(float_only=True), category="reduction"),
    OpSpec("reduce_max", "maximum over dims", ("input",), ("result",), {"dims": "i64_array", "keepdim": "bool"},
           infer=_reduce(), category="reduction"),
    OpSpec("reduce_min", "minimum over dims", ("input",), ("result",), {"dims": "i64_array", "keepdim": "bool"},
           infer=_reduce(), category="reduction"),
    OpSpec("var", "variance over dims with a correction (1 = unbiased)", ("input",), ("result",),
           {"dims": "i64_array", "correction": "float", "keepdim": "bool"},
           infer=_reduce(float_only=True), category="reduction"),
    OpSpec("logsumexp", "log(sum(exp(x))) over dims, in f32 (f64 for f64): a softmax's row statistic",
           ("input",), ("result",), {"dims": "i64_array", "keepdim": "bool"}, infer=_logsumexp,
           category="reduction"),
    OpSpec("argmax", "index of the maximum along dim", ("input",), ("result",), {"dim": "int", "keepdim": "bool"},
           infer=_argmax, category="reduction"),
    OpSpec("softmax", "softmax along dim", ("input",), ("result",), {"dim": "int"}, infer=_softmax,
           category="normalization"),
    OpSpec("log_softmax", "log of softmax along dim", ("input",), ("result",), {"dim": "int"}, infer=_softmax,
           category="normalization"),
    # contraction
    OpSpec("matmul", "matrix product over the last two dims, batch dims broadcast", ("lhs", "rhs"),
           ("result",), infer=_matmul, category="contraction"),
    # data movement
    OpSpec("transpose", "permute dims", ("input",), ("result",), {"perm": "i64_array"}, infer=_transpose,
           category="layout"),
    OpSpec("reshape", "same elements, new shape (the result type)", ("input",), ("result",), infer=_reshape,
           category="layout"),
    OpSpec("broadcast_to", "expand size-1 and leading dims to the result shape", ("input",), ("result",),
           infer=_broadcast_to, category="layout"),
    OpSpec("slice", "input[start:end:step] along dim; along a dim of run-time size a negative start and an end "
           "of 0 or less count from its end (slice_bounds)", ("input",), ("result",),
           {"dim": "int", "start": "int", "end": "int", "step": "int"}, infer=_slice, category="layout"),
    # Binary: IRDL binds one type to all operands of a variadic group, and concat's
    # operands differ in shape. builders.concat chains joins of more than two tensors.
    OpSpec("concat", "join lhs and rhs along dim", ("lhs", "rhs"), ("result",), {"dim": "int"}, infer=_concat,
           category="layout"),
    OpSpec("scan", "inclusive scan along dim: element i combines elements 0..i (kind: sum, prod, max, min, "
           "logsumexp), accumulated in f32 for f16/bf16", ("input",), ("result",), {"dim": "int", "kind": "str"},
           infer=_scan, category="scan"),
    OpSpec("topk", "k largest (or smallest) along dim, with their indices", ("input",), ("values", "indices"),
           {"k": "int", "dim": "int", "largest": "bool"}, infer=_topk, category="selection"),
    OpSpec("gather", "torch.gather along dim", ("input", "index"), ("result",), {"dim": "int"}, infer=_gather,
           category="indexing"),
    OpSpec("index_select", "rows of input picked by a 1-D index along dim", ("input", "index"), ("result",),
           {"dim": "int"}, infer=_index_select, category="indexing"),
    OpSpec("index_add", "input with source rows added at index along dim", ("input", "index", "source"),
           ("result",), {"dim": "int"}, infer=_index_add, category="indexing"),
    OpSpec("scatter_add", "torch.scatter_add along dim", ("input", "index", "source"), ("result",),
           {"dim": "int"}, infer=_scatter_add, category="indexing"),
    OpSpec("scatter_reduce", "torch.scatter_reduce along dim (reduce: none, sum, prod, amax, amin, mean; "
           "include_self: whether the input's element takes part); an element no index reaches keeps the input's",
           ("input", "index", "source"), ("result",), {"dim": "int", "reduce": "str", "include_self": "bool"},
           infer=_scatter_reduce, category="indexing"),
    # values
    OpSpec("constant", "a tensor of literal values", (), ("result",), {"value": "elements"}, infer=_constant,
           category="value"),
    OpSpec("fill", "a tensor with every element equal to value", (), ("result",), {"value": "float"},
           infer=_fill, category="value"),
    # indices: what arange, tril and triu are made of, computed where they are used
    OpSpec("iota", "each element's index along dim", (), ("result",), {"dim": "int"}, infer=_iota,
           category="value"),
    # random numbers: element i is a function of the state, offset and i alone (philox.py);
    # offset counts Philox blocks
    OpSpec("rand", "uniform [0, 1) or standard normal f32 samples, Philox4x32-10 keyed by the state "
           "[seed, offset]: element i is from the block at state offset + offset + i / 4 (i / 2: normal)",
           ("state",), ("result",),
           {"offset": "int", "distribution": "str"}, infer=_rand, category="random"),
)

BY_NAME: dict[str, OpSpec] = {op.full_name: op for op in OPS}

#: Values the builders give attributes that the caller leaves out (torch's defaults);
#: IRDL requires every listed attribute to be present in the IR.
ATTR_DEFAULTS: dict[str, object] = {"keepdim": False, "step": 1, "largest": True, "approximate": "none",
                                    "dims": (), "correction": 1.0}
