"""Emission helpers shared by kf's kernel strategies: reading a kernel function, making
its ``gpu.func``, index arithmetic, element types for storage and compute, and the
one-thread-per-element launch loop.

Indices are ``Ix = int | ir.Value`` (of MLIR ``index`` type): Python integers fold, so
remapping an index through a layout op or a broadcast costs no IR when it is static,
and the IR that is emitted reads like the index formula.

Element types follow the back ends and runtime/abi.py (torch's bytes, unchanged): a
kernel argument is a memref of the tensor's own element type, except booleans for CUDA.
kf-to-spirv stores ``memref<i1>`` as bytes and bf16 as 16-bit integers by itself (and
records ``i1`` in the binding, which the Vulkan launcher checks against torch.bool);
upstream MemRefToLLVM asserts on stores of ``i1`` (sub-byte), so for CUDA a bool tensor
is ``memref<i8>`` (one byte per element, torch's layout), loaded as ``!= 0`` and stored
zero-extended (``storage_type``, ``load``, ``store``). Computation follows kf's precision policy: f16, bf16 and fp8 values are
extended to f32 when loaded, computed in f32 and rounded once when stored
(``compute_type`` / ``load`` / ``store``); other types compute in themselves.
The narrow integers (int8, uint8, int16: kf-widen-integers leaves them to casts) are
i8/i16 memrefs (uint8 as i8), extended to i32 when loaded -- zero-extended for uint8,
which the loads tell by the tensor's element type, not the memref's -- and truncated
when stored; on CUDA an i8 memref is a boolean only where its tensor is one.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from kf.dialects.elements import ELEM_BYTES, FP8, LOW_PRECISION, NARROW_INTS, STORAGE_INTS, UNSIGNED
from kf.dialects.types import TensorSpec, spec_of
from kf.passes import scalar_math as sm
from mlir import ir
from mlir.dialects import arith, func, gpu, memref, scf

Ix = int | ir.Value


# --------------------------------------------------------------------------- kernel functions


def is_kernel(op: ir.Operation) -> bool:
    """A kernel function with its body (kf-map-to-gpu leaves declarations behind)."""
    return op.name == "func.func" and "kf.kernel" in op.attributes and len(op.regions[0].blocks) > 0


def kernel_functions(module: ir.Operation) -> list[ir.Operation]:
    """The kernel functions (func.func with a kf.kernel attribute and a body) of a module,
    in order."""
    return [op.operation for op in module.regions[0].blocks[0].operations if is_kernel(op.operation)]


def kernel_kind(kernel: ir.Operation) -> str:
    return ir.StringAttr(kernel.attributes["kf.kernel"]).value


def kernel_name(kernel: ir.Operation) -> str:
    return ir.StringAttr(kernel.attributes["sym_name"]).value


def kernel_body(kernel: ir.Operation) -> ir.Block:
    return kernel.regions[0].blocks[0]


def kernel_ops(kernel: ir.Operation) -> list[ir.Operation]:
    """The kf ops of a kernel function's body (the terminator left out)."""
    return [op.operation for op in kernel_body(kernel).operations if op.operation.name != "func.return"]


def kernel_results(kernel: ir.Operation) -> list[ir.Value]:
    """The values the kernel function returns, in order."""
    ret = list(kernel_body(kernel).operations)[-1].operation
    return list(ret.operands)


def kernel_signature(kernel: ir.Operation) -> tuple[list[TensorSpec], list[TensorSpec]]:
    ftype = ir.FunctionType(ir.TypeAttr(kernel.attributes["function_type"]).value)
    return [spec_of(t) for t in ftype.inputs], [spec_of(t) for t in ftype.results]


def shape_of(v: ir.Value) -> tuple[int, ...]:
    return tuple(ir.RankedTensorType(v.type).shape)


def elem_of(v: ir.Value) -> str:
    return str(ir.RankedTensorType(v.type).element_type)


def numel(shape: Sequence[int]) -> int:
    return math.prod(shape)


def fused_lines(kernel: ir.Operation) -> ir.Attribute:
    if "kf.fused_lines" in kernel.attributes:
        return kernel.attributes["kf.fused_lines"]
    return ir.ArrayAttr.get([])


# --------------------------------------------------------------------------- element types


def storage_type(elem: str, target: str = "spirv") -> ir.Type:
    """The element type of the memref that holds a tensor of elem on target: elem itself,
    but i8 for booleans on CUDA."""
    if elem == "i1" and target == "cuda":
        return ir.IntegerType.get_signless(8)
    return ir.Type.parse(STORAGE_INTS.get(elem, elem))


def _is_byte_bool(t: ir.Type, elem: str | None = None) -> bool:
    """An i8 in a memref of a tensor of elem is a boolean (CUDA's storage of them); where
    elem is not known, an i8 is taken for one."""
    if elem is not None:
        return elem == "i1" and t != ir.IntegerType.get_signless(1)
    return isinstance(t, ir.IntegerType) and ir.IntegerType(t).width == 8


def compute_type(elem: str) -> ir.Type:
    """The type kf computes values of a tensor of elem in."""
    if elem in NARROW_INTS:
        return ir.IntegerType.get_signless(32)
    return ir.F32Type.get() if elem in LOW_PRECISION else ir.Type.parse(elem)


def index_value(i: ir.Value, t: ir.Type) -> ir.Value:
    """A ``kf.iota`` element, the index ``i`` (an index or an integer), as a value of type
    ``t``. An index is never negative: zero-extended (index_castui). lavapipe gave every
    element of a compare of the sign-extended i64 (OpSConvert) as true."""
    return arith.index_castui(t, i) if isinstance(i.type, ir.IndexType) else sm.convert(i, t)


def widen(v: ir.Value, elem: str | None = None) -> ir.Value:
    """A scalar in its storage type extended to its compute type; ``elem``: the element
    type of the tensor it was loaded from (uint8 is held in an i8, zero-extended)."""
    if str(v.type) in FP8:
        return fp8_to_f32(v)
    elem = elem or str(v.type)
    return sm.convert(v, compute_type(elem), unsigned=elem in UNSIGNED)


def round_to(v: ir.Value, elem: str) -> ir.Value:
    """A compute value rounded (converted by torch's rules) to elem, back in elem's compute type."""
    if elem in FP8:  # a truncf/extf pair: lower_fp8_conversions folds it into a store's
        return fp8_to_f32(f32_to_fp8(sm.convert(v, ir.F32Type.get()), elem))
    return widen(to_storage(v, storage_type(elem)), elem)


def load(mem: ir.Value, idx: Sequence[Ix], kb: IndexBuilder, elem: str | None = None) -> ir.Value:
    """memref[idx] in its compute type; ``elem``: its tensor's element type (a uint8 or
    an int8 in an i8 memref, or CUDA's boolean), an i8 being a boolean where it is not
    given."""
    v = memref.load(mem, [kb.value(i) for i in idx])
    if _is_byte_bool(v.type, elem):
        return arith.cmpi(arith.CmpIPredicate.ne, v, kb.const(v.type, 0))
    return widen(v, elem)


def store(v: ir.Value, mem: ir.Value, idx: Sequence[Ix], kb: IndexBuilder) -> None:
    """Round the compute value v to the memref's element type (once) and store it."""
    memref.store(to_storage(v, ir.MemRefType(mem.type).element_type), mem, [kb.value(i) for i in idx])


def to_storage(v: ir.Value, elem: ir.Type) -> ir.Value:
    """A compute value as the memref element type elem (rounded; booleans as bytes 0/1)."""
    wide_int = isinstance(v.type, ir.IntegerType) and ir.IntegerType(v.type).width > 1
    if _is_byte_bool(elem) and not wide_int:  # a boolean; a wider integer is truncated
        return arith.extui(elem, sm.convert(v, ir.IntegerType.get_signless(1)))
    if str(elem) in FP8:
        return f32_to_fp8(sm.convert(v, ir.F32Type.get()), str(elem))
    return sm.convert(v, elem)


# --------------------------------------------------------------------------- fp8
#
# The strategies convert between f32 and fp8 with arith.truncf / arith.extf, which LLVM
# 22's NVVM path does not lower (they reach the LLVM translation, which refuses) and
# SPIR-V has no type for. The GPU lowerings run lower_fp8_conversions first: on CUDA
# from sm_89 e4m3 takes the hardware's cvt (one instruction a value), everything else
# the integer arithmetic below (kf-to-spirv stores no fp8 at all: there only a rounding
# inside a chain, truncf then extf, is left, and it goes through the byte, with no
# fp8-typed value made). A rounding followed by a store (a cast to fp8 that a kernel
# stores) is one conversion, not two. The encoders follow c10's
# (Float8_e4m3fn.h, Float8_e5m2.h) step for step, and round as torch's
# .to(float8) does (checked against torch 2.13 on 400k values): nearest-even,
# subnormals through one f32 addition, NaN to NaN; e4m3fn saturates (|x| past 448,
# inf included, is 448: it has no inf), e5m2 overflows to inf.


# format -> (first overflowing |bits|, denormal magic, smallest normal |bits|, mantissa shift,
#            exponent rebias + rounding half-ulp - 1)
_FP8_ENCODE = {
    "f8E4M3FN": (1087 << 20, 141 << 23, 121 << 23, 20, ((7 - 127) << 23) + 0x7FFFF),
    "f8E5M2": (143 << 23, 134 << 23, 113 << 23, 21, ((15 - 127) << 23) + 0xFFFFF),
}


def _i32(value: int) -> ir.Value:
    i32 = ir.IntegerType.get_signless(32)
    value &= 0xFFFFFFFF
    return arith.constant(i32, value - (1 << 32) if value >= 1 << 31 else value)


def _f32_bits(value: int) -> ir.Value:
    return arith.bitcast(ir.F32Type.get(), _i32(value))


def f32_to_fp8(f: ir.Value, fmt: str) -> ir.Value:
    """f32 -> f8E4M3FN / f8E5M2, rounding as torch does, for a store to an fp8 memref
    (CUDA only: no other GPU target stores fp8): an ``arith.truncf``, which kf-to-cuda
    lowers to ``cvt.rn.satfinite`` where the chip has it or to f32_to_fp8_byte's integer
    encoder (passes/to_cuda.py, ``_lower_fp8_truncf``)."""
    return arith.truncf(ir.Type.parse(fmt), f)


def f32_to_fp8_byte(f: ir.Value, fmt: str) -> ir.Value:
    """The i8 encoding of f32 f in fmt."""
    max_bits, denorm, min_normal, shift, rebias = _FP8_ENCODE[fmt]
    u = arith.CmpIPredicate
    i32, i8 = ir.IntegerType.get_signless(32), ir.IntegerType.get_signless(8)
    bits = arith.bitcast(i32, f)
    sign = arith.andi(bits, _i32(0x80000000))
    mag = arith.xori(bits, sign)
    # Below the smallest normal: adding 2^k aligns the mantissa so the FPU rounds it.
    aligned = arith.bitcast(i32, arith.addf(arith.bitcast(ir.F32Type.get(), mag), _f32_bits(denorm)))
    subnormal = arith.subi(aligned, _i32(denorm))
    odd = arith.andi(arith.shrui(mag, _i32(shift)), _i32(1))
    normal = arith.shrui(arith.addi(arith.addi(mag, _i32(rebias)), odd), _i32(shift))
    if fmt == "f8E4M3FN":
        # torch saturates: what rounds past 448 is 448 (the code 0x7F is NaN).
        normal = arith.minui(normal, _i32(0x7E))
    r = arith.select(arith.cmpi(u.ult, mag, _i32(min_normal)), subnormal, normal)
    largest = 0x7E if fmt == "f8E4M3FN" else 0x7C  # e4m3fn: 448 (saturated); e5m2: inf
    overflow = arith.select(arith.cmpi(u.ugt, mag, _i32(0x7F800000)), _i32(0x7F), _i32(largest))
    r = arith.select(arith.cmpi(u.uge, mag, _i32(max_bits)), overflow, r)
    r = arith.ori(r, arith.shrui(sign, _i32(24)))
    return arith.trunci(i8, r)


def fp8_to_f32(v: ir.Value) -> ir.Value:
    """f8E4M3FN / f8E5M2 -> f32, exactly: an ``arith.extf`` (see f32_to_fp8)."""
    return arith.extf(ir.F32Type.get(), v)


#: The first CUDA chip with cvt.rn.satfinite.{e4m3,e5m2}x2.f32 and cvt.rn.f16x2.{e4m3,e5m2}x2
#: (PTX ISA 7.8).
FP8_CVT_SM = 89


def lower_fp8_conversions(gpu_module: ir.Operation, cvt: bool) -> None:
    """Every scalar ``arith.truncf`` f32 -> fp8 and ``arith.extf`` fp8 -> float in
    gpu_module as what the target can run (see the section's comment). With cvt (CUDA,
    sm_89+): f32 -> f8E4M3FN is ``cvt.rn.satfinite.e4m3x2.f32`` (torch's rounding:
    nearest even, saturated at 448, NaN kept) and f8E4M3FN -> f32 ``cvt.rn.f16x2.e4m3x2``
    then f16 -> f32 (exact); f8E5M2 keeps the integer encoder (torch lets it overflow to
    inf, satfinite would not) and its decoder (a shift into an f16). The integer encoder
    is ~15 instructions a value: it made fp8's bf16 -> e4m3 quantization integer-bound
    (bench/fp8_attention.py; bench/RESULTS.md, "The quantization before the kernel")."""
    from mlir.dialects import llvm

    truncs, exts = [], []

    def visit(op):
        if op.name == "arith.truncf" and str(op.results[0].type) in FP8:
            truncs.append(op)
        elif op.name == "arith.extf" and str(op.operands[0].type) in FP8:
            exts.append(op)
        return ir.WalkResult.ADVANCE

    gpu_module.walk(visit)
    i8, i16, i32 = (ir.IntegerType.get_signless(w) for w in (8, 16, 32))
    f16, f32 = ir.F16Type.get(), ir.F32Type.get()
    bytes_of: dict = {}  # an fp8 value (a truncf's result) -> its i8 encoding
    for op in truncs:  # in program order: a rounding's truncf comes before its store's
        fmt, x = str(op.results[0].type), op.operands[0]
        inner = x.owner.operation if isinstance(x, ir.OpResult) else None
        if inner is not None and inner.name == "arith.extf" and inner.operands[0].type == op.results[0].type:
            y = inner.operands[0]  # truncf(extf(y)) is y: a rounded (or loaded) value stored
            byte = bytes_of.get(y)
            if byte is None:  # made here, for this truncf's users only (it dominates them)
                with ir.InsertionPoint(op), op.location:
                    byte = arith.bitcast(i8, y)
            bytes_of[op.results[0]] = byte
            continue
        with ir.InsertionPoint(op), op.location:
            x = sm.convert(x, f32)
            if cvt and fmt == "f8E4M3FN":
                zero = arith.constant(f32, 0.0)  # the high byte of the pair
                pair = llvm.InlineAsmOp(i16, [zero, x], "cvt.rn.satfinite.e4m3x2.f32 $0, $1, $2;", "=h,f,f").res
                bytes_of[op.results[0]] = arith.trunci(i8, pair)
            else:
                bytes_of[op.results[0]] = f32_to_fp8_byte(x, fmt)
    for op in exts:
        v, fmt = op.operands[0], str(op.operands[0].type)
        with ir.InsertionPoint(op), op.location:
            byte = bytes_of.get(v)
            if byte is None:
                byte = arith.bitcast(i8, v)
            if cvt and fmt == "f8E4M3FN":
                pair = llvm.InlineAsmOp(i32, [arith.extui(i16, byte)], "cvt.rn.f16x2.e4m3x2 $0, $1;", "=r,h").res
                wide = arith.extf(f32, arith.bitcast(f16, arith.trunci(i16, pair)))
            else:
                wide = fp8_byte_to_f32(byte, fmt)
            wide = sm.convert(wide, op.results[0].type)
        op.results[0].replace_all_uses_with(wide)
        op.erase()
    for op in truncs:  # what still needs the fp8 value (stores) takes the byte as fp8
        result = op.results[0]
        if any(True for _ in result.uses):
            with ir.InsertionPoint(op), op.location:
                result.replace_all_uses_with(arith.bitcast(result.type, bytes_of[result]))
        op.erase()


def fp8_byte_to_f32(byte: ir.Value, fmt: str) -> ir.Value:
    """The f32 value of the i8 encoding byte in fmt."""
    i16, i32 = ir.IntegerType.get_signless(16), ir.IntegerType.get_signless(32)
    f32 = ir.F32Type.get()
    if fmt == "f8E5M2":  # the top byte of an f16
        half = arith.bitcast(ir.F16Type.get(), arith.shli(arith.extui(i16, byte), arith.constant(i16, 8)))
        return arith.extf(f32, half)
    w = arith.extui(i32, byte)
    e = arith.andi(arith.shrui(w, _i32(3)), _i32(15))
    m = arith.andi(w, _i32(7))
    normal = arith.bitcast(f32, arith.ori(arith.shli(arith.addi(e, _i32(120)), _i32(23)),
                                          arith.shli(m, _i32(20))))
    subnormal = arith.mulf(arith.uitofp(f32, m), arith.constant(f32, 2.0 ** -9))
    eq = arith.CmpIPredicate.eq
    value = arith.select(arith.cmpi(eq, e, _i32(0)), subnormal, normal)
    nan = arith.andi(arith.cmpi(eq, e, _i32(15)), arith.cmpi(eq, m, _i32(7)))
    value = arith.select(nan, arith.constant(f32, math.nan), value)
    sign = arith.shli(arith.andi(w, _i32(0x80)), _i32(24))
    return arith.bitcast(f32, arith.ori(arith.bitcast(i32, value), sign))


def min_value(t: ir.Type) -> float:
    """The identity of max on t (-inf, the smallest integer, false)."""
    if sm.is_float(t):
        return -math.inf
    w = ir.IntegerType(t).width
    return 0 if w == 1 else -(2 ** (w - 1))


def max_value(t: ir.Type) -> float:
    if sm.is_float(t):
        return math.inf
    w = ir.IntegerType(t).width
    return 1 if w == 1 else 2 ** (w - 1) - 1


# --------------------------------------------------------------------------- scalar ops

ELEMENTWISE = frozenset({
    "kf.add", "kf.sub", "kf.mul", "kf.div", "kf.pow", "kf.fmod", "kf.max", "kf.min", "kf.neg", "kf.abs", "kf.exp",
    "kf.log", "kf.sqrt", "kf.rsqrt", "kf.reciprocal", "kf.tanh", "kf.erf", "kf.sigmoid", "kf.relu", "kf.gelu",
    "kf.erfc", "kf.sin", "kf.cos", "kf.trunc", "kf.round", "kf.signbit",
    "kf.cmp", "kf.bitwise", "kf.select", "kf.masked_fill", "kf.cast"})


def elementwise_value(op: ir.Operation, args: Sequence[ir.Value], attrs: dict, short_forms: bool = True) -> ir.Value:
    """The scalar of elementwise kf op ``op`` on compute-typed args, in the compute type of
    its result (i1 for cmp). A cast rounds to its target type; nothing else rounds.
    scalar_math is told the result's element type: erf of a value stored as bf16/f16 takes
    its short approximation (``scalar_math.emit``'s docstring gives the error), unless
    ``short_forms`` is off."""
    if op.name == "kf.cast":
        return round_to(args[0], elem_of(op.results[0]))
    return sm.emit(op.name, list(args), attrs, stored_as=elem_of(op.results[0]), short_forms=short_forms)


def better(x: ir.Value, best: ir.Value, largest: bool) -> ir.Value:
    """x should replace best in an arg-max (arg-min) scan: strictly greater (smaller), NaN
    counting as the greatest; booleans are unsigned. The same order as kf-lower-to-linalg."""
    i1 = ir.IntegerType.get_signless(1)
    if sm.is_float(x.type):
        strict = arith.cmpf(arith.CmpFPredicate.OGT if largest else arith.CmpFPredicate.OLT, x, best)
        x_nan = arith.cmpf(arith.CmpFPredicate.UNO, x, x)
        best_nan = arith.cmpf(arith.CmpFPredicate.UNO, best, best)
        one = sm.const(i1, 1)
        nan_wins = (arith.andi(x_nan, arith.xori(best_nan, one)) if largest
                    else arith.andi(best_nan, arith.xori(x_nan, one)))
        return arith.ori(strict, nan_wins)
    if ir.IntegerType(x.type).width == 1:
        return arith.cmpi(arith.CmpIPredicate.ugt if largest else arith.CmpIPredicate.ult, x, best)
    return arith.cmpi(arith.CmpIPredicate.sgt if largest else arith.CmpIPredicate.slt, x, best)


def same(x: ir.Value, y: ir.Value) -> ir.Value:
    """x and y are equal in the order of ``better`` (NaN equals NaN)."""
    if sm.is_float(x.type):
        both_nan = arith.andi(arith.cmpf(arith.CmpFPredicate.UNO, x, x), arith.cmpf(arith.CmpFPredicate.UNO, y, y))
        return arith.ori(arith.cmpf(arith.CmpFPredicate.OEQ, x, y), both_nan)
    return arith.cmpi(arith.CmpIPredicate.eq, x, y)


# --------------------------------------------------------------------------- index arithmetic


class IndexBuilder:
    """Index arithmetic that folds Python integers; constants are made once, at the top of
    the kernel's entry block, so the body reads as the formulas it computes."""

    def __init__(self, entry: ir.Block):
        self.entry = entry
        self._consts: dict[tuple[str, object], ir.Value] = {}
        self.index = ir.IndexType.get()

    def const(self, t: ir.Type, value) -> ir.Value:
        # by the float's bits: 0.0 == -0.0 (and a NaN is unequal to itself) as a key
        key = (str(t), float(value).hex() if isinstance(value, float) else value)
        if key not in self._consts:
            with ir.InsertionPoint.at_block_begin(self.entry):
                self._consts[key] = (arith.constant(t, int(value)) if isinstance(t, ir.IndexType)
                                     else sm.const(t, value))
        return self._consts[key]

    def value(self, i: Ix) -> ir.Value:
        return self.const(self.index, int(i)) if isinstance(i, int) else i

    def add(self, a: Ix, b: Ix) -> Ix:
        if isinstance(a, int) and isinstance(b, int):
            return a + b
        if isinstance(a, int) and a == 0:
            return b
        if isinstance(b, int) and b == 0:
            return a
        return arith.addi(self.value(a), self.value(b))

    def sub(self, a: Ix, b: Ix) -> Ix:
        if isinstance(a, int) and isinstance(b, int):
            return a - b
        if isinstance(b, int) and b == 0:
            return a
        return arith.subi(self.value(a), self.value(b))

    def mul(self, a: Ix, b: Ix) -> Ix:
        if isinstance(a, int) and isinstance(b, int):
            return a * b
        for x, y in ((a, b), (b, a)):
            if isinstance(x, int) and x == 0:
                return 0
            if isinstance(x, int) and x == 1:
                return y
        return arith.muli(self.value(a), self.value(b))

    def div(self, a: Ix, c: Ix) -> Ix:
        """a // c for a >= 0 (c may be a run-time size)."""
        if not isinstance(c, int):
            return arith.divui(self.value(a), c)
        if isinstance(a, int):
            return a // c
        return a if c == 1 else arith.divui(a, self.value(c))

    def rem(self, a: Ix, c: Ix) -> Ix:
        """a % c for a >= 0 (c may be a run-time size)."""
        if not isinstance(c, int):
            return arith.remui(self.value(a), c)
        if isinstance(a, int):
            return a % c
        return 0 if c == 1 else arith.remui(a, self.value(c))

    def lt(self, a: Ix, b: Ix) -> ir.Value | bool:
        if isinstance(a, int) and isinstance(b, int):
            return a < b
        return arith.cmpi(arith.CmpIPredicate.ult, self.value(a), self.value(b))

    def eq(self, a: Ix, b: Ix) -> ir.Value | bool:
        if isinstance(a, int) and isinstance(b, int):
            return a == b
        return arith.cmpi(arith.CmpIPredicate.eq, self.value(a), self.value(b))

    def from_int(self, v: ir.Value) -> ir.Value:
        """An integer scalar (i32/i64, a tensor element) as an index."""
        return arith.index_cast(self.index, v)

    def to_i64(self, i: Ix) -> ir.Value:
        i64 = ir.IntegerType.get_signless(64)
        return self.const(i64, i) if isinstance(i, int) else arith.index_cast(i64, i)

    def delinearize(self, lin: Ix, shape: Sequence[Ix]) -> list[Ix]:
        """The row-major multi-index of linear index lin in shape (whose sizes may be
        run-time ones)."""
        out: list[Ix] = []
        rest = lin
        for k in range(len(shape) - 1, -1, -1):
            size = shape[k]
            if isinstance(size, int) and size == 1:
                out.append(0)
            elif k == 0:
                out.append(rest)  # lin < numel already bounds the leading index
            else:
                out.append(self.rem(rest, size))
                rest = self.div(rest, size)
        return list(reversed(out))

    def linearize(self, idx: Sequence[Ix], shape: Sequence[Ix]) -> Ix:
        lin: Ix = 0
        for i, size in zip(idx, shape):
            lin = self.add(self.mul(lin, size), i)
        return lin


def broadcast_index(idx: Sequence[Ix], in_shape: Sequence[int], out_shape: Sequence[int]) -> list[Ix]:
    """Torch broadcasting: the index into an operand of in_shape that element idx of a
    result of out_shape reads (leading dims dropped, size-1 dims read index 0)."""
    lead = len(out_shape) - len(in_shape)
    return [0 if size == 1 else idx[lead + k] for k, size in enumerate(in_shape)]


# --------------------------------------------------------------------------- gpu.func


def memref_type(spec: TensorSpec, target: str) -> ir.MemRefType:
    """The kernel argument type of a tensor. A tensor with no elements is declared
    with its zero dims as 1: neither SPIR-V (no arrays of length 0) nor the GPU
    lowerings' function signatures take an empty memref, and a kernel never touches an
    element of an empty tensor (its loops over it run zero times)."""
    shape = list(spec.shape)
    if 0 in shape:
        shape = [max(d, 1) for d in shape]
    return ir.MemRefType.get(shape, storage_type(spec.elem, target))


def gpu_module(module: ir.Operation, name: str = "kf_kernels") -> ir.Operation:
    """The module's ``gpu.module @name``, made (at the end of the module, which then gets
    ``gpu.container_module``) if it does not exist."""
    body = module.regions[0].blocks[0]
    for op in body.operations:
        op = op.operation
        if op.name == "gpu.module" and ir.StringAttr(op.attributes["sym_name"]).value == name:
            return op
    module.attributes["gpu.container_module"] = ir.UnitAttr.get()
    with ir.InsertionPoint(body), module.location:
        gm = gpu.GPUModuleOp(ir.StringAttr.get(name))
        gm.regions[0].blocks.append()
    return gm.operation


def make_gpu_func(gmod: ir.Operation, name: str, inputs: Sequence[TensorSpec], outputs: Sequence[TensorSpec],
                  block: Sequence[int], loc: ir.Location, *, target: str,
                  index_flag: bool = False, sizes: int = 0,
                  flat: Sequence[bool] = ()) -> tuple[ir.Operation, ir.Block]:
    """An empty ``gpu.func @name(inputs..., outputs...) kernel`` with known_block_size in
    gmod (erroring if the name is taken), its memrefs typed for target ("cuda" or
    "spirv"); returns it and its entry block. With ``index_flag`` it takes one more
    argument, last: the program's index error flag (``IndexChecks``); with ``sizes`` one
    more after it: the buffer of that many run-time sizes (run_time_sizes.py). ``flat``:
    per tensor, whether it is declared one dim of all its elements (run_time_sizes.flat_type:
    addressed with run-time strides)."""
    body = gmod.regions[0].blocks[0]
    for op in body.operations:
        if "sym_name" in op.operation.attributes and ir.StringAttr(op.operation.attributes["sym_name"]).value == name:
            raise ValueError(f"gpu.module already holds @{name}")
    types = [memref_type(s, target) for s in [*inputs, *outputs]]
    if flat:
        from .run_time_sizes import flat_type

        types = [flat_type(t) if f else t for t, f in zip(types, flat)]
    if index_flag:
        types.append(ir.MemRefType.get([INDEX_FLAG_WORDS], ir.IntegerType.get_signless(32)))
    if sizes:
        types.append(ir.MemRefType.get([sizes], ir.IntegerType.get_signless(32)))
    ftype = ir.FunctionType.get(types, [])
    with ir.InsertionPoint(body), loc:
        f = gpu.GPUFuncOp(ftype, sym_name=name, kernel=True, known_block_size=[int(b) for b in block] + [1] * (3 - len(block)))
        entry = f.add_entry_block()
    return f.operation, entry


# --------------------------------------------------------------------------- index checks

#: int32 words of the error flag (runtime/abi.py's INDEX_FLAG_WORDS: the runtime reads it)
INDEX_FLAG_WORDS = 4

#: kf ops that load or store through an index operand (operand 1), and the dimension
#: (attribute ``dim``) of operand 0 that it indexes
INDEXING_OPS = ("kf.gather", "kf.index_select", "kf.index_add", "kf.scatter_add", "kf.scatter_reduce")


def uses_indices(kernel: ir.Operation) -> bool:
    """Whether a kernel function holds an op that indexes through a tensor of indices."""
    return any(op.name in INDEXING_OPS for op in kernel_ops(kernel))


def site_where(loc: ir.Location) -> str:
    """The user's file:line of an op's location ("" when it has none)."""
    import re

    m = re.search(r'loc\("([^"]+)":(\d+)', str(loc))
    return f"{m.group(1)}:{m.group(2)}" if m else ""


class IndexChecks:
    """Bounds checks of the indices one kernel loads or stores through.

    ``check`` compares an index (an integer scalar as the tensor holds it, i32 or i64:
    compared before any narrowing to ``index``, which is 32-bit on SPIR-V) with the
    bound of the dimension it indexes, in one unsigned comparison (a negative index is
    a huge unsigned one), and gives back an index that is always inside the dimension:
    the index itself, or 0 when it is out of range. The thread keeps the first bad
    index it meets (site and value) in two private words, without branching: checks sit
    inside loops (a reduction over a gathered row, index_add's walk of the index), and
    a branch there made lavapipe compute garbage. ``finish``, at the end of the kernel,
    reports it into the program's error flag (``flag``, the kernel's last argument;
    layout in runtime/abi.py): ``atomic or`` of 1 into word 0, and, by the one thread
    that found it 0, the site and the value into words 1..3. On good input the cost is
    a compare and three selects per index, in registers, and one branch per thread.

    Sites are numbered across the gpu.module (``base``: the sites of the kernels
    written before this one), and recorded on the gpu.func as ``kf.index_sites``
    (``record``), from which the driver builds ProgramABI.index_sites.
    """

    def __init__(self, kb: IndexBuilder, flag: ir.Value, base: int):
        self.kb, self.flag, self.base = kb, flag, base
        self.sites: list[dict] = []
        self._ids: dict = {}
        i64 = ir.IntegerType.get_signless(64)
        private = ir.Attribute.parse("#gpu.address_space<private>")
        with ir.InsertionPoint.at_block_begin(kb.entry):
            # [site + 1 of the first bad index (0: none yet), its value]
            self.first = memref.alloca(ir.MemRefType.get([2], i64, memory_space=private), [], [])
            zero = arith.constant(i64, 0)
            for k in range(2):
                memref.store(zero, self.first, [arith.constant(ir.IndexType.get(), k)])

    @staticmethod
    def first_site(gmod: ir.Operation) -> int:
        """The number the next kernel's first site gets: the sites recorded so far."""
        n = 0
        for op in gmod.regions[0].blocks[0].operations:
            if "kf.index_sites" in op.operation.attributes:
                n += len(ir.ArrayAttr(op.operation.attributes["kf.index_sites"]))
        return n

    def site(self, op: ir.Operation, bound: int, dim: int) -> int:
        key = (id(op), dim)
        if key not in self._ids:
            self._ids[key] = self.base + len(self.sites)
            self.sites.append({"id": self._ids[key], "op": op.name, "where": site_where(op.location),
                               "dim": dim, "bound": bound})
        return self._ids[key]

    def check(self, op: ir.Operation, value: ir.Value, bound: int, dim: int) -> ir.Value | None:
        """``value`` as an index into a dimension of ``bound`` elements, clamped; None
        when the dimension is empty (no index is valid: the error is noted, and the
        caller must not access the tensor)."""
        site = self.site(op, bound, dim)
        t = value.type
        if bound == 0:
            self._note(site, value, None)
            return None
        bad = arith.cmpi(arith.CmpIPredicate.uge, value, self.kb.const(t, bound))
        self._note(site, value, bad)
        return self.kb.from_int(arith.select(bad, self.kb.const(t, 0), value))

    def verify(self, op: ir.Operation, value: ir.Value, bound: int, dim: int) -> None:
        """Check an index that is only compared, never used as an address (index_add
        and scatter_add match their targets against it)."""
        site = self.site(op, bound, dim)
        self._note(site, value, arith.cmpi(arith.CmpIPredicate.uge, value, self.kb.const(value.type, bound)))

    def _note(self, site: int, value: ir.Value, bad: ir.Value | None) -> None:
        """Keep (site, value) as the thread's first bad index when ``bad`` (always when
        None) and none was kept before."""
        i64 = ir.IntegerType.get_signless(64)
        kb = self.kb
        c = lambda v: kb.const(ir.IndexType.get(), v)  # noqa: E731
        kept = memref.load(self.first, [c(0)])
        none_yet = arith.cmpi(arith.CmpIPredicate.eq, kept, kb.const(i64, 0))
        take = none_yet if bad is None else arith.andi(bad, none_yet)
        wide = value if ir.IntegerType(value.type).width == 64 else arith.extsi(i64, value)
        memref.store(arith.select(take, kb.const(i64, site + 1), kept), self.first, [c(0)])
        memref.store(arith.select(take, wide, memref.load(self.first, [c(1)])), self.first, [c(1)])

    def finish(self) -> None:
        """Report the thread's first bad index, if any, into the error flag (at the end
        of the kernel, outside every loop)."""
        i32, i64 = ir.IntegerType.get_signless(32), ir.IntegerType.get_signless(64)
        kb = self.kb
        c = lambda v: kb.const(ir.IndexType.get(), v)  # noqa: E731
        kept = memref.load(self.first, [c(0)])
        found = scf.IfOp(arith.cmpi(arith.CmpIPredicate.ne, kept, kb.const(i64, 0)))
        with ir.InsertionPoint(found.then_block):
            before = memref.atomic_rmw(arith.AtomicRMWKind.ori, kb.const(i32, 1), self.flag, [c(0)])
            first = scf.IfOp(arith.cmpi(arith.CmpIPredicate.eq, before, kb.const(i32, 0)))
            with ir.InsertionPoint(first.then_block):
                value = memref.load(self.first, [c(1)])
                memref.store(arith.trunci(i32, arith.subi(kept, kb.const(i64, 1))), self.flag, [c(1)])
                memref.store(arith.trunci(i32, value), self.flag, [c(2)])
                memref.store(arith.trunci(i32, arith.shrsi(value, kb.const(i64, 32))), self.flag, [c(3)])
                scf.YieldOp([])
            scf.YieldOp([])

    def record(self, gfunc: ir.Operation) -> None:
        """Record the sites on the kernel's gpu.func (``kf.index_sites``)."""
        from kf.dialects.attrs import to_attr

        gfunc.attributes["kf.index_sites"] = ir.ArrayAttr.get([
            ir.DictAttr.get({k: to_attr("str" if isinstance(v, str) else "int", v) for k, v in s.items()})
            for s in self.sites])


def linear_thread_id(kb: IndexBuilder, block: int) -> ir.Value:
    """block_id.x * block + thread_id.x."""
    bid = gpu.block_id(gpu.Dimension.x)
    tid = gpu.thread_id(gpu.Dimension.x)
    return arith.addi(arith.muli(bid, kb.value(block)), tid)


def for_each_thread_item(kb: IndexBuilder, total: Ix, block: int, grid: int, grid_stride: bool,
                         body: Callable[[ir.Value], None]) -> None:
    """Run body(i) for every i in [0, total), one i per thread: guarded by ``i < total``
    when the grid covers total in one pass (no guard when it is exact; always for a
    run-time total), else a grid-stride loop (grids are capped: Vulkan guarantees only
    65535 workgroups in x)."""
    start = linear_thread_id(kb, block)
    if grid_stride:
        step = kb.value(grid * block)
        loop = scf.ForOp(start, kb.value(total), step)
        with ir.InsertionPoint(loop.body):
            body(loop.induction_variable)
            scf.YieldOp([])
        return
    if isinstance(total, int) and grid * block == total:
        body(start)
        return
    guard = scf.IfOp(kb.lt(start, total))
    with ir.InsertionPoint(guard.then_block):
        body(start)
        scf.YieldOp([])


def launch_geometry(total: int, block: int, max_grid: int) -> tuple[int, bool]:
    """(grid, grid_stride) for total items at block threads per block."""
    grid = max(1, -(-total // block))
    return (max_grid, True) if grid > max_grid else (grid, False)


def max_grid_x(target_name: str) -> int:
    # CUDA allows 2^31 - 1 blocks in x; Vulkan guarantees maxComputeWorkGroupCount[0] >= 65535.
    return 2 ** 31 - 1 if target_name == "cuda" else 65535


def finish(entry: ir.Block) -> None:
    """End the kernel (gpu.return) and hoist its constants (see hoist_constants)."""
    with ir.InsertionPoint(entry):
        gpu.ReturnOp([])
    hoist_constants(entry)


def hoist_constants(entry: ir.Block) -> None:
    """One ``arith.constant`` per value and type, at the top of the entry block, and none
    that is unused.

    scalar_math makes its constants where it computes (a relu per lane makes a zero per
    lane); a constant has no operands, so the first of each kind can move to the entry
    block, where it dominates every use, and the others can go. This is the part of CSE
    that matters for reading the kernels, without running a pass pipeline inside a pass.
    """
    first: dict[tuple[str, str], ir.Operation] = {}
    nested = []  # firsts inside a region: they move to the top of the entry block
    dead = []

    def visit(block: ir.Block, top: bool) -> None:
        for op in block.operations:
            op = op.operation
            if op.name == "arith.constant":
                key = (str(op.attributes["value"]), str(op.results[0].type))
                if key in first:
                    op.results[0].replace_all_uses_with(first[key].results[0])
                    dead.append(op)
                else:
                    first[key] = op
                    if not top:
                        nested.append(op)
            for region in op.regions:
                for b in region.blocks:
                    visit(b, False)

    # The walk is in program order, so a first occurrence in the entry block comes
    # before (and dominates) every later one.
    visit(entry, True)
    for op in dead:
        op.erase()
    # Firsts nothing reads (index constants of lanes, say) go, after nested is filtered:
    # an erased op cannot be compared.
    unused = [first.pop(key) for key in [k for k, op in first.items() if not list(op.results[0].uses)]]
    nested = [op for op in nested if op in first.values()]
    for op in unused:
        op.erase()
    if nested:
        head = entry.operations[0].operation
        for op in nested:
            op.move_before(head)


def declare_kernel(kernel: ir.Operation, gpu_module_name: str) -> ir.Operation:
    """Replace kernel function's definition by a declaration carrying its attributes and
    ``kf.gpu_func = @gpu_module_name::@name``; the host's func.call ops stay valid."""
    name = kernel_name(kernel)
    ftype = ir.FunctionType(ir.TypeAttr(kernel.attributes["function_type"]).value)
    with ir.InsertionPoint(kernel), kernel.location:
        decl = func.FuncOp(name, ftype, visibility="private")
    for key in kernel.attributes:
        if key not in ("sym_name", "function_type", "sym_visibility"):
            decl.attributes[key] = kernel.attributes[key]
    decl.attributes["kf.gpu_func"] = ir.SymbolRefAttr.get([gpu_module_name, name])
    kernel.erase()
    return decl.operation
