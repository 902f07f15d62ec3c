"""kf-to-cpu: from linalg-on-tensors to the LLVM dialect, in kf's calling convention.

Every public ``func.func`` comes out as ``(inputs..., outputs...) -> ()`` on identity-
layout (dense row-major) memrefs, with ``llvm.emit_c_interface`` so that LLVM emits a
``_mlir_ciface_<name>`` entry that takes one pointer to a memref descriptor per argument
(see runtime/cpu.py, which calls it, and runtime/abi.py for the convention).

Destination passing is done on tensors, before bufferization: each input becomes a
memref argument read through ``bufferization.to_tensor restrict``, and each returned
tensor is written into a new output memref argument with
``bufferization.materialize_in_destination``. One-shot bufferization then writes the
producers of the results directly into the caller's buffers where it can
(``eliminate-empty-tensors``) and copies where it cannot (a result that is an input,
or one tensor returned twice); inputs, not being writable, are never clobbered.
The rest is the upstream pipeline: deallocation, linalg to loops (sequential), scf to
cf, math through LLVM intrinsics and libm (erf, tanh, ...), bf16 arithmetic and
integer-to-bf16 conversions done in f32 (``arith-emulate-unsupported-floats``), and bf16
conversions expanded in integer arithmetic (``arith-expand{include-bf16}``) because the
LLVM backend would otherwise call compiler-rt helpers (``__truncsfbf2``) that the JIT
making the object code cannot resolve: it aborts the process.

Three rewrites are kf's own, each because upstream LLVM 22 lacks it: fp8 conversions
in integer arithmetic (no fp8 in LLVM, no upstream expansion), strided memref copies as
loops (upstream calls a runtime-library function), and booleans stored as bytes
(upstream asserts on i1 stores; torch keeps a bool per byte anyway). bf16 values are
selected, loaded and stored as their 16 bits (``bf16_selects_as_integers``,
``bf16_memory_as_integers``): the x86 backend would carry them in f32 registers and
round them back with ``__truncsfbf2``; any other bf16 value left for LLVM is an error
(``no_bf16_values``), not an abort.

A fourth is about numerics: linalg-to-loops sums a reduction sequentially, and an f32
sum of n elements can lose n/2 ulps (``ones(2**25).sum()`` stops at 2^24), so after
fusion every float sum over more than ``REDUCTION_BLOCK`` elements is rewritten into
stages of at most that many (``blocked_reductions``; upstream's split-reduction
transform needs the block to divide the dim and rewrites one stage).
"""

from __future__ import annotations

import dataclasses
import math

from mlir import ir
from mlir.dialects import arith, bufferization, func, linalg, llvm, tensor
from mlir.passmanager import PassManager

from kf.dialects.elements import FP8 as _FP8

from . import scalar_math as sm
from .base import KfPass, PassError

BUFFERIZE = (
    "eliminate-empty-tensors, "
    "one-shot-bufferize{bufferize-function-boundaries=1 function-boundary-type-conversion=identity-layout-map}, "
    "buffer-deallocation-pipeline, convert-bufferization-to-memref, linalg-generalize-named-ops"
)
TO_LOOPS = (
    "convert-linalg-to-loops, fold-memref-alias-ops, expand-strided-metadata, "
    "lower-affine, convert-scf-to-cf, convert-math-to-funcs, "
    # bf16 arithmetic and integer conversions as f32 ones rounded to bf16 (LLVM's own
    # promotion calls compiler-rt's __truncsfbf2, which the JIT cannot resolve)
    "func.func(arith-emulate-unsupported-floats{source-types=bf16 target-type=f32}), arith-expand{include-bf16=true}, "
    # LLVM intrinsics first (rsqrt has no libm function), libm for the rest (erf, tanh).
    "convert-math-to-llvm, convert-math-to-libm"
)
TO_LLVM = (
    "finalize-memref-to-llvm, convert-func-to-llvm, convert-arith-to-llvm, "
    "convert-cf-to-llvm, convert-index-to-llvm, canonicalize, reconcile-unrealized-casts"
)


def _byte_memref(t: ir.Type) -> ir.Type | None:
    """The i8 twin of a memref of i1 (same shape, layout and memory space), else None."""
    if not isinstance(t, ir.MemRefType) or str(t.element_type) != "i1":
        return None
    return ir.MemRefType.get(list(t.shape), ir.IntegerType.get_signless(8), t.layout, t.memory_space)


def bools_as_bytes(module: ir.Operation) -> None:
    """Store booleans as bytes: every memref of i1 becomes a memref of i8, loads are
    truncated to i1 and stores extended from it.

    torch keeps one bool per byte, and LLVM 22's memref-to-LLVM lowering rejects i1
    stores (it asserts that stored integers are at least 8 bits wide), so this is both
    the ABI of bool tensors and what makes them compile.
    """
    i1, i8 = ir.IntegerType.get_signless(1), ir.IntegerType.get_signless(8)
    ops: list[ir.Operation] = []
    module.walk(lambda op: ops.append(op.operation) or ir.WalkResult.ADVANCE)
    for op in ops:
        for region in op.regions:
            for block in region.blocks:
                for arg in block.arguments:
                    if (t := _byte_memref(arg.type)) is not None:
                        arg.set_type(t)
        if op.name == "memref.global" and _byte_memref(ir.TypeAttr(op.attributes["type"]).value) is not None:
            raise PassError("kf-to-cpu cannot yet place a bool constant in memory", op.location)
        if op.name == "func.func":
            ft = ir.FunctionType(ir.TypeAttr(op.attributes["function_type"]).value)
            fix = lambda ts: [_byte_memref(t) or t for t in ts]
            op.attributes["function_type"] = ir.TypeAttr.get(ir.FunctionType.get(fix(ft.inputs), fix(ft.results)))
        for result in op.results:
            if (t := _byte_memref(result.type)) is not None:
                result.set_type(t)
    for op in ops:
        if op.name == "memref.load" and str(op.operands[0].type.element_type) == "i8" \
                and str(op.result.type) == "i1":
            op.result.set_type(i8)
            with ir.InsertionPoint.after(op), op.location:
                narrow = arith.trunci(i1, op.result)
            op.result.replace_all_uses_except(narrow, narrow.owner.operation)
        elif op.name == "memref.store" and str(op.operands[0].type) == "i1":
            with ir.InsertionPoint(op), op.location:
                op.operands[0] = arith.extui(i8, op.operands[0])


def bf16_selects_as_integers(module: ir.Operation) -> None:
    """Select bf16 values as their 16 bits: every ``arith.select`` of bf16 becomes one of
    i16 between bitcasts, which fold into the loads and stores around it.

    The x86 backend keeps a bf16 value in registers as an f32 (it promotes the type), so
    a select of two bf16 loads (``torch.where`` of bf16 tensors, once LLVM vectorizes it)
    comes back to memory through f32-to-bf16 truncations, calls to compiler-rt's
    ``__truncsfbf2`` that the JIT making kf's object code cannot resolve: it aborts the
    process. bf16 arithmetic is done in f32 before this (``arith-emulate-unsupported-
    floats``); ``no_bf16_values`` checks that nothing else is left."""
    i16 = ir.IntegerType.get_signless(16)
    ops: list[ir.Operation] = []
    module.walk(lambda op: ops.append(op.operation) or ir.WalkResult.ADVANCE)
    for op in ops:
        if op.name != "arith.select" or str(op.result.type) != "bf16":
            continue
        with ir.InsertionPoint(op), op.location:
            cond, a, b = op.operands
            out = arith.bitcast(op.result.type, arith.select(cond, arith.bitcast(i16, a), arith.bitcast(i16, b)))
        op.result.replace_all_uses_with(out)
        op.erase()


def bf16_memory_as_integers(module: ir.Operation) -> None:
    """In the LLVM dialect, load and store bf16 values as i16 (with bitcasts, which then
    fold away against those of the integer rounding): the x86 backend promotes a bf16
    load or store it meets in a vectorized loop to f32 as well, and rounds it back with
    ``__truncsfbf2`` (``torch.randn(n, dtype=torch.bfloat16)`` aborted so)."""
    i16, bf16 = ir.IntegerType.get_signless(16), ir.BF16Type.get()
    ops: list[ir.Operation] = []
    module.walk(lambda op: ops.append(op.operation) or ir.WalkResult.ADVANCE)
    for op in ops:
        if op.name == "llvm.load" and str(op.result.type) == "bf16":
            op.result.set_type(i16)
            with ir.InsertionPoint.after(op), op.location:
                value = llvm.bitcast(bf16, op.result)
            op.result.replace_all_uses_except(value, value.owner.operation)
        elif op.name == "llvm.store" and str(op.operands[0].type) == "bf16":
            with ir.InsertionPoint(op), op.location:
                op.operands[0] = llvm.bitcast(i16, op.operands[0])


#: LLVM-dialect ops that may make a bf16 value without the x86 backend rounding an f32
#: to it: a bitcast of its bits, a constant
_BF16_MAKERS = {"llvm.bitcast", "llvm.mlir.constant", "llvm.mlir.poison", "llvm.mlir.undef"}


def no_bf16_values(module: ir.Operation) -> None:
    """Raise PassError where an LLVM-dialect op other than a bitcast or constant makes a
    bf16 value (or a block takes one): the x86 backend would hold it as an f32 and round
    it to bf16 with compiler-rt's ``__truncsfbf2``, which the JIT cannot resolve -- an
    abort of the whole process, where this is an error that names the op. Taking a bf16
    value (``fpext`` to f64, a bitcast) is an exact widening and needs no call."""
    bad: list[ir.Operation] = []

    def visit(op):
        op = op.operation
        made = [*op.results] + [a for r in op.regions for b in r.blocks for a in b.arguments]
        if any("bf16" in str(v.type) for v in made) and op.name not in _BF16_MAKERS:
            bad.append(op)
        return ir.WalkResult.ADVANCE

    module.walk(visit)
    if bad:
        op = bad[0]
        raise PassError(f"kf-to-cpu left bf16 arithmetic for LLVM ({op.name}), which would call compiler-rt's "
                        f"__truncsfbf2: the CPU target cannot compile it", op.location)


def _is_dense(t: ir.Type) -> bool:
    """A memref with the identity layout (dense row-major, no offset)."""
    layout = ir.MemRefType(t).layout
    return isinstance(layout, ir.AffineMapAttr) and ir.AffineMapAttr(layout).value.is_permutation and \
        ir.AffineMapAttr(layout).value == ir.AffineMap.get_identity(ir.MemRefType(t).rank)


def strided_copies_as_loops(module: ir.Operation) -> None:
    """Rewrite each memref.copy between strided (non-dense) memrefs into linalg.copy.

    Upstream lowers a strided memref.copy to a call to ``memrefCopy`` from MLIR's C
    runner utilities, which a standalone shared object does not have; linalg.copy
    becomes plain loops. Dense copies stay memref.copy (they become memcpy).
    """
    ops: list[ir.Operation] = []
    module.walk(lambda op: ops.append(op.operation) or ir.WalkResult.ADVANCE)
    for op in ops:
        if op.name != "memref.copy":
            continue
        src, dst = op.operands
        if _is_dense(src.type) and _is_dense(dst.type):
            continue
        with ir.InsertionPoint(op), op.location:
            linalg.copy(src, outs=[dst])
        op.erase()


def _int(t: ir.Type, value: int) -> ir.Value:
    return arith.constant(t, ir.IntegerAttr.get(t, value))


def _fp8_to_f32(v: ir.Value) -> ir.Value:
    """Decode an f8E4M3FN or f8E5M2 scalar exactly into f32, as torch does."""
    i8, i16, i32 = (ir.IntegerType.get_signless(w) for w in (8, 16, 32))
    f32 = ir.F32Type.get()
    bits = arith.bitcast(i8, v)
    if str(v.type) == "f8E5M2":  # e5m2 is the top byte of an IEEE half
        half = arith.bitcast(ir.F16Type.get(), arith.shli(arith.extui(i16, bits), _int(i16, 8)))
        return arith.extf(f32, half)
    b = arith.extui(i32, bits)
    sign = arith.shli(arith.andi(b, _int(i32, 0x80)), _int(i32, 24))
    exp = arith.andi(arith.shrui(b, _int(i32, 3)), _int(i32, 0xF))
    man = arith.andi(b, _int(i32, 7))
    normal = arith.ori(arith.shli(arith.addi(exp, _int(i32, 120)), _int(i32, 23)), arith.shli(man, _int(i32, 20)))
    subnormal = arith.bitcast(i32, arith.mulf(arith.uitofp(f32, man), arith.constant(f32, 2.0 ** -9)))
    mag = arith.select(arith.cmpi(arith.CmpIPredicate.eq, exp, _int(i32, 0)), subnormal, normal)
    nan = arith.cmpi(arith.CmpIPredicate.eq, arith.andi(b, _int(i32, 0x7F)), _int(i32, 0x7F))
    mag = arith.select(nan, _int(i32, 0x7FC00000), mag)
    return arith.bitcast(f32, arith.ori(mag, sign))


def _f32_to_fp8(x: ir.Value, to: ir.Type) -> ir.Value:
    """Round an f32 scalar to f8E4M3FN / f8E5M2 to nearest even, bit for bit as torch's
    ``Tensor.to`` does: c10's fp8e*_from_fp32_value rounding, with e4m3fn (which has no
    infinity) saturating overflow and ±inf to ±448 and e5m2 overflowing to infinity."""
    i8, i32, f32 = ir.IntegerType.get_signless(8), ir.IntegerType.get_signless(32), ir.F32Type.get()
    e4m3 = str(to) == "f8E4M3FN"
    # (largest value that rounds in range, smallest normal, denormal magic, mantissa shift, bias)
    fmax, min_normal, denorm, shift, bias = ((1087 << 20, 121 << 23, 141 << 23, 20, 7) if e4m3
                                             else (143 << 23, 113 << 23, 134 << 23, 21, 15))
    f = arith.bitcast(i32, x)
    sign = arith.andi(f, _int(i32, 0x80000000))
    f = arith.xori(f, sign)
    # Small magnitudes: adding 2^k aligns the value's bits so that the FPU does the
    # round-to-nearest-even into the denormal grid.
    denorm_sum = arith.bitcast(i32, arith.addf(arith.bitcast(f32, f), arith.bitcast(f32, _int(i32, denorm))))
    small = arith.subi(denorm_sum, _int(i32, denorm))
    odd = arith.andi(arith.shrui(f, _int(i32, shift)), _int(i32, 1))
    biased = arith.addi(arith.addi(f, _int(i32, (((bias - 127) << 23) + (1 << (shift - 1)) - 1) & 0xFFFFFFFF)), odd)
    normal = arith.shrui(biased, _int(i32, shift))
    result = arith.select(arith.cmpi(arith.CmpIPredicate.ult, f, _int(i32, min_normal)), small, normal)
    nan = arith.cmpi(arith.CmpIPredicate.ugt, f, _int(i32, 255 << 23))
    overflow = arith.cmpi(arith.CmpIPredicate.uge, f, _int(i32, fmax))
    if e4m3:
        # Saturate: 0x7F is e4m3fn's NaN, 0x7E (448) its largest finite value.
        result = arith.minui(arith.select(overflow, _int(i32, 0x7E), result), _int(i32, 0x7E))
        result = arith.select(nan, _int(i32, 0x7F), result)
    else:
        result = arith.select(overflow, arith.select(nan, _int(i32, 0x7F), _int(i32, 0x7C)), result)
    result = arith.ori(result, arith.shrui(sign, _int(i32, 24)))
    return arith.bitcast(to, arith.trunci(i8, result))


def narrow_f64_conversions(module: ir.Operation) -> None:
    """Rewrite every scalar ``arith.truncf`` from f64 to f16 or bf16 as a truncation to
    f32, then to the 16-bit type. LLVM would otherwise call compiler-rt's
    ``__truncdfbf2`` / ``__truncdfhf2``, which the JIT that makes kf's object code
    cannot resolve (it aborts the process); torch converts a double to a half or a
    bfloat16 through float as well, so the values are torch's."""
    ops: list[ir.Operation] = []
    module.walk(lambda op: ops.append(op.operation) or ir.WalkResult.ADVANCE)
    for op in ops:
        if op.name != "arith.truncf" or str(op.operands[0].type) != "f64" or \
                str(op.result.type) not in ("f16", "bf16"):
            continue
        with ir.InsertionPoint(op), op.location:
            out = arith.truncf(op.result.type, arith.truncf(ir.F32Type.get(), op.operands[0]))
        op.result.replace_all_uses_with(out)
        op.erase()


def expand_fp8_conversions(module: ir.Operation) -> None:
    """Rewrite every extf from and truncf to an fp8 type into integer arithmetic.

    LLVM has no fp8 types (memory, constants and selects of fp8 become i8 in the LLVM
    conversion, which is all kf needs beside conversions: its fp8 math runs in f32)
    and LLVM 22's arith-expand expands only bf16, f8E8M0 and f4E2M1 conversions.
    """
    f32 = ir.F32Type.get()
    ops: list[ir.Operation] = []
    module.walk(lambda op: ops.append(op.operation) or ir.WalkResult.ADVANCE)
    for op in ops:
        if op.name not in ("arith.extf", "arith.truncf"):
            continue
        src, dst = op.operands[0].type, op.result.type
        if str(src) not in _FP8 and str(dst) not in _FP8:
            continue
        with ir.InsertionPoint(op), op.location:
            v = op.operands[0]
            wide = _fp8_to_f32(v) if str(src) in _FP8 else (
                arith.truncf(f32, v) if str(src) == "f64" else v if str(src) == "f32" else arith.extf(f32, v))
            if str(dst) in _FP8:
                out = _f32_to_fp8(wide, dst)
            else:
                out = wide if str(dst) == "f32" else arith.extf(dst, wide) if str(dst) == "f64" else \
                    arith.truncf(dst, wide)
        op.result.replace_all_uses_with(out)
        op.erase()


def _iterators(op: ir.Operation) -> list[str]:
    return [str(a).removeprefix("#linalg.iterator_type<").removesuffix(">")
            for a in ir.ArrayAttr(op.attributes["iterator_types"])]


def _maps(op: ir.Operation) -> list[ir.AffineMap]:
    return [ir.AffineMapAttr(a).value for a in ir.ArrayAttr(op.attributes["indexing_maps"])]


def _permuted(m: ir.AffineMap, new_pos: list[int]) -> ir.AffineMap:
    exprs = [ir.AffineDimExpr.get(new_pos[e.position]) if isinstance(e, ir.AffineDimExpr) else e for e in m.results]
    return ir.AffineMap.get(m.n_dims, m.n_symbols, exprs)


def contiguous_inner_loops(module: ir.Operation) -> None:
    """Make the innermost loop of a contraction run along the output's last dim.

    A matmul's natural loop order (m, n, k) puts the reduction innermost, striding
    through the rhs column by column; (m, k, n) walks the rhs and the output row-major,
    which LLVM vectorizes. A generic qualifies when its innermost loop is a reduction
    and the loop indexing the output's last dim also indexes some input's last dim, so
    moving it innermost keeps both accesses unit-stride. The loop domain is permuted
    in place: indexing maps, iterator types and the ``linalg.index`` ops of the body.
    """
    ops: list[ir.Operation] = []
    module.walk(lambda op: ops.append(op.operation) or ir.WalkResult.ADVANCE)
    for op in ops:
        if op.name != "linalg.generic":
            continue
        its, maps = _iterators(op), _maps(op)
        n_out = list(ir.DenseI32ArrayAttr(op.attributes["operandSegmentSizes"]))[1]
        out_map = maps[-1]
        if not its or its[-1] != "reduction" or n_out != 1 or not out_map.results:
            continue
        last = out_map.results[len(out_map.results) - 1]
        if not isinstance(last, ir.AffineDimExpr) or its[last.position] != "parallel":
            continue
        p = last.position
        if not any(m.results and isinstance(m.results[len(m.results) - 1], ir.AffineDimExpr)
                   and m.results[len(m.results) - 1].position == p for m in maps[:-1]):
            continue
        order = [d for d in range(len(its)) if d != p] + [p]
        new_pos = [order.index(d) for d in range(len(its))]
        op.attributes["indexing_maps"] = ir.ArrayAttr.get([ir.AffineMapAttr.get(_permuted(m, new_pos)) for m in maps])
        op.attributes["iterator_types"] = ir.ArrayAttr.get(
            [ir.Attribute.parse(f"#linalg.iterator_type<{its[d]}>") for d in order])
        for inner in op.regions[0].blocks[0].operations:
            if inner.operation.name == "linalg.index":
                d = ir.IntegerAttr(inner.attributes["dim"]).value
                inner.attributes["dim"] = ir.IntegerAttr.get(ir.IntegerType.get_signless(64), new_pos[d])


#: The longest sequential chain of one reduction on the CPU: a linalg reduction over more
#: elements is split into stages (``blocked_reductions``).
REDUCTION_BLOCK = 4096

#: Combiners whose error grows with the chain's length, and their identity (-0.0 + x is x,
#: -0.0 included). Not mulf: a product rounds once per factor in any order.
_COMBINERS = {"arith.addf": -0.0}


def _dim_of(e: ir.AffineExpr) -> int | None:
    return e.position if isinstance(e, ir.AffineDimExpr) else None


def _loop_extents(op: ir.Operation, maps: list[ir.AffineMap]) -> list[int] | None:
    """The static extent of each loop dim of a linalg.generic (from its operands'
    shapes), or None where one is unknown."""
    extents: list[int | None] = [None] * maps[0].n_dims
    for v, m in zip(op.operands, maps):
        shape = list(ir.RankedTensorType(v.type).shape) if isinstance(v.type, ir.RankedTensorType) else []
        for pos, e in enumerate(m.results):
            d = _dim_of(e)
            if d is not None and pos < len(shape):
                extents[d] = shape[pos]
    return None if any(x is None or x < 0 for x in extents) else extents


def _combiner(op: ir.Operation) -> ir.Operation | None:
    """The yield's ``acc + f(inputs)`` of a one-result float reduction generic whose
    accumulator is used only there, else None."""
    block = op.regions[0].blocks[0]
    acc = block.arguments[len(block.arguments) - 1]
    ops = [o.operation for o in block.operations]
    if any(o.name == "linalg.index" for o in ops):
        return None
    y = ops[-1]
    if len(y.operands) != 1 or isinstance(y.operands[0].owner, ir.Block):
        return None
    comb = y.operands[0].owner.operation
    if comb.name not in _COMBINERS or acc not in list(comb.operands):
        return None
    uses = [u.owner for u in acc.uses]
    return comb if len(uses) == 1 else None


def _maps_attr(maps: list[ir.AffineMap]) -> ir.ArrayAttr:
    return ir.ArrayAttr.get([ir.AffineMapAttr.get(m) for m in maps])


def _iterators_attr(its: list[str]) -> ir.ArrayAttr:
    return ir.ArrayAttr.get([ir.Attribute.parse(f"#linalg.iterator_type<{it}>") for it in its])


def _split_operand(v: ir.Value, pos: int, start: int, size: int, blocks: tuple[int, int] | None) -> ir.Value:
    """v sliced to [start, start + size) along dim pos, then that dim split into blocks
    (o, c) when given (a view: no data moves once bufferized)."""
    from .linalg.build import extract_slice, reassociation, tensor_type

    shape = list(ir.RankedTensorType(v.type).shape)
    elem = ir.RankedTensorType(v.type).element_type
    if (start, size) != (0, shape[pos]):
        sizes = shape[:pos] + [size] + shape[pos + 1:]
        v = extract_slice(v, [0] * pos + [start] + [0] * (len(shape) - pos - 1), sizes)
        shape = sizes
    if blocks is None:
        return v
    out = shape[:pos] + list(blocks) + shape[pos + 1:]
    groups = [[d] for d in range(pos)] + [[pos, pos + 1]] + [[d + 1] for d in range(pos + 1, len(shape))]
    return tensor.expand_shape(tensor_type(out, elem), v, reassociation(groups), [], out)


def _reduce_last(partial: ir.Value, pos: int, init: ir.Value, combiner: str) -> ir.Value:
    """init + the partial results reduced over their dim pos."""
    from .linalg.build import generic, identity_map, projection_map

    rank = len(ir.RankedTensorType(partial.type).shape)
    kept = [d for d in range(rank) if d != pos]
    its = ["reduction" if d == pos else "parallel" for d in range(rank)]
    return generic([partial], [init], [identity_map(rank), projection_map(rank, kept)], its,
                   lambda a: [ir.Operation.create(combiner, [a[0].type], [a[0], a[1]]).result])[0]


def _block_one(op: ir.Operation, bound: int) -> list[ir.Operation] | None:
    """Split one sum generic that reduces more than bound elements: the reduced loop dim
    r of largest extent E becomes blocks (o = E // c parallel, c reduced; c times the
    other reduced extents within bound) summed into partial results (the result with a
    dim o added, among its dims in loop order), which a second generic sums into the
    original accumulator; a tail of E % c elements is summed first, into that
    accumulator. Where the other reduced dims alone exceed the bound, r is made parallel
    instead. The operands' blocks are slices and reshapes (views). Returns the new
    generics (to be split again where still over the bound), or None where op is not a
    sum this applies to."""
    from .linalg.build import filled

    if op.name != "linalg.generic" or len(op.results) != 1:
        return None
    n_out = list(ir.DenseI32ArrayAttr(op.attributes["operandSegmentSizes"]))[1]
    its, maps = _iterators(op), _maps(op)
    if n_out != 1 or "reduction" not in its or not sm.is_float(ir.RankedTensorType(op.results[0].type).element_type):
        return None
    comb = _combiner(op)
    extents = _loop_extents(op, maps)
    if comb is None or extents is None:
        return None
    red = [d for d, it in enumerate(its) if it == "reduction"]
    n = math.prod(extents[d] for d in red)
    if n <= bound:
        return None
    r = max(red, key=lambda d: (extents[d], d))
    e = extents[r]
    others = n // e
    if any(sum(1 for x in m.results if _dim_of(x) == r) > 1 for m in maps):
        return None
    if others > bound // 2:
        c, o, tail = 1, e, 0  # r parallel, its elements each a partial result
    else:
        block = min(bound // others, e - 1)
        c = next((k for k in range(block, block // 2, -1) if e % k == 0), block)  # a divisor leaves no tail
        o, tail = e // c, e % c
    init = op.operands[len(op.operands) - 1]
    out_t = ir.RankedTensorType(op.results[0].type)
    identity = _COMBINERS[comb.name]
    split = c > 1
    # The new loop domain: r becomes (o, c) when split, stays (as o) when not.
    shift = 1 if split else 0

    def renumber(m: ir.AffineMap, at_r: list[ir.AffineExpr]) -> list[ir.AffineExpr]:
        out = []
        for x in m.results:
            d = _dim_of(x)
            if d is None:
                out.append(x)
            elif d == r:
                out.extend(at_r)
            else:
                out.append(ir.AffineDimExpr.get(d + shift if d > r else d))
        return out

    n_dims = len(its) + shift
    d_o, d_c = ir.AffineDimExpr.get(r), ir.AffineDimExpr.get(r + 1)
    new_maps = [ir.AffineMap.get(n_dims, 0, renumber(m, [d_o, d_c] if split else [d_o])) for m in maps[:-1]]
    out_res = renumber(maps[-1], [])
    pos = sum(1 for x in out_res if _dim_of(x) is not None and _dim_of(x) < r)
    out_res.insert(pos, d_o)
    new_maps.append(ir.AffineMap.get(n_dims, 0, out_res))
    new_its = its[:r] + (["parallel", "reduction"] if split else ["parallel"]) + its[r + 1:]
    made = []
    with ir.InsertionPoint(op), op.location:
        ins = []
        for v, m in zip(list(op.operands)[:-1], maps[:-1]):
            at = [i for i, x in enumerate(m.results) if _dim_of(x) == r]
            ins.append(_split_operand(v, at[0], 0, o * c, (o, c) if split else None) if at else v)
        shape = list(out_t.shape)
        partial_shape = shape[:pos] + [o] + shape[pos:]
        partial = filled(partial_shape, out_t.element_type, identity)
        first = op.clone()
        for i, v in enumerate(ins):
            first.operands[i] = v
        first.operands[len(ins)] = partial
        first.attributes["indexing_maps"] = _maps_attr(new_maps)
        first.attributes["iterator_types"] = _iterators_attr(new_its)
        first.results[0].set_type(ir.RankedTensorType.get(partial_shape, out_t.element_type))
        made.append(first)
        acc = init
        if tail:
            tails = {}
            for i, (v, m) in enumerate(zip(list(op.operands)[:-1], maps[:-1])):
                at = [k for k, x in enumerate(m.results) if _dim_of(x) == r]
                if at:
                    tails[i] = _split_operand(v, at[0], o * c, tail, None)
            rest = op.clone()  # after its operands: a clone goes at the insertion point
            for i, v in tails.items():
                rest.operands[i] = v
            made.append(rest)
            acc = rest.results[0]
        result = _reduce_last(first.results[0], pos, acc, comb.name)
        made.append(result.owner.operation if hasattr(result.owner, "operation") else result.owner)
    op.results[0].replace_all_uses_with(result)
    op.erase()
    return made


def blocked_reductions(module: ir.Operation, bound: int = REDUCTION_BLOCK) -> None:
    """Split every float sum (a linalg.generic whose body yields ``acc + f(x)``, kf's and
    torch-mlir's alike: sum, mean, var, norm, logsumexp) that reduces more than bound
    elements into stages of at most bound: a sequential f32 sum of ``ones(2**25)`` stops
    at 2^24, and its error grows with the chain's length; in stages it grows with their
    number (here log_bound(n)). Max, min and integer reductions are exact in any order,
    and a product rounds once per factor in any order: they stay as they are."""
    work: list[ir.Operation] = []
    module.walk(lambda op: work.append(op.operation) or ir.WalkResult.ADVANCE)
    work = [op for op in work if op.name == "linalg.generic"]
    while work:
        op = work.pop()
        made = _block_one(op, bound)
        if made:
            work.extend(made)


def _memref(t: ir.Type, f: ir.Operation, what: str) -> ir.Type:
    """The dense memref of a ranked tensor type (``?`` dims stay ``?``: the caller's
    descriptor gives their sizes)."""
    if not isinstance(t, ir.RankedTensorType):
        raise PassError(f"@{ir.StringAttr(f.attributes['sym_name']).value}: {what} is {t}; kf-to-cpu takes "
                        "ranked tensors", f.location)
    return ir.MemRefType.get(list(t.shape), t.element_type)


def is_public(f: func.FuncOp) -> bool:
    vis = f.attributes["sym_visibility"] if "sym_visibility" in f.attributes else None
    return vis is None or ir.StringAttr(vis).value == "public"


def to_destination_passing(f: ir.Operation) -> None:
    """Rewrite ``(tensors) -> (tensors)`` into ``(input memrefs, output memrefs) -> ()``."""
    blocks = list(f.regions[0].blocks)
    if not blocks:
        return
    if len(blocks) != 1:
        raise PassError(f"@{ir.StringAttr(f.attributes['sym_name']).value} has {len(blocks)} blocks; kf-to-cpu "
                        "takes single-block functions", f.location)
    block = blocks[0]
    ftype = ir.FunctionType(ir.TypeAttr(f.attributes["function_type"]).value)
    n_in = len(ftype.inputs)
    with f.location:
        in_types = [_memref(t, f, f"argument {i}") for i, t in enumerate(ftype.inputs)]
        out_types = [_memref(t, f, f"result {i}") for i, t in enumerate(ftype.results)]
        # New memref arguments go after the old tensor ones, which are erased once the
        # to_tensor values have replaced them.
        new_args = [block.add_argument(t, f.location) for t in in_types + out_types]
        with ir.InsertionPoint.at_block_begin(block):
            for old, new, t in zip(list(block.arguments)[:n_in], new_args, ftype.inputs):
                old.replace_all_uses_with(bufferization.to_tensor(t, new, restrict=True))
        for _ in range(n_in):
            block.erase_argument(0)
        ret = block.operations[len(block.operations) - 1]
        outs = list(block.arguments)[n_in:]
        with ir.InsertionPoint(ret):
            for value, dest in zip(list(ret.operands), outs):
                bufferization.materialize_in_destination(None, value, dest, restrict=True, writable=True)
            func.ReturnOp([])
        ret.erase()
        f.attributes["function_type"] = ir.TypeAttr.get(ir.FunctionType.get(in_types + out_types, []))
        # Per-argument attributes (parameter names, say) must match the new arity.
        if "arg_attrs" in f.attributes:
            kept = list(ir.ArrayAttr(f.attributes["arg_attrs"]))
            f.attributes["arg_attrs"] = ir.ArrayAttr.get(kept + [ir.DictAttr.get({})] * len(out_types))
        if "res_attrs" in f.attributes:
            del f.attributes["res_attrs"]
        f.attributes["llvm.emit_c_interface"] = ir.UnitAttr.get()


def _check_lowered(module: ir.Operation) -> None:
    """kf-to-cpu takes linalg on tensors: a kf op left means kf-lower-to-linalg did not run
    (upstream bufferization would only say that the op "was not bufferized")."""
    left: list[ir.Operation] = []

    def visit(op: ir.Operation) -> ir.WalkResult:
        if op.name.startswith("kf."):
            left.append(op)
            return ir.WalkResult.INTERRUPT
        return ir.WalkResult.ADVANCE

    module.walk(visit)
    if left:
        raise PassError(f"{left[0].name} is not lowered: run kf-lower-to-linalg before kf-to-cpu", left[0].location)


@dataclasses.dataclass(frozen=True)
class ToCpuPass(KfPass):
    NAME = "kf-to-cpu"
    DESCRIPTION = "destination-passing style, bufferize, lower linalg on tensors to LLVM"
    #: fuse producer/consumer elementwise generics on tensors before bufferizing
    #: (fewer temporaries and loops); off shows one loop nest per kf op.
    fuse: bool = True

    def pipelines(self) -> tuple[str, str, str, str]:
        """The upstream passes around kf's rewrites: fusion on tensors, then (after the
        reductions are blocked) bufferization, then (after the memref-level rewrites of
        copies and loop order) loops, then (after bools) LLVM."""
        # eliminate-empty-tensors before cse: cse would merge the identical empty/fill inits of
        # two reductions, and both results would then land in one output buffer.
        fuse = "canonicalize, linalg-fuse-elementwise-ops" if self.fuse else "canonicalize"
        return (f"builtin.module({fuse})", f"builtin.module(eliminate-empty-tensors, cse, {BUFFERIZE})",
                f"builtin.module({TO_LOOPS})", f"builtin.module({TO_LLVM})")

    def run(self, module: ir.Operation) -> None:
        _check_lowered(module)
        with module.context, module.location:
            expand_fp8_conversions(module)
            narrow_f64_conversions(module)
        for op in module.regions[0].blocks[0].operations:
            op = op.operation  # an OpView's .name is its symbol, an Operation's its kind
            if op.name == "func.func" and is_public(op) and len(op.regions[0].blocks):
                to_destination_passing(op)
        fuse, bufferize, to_loops, to_llvm = self.pipelines()
        self._upstream(fuse, module)
        with module.context, module.location:
            blocked_reductions(module)
        self._upstream(bufferize, module)
        with module.context, module.location:
            strided_copies_as_loops(module)
            contiguous_inner_loops(module)
        self._upstream(to_loops, module)
        with module.context, module.location:
            bools_as_bytes(module)
            bf16_selects_as_integers(module)
        self._upstream(to_llvm, module)
        with module.context, module.location:
            bf16_memory_as_integers(module)
        self._upstream("builtin.module(canonicalize)", module)
        no_bf16_values(module)

    @staticmethod
    def _upstream(text: str, module: ir.Operation) -> None:
        pm = PassManager.parse(text, context=module.context)
        try:
            pm.run(module)
        except ir.MLIRError as e:
            raise PassError(f"upstream pipeline failed: {e}") from None
