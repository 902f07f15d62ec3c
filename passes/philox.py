"""The scalar of ``kf.rand`` in arith and math ops: one Philox4x32-10 block and its sample
(kf/dialects/philox.py defines both), emitted at the current insertion point. Every
lowering of ``kf.rand`` calls ``sample`` (kf-lower-to-linalg inside a ``linalg.generic``,
the GPU strategies per thread), so the targets cannot disagree on a number.

The 32x32 -> 64-bit products are ``arith.mului_extended``, which lowers to LLVM's
widening multiply on the CPU and NVPTX (``mul.hi.u32`` / ``mul.lo.u32``) and to
``OpUMulExtended`` in SPIR-V.
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


def block(seed: ir.Value, counter: ir.Value) -> tuple[ir.Value, ir.Value, ir.Value, ir.Value]:
    """Philox4x32-10 of the counter (counter mod 2^32, counter div 2^32, 0, 0) under the key
    (seed mod 2^32, seed div 2^32); seed and counter are i64, the words i32."""
    k0, k1 = _split(seed)
    c0, c1 = _split(counter)
    c2 = c3 = _i32(0)
    for r in range(philox.ROUNDS):
        if r:
            k0, k1 = arith.addi(k0, _i32(philox.W0)), arith.addi(k1, _i32(philox.W1))
        lo0, hi0 = arith.mului_extended(_i32(philox.M0), c0)
        lo1, hi1 = arith.mului_extended(_i32(philox.M1), c2)
        c0, c1, c2, c3 = arith.xori(arith.xori(hi1, c1), k0), lo1, arith.xori(arith.xori(hi0, c3), k1), lo0
    return c0, c1, c2, c3


def _unit(word: ir.Value, plus_one: bool = False) -> ir.Value:
    """The top 24 bits of a word (plus one) times 2^-24, exactly, as f32."""
    f32 = ir.F32Type.get()
    bits = arith.shrui(word, _i32(philox.SAMPLE_SHIFT))
    if plus_one:
        bits = arith.addi(bits, _i32(1))
    return arith.mulf(arith.sitofp(f32, bits), arith.constant(f32, philox.SAMPLE_SCALE))


def sample(seed: ir.Value, counter: ir.Value, distribution: str) -> ir.Value:
    """The f32 sample of the block at counter: uniform in [0, 1) or standard normal."""
    words = block(seed, counter)
    if distribution == "uniform":
        return _unit(words[0])
    if distribution != "normal":
        raise ValueError(f"kf.rand has no distribution {distribution!r}")
    f32 = ir.F32Type.get()
    u1, u2 = _unit(words[0], plus_one=True), _unit(words[1])
    radius = mmath.sqrt(arith.mulf(arith.constant(f32, -2.0), mmath.log(u1)))
    return arith.mulf(radius, mmath.cos(arith.mulf(arith.constant(f32, 2.0 * math.pi), u2)))


def counter(state_offset: ir.Value, op_offset: int, index: ir.Value) -> ir.Value:
    """state offset + op offset + linear index, as i64 (wrapping, as the reference does);
    index is an ``index`` value."""
    i64 = ir.IntegerType.get_signless(64)
    c = arith.addi(arith.index_cast(i64, index), state_offset)
    return arith.addi(c, arith.constant(i64, op_offset)) if op_offset else c
