"""The rowwise strategy: kernels whose reductions all run over the same trailing
dimension(s) of one row space — layer norm, RMSNorm, softmax, log_softmax, and any
elementwise ops (torch broadcasting) around them.

Shape of the emitted kernel (one workgroup per row, T threads, T a power of two):

    row = block_id.x                      (decomposed into the leading coordinates)
    for each statistic, in dependency order:          (a *phase*)
        acc = scf.for j = tid to R step T iter_args(neutral) {kf.row_loop}
                  acc op f(x[row, j], earlier statistics)
        stat = workgroup_reduce(acc)      (subgroup shuffles where the target has
                                           them -- CUDA, Vulkan devices with subgroup
                                           shuffles --, else a tree in workgroup
                                           memory with gpu.barrier)
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

import dataclasses
import math
from dataclasses import dataclass, field

from mlir import ir
from mlir.dialects import arith, gpu, memref, scf, vector

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
ASSUMED_ALIGNMENT = "kf.assumed_alignment"  # on the gpu.func: bytes kernel buffers are aligned to (kf-vectorize's)


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
        self.T = plan.get("row_threads", plan["threads"])  # threads that share one row
        self.P = plan.get("rows_per_block", 1)
        self.row_memo: dict = {}  # (id(node), coords) -> value computed once per row
        self.stats: dict = {}  # (kind, id(node)) -> per-row statistic
        self.promote = set(plan.get("cached_inputs", []))
        self.reductions = 0
        self.col: dict | None = None  # inside a row loop: token -> index value
        self.loop_memo: dict = {}
        self.loop_op = None
        # registers mode: the element being computed, (chunk, lane), and what is loaded
        self.elem: tuple[int, int] | None = None
        self.elem_memo: dict = {}  # (chunk, lane) -> that element's memo
        self.chunk_loads: dict = {}  # (input, leading coords, chunk) -> vector (or i32 words)
        self.columns: dict = {}  # (chunk, lane) -> column index
        self.assumed_alignment = 0  # the widest vector access to a kernel buffer, in bytes

    # -- coordinates
    def setup(self):
        tid = gpu.thread_id(gpu.Dimension.x)
        bid = gpu.block_id(gpu.Dimension.x)
        self.zero = _index(0)
        self.block_tid = tid
        self.row_ok = None  # i1: this thread's row exists (several rows a block, rows % P != 0)
        if self.P > 1:
            # rows_per_block rows of T threads each: thread tid works on row bid*P + tid/T
            self.tid = arith.remui(tid, _index(self.T))
            row = arith.addi(arith.muli(bid, _index(self.P)), arith.divui(tid, _index(self.T)))
            if self.a.rows % self.P:
                # Threads past the last row compute the last row again (so that every
                # thread takes part in the shuffles and barriers) and store nothing.
                self.row_ok = arith.cmpi(arith.CmpIPredicate.ult, row, _index(self.a.rows))
                row = arith.minui(row, _index(self.a.rows - 1))
        else:
            self.tid = tid
            row = bid
        self.rowv = {}
        rem = row
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
        if self.elem is not None:
            return self.column(*self.elem)
        return self.col[token]

    # -- values
    def value(self, node: Node, coords: tuple) -> ir.Value:
        in_loop = any(c and c[0] == "c" for c in coords)
        memo = (self.elem_memo.setdefault(self.elem, {}) if self.elem is not None else self.loop_memo) \
            if in_loop else self.row_memo
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
                if self.elem is not None and any(c and c[0] == "c" for c in coords):
                    return self._element_of(node, coords)
                t = self.args[node.arg]
                load = memref.LoadOp(t, [self._idx(c) for c in coords])
                if node.arg in self.promote and self.col is not None and any(c and c[0] == "c" for c in coords):
                    load.operation.attributes[PROMOTE] = ir.UnitAttr.get()
                return self._widen(load.result, node.elem)
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
                    e = self.shifted_exp(node.operands[0], coords)
                    if self.plan.get("reciprocal"):
                        return arith.mulf(e, self.per_row(("reciprocal", "sumexp", x_id), lambda: self._recip(s)))
                    return arith.divf(e, s)
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
            if node.op == "kf.div" and self.plan.get("reciprocal") and _has_column(coords):
                d_coords = _align(coords, node.shape, node.operands[1].shape)
                if not _has_column(d_coords):
                    # x / d with d one value per row: x * (1 / d), one division per row
                    # instead of one per element (the plan allows it where the outputs are
                    # rounded to 8 or 11 bits, which hides the f32 difference of an ulp)
                    key = ("reciprocal", id(node.operands[1]), d_coords)
                    return arith.mulf(vals[0], self.per_row(key, lambda: self._recip(vals[1])))
            return sm.emit(node.op, vals, node.attrs)

    @staticmethod
    def _recip(d: ir.Value) -> ir.Value:
        return arith.divf(sm.const(d.type, 1.0), d)

    def per_row(self, key, make) -> ir.Value:
        """A value computed once per row (before the current row loop, if inside one)."""
        if key not in self.row_memo:
            if self.loop_op is not None:
                with ir.InsertionPoint(self.loop_op):
                    self.row_memo[key] = make()
            else:
                self.row_memo[key] = make()
        return self.row_memo[key]

    def shifted_exp(self, x: Node, coords: tuple) -> ir.Value:
        """exp(x - max(x)) of the current element, computed once: the sum of a softmax
        and its output share it (in registers mode, across phases)."""
        # per element in registers mode, per loop inside a row loop (the loop's body is
        # the only place its values dominate), per row outside any loop: a row of one
        # column stores its output after the sum's loop, where the loop's exp does not
        # dominate (kf-map-to-gpu failed on softmax over [.., 1], the MoE's top-1 gate)
        if self.elem is not None:
            memo = self.elem_memo.setdefault(self.elem, {})
        else:
            memo = self.loop_memo if self.loop_op is not None else self.row_memo
        key = ("shifted_exp", id(x), coords)
        if key not in memo:
            memo[key] = sm.emit("exp", [arith.subf(self.value(x, coords), self.stats[("max", id(x))])])
        return memo[key]

    def _widen(self, v: ir.Value, elem: str) -> ir.Value:
        """A loaded storage value in its compute type (booleans, bytes on CUDA, as != 0)."""
        if elem == "i1" and v.type != ir.IntegerType.get_signless(1):
            return arith.cmpi(arith.CmpIPredicate.ne, v, sm.const(v.type, 0))
        return sm.convert(v, _compute_type(elem))

    def _reduction_result(self, node: Node) -> ir.Value:
        x = node.operands[0]
        if node.op == "kf.sum":
            return self.stats[("sum", id(x))]
        if node.op == "kf.mean":
            return self.row_mean(x)
        if node.op == "kf.var":
            return sm.variance(self.stats[("m2", id(x))], self.a.row_length,
                               float(node.attrs.get("correction", 1.0)))
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
                    v = self.shifted_exp(x, _full_tokens(self.a))
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
        """The partials of the T threads of a row combined; each of them gets the result.
        With several rows a workgroup, row g's threads are T consecutive ones."""
        buf = self.scratch[self.reductions % 2]
        self.reductions += 1
        T = self.T
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

            v = butterfly(partial, min(T, sub))  # XOR below T stays among a row's threads
            if T <= sub:
                return v
            warps = T // sub  # a row's warps, consecutive: their partials go to buf[warp]
            lane = arith.remui(self.block_tid, _index(sub))
            warp = arith.divui(self.block_tid, _index(sub))
            first = arith.cmpi(arith.CmpIPredicate.eq, lane, self.zero)
            iff = scf.IfOp(first)
            with ir.InsertionPoint(iff.then_block):
                memref.store(v, buf, [warp])
                scf.YieldOp([])
            gpu.barrier()
            # lane l of every warp of the row reads the partial of the row's warp l % warps:
            # a butterfly over `warps` lanes then gives every lane the row's total
            row_first = arith.subi(warp, arith.remui(warp, _index(warps)))
            w = memref.load(buf, [arith.addi(row_first, arith.remui(lane, _index(warps)))])
            return butterfly(w, warps)
        memref.store(partial, buf, [self.block_tid])
        gpu.barrier()
        s = T // 2
        while s >= 1:
            lt = arith.cmpi(arith.CmpIPredicate.ult, self.tid, _index(s))
            iff = scf.IfOp(lt)
            with ir.InsertionPoint(iff.then_block):
                other = arith.addi(self.block_tid, _index(s))
                u = memref.load(buf, [self.block_tid])
                w = memref.load(buf, [other])
                memref.store(self._combine(kind, u, w), buf, [self.block_tid])
                scf.YieldOp([])
            gpu.barrier()
            s //= 2
        return memref.load(buf, [arith.subi(self.block_tid, self.tid) if self.P > 1 else self.zero])

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
            self._row_outputs(row_outs)

    # -- registers mode: the row's elements stay in the threads' registers
    #
    # The row is cut into `chunks` x T vectors of L elements (the last chunk partial
    # where T does not divide the vectors): thread t holds vectors c*T + t. Each phase is
    # straight-line code over the thread's elements, so a value computed in one phase
    # (the loaded and extended x, exp(x - max)) is there for the next without being
    # loaded or computed again, and all of a phase's loads are issued before any is used.

    def chunk_full(self, c: int) -> bool:
        return (c + 1) * self.T <= self.plan["row_length"] // self.plan["vector_lanes"]

    def vector_of(self, c: int) -> ir.Value:
        """The index of thread's vector in chunk c, clamped to the row: a partial chunk's
        threads past the row read the last vector again and use none of it."""
        key = ("vector", c)
        if key not in self.row_memo:
            nvec = self.plan["row_length"] // self.plan["vector_lanes"]
            v = arith.addi(self.tid, _index(c * self.T)) if c else self.tid
            self.row_memo[key] = v if self.chunk_full(c) else arith.minui(v, _index(nvec - 1))
        return self.row_memo[key]

    def chunk_valid(self, c: int) -> ir.Value | None:
        """i1: chunk c of this thread lies in the row (None: it always does)."""
        if self.chunk_full(c):
            return None
        key = ("valid", c)
        if key not in self.row_memo:
            nvec = self.plan["row_length"] // self.plan["vector_lanes"]
            self.row_memo[key] = arith.cmpi(arith.CmpIPredicate.ult, arith.addi(self.tid, _index(c * self.T)),
                                            _index(nvec))
        return self.row_memo[key]

    def column(self, c: int, lane: int) -> ir.Value:
        if (c, lane) not in self.columns:
            base = self.vector_base(c) if self.plan["vector_lanes"] > 1 else self.vector_of(c)
            self.columns[(c, lane)] = arith.addi(base, _index(lane)) if lane else base
        return self.columns[(c, lane)]

    def vector_base(self, c: int) -> ir.Value:
        """The first column of this thread's vector in chunk c."""
        key = ("vector_base", c)
        if key not in self.row_memo:
            self.row_memo[key] = arith.muli(self.vector_of(c), _index(self.plan["vector_lanes"]))
        return self.row_memo[key]

    def _vector_access(self, node_shape: tuple, coords: tuple, mem: ir.Value) -> list | None:
        """Indices of a vector access of chunk `self.elem[0]` to mem at coords, or None
        where lanes are not contiguous there (or not worth a vector: one lane, booleans)."""
        L = self.plan["vector_lanes"]
        elem = ir.MemRefType(mem.type).element_type
        if L == 1 or str(elem) not in ("f32", "f16", "bf16", "f64"):
            return None
        p = max(k for k, c in enumerate(coords) if c and c[0] == "c")
        if any(d != 1 for d in node_shape[p + 1:]):
            return None
        idx = [self._idx(t) for t in coords[:p]]
        idx.append(self.vector_base(self.elem[0]))
        return idx + [self.zero] * (len(coords) - p - 1)

    def _element_of(self, node: Node, coords: tuple) -> ir.Value:
        """The current element of input node (registers mode): a lane of its chunk's
        vector, loaded once for all lanes and phases."""
        c, lane = self.elem
        mem = self.args[node.arg]
        mt = ir.MemRefType(mem.type)
        key = (node.arg, coords, c)
        if key not in self.chunk_loads:
            idx = self._vector_access(node.shape, coords, mem)
            if idx is None:
                self.chunk_loads[key] = None
            else:
                L = self.plan["vector_lanes"]
                align = min(L * _ELEM_BYTES[str(mt.element_type)], self.target.vector_bytes)
                self.assumed_alignment = max(self.assumed_alignment, align)
                vec = vector.load(ir.VectorType.get([L], mt.element_type), mem, idx, alignment=align)
                if str(mt.element_type) == "bf16" and self.target.name == "cuda":
                    # bf16 -> f32 is the 16 bits moved up: as 32-bit words, the low element
                    # is word << 16 and the high one word & 0xffff0000 (one instruction
                    # each, where extf takes PRMT + shift for every high element)
                    vec = vector.bitcast(ir.VectorType.get([L // 2], ir.IntegerType.get_signless(32)), vec)
                self.chunk_loads[key] = vec
        vec = self.chunk_loads[key]
        if vec is None:
            return self._widen(memref.load(mem, [self._idx(t) for t in coords]), node.elem)
        if ir.VectorType(vec.type).element_type == ir.IntegerType.get_signless(32):
            i32 = ir.IntegerType.get_signless(32)
            word = vector.extract(vec, [], [lane // 2])
            bits = arith.shli(word, arith.constant(i32, 16)) if lane % 2 == 0 else \
                arith.andi(word, arith.constant(i32, -65536))
            return arith.bitcast(ir.F32Type.get(), bits)
        return self._widen(vector.extract(vec, [], [lane]), node.elem)

    def _elements(self):
        for c in range(self.plan["chunks"]):
            for lane in range(self.plan["vector_lanes"]):
                yield c, lane

    def preload(self, nodes: list[tuple[Node, tuple]], only_rows: bool = False, chunks=None) -> None:
        """Issue the vector loads the elements of nodes need, for every chunk (or those
        of `chunks`), before any element is computed (only those of inputs that change
        from row to row, with only_rows: the ones from DRAM)."""
        acc: set = set()
        for n, coords in nodes:
            _loads(self.a, n, coords, acc, set())
        for arg, coords in sorted(acc, key=lambda k: (k[0], str(k[1]))):
            if only_rows and not any(t and t[0] == "r" for t in coords):
                continue
            node = self.a.inputs[arg]
            for c in range(self.plan["chunks"]) if chunks is None else chunks:
                self.elem = (c, 0)
                key = (arg, coords, c)
                if key not in self.chunk_loads and self._vector_access(node.shape, coords, self.args[arg]) is not None:
                    self._element_of(node, coords)
        self.elem = None

    def register_phase(self, kind: str, x: Node) -> None:
        """One statistic of x over the row from the thread's elements, then the
        workgroup reduction."""
        ct = _compute_type(x.elem)
        combine = "max" if kind == "max" else "min" if kind == "min" else "add"
        neutral = {"add": 0.0, "max": -math.inf, "min": math.inf}[combine]
        full = _full_tokens(self.a)
        with x.loc or ir.Location.unknown():
            if not self.chunk_loads:
                # Before the first element is used, the loads of every phase: the row's own
                # inputs (from DRAM) and, with the preload "all", those shared by all rows
                # (weights, from L2) too, rather than after the reductions (at the cost of
                # their registers across them).
                self.preload([(x_, full) for _, x_ in self.a.stats] + [
                    (o, _natural(self.a, o)) for o in self.a.outputs if _has_column(_natural(self.a, o))],
                    only_rows=self.plan.get("preload", "rows") != "all")
            self.preload([(x, full)])
            acc = None
            L = self.plan["vector_lanes"]
            for c in range(self.plan["chunks"]):
                parts = []
                for lane in range(L):
                    self.elem = (c, lane)
                    v = self.value(x, full)
                    if kind == "m2":  # two-pass variance: squared deviations from the mean
                        d = arith.subf(v, self.row_mean(x))
                        v = arith.mulf(d, d)
                    elif kind == "sumexp":
                        v = self.shifted_exp(x, full)
                    valid = self.chunk_valid(c)
                    parts.append(v if valid is None else arith.select(valid, v, sm.const(ct, neutral)))
                # a tree over the chunk's lanes (log-depth dependences), then chunk after
                # chunk: terms of one chunk are not all live at once beside the row
                while len(parts) > 1:
                    parts = [self._combine(combine, parts[k], parts[k + 1]) if k + 1 < len(parts) else parts[k]
                             for k in range(0, len(parts), 2)]
                acc = parts[0] if acc is None else self._combine(combine, acc, parts[0])
            self.elem = None
            parts = [acc]
            self.stats[(kind, id(x))] = self.workgroup_reduce(parts[0], combine)

    def register_outputs(self) -> None:
        a = self.a
        n_in = len(a.inputs)
        col_outs, row_outs = [], []
        for i, o in enumerate(a.outputs):
            coords = _natural(a, o)
            (col_outs if _has_column(coords) else row_outs).append((i, o, coords))
        needs = [(o, coords) for _, o, coords in col_outs]
        C = self.plan["chunks"]
        # "pipelined": the loads of chunk c + 1 (weights, from L2) are issued before chunk
        # c is computed, so that two chunks' weights, not all of them, are live beside the
        # row (RMSNorm bf16 32768x8192: 54 -> 48 registers, 4 -> 5 workgroups an SM), at
        # the cost of waiting on L2 more than once; else all chunks' at once, here
        ahead = 1 if self.plan.get("preload", "rows") == "pipelined" else C
        self.preload(needs, chunks=range(min(C, 1 + ahead)))
        L = self.plan["vector_lanes"]
        for c in range(C):
            if c + ahead < C and c:
                self.preload(needs, chunks=[c + ahead])
            stores = []  # (value, memref, indices): every value and index made before the guard
            for i, o, coords in col_outs:
                mem = self.args[n_in + i]
                st = ir.MemRefType(mem.type).element_type
                with o.loc:
                    vals = []
                    for lane in range(L):
                        self.elem = (c, lane)
                        vals.append(to_storage(self.value(o, coords), st))
                    self.elem = (c, 0)
                    idx = self._vector_access(o.shape, coords, mem)
                    if idx is not None:
                        stores.append((vector.from_elements(ir.VectorType.get([L], st), vals), mem, idx, o.loc))
                    else:
                        for lane in range(L):
                            self.elem = (c, lane)
                            stores.append((vals[lane], mem, [self._idx(t) for t in coords], o.loc))
            self.elem = None
            guard = [g for g in (self.chunk_valid(c), self.row_ok) if g is not None]
            ip = None
            if guard:
                cond = guard[0] if len(guard) == 1 else arith.andi(guard[0], guard[1])
                iff = scf.IfOp(cond)
                ip = ir.InsertionPoint(iff.then_block)
            with ip or _here():
                for v, mem, idx, loc in stores:
                    with loc:
                        if isinstance(v.type, ir.VectorType):
                            align = min(L * _ELEM_BYTES[str(ir.VectorType(v.type).element_type)],
                                        self.target.vector_bytes)
                            self.assumed_alignment = max(self.assumed_alignment, align)
                            vector.store(v, mem, idx, alignment=align)
                        else:
                            memref.store(v, mem, idx)
                if guard:
                    scf.YieldOp([])
        if row_outs:
            self._row_outputs(row_outs)

    def _row_outputs(self, row_outs) -> None:
        """Per-row outputs (reductions without keepdim): the row's thread 0 stores them."""
        n_in = len(self.a.inputs)
        vals = [(i, o, coords, self.value(o, coords)) for i, o, coords in row_outs]
        first = arith.cmpi(arith.CmpIPredicate.eq, self.tid, self.zero)
        if self.row_ok is not None:
            first = arith.andi(first, self.row_ok)
        iff = scf.IfOp(first)
        with ir.InsertionPoint(iff.then_block):
            for i, o, coords, v in vals:
                with o.loc:
                    mem = self.args[n_in + i]
                    memref.store(to_storage(v, ir.MemRefType(mem.type).element_type), mem,
                                 [self._idx(c) for c in coords])
            scf.YieldOp([])


class _here:
    """The current insertion point (a no-op context, beside ir.InsertionPoint)."""

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False


def _has_column(coords: tuple) -> bool:
    return any(c and c[0] == "c" for c in coords)


def _next_pow2(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


@dataclass(frozen=True)
class RowwiseVariant:
    """The rowwise kernels' variants (``kf-tile{rowwise.<field>=<value>}``): which of the
    two kernels a row gets -- registers mode (a thread keeps its share of the row in
    registers, straight-line code) or the loop kernel (row loops that kf-vectorize and
    kf-promote-shared rewrite) -- and their tuning numbers. bench/RESULTS.md has the
    measurements behind each default."""

    #: a cap on the vector lanes of row accesses (0: none, the target's widest access,
    #: which moves the most bytes an instruction)
    max_lanes: int = 0
    #: a cap on the threads that share a row (0: one thread per vector of the row, up to
    #: the workgroup limit). Fewer threads a row loop over more vectors each, and more
    #: workgroups (rows) stay resident on a multiprocessor: more loads in flight; 256
    #: keeps a long row's loop short while leaving room for that.
    max_row_threads: int = 256
    #: registers mode where a thread's share of the row fits this many values (0: never,
    #: the loop kernel everywhere). The loop kernel's phases each unpack the row again
    #: from workgroup memory behind a barrier, and a softmax computes exp twice an
    #: element; registers mode loads and computes each element once. 32 values a thread
    #: fit beside a reduction's working set without spilling.
    row_registers: int = 32
    #: registers mode for rows whose narrowest float moved along the row has at most this
    #: many bytes. 2: f16/bf16 rows, where the loop kernel's own instructions (unpacking
    #: and converting halves), not memory, bound it; wider rows take registers mode only
    #: as ``row_registers_wide_capped`` allows.
    row_registers_widest: int = 2
    #: registers mode for wider (f32) rows too where one row fills a workgroup and
    #: ``row_max_registers`` holds the thread to its cap (CUDA). With several rows a
    #: workgroup the loop kernel is as fast and registers mode spills on sm_80: those
    #: rows stay on the loop kernel.
    row_registers_wide_capped: bool = True
    #: threads a workgroup aims at in registers mode: rows short enough for fewer threads
    #: share a workgroup, one group of threads each (reductions of a warp or less are
    #: shuffles only, with no barrier)
    row_block: int = 256
    #: division by a per-row value (layer norm's sqrt(var + eps), softmax's sum):
    #: "narrow" multiplies by its reciprocal, computed once a row, where every output is
    #: f16/bf16 (the f32 results differ by an ulp at most, far below their rounding);
    #: "always"; "never"
    row_reciprocal: str = "narrow"
    #: registers mode: which loads go before the first phase. "rows": the inputs that
    #: change from row to row (from DRAM); a weight is loaded, every chunk at once, by the
    #: first phase that reads it. "pipelined": as "rows", but the output phase loads a
    #: weight's chunk c + 1 before computing chunk c, so that two chunks' weights, not
    #: all, are live beside the row (fewer registers, more workgroups resident). "all":
    #: weights too, their latency off the row's critical path and their registers held
    #: through the reductions.
    row_preload: str = "pipelined"
    #: registers mode on CUDA: the registers ptxas holds a thread to (.maxnreg) where one
    #: row a workgroup holds at most 32 values a thread; 0: ptxas's own choice. Left to
    #: itself ptxas gives the bf16 layer norm more registers than four workgroups of 256
    #: threads a multiprocessor allow; 64 fits them without spilling. With several rows a
    #: workgroup 64 spills, so the cap is not applied there.
    row_max_registers: int = 64

    def __post_init__(self):
        choices = {"row_reciprocal": ("narrow", "always", "never"), "row_preload": ("rows", "pipelined", "all")}
        for name, allowed in choices.items():
            if getattr(self, name) not in allowed:
                raise ValueError(f"variant '{name}' takes {', '.join(allowed[:-1])} or {allowed[-1]}, "
                                 f"not '{getattr(self, name)}'")
        for f in dataclasses.fields(self):
            if isinstance(getattr(self, f.name), int) and getattr(self, f.name) < 0:
                raise ValueError(f"variant '{f.name}' takes an int >= 0, not '{getattr(self, f.name)}'")


class RowwiseStrategy(Strategy):
    KIND = "rowwise"
    VARIANT = RowwiseVariant

    def plan(self, kernel: ir.Operation, target: TargetInfo, variant: RowwiseVariant | None = None) -> dict:
        """Threads per row, vector lanes, which inputs' rows to cache in workgroup memory
        and how reductions combine across threads; ``variant``: a RowwiseVariant (its
        defaults where None)."""
        v = variant or RowwiseVariant()
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
        if v.max_lanes:
            lanes = min(lanes, v.max_lanes)
        threads = min(target.max_threads, max(target.subgroup_size, _next_pow2(-(-R // lanes))))
        if v.max_row_threads:
            threads = max(target.subgroup_size, min(threads, v.max_row_threads))

        def reduction_for(block: int) -> str:
            # subgroup butterflies, then one across the subgroups' partials: that second
            # one needs at most a subgroup of them (CUDA: 32 x 32 covers any workgroup)
            return "shuffle" if target.has_shuffle and block <= target.subgroup_size ** 2 else "tree"

        reduction = reduction_for(threads)
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
        outs = [n.elem for n in a.outputs]
        reciprocal = {"always": True, "never": False}.get(
            v.row_reciprocal, bool(outs) and all(e in ("f16", "bf16") for e in outs))
        common = {"rows": a.rows, "row_length": R, "reduction": reduction, "phases": len(a.stats) + 1,
                  "reciprocal": reciprocal}
        # booleans (a mask beside f32 rows) do not make a row narrow: its floats do
        narrow_float = min((_ELEM_BYTES.get(e, 4) for e in row_elems if e.startswith(("f", "bf"))), default=4)
        registers = self._registers_plan(a, target, lanes, v)
        if registers is not None and narrow_float > v.row_registers_widest and not (
                v.row_registers_wide_capped and registers["max_registers"]):
            registers = None
        if registers is not None:
            T = registers["threads"]
            reduction = reduction_for(T)
            return {**common, "reduction": reduction, **registers, "cache_row": False, "cached_inputs": [],
                    "scratch_bytes": 2 * (target.subgroup_size if reduction == "shuffle" else T) * 4}
        return {**common, "mode": "loop", "threads": threads, "vector_lanes": lanes, "cache_row": bool(cached),
                "cached_inputs": cached, "scratch_bytes": scratch}

    def _registers_plan(self, a: Analysis, target: TargetInfo, lanes: int, v: RowwiseVariant) -> dict | None:
        """Registers mode where a thread's share of the row fits ``v.row_registers``
        values: L lanes dividing the row (so every row starts aligned), T threads a row (a
        power of two, at most ``v.max_row_threads``) for at most row_registers // L vectors
        each, and as many rows a workgroup as fill ``v.row_block`` threads."""
        if not v.row_registers or a.nred != 1:
            return None
        R = a.row_length
        L = lanes
        while L > 1 and R % L:
            L //= 2
        nvec = R // L
        cap = min(target.max_threads, v.max_row_threads or target.max_threads)
        cap = 1 << (cap.bit_length() - 1)
        T = min(cap, _next_pow2(-(-nvec // max(1, v.row_registers // L))))
        chunks = -(-nvec // T)
        if chunks * L > v.row_registers:
            return None
        block = max(T, min(v.row_block, target.max_threads))
        P = max(1, min(block // T, _next_pow2(a.rows)))
        return {"mode": "registers", "threads": P * T, "row_threads": T, "rows_per_block": P,
                "vector_lanes": L, "chunks": chunks, "preload": v.row_preload,
                "max_registers": self._max_registers(target, P, chunks * L, v)}

    def _max_registers(self, target: TargetInfo, rows_per_block: int, values: int, v: RowwiseVariant) -> int:
        """The registers a thread ptxas is held to (.maxnreg), or 0 for its own choice:
        ``v.row_max_registers`` on CUDA for one row a workgroup of at most 32 values a
        thread (with several rows a workgroup the cap spills)."""
        if target.name != "cuda" or not v.row_max_registers or rows_per_block > 1 or values > 32:
            return 0
        return v.row_max_registers

    def emit(self, kernel: ir.Operation, plan: dict, gpu_module: ir.Operation, target: TargetInfo) -> EmittedKernel:
        a = analyze(kernel)
        plan = plan or self.plan(kernel, target)
        name = ir.StringAttr(kernel.attributes["sym_name"]).value
        T = plan["threads"]
        registers = plan.get("mode") == "registers"
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
                    (em.register_phase if registers else em.phase)(kind, node)
                (em.register_outputs if registers else em.outputs)()
                gpu.ReturnOp([])
            if plan.get("max_registers"):
                # .maxnreg for ptxas (a cap: it may still use fewer)
                fn.operation.attributes["nvvm.maxnreg"] = ir.IntegerAttr.get(
                    ir.IntegerType.get_signless(32), plan["max_registers"])
            if em.assumed_alignment:
                # what kf-vectorize records for its vector accesses: the launcher's promise
                fn.operation.attributes[ASSUMED_ALIGNMENT] = ir.IntegerAttr.get(
                    ir.IntegerType.get_signless(64), em.assumed_alignment)
        notes = dict(plan, inputs=len(a.inputs), outputs=len(a.outputs))
        P = plan.get("rows_per_block", 1)
        return EmittedKernel(name, (-(-a.rows // P), 1, 1), (T, 1, 1), 0, notes)


def _has_terminator(block: ir.Block) -> bool:
    ops = list(block.operations)
    return bool(ops) and ops[-1].operation.name in ("gpu.module_end",)


register(RowwiseStrategy())
