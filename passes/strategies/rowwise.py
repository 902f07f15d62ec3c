"""The rowwise strategy: kernels whose reductions all run over the same trailing
dimension(s) of one row space — layer norm, RMSNorm, softmax, log_softmax, and any
elementwise ops (torch broadcasting) around them.

Shape of the emitted kernel (one workgroup per row, T threads, T a power of two):

    row = block_id.x                      (decomposed into the leading coordinates)
    for each statistic, in dependency order:          (a *phase*)
        acc = scf.for j = tid to R step T iter_args(neutral) {kf.row_loop}
                  acc op f(x[row, j], earlier statistics)
        stat = workgroup_reduce(acc)      (warp shuffles on CUDA, else a tree in
                                           workgroup memory with gpu.barrier)
    scf.for j = tid to R step T {kf.row_loop}:   (the output phase)
        out[row, j] = g(x[row, j], statistics)
    per-row outputs: thread 0 stores them

Why this shape:

- Phases in dependency order make the numerics those of the textbook algorithms: var
  is two-pass (the mean first, then the sum of squared deviations from it), never
  E[x²] - E[x]², which loses every digit when |mean| >> std; softmax subtracts the row
  maximum before exp.
- Everything is computed in f32 (f64 stays f64): f16/bf16 elements are extended when
  loaded and the output is rounded once, when stored (kf's precision policy).
- Global loads and stores are plain scalars in loops marked ``kf.row_loop``: the loop
  shape that ``kf-vectorize`` turns into 128-bit accesses, and loads of an input read in
  more than one phase carry ``kf.promote`` so that ``kf-promote-shared`` reads the row
  from global memory once. Keeping those two rewrites out of the strategy keeps each
  one small and testable on its own IR (and keeps this module about the math).
- The two reduction scratch buffers alternate between consecutive reductions, so a
  reduction needs no barrier after all threads have read its result: the next write to
  the same buffer comes after the next reduction's barrier.

Not handled (the strategy raises NotApplicable and kf-map-to-gpu falls back to
generic): reductions over non-trailing dims, integer reductions, argmax/topk, layout ops
other than unit-dim reshapes and broadcast_to, mixing a keepdim=False reduction result
with full rows (torch right-aligns it against the wrong dims). Reductions over several
trailing dims work but are not vectorized (their column index is not the loop index).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

from mlir import ir
from mlir.dialects import arith, gpu, memref, scf

from kf.dialects.attrs import op_attrs
from kf.dialects.types import spec_of
from kf.passes import scalar_math as sm

from .base import EmittedKernel, NotApplicable, Strategy, TargetInfo, register
from .emit import storage_type, to_storage

_ELEMENTWISE = {"kf.add", "kf.sub", "kf.mul", "kf.div", "kf.pow", "kf.max", "kf.min", "kf.neg", "kf.abs",
                "kf.exp", "kf.log", "kf.sqrt", "kf.rsqrt", "kf.reciprocal", "kf.tanh", "kf.erf", "kf.sigmoid",
                "kf.relu", "kf.gelu", "kf.cmp", "kf.select", "kf.masked_fill"}
_REDUCTIONS = {"kf.sum": "add", "kf.mean": "add", "kf.reduce_max": "max", "kf.reduce_min": "min",
               "kf.var": "add"}
_ELEM_BYTES = {"f64": 8, "f32": 4, "f16": 2, "bf16": 2, "i64": 8, "i32": 4, "i1": 1}

#: Attribute names shared with kf-promote-shared and kf-vectorize (the markers).
ROW_LOOP = "kf.row_loop"  # unit: IV = tid + k*T over [0, ub), each column once per workgroup
VECTOR_LANES = "kf.vector_lanes"  # on a row loop: lanes the plan allows (1 = leave scalar)
PROMOTE = "kf.promote"  # on a global load: this input's row is read in several phases
MAX_SHARED = "kf.max_shared_bytes"  # on the gpu.func: the target's workgroup-memory limit


# --------------------------------------------------------------------------- analysis


@dataclass
class Node:
    """One value of the kernel function."""

    op: str  # kf op name, or "arg"
    shape: tuple[int, ...]
    elem: str
    operands: list["Node"] = field(default_factory=list)
    attrs: dict = field(default_factory=dict)
    loc: ir.Location | None = None
    arg: int = -1  # kernel input index for "arg"
    frame: str = "F"  # "S" (right-aligned into the row space), "L" (into its leading dims), "F" (either)

    def __hash__(self):
        return id(self)

    def __eq__(self, other):
        return self is other


@dataclass
class Analysis:
    inputs: list[Node]
    outputs: list[Node]
    space: tuple[int, ...]  # S: the row space (shape of every reduction's input)
    nred: int  # k: how many trailing dims are reduced
    stats: list[tuple]  # statistics in dependency order: (kind, node) - see _stat_keys

    @property
    def lead(self) -> tuple[int, ...]:
        return self.space[:len(self.space) - self.nred]

    @property
    def cols(self) -> tuple[int, ...]:
        return self.space[len(self.space) - self.nred:]

    @property
    def rows(self) -> int:
        return math.prod(self.lead)

    @property
    def row_length(self) -> int:
        return math.prod(self.cols)


def _row_tokens(a: Analysis) -> tuple:
    return tuple(("r", i) if s > 1 else None for i, s in enumerate(a.lead))


def _full_tokens(a: Analysis) -> tuple:
    return _row_tokens(a) + tuple(("c", k) if s > 1 else None for k, s in enumerate(a.cols))


def _align(coords: tuple, out_shape, in_shape) -> tuple:
    """Torch broadcasting: the coordinates of an operand of shape in_shape at the point
    coords of a result of shape out_shape (right-aligned, size-1 dims read index 0)."""
    off = len(out_shape) - len(in_shape)
    return tuple(None if in_shape[k] == 1 else coords[k + off] for k in range(len(in_shape)))


def _natural(a: Analysis, node: Node) -> tuple:
    """The coordinates of node's own element at the current (row, column) point."""
    tokens = _row_tokens(a) if node.frame == "L" else _full_tokens(a)
    frame = a.lead if node.frame == "L" else a.space
    off = len(frame) - len(node.shape)  # negative: leading dims beyond the frame, which must be 1
    if any(s != 1 and (k + off < 0 or s != frame[k + off]) for k, s in enumerate(node.shape)):
        raise NotApplicable(f"a value of shape {list(node.shape)} does not fit the row space {list(a.space)}")
    return tuple(None if s == 1 else tokens[k + off] for k, s in enumerate(node.shape))


def _stat_coords(a: Analysis, node: Node) -> tuple:
    """Where a reduction result may be read: at the current row only."""
    if node.attrs.get("keepdim") or node.op in ("kf.softmax", "kf.log_softmax"):
        return _row_tokens(a) + (None,) * a.nred
    return _row_tokens(a)


def _build_graph(kernel: ir.Operation) -> tuple[list[Node], list[Node]]:
    body = kernel.regions[0].blocks[0]
    nodes: dict = {}
    inputs = []
    for i, arg in enumerate(body.arguments):
        try:
            s = spec_of(arg.type)
        except Exception as e:
            raise NotApplicable(f"kernel input {i}: {e}") from None
        n = Node("arg", s.shape, s.elem, arg=i, loc=kernel.location)
        nodes[arg] = n
        inputs.append(n)
    outputs = None
    for op in body.operations:
        op = op.operation
        if op.name == "func.return":
            outputs = [nodes[v] for v in op.operands]
            break
        if len(op.results) != 1:
            raise NotApplicable(f"{op.name} has {len(op.results)} results")
        s = spec_of(op.results[0].type)
        n = Node(op.name, s.shape, s.elem, [nodes[v] for v in op.operands], op_attrs(op), op.location)
        if op.name == "kf.reshape":
            # Only unit dims may come or go: then the elements keep their coordinates.
            src = n.operands[0]
            if [d for d in src.shape if d != 1] != [d for d in n.shape if d != 1]:
                raise NotApplicable(f"kf.reshape {list(src.shape)} -> {list(n.shape)} moves elements")
        elif op.name == "kf.constant":
            value = n.attrs.get("value")
            if not isinstance(value, ir.DenseElementsAttr) or not value.is_splat:
                raise NotApplicable("kf.constant that is not a splat")
        elif op.name not in _ELEMENTWISE and op.name not in _REDUCTIONS and op.name not in (
                "kf.softmax", "kf.log_softmax", "kf.cast", "kf.fill", "kf.broadcast_to"):
            raise NotApplicable(f"{op.name} is not a rowwise op")
        nodes[op.results[0]] = n
    if outputs is None:
        raise NotApplicable("kernel function has no func.return")
    return inputs, outputs


def _uniform(n: Node) -> bool:
    return all(d == 1 for d in n.shape)


def analyze(kernel: ir.Operation) -> Analysis:
    """Find the row space and the statistics of a kernel function; NotApplicable if it is
    not rowwise."""
    inputs, outputs = _build_graph(kernel)
    order: list[Node] = []
    seen = set()

    def visit(n):
        if id(n) in seen:
            return
        seen.add(id(n))
        for o in n.operands:
            visit(o)
        order.append(n)

    for o in outputs:
        visit(o)
    space, dims = None, None
    for n in order:
        if n.op in _REDUCTIONS or n.op in ("kf.softmax", "kf.log_softmax"):
            x = n.operands[0]
            rank = len(x.shape)
            if n.op in _REDUCTIONS:
                d = sorted({int(v) % max(rank, 1) for v in n.attrs.get("dims", [])}) or list(range(rank))
            else:
                d = [int(n.attrs["dim"]) % max(rank, 1)]
            if not x.elem.startswith(("f", "bf")):
                raise NotApplicable(f"{n.op} of {x.elem}: the rowwise strategy reduces floats")
            if space is None:
                space, dims = x.shape, d
            elif x.shape != space or d != dims:
                raise NotApplicable(f"reductions over different row spaces: {list(space)} dims {dims} and "
                                    f"{list(x.shape)} dims {d}")
    if space is None:
        raise NotApplicable("no reduction: not a rowwise kernel")
    if dims != list(range(len(space) - len(dims), len(space))):
        raise NotApplicable(f"reduced dims {dims} of {list(space)} are not the trailing dims")
    # Frames: a keepdim=False reduction moves its result into the leading-dims frame.
    for n in order:
        if n.op == "arg" or n.op in ("kf.fill", "kf.constant"):
            n.frame = "F"
        elif n.op in _REDUCTIONS:
            if n.operands[0].frame == "L":
                raise NotApplicable("a reduction of a per-row value")
            n.frame = "S" if n.attrs.get("keepdim") else "L"
        elif n.op in ("kf.softmax", "kf.log_softmax"):
            n.frame = "S"
        else:
            frames = {o.frame for o in n.operands if not _uniform(o)} - {"F"}
            lead = space[:len(space) - len(dims)]
            free_fit = all(len(o.shape) <= len(lead) and all(
                d in (1, lead[k + len(lead) - len(o.shape)]) for k, d in enumerate(o.shape))
                for o in n.operands if o.frame == "F" and not _uniform(o))
            if len(frames) > 1 or (frames == {"L"} and not free_fit):
                raise NotApplicable("a keepdim=False reduction result meets full rows: torch aligns it with "
                                    "the wrong dims, which no rowwise kernel computes")
            n.frame = frames.pop() if frames else "F"
    a = Analysis(inputs, outputs, tuple(space), len(dims), [])
    for o in outputs:
        _natural(a, o)  # raises for outputs that do not fit the row space
    a.stats = _stat_order(a, order)
    return a


def _stat_keys(n: Node) -> list[tuple]:
    """The statistics a reduction or softmax node needs, in order, keyed by kind and
    input so that mean(x) and var(x) share one sum of x."""
    x = n.operands[0]
    if n.op == "kf.var":
        return [("sum", x), ("m2", x)]
    if n.op in ("kf.softmax", "kf.log_softmax"):
        return [("max", x), ("sumexp", x)]
    return [({"kf.sum": "sum", "kf.mean": "sum", "kf.reduce_max": "max", "kf.reduce_min": "min"}[n.op], x)]


def _stat_order(a: Analysis, order: list[Node]) -> list[tuple]:
    """Every statistic once, in an order where each comes after those its input needs
    (order is topological: an input's statistics come before its users')."""
    out: list[tuple] = []
    for n in order:
        if n.op in _REDUCTIONS or n.op in ("kf.softmax", "kf.log_softmax"):
            for key in _stat_keys(n):
                if not any(k == key[0] and m is key[1] for k, m in out):
                    out.append(key)
    return out


def _loads(a: Analysis, node: Node, coords: tuple, acc: set, seen: set) -> None:
    """The (input, coordinates) loaded while computing node at coords inside a row loop,
    stopping at statistics (computed before the loop)."""
    key = (id(node), coords)
    if key in seen:
        return
    seen.add(key)
    if not any(c and c[0] == "c" for c in coords):
        return  # per-row: computed once, outside the loop
    if node.op == "arg":
        acc.add((node.arg, coords))
        return
    if node.op in _REDUCTIONS:
        return
    if node.op in ("kf.softmax", "kf.log_softmax"):
        _loads(a, node.operands[0], coords, acc, seen)
        return
    for o in node.operands:
        _loads(a, o, _align(coords, node.shape, o.shape), acc, seen)


def phase_loads(a: Analysis) -> list[set]:
    """For each phase (each statistic, then the output phase), the inputs it reads."""
    out = []
    full = _full_tokens(a)
    for kind, x in a.stats:
        s: set = set()
        _loads(a, x, full, s, set())
        out.append({arg for arg, _ in s})
    s = set()
    for o in a.outputs:
        _loads(a, o, _natural(a, o), s, set())
    out.append({arg for arg, _ in s})
    return out


# --------------------------------------------------------------------------- emission


def _compute_type(elem: str) -> ir.Type:
    if elem in ("f16", "bf16") or elem.startswith("f8") or elem == "f32":
        return ir.F32Type.get()
    return ir.Type.parse(elem)


def _index(v: int) -> ir.Value:
    return arith.constant(ir.IndexType.get(), v)


class _Emitter:
    def __init__(self, a: Analysis, plan: dict, target: TargetInfo, fn, args, scratch):
        self.a, self.plan, self.target = a, plan, target
        self.fn, self.args, self.scratch = fn, args, scratch
        self.T = plan["threads"]
        self.row_memo: dict = {}  # (id(node), coords) -> value computed once per row
        self.stats: dict = {}  # (kind, id(node)) -> per-row statistic
        self.promote = set(plan.get("cached_inputs", []))
        self.reductions = 0
        self.col: dict | None = None  # inside a row loop: token -> index value
        self.loop_memo: dict = {}
        self.loop_op = None

    # -- coordinates
    def setup(self):
        self.tid = gpu.thread_id(gpu.Dimension.x)
        bid = gpu.block_id(gpu.Dimension.x)
        self.zero = _index(0)
        self.rowv = {}
        rem = bid
        lead = self.a.lead
        for i in reversed(range(len(lead))):
            if lead[i] == 1:
                continue
            if i == min(k for k in range(len(lead)) if lead[k] > 1):
                self.rowv[("r", i)] = rem
            else:
                c = _index(lead[i])
                self.rowv[("r", i)] = arith.remui(rem, c)
                rem = arith.divui(rem, c)

    def _col_values(self, j: ir.Value) -> dict:
        cols = self.a.cols
        out = {}
        big = [k for k in range(len(cols)) if cols[k] > 1]
        rem = j
        for k in reversed(range(len(cols))):
            if cols[k] == 1:
                continue
            if k == big[0]:
                out[("c", k)] = rem
            else:
                c = _index(cols[k])
                out[("c", k)] = arith.remui(rem, c)
                rem = arith.divui(rem, c)
        return out

    def _idx(self, token) -> ir.Value:
        if token is None:
            return self.zero
        if token[0] == "r":
            return self.rowv[token]
        return self.col[token]

    # -- values
    def value(self, node: Node, coords: tuple) -> ir.Value:
        in_loop = any(c and c[0] == "c" for c in coords)
        memo = self.loop_memo if in_loop else self.row_memo
        key = (id(node), coords)
        if key in memo:
            return memo[key]
        if not in_loop and self.loop_op is not None:
            # A per-row value needed inside a loop is computed before the loop.
            with ir.InsertionPoint(self.loop_op):
                v = self._value(node, coords)
        else:
            v = self._value(node, coords)
        memo[key] = v
        return v

    def _value(self, node: Node, coords: tuple) -> ir.Value:
        with node.loc or ir.Location.unknown():
            if node.op == "arg":
                t = self.args[node.arg]
                load = memref.LoadOp(t, [self._idx(c) for c in coords])
                if node.arg in self.promote and self.col is not None and any(c and c[0] == "c" for c in coords):
                    load.operation.attributes[PROMOTE] = ir.UnitAttr.get()
                if node.elem == "i1" and load.result.type != ir.IntegerType.get_signless(1):
                    return arith.cmpi(arith.CmpIPredicate.ne, load.result, sm.const(load.result.type, 0))
                return sm.convert(load.result, _compute_type(node.elem))
            if node.op in ("kf.fill", "kf.constant"):
                if node.op == "kf.fill":
                    value = node.attrs["value"]
                else:
                    splat = ir.DenseElementsAttr(node.attrs["value"]).get_splat_value()
                    value = splat.value if hasattr(splat, "value") else float(splat)
                elem = ir.Type.parse(node.elem)
                return sm.convert(sm.const(elem, value), _compute_type(node.elem))
            if node.op in _REDUCTIONS:
                if coords != _stat_coords(self.a, node):
                    raise NotApplicable(f"{node.op} result read across rows")
                return self._reduction_result(node)
            if node.op in ("kf.softmax", "kf.log_softmax"):
                x = self.value(node.operands[0], coords)
                x_id = id(node.operands[0])
                m, s = self.stats[("max", x_id)], self.stats[("sumexp", x_id)]
                if node.op == "kf.softmax":
                    return arith.divf(sm.emit("exp", [arith.subf(x, m)]), s)
                return arith.subf(arith.subf(x, m), sm.emit("log", [s]))
            if node.op in ("kf.reshape", "kf.broadcast_to"):
                src = node.operands[0]
                if node.op == "kf.reshape":
                    sub = tuple(c for c, d in zip(coords, node.shape) if d != 1)
                    it = iter(sub)
                    inner = tuple(None if d == 1 else next(it) for d in src.shape)
                else:
                    inner = _align(coords, node.shape, src.shape)
                return self.value(src, inner)
            vals = [self.value(o, _align(coords, node.shape, o.shape)) for o in node.operands]
            if node.op == "kf.cast":
                target = ir.Type.parse(node.elem)
                return sm.convert(sm.convert(vals[0], target), _compute_type(node.elem))
            if node.op not in ("kf.select", "kf.masked_fill"):
                if len({str(v.type) for v in vals}) > 1:
                    raise NotApplicable(f"{node.op} on mixed compute types")
            return sm.emit(node.op, vals, node.attrs)

    def _reduction_result(self, node: Node) -> ir.Value:
        x = node.operands[0]
        ct = _compute_type(x.elem)
        if node.op == "kf.sum":
            return self.stats[("sum", id(x))]
        if node.op == "kf.mean":
            return self.row_mean(x)
        if node.op == "kf.var":
            return arith.divf(self.stats[("m2", id(x))],
                              sm.const(ct, self.a.row_length - float(node.attrs.get("correction", 1.0))))
        return self.stats[({"kf.reduce_max": "max", "kf.reduce_min": "min"}[node.op], id(x))]

    # -- loops
    def row_loop(self, iter_inits: list[ir.Value]):
        """scf.for j = tid to R step T, marked for kf-vectorize and kf-promote-shared."""
        loop = scf.ForOp(self.tid, _index(self.a.row_length), _index(self.T), iter_inits)
        loop.operation.attributes[ROW_LOOP] = ir.UnitAttr.get()
        loop.operation.attributes[VECTOR_LANES] = ir.IntegerAttr.get(
            ir.IntegerType.get_signless(64), self.plan["vector_lanes"] if self.a.nred == 1 else 1)
        return loop

    def phase(self, kind: str, x: Node) -> None:
        """One statistic of x over the row: a row loop of per-thread partials, then the
        workgroup reduction."""
        ct = _compute_type(x.elem)
        combine = "max" if kind == "max" else "min" if kind == "min" else "add"
        neutral = {"add": 0.0, "max": -math.inf, "min": math.inf}[combine]
        with x.loc or ir.Location.unknown():
            loop = self.row_loop([sm.const(ct, neutral)])
            self.loop_op, self.loop_memo = loop.operation, {}
            with ir.InsertionPoint(loop.body):
                self.col = self._col_values(loop.induction_variable)
                v = self.value(x, _full_tokens(self.a))
                if kind == "m2":  # two-pass variance: squared deviations from the mean
                    d = arith.subf(v, self.row_mean(x))
                    v = arith.mulf(d, d)
                elif kind == "sumexp":  # softmax: exp(x - max), never overflows
                    v = sm.emit("exp", [arith.subf(v, self.stats[("max", id(x))])])
                acc = loop.inner_iter_args[0]
                scf.YieldOp([self._combine(combine, acc, v)])
            self.col, self.loop_op = None, None
            self.stats[(kind, id(x))] = self.workgroup_reduce(loop.results[0], combine)

    def row_mean(self, x: Node) -> ir.Value:
        """sum(x) / R, once per row (before the current loop, if inside one)."""
        key = ("meanvalue", id(x))
        if key not in self.stats:
            ip = ir.InsertionPoint(self.loop_op) if self.loop_op is not None else ir.InsertionPoint.current
            with ip:
                ct = _compute_type(x.elem)
                self.stats[key] = arith.divf(self.stats[("sum", id(x))], sm.const(ct, self.a.row_length))
        return self.stats[key]

    @staticmethod
    def _combine(kind: str, a: ir.Value, b: ir.Value) -> ir.Value:
        return {"add": arith.addf, "max": arith.maximumf, "min": arith.minimumf}[kind](a, b)

    def workgroup_reduce(self, partial: ir.Value, kind: str) -> ir.Value:
        """All threads' partials combined; every thread gets the result."""
        buf = self.scratch[self.reductions % 2]
        self.reductions += 1
        T = self.T
        ct = partial.type
        i32 = ir.IntegerType.get_signless(32)
        if self.plan["reduction"] == "shuffle":
            sub = self.target.subgroup_size
            width = arith.constant(i32, sub)

            def butterfly(v, lanes):
                off = lanes // 2
                while off >= 1:
                    o = gpu.ShuffleOp(v, arith.constant(i32, off), width, gpu.ShuffleMode.XOR)
                    v = self._combine(kind, v, o.results[0])
                    off //= 2
                return v

            v = butterfly(partial, min(T, sub))
            if T <= sub:
                return v
            warps = T // sub
            lane = arith.remui(self.tid, _index(sub))
            warp = arith.divui(self.tid, _index(sub))
            first = arith.cmpi(arith.CmpIPredicate.eq, lane, self.zero)
            iff = scf.IfOp(first)
            with ir.InsertionPoint(iff.then_block):
                memref.store(v, buf, [warp])
                scf.YieldOp([])
            gpu.barrier()
            has = arith.cmpi(arith.CmpIPredicate.ult, lane, _index(warps))
            safe = arith.select(has, lane, self.zero)
            w = memref.load(buf, [safe])
            neutral = sm.const(ct, {"add": 0.0, "max": -math.inf, "min": math.inf}[kind])
            w = arith.select(has, w, neutral)
            return butterfly(w, sub)
        memref.store(partial, buf, [self.tid])
        gpu.barrier()
        s = T // 2
        while s >= 1:
            lt = arith.cmpi(arith.CmpIPredicate.ult, self.tid, _index(s))
            iff = scf.IfOp(lt)
            with ir.InsertionPoint(iff.then_block):
                other = arith.addi(self.tid, _index(s))
                u = memref.load(buf, [self.tid])
                w = memref.load(buf, [other])
                memref.store(self._combine(kind, u, w), buf, [self.tid])
                scf.YieldOp([])
            gpu.barrier()
            s //= 2
        return memref.load(buf, [self.zero])

    def outputs(self) -> None:
        a = self.a
        n_in = len(a.inputs)
        col_outs, row_outs = [], []
        for i, o in enumerate(a.outputs):
            coords = _natural(a, o)
            (col_outs if any(c and c[0] == "c" for c in coords) else row_outs).append((i, o, coords))
        if col_outs:
            loop = self.row_loop([])
            self.loop_op, self.loop_memo = loop.operation, {}
            with ir.InsertionPoint(loop.body):
                self.col = self._col_values(loop.induction_variable)
                for i, o, coords in col_outs:
                    with o.loc:
                        v = self.value(o, coords)
                        mem = self.args[n_in + i]
                        memref.store(to_storage(v, ir.MemRefType(mem.type).element_type), mem,
                                     [self._idx(c) for c in coords])
                scf.YieldOp([])
            self.col, self.loop_op = None, None
        if row_outs:
            vals = [(i, o, coords, self.value(o, coords)) for i, o, coords in row_outs]
            first = arith.cmpi(arith.CmpIPredicate.eq, self.tid, self.zero)
            iff = scf.IfOp(first)
            with ir.InsertionPoint(iff.then_block):
                for i, o, coords, v in vals:
                    with o.loc:
                        mem = self.args[n_in + i]
                        memref.store(to_storage(v, ir.MemRefType(mem.type).element_type), mem,
                                     [self._idx(c) for c in coords])
                scf.YieldOp([])


def _next_pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


class RowwiseStrategy(Strategy):
    KIND = "rowwise"

    #: A cap on the vector lanes of row loops (0: none), for experiments.
    MAX_LANES = 0

    #: A cap on the threads that share a row (0: one thread per vector of the row, up to
    #: the workgroup limit). 128 measured best on the H200 (bench/variants.py --only
    #: rowwise, 2026-12-02): the seed's layer norm at 32768x8192 bf16 0.908 -> 0.400 ms
    #: (1182 -> 2684 GB/s), 8192x4096 f32 0.142 -> 0.120, bf16 0.092 -> 0.085; 32 was
    #: slower everywhere. Fewer threads a row loop over more vectors each, with more
    #: workgroups (rows) resident per SM: more loads in flight. Measured again with
    #: caps 128/256/512 (2026-12-03, bench/results/variants-rowwise-2026-12-03.json):
    #: 256 is the best or within 3% of it at every shape -- 8192x4096 bf16 0.0775 ->
    #: 0.0724 ms, f32 0.117 -> 0.102, 32768x8192 bf16 0.381 either way, f32 0.881 ->
    #: 0.606 (3546 GB/s; 512: 0.590) -- so 256.
    MAX_ROW_THREADS = 256

    def plan(self, kernel: ir.Operation, target: TargetInfo) -> dict:
        """Threads per row, vector lanes, which inputs' rows to cache in workgroup memory
        and how reductions combine across threads."""
        a = analyze(kernel)
        R = a.row_length
        phases = phase_loads(a)
        row_inputs = set().union(*phases)
        # The element types moved along the row: inputs loaded per column, full-row outputs.
        row_elems = [a.inputs[i].elem for i in sorted(row_inputs)] + [
            n.elem for n in a.outputs if any(c and c[0] == "c" for c in _natural(a, n))]
        narrow = min((_ELEM_BYTES.get(e, 4) for e in row_elems), default=4)
        lanes = max(1, target.vector_bytes // narrow)
        if target.name == "spirv":
            # SPIR-V vectors have at most 4 components (without Vector16), and kf-to-spirv
            # keeps bf16 as i16 storage with scalar conversions: no bf16 vectors there.
            lanes = 1 if "bf16" in row_elems else min(lanes, 4)
        if a.nred != 1:
            lanes = 1
        if self.MAX_LANES:
            lanes = min(lanes, self.MAX_LANES)
        threads = min(target.max_threads, max(target.subgroup_size, _next_pow2(-(-R // lanes))))
        if self.MAX_ROW_THREADS:
            threads = max(target.subgroup_size, min(threads, self.MAX_ROW_THREADS))
        reduction = "shuffle" if target.has_shuffle and target.name == "cuda" else "tree"
        scratch = 2 * (target.subgroup_size if reduction == "shuffle" else threads) * 4
        cached, budget = [], target.max_shared_bytes - scratch
        reads: dict[int, int] = {}
        for loads in phases:
            for arg in loads:
                reads[arg] = reads.get(arg, 0) + 1
        for arg in sorted(reads):
            inp = a.inputs[arg]
            nbytes = R * _ELEM_BYTES.get(inp.elem, 4)
            if reads[arg] > 1 and a.nred == 1 and inp.shape[-1:] == (R,) and nbytes <= budget:
                cached.append(arg)
                budget -= nbytes
        return {"threads": threads, "vector_lanes": lanes, "rows": a.rows, "row_length": R,
                "reduction": reduction, "cache_row": bool(cached), "cached_inputs": cached,
                "phases": len(a.stats) + 1, "scratch_bytes": scratch}

    def emit(self, kernel: ir.Operation, plan: dict, gpu_module: ir.Operation, target: TargetInfo) -> EmittedKernel:
        a = analyze(kernel)
        plan = plan or self.plan(kernel, target)
        name = ir.StringAttr(kernel.attributes["sym_name"]).value
        T = plan["threads"]
        with kernel.location:
            # booleans are bytes on CUDA (torch's layout; a vector<N x i1> load would read
            # N bits): loaded as != 0, stored zero-extended
            arg_types = [ir.MemRefType.get(list(n.shape), storage_type(n.elem, target.name))
                         for n in a.inputs + a.outputs]
            wg = ir.Attribute.parse("#gpu.address_space<workgroup>")
            ct = ir.F64Type.get() if any(n.elem == "f64" for n in a.inputs) else ir.F32Type.get()
            slots = target.subgroup_size if plan["reduction"] == "shuffle" else T
            scratch_t = ir.MemRefType.get([slots], ct, None, wg)
            block = gpu_module.regions[0].blocks[0]
            ip = ir.InsertionPoint.at_block_terminator(block) if _has_terminator(block) else ir.InsertionPoint(block)
            fn = gpu.GPUFuncOp(ir.TypeAttr.get(ir.FunctionType.get(arg_types, [])), sym_name=name, kernel=True,
                               known_block_size=[T, 1, 1], ip=ip)
            fn.operation.attributes["workgroup_attributions"] = ir.IntegerAttr.get(ir.IntegerType.get_signless(64), 2)
            fn.operation.attributes[MAX_SHARED] = ir.IntegerAttr.get(ir.IntegerType.get_signless(64),
                                                                     target.max_shared_bytes)
            entry = fn.regions[0].blocks.append(*arg_types, scratch_t, scratch_t)
            args = list(entry.arguments)
            with ir.InsertionPoint(entry):
                em = _Emitter(a, plan, target, fn, args[:len(arg_types)], args[len(arg_types):])
                em.setup()
                for kind, node in a.stats:
                    em.phase(kind, node)
                em.outputs()
                gpu.ReturnOp([])
        notes = dict(plan, inputs=len(a.inputs), outputs=len(a.outputs))
        return EmittedKernel(name, (a.rows, 1, 1), (T, 1, 1), 0, notes)


def _has_terminator(block: ir.Block) -> bool:
    ops = list(block.operations)
    return bool(ops) and ops[-1].operation.name in ("gpu.module_end",)


register(RowwiseStrategy())
