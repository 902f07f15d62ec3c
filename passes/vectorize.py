"""kf-vectorize: 128-bit loads and stores for per-thread row loops.

A rowwise kernel's phases are loops ``scf.for %j = %tid to %R step %T {kf.row_loop}``
whose loads and stores index the innermost, contiguous dimension with ``%j``. Each thread
moves 4 bytes (f32) or 2 (f16) per access, which leaves part of the bandwidth that
torch's 128-bit accesses reach unused. This pass rewrites such a loop into

    %v = scf.for %jv = %tid * L to R' step %T * L iter_args(vector accumulators) {
           vector.load %x[..., %jv] {alignment}  ->  arithmetic on vector<L x T>
           -> vector.store / the accumulators }               R' = R rounded down to L
    %s = vector.reduction <kind>, %v, %init                   (one per accumulator)
    scf.for %j = R' + %tid to %R step %T iter_args(%s) { the original scalar body }

so thread t moves L consecutive elements (16 bytes: ``vector<4xf32>``, ``vector<8xf16>``,
``vector<8xbf16>``) and consecutive threads consecutive 16-byte chunks; the scalar loop
takes the tail (R - R' < L elements), and is dropped when there is none.

When it applies (anything else leaves the loop as it is: the pass never guesses):

- the loop carries ``kf.row_loop`` (the strategy's promise that the loop's iterations are
  independent apart from the accumulators), its lower bound is ``gpu.thread_id x``, its
  step the constant block size of the kernel's ``known_block_size`` (x only), and its
  upper bound a constant; so vector iterations tile [0, R') with no thread skipping one;
- every use of the IV is the last index of a ``memref.load``/``memref.store`` whose other
  indices are defined outside the loop;
- every access is aligned: the memref's last dimension is a multiple of L, or all its
  other indices are the constant 0 (then row 0 starts at the buffer's start). Kernel
  buffers are assumed aligned to the vector (16 bytes at most; torch's allocations are
  256-byte aligned): the pass records that as ``kf.assumed_alignment`` on the gpu.func
  for the launcher to check, since a contiguous view at an odd storage offset is not.
  Workgroup buffers get the alignment as ``llvm.align`` (attributions) or ``alignment``
  (memref.alloc);
- the body is one block of arith/math ops (widened to vectors; loop-invariant scalars are
  broadcast), loads and stores; each loop result is an accumulator ``yield
  combine(%acc, x)`` with combine one of addf, mulf, maximumf, minimumf, used nowhere
  else in the body.

Lanes: the loop's ``kf.vector_lanes`` (the strategy's plan, which knows the target:
SPIR-V vectors have at most 4 components and kf-to-spirv has no bf16 vectors) or else
``vector-bits`` over the narrowest element; ``max-lanes`` caps it either way. Lanes that
do not give aligned accesses are halved until they do (down to 2).

The vector accumulators change the order of floating-point additions (L interleaved
partial sums per thread): as exact as the scalar order, not bit-identical to it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

from mlir import ir
from mlir.dialects import arith, scf, vector

from .base import KfPass, PassError

ROW_LOOP = "kf.row_loop"
VECTOR_LANES = "kf.vector_lanes"
ASSUMED_ALIGNMENT = "kf.assumed_alignment"  # on the gpu.func: bytes every kernel argument must be aligned to
_BITS = {"f64": 64, "f32": 32, "f16": 16, "bf16": 16, "i64": 64, "i32": 32, "i16": 16, "i8": 8, "i1": 8}
_COMBINE = {"arith.addf": "add", "arith.mulf": "mul", "arith.maximumf": "maximumf", "arith.minimumf": "minimumf"}


def _power_of_two(n: int) -> bool:
    return n > 0 and n & (n - 1) == 0


class _Refuse(Exception):
    """This loop is not vectorized (the reason is kept for kf.vectorize_skipped)."""


def _op(x) -> ir.Operation:
    return x.operation if isinstance(x, ir.OpView) else x


def _walk(op: ir.Operation):
    for region in op.regions:
        for block in region.blocks:
            for inner in block.operations:
                yield inner.operation
                yield from _walk(inner.operation)


def _const_index(v: ir.Value) -> int | None:
    owner = v.owner
    if isinstance(owner, ir.Block) or _op(owner).name != "arith.constant":
        return None
    attr = _op(owner).attributes["value"]
    return ir.IntegerAttr(attr).value if isinstance(attr, ir.IntegerAttr) else None


def _defined_outside(v: ir.Value, loop: ir.Operation) -> bool:
    """v is defined above loop, not in its body."""
    owner = v.owner
    op = owner.owner if isinstance(owner, ir.Block) else _op(owner).parent
    while op is not None:
        if _op(op) == loop:
            return False
        op = _op(op).parent
    return True


def _elementwise(name: str) -> bool:
    """Ops that apply to vectors lane by lane (ElementwiseMappable in arith and math)."""
    return name.startswith("math.") or (name.startswith("arith.") and name not in (
        "arith.constant", "arith.index_cast", "arith.index_castui"))


def _align_workgroup(fn: ir.Operation | None, mem: ir.Value, align: int) -> None:
    """Make a workgroup buffer at least align-byte aligned, so that its vector accesses are.

    Kernel arguments come 16-byte aligned, workgroup buffers do not: convert-gpu-to-nvvm
    gives an attribution its element's alignment (``.shared .align 4`` for f32) unless
    the attribution carries ``llvm.align``, and ld.shared.v4 at an address that is not a
    multiple of 16 faults. memref.alloc/alloca take an ``alignment`` attribute."""
    owner = mem.owner
    i64 = ir.IntegerType.get_signless(64)
    if not isinstance(owner, ir.Block):
        op = _op(owner)
        if op.name not in ("memref.alloc", "memref.alloca"):
            raise _Refuse(f"workgroup buffer made by {op.name}: its alignment is unknown")
        old = ir.IntegerAttr(op.attributes["alignment"]).value if "alignment" in op.attributes else 0
        if old < align:
            op.attributes["alignment"] = ir.IntegerAttr.get(i64, align)
        return
    if fn is None or owner != fn.regions[0].blocks[0]:
        raise _Refuse("workgroup buffer that is not an attribution of the kernel")
    n_inputs = len(ir.FunctionType(ir.TypeAttr(fn.attributes["function_type"]).value).inputs)
    n_wg = ir.IntegerAttr(fn.attributes["workgroup_attributions"]).value if "workgroup_attributions" in fn.attributes else 0
    k = ir.BlockArgument(mem).arg_number - n_inputs
    if not 0 <= k < n_wg:
        raise _Refuse("workgroup buffer that is not a workgroup attribution")
    attrs = list(ir.ArrayAttr(fn.attributes["workgroup_attrib_attrs"])) if "workgroup_attrib_attrs" in fn.attributes \
        else []
    attrs += [ir.DictAttr.get({})] * (n_wg - len(attrs))
    d = ir.DictAttr(attrs[k])
    entries = {d[i].name: d[i].attr for i in range(len(d))}
    old = ir.IntegerAttr(entries["llvm.align"]).value if "llvm.align" in entries else 0
    if old < align:
        entries["llvm.align"] = ir.IntegerAttr.get(i64, align)
        attrs[k] = ir.DictAttr.get(entries)
        fn.attributes["workgroup_attrib_attrs"] = ir.ArrayAttr.get(attrs)


@dataclass(frozen=True)
class VectorizePass(KfPass):
    """``kf-vectorize{vector-bits=128 max-lanes=0}``."""

    NAME: ClassVar[str] = "kf-vectorize"
    DESCRIPTION: ClassVar[str] = "128-bit vector loads/stores for row loops over the contiguous dimension"

    vector_bits: int = 128
    max_lanes: int = 0  # 0: no cap beyond the loop's kf.vector_lanes / vector-bits

    def run(self, module: ir.Operation) -> None:
        if self.vector_bits < 8 or not _power_of_two(self.vector_bits):
            raise PassError(f"vector-bits must be a power of two of at least 8, got {self.vector_bits}",
                            module.location)
        if self.max_lanes and (self.max_lanes < 0 or not _power_of_two(self.max_lanes)):
            raise PassError(f"max-lanes must be 0 (no cap) or a power of two, got {self.max_lanes}", module.location)
        for fn in _walk(module):
            if fn.name != "gpu.func" or "gpu.kernel" not in fn.attributes:
                continue
            for loop in [op for op in _walk(fn) if op.name == "scf.for" and VECTOR_LANES in op.attributes]:
                lanes = loop.attributes[VECTOR_LANES]
                if not isinstance(lanes, ir.IntegerAttr) or lanes.value < 1 or not _power_of_two(lanes.value):
                    raise PassError(f"{VECTOR_LANES} is {lanes}: the lanes of a row loop are a power of two "
                                    "(an integer attribute)", loop.location)
            block = tuple(ir.DenseI32ArrayAttr(fn.attributes["known_block_size"])) \
                if "known_block_size" in fn.attributes else None
            for loop in [op for op in _walk(fn) if op.name == "scf.for" and ROW_LOOP in op.attributes]:
                try:
                    self.vectorize(loop, block, fn)
                except _Refuse as e:
                    loop.attributes["kf.vectorize_skipped"] = ir.StringAttr.get(str(e))

    # ------------------------------------------------------------------ checks

    def _accesses(self, loop: ir.Operation):
        body = loop.regions[0].blocks[0]
        iv = body.arguments[0]
        out = []
        for op in body.operations:
            op = op.operation
            if op.regions and op.name != "scf.yield" and len(op.regions[0].blocks):
                raise _Refuse(f"{op.name} with a region in the body")
            if op.name in ("memref.load", "memref.store"):
                mem = op.operands[0] if op.name == "memref.load" else op.operands[1]
                idx = list(op.operands)[1:] if op.name == "memref.load" else list(op.operands)[2:]
                if idx and idx[-1] == iv:
                    if any(i == iv or not _defined_outside(i, loop) for i in idx[:-1]):
                        raise _Refuse(f"{op.name} with leading indices computed in the loop")
                    out.append((op, mem, idx))
                elif any(i == iv for i in idx):
                    raise _Refuse(f"{op.name} indexes a non-innermost dimension with the loop index")
        for use in iv.uses:
            user = _op(use.owner)
            if user.name not in ("memref.load", "memref.store") or use.operand_number != len(list(user.operands)) - 1:
                raise _Refuse(f"the loop index is used by {user.name}, not as an innermost index")
        return out

    def _lanes(self, loop: ir.Operation, accesses) -> int:
        bits = min((_BITS.get(str(ir.MemRefType(m.type).element_type), 32) for _, m, _ in accesses), default=32)
        lanes = ir.IntegerAttr(loop.attributes[VECTOR_LANES]).value if VECTOR_LANES in loop.attributes \
            else self.vector_bits // bits
        if self.max_lanes:
            lanes = min(lanes, self.max_lanes)
        if lanes < 2:
            raise _Refuse(f"{lanes} lane: the plan keeps this loop scalar")
        while lanes >= 2:
            if all(self._aligned(m, idx, lanes) for _, m, idx in accesses):
                return lanes
            lanes //= 2
        raise _Refuse("no vector width gives aligned accesses (last dimension not a multiple of the lanes)")

    @staticmethod
    def _aligned(mem: ir.Value, idx, lanes: int) -> bool:
        t = ir.MemRefType(mem.type)
        return t.shape[-1] % lanes == 0 or all(_const_index(i) == 0 for i in idx[:-1])

    # ------------------------------------------------------------------ rewrite

    def vectorize(self, loop: ir.Operation, block, fn: ir.Operation | None = None) -> None:
        lb, ub, step = loop.operands[0], loop.operands[1], loop.operands[2]
        lb_op = lb.owner
        if isinstance(lb_op, ir.Block) or _op(lb_op).name != "gpu.thread_id" or \
                str(_op(lb_op).attributes["dimension"]) != "#gpu<dim x>":
            raise _Refuse("lower bound is not gpu.thread_id x")
        if block is None or tuple(block[1:]) not in ((1, 1), (1,), ()) or _const_index(step) != block[0]:
            raise _Refuse("step is not the kernel's constant block size (known_block_size x, 1-D blocks)")
        R = _const_index(ub)
        if R is None:
            raise _Refuse("upper bound is not a constant")
        accesses = self._accesses(loop)
        if not accesses:
            raise _Refuse("no memory access indexed by the loop")
        lanes = self._lanes(loop, accesses)
        main = (R // lanes) * lanes
        if main == 0:
            raise _Refuse(f"row of {R} is shorter than {lanes} lanes")
        body = loop.regions[0].blocks[0]
        yield_op = _op(list(body.operations)[-1])
        kinds = self._accumulators(body, yield_op)
        self._check_body(body)
        assumed = 0
        for _, mem, _ in accesses:
            t = ir.MemRefType(mem.type)
            if t.memory_space is not None and "workgroup" in str(t.memory_space):
                _align_workgroup(fn, mem, self._alignment(t.element_type, lanes))
            else:
                assumed = max(assumed, self._alignment(t.element_type, lanes))
        if assumed and fn is not None:
            # What the launcher must guarantee of every buffer it passes (a contiguous
            # view at an odd storage offset would fault on ld.global.v4).
            old = ir.IntegerAttr(fn.attributes[ASSUMED_ALIGNMENT]).value if ASSUMED_ALIGNMENT in fn.attributes else 0
            fn.attributes[ASSUMED_ALIGNMENT] = ir.IntegerAttr.get(ir.IntegerType.get_signless(64), max(old, assumed))
        T = block[0]
        index = ir.IndexType.get()
        with loop.location:
            ip = ir.InsertionPoint(loop)
            c = lambda v: arith.ConstantOp(index, ir.IntegerAttr.get(index, v), ip=ip).result  # noqa: E731
            vlb = arith.MulIOp(lb, c(lanes), ip=ip).result
            inits = []
            for k, init in enumerate(list(loop.operands)[3:]):
                vt = ir.VectorType.get([lanes], init.type)
                if kinds[k] in ("add", "mul"):
                    neutral = 0.0 if kinds[k] == "add" else 1.0
                    attr = ir.DenseElementsAttr.get_splat(vt, ir.FloatAttr.get(init.type, neutral))
                    inits.append(arith.ConstantOp(vt, attr, ip=ip).result)
                else:  # max/min are idempotent: start every lane at the initial value
                    inits.append(vector.BroadcastOp(vt, init, ip=ip).result)
            new = scf.ForOp(vlb, c(main), c(T * lanes), inits, ip=ip)
            new.operation.attributes["kf.vectorized"] = ir.IntegerAttr.get(ir.IntegerType.get_signless(64), lanes)
            self._widen(body, new, lanes)
            results = []
            for k, init in enumerate(list(loop.operands)[3:]):
                kind = getattr(vector.CombiningKind, {"add": "ADD", "mul": "MUL", "maximumf": "MAXIMUMF",
                                                      "minimumf": "MINIMUMF"}[kinds[k]])
                results.append(vector.ReductionOp(init.type, kind, new.results[k], acc=init, ip=ip).result)
            if main == R:
                for old, r in zip(loop.results, results):
                    old.replace_all_uses_with(r)
                loop.erase()
                return
            # The tail: the original scalar loop over [main, R), starting from the vector results.
            loop.operands[0] = arith.AddIOp(c(main), lb, ip=ip).result
            for k, r in enumerate(results):
                loop.operands[3 + k] = r
            del loop.attributes[ROW_LOOP]
            loop.attributes["kf.vector_tail"] = ir.UnitAttr.get()

    @staticmethod
    def _accumulators(body: ir.Block, yield_op: ir.Operation) -> list[str]:
        kinds = []
        for k, y in enumerate(yield_op.operands):
            acc = body.arguments[1 + k]
            owner = y.owner
            if isinstance(owner, ir.Block) or _op(owner).name not in _COMBINE:
                raise _Refuse(f"loop result {k} is not an add/mul/max/min accumulator")
            comb = _op(owner)
            uses = list(acc.uses)
            if acc not in list(comb.operands) or len(uses) != 1 or len(list(y.uses)) != 1:
                raise _Refuse(f"accumulator {k} is used other than by its combine")
            if not isinstance(acc.type, (ir.F32Type, ir.F64Type, ir.F16Type, ir.BF16Type)):
                raise _Refuse(f"accumulator {k} of {acc.type} is not a float")
            kinds.append(_COMBINE[comb.name])
        return kinds

    @staticmethod
    def _check_body(body: ir.Block) -> None:
        """What _widen will meet: every op fed by a loop-varying value must be elementwise."""
        iv = body.arguments[0]
        varying = set(list(body.arguments)[1:])
        for op in body.operations:
            op = op.operation
            if op.name == "memref.load" and list(op.operands)[-1] == iv:
                varying.add(op.results[0])
            elif op.name in ("scf.yield", "memref.store"):
                continue
            elif any(v in varying for v in op.operands):
                if not _elementwise(op.name):
                    raise _Refuse(f"{op.name} on a loop-varying value is not elementwise")
                varying.update(op.results)

    def _widen(self, body: ir.Block, new, lanes: int) -> None:
        """Copy body into new's body: IV-dependent values become vectors of lanes."""
        nb = new.body
        iv = body.arguments[0]
        vmap: dict = {iv: nb.arguments[0]}
        varying = set()
        for k, a in enumerate(list(body.arguments)[1:]):
            vmap[a] = nb.arguments[1 + k]
            varying.add(a)

        def get(v):
            return vmap.get(v, v)

        def as_vector(v, ip):
            m = get(v)
            if v in varying:
                return m
            return vector.BroadcastOp(ir.VectorType.get([lanes], m.type), m, ip=ip).result

        for op in body.operations:
            op = op.operation
            ip = ir.InsertionPoint(nb)
            with op.location:
                if op.name == "scf.yield":
                    scf.YieldOp([get(v) for v in op.operands], ip=ip)
                    continue
                if op.name == "memref.load" and list(op.operands)[-1] == iv:
                    mem = get(op.operands[0])
                    vt = ir.VectorType.get([lanes], op.results[0].type)
                    idx = [get(i) for i in list(op.operands)[1:]]
                    ld = vector.LoadOp(vt, mem, idx, alignment=self._alignment(op.results[0].type, lanes), ip=ip)
                    vmap[op.results[0]] = ld.result
                    varying.add(op.results[0])
                    continue
                if op.name == "memref.store" and list(op.operands)[-1] == iv:
                    val = as_vector(op.operands[0], ip)
                    idx = [get(i) for i in list(op.operands)[2:]]
                    vector.StoreOp(val, get(op.operands[1]), idx,
                                   alignment=self._alignment(op.operands[0].type, lanes), ip=ip)
                    continue
                if any(v in varying for v in op.operands):
                    operands = [as_vector(v, ip) for v in op.operands]
                    res = [ir.VectorType.get([lanes], r.type) for r in op.results]
                    attrs = {n: op.attributes[n] for n in op.attributes}
                    w = ir.Operation.create(op.name, results=res, operands=operands, attributes=attrs, ip=ip)
                    for r, nr in zip(op.results, w.results):
                        vmap[r] = nr
                        varying.add(r)
                    continue
                clone = op.clone(ip=ip)
                for k, v in enumerate(op.operands):
                    clone.operands[k] = get(v)
                for r, nr in zip(op.results, clone.results):
                    vmap[r] = nr

    def _alignment(self, elem: ir.Type, lanes: int) -> int:
        nbytes = lanes * _BITS.get(str(elem), 32) // 8
        return min(nbytes, self.vector_bits // 8)
