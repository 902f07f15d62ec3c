"""The consumers' products: S = Q K^T and O += P V as wgmmas.

S is one m64 x BLOCK_N x 16 wgmma per 16 of the head dim (32 for fp8), both operands from
shared memory through descriptors. The accumulator comes out in mma.sync's C layout per 8
columns, which is the A fragment layout of a register-A wgmma: O += P V takes P from
registers, rounded to the input type (as FlashAttention does; MLIR 22's op takes
descriptors only, so this one is inline PTX, ``nvidia.wgmma.register_a_wgmma``). fp8 keys
are staged in ``fp8_key_order``, so that the f32 score accumulators are already the fp8 A
fragment of P V (no shuffles); fp8 V is read K-major from its transpose.
"""

from __future__ import annotations

from kf.passes import scalar_math
from mlir import ir
from mlir.dialects import arith, llvm, nvvm

from ...kernel_ir import GpuFunc
from ...nvidia import wgmma as _wg
from ...nvidia.mma_sync import FP8_PTX


def fp8_key_of(j: int) -> int:
    """``fp8_key_order`` on a Python int: the key stage row j holds (see there)."""
    return (j & ~15) | (j & 1) | ((j >> 2) & 2) | ((j << 1) & 12)


def fp8_key_order(j: ir.Value, g: GpuFunc) -> ir.Value:
    """The key (relative to its block) that K's stage row j holds in the fp8 kernel.

    fp8 wgmma's register A fragment gives a thread, of row gid, the 4 consecutive
    columns 4t..4t+3 and 16+4t..16+4t+3 of each 32 (t = lane % 4), where the f32
    accumulator of S = Q K^T gives it columns 2t, 2t+1, 8+2t, 9+2t, 16+2t, ... If stage
    row j = 8s + 2t + e (s, e in {0, 1}; within each 16) holds key 4t + 2s + e, the
    score accumulators of a thread are, in order, the probabilities its A fragment
    needs: P goes from the softmax into the second product without a shuffle, and V is
    read in key order. The permutation keeps bit 4 and up (and bit 0) of j."""
    low = arith.ori(arith.andi(j, g.c(1)), arith.ori(arith.andi(arith.shrui(j, g.c(2)), g.c(2)),
                                                   arith.andi(arith.shli(j, g.c(1)), g.c(12))))
    return arith.ori(arith.andi(j, g.c(~15)), low)


def pack_fp8x4(elem: str, xs: list[ir.Value]) -> ir.Value:
    """Four f32 values rounded (satfinite) to fp8 and packed into a b32, xs[0] in the
    lowest byte: two ``cvt.rn.satfinite.e4m3x2.f32`` (which put their first operand in
    the upper byte) and a ``mov.b32`` of the halves."""
    t = FP8_PTX[elem]
    asm = ("{\n.reg .b16 lo, hi;\n"
           f"cvt.rn.satfinite.{t}x2.f32 lo, $2, $1;\n"
           f"cvt.rn.satfinite.{t}x2.f32 hi, $4, $3;\n"
           "mov.b32 $0, {lo, hi};\n}")
    i32 = ir.IntegerType.get_signless(32)
    return llvm.InlineAsmOp(i32, list(xs), asm, "=r,f,f,f,f").res


class Products:
    """The kernel's wgmmas (``k``: the HopperAttention whose tiles and descriptors they
    read)."""

    def __init__(self, k):
        self.k = k

    def issue_scores(self, stage):
        """S = Q K^T of the block in ``stage``: the wgmmas issued and committed as one
        group, not waited for (the accumulator struct)."""
        k = self.k
        g, i64 = k.g, ir.IntegerType.get_signless(64)
        k_d = arith.addi(k.k_desc0, arith.index_cast(i64, g.mul(stage, k.k_tile.stage_bytes // 16)))
        nvvm.wgmma_fence_aligned()
        acc = llvm.mlir_zero(k.s_t)
        for t in range(k.D // k.k_inst):
            acc = nvvm.WgmmaMmaAsyncOp(
                k.s_t, acc, arith.addi(k.q_desc, _wg.i64_const(k.q_tile.slice_offset(t, k.k_inst) // 16)),
                arith.addi(k_d, _wg.i64_const(k.k_tile.slice_offset(t, k.k_inst) // 16)), *k.s_attrs).result
        nvvm.wgmma_commit_group_sync_aligned()
        return acc

    def p_operands(self, p):
        """P (f32, the softmax's C layout) as the register A operands of P V: a function
        of kk that emits the 4 x b32 of the kk-th wgmma (16 keys; fp8: 32 keys in
        ``fp8_key_order``), times the P chain's scale, rounded to the input type and
        packed. Emitted where each wgmma is issued, ptxas needs fewer registers (all of
        them first: head dim 64 spilled 12 bytes)."""
        k = self.k
        if k.p_scale != 1.0 and not k.softmax.log2_p:  # the P chain (precision policy): c * p, rounded below
            c = k.g.fconst(k.p_scale)
            p = [[arith.mulf(v, c) for v in pj] for pj in p]

        def part(kk):
            if k.fp8:
                # rows gid (0) and gid + 8 (1) of key columns 4t.. and 16 + 4t.. (fp8_key_order)
                q4 = p[4 * kk: 4 * kk + 4]
                return [pack_fp8x4(k.elem, [q4[2 * hi][2 * h], q4[2 * hi][2 * h + 1],
                                            q4[2 * hi + 1][2 * h], q4[2 * hi + 1][2 * h + 1]])
                        for hi in range(2) for h in range(2)]
            pe = [[scalar_math.convert(v, k.et) for v in p[2 * kk + i]] for i in range(2)]
            a = [k.tc.pack(pe[0][0], pe[0][1]), k.tc.pack(pe[0][2], pe[0][3]),
                 k.tc.pack(pe[1][0], pe[1][1]), k.tc.pack(pe[1][2], pe[1][3])]
            return [x if k.elem != "f16" else llvm.bitcast(ir.IntegerType.get_signless(32), x) for x in a]
        return part

    def packed(self, p):
        """``p_operands`` emitted at once, flat (the pipelined loop carries them)."""
        part = self.p_operands(p)
        return [x for kk in range(self.k.bn // self.k.k_inst) for x in part(kk)]

    def issue_pv(self, o, a, stage, fence=True):
        """O += P V of the block in ``stage``: the register-A wgmmas issued and committed
        as one group, not waited for. ``a``: ``p_operands``'s function, or the flat list
        of ``packed``. ``fence``: the wgmma fence first (else the caller has placed it)."""
        k = self.k
        g, i64 = k.g, ir.IntegerType.get_signless(64)
        part = a if callable(a) else (lambda kk: a[4 * kk: 4 * kk + 4])
        v_d = arith.addi(k.v_desc0, arith.index_cast(i64, g.mul(stage, k.v_tile.stage_bytes // 16)))
        if fence:
            nvvm.wgmma_fence_aligned()
        for kk in range(k.bn // k.k_inst):
            o = _wg.register_a_wgmma(o, k.Dv, k.elem, part(kk),
                                     arith.addi(v_d, _wg.i64_const(k.v_tile.slice_offset(kk, k.k_inst) // 16)))
        nvvm.wgmma_commit_group_sync_aligned()
        return o
