"""kf-canonicalize: fold, simplify and clean kf IR before fusion.

What it changes (each rule has a case in test/passes/kf-canonicalize.mlir):
- arithmetic on splat fills folds to a fill: ``fill(2) * fill(3)`` is ``fill(6)``;
- identities vanish: ``x * 1``, ``x / 1``, ``x + (-0.0)``, ``x - 0``, ``-(-x)`` (``x + 0`` stays:
  it is +0 where x is -0, as in torch);
- broadcasts simplify: a ``broadcast_to`` feeding an elementwise op is dropped where
  the op's implicit broadcasting gives the same result, a broadcast to the same shape
  is removed, chains of broadcasts merge and a broadcast fill becomes a larger fill;
- ``reshape``/``transpose``/``cast`` that change nothing are removed, chains merge;
- a reshape of a ``kf.iota`` that only adds or drops unit dims is an iota of the new
  shape (``arange(n)[:, None]``), so that it stays free for kf-fuse; one of an
  elementwise op of fills and iotas moves onto its operands (``arange(n).float()[None,
  :, None]``) and folds so too;
- a reshape of a last-two-dims transpose that keeps those dims (batch dims merged or
  split) becomes the transpose of the reshape, which kf-fuse then leaves as a view feeding
  a matmul that reads the transpose in place;
- a matmul of operands whose batch dims were merged into one, reshaped back to those
  batch dims, becomes the matmul over the batch dims (torch's 4-D matmul traced as bmm,
  as autograd's derived graphs have it);
- a reshape that drops the unit dims a ``keepdim`` reduction kept becomes the
  reduction without keepdim;
- ``select(c, fill(v), x)`` of x's shape and float type becomes ``masked_fill(x, c, v)``;
- kf ops whose results are unused are erased (kf ops have no side effects).
It runs the rules to a fixed point.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Callable

from mlir import ir

from kf.dialects import BY_NAME, builders
from kf.dialects.attrs import op_attrs, set_sizes_from, sizes_from
from kf.dialects.elements import wrap_int
from kf.dialects.types import DYN, broadcast_shapes, defining, spec_of, transposes_last_two

from .base import KfPass

def _div(a: float, b: float) -> float:
    if b:
        return a / b
    if a != a or not a:
        return math.nan
    return math.copysign(math.inf, a) * math.copysign(1.0, b)  # the sign of a zero divisor counts


def _iota_dim_after_reshape(shape, dim: int, new_shape) -> int | None:
    """The dim of ``new_shape`` that a reshape of an iota along ``dim`` of ``shape`` runs
    along, where the reshape only adds or drops unit dims and keeps that dim (an
    ``arange(n)[:, None]``); None for any other reshape. A size-1 dim gives a dim of size 1."""
    dim %= len(shape)
    kept = [(i, d) for i, d in enumerate(shape) if d != 1]
    new_kept = [(i, d) for i, d in enumerate(new_shape) if d != 1]
    if [d for _, d in kept] != [d for _, d in new_kept]:
        return None
    if shape[dim] == 1:
        return new_shape.index(1) if 1 in new_shape else None
    return new_kept[[i for i, _ in kept].index(dim)][0]


def _max(a: float, b: float) -> float:
    return a if a != a or a >= b else b  # NaN wins; of equal values (0 and -0) the first, as torch


def _min(a: float, b: float) -> float:
    return a if a != a or a <= b else b


def _pow(a: float, b: float) -> float:
    try:
        return math.pow(a, b)
    except OverflowError:  # |a| ** b beyond the double range
        return math.inf if a > 0 or float(b).is_integer() and b % 2 == 0 else -math.inf
    except ValueError:  # a negative base to a non-integer power, or 0 to a negative one
        if a == 0:
            return math.copysign(math.inf, a) if float(b).is_integer() and b % 2 == 1 else math.inf
        return math.nan


def _exp(a: float) -> float:
    try:
        return math.exp(a)
    except OverflowError:
        return math.inf


def _fmod(a: float, b: float) -> float:
    if b == 0 or math.isinf(a) or math.isnan(a) or math.isnan(b):
        return math.nan
    return math.fmod(a, b)  # exact, as C's


# Folding follows IEEE 754 in double precision, as torch computes: NaN propagates,
# inf and signed zeros come out as the hardware's would (Python's own operators raise on
# 0 ** -1 and exp(1000), and its max/min ignore a NaN in second place).
_FOLD_BINARY: dict[str, Callable[[float, float], float]] = {
    "kf.add": lambda a, b: a + b,
    "kf.sub": lambda a, b: a - b,
    "kf.mul": lambda a, b: a * b,
    "kf.div": _div,
    "kf.max": _max,
    "kf.min": _min,
    "kf.pow": _pow,
    "kf.fmod": _fmod,
}
def _int_quotient(a: int, b: int) -> float:
    """C's a / b of integers (toward zero), with kf.div's rule for 0 and -1 divisors."""
    if b in (0, 1):
        return float(a)
    if b == -1:
        return float(-a)
    q = abs(a) // abs(b)
    return float(q if (a < 0) == (b < 0) else -q)


def _int_remainder(a: int, b: int) -> float:
    """C's a % b of integers (the sign of a), 0 where b is 0 or -1, as kf.fmod's rule."""
    if b in (0, -1):
        return 0.0
    r = abs(a) % abs(b)
    return float(-r if a < 0 else r)


#: integer kf.div and kf.fmod fold exactly, by their rule for 0 and -1 divisors
_INT_DIVISION: dict[str, Callable[[int, int], float]] = {"kf.div": _int_quotient, "kf.fmod": _int_remainder}

_FOLD_UNARY: dict[str, Callable[[float], float]] = {
    "kf.neg": lambda a: -a,
    "kf.abs": abs,
    "kf.exp": _exp,
    "kf.log": lambda a: math.log(a) if a > 0 else (-math.inf if a == 0 else math.nan),
    "kf.sqrt": lambda a: math.sqrt(a) if a >= 0 else math.nan,
    "kf.rsqrt": lambda a: 1 / math.sqrt(a) if a > 0 else (math.copysign(math.inf, a) if a == 0 else math.nan),
    "kf.reciprocal": lambda a: 1 / a if a else math.copysign(math.inf, a),
    "kf.tanh": math.tanh,
    "kf.erf": math.erf,
    "kf.erfc": math.erfc,
    "kf.sin": math.sin,
    "kf.cos": math.cos,
    # (zeros keep the operand's sign; Python's round takes ties to even, as kf.round)
    "kf.trunc": lambda a: math.copysign(float(math.trunc(a)), a) if math.isfinite(a) else a,
    "kf.round": lambda a: math.copysign(float(round(a)), a) if math.isfinite(a) else a,
    "kf.relu": lambda a: a if a != a or a >= 0 else 0.0,
}
#: x op c is x exactly when c is this (IEEE: x + 0 is 0 for x = -0, so only -0 is the
#: additive identity; x - 0 is x for every x)
_RIGHT_IDENTITY = {"kf.add": -0.0, "kf.sub": 0.0, "kf.mul": 1.0, "kf.div": 1.0}


def _is_identity(value: float | None, identity: float, is_float: bool) -> bool:
    if value is None or value != identity:
        return False
    return not is_float or identity != 0 or math.copysign(1.0, value) == math.copysign(1.0, identity)


_ELEMENTWISE_BINARY = {"kf.add", "kf.sub", "kf.mul", "kf.div", "kf.max", "kf.min", "kf.pow", "kf.cmp", "kf.bitwise"}


def _fill_value(v: ir.Value) -> float | None:
    """The value of a kf.fill as its element type holds it (a uint8 fill of -5 is 251)."""
    op = defining(v)
    if op is not None and op.name == "kf.fill":
        value, elem = float(op_attrs(op)["value"]), spec_of(v.type).elem
        return value if spec_of(v.type).is_float or elem == "i1" or not math.isfinite(value) else _as_int(value, elem)
    return None


def _as_int(value: float, elem: str) -> float:
    """value converted to the integer type elem as torch converts (toward zero, wrapping;
    non-zero is true)."""
    if elem == "i1":
        return float(value != 0)
    return float(wrap_int(int(value), elem))


def _is_int(v: ir.Value) -> bool:
    return not spec_of(v.type).is_float


class _Rewriter:
    def __init__(self) -> None:
        self.changed = False

    def replace(self, op: ir.Operation, value: ir.Value) -> None:
        op.result.replace_all_uses_with(value)
        op.erase()
        self.changed = True

    def apply(self, op: ir.Operation) -> None:
        name = op.name
        if name.startswith("kf.") and all(len(list(r.uses)) == 0 for r in op.results):
            op.erase()
            self.changed = True
            return
        with ir.InsertionPoint(op), op.location:
            if name in _FOLD_BINARY and self._fold_binary(op):
                return
            if name in _FOLD_UNARY and self._fold_unary(op):
                return
            if name in _ELEMENTWISE_BINARY and self._drop_broadcast_operands(op):
                return
            handler = getattr(self, "_" + name[3:], None) if name.startswith("kf.") else None
            if handler is not None:
                handler(op)

    # -- folding
    def _fold_binary(self, op: ir.Operation) -> bool:
        lhs, rhs = op.operands
        a, b = _fill_value(lhs), _fill_value(rhs)
        out = spec_of(op.result.type)
        if a is not None and b is not None:
            if _is_int(op.result) and op.name in _INT_DIVISION:
                value = _INT_DIVISION[op.name](int(a), int(b))
            else:
                value = _FOLD_BINARY[op.name](a, b)
            if _is_int(op.result):
                value = _as_int(value, out.elem)
            self.replace(op, _sized(builders.fill(out.shape, out.elem, value), lhs, rhs))
            return True
        identity = _RIGHT_IDENTITY.get(op.name)
        if identity is None:
            return False
        if _is_identity(b, identity, out.is_float) and spec_of(lhs.type) == out:
            self.replace(op, lhs)
            return True
        if op.name in ("kf.add", "kf.mul") and _is_identity(a, identity, out.is_float) and spec_of(rhs.type) == out:
            self.replace(op, rhs)
            return True
        return False

    def _fold_unary(self, op: ir.Operation) -> bool:
        (x,) = op.operands
        a = _fill_value(x)
        if a is not None:
            out = spec_of(op.result.type)
            self.replace(op, _sized(builders.fill(out.shape, out.elem, _FOLD_UNARY[op.name](a)), x))
            return True
        inner = defining(x)
        if op.name == "kf.neg" and inner is not None and inner.name == "kf.neg":
            self.replace(op, inner.operands[0])
            return True
        return False

    def _drop_broadcast_operands(self, op: ir.Operation) -> bool:
        operands = list(op.operands)
        out_shape = spec_of(op.result.type).shape
        for i, v in enumerate(operands):
            inner = defining(v)
            if inner is None or inner.name != "kf.broadcast_to":
                continue
            src = inner.operands[0]
            trial = [spec_of(o.type).shape for o in operands]
            trial[i] = spec_of(src.type).shape
            try:
                same = broadcast_shapes(*trial) == out_shape
            except ValueError:
                same = False
            if same:
                op.operands[i] = src
                self.changed = True
                return True
        return False

    # -- per-op rules
    def _broadcast_to(self, op: ir.Operation) -> None:
        (x,) = op.operands
        out = spec_of(op.result.type)
        if spec_of(x.type) == out:
            self.replace(op, x)
            return
        inner = defining(x)
        if inner is None:
            return
        if inner.name == "kf.broadcast_to":
            self.replace(op, builders.broadcast_to(inner.operands[0], out.shape))
        elif inner.name == "kf.fill":
            self.replace(op, _sized(builders.fill(out.shape, out.elem, _fill_value(x)), x))

    def _reshape(self, op: ir.Operation) -> None:
        (x,) = op.operands
        out = spec_of(op.result.type)
        if spec_of(x.type) == out:
            self.replace(op, x)
            return
        inner = defining(x)
        if inner is not None and inner.name == "kf.matmul" and self._batched_matmul(op, inner):
            return
        if inner is not None and inner.name in _KEEPDIM_REDUCTIONS and self._drop_kept_dims(op, inner):
            return
        if inner is not None and inner.name == "kf.reshape":
            self.replace(op, builders.reshape(inner.operands[0], out.shape))
        elif inner is not None and inner.name == "kf.fill":
            self.replace(op, _sized(builders.fill(out.shape, out.elem, _fill_value(x)), x))
        elif inner is not None and inner.name == "kf.iota":
            dim = _iota_dim_after_reshape(spec_of(x.type).shape, int(op_attrs(inner)["dim"]), out.shape)
            if dim is not None:
                # (an iota along a run-time size stays one: DYN is not a size of 1)
                self.replace(op, _sized(builders.iota(out.shape, dim, out.elem) if out.shape[dim] != 1
                                        else builders.fill(out.shape, out.elem, 0.0), x))
        elif inner is not None and spec_of(x.type).rank > 0 and _made_of_indices(x) and \
                _unit_dims_only(spec_of(x.type).shape, out.shape) and \
                all(spec_of(v.type).rank == 0 or spec_of(v.type).shape == spec_of(x.type).shape
                    for v in inner.operands):
            # (x of rank 0: its operands are all rank 0, and none would take the new shape)
            # an elementwise op of fills and iotas (``arange(n).float()[None, :, None]``):
            # the op of the reshaped operands, which fold to fills and iotas of the new shape
            operands = [v if spec_of(v.type).rank == 0 else builders.reshape(v, out.shape) for v in inner.operands]
            self.replace(op, builders.build(inner.name, operands, dict(op_attrs(inner)), [out]).result)
        elif transposes_last_two(inner):
            # reshape(transpose_last_two(t)) with the last two dims kept (only batch dims
            # merged or split) is transpose_last_two(reshape(t)): the reshape of t is then a
            # view (kf-fuse) and the transpose one a matmul reads in place (the batched
            # matmuls of a derived backward: bmm(q^T-ish, ...) after view(-1, s, d))
            src = spec_of(inner.operands[0].type)
            tshape = spec_of(x.type).shape
            if len(out.shape) >= 2 and out.shape[-2:] == tshape[-2:]:
                lead = tuple(out.shape[:-2]) + src.shape[-2:]
                r = builders.reshape(inner.operands[0], lead)
                n = len(lead)
                self.replace(op, builders.transpose(r, perm=list(range(n - 2)) + [n - 1, n - 2]))

    def _drop_kept_dims(self, op: ir.Operation, red: ir.Operation) -> bool:
        """``reshape(sum(x, dims, keepdim=True))`` to the shape without the kept unit dims
        is ``sum(x, dims, keepdim=False)`` (autograd writes a bias's gradient so): a
        reshape of a result the function returns would be a copy kernel of its own."""
        if len(list(red.result.uses)) != 1:
            return False
        attrs = op_attrs(red)
        if not attrs.get("keepdim"):
            return False
        shape = spec_of(red.operands[0].type).shape
        dims = {d % max(len(shape), 1) for d in (attrs.get("dims") or range(len(shape)))}
        dropped = tuple(s for i, s in enumerate(shape) if i not in dims)
        if dropped != spec_of(op.result.type).shape:
            return False
        attrs = {**attrs, "keepdim": False}
        self.replace(op, builders.build(red.name, list(red.operands), attrs).result)
        return True

    def _batched_matmul(self, op: ir.Operation, mm: ir.Operation) -> bool:
        """``reshape(matmul(reshape(a), reshape(b)))`` that merges batch dims into one and
        splits them back is ``matmul(a, b)`` over the batch dims (torch's matmul of 4-D
        tensors traced as bmm: a derived forward or backward), which kf-fuse recognizes
        as the attention it is; an operand may be the last-two-dims transpose of such a
        reshape (``k^T``)."""
        if len(list(mm.result.uses)) != 1:
            return False
        out = spec_of(op.result.type)
        mshape = spec_of(mm.result.type).shape
        if len(mshape) != 3 or len(out.shape) < 3 or out.shape[-2:] != mshape[-2:]:
            return False
        lead = tuple(out.shape[:-2])
        operands = [_unbatched(v, lead) for v in mm.operands]
        if any(v is None for v in operands):
            return False
        self.replace(op, builders.build("matmul", operands, None, [out]).result)
        return True

    def _transpose(self, op: ir.Operation) -> None:
        (x,) = op.operands
        perm = op_attrs(op)["perm"]
        if perm == sorted(perm):
            self.replace(op, x)
            return
        inner = defining(x)
        if inner is not None and inner.name == "kf.transpose":
            first = op_attrs(inner)["perm"]
            composed = [first[p] for p in perm]
            self.replace(op, builders.transpose(inner.operands[0], perm=composed))
        elif inner is not None and _made_of_indices(x):
            self._transpose_indices(op, inner, perm)

    def _transpose_indices(self, op: ir.Operation, inner: ir.Operation, perm: list[int]) -> None:
        """A transpose of a value computed from fills and iotas alone (a mask
        ``torch.triu(torch.ones(S, S)).T``) moves onto them: the transpose of an iota is an
        iota along the permuted dim, that of a fill a fill, and an elementwise op of
        transposed operands is the transpose of the op. kf-fuse then computes the mask in
        the kernel that reads it (an attention's block table) instead of a transpose
        kernel writing it to memory."""
        out = spec_of(op.result.type)
        if inner.name == "kf.fill":
            self.replace(op, _sized(builders.fill(out.shape, out.elem, _fill_value(inner.result)), inner.result,
                                    order=list(perm)))
        elif inner.name == "kf.iota":
            self.replace(op, _sized(builders.iota(out.shape, perm.index(int(op_attrs(inner)["dim"]) % out.rank),
                                                  out.elem), inner.result, order=list(perm)))
        else:
            operands = [v if spec_of(v.type).rank == 0 else builders.transpose(v, perm=list(perm))
                        for v in inner.operands]
            attrs = {k: v for k, v in op_attrs(inner).items()}
            self.replace(op, builders.build(inner.name, operands, attrs, [out]).result)

    def _select(self, op: ir.Operation) -> None:
        """``select(c, fill(v), x)`` of x's own shape and float type is ``masked_fill(x, c, v)``
        (autograd's traces write ``masked_fill(mask == 0, -1e9)`` as ``where``): the form
        an attention's mask is recognized in (its block table, the key blocks it skips)."""
        c, a, x = op.operands
        v = _fill_value(a)
        if v is None or spec_of(x.type) != spec_of(op.result.type) or not spec_of(x.type).is_float:
            return
        self.replace(op, builders.masked_fill(x, c, value=v))

    def _cast(self, op: ir.Operation) -> None:
        (x,) = op.operands
        if x.type == op.result.type:
            self.replace(op, x)
            return
        a = _fill_value(x)
        if a is not None:
            out = spec_of(op.result.type)
            self.replace(op, _sized(builders.fill(out.shape, out.elem, _as_int(a, out.elem) if not out.is_float
                                                  else a), x))


def _sized(new: ir.Value, *olds: ir.Value, order: list[int] | None = None) -> ir.Value:
    """new (a fill or iota made in place of values computed from fills and iotas) with the
    run-time sizes (SIZES_FROM) of the first of ``olds`` that has them for new's run-time
    dims: dim i of new is dim ``order[i]`` of it (a transpose), or, without order, new's
    run-time dims are its run-time dims in order (a reshape that adds or drops unit dims,
    an elementwise op). Without them new's lowering refuses run-time sizes."""
    shape = spec_of(new.type).shape
    if DYN not in shape:
        return new
    for old in olds:
        op = defining(old)
        pairs = sizes_from(op) if op is not None else None
        if pairs is None:
            continue
        if order is not None:
            mapped = [pairs[order[i]] if n == DYN else (-1, -1) for i, n in enumerate(shape)]
        else:
            dyn = [p for p, n in zip(pairs, spec_of(old.type).shape) if n == DYN]
            if len(dyn) != shape.count(DYN):
                continue
            it = iter(dyn)
            mapped = [next(it) if n == DYN else (-1, -1) for n in shape]
        if all(p[0] >= 0 for p, n in zip(mapped, shape) if n == DYN):
            set_sizes_from(defining(new), mapped)
            return new
    return new


def _unit_dims_only(shape, new_shape) -> bool:
    """A reshape from shape to new_shape only adds or drops dims of size 1."""
    return [d for d in shape if d != 1] == [d for d in new_shape if d != 1]


def _made_of_indices(v: ir.Value) -> bool:
    """v is computed from ``kf.fill`` and ``kf.iota`` alone, through elementwise ops whose
    operands are of v's rank or rank 0 (what a transpose can move onto)."""
    op = defining(v)
    if op is None:
        return False
    if op.name in ("kf.fill", "kf.iota"):
        return True
    spec = BY_NAME.get(op.name)
    rank = spec_of(v.type).rank
    return (spec is not None and spec.category == "elementwise" and len(op.results) == 1
            and all(spec_of(o.type).rank in (0, rank) and _made_of_indices(o) for o in op.operands))


_KEEPDIM_REDUCTIONS = {"kf.sum", "kf.mean", "kf.reduce_max", "kf.reduce_min", "kf.var"}


def _unbatched(v: ir.Value, lead: tuple[int, ...]) -> ir.Value | None:
    """A value with batch dims ``lead`` whose batch dims merged are v -- v's reshape
    operand, or the transpose of one where v transposes its last two dims --, else None.
    Made at the current insertion point."""
    op = defining(v)
    shape = spec_of(v.type).shape
    if op is None or len(shape) != 3 or math.prod(lead) != shape[0]:
        return None
    if op.name == "kf.reshape" and spec_of(op.operands[0].type).shape == lead + shape[-2:]:
        return op.operands[0]
    if transposes_last_two(op):
        inner = _unbatched(op.operands[0], lead)
        if inner is not None:
            n = len(lead) + 2
            return builders.transpose(inner, perm=list(range(n - 2)) + [n - 1, n - 2])
    return None


def _ops_in_order(root: ir.Operation) -> list[ir.Operation]:
    found: list[ir.Operation] = []

    def visit(op):
        found.append(op.operation)
        return ir.WalkResult.ADVANCE

    root.walk(visit, ir.WalkOrder.POST_ORDER)
    return found


@dataclasses.dataclass(frozen=True)
class CanonicalizePass(KfPass):
    NAME = "kf-canonicalize"
    DESCRIPTION = "fold constants, simplify broadcasts, reshapes and transposes, remove dead kf ops"
    max_iterations: int = 16

    def __post_init__(self):
        # 0 or fewer sweeps would leave the module as it is, silently
        if self.max_iterations < 1:
            raise ValueError(f"pass '{self.NAME}': max-iterations must be 1 or more, got {self.max_iterations}")

    def run(self, module: ir.Operation) -> None:
        for _ in range(self.max_iterations):
            rw = _Rewriter()
            # Visit users before producers so dead chains disappear in one sweep.
            for op in reversed(_ops_in_order(module)):
                if op.name.startswith("kf."):
                    rw.apply(op)
            if not rw.changed:
                return


