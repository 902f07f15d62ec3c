"""Registers mode: the row's elements stay in the threads' registers.

The row is cut into `chunks` x T vectors of L elements (the last chunk partial
where T does not divide the vectors): thread t holds vectors c*T + t. Each phase is
straight-line code over the thread's elements, so a value computed in one phase
(the loaded and extended x, exp(x - max)) is there for the next without being
loaded or computed again, and all of a phase's loads are issued before any is used.
"""

from __future__ import annotations

import contextlib
import math

from mlir import ir
from mlir.dialects import arith, memref, scf, vector

from kf.passes import scalar_math as sm

from ..emit import to_storage
from .analysis import ELEM_BYTES, Node, element_loads, full_tokens, has_column, natural
from .emit import RowEmitter, compute_type, const_index


class RegistersEmitter(RowEmitter):
    """Registers mode's phases and outputs: straight-line code over a thread's elements."""

    def __init__(self, *args):
        super().__init__(*args)
        self.chunk_loads: dict = {}  # (input, leading coords, chunk) -> vector (or i32 words)
        self.columns: dict = {}  # (chunk, lane) -> column index

    def chunk_full(self, c: int) -> bool:
        return (c + 1) * self.T <= self.plan["row_length"] // self.plan["vector_lanes"]

    def vector_of(self, c: int) -> ir.Value:
        """The index of thread's vector in chunk c, clamped to the row: a partial chunk's
        threads past the row read the last vector again and use none of it."""
        key = ("vector", c)
        if key not in self.row_memo:
            nvec = self.plan["row_length"] // self.plan["vector_lanes"]
            v = arith.addi(self.tid, const_index(c * self.T)) if c else self.tid
            self.row_memo[key] = v if self.chunk_full(c) else arith.minui(v, const_index(nvec - 1))
        return self.row_memo[key]

    def chunk_valid(self, c: int) -> ir.Value | None:
        """i1: chunk c of this thread lies in the row (None: it always does)."""
        if self.chunk_full(c):
            return None
        key = ("valid", c)
        if key not in self.row_memo:
            nvec = self.plan["row_length"] // self.plan["vector_lanes"]
            self.row_memo[key] = arith.cmpi(arith.CmpIPredicate.ult, arith.addi(self.tid, const_index(c * self.T)),
                                            const_index(nvec))
        return self.row_memo[key]

    def column(self, c: int, lane: int) -> ir.Value:
        if (c, lane) not in self.columns:
            base = self.vector_base(c) if self.plan["vector_lanes"] > 1 else self.vector_of(c)
            self.columns[(c, lane)] = arith.addi(base, const_index(lane)) if lane else base
        return self.columns[(c, lane)]

    def vector_base(self, c: int) -> ir.Value:
        """The first column of this thread's vector in chunk c."""
        key = ("vector_base", c)
        if key not in self.row_memo:
            self.row_memo[key] = arith.muli(self.vector_of(c), const_index(self.plan["vector_lanes"]))
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
                align = min(L * ELEM_BYTES[str(mt.element_type)], self.target.vector_bytes)
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

    def preload(self, nodes: list[tuple[Node, tuple]], only_rows: bool = False, chunks=None) -> None:
        """Issue the vector loads the elements of nodes need, for every chunk (or those
        of `chunks`), before any element is computed (only those of inputs that change
        from row to row, with only_rows: the ones from DRAM)."""
        acc: set = set()
        for n, coords in nodes:
            element_loads(self.a, n, coords, acc, set())
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

    def phase(self, kind: str, x: Node) -> None:
        """One statistic of x over the row from the thread's elements, then the
        workgroup reduction."""
        ct = compute_type(x.elem)
        combine = "max" if kind == "max" else "min" if kind == "min" else "add"
        neutral = {"add": 0.0, "max": -math.inf, "min": math.inf}[combine]
        full = full_tokens(self.a)
        with x.loc or ir.Location.unknown():
            if not self.chunk_loads:
                # Before the first element is used, the loads of every phase: the row's own
                # inputs (from DRAM) and, with the preload "all", those shared by all rows
                # (weights, from L2) too, rather than after the reductions (at the cost of
                # their registers across them).
                self.preload([(x_, full) for _, x_ in self.a.stats] + [
                    (o, natural(self.a, o)) for o in self.a.outputs if has_column(natural(self.a, o))],
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

    # -- column partials: each thread sums its own elements of the group's rows
    def _partial_elements(self):
        for i, o in self.a.partials:
            for c in range(self.plan["chunks"]):
                for lane in range(self.plan["vector_lanes"]):
                    yield i, o, c, lane

    def partial_inits(self) -> list[ir.Value]:
        return [sm.const(compute_type(o.elem), 0.0) for _, o, _, _ in self._partial_elements()]

    def accumulate(self) -> list[ir.Value]:
        full = full_tokens(self.a)
        sums = []
        for acc, (_, o, c, lane) in zip(self.accumulators, self._partial_elements()):
            with o.loc:
                self.elem = (c, lane)
                v = self.value(o.operands[0], full)
                sums.append(arith.addf(acc, sm.convert(v, acc.type)))
        self.elem = None
        return sums

    def store_partials(self, sums: list[ir.Value]) -> None:
        """Each chunk's sums stored at [group, column], guarded where the chunk or the
        group can be missing."""
        n_in = len(self.a.inputs)
        by_chunk: dict = {}
        for v, (i, o, c, lane) in zip(sums, self._partial_elements()):
            by_chunk.setdefault(c, []).append((v, i, o, lane))
        for c, items in sorted(by_chunk.items()):
            stores = []
            for v, i, o, lane in items:
                self.elem = (c, lane)
                mem = self.args[n_in + i]
                stores.append((to_storage(v, ir.MemRefType(mem.type).element_type), mem,
                               [self._idx(t) for t in natural(self.a, o)], o.loc))
            self.elem = None
            guard = [g for g in (self.chunk_valid(c), self.row_ok) if g is not None]
            ip = None
            if guard:
                iff = scf.IfOp(guard[0] if len(guard) == 1 else arith.andi(guard[0], guard[1]))
                ip = ir.InsertionPoint(iff.then_block)
            with ip or contextlib.nullcontext():
                for v, mem, idx, loc in stores:
                    with loc:
                        memref.store(v, mem, idx)
                if guard:
                    scf.YieldOp([])

    def _forget(self) -> None:
        super()._forget()
        self.chunk_loads, self.columns = {}, {}

    def outputs(self) -> None:
        """The row's outputs, chunk by chunk, each chunk's stores guarded where its vectors
        or its row can be missing."""
        a = self.a
        n_in = len(a.inputs)
        col_outs, row_outs = [], []
        for i, o in enumerate(a.outputs):
            if o.op == "partial":
                continue
            coords = natural(a, o)
            (col_outs if has_column(coords) else row_outs).append((i, o, coords))
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
            with ip or contextlib.nullcontext():
                for v, mem, idx, loc in stores:
                    with loc:
                        if isinstance(v.type, ir.VectorType):
                            align = min(L * ELEM_BYTES[str(ir.VectorType(v.type).element_type)],
                                        self.target.vector_bytes)
                            self.assumed_alignment = max(self.assumed_alignment, align)
                            vector.store(v, mem, idx, alignment=align)
                        else:
                            memref.store(v, mem, idx)
                if guard:
                    scf.YieldOp([])
        if row_outs:
            self.row_outputs(row_outs)
