"""The scalars of ``kf.rand`` in arith and math ops: Philox4x32-10 blocks and their samples
(kf/dialects/philox.py defines both), emitted at the current insertion point. Every
lowering of ``kf.rand`` calls these (kf-lower-to-linalg inside a ``linalg.generic``, the
GPU strategies per thread), so the targets cannot disagree on a number.

``sample`` computes one element from its linear index: it evaluates the element's block
and picks its word. A strategy that computes the ``PER_BLOCK`` consecutive elements of a
block in one thread evaluates the block once (``block``) and takes each element's word
with ``from_words``, a quarter of the work for uniform samples.

The 32x32 -> 64-bit products are ``arith.mului_extended``: LLVM's widening multiply on
the CPU, ``OpUMulExtended`` in SPIR-V. On CUDA, LLVM widens the xors around them to
64 bits and multiplies in 64 bits; ``lower_mulhi`` (kf-to-cuda) writes them as
``mul.lo.u32`` and ``mul.hi.u32`` instead, which keeps the whole block in 32-bit registers.
"""

from __future__ import annotations

import math

from mlir import ir
from mlir.dialects import arith
from mlir.dialects import math as mmath

from kf.dialects import philox


def _i32(value: int) -> ir.Value:
    value &= philox.MASK32
    return arith.constant(ir.IntegerType.get_signless(32), value - (1 << 32) if value >= 1 << 31 else value)


def _split(v: ir.Value) -> tuple[ir.Value, ir.Value]:
    """(low, high) 32-bit words of an i64."""
    i32, i64 = ir.IntegerType.get_signless(32), ir.IntegerType.get_signless(64)
    return arith.trunci(i32, v), arith.trunci(i32, arith.shrui(v, arith.constant(i64, 32)))


def block(seed: ir.Value, counter: ir.Value) -> list[ir.Value]:
    """Philox4x32-10 of the counter (counter mod 2^32, counter div 2^32, 0, 0) under the key
    (seed mod 2^32, seed div 2^32); seed and counter are i64, the four words i32."""
    k0, k1 = _split(seed)
    c0, c1 = _split(counter)
    c2 = c3 = _i32(0)
    for r in range(philox.ROUNDS):
        if r:
            k0, k1 = arith.addi(k0, _i32(philox.W0)), arith.addi(k1, _i32(philox.W1))
        lo0, hi0 = arith.mului_extended(_i32(philox.M0), c0)
        lo1, hi1 = arith.mului_extended(_i32(philox.M1), c2)
        c0, c1, c2, c3 = arith.xori(arith.xori(hi1, c1), k0), lo1, arith.xori(arith.xori(hi0, c3), k1), lo0
    return [c0, c1, c2, c3]


def counter(state_offset: ir.Value, op_offset: int, block_index: ir.Value) -> ir.Value:
    """state offset + op offset + block index, as i64 (wrapping, as the reference does);
    block_index is an ``index`` value."""
    i64 = ir.IntegerType.get_signless(64)
    c = arith.addi(arith.index_cast(i64, block_index), state_offset)
    return arith.addi(c, arith.constant(i64, op_offset)) if op_offset else c


def _unit(word: ir.Value, plus_one: bool = False) -> ir.Value:
    """The top 24 bits of a word (plus one) times 2^-24, exactly, as f32."""
    f32 = ir.F32Type.get()
    bits = arith.shrui(word, _i32(philox.SAMPLE_SHIFT))
    if plus_one:
        bits = arith.addi(bits, _i32(1))
    return arith.mulf(arith.sitofp(f32, bits), arith.constant(f32, philox.SAMPLE_SCALE))


def _pick(words: list[ir.Value], k: ir.Value) -> ir.Value:
    """words[k] for an ``index`` k in [0, len(words))."""
    out = words[0]
    for j in range(1, len(words)):
        is_j = arith.cmpi(arith.CmpIPredicate.eq, k, arith.constant(ir.IndexType.get(), j))
        out = arith.select(is_j, words[j], out)
    return out


def from_words(words: list[ir.Value], k: int | ir.Value, distribution: str) -> ir.Value:
    """The f32 sample of element k of a block (k an int, or an ``index`` value)."""
    if distribution == "uniform":
        return _unit(words[k] if isinstance(k, int) else _pick(words, k))
    if distribution != "normal":
        raise ValueError(f"kf.rand has no distribution {distribution!r}")
    if isinstance(k, int):
        a, b = words[2 * k], words[2 * k + 1]
    else:
        a, b = _pick(words[0::2], k), _pick(words[1::2], k)
    f32 = ir.F32Type.get()
    radius = mmath.sqrt(arith.mulf(arith.constant(f32, -2.0), mmath.log(_unit(a, plus_one=True))))
    return arith.mulf(radius, mmath.cos(arith.mulf(arith.constant(f32, 2.0 * math.pi), _unit(b))))


def sample(seed: ir.Value, state_offset: ir.Value, op_offset: int, index: ir.Value, distribution: str) -> ir.Value:
    """The f32 sample of the element at linear ``index`` (an ``index`` value): its block,
    then its word in the block."""
    n = philox.PER_BLOCK[distribution]
    idx = ir.IndexType.get()
    b = arith.divui(index, arith.constant(idx, n))
    k = arith.remui(index, arith.constant(idx, n))
    return from_words(block(seed, counter(state_offset, op_offset, b)), k, distribution)


def lower_mulhi(gpu_module: ir.Operation) -> None:
    """Every ``arith.mului_extended`` of i32 in gpu_module as ``mul.lo.u32`` (arith.muli) and
    ``mul.hi.u32`` (inline PTX): CUDA only."""
    from mlir.dialects import llvm

    found = []

    def visit(op):
        if op.name == "arith.mului_extended" and str(op.operands[0].type) == "i32":
            found.append(op)
        return ir.WalkResult.ADVANCE

    gpu_module.walk(visit)
    i32 = ir.IntegerType.get_signless(32)
    for op in found:
        a, b = op.operands
        with ir.InsertionPoint(op), op.location:
            low = arith.muli(a, b)
            high = llvm.InlineAsmOp(i32, [a, b], "mul.hi.u32 $0, $1, $2;", "=r,r,r").res
        op.results[0].replace_all_uses_with(low)
        op.results[1].replace_all_uses_with(high)
        op.erase()
