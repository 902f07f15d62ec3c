"""What both rowwise kernels share: the markers kf-promote-shared and kf-vectorize read,
and ``RowEmitter``, which writes a kernel's values at the current (row, column) point,
its per-row values and its workgroup reductions. ``LoopEmitter`` (loop.py) and
``RegistersEmitter`` (registers.py) write the phases."""

from __future__ import annotations

import contextlib

from mlir import ir
from mlir.dialects import arith, gpu, memref, scf

from kf.dialects.elements import NARROW_INTS, UNSIGNED
from kf.passes import scalar_math as sm

from ..base import NotApplicable, TargetInfo
from ..emit import index_value, storage_type, to_storage
from .analysis import REDUCTIONS, Analysis, Node, align, has_column, stat_coords

#: Attribute names shared with kf-promote-shared and kf-vectorize (the markers).
ROW_LOOP = "kf.row_loop"  # unit: IV = tid + k*T over [0, ub), each column once per workgroup
VECTOR_LANES = "kf.vector_lanes"  # on a row loop: lanes the plan allows (1 = leave scalar)
PROMOTE = "kf.promote"  # on a global load: this input's row is read in several phases
MAX_SHARED = "kf.max_shared_bytes"  # on the gpu.func: the target's workgroup-memory limit
ASSUMED_ALIGNMENT = "kf.assumed_alignment"  # on the gpu.func: bytes kernel buffers are aligned to (kf-vectorize's)


def compute_type(elem: str) -> ir.Type:
    if elem in ("f16", "bf16") or elem.startswith("f8") or elem == "f32":
        return ir.F32Type.get()
    if elem in NARROW_INTS:
        return ir.IntegerType.get_signless(32)
    return ir.Type.parse(elem)


def const_index(v: int) -> ir.Value:
    return arith.constant(ir.IndexType.get(), v)


class RowEmitter:
    """A rowwise kernel's gpu.func body being written: ``setup`` (the row's coordinates),
    then a subclass's ``phase`` for each statistic and its ``outputs``."""

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
        # registers mode: the element being computed, (chunk, lane)
        self.elem: tuple[int, int] | None = None
        self.elem_memo: dict = {}  # (chunk, lane) -> that element's memo
        self.assumed_alignment = 0  # the widest vector access to a kernel buffer, in bytes
        #: run-time sizes: the number of rows (an index; the grid covers exactly these
        #: with one row a workgroup), None where it is a.rows
        self.rows_value: ir.Value | None = None
        #: the workgroup's index where the grid is folded into two dims, else None (x)
        self.block_index: ir.Value | None = None

    # -- coordinates
    def setup(self):
        """The thread's place: its index among its row's threads, and its row -- or, with
        column partials, its group of rows (``rows`` walks them)."""
        tid = gpu.thread_id(gpu.Dimension.x)
        bid = self.block_index if self.block_index is not None else gpu.block_id(gpu.Dimension.x)
        self.zero = const_index(0)
        self.block_tid = tid
        self.row_ok = None  # i1: this thread's row exists (several rows a block, rows % P != 0)
        count = self.a.groups or self.a.rows  # what the workgroups share out: groups or rows
        if self.P > 1:
            # rows_per_block rows of T threads each: thread tid works on row bid*P + tid/T
            self.tid = arith.remui(tid, const_index(self.T))
            row = arith.addi(arith.muli(bid, const_index(self.P)), arith.divui(tid, const_index(self.T)))
            if self.rows_value is not None or count % self.P:
                # Threads past the last row compute the last row again (so that every
                # thread takes part in the shuffles and barriers) and store nothing.
                if self.rows_value is None:
                    self.row_ok = arith.cmpi(arith.CmpIPredicate.ult, row, const_index(count))
                    row = arith.minui(row, const_index(count - 1))
                else:  # run-time sizes: rows only (column partials need static rows)
                    self.row_ok = arith.cmpi(arith.CmpIPredicate.ult, row, self.rows_value)
                    row = arith.minui(row, arith.subi(self.rows_value, const_index(1)))
        else:
            self.tid = tid
            row = bid
        self.group = row if self.a.groups else None
        self.row = None if self.a.groups else row
        self.accumulators: list = []  # registers mode, in the group's loop: the partial sums so far

    @contextlib.contextmanager
    def rows(self):
        """Around the phases and outputs: the row's coordinates; with column partials, the
        loop over the group's B rows (``scf.for r``), whose body ends with the partial
        sums of the row added (``accumulate``) and a barrier -- the next row's first
        reduction writes the scratch buffer that this row's last one may still be read
        from --, and after which the sums are stored (``store_partials``)."""
        if not self.a.groups:
            self._row_coordinates(self.row)
            yield
            return
        B = self.a.rows // self.a.groups
        loop = scf.ForOp(self.zero, const_index(B), const_index(1), self.partial_inits())
        with ir.InsertionPoint(loop.body):
            self.first_row = arith.cmpi(arith.CmpIPredicate.eq, loop.induction_variable, self.zero)
            self.accumulators = list(loop.inner_iter_args)
            row = arith.addi(arith.muli(self.group, const_index(B)), loop.induction_variable)
            self._row_coordinates(row)
            yield
            sums = self.accumulate()
            gpu.barrier()
            scf.YieldOp(sums)
        # what the loop body computed does not dominate what follows
        self._forget()
        self.store_partials(list(loop.results))

    def partial_inits(self) -> list[ir.Value]:
        """The initial values of the group loop's accumulators (none: ``LoopEmitter``
        accumulates in the partial outputs themselves)."""
        return []

    def accumulate(self) -> list[ir.Value]:
        """At the end of a row of the group loop: the accumulators with the row added."""
        return []

    def store_partials(self, sums: list[ir.Value]) -> None:
        """After the group loop: the partial sums stored."""

    def _forget(self) -> None:
        self.row_memo, self.stats, self.loop_memo, self.elem_memo = {}, {}, {}, {}

    def _row_coordinates(self, row: ir.Value) -> None:
        self.rowv = {}
        rem = row
        lead = self.a.lead
        for i in reversed(range(len(lead))):
            if lead[i] == 1:
                continue
            if i == min(k for k in range(len(lead)) if lead[k] > 1):
                self.rowv[("r", i)] = rem
            else:
                c = const_index(lead[i])
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
                c = const_index(cols[k])
                out[("c", k)] = arith.remui(rem, c)
                rem = arith.divui(rem, c)
        return out

    def _idx(self, token) -> ir.Value:
        if token is None:
            return self.zero
        if token[0] == "r":
            return self.rowv[token]
        if token[0] == "g":
            return self.group
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
                elem = storage_type(node.elem)
                return sm.convert(sm.const(elem, value), compute_type(node.elem), unsigned=node.elem in UNSIGNED)
            if node.op == "kf.iota":
                # the index along its dim (a causal mask built in the function)
                token = coords[int(node.attrs["dim"]) % len(coords)]
                return index_value(self._idx(token), compute_type(node.elem))
            if node.op in REDUCTIONS:
                if coords != stat_coords(self.a, node):
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
                    inner = align(coords, node.shape, src.shape)
                return self.value(src, inner)
            vals = [self.value(o, align(coords, node.shape, o.shape)) for o in node.operands]
            if node.op == "kf.cast":
                target = storage_type(node.elem)
                return sm.convert(sm.convert(vals[0], target), compute_type(node.elem),
                                  unsigned=node.elem in UNSIGNED)
            if node.op not in ("kf.select", "kf.masked_fill"):
                if len({str(v.type) for v in vals}) > 1:
                    raise NotApplicable(f"{node.op} on mixed compute types")
            if node.op == "kf.div" and self.plan.get("reciprocal") and has_column(coords):
                d_coords = align(coords, node.shape, node.operands[1].shape)
                if not has_column(d_coords):
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
        return sm.convert(v, compute_type(elem), unsigned=elem in UNSIGNED)

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


    def _element_of(self, node: Node, coords: tuple) -> ir.Value:
        """Registers mode's current element of an input (``RegistersEmitter``)."""
        raise NotImplementedError

    def column(self, c: int, lane: int) -> ir.Value:
        """Registers mode's column of element (c, lane) (``RegistersEmitter``)."""
        raise NotImplementedError

    def row_mean(self, x: Node) -> ir.Value:
        """sum(x) / R, once per row (before the current loop, if inside one)."""
        key = ("meanvalue", id(x))
        if key not in self.stats:
            ip = ir.InsertionPoint(self.loop_op) if self.loop_op is not None else ir.InsertionPoint.current
            with ip:
                ct = compute_type(x.elem)
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
            lane = arith.remui(self.block_tid, const_index(sub))
            warp = arith.divui(self.block_tid, const_index(sub))
            first = arith.cmpi(arith.CmpIPredicate.eq, lane, self.zero)
            iff = scf.IfOp(first)
            with ir.InsertionPoint(iff.then_block):
                memref.store(v, buf, [warp])
                scf.YieldOp([])
            gpu.barrier()
            # lane l of every warp of the row reads the partial of the row's warp l % warps:
            # a butterfly over `warps` lanes then gives every lane the row's total
            row_first = arith.subi(warp, arith.remui(warp, const_index(warps)))
            w = memref.load(buf, [arith.addi(row_first, arith.remui(lane, const_index(warps)))])
            return butterfly(w, warps)
        memref.store(partial, buf, [self.block_tid])
        gpu.barrier()
        s = T // 2
        while s >= 1:
            lt = arith.cmpi(arith.CmpIPredicate.ult, self.tid, const_index(s))
            iff = scf.IfOp(lt)
            with ir.InsertionPoint(iff.then_block):
                other = arith.addi(self.block_tid, const_index(s))
                u = memref.load(buf, [self.block_tid])
                w = memref.load(buf, [other])
                memref.store(self._combine(kind, u, w), buf, [self.block_tid])
                scf.YieldOp([])
            gpu.barrier()
            s //= 2
        return memref.load(buf, [arith.subi(self.block_tid, self.tid) if self.P > 1 else self.zero])

    def row_outputs(self, row_outs) -> None:
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
