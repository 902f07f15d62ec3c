"""Key loops that skip the key blocks a mask masks entirely, exactly: the block test
(``skipping_loop``) and the second pass for query rows masked everywhere
(``two_pass_loop``), shared by the mma.sync and the Hopper kernels."""

from __future__ import annotations

from kf.dialects import spec_of
from mlir import ir
from mlir.dialects import arith

from ..kernel_ir import GpuFunc, Pointwise
from ..nvidia.barriers import block_reduce
from ..run_time_sizes import ragged
from .chain import Chain

def skipping_loop(g: GpuFunc, pw: Pointwise, ch: Chain, key_block, init: list[ir.Value], rows: list[ir.Value],
                   tig2: ir.Value, bm: int, bn: int, s_lead: list, stage_block=None, start_pass=None,
                   whole_blocks: bool = False, block_class=None, uniform=None) -> list[ir.Value]:
    """The key loop, skipping blocks that the mask masks entirely (a causal mask's
    upper triangle: half the work), exactly.

    Per key block every thread tests its own score positions of the mask and the
    workgroup ORs them (``bar.red.or``); a block with no unmasked score is neither
    staged nor computed. That is exact for every row with an unmasked score
    somewhere, whose running max is then a real score and the skipped terms
    exp(fill - max) are 0 in f32. A row masked everywhere is softmax over equal fills
    in eager torch (uniform weights over all keys), so when one occurs in a block that
    skipped anything, the block runs the loop again without skipping (the outer
    two-pass loop; the second pass happens only then).

    Hooks of a pipelined kernel (the wgmma one): ``start_pass()`` at the start of each
    pass (the first block's copies); ``stage_block(n0)`` at the start of every block,
    skipped or not, returns the pipeline stage the block's K and V are in (having
    staged its mask tile, see ``Pointwise.tiles``, and issued the next block's
    copies), passed on as ``key_block(n0, state, stage)``. With ``whole_blocks`` the
    workgroup also ANDs whether the mask leaves every score of the block alone, and
    ``key_block(..., unmasked=pred)`` may then skip the mask (a causal mask's blocks
    below the diagonal). ``block_class(n0)``, where given, answers (live, whole) for
    the block instead of the test (a table made before the kernel); ``stage_block``
    is then told whether blocks may be skipped at all (``allow``). It may answer
    (live, whole, causal): ``causal`` -- the mask is ``key > query`` over the block --
    goes to ``key_block(..., causal=pred)``. ``uniform``, where given, rewrites the
    condition of the branch around each block (the wgmma kernel: a warp vote of it,
    which ptxas knows to be uniform)."""
    Sq, Sk = ch.seq_q, ch.seq_k
    i1 = ir.IntegerType.get_signless(1)
    true, false = arith.constant(i1, 1), arith.constant(i1, 0)
    types = [v.type for v in init]

    block_or = block_reduce
    uniform = uniform or (lambda p: p)

    def inner(allow: ir.Value):
        def block(n0, carried):
            state, skipped = carried[:-1], carried[-1]
            stage = stage_block(n0, allow) if stage_block is not None else None
            if block_class is not None:
                live, whole, *causal = block_class(n0)
                go = arith.ori(live, arith.xori(allow, true))
                extra = {"stage": stage, **({"unmasked": whole} if whole_blocks else {}),
                         **({"causal": causal[0]} if causal else {})}
                out = g.guarded(uniform(go), types, lambda: key_block(n0, state, **extra), lambda: state)
                return out + [arith.ori(skipped, arith.xori(go, true))]
            live, whole = false, true
            for gi in rows:
                for j in range(bn // 8):
                    for e in range(2):
                        gj = arith.addi(n0, g.add(tig2, 8 * j + e))
                        conds = [c for c in (g.lt(gi, Sq) if ragged(Sq, bm) else None,
                                             g.lt(gj, Sk) if ragged(Sk, bn) else None) if c is not None]

                        def masked(gi=gi, gj=gj):
                            pw.reset()
                            # the condition at its own (broadcast) index, e.g. a [seq, seq] mask
                            c = pw.eval(ch.mask_cond, pw.operand_index(
                                spec_of(ch.mask_cond.type).shape, s_lead + [gi, gj], ch.scores.rank))
                            pw.reset()
                            return [c]

                        m = g.guarded(g.all_of(conds), [i1], masked, lambda: [true])[0]
                        live = arith.ori(live, arith.xori(m, true))
                        whole = arith.andi(whole, arith.xori(m, true))
            go = arith.ori(block_or(live), arith.xori(allow, true))
            extra = {} if stage is None else {"stage": stage}
            if whole_blocks:
                extra["unmasked"] = block_reduce(whole, "and")
            out = g.guarded(uniform(go), types, lambda: key_block(n0, state, **extra), lambda: state)
            return out + [arith.ori(skipped, arith.xori(go, true))]

        return block

    def run_pass(allow):
        if start_pass is not None:
            start_pass()
        out = g.loop(0, Sk, bn, init + [false], inner(allow))
        return out[:-1], out[-1]

    return two_pass_loop(g, ch, init, rows, bm, run_pass)


def two_pass_loop(g: GpuFunc, ch: Chain, init: list[ir.Value], rows: list[ir.Value], bm: int,
                  run_pass, reduce=block_reduce) -> list[ir.Value]:
    """The skipping loop's outer loop: ``run_pass(allow)`` runs the key blocks once
    (skipping dead ones where ``allow``, an i1, holds) and returns (state, skipped). The
    second pass, with nothing skipped, runs only when the first skipped a block and a
    query row of the workgroup saw masked scores only (its max is the fill): in eager
    torch such a row is softmax over equal fills, uniform over all keys. ``reduce``: the
    OR over the threads that compute (``block_reduce``)."""
    Sq = ch.seq_q
    i1 = ir.IntegerType.get_signless(1)
    true, false = arith.constant(i1, 1), arith.constant(i1, 0)
    types = [v.type for v in init]
    fill_half = g.fconst(ch.mask_fill / 2)

    def attempt(p, carried):
        done = carried[0]

        def run():
            allow = arith.cmpi(arith.CmpIPredicate.eq, p, g.c(0))
            state, skipped = run_pass(allow)
            # a row that saw masked scores only has the fill as its max
            full = false
            for h, gi in enumerate(rows):
                only_masked = arith.cmpf(arith.CmpFPredicate.OLE, state[h], fill_half)
                if ragged(Sq, bm):
                    only_masked = arith.andi(only_masked, g.lt(gi, Sq))
                full = arith.ori(full, only_masked)
            redo = arith.andi(reduce(full), skipped)
            return [arith.xori(redo, true)] + list(state)

        return g.guarded(done, [i1] + types, lambda: list(carried), run)

    return g.loop(0, 2, 1, [false] + init, attempt)[1:]
