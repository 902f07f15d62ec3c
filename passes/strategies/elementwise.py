"""The elementwise strategy: a fused chain of elementwise kf ops (with torch broadcasting,
fills, splat constants, broadcast_to and kf.rand) written as one pass over the output.

One thread computes ``vec`` contiguous elements of the output (one when ``vec`` is 1),
on CUDA ``items_per_thread`` such groups (``ElementwiseVariant``, one grid's width apart):
operands that run along the output's innermost dimension are read with one
``vector.load`` of ``vec`` elements (16 bytes; bf16 lanes are widened from its 32-bit
words with one shift or mask each), operands broadcast along it are read
once per thread and shared by the lanes, and each output is written with one
``vector.store``. The scalar arithmetic of each lane is the generic strategy's
evaluator (scalar_math through kf's precision policy: f16/bf16 computed in f32, rounded
once when stored), so the two strategies cannot disagree on a value. A ``kf.rand`` of the
output's shape is computed one Philox block per 4 lanes (2 for normal samples), which
the lanes share, where the vector is whole blocks; elsewhere each element computes its
own block, as in the generic strategy.

The plan picks ``block`` = 256 threads (every target kf has allows that) and
``vector_width`` = 16 bytes / the widest element (of the outputs and the inputs that
are not rank 0 or random states), when the output's innermost dimension
is a multiple of it (so a thread's elements never straddle two rows and every access is
16-byte aligned); booleans (LLVM packs ``vector<Nxi1>`` into bits, torch stores bytes)
and, on SPIR-V, bf16 (kf-to-spirv loads bf16 as scalars) keep it at 1; SPIR-V caps it
at 4 (its vectors have at most 4 components without the Vector16 capability). Grid: exact,
``ceil(numel / vec / items_per_thread / block)``, the last pass of a thread guarded where
it can run past the end, or grid-stride (one vector a thread) past the target's grid
limit. kf-vectorize may read ``vector_width`` from the plan.

Not applicable (the generic strategy takes it): any other op, or results of different
shapes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from mlir import ir
from mlir.dialects import arith, scf, vector

from kf.dialects.attrs import op_attrs
from kf.dialects.philox import PER_BLOCK
from kf.passes import philox

from . import emit as E
from . import run_time_sizes
from .base import EmittedKernel, NotApplicable, Strategy, TargetInfo, register
from .generic import Evaluator, emit_outputs

_ALSO = frozenset({"kf.fill", "kf.broadcast_to", "kf.rand"})
#: ops that move elements (kf-fuse's ``remaps``): their operand is read at the moved index
_MOVES = frozenset({"kf.slice", "kf.concat", "kf.transpose"})


def _check(kernel: ir.Operation) -> tuple[int, ...]:
    """The common output shape, or NotApplicable."""
    for op in E.kernel_ops(kernel):
        ok = op.name in E.ELEMENTWISE or op.name in _ALSO or op.name in _MOVES or (
            op.name == "kf.constant" and ir.DenseElementsAttr(op.attributes["value"]).is_splat)
        if not ok:
            raise NotApplicable(f"{op.name} is not elementwise")
        if op.name in _MOVES and run_time_sizes.is_bounded(kernel):
            # a slice's start from the end and a concat's split are run-time sizes there,
            # which the generic strategy reads (RunTimeShapes)
            raise NotApplicable(f"{op.name} with run-time sizes")
    _, outs = E.kernel_signature(kernel)
    shapes = {s.shape for s in outs}
    if len(shapes) != 1:
        raise NotApplicable("results of different shapes")
    return shapes.pop()


def _random_states(kernel: ir.Operation) -> set[int]:
    """The kernel arguments only kf.rand reads (random states: two words a thread)."""
    args = E.kernel_body(kernel).arguments
    states = set()
    for i, a in enumerate(args):
        users = [getattr(u.owner, "operation", u.owner) for u in a.uses]
        if users and all(op.name == "kf.rand" for op in users):
            states.add(i)
    return states


def vector_width(kernel: ir.Operation, shape: Sequence[int], target: TargetInfo) -> int:
    ins, outs = E.kernel_signature(kernel)
    # rank-0 inputs are read once a thread: they do not bound the vector (an f32 scale
    # kept fp8's bf16 -> e4m3 quantization at 4 lanes, 8-byte loads and 4-byte stores);
    # nor do random states, read once a thread too
    states = _random_states(kernel)
    elems = {s.elem for i, s in enumerate(ins) if s.rank > 0 and i not in states} | {s.elem for s in outs}
    if not shape or "i1" in elems or (target.name == "spirv" and "bf16" in elems):
        return 1
    if run_time_sizes.innermost_is_run_time(kernel):
        return 1  # a run-time innermost dim (a 1-d tensor of run-time length) need not divide
    vec = target.vector_bytes // max(E.ELEM_BYTES[e] for e in elems)
    if target.name == "spirv":
        vec = min(vec, 4)  # SPIR-V vectors have at most 4 components without Vector16
    return vec if vec > 1 and shape[-1] % vec == 0 else 1


class _Lane(Evaluator):
    """The evaluator of lane ``lane`` of a thread's ``vec`` elements, the thread's
    ``item``-th group of the output (of ``shape``); loads are shared by the lanes through
    ``shared`` (vectors for operands along the innermost dimension, scalars for the
    others), and so are Philox blocks."""

    def __init__(self, kb, inputs, lane: int, inner: Sequence[ir.Value], shared: dict,
                 item: ir.Value | None = None, shape: Sequence[int] = (), short_forms: bool = True):
        super().__init__(kb, inputs, short_forms=short_forms)
        self.lane, self.inner, self.shared = lane, inner, shared
        self.item, self.out_shape = item, tuple(shape)
        #: the block the lanes share values in; inside a concat's branches a lane computes
        #: on its own (a value made there does not reach the other lanes)
        self.home = ir.InsertionPoint.current.block

    def _at_home(self) -> bool:
        return ir.InsertionPoint.current.block == self.home

    def compute(self, op: ir.Operation, idx: list, which: int) -> list[ir.Value]:
        if op.name == "kf.rand":
            value = self._shared_block_sample(op, idx)
            if value is not None:
                return [value]
        return super().compute(op, idx, which)

    def _shared_block_sample(self, op: ir.Operation, idx: list) -> ir.Value | None:
        """This lane's sample of a Philox block the lanes share, or None: when the rand has
        the output's shape (its element is the lane's own) and the vector is whole blocks
        (the first lane's element, ``item * vec``, then starts one), lane k takes word
        k % n of the thread's block k // n, made once."""
        attrs = op_attrs(op)
        n = PER_BLOCK[attrs["distribution"]]
        vec = len(self.inner)
        if self.item is None or vec % n or E.shape_of(op.results[0]) != self.out_shape or \
                not idx or idx[-1] != self.inner[self.lane] or not self._at_home():
            return None
        key = ("philox", op, self.lane // n)
        if key not in self.shared:
            state = op.operands[0]
            seed, offset = self.value(state, [0]), self.value(state, [1])
            b = self.kb.value(self.kb.add(self.kb.mul(self.item, vec // n), self.lane // n))
            self.shared[key] = philox.block(seed, philox.counter(offset, int(attrs["offset"]), b))
        return philox.from_words(self.shared[key], self.lane % n, attrs["distribution"])

    def load_input(self, arg: int, idx: tuple, elem: str | None = None) -> ir.Value:
        mem = self.inputs[arg]
        if not self._at_home():
            return super().load_input(arg, idx, elem)
        mt = ir.MemRefType(mem.type)
        # a vector of the lanes' elements, where they are consecutive elements of this
        # input's row starting at a vector's multiple (a slice along the row moves them)
        if idx and not isinstance(idx[-1], int) and idx[-1] == self.inner[self.lane] and \
                mt.shape[-1] % len(self.inner) == 0:
            key = ("vec", arg, idx[:-1])
            if key not in self.shared:
                vt = ir.VectorType.get([len(self.inner)], mt.element_type)
                at = [self.kb.value(i) for i in [*idx[:-1], self.inner[0]]]
                self.shared[key] = vector.load(vt, mem, at, alignment=_alignment(mt, len(self.inner)))
            if str(ir.MemRefType(mem.type).element_type) == "bf16" and len(self.inner) % 2 == 0:
                return self._bf16_lane(key)
            return E.widen(vector.extract(self.shared[key], [], [self.lane]), elem)
        key = ("scalar", arg, idx)
        if key not in self.shared:
            self.shared[key] = E.load(mem, idx, self.kb, elem)
        return self.shared[key]

    def _bf16_lane(self, key) -> ir.Value:
        """This lane's bf16 as f32, from the vector's 32-bit words: bf16 is the high half
        of an f32, so the low element of a word is ``word << 16`` and the high one
        ``word & 0xffff0000`` (one instruction each; ``arith.extf`` makes ptxas move the
        high half down and shift it back, two)."""
        i32 = ir.IntegerType.get_signless(32)
        wkey = ("words", *key[1:])
        if wkey not in self.shared:
            self.shared[wkey] = vector.bitcast(ir.VectorType.get([len(self.inner) // 2], i32), self.shared[key])
        word = vector.extract(self.shared[wkey], [], [self.lane // 2])
        if self.lane % 2 == 0:
            bits = arith.shli(word, arith.constant(i32, 16))
        else:
            bits = arith.andi(word, arith.constant(i32, -65536))  # 0xffff0000
        return arith.bitcast(ir.F32Type.get(), bits)


def _alignment(mt: ir.MemRefType, vec: int) -> int:
    return vec * E.ELEM_BYTES[str(mt.element_type)]


@dataclass(frozen=True)
class ElementwiseVariant:
    """The elementwise kernel's variants (``kf-tile{elementwise.<field>=<value>}``)."""

    #: Vectors a thread handles on CUDA (plan key ``items_per_thread``, absent when 1; 1 on
    #: other targets and without vectors). Two share the index arithmetic and a broadcast
    #: operand's load: bf16 bias+GELU 32768x8192 on sm_90 is 245 SASS instructions a
    #: thread for 16 elements (15.3 an element) against 133 for 8 (16.6); f32 252 for 8
    #: (31.5) against 135 for 4 (33.8). 1 gives the one-vector kernel back.
    items_per_thread: int = 2
    #: Results stored as bf16/f16/fp8 take scalar_math's short forms of GELU, sigmoid and
    #: erf (``scalar_math.emit`` gives their errors); False: the accurate forms
    #: (libdevice's erff and exact division) everywhere.
    short_forms: bool = True

    def __post_init__(self):
        if self.items_per_thread < 1:
            raise ValueError(f"variant 'items_per_thread' takes an int >= 1, not '{self.items_per_thread}'")


class ElementwiseStrategy(Strategy):
    KIND = "elementwise"
    VARIANT = ElementwiseVariant

    def plan(self, kernel: ir.Operation, target: TargetInfo, variant: ElementwiseVariant | None = None) -> dict:
        v = variant or ElementwiseVariant()
        shape = _check(kernel)
        vec = vector_width(kernel, shape, target)
        block = min(256, target.max_threads)
        items = E.numel(shape) // vec
        per = v.items_per_thread if target.name == "cuda" and vec > 1 else 1
        per = min(per, max(1, items // block))
        grid, stride = E.launch_geometry(-(-items // per), block, E.max_grid_x(target.name))
        if stride:
            per = 1
            grid, stride = E.launch_geometry(items, block, E.max_grid_x(target.name))
        plan = {"strategy": "elementwise", "block": block, "vector_width": vec, "numel": E.numel(shape),
                "grid": grid, "grid_stride": stride}
        if per > 1:
            plan["items_per_thread"] = per
        if not v.short_forms:
            plan["short_forms"] = False
        return plan

    def emit(self, kernel: ir.Operation, plan: dict, gpu_module: ir.Operation, target: TargetInfo) -> EmittedKernel:
        shape = _check(kernel)
        ins, outs = E.kernel_signature(kernel)
        name = E.kernel_name(kernel)
        block, grid, vec = int(plan["block"]), int(plan["grid"]), int(plan["vector_width"])
        short = bool(plan.get("short_forms", True))
        total = E.numel(shape)
        if vec > 1 and shape[-1] % vec:
            raise NotApplicable(f"vector width {vec} does not divide the innermost dimension {shape[-1]}")
        size_slots = plan.get("sizes", [])
        if size_slots and vec > 1 and size_slots[0][1] == len(shape) - 1:
            raise ValueError("an elementwise kernel with run-time sizes takes vectors along a static innermost dim")
        _, entry = E.make_gpu_func(gpu_module, name, ins, outs, [block], kernel.location,
                                  target=target.name, sizes=len(size_slots))
        args = list(entry.arguments)
        inputs, outputs = args[:len(ins)], args[len(ins):len(ins) + len(outs)]
        items: int | ir.Value = total // vec
        if size_slots:
            with kernel.location:
                items = run_time_sizes.SizeSlots(entry, args[-1], size_slots).extent(total // vec)
        with kernel.location, ir.InsertionPoint(entry):
            kb = E.IndexBuilder(entry)

            def body(item, stores=None):
                if vec == 1:
                    ev = Evaluator(kb, inputs, short_forms=short)
                    with ev.scope():
                        emit_outputs(ev, kernel, outputs, item, total)
                    return
                _emit_vector(kb, kernel, inputs, outputs, item, shape, vec, stores, short)

            # (with run-time sizes one vector a thread: the passes' guards are static)
            per = 1 if size_slots else int(plan.get("items_per_thread", 1))
            if per == 1:
                E.for_each_thread_item(kb, items, block, grid, bool(plan["grid_stride"]), body)
            else:
                _for_items(kb, total // vec, block, grid, per, body)
            E.finish(entry)
        notes = {"strategy": "elementwise", "vector_width": vec, "items_per_thread": per}
        if not size_slots:
            return EmittedKernel(name, (grid, 1, 1), (block, 1, 1), 0, notes)
        # a grid-stride kernel keeps its grid; else it covers the run-time items
        gx = str(grid) if plan["grid_stride"] else run_time_sizes.grid_text(0, total // vec // run_time_sizes.BOUND,
                                                                             block)
        return EmittedKernel(name, (grid, 1, 1), (block, 1, 1), 0, notes, sizes=tuple(map(tuple, size_slots)),
                             grid_sizes=(gx, "1", "1"))


def _for_items(kb: E.IndexBuilder, items: int, block: int, grid: int, per: int, body) -> None:
    """body(i) for i = thread + k * grid * block, k < per: consecutive threads take
    consecutive vectors in each of the per passes. The passes that stay inside the output
    store after all of them have computed (stores may alias later loads as far as LLVM
    and ptxas know, so a store between them would keep the next pass's loads behind it);
    a pass that can run past the end is guarded and stores on its own."""
    start = E.linear_thread_id(kb, block)
    stores: list = []
    for k in range(per):
        item = start if k == 0 else kb.value(kb.add(start, k * grid * block))
        if (k + 1) * grid * block <= items:
            body(item, stores)
            continue
        for store in stores:
            store()
        stores = []
        guard = scf.IfOp(kb.lt(item, items))
        with ir.InsertionPoint(guard.then_block):
            body(item)
            scf.YieldOp([])
    for store in stores:
        store()


def _emit_vector(kb: E.IndexBuilder, kernel, inputs, outputs, item: ir.Value, shape, vec: int,
                 stores: list | None = None, short_forms: bool = True) -> None:
    """Elements item*vec .. item*vec + vec - 1 of every output; with ``stores``, the
    stores are appended to it (as callables) instead of made."""
    idx0 = kb.delinearize(kb.mul(item, vec), shape)
    outer, inner0 = idx0[:-1], idx0[-1]
    inner = [inner0] + [kb.add(inner0, k) for k in range(1, vec)]
    inner = [kb.value(i) for i in inner]
    shared: dict = {}
    lanes = [_Lane(kb, inputs, k, inner, shared, item, shape, short_forms) for k in range(vec)]
    for value, mem in zip(E.kernel_results(kernel), outputs):
        mt = ir.MemRefType(mem.type)
        elems = [E.to_storage(lane.value(value, [*outer, inner[k]]), mt.element_type) for k, lane in enumerate(lanes)]
        v = vector.from_elements(ir.VectorType.get([vec], mt.element_type), elems)
        at = [kb.value(i) for i in [*outer, inner0]]
        store = (lambda v=v, mem=mem, at=at, a=_alignment(mt, vec): vector.store(v, mem, at, alignment=a))
        if stores is None:
            store()
        else:
            stores.append(store)
    # The index of lane k > 0 names its elements while the DAG is walked; an operand that
    # uses it is read through the vector, so it is usually left without uses.
    for i in inner[1:]:
        if not list(i.uses):
            i.owner.operation.erase()


register(ElementwiseStrategy())
