"""The generic strategy: correct for every kf op and any DAG of them, the fallback of
every other strategy.

Design: one thread per element of the kernel's outputs. (A kernel of column sums -- the
sums over leading dims of a norm's backward -- takes the columns plan instead,
``columns.py``: slices of rows a column, added in workgroup memory.) A thread computes its element
by evaluating the kernel function's DAG *backwards from that element*: the value of
tensor ``v`` at index ``idx`` is a load when ``v`` is a kernel input, and otherwise the
op that made ``v`` computes it from its operands' values at remapped indices:

- elementwise ops read their operands at the broadcast index (scalar_math computes);
- layout ops (transpose, reshape, broadcast_to, slice, concat) only remap the index
  (concat picks its operand with an ``scf.if``, so no out-of-bounds load is made);
- reductions (sum, mean, reduce_max/min, var, argmax) run an inner ``scf.for`` over the
  reduced elements (var: two passes, mean then squared deviations), softmax and
  log_softmax three (max, sum of exp, the element), logsumexp two (max, sum of exp);
- matmul runs an ``scf.for`` over K;
- topk: output position p along dim is the (p+1)-th pass of a selection that walks the
  row in the total order (value, then index; NaN largest), each pass picking the best
  element after the previous pick, so no per-row scratch memory is needed;
- gather / index_select load the index and read the input there; index_add and
  scatter_add loop, per output element, over the index and sum the sources that land
  on it: deterministic, no atomics (an index_add of a long index sorts it first and
  walks only its own segment: segments.py). Every index is checked against the
  dimension it indexes where it is used (``emit.IndexChecks``): one out of range is
  clamped to 0 (no access leaves the buffer) and sets the program's error flag, which
  the launcher raises as an IndexError naming the op and the user's line;
- constant: a splat is one constant, other constants a chain of selects on the linear
  index (up to ``MAX_CONSTANT_ELEMENTS``: bigger ones should be kernel inputs); fill: a
  constant;
- rand: the element's sample of the Philox block its linear index names
  (``passes/philox.py``), so a value recomputed in another kernel or thread is the same.

Values of one tensor at one index are computed once per region (a cache scoped to the
``scf.for``/``scf.if`` bodies they dominate), so a value used twice, like ``x`` in
``x * sigmoid(x)``, is loaded once.

Precision: values flow between ops in their compute type (f32 for f16, bf16 and fp8) and
are rounded once, when stored; only kf.cast rounds on the way (it is a rounding by
definition). Reductions and matmul accumulate in the compute type of their result.

What this asks of kf-fuse: nothing for correctness (any DAG, several results of any
shapes: the thread count is the largest output's size and each output is guarded by its
own). Cost is per output element and grows with the nesting of reduction-like ops:
a reduction or matmul costs its extent, softmax three passes over its row (O(n²) per
row: the rowwise strategy is the fast path), topk O(k·n), index_add and scatter_add the
length of their index, and a reduction feeding a reduction the product of both. So
kf-fuse should give a generic kernel at most one reduction-like op (reduction, softmax,
matmul, topk, index_add, scatter_add), with any elementwise and layout ops around it.
Indices are MLIR ``index`` values: 64-bit on CUDA, 32-bit on SPIR-V (tensors below 2^31
elements there).

Run-time sizes (run_time_sizes.py): the strategy takes a run-time dim anywhere in a
tensor (a sequence after heads: the transposes of attention's q/k/v, the rotary
embedding's slices and cat), since every tensor with one is a flat buffer addressed with
strides from the sizes; ``Evaluator.shape`` gives each tensor's shape with its run-time
extent (``RunTimeShapes``), which the thread's output index, reshapes, reductions and
means, concats along the dim and the columns plan read. What needs the extent at compile
time raises ValueError (the driver then compiles static sizes): a variance over it,
index_add / scatter over it, indices checked against it, random numbers.
"""

from __future__ import annotations

import contextlib
import math
from collections.abc import Callable, Sequence

from kf.dialects.attrs import op_attrs
from kf.dialects.types import normalize_dim, spec_of
from kf.passes import philox
from kf.passes import scalar_math as sm
from mlir import ir
from mlir.dialects import arith, scf

from . import emit as E
from . import run_time_sizes, segments
from .base import EmittedKernel, NotApplicable, Strategy, TargetInfo, register

MAX_CONSTANT_ELEMENTS = 1024


class Evaluator:
    """Computes the value of any tensor of a kernel function at an index, in compute type.

    ``inputs`` maps the kernel function's block arguments (by number) to the gpu.func's
    memrefs. ``checks`` (``emit.IndexChecks``) checks the indices of gather,
    index_select, index_add and scatter_add; an evaluator without it refuses them
    (NotApplicable), so no strategy can read through an unchecked index. Subclasses may
    override ``load_input`` (the elementwise strategy loads vectors there).
    ``short_forms``: whether results stored as bf16/f16/fp8 take scalar_math's short forms.
    """

    def __init__(self, kb: E.IndexBuilder, inputs: Sequence[ir.Value], checks: E.IndexChecks | None = None,
                 short_forms: bool = True):
        self.kb = kb
        self.short_forms = short_forms
        self.inputs = list(inputs)
        self.checks = checks
        self._scopes: list[dict] = [{}]
        #: run_time_sizes.RunTimeShapes of a kernel with run-time sizes, and which inputs
        #: are flat buffers (addressed with run-time strides)
        self.shapes = None
        self.flat: Sequence[bool] = ()
        #: index_add op -> its sorted table (segments.py), where the kernel sorts its index
        self.segments: dict = {}

    # ---- shapes (with run-time sizes: index values at the run-time dims)

    def shape(self, v: ir.Value) -> list:
        return self.shapes.shape(v) if self.shapes is not None else list(E.shape_of(v))

    def numel(self, shape: Sequence[E.Ix]) -> E.Ix:
        out: E.Ix = 1
        for d in shape:
            out = self.kb.mul(out, d)
        return out

    def static(self, v: ir.Value, why: str) -> None:
        """ValueError where v has a run-time size that the rule for ``why`` needs static."""
        if self.shapes is not None and self.shapes.has(v):
            raise ValueError(f"the generic strategy takes no run-time size in {why}")

    # ---- caching by region

    @contextlib.contextmanager
    def scope(self):
        """Values cached inside belong to the region being built and vanish after it."""
        self._scopes.append({})
        try:
            yield
        finally:
            self._scopes.pop()

    def seed(self, op: ir.Operation, idx, values) -> None:
        """Record op's value at idx, computed elsewhere (a column sum's total,
        ``columns.py``), for the region being built."""
        self._scopes[-1][("op", op, tuple(idx))] = values if isinstance(values, list) else [values]

    def _lookup(self, key):
        for s in reversed(self._scopes):
            if key in s:
                return s[key]
        return None

    # ---- structured control flow

    def loop(self, ub: E.Ix, inits: Sequence[ir.Value], body: Callable[[ir.Value, list], list]) -> list[ir.Value]:
        """scf.for iv in [0, ub) carrying inits; body(iv, carried) returns the next values."""
        kb = self.kb
        loop = scf.ForOp(kb.value(0), kb.value(ub), kb.value(1), list(inits))
        with ir.InsertionPoint(loop.body), self.scope():
            scf.YieldOp(body(loop.induction_variable, list(loop.inner_iter_args)))
        return list(loop.results)

    def branch(self, cond: ir.Value, then: Callable[[], list], other: Callable[[], list],
               types: Sequence[ir.Type]) -> list[ir.Value]:
        op = scf.IfOp(cond, list(types), has_else=True)
        with ir.InsertionPoint(op.then_block), self.scope():
            scf.YieldOp(then())
        with ir.InsertionPoint(op.else_block), self.scope():
            scf.YieldOp(other())
        return list(op.results)

    # ---- values

    def value(self, v: ir.Value, idx: Sequence[E.Ix]) -> ir.Value:
        idx = tuple(idx)
        owner = v.owner
        if isinstance(owner, ir.Block):
            key = ("arg", v, idx)
            hit = self._lookup(key)
            if hit is None:
                hit = self.load_input(ir.BlockArgument(v).arg_number, idx, spec_of(v.type).elem)
                self._scopes[-1][key] = hit
            return hit
        op = owner.operation if hasattr(owner, "operation") else owner
        key = ("op", op, idx)
        hit = self._lookup(key)
        if hit is None:
            hit = self.compute(op, list(idx), ir.OpResult(v).result_number)
            self._scopes[-1][key] = hit
        return hit[ir.OpResult(v).result_number]

    def load_input(self, arg: int, idx: tuple, elem: str | None = None) -> ir.Value:
        if arg < len(self.flat) and self.flat[arg]:
            shape = self.shapes.shape(self.shapes.args[arg])
            return E.load(self.inputs[arg], [self.kb.linearize(idx, shape)], self.kb, elem)
        return E.load(self.inputs[arg], idx, self.kb, elem)

    def compute(self, op: ir.Operation, idx: list, which: int) -> list[ir.Value]:
        """The values of all of op's results at idx (``which`` is the one asked for)."""
        name = op.name
        attrs = op_attrs(op)
        if name in E.ELEMENTWISE:
            out = E.shape_of(op.results[0])
            args = [self.value(o, E.broadcast_index(idx, E.shape_of(o), out)) for o in op.operands]
            return [E.elementwise_value(op, args, attrs, self.short_forms)]
        handler = _HANDLERS.get(name)
        if handler is None:
            raise NotImplementedError(f"the generic strategy has no rule for {name}")
        if name in E.INDEXING_OPS and self.checks is None:
            raise NotApplicable(f"{name} needs its indices checked (a kernel with the index error flag)")
        return handler(self, op, idx, attrs)

    def index(self, op: ir.Operation, index: ir.Value, at: Sequence[E.Ix], dim: int) -> ir.Value | None:
        """Element ``at`` of the index tensor ``index`` of op, checked against dimension
        ``dim`` of op's input and clamped into it (None: the dimension is empty)."""
        if self.shapes is not None and self.shapes.has(op.operands[0]) and \
                not isinstance(self.shape(op.operands[0])[dim], int):
            raise ValueError(f"the generic strategy takes no run-time size in the dim {op.name} indexes")
        bound = E.shape_of(op.operands[0])[dim]
        return self.checks.check(op, self.value(index, at), bound, dim)


# --------------------------------------------------------------------------- per-op rules


def _reduced(rank: int, dims: Sequence[int]) -> list[int]:
    if rank == 0:
        return []
    return sorted({normalize_dim(int(d), rank) for d in dims}) if dims else list(range(rank))


def _input_index(x_shape, red, idx, keepdim):
    """The index into the reduced tensor with None at the reduced dims."""
    kept_idx = [i for d, i in enumerate(idx) if d not in red] if keepdim else list(idx)
    it = iter(kept_idx)
    return [None if d in red else next(it) for d in range(len(x_shape))]


def _reduce_loop(ev: Evaluator, x: ir.Value, red, base, inits, combine):
    """Loop over every element of x along dims red (base holds the other coordinates);
    combine(xv, carried) returns the next carried values."""
    xs = ev.shape(x)
    extents = [xs[d] for d in red]
    kb = ev.kb

    def body(j, carried):
        coords = iter(kb.delinearize(j, extents))
        full = [next(coords) if b is None else b for b in base]
        return combine(ev.value(x, full), carried, j)

    return ev.loop(ev.numel(extents), inits, body)


def _sum_like(ev: Evaluator, op, idx, attrs):
    x = op.operands[0]
    xs = E.shape_of(x)
    red = _reduced(len(xs), attrs.get("dims", []))
    base = _input_index(xs, red, idx, bool(attrs.get("keepdim", False)))
    out_t = E.compute_type(E.elem_of(op.results[0]))
    n = ev.numel([ev.shape(x)[d] for d in red])
    if op.name in ("kf.sum", "kf.mean"):
        [s] = _reduce_loop(ev, x, red, base, [sm.const(out_t, 0)],
                           lambda v, c, j: [sm.emit("add", [c[0], sm.convert(v, out_t)])])
        return [arith.divf(s, count(n, out_t)) if op.name == "kf.mean" else s]
    largest = op.name == "kf.reduce_max"
    init = E.min_value(out_t) if largest else E.max_value(out_t)
    [s] = _reduce_loop(ev, x, red, base, [sm.const(out_t, init)],
                       lambda v, c, j: [sm.emit("max" if largest else "min", [v, c[0]])])
    return [s]


def count(n: E.Ix, t: ir.Type) -> ir.Value:
    """An element count as a float of type t (a run-time one converted)."""
    if isinstance(n, int):
        return sm.const(t, n)
    return arith.uitofp(t, arith.index_cast(ir.IntegerType.get_signless(64), n))


def _var(ev: Evaluator, op, idx, attrs):
    x = op.operands[0]
    xs = E.shape_of(x)
    red = _reduced(len(xs), attrs.get("dims", []))
    if not all(isinstance(ev.shape(x)[d], int) for d in red):
        raise ValueError("the generic strategy takes no run-time size in the dims of a variance")
    base = _input_index(xs, red, idx, bool(attrs.get("keepdim", False)))
    t = E.compute_type(E.elem_of(op.results[0]))
    n = E.numel([xs[d] for d in red])
    # Two passes, as kf-lower-to-linalg: E[x²] - E[x]² loses everything for a large mean.
    [s] = _reduce_loop(ev, x, red, base, [sm.const(t, 0)], lambda v, c, j: [arith.addf(c[0], v)])
    mean = arith.divf(s, sm.const(t, n))

    def sq(v, c, j):
        d = arith.subf(v, mean)
        return [arith.addf(c[0], arith.mulf(d, d))]

    [m2] = _reduce_loop(ev, x, red, base, [sm.const(t, 0)], sq)
    return [sm.variance(m2, n, float(attrs.get("correction", 1.0)))]


def _argmax(ev: Evaluator, op, idx, attrs):
    x = op.operands[0]
    xs = E.shape_of(x)
    i64 = ir.IntegerType.get_signless(64)
    if not xs:
        return [sm.const(i64, 0)]
    dim = normalize_dim(int(attrs["dim"]), len(xs))
    base = _input_index(xs, [dim], idx, bool(attrs.get("keepdim", False)))
    t = E.compute_type(E.elem_of(x))

    def step(v, c, j):
        best, best_i = c
        ji = ev.kb.to_i64(j)
        take = arith.ori(arith.cmpi(arith.CmpIPredicate.eq, best_i, sm.const(i64, -1)), E.better(v, best, True))
        return [arith.select(take, v, best), arith.select(take, ji, best_i)]

    _, bi = _reduce_loop(ev, x, [dim], base, [sm.const(t, 0), sm.const(i64, -1)], step)
    return [bi]


def _softmax(ev: Evaluator, op, idx, attrs):
    x = op.operands[0]
    xs = E.shape_of(x)
    t = E.compute_type(E.elem_of(op.results[0]))
    log = op.name == "kf.log_softmax"
    if not xs:  # one element: x - x is 0, or NaN for +-inf and NaN (torch gives NaN there)
        v = sm.convert(ev.value(x, idx), t)
        shifted = arith.subf(v, v)
        return [shifted if log else sm.emit("exp", [shifted])]
    dim = normalize_dim(int(attrs["dim"]), len(xs))
    base = [None if d == dim else i for d, i in enumerate(idx)]
    [mx] = _reduce_loop(ev, x, [dim], base, [sm.const(t, -math.inf)], lambda v, c, j: [arith.maximumf(c[0], v)])
    [total] = _reduce_loop(ev, x, [dim], base, [sm.const(t, 0)],
                           lambda v, c, j: [arith.addf(c[0], sm.emit("exp", [arith.subf(v, mx)]))])
    shifted = arith.subf(ev.value(x, idx), mx)
    if log:
        return [arith.subf(shifted, sm.emit("log", [total]))]
    return [arith.divf(sm.emit("exp", [shifted]), total)]


def _logsumexp(ev: Evaluator, op, idx, attrs):
    """log(sum(exp(x))) over dims as torch.logsumexp: m + log(sum(exp(x - m))) with m the
    maximum, 0 where that is infinite (so a row of -inf is -inf, one holding +inf +inf).
    The attention kernel function's second output where the generic strategy takes it
    (sizes of 0)."""
    x = op.operands[0]
    xs = E.shape_of(x)
    red = _reduced(len(xs), attrs.get("dims", []))
    base = _input_index(xs, red, idx, bool(attrs.get("keepdim", False)))
    t = E.compute_type(E.elem_of(op.results[0]))
    [mx] = _reduce_loop(ev, x, red, base, [sm.const(t, -math.inf)],
                        lambda v, c, j: [arith.maximumf(c[0], sm.convert(v, t))])
    infinite = arith.cmpf(arith.CmpFPredicate.OEQ, sm.emit("abs", [mx]), sm.const(t, math.inf))
    mx = arith.select(infinite, sm.const(t, 0.0), mx)
    [total] = _reduce_loop(ev, x, red, base, [sm.const(t, 0)], lambda v, c, j: [
        arith.addf(c[0], sm.emit("exp", [arith.subf(sm.convert(v, t), mx)]))])
    return [arith.addf(sm.emit("log", [total]), mx)]


def _matmul(ev: Evaluator, op, idx, attrs):
    a, b = op.operands
    sa, sb, so = E.shape_of(a), E.shape_of(b), E.shape_of(op.results[0])
    t = E.compute_type(E.elem_of(op.results[0]))
    batch, i, j = idx[:-2], idx[-2], idx[-1]
    a_batch = E.broadcast_index(batch, sa[:-2], so[:-2])
    b_batch = E.broadcast_index(batch, sb[:-2], so[:-2])

    def step(k, c):
        x = sm.convert(ev.value(a, [*a_batch, i, k]), t)
        y = sm.convert(ev.value(b, [*b_batch, k, j]), t)
        return [sm.emit("add", [c[0], sm.emit("mul", [x, y])])]

    return ev.loop(ev.shape(a)[-1], [sm.const(t, 0)], step)


def _transpose(ev: Evaluator, op, idx, attrs):
    perm = [int(p) for p in attrs["perm"]]
    src = [0] * len(perm)
    for j, p in enumerate(perm):
        src[p] = idx[j]
    return [ev.value(op.operands[0], src)]


def _reshape(ev: Evaluator, op, idx, attrs):
    x = op.operands[0]
    lin = ev.kb.linearize(idx, ev.shape(op.results[0]))
    return [ev.value(x, ev.kb.delinearize(lin, ev.shape(x)))]


def _broadcast_to(ev: Evaluator, op, idx, attrs):
    x = op.operands[0]
    return [ev.value(x, E.broadcast_index(idx, E.shape_of(x), E.shape_of(op.results[0])))]


def _slice(ev: Evaluator, op, idx, attrs):
    """A slice reads its input at start + i * step; a start counted from the end of a
    run-time dim (dialects.ops.slice_bounds) is the dim's run-time size plus it."""
    x = op.operands[0]
    dim = normalize_dim(int(attrs["dim"]), len(E.shape_of(x)))
    start = int(attrs["start"])
    if start < 0:
        start = ev.kb.add(ev.shape(x)[dim], start)
    src = list(idx)
    src[dim] = ev.kb.add(start, ev.kb.mul(idx[dim], int(attrs.get("step", 1))))
    return [ev.value(x, src)]


def _concat(ev: Evaluator, op, idx, attrs):
    lhs, rhs = op.operands
    dim = normalize_dim(int(attrs["dim"]), len(E.shape_of(lhs)))
    n0 = ev.shape(lhs)[dim]
    right = list(idx)
    right[dim] = ev.kb.sub(idx[dim], n0)
    cond = ev.kb.lt(idx[dim], n0)
    if isinstance(cond, bool):
        return [ev.value(lhs, idx) if cond else ev.value(rhs, right)]
    t = E.compute_type(E.elem_of(op.results[0]))
    return ev.branch(cond, lambda: [ev.value(lhs, idx)], lambda: [ev.value(rhs, right)], [t])


def _topk(ev: Evaluator, op, idx, attrs):
    x = op.operands[0]
    xs = E.shape_of(x)
    dim = normalize_dim(int(attrs["dim"]), len(xs))
    largest = bool(attrs.get("largest", True))
    t = E.compute_type(E.elem_of(x))
    i64 = ir.IntegerType.get_signless(64)
    base = [None if d == dim else i for d, i in enumerate(idx)]
    minus_one = sm.const(i64, -1)

    def ranks_before(v, vi, w, wi):
        """(v, vi) comes before (w, wi) in the order topk lists elements."""
        return arith.ori(E.better(v, w, largest),
                         arith.andi(E.same(v, w), arith.cmpi(arith.CmpIPredicate.slt, vi, wi)))

    def one_pass(p, prev):
        pv, pi = prev

        def step(v, c, j):
            bv, bi = c
            ji = ev.kb.to_i64(j)
            after_prev = arith.ori(arith.cmpi(arith.CmpIPredicate.eq, pi, minus_one), ranks_before(pv, pi, v, ji))
            first = arith.cmpi(arith.CmpIPredicate.eq, bi, minus_one)
            take = arith.andi(after_prev, arith.ori(first, ranks_before(v, ji, bv, bi)))
            return [arith.select(take, v, bv), arith.select(take, ji, bi)]

        return _reduce_loop(ev, x, [dim], base, [pv, minus_one], step)

    # Position p along dim is pass p + 1 of the selection.
    count = ev.kb.add(idx[dim], 1)
    v, i = ev.loop(count, [sm.const(t, 0), minus_one], one_pass)
    return [v, i]


def _scan(ev: Evaluator, op, idx, attrs):
    """Position i along dim combines elements 0..i: a loop of i + 1 trips per output
    element (O(n^2) over a row: correct everywhere, fast for short rows)."""
    x = op.operands[0]
    dim = normalize_dim(int(attrs["dim"]), len(E.shape_of(x)))
    kind = attrs["kind"]
    t = E.compute_type(E.elem_of(op.results[0]))

    def step(j, c):
        at = list(idx)
        at[dim] = j
        return [sm.scan_step(kind, c[0], sm.convert(ev.value(x, at), t))]

    return ev.loop(ev.kb.add(idx[dim], 1), [sm.scan_identity(kind, t)], step)


def _zero(op) -> ir.Value:
    return sm.const(E.compute_type(E.elem_of(op.results[0])), 0)


def _gather(ev: Evaluator, op, idx, attrs):
    x, index = op.operands
    dim = normalize_dim(int(attrs["dim"]), len(E.shape_of(x)))
    src = list(idx)
    src[dim] = ev.index(op, index, idx, dim)
    return [_zero(op) if src[dim] is None else ev.value(x, src)]


def _index_select(ev: Evaluator, op, idx, attrs):
    x, index = op.operands
    dim = normalize_dim(int(attrs["dim"]), len(E.shape_of(x)))
    src = list(idx)
    src[dim] = ev.index(op, index, [idx[dim]], dim)
    return [_zero(op) if src[dim] is None else ev.value(x, src)]


def _target(ev: Evaluator, op, index: ir.Value, at: Sequence[E.Ix], dim: int) -> ir.Value:
    """The index element ``at`` that index_add / scatter_add compare with an output
    position along dim: checked (out of range it sets the flag and matches nothing)."""
    v = ev.value(index, at)
    ev.checks.verify(op, v, E.shape_of(op.operands[0])[dim], dim)
    return ev.kb.from_int(v)


def _written_dim_static(ev: Evaluator, op, dim: int) -> None:
    """ValueError where the dim index_add / scatter_add / scatter_reduce write along is
    a run-time size (the indices are checked against it as a static bound). Their
    other dims, and the number of indices, may be run-time sizes (a loss's rows, the
    tokens of an embedding's gradient)."""
    if not isinstance(ev.shape(op.operands[0])[dim], int):
        raise ValueError(f"the generic strategy takes no run-time size in the dim {op.name} writes along")


def _index_add(ev: Evaluator, op, idx, attrs):
    x, index, source = op.operands
    dim = normalize_dim(int(attrs["dim"]), len(E.shape_of(x)))
    _written_dim_static(ev, op, dim)
    table = ev.segments.get(op)
    if table is not None:
        return segments.segment_sum(ev, op, idx, dim, table)
    target = ev.kb.value(idx[dim])

    def step(i, c):
        hit = arith.cmpi(arith.CmpIPredicate.eq, _target(ev, op, index, [i], dim), target)
        at = list(idx)
        at[dim] = i
        return [arith.select(hit, sm.emit("add", [c[0], ev.value(source, at)]), c[0])]

    return ev.loop(ev.shape(index)[0], [ev.value(x, idx)], step)


def _scatter_add(ev: Evaluator, op, idx, attrs):
    x, index, source = op.operands
    xs, ishape = ev.shape(x), ev.shape(index)
    dim = normalize_dim(int(attrs["dim"]), len(xs))
    _written_dim_static(ev, op, dim)
    kb = ev.kb
    # Sources land on idx only from index positions that agree with idx outside dim;
    # when idx lies beyond the index's extent in such a dim, none do (zero trips).
    trips = _index_trips(kb, idx, xs, ishape, dim)
    if trips is None:
        return [ev.value(x, idx)]  # statically beyond the index: nothing lands here
    target = kb.value(idx[dim])

    def step(j, c):
        at = list(idx)
        at[dim] = j
        hit = arith.cmpi(arith.CmpIPredicate.eq, _target(ev, op, index, at, dim), target)
        return [arith.select(hit, sm.emit("add", [c[0], ev.value(source, at)]), c[0])]

    return ev.loop(trips, [ev.value(x, idx)], step)


def _index_trips(kb, idx, xs, ishape, dim: int):
    """How many index positions along dim a loop over the index visits for output
    element idx: all of them where idx lies within the index's extent in every other dim,
    none where it lies beyond (a select at run time); None where it is statically beyond.
    Extents may be run-time sizes (index values): an index as long as the output in a
    dim (the same size) needs no test there, any other run-time extent is tested."""
    conds = []
    for d in range(len(xs)):
        if d == dim or ishape[d] is xs[d]:
            continue
        if not (isinstance(ishape[d], int) and isinstance(xs[d], int)) or ishape[d] < xs[d]:
            c = kb.lt(idx[d], ishape[d])
            if c is False:
                return None
            if c is not True:
                conds.append(c)
    trips: E.Ix = ishape[dim]
    if conds:
        inside = conds[0]
        for c in conds[1:]:
            inside = arith.andi(inside, c)
        trips = arith.select(inside, kb.value(ishape[dim]), kb.value(0))
    return trips


def _scatter_reduce(ev: Evaluator, op, idx, attrs):
    """As scatter_add: a loop over the index positions that agree with idx outside dim,
    combining the sources whose index names idx along dim, counting them (the first
    replaces the input's element unless include_self; a mean divides by the count)."""
    x, index, source = op.operands
    xs, ishape = ev.shape(x), ev.shape(index)
    dim = normalize_dim(int(attrs["dim"]), len(xs))
    _written_dim_static(ev, op, dim)
    reduce, include = attrs["reduce"], bool(attrs["include_self"])
    kb = ev.kb
    t = E.compute_type(E.elem_of(op.results[0]))
    i64 = ir.IntegerType.get_signless(64)
    start = [sm.convert(ev.value(x, idx), t), sm.const(i64, 1 if include else 0)]
    trips = _index_trips(kb, idx, xs, ishape, dim)
    if trips is None:
        return [start[0]]
    target = kb.value(idx[dim])

    def step(j, c):
        acc, n = c
        at = list(idx)
        at[dim] = j
        hit = arith.cmpi(arith.CmpIPredicate.eq, _target(ev, op, index, at, dim), target)
        v = sm.convert(ev.value(source, at), t)
        new = sm.scatter_step(reduce, acc, v)
        if not include:
            new = arith.select(arith.cmpi(arith.CmpIPredicate.eq, n, sm.const(i64, 0)), v, new)
        return [arith.select(hit, new, acc), arith.select(hit, arith.addi(n, sm.const(i64, 1)), n)]

    acc, n = ev.loop(trips, start, step)
    return [sm.scatter_mean(acc, n) if reduce == "mean" else acc]


def _constant(ev: Evaluator, op, idx, attrs):
    out = op.results[0]
    t = E.compute_type(E.elem_of(out))
    value = op.attributes["value"]
    dense = ir.DenseElementsAttr(value)
    floats = sm.is_float(ir.RankedTensorType(out.type).element_type)
    if dense.is_splat:
        return [_scalar_const(ev, t, _splat(dense, floats))]
    n = len(dense)
    if n > MAX_CONSTANT_ELEMENTS:
        raise NotImplementedError(f"a non-splat kf.constant of {n} elements (the generic strategy inlines at most "
                                  f"{MAX_CONSTANT_ELEMENTS}): pass it to the kernel as an input")
    items = _elements(dense, floats)
    lin = ev.kb.linearize(idx, E.shape_of(out))
    if isinstance(lin, int):
        return [_scalar_const(ev, t, items[lin])]
    v = _scalar_const(ev, t, items[0])
    for k in range(1, n):
        v = arith.select(ev.kb.eq(lin, k), _scalar_const(ev, t, items[k]), v)
    return [v]


def _splat(dense, floats: bool):
    if floats:
        return float(ir.DenseFPElementsAttr(dense).get_splat_value().value)
    return int(ir.DenseIntElementsAttr(dense).get_splat_value().value)


def _elements(dense, floats: bool) -> list:
    if floats:
        d = ir.DenseFPElementsAttr(dense)
        return [float(d[i]) for i in range(len(d))]
    d = ir.DenseIntElementsAttr(dense)
    return [int(d[i]) for i in range(len(d))]


def _scalar_const(ev: Evaluator, t: ir.Type, value) -> ir.Value:
    if not sm.is_float(t) and ir.IntegerType(t).width == 1:
        value = 1 if value else 0
    return ev.kb.const(t, value)


def _rand(ev: Evaluator, op, idx, attrs):
    """The element's sample of its Philox block, found from its linear index (passes/philox.py)."""
    state = op.operands[0]
    ev.static(op.results[0], "random numbers (their linear index)")
    seed, offset = ev.value(state, [0]), ev.value(state, [1])
    lin = ev.kb.value(ev.kb.linearize(idx, E.shape_of(op.results[0])))
    return [philox.sample(seed, offset, int(attrs["offset"]), lin, attrs["distribution"])]


def _iota(ev: Evaluator, op, idx, attrs):
    i = idx[int(attrs["dim"]) % len(idx)]
    t = E.compute_type(E.elem_of(op.results[0]))
    return [ev.kb.const(t, i) if isinstance(i, int) else E.index_value(i, t)]


def _fill(ev: Evaluator, op, idx, attrs):
    elem = E.elem_of(op.results[0])
    t = E.compute_type(elem)
    value = float(attrs["value"])
    if elem == "i1":
        value = 1 if value != 0 else 0
    elif not sm.is_float(t):
        value = int(value)
    return [E.round_to(ev.kb.const(t, value), elem) if elem in E.LOW_PRECISION else ev.kb.const(t, value)]


_HANDLERS = {
    "kf.sum": _sum_like, "kf.mean": _sum_like, "kf.reduce_max": _sum_like, "kf.reduce_min": _sum_like,
    "kf.var": _var, "kf.argmax": _argmax, "kf.softmax": _softmax, "kf.log_softmax": _softmax,
    "kf.logsumexp": _logsumexp,
    "kf.matmul": _matmul, "kf.transpose": _transpose, "kf.reshape": _reshape, "kf.broadcast_to": _broadcast_to,
    "kf.slice": _slice, "kf.concat": _concat, "kf.topk": _topk, "kf.gather": _gather,
    "kf.index_select": _index_select, "kf.index_add": _index_add, "kf.scatter_add": _scatter_add,
    "kf.constant": _constant, "kf.fill": _fill, "kf.rand": _rand,
    "kf.iota": _iota, "kf.scan": _scan, "kf.scatter_reduce": _scatter_reduce,
}


# --------------------------------------------------------------------------- the strategy


def emit_outputs(ev: Evaluator, kernel: ir.Operation, outputs: Sequence[ir.Value], lin: ir.Value,
                 total: E.Ix, flat: Sequence[bool] = ()) -> None:
    """Store element lin of every kernel output (each guarded by its own size when it is
    smaller than total, the thread count, or a run-time size). ``flat``: per output,
    whether its buffer is flat (run-time strides)."""
    kb = ev.kb
    for k, (value, mem) in enumerate(zip(E.kernel_results(kernel), outputs)):
        shape = ev.shape(value)
        n = ev.numel(shape)

        def write(shape=shape, value=value, mem=mem, k=k):
            idx = kb.delinearize(lin, shape)
            at = [kb.linearize(idx, shape)] if k < len(flat) and flat[k] else idx
            E.store(ev.value(value, idx), mem, at, kb)

        if n is total or (isinstance(n, int) and isinstance(total, int) and n == total):
            write()
            continue
        guard = scf.IfOp(kb.lt(lin, n))
        with ir.InsertionPoint(guard.then_block), ev.scope():
            write()
            scf.YieldOp([])


def _run_time_items(ev: Evaluator, kernel: ir.Operation) -> E.Ix:
    """The threads' items with run-time sizes: the largest output's elements."""
    items: E.Ix = 0
    for value in E.kernel_results(kernel):
        n = ev.numel(ev.shape(value))
        if isinstance(n, int) and isinstance(items, int):
            items = max(items, n)
        elif isinstance(items, int) and items == 0:
            items = n
        else:
            items = arith.maxui(ev.kb.value(items), ev.kb.value(n))
    return items


def _run_time_grid(kernel: ir.Operation, plan: dict, slots: list, n_in: int) -> str:
    """Grid x over the slots (``KernelABI.grid_sizes``): the plan's where it strides over
    the grid, else the workgroups of the largest output (each output with a run-time
    size as its slot times its elements per run-time row)."""
    block, grid = int(plan["block"]), int(plan["grid"])
    if plan["grid_stride"]:
        return str(grid)
    terms = []
    for k, value in enumerate(E.kernel_results(kernel)):
        n = E.numel(E.shape_of(value))
        slot = next((i for i, (pos, _) in enumerate(slots) if pos == n_in + k), None)
        terms.append(str(-(-n // block)) if slot is None else
                     run_time_sizes.grid_text(slot, n // run_time_sizes.BOUND, block))
    return terms[0] if len(terms) == 1 else "Max(" + ", ".join(terms) + ")"


class GenericStrategy(Strategy):
    KIND = "generic"

    def plan(self, kernel: ir.Operation, target: TargetInfo) -> dict:
        """One thread an output element; or, for a kernel of column sums of its inputs,
        ``columns.py``'s plan (``mode = "columns"``: slices of rows a column)."""
        from . import columns

        by_columns = columns.plan(kernel, target.max_threads, E.max_grid_x(target.name))
        if by_columns is not None:
            return by_columns
        _, outs = E.kernel_signature(kernel)
        total = max((E.numel(s.shape) for s in outs), default=1)
        block = min(256, target.max_threads)
        grid, stride = E.launch_geometry(total, block, E.max_grid_x(target.name))
        plan = {"strategy": "generic", "block": block, "numel": total, "grid": grid, "grid_stride": stride}
        if segments.segment_op(kernel) is not None:
            plan["segments"] = True  # a long index_add's index sorted first (segments.py)
        return plan

    def emit(self, kernel: ir.Operation, plan: dict, gpu_module: ir.Operation, target: TargetInfo) -> EmittedKernel:
        ins, outs = E.kernel_signature(kernel)
        name = E.kernel_name(kernel)
        block, total, grid = int(plan["block"]), int(plan["numel"]), int(plan["grid"])
        flagged = E.uses_indices(kernel)
        base = E.IndexChecks.first_site(gpu_module)
        slots = [tuple(x) for x in plan.get("sizes", [])]
        # with run-time sizes every tensor that has one is a flat buffer (its strides
        # may be run-time sizes: a sequence after heads)
        flat = [any(pos == k for pos, _ in slots) for k in range(len(ins) + len(outs))] if slots else []
        prelude = sorted_op = None
        if plan.get("segments") and plan.get("mode") != "columns":
            sorted_op = segments.segment_op(kernel)
        if sorted_op is not None:
            prelude = segments.emit_table(kernel, sorted_op, gpu_module, target, Evaluator, slots, flat[:len(ins)])
        extra = [segments.table_spec(sorted_op)] if prelude is not None else []
        # the table is one more input, static (at the bound of a run-time index length)
        gflat = [*flat[:len(ins)], *[False] * len(extra), *flat[len(ins):]] if flat else []
        gfunc, entry = E.make_gpu_func(gpu_module, name, [*ins, *extra], outs, [block], kernel.location,
                                       target=target.name, index_flag=flagged, sizes=len(slots), flat=gflat)
        args = list(entry.arguments)
        if extra:
            table = args.pop(len(ins))
        if plan.get("mode") == "columns":
            from . import columns

            wg = ir.Attribute.parse("#gpu.address_space<workgroup>")
            scratch = entry.add_argument(ir.MemRefType.get([block], ir.F32Type.get(), None, wg), kernel.location)
            gfunc.attributes["workgroup_attributions"] = ir.IntegerAttr.get(ir.IntegerType.get_signless(64), 1)
            with kernel.location, ir.InsertionPoint(entry):
                kb = E.IndexBuilder(entry)
                ev = Evaluator(kb, args[:len(ins)], None)
                if slots:
                    ev.shapes = run_time_sizes.RunTimeShapes(kernel, run_time_sizes.SizeSlots(entry, args[-1], slots))
                    ev.flat = flat[:len(ins)]
                columns.emit(ev, kernel, entry, args[len(ins):len(ins) + len(outs)], scratch, plan,
                             flat[len(ins):])
                E.finish(entry)
            notes = {"strategy": "generic", "mode": "columns"}
            if slots:
                return EmittedKernel(name, (grid, 1, 1), (block, 1, 1), 0, notes, sizes=tuple(slots),
                                     grid_sizes=(str(grid), "1", "1"))
            return EmittedKernel(name, (grid, 1, 1), (block, 1, 1), 0, notes)
        with kernel.location, ir.InsertionPoint(entry):
            kb = E.IndexBuilder(entry)
            checks = E.IndexChecks(kb, args[-1 - bool(slots)], base) if flagged else None
            ev = Evaluator(kb, args[:len(ins)], checks)
            if prelude is not None:
                ev.segments = {sorted_op: table}
            items: E.Ix = total
            if slots:
                ev.shapes = run_time_sizes.RunTimeShapes(kernel, run_time_sizes.SizeSlots(entry, args[-1], slots))
                ev.flat = flat[:len(ins)]
                items = _run_time_items(ev, kernel)

            def body(lin):
                with ev.scope():
                    emit_outputs(ev, kernel, args[len(ins):len(ins) + len(outs)], lin, items, flat[len(ins):])

            E.for_each_thread_item(kb, items, block, grid, bool(plan["grid_stride"]), body)
            if checks is not None:
                checks.finish()
                checks.record(gfunc)
            E.finish(entry)
        notes = {"strategy": "generic", "mode": "segments"} if prelude is not None else {"strategy": "generic"}
        sorting = {"prelude": prelude, "prelude_output": segments.table_type(sorted_op)} if prelude is not None else {}
        if not slots:
            return EmittedKernel(name, (grid, 1, 1), (block, 1, 1), 0, notes, **sorting)
        return EmittedKernel(name, (grid, 1, 1), (block, 1, 1), 0, notes, **sorting,
                             sizes=run_time_sizes.launch_slots(slots, len(ins), len(extra)),
                             grid_sizes=(_run_time_grid(kernel, plan, slots, len(ins)), "1", "1"))


register(GenericStrategy())
