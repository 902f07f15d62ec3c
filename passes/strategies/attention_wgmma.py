"""The attention strategy's Hopper kernel: FlashAttention on ``wgmma.mma_async`` (sm_90a).

The mma.sync kernel (attention.py) reads every K and V fragment from shared memory
with ldmatrix into registers, 16 query rows a warp; at head dim 128 that kept it at
0.44x torch's SDPA on the H200. Here the tensor cores read K and V from shared memory
themselves, through matrix descriptors, and a warpgroup (4 warps) owns 64 query rows:

- Q (the workgroup's BLOCK_M = 64 x WARPGROUPS rows) is copied once into 128-byte
  swizzled shared memory; K and V blocks of BLOCK_N keys are double-buffered by cp.async
  in the same layout (``wgmma.SwizzledTile``: Q and K K-major over the head dim, V as it
  lies, keys by head dim, which wgmma reads transposed).
- Per key block, S = Q K^T is one m64 x BLOCK_N x 16 wgmma per 16 of the head dim, both
  operands from shared memory. The accumulator comes out in mma.sync's C layout per 8
  columns, so the online softmax is the mma.sync kernel's (``attention.online_softmax``:
  the elementwise chain per score, tails, quad-shuffled row maxima and sums).
- O += P V takes P from registers: the A operand of a register-A wgmma has mma.sync's A
  fragment layout, which is the layout the scores are in, rounded to the input type
  (as FlashAttention does). MLIR 22's nvvm.wgmma.mma_async takes descriptors only, so
  this instruction is inline PTX, its 4 A registers and Dv/2 accumulators as operands.
- A key block is waited for before its softmax (S) and before the next block (O), so
  a warpgroup's products do not overlap its own softmax; the workgroup's other
  warpgroups do, and the next block's copies are in flight meanwhile.

Masks that mask whole key blocks are skipped exactly as in the mma.sync kernel
(``AttentionStrategy._skipping_loop``). K and V stay double-buffered there (the next
block's copies issued before this block is tested); a mask every head shares (a
causal mask) is staged a block tile at a time in swizzled shared memory, double-
buffered where it fits, and read there by the test and the softmax; blocks it leaves
whole run the softmax without it. H200, 4x32x2048x128 bf16 causal: 1.53 ms with K and
V staged per live block and the mask read from global memory, 0.82 ms so
(bench/results/variants-attention-masks-2026-12-03.json), 0.34x SDPA. What is left is
the cost of a dead block, ~0.45 ms at that shape measured on a diagonal mask: its
mask tile and its K and V still cross from L2 to every workgroup.

The block table (BLOCK_TABLE, FlexAttention's block mask) took that away: a prelude
kernel classifies each (query block, key block) of a head-shared mask once per call as
dead, partial or whole (0.597 ms causal, 0.52x SDPA, 2026-12-03). What it left (RESULTS.md):
the diagonal blocks read the mask from global memory element by element, and every key
block, dead or not, waited on its table entry and passed two barriers. And, found since
in ptxas's log: every masked kernel at the benchmark's shapes had its wgmmas serialized
(C7520), as the branches around the products test conditions ptxas cannot prove
uniform; the unmasked kernel never had that. Three switches, not yet measured on the
H200: UNIFORM_BRANCHES (branch on warp votes), CAUSAL_BLOCKS (a fourth class, where the
mask is the causal pattern over the block, computed from the indices) and TABLE_WALK
(the table row read once into bit masks; the loop visits the live blocks only).

Since 2026-12-04 (session 6, bench/results/fp8-attention-2026-12-04.json, H200):

- fp8 q, k, v (``precision="fp8"``; FP8): both products are m64nNk32 e4m3/e5m2 wgmmas.
  K's rows are staged in ``fp8_key_order`` so the f32 score accumulators are already
  the fp8 A fragment of P V (no shuffles), and V is read K-major from its transpose,
  which the precision policy stores. 4x32x2048x128: 0.494 ms, 1.33x kf's bf16 kernel
  (0.657); 2x32x4096x128: 0.860 ms, 1.36x (639 TFLOP/s; SDPA bf16 0.842).
- OVERLAP_SCORES: block j + 1's S is issued before block j's softmax (three stages).
- LINEAR_SCORES: a chain that only scales the scores is one factor, folded with log2 e
  into an FFMA per score (``linear_softmax``).
- Rank-0 arguments (fp8 dequantization factors) are loaded once (``Pointwise.hoist_scalars``).

Since session 9 (bench/results/variants-attention-session9-2026-12-04.json): OVERLAP_PV,
FlashAttention-3's intra-warpgroup schedule (block j's S and block j - 1's P V in flight
together, the softmax between their waits), and wgmma.LEAN_COPIES for K and V: with both,
4x32x2048x128 0.637 -> 0.617 ms, 2x32x4096x128 1.130 -> 1.088, causal 0.478 -> 0.456.

Since session 10 (bench/results/variants-*-session10-2026-12-04.json): WARP_SPECIALIZED,
FlashAttention-3's producer warpgroup (with cp.async and mbarriers where it has TMA): a
third warpgroup copies, the two others only compute, in the three-stage loops (unmasked
from head dim 128, the block table's walk from 64). With LINEAR_MASKED_BLOCKS (the walk's
whole and causal blocks by ``linear_softmax``) and LAZY_RESCALE: 4x32x2048x128 0.617 ->
0.533 ms (0.83x SDPA), 2x32x4096x128 1.088 -> 0.931 (0.91x), causal 0.456 -> 0.388
(0.73x), causal head dim 64 0.348 -> 0.290.

Since session 11 the unmasked producer/consumer kernel is persistent (PERSISTENT), and since
session 12 the block table's walk too (PERSISTENT_WALK: tiles claimed from a counter in the
table, longest first in groups of heads; the table's live-row words replace the second
pass): causal 4x32x2048x128 0.355 ms not persistent against 0.308 persistent in one run,
0.293 with WALK_EVEN_GROUPS in another; 0.98x SDPA's causal kernel in the final benchmark
(bench/RESULTS.md, session 12).
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import Callable

from kf.dialects import spec_of
from kf.dialects.attrs import op_attrs
from kf.dialects.types import defining
from kf.passes import scalar_math
from mlir import ir
from mlir.dialects import arith, gpu, llvm, memref, nvvm, scf, vector
from mlir.dialects import math as mmath

from .base import EmittedKernel, NotApplicable, TargetInfo
from .emit import to_storage as emit_to_storage
from .kernel_ir import GpuFunc, Pointwise, direct_source, gpu_arg_types, quad_reduce, workgroup_memref
from .kernel_ir import elem_bytes as _elem_bytes
from .nvidia.mma_sync import MmaSync
from .nvidia import wgmma as _wg
from .attention.chain import transposed_source
from .attention.skipping import skipping_loop, two_pass_loop
from .attention.softmax import online_softmax, row_sums
from .nvidia.barriers import NamedBarrier, StageBarriers, block_reduce, named_sync

#: Query rows a workgroup: two consumer warpgroups of 64 rows each.
WARPGROUPS = 2
BLOCK_M = 64 * WARPGROUPS

#: Keys a block.
BLOCK_N = 128

#: An sm_90 SM's registers and shared memory, and the shared memory the driver keeps
#: per workgroup (ncu's "Driver Shared Memory Per Block"): what decides whether two
#: workgroups fit on one SM.
SM_REGISTERS = 65536
SM_SHARED_BYTES = 228 * 1024
DRIVER_SHARED_BYTES = 1024

#: The least head dim whose unmasked kernel takes three stages of K and V (and with
#: them the producer warpgroup): at 64 two stages let two workgroups share an SM, which
#: pays more. The walk over a mask's live blocks takes three stages from 64.
THREE_STAGES_FROM = 128
WALK_THREE_STAGES_FROM = 64

#: A persistent kernel only where the keys and values of the tiles that run at once (one
#: an SM: multiprocessors / query blocks heads, each Sk x (D + Dv) elements) take at most
#: this much of L2 (50 MiB on the H200): a workgroup takes its tiles whatever the others
#: do, so over many tiles they drift apart, and beyond this the tiles in flight no longer
#: share their heads' keys and values in L2.
PERSISTENT_WINDOW_BYTES = 12 << 20

#: i64 slots after the barriers (the persistent walk): the claimed tile, its walk, whole
#: and causal masks (consumers), and two slots for the producer's claim (by tile parity).
WALK_INFO_SLOTS = 6

#: Registers a thread of the consumer and of the producer warpgroups (``setmaxnreg``;
#: multiples of 8, 2 x 128 x 240 + 128 x 24 = 64512 of the SM's 65536).
CONSUMER_REGISTERS, PRODUCER_REGISTERS = 240, 24

#: Where the scores are linear and the producer warpgroup overlaps products with the
#: softmax, the running row maxima move only when a row of the warp would gain more than
#: this (log2 units: P then up to 2^8, which bf16 and f16 hold, and O and l in f32 keep
#: their sums; fp8 less, ``_lazy_threshold``), and O's rescale (Dv / 2 FMULs a thread a
#: block) is skipped where they did not -- exact, as O and l share the maxima they were
#: summed under (FlashAttention-4's conditional rescaling).
LAZY_RESCALE = 8.0


@dataclass(frozen=True)
class AttentionVariant:
    """The attention kernels' variants (``kf-tile{attention.<field>=<value>}``)."""

    #: where blocks may be skipped and tiles are not claimed in turn, workgroups take the
    #: query blocks last to first: under a causal mask the last query blocks have the most
    #: live key blocks, and started first they do not trail the grid (workgroups start in
    #: block index order)
    reverse_q_blocks: bool = True


def plan(ch, target: TargetInfo, skip: bool, variant: AttentionVariant) -> dict | None:
    """The wgmma attention plan, or None where the mma.sync kernel stays: not sm_90a,
    q/k/v not f16/bf16 arguments read as they lie (K through its transpose), head dims
    not multiples of 64 (whole 128-byte swizzled rows) up to 256, or shared memory short."""
    if not _wg.available(target):
        return None
    view = ch.view
    elems = {spec_of(x.type).elem for x in (ch.q, ch.kt, ch.v)}
    if len(elems) != 1 or (elem := elems.pop()) not in ("f16", "bf16") + tuple(FP8_ELEMS):
        return None
    fp8 = elem in FP8_ELEMS
    d, dv = ch.head_dim, ch.head_dim_v
    if d % 64 or dv % 64 or max(d, dv) > 256:
        return None
    from .kernel_ir import contiguous_last as _contiguous_last

    if view.arg_index(ch.q) is None or not _contiguous_last(view, ch.q):
        return None
    if view.arg_index(transposed_source(ch.kt)) is None or not ch.k_d_contiguous:
        return None
    if fp8:
        if not _fp8_applies(ch, elem):
            return None
    elif view.arg_index(ch.v) is None or not _contiguous_last(view, ch.v):
        return None
    elif _p_scale(ch) is None:
        return None
    bm, bn = BLOCK_M, BLOCK_N
    stages = 2
    esize = 1 if fp8 else 2
    if not skip and ch.mask_cond is None and max(d, dv) >= THREE_STAGES_FROM and \
            esize * (bm * d + 3 * bn * (d + dv)) + _wg.ATOM_BYTES <= target.max_dynamic_shared_bytes:
        stages = 3
    shared = esize * (bm * d + stages * bn * (d + dv)) + _wg.ATOM_BYTES
    if shared > target.max_dynamic_shared_bytes:
        return None
    table = skip and ch.mask_cond is not None and _head_shared_mask(ch)
    if fp8 and (skip or ch.mask_cond is not None):
        return None
    batch = math.prod(ch.batch)
    if batch > 65535:
        return None
    # unmasked, two workgroups an SM where their shared memory fits: ptxas is then held
    # to the registers that two leave a thread (SM_REGISTERS / (2 x threads) = 128),
    # which it otherwise may pass (head dim 64 bf16 took 136 with ex2.approx.ftz: one
    # workgroup an SM). Masked kernels need more (at 128, head dim 64
    # spilled 176 bytes); at exactly half the SM's shared memory ncu reports one
    # workgroup an SM (fp8 head dim 128), hence the strict bound.
    pair_registers = SM_REGISTERS // (2 * 128 * WARPGROUPS)  # (three warpgroups would leave 85)
    pair = not skip and ch.mask_cond is None and 2 * (shared + DRIVER_SHARED_BYTES) < SM_SHARED_BYTES \
        and pair_registers >= 128
    # the producer warpgroup (one more 128-thread warpgroup and the stages' mbarriers),
    # with FlashAttention-3's overlap of a block's P V with the next block's softmax: up
    # to head dim 128 (V's; O, S and two blocks of P spill at 256) and from three key
    # blocks (two, a loop of one trip that LLVM removes, spilled in fp8)
    specialized = stages == 3 and dv <= 128 and ch.seq_k > 2 * bn and \
        shared + _wg.ATOM_BYTES <= target.max_dynamic_shared_bytes
    if specialized:
        shared += _wg.ATOM_BYTES
    # with the block table, the walk over live blocks in three stages with the producer
    walk_shared = esize * (bm * d + 3 * bn * (d + dv)) + 2 * _wg.ATOM_BYTES
    walk = table and -(-ch.seq_k // bn) <= TABLE_WALK_MAX_BLOCKS and \
        max(d, dv) >= WALK_THREE_STAGES_FROM and dv <= 128 and walk_shared <= target.max_dynamic_shared_bytes
    if walk:
        specialized = True
        stages, shared = 3, walk_shared
    grid = [-(-ch.seq_q // bm), batch, 1]
    # persistent: the unmasked producer/consumer kernel, one workgroup an SM over the
    # tiles, while the keys and values the SMs' tiles read at once stay a fraction of L2;
    # not where the keys end inside a block (the producer's per-slot edge tests spilled at
    # its 24 registers)
    window = target.multiprocessors / grid[0] * ch.seq_k * (d + dv) * esize
    persistent = specialized and not table \
        and target.multiprocessors > 0 and window <= PERSISTENT_WINDOW_BYTES and ch.seq_k % bn == 0
    # the walk's, with tiles claimed in turn (whole blocks only: the walk's tails take the
    # serial loop, whose overlap's guards spilled)
    persistent_walk = walk and target.multiprocessors > 0 \
        and window <= PERSISTENT_WINDOW_BYTES and ch.seq_q % bm == 0 and ch.seq_k % bn == 0
    if persistent or persistent_walk:
        grid = [min(grid[0] * batch, target.multiprocessors), 1, 1]
    # heads a group of the claim order: their keys and values within the window, and a
    # divisor of the heads, so that the last group is a whole one
    group = max(1, min(batch, int(PERSISTENT_WINDOW_BYTES // (ch.seq_k * (d + dv) * esize))))
    group = max(g for g in range(1, group + 1) if batch % g == 0)
    return {"block_m": bm, "block_n": bn, "threads": 128 * (WARPGROUPS + specialized), "stages": stages,
            "grid": grid, "shared_bytes": shared, "dynamic_shared": True, "seq_q": ch.seq_q, "seq_k": ch.seq_k,
            "head_dim": d, "head_dim_v": dv, "batch": list(ch.batch), "mma": True, "wgmma": True,
            "skip_masked_blocks": skip, "elem": elem,
            "block_table": [-(-ch.seq_q // bm), -(-ch.seq_k // bn)] if table else [],
            "reverse_q_blocks": bool(variant.reverse_q_blocks and skip and ch.mask_cond is not None
                                     and not persistent_walk),
            "max_registers": pair_registers if pair else 0,
            "overlap_pv": specialized, "warp_specialized": specialized,
            "persistent": [-(-ch.seq_q // bm), batch] if persistent else [],
            "persistent_walk": [-(-ch.seq_q // bm), batch, group] if persistent_walk else []}


FP8_ELEMS = {"f8E4M3FN": "e4m3", "f8E5M2": "e5m2"}


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


def _p_scale(ch) -> float | None:
    """The constant c with mm2's A operand = c * softmax (rounded to its type), 1.0 where
    mm2 reads the softmax itself; None for any other P chain."""
    if getattr(ch, "p_value", ch.sm.result) == ch.sm.result:
        return 1.0
    return getattr(ch, "p_scale", None)


def _reads_per_key(ch) -> bool:
    """Whether the score chain (mm1 to the softmax) reads an operand that varies along
    the keys (a mask, a bias): the fp8 kernel's score columns are keys in
    ``fp8_key_order``, which ``online_softmax`` does not index by."""
    view = ch.view
    seen, stack = set(), [ch.sm.operands[0]]
    while stack:
        v = stack.pop()
        if v in seen or v == ch.mm1.result:
            continue
        seen.add(v)
        i = view.arg_index(v)
        if i is not None:
            shape = view.arg_specs[i].shape
            if shape and shape[-1] != 1:
                return True
            continue
        op = defining(v)
        if op is None:
            continue
        if op.name == "kf.constant" and spec_of(op.result.type).shape and spec_of(op.result.type).shape[-1] != 1:
            return True
        stack.extend(op.operands)
    return False


def _fp8_applies(ch, elem: str) -> bool:
    """The fp8 kernel's conditions: V is the transpose of an argument stored [.., Dv, Sk]
    (K-major), head dims whole 128-byte rows, keys whole blocks (no tail: key order is
    permuted within blocks), no per-key operand in the score chain, and a P chain that
    rounds c * P to q's fp8 type."""
    from .kernel_ir import contiguous_last as _contiguous_last

    if ch.mask_cond is not None:
        return False
    view = ch.view
    vt = transposed_source(ch.v)
    if vt == ch.v or view.arg_index(vt) is None or not _contiguous_last(view, vt):
        return False
    if ch.head_dim % 128 or ch.seq_k % BLOCK_N or _reads_per_key(ch):
        return False
    return getattr(ch, "p_elem", None) == elem and _p_scale(ch) is not None


def _linear_factors(ch, scores: ir.Value | None = None) -> list[tuple[ir.Value, bool]] | None:
    """The rank-0 values the chain from q k^T to the softmax (or to ``scores``: the
    scores before a mask) multiplies (False) or divides (True) the scores by, in order,
    when that is all it does besides casts between floats; None otherwise (a mask, a
    bias, any other op)."""
    v, factors = scores if scores is not None else ch.sm.operands[0], []
    while v != ch.mm1.result:
        op = defining(v)
        if op is None:
            return None
        if op.name == "kf.cast" and spec_of(op.operands[0].type).is_float and spec_of(v.type).is_float:
            v = op.operands[0]
            continue
        if op.name not in ("kf.mul", "kf.div"):
            return None
        a, b = op.operands
        if spec_of(b.type).shape and op.name == "kf.mul" and not spec_of(a.type).shape:
            a, b = b, a
        if spec_of(b.type).shape:
            return None
        factors.append((b, op.name == "kf.div"))
        v = a
    return factors


def _positive_constant(pw: Pointwise, factors) -> float | None:
    """The product of the factors where all are compile-time constants and it is
    positive (then the row maximum may be taken on the unscaled scores)."""
    from .kernel_ir import float_constant as _float_constant

    prod = 1.0
    for x, div in factors:
        c = _float_constant(pw.eval(x, []))
        if c is None or c == 0:
            return None
        prod = prod / c if div else prod * c
    return prod if prod > 0 else None


#: kf ops whose result is >= 0 (or NaN) when their operands are (``_nonnegative``).
_KEEPS_SIGN = {"kf.mul", "kf.div", "kf.add", "kf.min", "kf.cast", "kf.reciprocal", "kf.rsqrt", "kf.sqrt"}
_NONNEGATIVE = {"kf.abs", "kf.exp", "kf.sigmoid", "kf.relu"}


def _nonnegative(v: ir.Value) -> bool:
    """Whether a rank-0 value of the kernel is >= 0 (or NaN) by construction: fills,
    abs, exp, max with something non-negative, and products, quotients, sums, casts of
    such values -- fp8's dequantization factor 1 / ((448 / max(amax_q, eps)) (448 /
    max(amax_k, eps))), which kf-fuse computes in the attention kernel. Arguments are
    not: the caller's scales could be negative."""
    op = defining(v)
    if op is None or spec_of(v.type).shape:
        return False
    if op.name == "kf.fill":
        return op_attrs(op)["value"] >= 0
    if op.name in _NONNEGATIVE:
        return True
    if op.name == "kf.max":
        return any(_nonnegative(x) for x in op.operands)
    if op.name == "kf.pow":
        return _nonnegative(op.operands[0])
    if op.name in _KEEPS_SIGN:
        return all(_nonnegative(x) for x in op.operands)
    return False


def linear_softmax(g: GpuFunc, ch, s, m, l, scale, positive: bool, log2_p: float, tig2, n0, bn: int,
                   lazy: float | None = None, masked: Callable[[int, int], ir.Value] | None = None):
    """``online_softmax`` for scores the chain only scales (``_linear_factors``), in the
    log2 domain: ``scale`` is the factors' product times log2 e, ``m`` the running
    maxima of scaled scores; p = 2^(s scale - m + log2_p) (the P chain's power-of-two
    scale c = 2^log2_p inside the exponent), and l sums those p, so l / c is the sum of
    the unscaled ones. With a positive scale (a constant, or ``_nonnegative`` factors)
    the maximum is taken on the raw scores and each p is one FFMA and one ex2; else
    each score is scaled first.

    ``lazy`` (``LAZY_RESCALE``, log2 units): the running maxima move only when a row of
    the warp would gain more than that, and then every row of the warp takes its own;
    else p is up to 2^lazy and alpha is 1. Returns, after (m, l, alpha, p), whether the
    maxima moved (a warp-uniform i1; None without ``lazy``), so that the caller may skip
    O's rescale (FlashAttention-4's conditional rescaling). ``masked(j, k)``: an i1,
    whether a mask takes score k of 8-key tile j out (-inf)."""
    Sk = ch.seq_k
    neg_inf = g.fconst(-math.inf)
    tail = bool(Sk % bn)
    x = []
    for j in range(bn // 8):
        xj = []
        for k in range(4):
            v = s[j][k] if positive else arith.mulf(s[j][k], scale)
            if tail:
                gj = arith.addi(n0, g.add(tig2, 8 * j + k % 2))
                v = arith.select(g.lt(gj, Sk), v, neg_inf)
            if masked is not None:
                v = arith.select(masked(j, k), neg_inf, v)
            xj.append(v)
        x.append(xj)
    m_new, alpha, shift = [], [], []

    def scale_of(h, mx):
        alpha.append(softmax_exp2(arith.subf(m[h], mx)))
        # a row with no finite score yet (-inf everywhere) takes p = 0, not NaN
        safe = arith.select(arith.cmpf(arith.CmpFPredicate.OEQ, mx, neg_inf), g.fconst(0.0), mx)
        shift.append(arith.subf(g.fconst(log2_p), safe) if log2_p else arith.negf(safe))

    for h in range(2):
        mx = x[0][2 * h]
        for j in range(bn // 8):
            for k in (2 * h, 2 * h + 1):
                if (j, k) != (0, 2 * h):
                    mx = arith.maximumf(mx, x[j][k])
        mx = quad_reduce(mx, arith.maximumf)
        if positive:
            mx = arith.mulf(mx, scale)
        m_new.append(arith.maximumf(m[h], mx))
        if lazy is None:
            scale_of(h, m_new[h])
    moved = None
    if lazy is not None:
        # any row of the warp gaining more than lazy (from -inf: the first block) moves all
        gains = [arith.cmpf(arith.CmpFPredicate.UGT, arith.subf(m_new[h], m[h]), g.fconst(lazy)) for h in range(2)]
        moved = _uniform(arith.ori(*gains))
        m_new = [arith.select(moved, m_new[h], m[h]) for h in range(2)]
        for h in range(2):
            scale_of(h, m_new[h])
    if positive:
        p = [[softmax_exp2(math_fma(x[j][k], scale, shift[k // 2])) for k in range(4)] for j in range(bn // 8)]
    else:
        p = [[softmax_exp2(arith.addf(x[j][k], shift[k // 2])) for k in range(4)] for j in range(bn // 8)]
    if lazy is not None:
        return m_new, row_sums(l, alpha, p), alpha, p, moved
    return m_new, row_sums(l, alpha, p), alpha, p


def math_fma(a: ir.Value, b: ir.Value, c: ir.Value) -> ir.Value:
    return mmath.fma(a, b, c)


def _pack_fp8x4(elem: str, xs: list[ir.Value]) -> ir.Value:
    """Four f32 values rounded (satfinite) to fp8 and packed into a b32, xs[0] in the
    lowest byte: two ``cvt.rn.satfinite.e4m3x2.f32`` (which put their first operand in
    the upper byte) and a ``mov.b32`` of the halves."""
    t = FP8_ELEMS[elem]
    asm = ("{\n.reg .b16 lo, hi;\n"
           f"cvt.rn.satfinite.{t}x2.f32 lo, $2, $1;\n"
           f"cvt.rn.satfinite.{t}x2.f32 hi, $4, $3;\n"
           "mov.b32 $0, {lo, hi};\n}")
    i32 = ir.IntegerType.get_signless(32)
    return llvm.InlineAsmOp(i32, list(xs), asm, "=r,f,f,f,f").res


#: What the block table says of a block: DEAD (the mask masks all of it: skipped at no
#: cost, no test, no copies of its K and V), WHOLE (none of it: the softmax without the
#: mask), CAUSAL (the mask is the causal pattern over the block, masked iff key > query in
#: absolute indices: computed from the indices, not read), PARTIAL (the mask read where
#: the softmax needs it, so any mask stays exact).
DEAD, PARTIAL, WHOLE, CAUSAL = 0, 1, 2, 3


#: The most key blocks a walk over live blocks takes (its bit masks are i64); more take
#: the per-block loop, which loads each block's table entry.
TABLE_WALK_MAX_BLOCKS = 64

def _head_shared_mask(ch) -> bool:
    """Whether the mask condition reads nothing but [.., Sq, Sk] arguments whose leading
    dims are 1: one mask for every head and batch, as a causal mask is, so one table of
    its blocks serves every workgroup."""
    view = ch.view
    seen, stack = set(), [ch.mask_cond]
    while stack:
        v = stack.pop()
        if v in seen:
            continue
        seen.add(v)
        if v == ch.mm1.result:
            return False
        i = view.arg_index(v)
        if i is not None:
            spec = view.arg_specs[i]
            if spec.rank < 2 or tuple(spec.shape[-2:]) != (ch.seq_q, ch.seq_k) or any(x != 1 for x in spec.shape[:-2]):
                return False
            continue
        op = defining(v)
        if op is None:
            return False
        stack.extend(op.operands)
    return True


def _table_columns(nk: int, rows_live: bool) -> int:
    """The block table's columns: a code per key block; with ``rows_live``
    (PERSISTENT_WALK) then ``ROW_WORDS`` words a key block of which query rows see a live
    score there, and the tile counter (row 0's last column)."""
    return nk * (1 + ROW_WORDS) + 1 if rows_live else nk


#: Words of a block's live query rows in the block table (PERSISTENT_WALK): bit e of
#: word 2p + h is row 2 (32 h + e) + p of the query block (the table kernel's threads
#: take rows of one parity a warp; see ``_emit_block_table``).
ROW_WORDS = 4


def _emit_block_table(ch, gpu_module: ir.Operation, target: TargetInfo, bm: int, bn: int,
                      table_t: ir.Type, rows_live: bool = False) -> EmittedKernel:
    """The kernel that writes the block table: a workgroup per (query block, key block),
    its 256 threads reading the block's mask condition, coalesced along the keys; out of
    range positions count as masked (so a tail block is never WHOLE). With
    CAUSAL_BLOCKS a live block that is not whole is CAUSAL where every in-range position
    is masked exactly when its key index exceeds its query index (out of range positions
    do not count: the attention kernel's tail guards decide them before the mask).

    ``rows_live`` (PERSISTENT_WALK): also which query rows see an unmasked in-range score
    in the block (``ROW_WORDS`` words: a warp vote per row, the four warps of a row's
    parity ORed through shared memory; rows past the queries count as live), and
    workgroup (0, 0) zeroes the tile counter, which the attention kernel, launched after
    this one on the same stream, counts up."""
    view = ch.view
    Sq, Sk = ch.seq_q, ch.seq_k
    threads = 256
    i1, i32 = ir.IntegerType.get_signless(1), ir.IntegerType.get_signless(32)
    nq, nk = -(-Sq // bm), -(-Sk // bn)
    name = f"{view.name}_blocks"
    arg_types = gpu_arg_types(view, target)[:len(view.args)] + [table_t]
    warps = threads // 32
    if rows_live and (bn % 32 or threads % bn or bm * bn // threads != 64):
        raise NotApplicable("the block table's live rows take 128-key blocks and 256 threads")
    g = GpuFunc(gpu_module, name, arg_types, [workgroup_memref([2 * warps], i32)] if rows_live else [],
                (threads, 1, 1))
    pw = Pointwise(g, view, g.args[:len(view.args)])
    with ir.InsertionPoint(g.entry):
        tid, kb, qb = g.tid(), g.bid("x"), g.bid("y")
        r0, c0 = g.mul(qb, bm), g.mul(kb, bn)
        true, false = arith.constant(i1, 1), arith.constant(i1, 0)
        lead = [g.c(0)] * (ch.scores.rank - 2)
        live, whole, causal = false, true, true
        row_words = [arith.constant(i32, 0)] * 2  # this warp's rows, e < 32 and e >= 32
        for e in range(bm * bn // threads):
            lin = g.add(tid, e * threads)
            r, c = arith.addi(r0, g.div(lin, bn)), arith.addi(c0, g.rem(lin, bn))
            conds = [x for x in (g.lt(r, Sq) if Sq % bm else None, g.lt(c, Sk) if Sk % bn else None) if x is not None]

            def masked(r=r, c=c):
                pw.reset()
                m = pw.eval(ch.mask_cond, pw.operand_index(spec_of(ch.mask_cond.type).shape, lead + [r, c],
                                                           ch.scores.rank))
                pw.reset()
                above = arith.cmpi(arith.CmpIPredicate.ugt, c, r)  # key past query: causal masks it
                return [m, arith.cmpi(arith.CmpIPredicate.eq, m, above)]

            m, *agrees = g.guarded(g.all_of(conds), [i1] * 2, masked, lambda: [true] * 2)
            live = arith.ori(live, arith.xori(m, true))
            whole = arith.andi(whole, arith.xori(m, true))
            if agrees:
                causal = arith.andi(causal, agrees[0])
            if rows_live:  # the warp's row (2e + its parity): any lane's score live
                seen = nvvm.vote_sync(i1, arith.constant(i32, -1), arith.xori(m, true), nvvm.VoteSyncKind.any)
                if Sq % bm:
                    seen = arith.ori(seen, arith.cmpi(arith.CmpIPredicate.uge, r, g.c(Sq)))
                bit = arith.shli(arith.extui(i32, seen), arith.constant(i32, e % 32))
                row_words[e // 32] = arith.ori(row_words[e // 32], bit)
        if rows_live:
            shared = g.shared[0]
            warp = g.div(tid, 32)
            g.when(arith.cmpi(arith.CmpIPredicate.eq, g.rem(tid, 32), g.c(0)),
                   lambda: [memref.store(w, shared, [g.add(g.mul(warp, 2), h)]) for h, w in enumerate(row_words)])
            gpu.barrier()

            def gather():  # word 2p + h: the OR of the parity p warps' (4p .. 4p + 3) word h
                p, h = g.div(tid, 2), g.rem(tid, 2)
                word = arith.constant(i32, 0)
                for w in range(warps // 2):
                    at = g.add(g.mul(g.add(g.mul(p, warps // 2), w), 2), h)
                    word = arith.ori(word, memref.load(shared, [at]))
                memref.store(word, g.args[-1], [qb, g.add(g.add(g.mul(kb, ROW_WORDS), tid), nk)])

            g.when(g.lt(tid, ROW_WORDS), gather)
            first = arith.andi(arith.cmpi(arith.CmpIPredicate.eq, g.add(kb, qb), g.c(0)),
                               arith.cmpi(arith.CmpIPredicate.eq, tid, g.c(0)))
            g.when(first, lambda: memref.store(arith.constant(i32, 0), g.args[-1],
                                               [g.c(0), g.c(_table_columns(nk, True) - 1)]))
        live, whole = block_reduce(live, "or"), block_reduce(whole, "and")
        partial = arith.constant(i32, PARTIAL)
        partial = arith.select(block_reduce(causal, "and"), arith.constant(i32, CAUSAL), partial)
        code = arith.select(live, arith.select(whole, arith.constant(i32, WHOLE), partial), arith.constant(i32, DEAD))
        g.when(arith.cmpi(arith.CmpIPredicate.eq, tid, g.c(0)), lambda: memref.store(code, g.args[-1], [qb, kb]))
        g.finish()
    return EmittedKernel(name, (nk, nq, 1), (threads, 1, 1), 0, {"strategy": "attention block table"})


def _table_masks(g: GpuFunc, table: ir.Value, qblock: ir.Value, nk: int, tid: ir.Value,
                 names: tuple[str, ...]) -> dict[str, ir.Value]:
    """The workgroup's row of the block table as i64 bit masks (bit j: key block j), of
    ``names`` among ``live``, ``whole`` and ``causal``: lane l of every warp loads entries
    l, l + 32 (one L2 line, shared by the warps) and a ballot a mask and word gathers
    them, so no barrier and no shared memory; the masks are uniform over the workgroup."""
    i32, i64 = ir.IntegerType.get_signless(32), ir.IntegerType.get_signless(64)
    lane = g.rem(tid, 32)
    everyone = arith.constant(i32, -1)
    masks: dict[str, ir.Value] = {}
    for w in range(-(-nk // 32)):
        col = g.add(lane, 32 * w)
        code = memref.load(table, [qblock, arith.minui(col, g.c(nk - 1))])
        inside = g.lt(col, nk) if nk < 32 * (w + 1) else None
        preds = {"live": arith.cmpi(arith.CmpIPredicate.ne, code, arith.constant(i32, DEAD)),
                 "whole": arith.cmpi(arith.CmpIPredicate.eq, code, arith.constant(i32, WHOLE)),
                 "causal": arith.cmpi(arith.CmpIPredicate.eq, code, arith.constant(i32, CAUSAL))}
        for name in names:
            pred = preds[name]
            if inside is not None:
                pred = arith.andi(inside, pred)
            word = arith.extui(i64, nvvm.vote_sync(i32, everyone, pred, nvvm.VoteSyncKind.ballot))
            if w:
                word = arith.shli(word, arith.constant(i64, 32 * w))
            masks[name] = arith.ori(masks[name], word) if name in masks else word
    return masks


def _walk_classes() -> tuple[str, ...]:
    """The ``_table_masks`` a walk over live blocks reads."""
    return ("live", "whole", "causal")


def _every_block(nk: int) -> ir.Value:
    """The i64 bit mask of all nk key blocks (a pass that skips none)."""
    return arith.constant(ir.IntegerType.get_signless(64), (1 << nk) - 1 if nk < 64 else -1)


def _rows_dead(g: GpuFunc, table: ir.Value, qblock: ir.Value, nk: int, tid: ir.Value) -> ir.Value:
    """PERSISTENT_WALK: whether a query row of the workgroup's block sees no live score in
    any key block (the table's row words, ``ROW_WORDS`` a block, ORed over the blocks:
    lane l of every warp loads blocks l, l + 32, ..., and ``redux.sync`` ORs the warp's):
    uniform over the workgroup, no barrier. Such a row's softmax is over its fills, so
    the walk must visit every block."""
    i32 = ir.IntegerType.get_signless(32)
    lane = g.rem(tid, 32)
    zero, everyone = arith.constant(i32, 0), arith.constant(i32, -1)
    words = [zero] * ROW_WORDS
    for w in range(-(-nk // 32)):
        col = g.add(lane, 32 * w)
        at = g.add(g.mul(arith.minui(col, g.c(nk - 1)), ROW_WORDS), nk)
        for h in range(ROW_WORDS):
            x = memref.load(table, [qblock, g.add(at, h)])
            if nk < 32 * (w + 1):
                x = arith.select(g.lt(col, nk), x, zero)
            words[h] = arith.ori(words[h], x)
    dead = arith.constant(ir.IntegerType.get_signless(1), 0)
    for word in words:
        seen = nvvm.redux_sync(i32, word, nvvm.ReduxKind.OR, everyone)
        dead = arith.ori(dead, arith.cmpi(arith.CmpIPredicate.ne, seen, everyone))
    return dead


def _live_count(walk: ir.Value) -> ir.Value:
    """The blocks a walk visits: its bits (an index)."""
    return arith.index_cast(ir.IndexType.get(), llvm.intr_ctpop(walk))


def _live_after(walk: ir.Value, j: ir.Value) -> ir.Value:
    """The walk's blocks past block j (its bits above bit j)."""
    return arith.andi(walk, arith.shli(arith.constant(ir.IntegerType.get_signless(64), -2), j))


def _walk_classes_of(masks: dict[str, ir.Value], j: ir.Value) -> tuple[ir.Value | None, ir.Value | None]:
    """Block j's (unmasked, causal) for ``classified_softmax`` (None where not told apart)."""
    kinds = _block_kinds(masks, j)
    return kinds.get("unmasked"), kinds.get("causal")


def _block_kinds(masks: dict[str, ir.Value], j: ir.Value) -> dict[str, ir.Value]:
    """Block j's classes as ``key_block``'s keywords: ``unmasked`` (whole) and ``causal``."""
    i1 = ir.IntegerType.get_signless(1)
    return {"unmasked": arith.trunci(i1, arith.shrui(masks["whole"], j)),
            "causal": arith.trunci(i1, arith.shrui(masks["causal"], j))}


def _table_walk(g: GpuFunc, ch, table: ir.Value, qblock: ir.Value, nk: int, bn: int, bm: int, tid: ir.Value,
                init: list[ir.Value], rows: list[ir.Value], key_block, copy_block, fence_and_publish) -> list[ir.Value]:
    """The key loop over the live blocks only (TABLE_WALK), from the table's bit masks
    (``_table_masks``), in the skipping loop's two passes (``attention.two_pass_loop``:
    the second, over every block, only for a workgroup with a query row masked
    everywhere). The i-th block walked is in stage i % 2; each step waits for its own
    copies, fences them for the async proxy and passes one barrier (after which nobody
    reads the other stage), then issues the next live block's copies into the other
    stage (the lowest set bit above this block: cttz) and computes. Whole and causal
    blocks are told so (``key_block(..., unmasked=, causal=)``); the table is not read
    again."""
    from mlir.dialects import scf

    i64 = ir.IntegerType.get_signless(64)
    masks = _table_masks(g, table, qblock, nk, tid, _walk_classes())
    every = _every_block(nk)

    def block_start(j):
        return _block_start(g, j, bn)

    def run_pass(allow):
        walk = arith.select(allow, masks["live"], every)
        count = _live_count(walk)
        first = _cttz(walk)
        nvvm.cp_async_wait_group(0)  # a previous pass's last prefetch
        g.when(arith.cmpi(arith.CmpIPredicate.ugt, count, g.c(0)), lambda: copy_block(block_start(first), g.c(0)))
        nvvm.cp_async_commit_group()  # with Q's copies on the first pass
        loop = scf.ForOp(g.c(0), count, g.c(1), list(init) + [first])
        with ir.InsertionPoint(loop.body):
            i, carried = loop.induction_variable, list(loop.inner_iter_args)
            state, j = carried[:-1], carried[-1]
            nvvm.cp_async_wait_group(0)  # this block's K and V
            fence_and_publish()  # and every reader of the other stage is done
            later = _live_after(walk, j)
            nxt = _cttz(later)
            g.when(arith.cmpi(arith.CmpIPredicate.ne, later, arith.constant(i64, 0)),
                   lambda: copy_block(block_start(nxt), g.rem(g.add(i, 1), 2)))
            nvvm.cp_async_commit_group()
            scf.yield_(key_block(block_start(j), state, stage=g.rem(i, 2), **_block_kinds(masks, j)) + [nxt])
        state = list(loop.results)[:-1]
        return state, arith.cmpi(arith.CmpIPredicate.ne, walk, every)

    return two_pass_loop(g, ch, init, rows, bm, run_pass)


#: The largest finite value of each fp8 type (e4m3fn saturates there).
FP8_MAX = {"f8E4M3FN": 448.0, "f8E5M2": 57344.0}

def _lazy_threshold(elem: str, p_scale: float, log2_p: float) -> float | None:
    """LAZY_RESCALE's threshold (log2 units) for P of type ``elem``, or None for every
    block's rescale: P is up to 2^threshold times the P chain's scale c, which fp8 must
    hold (e4m3 at c = 256: 448 / 256 leaves 0.75, in eighths)."""
    if elem not in FP8_MAX:
        return LAZY_RESCALE
    c = 2.0 ** log2_p if log2_p else p_scale
    room = math.floor(math.log2(FP8_MAX[elem] / c) * 8) / 8 if c > 0 else 0.0
    return min(LAZY_RESCALE, room) if room > 0 else None


def _opaque_tid() -> ir.Value:
    """The thread's index (x) as an index, read by inline PTX with side effects: LLVM
    neither hoists it out of a loop nor merges it with another read, so what is
    computed from it stays where it is used (``gpu.thread_id`` is a pure intrinsic)."""
    i32 = ir.IntegerType.get_signless(32)
    r = llvm.InlineAsmOp(i32, [], "mov.u32 $0, %tid.x;", "=r", has_side_effects=True).res
    return arith.index_cast(ir.IndexType.get(), r)


def _cttz(x: ir.Value) -> ir.Value:
    """The lowest set bit's index of an i64 (64 for 0; math.cttz and ctpop have no NVVM
    lowering in MLIR 22)."""
    return llvm.intr_cttz(x, False)


def _block_start(g: GpuFunc, j: ir.Value, bn: int) -> ir.Value:
    """Key block j's (i64) first key, as an index."""
    return g.mul(arith.index_cast(ir.IndexType.get(), j), bn)


def _uniform(pred: ir.Value) -> ir.Value:
    """``pred``, the same in every lane, as a warp vote's result (``vote.sync.ballot``
    != 0), which ptxas knows to be uniform over the warp. The key loops' branches around
    products (which kind of softmax a block takes; in the per-block loop, whether the
    block runs at all) test such votes: their conditions are the same in every thread
    (table entries, bar.red results), but where ptxas cannot tell, a wgmma whose register
    operands come out of a branch it thinks divergent makes it serialize every wgmma of
    the kernel (C7520)."""
    i32 = ir.IntegerType.get_signless(32)
    b = nvvm.vote_sync(i32, arith.constant(i32, -1), pred, nvvm.VoteSyncKind.ballot)
    return arith.cmpi(arith.CmpIPredicate.ne, b, arith.constant(i32, 0))


def emit(strategy, ch, kernel: ir.Operation, plan: dict, gpu_module: ir.Operation, target: TargetInfo) -> EmittedKernel:
    """The wgmma attention kernel of a ``plan()`` plan (see the module docstring)."""
    view = ch.view
    bm, bn, threads, stages = plan["block_m"], plan["block_n"], plan["threads"], plan["stages"]
    D, Dv, Sq, Sk = ch.head_dim, ch.head_dim_v, ch.seq_q, ch.seq_k
    elem = spec_of(ch.q.type).elem
    et = ir.Type.parse(elem)
    fp8 = elem in FP8_ELEMS
    esize = 1 if fp8 else 2
    k_inst = 32 // esize  # k of one wgmma: 16, 32 for fp8
    per_row = _wg.SWIZZLE_BYTES // esize
    p_scale = _p_scale(ch)
    i64 = ir.IntegerType.get_signless(64)
    f32 = ir.F32Type.get()
    s_t = ir.Type.parse("!llvm.struct<(" + ", ".join(["f32"] * (bn // 2)) + ")>")
    o_t = ir.Type.parse("!llvm.struct<(" + ", ".join(["f32"] * (Dv // 2)) + ")>")
    s_attrs = _wg.wgmma_attrs(elem, bn, k_inst, False)
    n_in = len(view.args)
    specialized = plan.get("warp_specialized", False)
    table_shape = plan.get("block_table") if plan.get("skip_masked_blocks") and (stages == 2 or specialized) else None
    arg_types = gpu_arg_types(view, target)
    prelude = None
    walk_persistent = plan.get("persistent_walk") if table_shape else None
    with kernel.location:
        if table_shape:
            i32 = ir.IntegerType.get_signless(32)
            table_t = ir.MemRefType.get([table_shape[0], _table_columns(table_shape[1], bool(walk_persistent))], i32)
            prelude = _emit_block_table(ch, gpu_module, target, bm, bn, table_t, rows_live=bool(walk_persistent))
            arg_types = arg_types[:n_in] + [table_t] + arg_types[n_in:]
        g = GpuFunc(gpu_module, view.name, arg_types, [], (threads, 1, 1))  # window: _carve_aligned
        if plan.get("max_registers"):
            g.op.attributes["nvvm.maxnreg"] = ir.IntegerAttr.get(ir.IntegerType.get_signless(32), plan["max_registers"])
        table = g.args[n_in] if table_shape else None
        out_mem = g.args[n_in + (1 if table_shape else 0)]
        pw = Pointwise(g, view, g.args[:n_in])
        zero, neg_inf = g.fconst(0.0), g.fconst(-math.inf)
        tc = MmaSync(elem)
        nb = len(ch.batch)
        with ir.InsertionPoint(g.entry):
            # Q: bm rows x D; K: bn rows x D a stage; V: bn k-rows x Dv a stage (MN-major)
            reuses_q = bool(plan.get("persistent") or walk_persistent)  # Q refilled a tile
            n_barriers = StageBarriers.size(stages, bool(table_shape), reuses_q)
            Qs, Ks, Vs, *Ms = _wg.carve_aligned(
                g, [(bm * D // per_row, per_row, et), (stages * bn * D // per_row, per_row, et),
                    (stages * bn * Dv // per_row, per_row, et)]
                + ([(1, n_barriers + (WALK_INFO_SLOTS if walk_persistent else 0), i64)] if specialized else []))
            # with the table, a barrier for Q too: a workgroup may walk no block; PERSISTENT:
            # one on which the consumers give Q back for the next tile
            barrier_mem = Ms.pop() if specialized else None
            barriers = StageBarriers(g, barrier_mem, stages, bool(table_shape),
                                     q_free=reuses_q) if specialized else None
            tid = g.tid()
            persistent = plan.get("persistent")
            qblock = g.bid("x")
            if plan.get("reverse_q_blocks"):  # the last query blocks, with the most live keys, first
                qblock = arith.subi(g.c(plan["grid"][0] - 1), qblock)
            batch = g.bid("y")
            n_tiles = persistent[0] * persistent[1] if persistent else 0

            def tile_of(t: ir.Value) -> tuple[ir.Value, ir.Value]:
                """PERSISTENT: tile t's query block and batch (linear index), query blocks
                fastest (a head's tiles run side by side and share its K and V in L2)."""
                return g.rem(t, persistent[0]), g.div(t, persistent[0])

            def walk_tile_of(u: ir.Value) -> tuple[ir.Value, ir.Value]:
                """PERSISTENT_WALK: the u-th tile claimed: heads in groups of ``group``
                (the last may be smaller), a group's tiles by query block last to first,
                then by head."""
                nq, heads, group = walk_persistent
                per_group = group * nq
                first = g.mul(g.div(u, per_group), group)
                size = arith.minui(g.c(group), arith.subi(g.c(heads), first))
                within = g.rem(u, per_group)
                block = arith.subi(g.c(nq - 1), arith.divui(within, size))
                return block, arith.addi(first, arith.remui(within, size))

            if persistent:  # the first tile's (the loops place each: ``place_tile``)
                qblock, batch = tile_of(qblock)
            batch_idx = g.delinearize(batch, ch.batch) if ch.batch else []
            warp, lane = g.div(tid, 32), g.rem(tid, 32)
            wg = g.div(warp, 4)
            gid, tig2 = g.div(lane, 4), g.mul(g.rem(lane, 4), 2)
            q0 = rows = q_direct = k_direct = v_direct = None

            def place_rows() -> None:
                """The tile's first query row and each thread's two rows."""
                nonlocal q0, rows
                q0 = g.mul(qblock, bm)
                r0 = arith.addi(q0, arith.addi(g.mul(wg, 64), arith.addi(g.mul(g.rem(warp, 4), 16), gid)))
                rows = [r0, g.add(r0, 8)]

            def place_sources() -> None:
                """Where the tile's Q, K and V lie."""
                nonlocal q_direct, k_direct, v_direct
                q_direct = direct_source(view, g.args[:n_in], ch.q, lead(ch.q), False)
                k_direct = direct_source(view, g.args[:n_in], ch.kt, lead(ch.kt), True)
                # fp8: V^T as stored ([.., Dv, Sk], K-major for the second product)
                v_direct = direct_source(view, g.args[:n_in], ch.v, lead(ch.v), fp8)

            def place_tile(t: ir.Value) -> None:
                """PERSISTENT: the workgroup's tile t (``tile_of``; PERSISTENT_WALK: the
                t-th claimed, ``walk_tile_of``) and what follows from it, set again for
                each tile."""
                nonlocal qblock, batch_idx, s_lead
                qblock, batch = (walk_tile_of if walk_persistent else tile_of)(t)
                batch_idx = g.delinearize(batch, ch.batch) if ch.batch else []
                s_lead = pw.operand_index(ch.scores.shape[:-2], batch_idx, nb)
                place_rows()
                place_sources()

            def lead(value):
                return pw.operand_index(spec_of(value.type).shape[:-2], batch_idx, nb)

            place_rows()
            pw.reciprocal_of_constants = True
            pw.hoist_scalars()
            factors = _linear_factors(ch) if ch.mask_cond is None else None

            def linear_scale(factors):
                """(the factors' product times log2 e, whether the maximum may be taken
                on the raw scores) for ``linear_softmax``."""
                positive = _positive_constant(pw, factors)
                if positive is not None:
                    return g.fconst(positive * math.log2(math.e)), True
                scale = g.fconst(math.log2(math.e))
                for x, div in factors:
                    xv = scalar_math.convert(pw.eval(x, []), f32)
                    scale = arith.divf(scale, xv) if div else arith.mulf(scale, xv)
                if all(_nonnegative(x) for x, _ in factors):
                    # >= 0, so the row maximum may be taken on the raw scores (one
                    # FMUL a score fewer); at least the least normal float, so that
                    # a zero cannot make a ragged tail's -inf * 0 a NaN
                    return arith.maximumf(scale, g.fconst(2.0 ** -126)), True
                return scale, False

            linear, log2_p = None, 0.0
            if factors is not None:
                linear = linear_scale(factors)
                e = math.frexp(p_scale)
                if p_scale > 0 and e[0] == 0.5:  # a power of two: into the exponent
                    log2_p = float(e[1] - 1)

            place_sources()
            if None in (q_direct, k_direct, v_direct):
                raise NotApplicable("the wgmma attention plan reads q, k and v straight from arguments")
            # LEAN_COPIES' four more registers through the loop made the kernels held to
            # 128 (two workgroups an SM, head dim 64) spill 8 bytes, and fp8 head dim 256
            # over two key blocks (a loop of one trip, which LLVM removes) 92
            lean = not plan.get("max_registers") and Sk > 2 * bn and not specialized
            q_tile = _wg.SwizzledTile(g, tid, threads, Qs, q_direct, bm, D, esize, Sq, D, False, width=D, lean=False)

            def kv_tiles(tid, threads, lean, producer=False):
                """K's and V's SwizzledTiles, copied by ``threads`` threads (``tid`` from 0);
                ``producer``: WARP_SPECIALIZED's (see SwizzledTile)."""
                k = _wg.SwizzledTile(g, tid, threads, Ks, k_direct, bn, D, esize, Sk, D, False, width=D,
                                     row_perm=(lambda j: fp8_key_order(j, g)) if fp8 else None, lean=lean,
                                     producer=producer)
                if fp8:  # V^T, K-major
                    return k, _wg.SwizzledTile(g, tid, threads, Vs, v_direct, Dv, bn, esize, Dv, Sk, False,
                                               width=bn, lean=lean, producer=producer)
                return k, _wg.SwizzledTile(g, tid, threads, Vs, v_direct, Dv, bn, esize, Dv, Sk, True, lean=lean,
                                           producer=producer)

            # WARP_SPECIALIZED: copied by the consumers where they copy (the walk's second pass)
            k_tile, v_tile = kv_tiles(tid, 256 if specialized else threads, lean)
            s_lead = pw.operand_index(ch.scores.shape[:-2], batch_idx, nb)
            n_o = Dv // 8
            n_blocks = -(-Sk // bn)
            q_desc = arith.addi(q_tile.descriptor_base(), arith.index_cast(i64, g.mul(wg, 64 * _wg.SWIZZLE_BYTES // 16)))
            k_desc0, v_desc0 = k_tile.descriptor_base(), v_tile.descriptor_base()
            log2e = g.fconst(math.log2(math.e))

            def exp(x):  # (masked and general chains: with ex2.approx.ftz the masked kernel spilled)
                return mmath.exp2(arith.mulf(x, log2e))

            def sync():
                """A barrier of every thread that computes (WARP_SPECIALIZED: the 256 of the
                consumer warpgroups; else the workgroup)."""
                if specialized:
                    named_sync(NamedBarrier.CONSUMERS, 256)
                else:
                    gpu.barrier()

            def fence_and_publish():
                nvvm.FenceProxyOp(ir.Attribute.parse("#nvvm.proxy_kind<async.shared>"),
                                  space=ir.Attribute.parse("#nvvm.shared_space<cta>"))
                sync()

            def issue_scores(stage):
                """S = Q K^T of the block in ``stage``: the wgmmas issued and committed as
                one group, not waited for (the accumulator struct)."""
                k_d = arith.addi(k_desc0, arith.index_cast(i64, g.mul(stage, k_tile.stage_bytes // 16)))
                nvvm.wgmma_fence_aligned()
                acc = llvm.mlir_zero(s_t)
                for t in range(D // k_inst):
                    acc = nvvm.WgmmaMmaAsyncOp(
                        s_t, acc, arith.addi(q_desc, _wg.i64_const(q_tile.slice_offset(t, k_inst) // 16)),
                        arith.addi(k_d, _wg.i64_const(k_tile.slice_offset(t, k_inst) // 16)), *s_attrs).result
                nvvm.wgmma_commit_group_sync_aligned()
                return acc

            def p_operands(p):
                """P (f32, the softmax's C layout) as the register A operands of P V: a
                function of kk that emits the 4 x b32 of the kk-th wgmma (16 keys; fp8: 32
                keys in ``fp8_key_order``), times the P chain's scale, rounded to the
                input type and packed. Emitted where each wgmma is issued, ptxas needs
                fewer registers (all of them first: head dim 64 spilled 12 bytes)."""
                if p_scale != 1.0 and not log2_p:  # the P chain (precision policy): c * p, rounded below
                    c = g.fconst(p_scale)
                    p = [[arith.mulf(v, c) for v in pj] for pj in p]

                def part(kk):
                    if fp8:
                        # rows gid (0) and gid + 8 (1) of key columns 4t.. and 16 + 4t.. (fp8_key_order)
                        q4 = p[4 * kk: 4 * kk + 4]
                        return [_pack_fp8x4(elem, [q4[2 * hi][2 * h], q4[2 * hi][2 * h + 1],
                                                   q4[2 * hi + 1][2 * h], q4[2 * hi + 1][2 * h + 1]])
                                for hi in range(2) for h in range(2)]
                    pe = [[scalar_math.convert(v, et) for v in p[2 * kk + i]] for i in range(2)]
                    a = [tc.pack(pe[0][0], pe[0][1]), tc.pack(pe[0][2], pe[0][3]),
                         tc.pack(pe[1][0], pe[1][1]), tc.pack(pe[1][2], pe[1][3])]
                    return [x if elem != "f16" else llvm.bitcast(ir.IntegerType.get_signless(32), x) for x in a]
                return part

            def packed(p):
                """``p_operands`` emitted at once, flat (the pipelined loop carries them)."""
                part = p_operands(p)
                return [x for kk in range(bn // k_inst) for x in part(kk)]

            def issue_pv(o, a, stage, fence=True):
                """O += P V of the block in ``stage``: the register-A wgmmas issued and
                committed as one group, not waited for. ``a``: ``p_operands``'s function,
                or the flat list of ``packed``. ``fence``: the wgmma fence first (else the
                caller has placed it)."""
                part = a if callable(a) else (lambda kk: a[4 * kk: 4 * kk + 4])
                v_d = arith.addi(v_desc0, arith.index_cast(i64, g.mul(stage, v_tile.stage_bytes // 16)))
                if fence:
                    nvvm.wgmma_fence_aligned()
                for kk in range(bn // k_inst):
                    o = _wg.register_a_wgmma(o, Dv, elem, part(kk),
                                          arith.addi(v_d, _wg.i64_const(v_tile.slice_offset(kk, k_inst) // 16)))
                nvvm.wgmma_commit_group_sync_aligned()
                return o

            def block_softmax(n0, acc, m, l, score_in=None, causal_mask=False, lazy=None):
                """The online softmax of a key block's S accumulator: (m, l, alpha, p), and
                with ``lazy`` (linear scores only) whether the maxima moved."""
                s = [[llvm.extractvalue(f32, acc, [4 * j + k]) for k in range(4)] for j in range(bn // 8)]
                if linear is not None:
                    return linear_softmax(g, ch, s, m, l, linear[0], linear[1], log2_p, tig2, n0, bn, lazy)
                return online_softmax(g, pw, ch, s, m, l, rows, tig2, n0, bm, bn, s_lead, exp, score_in,
                                      causal=causal_mask)

            def rescale(o, alpha):
                """O *= alpha (the rows' rescale), in the accumulator registers."""
                ov = [arith.mulf(llvm.extractvalue(f32, o, [i]), alpha[(i % 4) // 2]) for i in range(Dv // 2)]
                o = llvm.mlir_undef(o_t)
                for i, v in enumerate(ov):
                    o = llvm.insertvalue(o, v, [i])
                return o

            masked_linear = None
            if specialized and ch.mask_cond is not None:
                whole_factors = _linear_factors(ch, ch.unmasked_scores)
                masked_linear = linear_scale(whole_factors) if whole_factors is not None else None

            def classified_softmax(n0, acc, m, l, unmasked=None, causal=None):
                """``block_softmax`` of a block the mask may leave alone (``unmasked``) or
                give the causal pattern (``causal``): uniform branches over the three.
                With ``masked_linear`` (the walk's blocks) the first two take
                ``linear_softmax``, in the log2 domain: m is kept in the scores' units
                (the mask's fill compares with it), so it is scaled by log2 e into it and
                back out."""
                def softmax(score_in=None, causal_mask=False):
                    if masked_linear is not None and (score_in is not None or causal_mask):
                        s = [[llvm.extractvalue(f32, acc, [4 * j + k]) for k in range(4)] for j in range(bn // 8)]
                        masked = None
                        if causal_mask:  # key n0 + 2 tig + c past query row: c > row - n0 - 2 tig
                            i32 = ir.IntegerType.get_signless(32)
                            offsets = [arith.index_cast(i32, arith.subi(gi, arith.addi(n0, tig2))) for gi in rows]
                            masked = lambda j, k: arith.cmpi(arith.CmpIPredicate.slt, offsets[k // 2],  # noqa: E731
                                                             arith.constant(i32, 8 * j + k % 2))
                        m2 = [arith.mulf(x, log2e) for x in m]
                        m_, l_, a_, p_ = linear_softmax(g, ch, s, m2, l, masked_linear[0], masked_linear[1], 0.0,
                                                        tig2, n0, bn, masked=masked)
                        m_ = [arith.mulf(x, g.fconst(math.log(2.0))) for x in m_]
                    else:
                        m_, l_, a_, p_ = block_softmax(n0, acc, m, l, score_in, causal_mask)
                    return m_ + l_ + a_ + [x for pj in p_ for x in pj]

                flat_types = [f32] * (6 + bn // 2)
                uniform = _uniform

                def masked_softmax():
                    if causal is None:
                        return softmax()
                    return g.guarded(uniform(causal), flat_types, lambda: softmax(causal_mask=True), softmax)

                if unmasked is None:
                    flat = masked_softmax()
                else:
                    flat = g.guarded(uniform(unmasked), flat_types, lambda: softmax(ch.unmasked_scores), masked_softmax)
                return flat[0:2], flat[2:4], flat[4:6], [flat[6 + 4 * j: 10 + 4 * j] for j in range(bn // 8)]

            def key_block(n0, carried, stage=None, unmasked=None, causal=None, scores=None):
                """One key block; ``stage``: the block is already in that stage (the
                pipelined loops). Without, it is staged here into stage 0. ``unmasked``:
                whether the mask leaves the whole block alone (its scores then skip it);
                ``causal``: whether it is the causal pattern there (computed, not read).
                ``scores``: its S accumulator, issued earlier (``OVERLAP_SCORES``) and
                complete; the wgmma wait at the end then also completes the next block's."""
                m, l, o = carried[0:2], carried[2:4], carried[4]
                if stage is None:
                    sync()  # the previous block's readers are done
                    k_tile.copy_async(n0, 0, 0)
                    v_tile.copy_async(0, n0, 0)
                    nvvm.cp_async_commit_group()
                    nvvm.cp_async_wait_group(0)
                    fence_and_publish()
                    stage = g.c(0)
                acc = scores
                if acc is None:
                    acc = issue_scores(stage)
                    nvvm.wgmma_wait_group_sync_aligned(0)
                m_new, l_new, alpha, p = classified_softmax(n0, acc, m, l, unmasked, causal)
                o = rescale(o, alpha)
                nvvm.wgmma_fence_aligned()  # before P's rounding, as ptxas then needs fewer registers
                o = issue_pv(o, p_operands(p), stage, fence=False)
                nvvm.wgmma_wait_group_sync_aligned(0)
                return m_new + l_new + [o]

            def first_scores(base=None):
                """The three-stage loops' start: blocks 0 and 1 copied into stages 0 and 1
                (block 0 with Q; by the producer where ``barriers``), block 0's S = Q K^T
                computed and waited for. ``base``: block 0 is the pipeline's block base
                (PERSISTENT)."""
                if barriers is not None:
                    barriers.wait_full(g.c(0) if base is None else base)
                else:
                    for j in range(2):
                        k_tile.copy_async(j * bn, 0, j)
                        v_tile.copy_async(0, j * bn, j)
                        nvvm.cp_async_commit_group()  # block 0 with Q
                    nvvm.cp_async_wait_group(1)
                    fence_and_publish()
                first = issue_scores(g.c(0) if base is None else g.rem(base, 3))
                nvvm.wgmma_wait_group_sync_aligned(0)
                return first

            def rescaled(o, alpha, moved):
                """``rescale``, skipped where ``moved`` (LAZY_RESCALE's warp vote) is false:
                alpha is 1 there."""
                if moved is None:
                    return rescale(o, alpha)
                return g.guarded(moved, [o_t], lambda: [rescale(o, alpha)], lambda: [o])[0]

            def pipelined(walk=None, classes=None, base=None):
                """The producer/consumer kernel's key loop (FlashAttention-3's intra-warpgroup pipeline):
                block j's S and block j - 1's O += P V are issued together, S is waited for
                alone before its softmax, P V after it. K and V in three stages: j - 1 (V
                read by P V), j (K read by S), j + 1 (copies in flight). ptxas hoists the
                wait for P V above the softmax's exponentials (the row maxima overlap P V,
                the rest does not; seen in the SASS, not in the PTX); waiting for it at
                the top of the next iteration instead kept the whole softmax in the
                overlap but was slower. P_j is rounded after the
                wait: its loop-carried registers are those P V of block j - 1 reads, and
                ptxas serializes every wgmma (C7513) where an instruction writes them
                before that P V is done. The producer warpgroup copies; a block is waited
                for on its full mbarrier, and its stage given back on its empty one once
                its P V is complete.

                ``walk`` (with the block table): the live key blocks
                only, an i64 bit mask with at least one bit set; the i-th of them is in
                stage i % 3, and ``classes(j)`` gives block j's (unmasked, causal) for
                ``classified_softmax``. ``base`` (persistent kernels): key block
                j (the walk's j-th block) is the pipeline's block base + j; Q is given
                back once the tile's last S is complete, and the last block after its
                P V."""
                lazy = _lazy_threshold(elem, p_scale, log2_p) if linear is not None else None

                def at(i):  # the pipeline's index of the walk's i-th block
                    return i if base is None else arith.addi(base, i)
                if walk is None:
                    first = first_scores(base)
                    m, l, _, p = block_softmax(g.c(0), first, init[0:2], init[2:4])[:4]
                    carried = m + l + [init[4]] + packed(p)
                else:
                    count = _live_count(walk)
                    j0 = _cttz(walk)
                    barriers.wait_full(at(g.c(0)))
                    first = issue_scores(g.c(0) if base is None else g.rem(base, 3))
                    nvvm.wgmma_wait_group_sync_aligned(0)
                    if base is not None:  # a walk of one block: its S was the tile's last
                        g.when(arith.cmpi(arith.CmpIPredicate.eq, count, g.c(1)), barriers.release_q)
                    m, l, _, p = classified_softmax(_block_start(g, j0, bn), first, init[0:2], init[2:4], *classes(j0))
                    carried = m + l + [init[4]] + packed(p) + [j0]

                def walked(i, c):
                    """The i-th live block (i >= 1) after block c[-1]."""
                    m, l, o, a, prev = c[0:2], c[2:4], c[4], c[5:-1], c[-1]
                    j = _cttz(_live_after(walk, prev))
                    barriers.wait_full(at(i))
                    acc = issue_scores(g.rem(at(i), 3))
                    o = issue_pv(o, a, g.rem(g.add(at(i), 2), 3))  # the block before
                    nvvm.wgmma_wait_group_sync_aligned(1)
                    if base is not None:
                        g.when(arith.cmpi(arith.CmpIPredicate.eq, i, arith.subi(count, g.c(1))), barriers.release_q)
                    m, l, alpha, p = classified_softmax(_block_start(g, j, bn), acc, m, l, *classes(j))
                    nvvm.wgmma_wait_group_sync_aligned(0)
                    barriers.release(arith.subi(at(i), g.c(1)))
                    return m + l + [rescale(o, alpha)] + packed(p) + [j]

                if walk is not None:
                    loop = scf.ForOp(g.c(1), count, g.c(1), carried)
                    with ir.InsertionPoint(loop.body):
                        scf.yield_(walked(loop.induction_variable, list(loop.inner_iter_args)))
                    c = list(loop.results)
                    o = issue_pv(c[4], c[5:-1], g.rem(arith.addi(at(count), g.c(2)), 3))
                    nvvm.wgmma_wait_group_sync_aligned(0)
                    if base is not None:
                        barriers.release(arith.subi(at(count), g.c(1)))
                    return c[0:4] + [o]

                def step(n0, c):
                    m, l, o, a = c[0:2], c[2:4], c[4], c[5:]
                    j = g.div(n0, bn)
                    if base is not None:
                        j = arith.addi(base, j)
                    barriers.wait_full(j)
                    acc = issue_scores(g.rem(j, 3))
                    o = issue_pv(o, a, g.rem(g.add(j, 2), 3))  # block j - 1
                    nvvm.wgmma_wait_group_sync_aligned(1)  # S (groups complete in order)
                    if base is not None:  # the tile's last S is complete: Q may be refilled
                        g.when(arith.cmpi(arith.CmpIPredicate.eq, n0, g.c((n_blocks - 1) * bn)), barriers.release_q)
                    out = block_softmax(n0, acc, m, l, lazy=lazy)
                    m, l, alpha, p = out[:4]
                    nvvm.wgmma_wait_group_sync_aligned(0)
                    barriers.release(arith.subi(j, g.c(1)))  # block j - 1 is read
                    return m + l + [rescaled(o, alpha, out[4] if lazy else None)] + packed(p)

                c = g.loop(bn, Sk, bn, carried, step)
                if base is not None:
                    last = g.add(base, n_blocks - 1)
                    o = issue_pv(c[4], c[5:], g.rem(last, 3))
                else:
                    o = issue_pv(c[4], c[5:], g.c((n_blocks - 1) % 3))
                nvvm.wgmma_wait_group_sync_aligned(0)
                if base is not None:
                    barriers.release(last)
                return c[0:4] + [o]

            def store_output(final):
                """O / l, through the kernel's ops after P V, stored from the accumulators:
                O times 1 / l, the reciprocal once a row (a division a value was a
                slow-path check and call each, 64 a thread: 22% of the consumers' samples
                under ncu at 4x32x2048x128), and each thread's two neighbouring columns
                as one store (the runtime's buffers are 16-byte aligned; the columns'
                offsets and the rows' lengths are even)."""
                totals = [quad_reduce(final[2 + h], arith.addf) for h in range(2)]
                if log2_p:  # l summed c * p (linear_softmax)
                    totals = [arith.mulf(t, g.fconst(2.0 ** -log2_p)) for t in totals]
                epilogue = getattr(ch, "epilogue_value", ch.mm2.result)
                epilogue = None if epilogue == ch.mm2.result else epilogue
                out_elem = ir.MemRefType(out_mem.type).element_type
                pair_t = ir.VectorType.get([2], out_elem)
                o = final[4]
                for h in range(2):
                    def store(h=h):
                        inverse = arith.divf(g.fconst(1.0), totals[h])
                        for n in range(n_o):
                            pair = []
                            for k in (2 * h, 2 * h + 1):
                                v = arith.mulf(llvm.extractvalue(f32, o, [4 * n + k]), inverse)
                                if epilogue is not None:  # ops after P V (fp8: the scales)
                                    pw.reset()
                                    pw.bind(ch.mm2.result, v)
                                    v = pw.eval(epilogue, list(batch_idx) + [rows[h], g.add(tig2, 8 * n + k % 2)])
                                pair.append(emit_to_storage(v, out_elem))
                            vector.store(vector.from_elements(pair_t, pair), out_mem,
                                         list(batch_idx) + [rows[h], g.add(tig2, 8 * n)],
                                         alignment=2 * _elem_bytes(out_elem))

                    g.when(g.lt(rows[h], Sq) if Sq % bm or Sq < bm else None, store)

            def tiles():
                """The producer's copies of the tile placed (``place_tile``): Q, K, V.
                PERSISTENT, PERSISTENT_WALK: their per-thread offsets from a thread index
                read anew (``_opaque_tid``), so that they are computed in each tile rather
                than hoisted out of the tile loop and held in the producer's 24 registers
                (ptxas spilled 16 to 128 bytes)."""
                ptid = arith.subi(_opaque_tid() if reuses_q else tid, g.c(threads - 128))
                # PERSISTENT: lean too (ptxas keeps per-copy addresses through the tile loop)
                q_p = _wg.SwizzledTile(g, ptid, 128, Qs, q_direct, bm, D, esize, Sq, D, False, width=D,
                                       lean=reuses_q, producer=reuses_q)
                # per-copy addresses spilled at 24 registers (528 bytes, 333 keys)
                return (q_p, *kv_tiles(ptid, 128, True, producer=True))

            def copy(i, n0, k_p, v_p):
                """The producer's copies of key block n0 into the stage of the pipeline's
                i-th block, once its last block there is given back."""
                stage = g.rem(i, stages)
                barriers.wait_empty(i)
                k_p.copy_async(n0, 0, stage)
                v_p.copy_async(0, n0, stage)
                barriers.arrive_full(stage)

            def copy_walk(walk, k_p, v_p, base=None):
                """The producer's copies of a walk's blocks: its i-th (cttz of the bits
                above the last) into the stage of the pipeline's block i (PERSISTENT_WALK:
                base + i)."""
                loop = scf.ForOp(g.c(0), _live_count(walk), g.c(1), [_cttz(walk)])
                with ir.InsertionPoint(loop.body):
                    j, i = loop.inner_iter_args[0], loop.induction_variable
                    copy(i if base is None else arith.addi(base, i), _block_start(g, j, bn), k_p, v_p)
                    scf.yield_([_cttz(_live_after(walk, j))])

            def producer(walk_of=None):
                """WARP_SPECIALIZED's third warpgroup: Q, then each key block's K and V into
                stage j % 3 once its empty mbarrier says the consumers are done with block
                j - 3, its full one arrived on as the copies land. ``walk_of()``: the i64
                bit mask of the blocks to copy (the i-th set bit's into stage i % 3); Q
                then has a barrier of its own."""
                nvvm.SetMaxRegisterOp(PRODUCER_REGISTERS, ir.Attribute.parse("#nvvm<action decrease>"))
                walk = walk_of() if walk_of is not None else None

                def key_blocks(k_p, v_p):
                    def block(n0, _):
                        copy(g.div(n0, bn), n0, k_p, v_p)
                        return []

                    g.loop(0, Sk, bn, [], block)

                if persistent:
                    # one loop over the workgroup's tiles' key blocks, i = k x blocks + j:
                    # nested, LLVM unrolled a short inner loop, and ptxas spilled (108
                    # bytes, fp8 with three key blocks)
                    grid = gpu.grid_dim(gpu.Dimension.x)
                    mine = arith.divui(arith.addi(arith.subi(g.c(n_tiles), g.bid("x")),
                                                  arith.subi(grid, g.c(1))), grid)
                    # (an i32 count: as an index, ptxas spilled its 64 bits at 333 keys)
                    i32 = ir.IntegerType.get_signless(32)
                    loop = scf.ForOp(arith.constant(i32, 0), arith.index_cast(i32, g.mul(mine, n_blocks)),
                                     arith.constant(i32, 1), [])
                    with ir.InsertionPoint(loop.body):
                        i = arith.index_cast(ir.IndexType.get(), loop.induction_variable)
                        k, j = g.div(i, n_blocks), g.rem(i, n_blocks)
                        t = arith.addi(g.bid("x"), arith.muli(k, grid))
                        place_tile(t)
                        q_p, k_p, v_p = tiles()

                        def tile_start():  # Q lands with the tile's first block (its full barrier)
                            barriers.wait_q_free(k)
                            q_p.copy_async(q0, 0, 0)

                        g.when(arith.cmpi(arith.CmpIPredicate.eq, j, g.c(0)), tile_start)
                        copy(i, g.mul(j, bn), k_p, v_p)
                        scf.yield_([])
                else:
                    q_p, k_p, v_p = tiles()
                    q_p.copy_async(q0, 0, 0)
                    if walk is None:
                        key_blocks(k_p, v_p)
                    else:
                        barriers.arrive_q()
                        copy_walk(walk, k_p, v_p)
                nvvm.cp_async_commit_group()
                nvvm.cp_async_wait_group(0)

            def tile_loop(body: Callable[[ir.Value], None]) -> None:
                """PERSISTENT: ``body(k)`` for the workgroup's k-th tile t (t = its block
                index + k x the grid), placed (``place_tile``) first."""
                loop = scf.ForOp(g.bid("x"), g.c(n_tiles), gpu.grid_dim(gpu.Dimension.x), [g.c(0)])
                with ir.InsertionPoint(loop.body):
                    t, k = loop.induction_variable, loop.inner_iter_args[0]
                    place_tile(t)
                    body(k)
                    scf.yield_([g.add(k, 1)])

            def split(produce, consume):
                """The producer warpgroup (the last) and the consumers' code, each with its
                registers (setmaxnreg)."""
                op = scf.IfOp(arith.cmpi(arith.CmpIPredicate.uge, tid, g.c(threads - 128)), [], has_else=True)
                with ir.InsertionPoint(op.then_block):
                    produce()
                    scf.yield_([])
                with ir.InsertionPoint(op.else_block):
                    nvvm.SetMaxRegisterOp(CONSUMER_REGISTERS, ir.Attribute.parse("#nvvm<action increase>"))
                    consume()
                    scf.yield_([])

            def walk_consumers():
                """The table walk's consumers (WARP_SPECIALIZED): the first pass over the
                live blocks as the producer copies them (``pipelined``); the second, rare
                (``two_pass_loop``: a query row masked everywhere), over every block,
                copied by the consumers themselves into stage 0, as ``key_block`` does."""
                masks = _table_masks(g, table, qblock, table_shape[1], tid, _walk_classes())
                i64 = ir.IntegerType.get_signless(64)
                types = [v.type for v in init]
                barriers.wait_q()
                classes = functools.partial(_walk_classes_of, masks)

                def serial(walk):
                    """The live blocks, each one's P V waited for before the next block's S."""
                    loop = scf.ForOp(g.c(0), _live_count(walk), g.c(1), list(init) + [_cttz(walk)])
                    with ir.InsertionPoint(loop.body):
                        i, c = loop.induction_variable, list(loop.inner_iter_args)
                        j = c[-1]
                        barriers.wait_full(i)
                        out = key_block(_block_start(g, j, bn), c[:-1], stage=g.rem(i, 3), **_block_kinds(masks, j))
                        barriers.release(i)
                        scf.yield_(out + [_cttz(_live_after(walk, j))])
                    return list(loop.results)[:-1]

                def first_pass():
                    if Sq % bm or Sk % bn:  # tails: the overlap's guards spilled
                        return serial(masks["live"])
                    live = arith.cmpi(arith.CmpIPredicate.ne, masks["live"], arith.constant(i64, 0))
                    return g.guarded(live, types, lambda: pipelined(masks["live"], classes), lambda: list(init))

                def every_block():
                    # the consumers' copy addresses made here: from the kernel's start they
                    # were registers through the first pass (ptxas spilled 176 bytes)
                    nonlocal k_tile, v_tile
                    k_tile, v_tile = kv_tiles(tid, 256, False)

                    def step(n0, c):
                        return key_block(n0, c, **_block_kinds(masks, arith.index_cast(i64, g.div(n0, bn))))
                    return g.loop(0, Sk, bn, list(init), step)

                def run_pass(allow):
                    state = g.guarded(allow, types, first_pass, every_block)
                    return state, arith.cmpi(arith.CmpIPredicate.ne, masks["live"], _every_block(table_shape[1]))

                consumers = (int(NamedBarrier.CONSUMERS), 256)
                store_output(two_pass_loop(g, ch, init, rows, bm, run_pass,
                                           reduce=lambda pred: block_reduce(pred, barrier=consumers)))

            def info(slot: int) -> list[ir.Value]:
                """PERSISTENT_WALK: the index of an i64 slot after the barriers."""
                return [g.c(0), g.c(n_barriers + slot)]

            def claimed(k: ir.Value, leader: ir.Value) -> ir.Value:
                """PERSISTENT_WALK's producer: the workgroup's next tile (its k-th), from the
                table's counter: one thread adds, the producer warpgroup reads it on a named
                barrier of its own (slot by k's parity: a thread still reading the last
                one's is not overwritten); ``leader``: the thread that adds."""
                i32, i64 = ir.IntegerType.get_signless(32), ir.IntegerType.get_signless(64)
                slot = arith.addi(g.c(n_barriers + 4), g.rem(k, 2))

                def take():
                    u = memref.atomic_rmw(arith.AtomicRMWKind.addi, arith.constant(i32, 1), table,
                                          [g.c(0), g.c(_table_columns(table_shape[1], True) - 1)])
                    memref.store(arith.extui(i64, u), barrier_mem, [g.c(0), slot])

                g.when(leader, take)
                named_sync(NamedBarrier.PRODUCER, 128)
                return arith.index_cast(ir.IndexType.get(), memref.load(barrier_mem, [g.c(0), slot]))

            def walk_producer():
                """PERSISTENT_WALK's producer warpgroup: claims tiles (``claimed``) until
                none is left. A tile: its row of the block table (the walk: its live
                blocks, or every block where a query row sees no live score,
                ``_rows_dead``), Q copied once the consumers gave the last tile's back, the
                tile and its masks handed to them in shared memory on Q's barrier
                (``announce_q``), then the walk's K and V as ``producer`` copies them;
                the stages' phases run on across tiles (``base``). At the end the
                consumers get a tile past the last."""
                nvvm.SetMaxRegisterOp(PRODUCER_REGISTERS, ir.Attribute.parse("#nvvm<action decrease>"))
                idx, i64 = ir.IndexType.get(), ir.IntegerType.get_signless(64)
                nq, heads, _ = walk_persistent
                leader = arith.cmpi(arith.CmpIPredicate.eq, tid, g.c(threads - 128))
                nk = table_shape[1]
                loop = scf.WhileOp([idx, idx, idx], [g.c(0), g.c(0)])
                before = loop.before.blocks.append(idx, idx)
                with ir.InsertionPoint(before):
                    k, base = before.arguments
                    u = claimed(k, leader)
                    scf.condition(g.lt(u, nq * heads), [k, base, u])
                after = loop.after.blocks.append(idx, idx, idx)
                with ir.InsertionPoint(after):
                    k, base, u = after.arguments
                    place_tile(u)
                    masks = _table_masks(g, table, qblock, nk, tid, _walk_classes())
                    walk = arith.select(_rows_dead(g, table, qblock, nk, tid), _every_block(nk), masks["live"])
                    q_p, k_p, v_p = tiles()
                    barriers.wait_q_free(k)
                    q_p.copy_async(q0, 0, 0)
                    barriers.arrive_q()

                    def announce():
                        none = arith.constant(i64, 0)
                        for slot, v in enumerate((arith.index_cast(i64, u), walk, masks.get("whole", none),
                                                  masks.get("causal", none))):
                            memref.store(v, barrier_mem, info(slot))
                        barriers.announce_q()

                    g.when(leader, announce)
                    copy_walk(walk, k_p, v_p, base)
                    scf.yield_([g.add(k, 1), arith.addi(base, _live_count(walk))])
                k, u = loop.results[0], loop.results[2]
                barriers.wait_q_free(k)  # the end, as a tile past the last, with Q's arrivals
                barriers.arrive_q()

                def end():
                    memref.store(arith.index_cast(i64, u), barrier_mem, info(0))
                    barriers.announce_q()

                g.when(leader, end)
                nvvm.cp_async_commit_group()
                nvvm.cp_async_wait_group(0)

            def persistent_walk_consumers():
                """PERSISTENT_WALK's consumer warpgroups: a tile as the producer hands it
                over on Q's barrier (k-th fill), its walk ``pipelined`` and its O stored,
                until the tile handed over is past the last."""
                idx = ir.IndexType.get()
                i64 = ir.IntegerType.get_signless(64)
                nq, heads, _ = walk_persistent
                loop = scf.WhileOp([idx, idx, idx, i64, i64, i64], [g.c(0), g.c(0)])
                before = loop.before.blocks.append(idx, idx)
                with ir.InsertionPoint(before):
                    k, base = before.arguments
                    barriers.wait_q(k)
                    u = arith.index_cast(idx, memref.load(barrier_mem, info(0)))
                    masks = [memref.load(barrier_mem, info(slot)) for slot in (1, 2, 3)]
                    scf.condition(g.lt(u, nq * heads), [k, base, u] + masks)
                after = loop.after.blocks.append(idx, idx, idx, i64, i64, i64)
                with ir.InsertionPoint(after):
                    k, base, u, walk, whole, causal = after.arguments
                    place_tile(u)
                    classes = functools.partial(_walk_classes_of, {"live": walk, "whole": whole, "causal": causal})
                    store_output(pipelined(walk, classes, base=base))
                    scf.yield_([g.add(k, 1), arith.addi(base, _live_count(walk))])

            init = [neg_inf, neg_inf, zero, zero, llvm.mlir_zero(o_t)]
            if not specialized:
                q_tile.copy_async(q0, 0, 0)
            skip = plan.get("skip_masked_blocks") and ch.mask_cond is not None
            if skip and specialized and walk_persistent:
                barriers.initialize(128, 256, q_extra=1)  # the producer's announce_q
                final = None
                split(walk_producer, persistent_walk_consumers)
            elif skip and specialized:
                barriers.initialize(128, 256)
                final = None

                split(lambda: producer(lambda: _table_masks(g, table, qblock, table_shape[1], tid, ("live",))["live"]),
                      walk_consumers)
            elif skip:
                def start_pass():
                    """The first block's K and V into stage 0, with Q on the first pass."""
                    nvvm.cp_async_wait_group(0)  # a previous pass's last prefetch
                    k_tile.copy_async(0, 0, 0)
                    v_tile.copy_async(0, 0, 0)
                    nvvm.cp_async_commit_group()

                def table_at(j):
                    return memref.load(table, [qblock, j])

                def block_class(n0):
                    """(live, whole, causal) of a block, from the table: uniform, no test."""
                    code = table_at(g.div(n0, bn))
                    return (arith.cmpi(arith.CmpIPredicate.ne, code, arith.constant(code.type, DEAD)),
                            arith.cmpi(arith.CmpIPredicate.eq, code, arith.constant(code.type, WHOLE)),
                            arith.cmpi(arith.CmpIPredicate.eq, code, arith.constant(code.type, CAUSAL)))

                def stage_block(n0, allow):
                    """The next block's copies into the other stage, and the wait for this
                    block's (issued a block earlier). With the block table, the next
                    block's K and V are copied only if it is live (or nothing is skipped:
                    ``allow`` false, the second pass)."""
                    j = g.div(n0, bn)
                    cur, nxt, n1 = g.rem(j, 2), g.rem(g.add(j, 1), 2), g.add(n0, bn)
                    gpu.barrier()  # every reader of the other stage is done
                    nvvm.cp_async_commit_group()

                    def copy_next():
                        k_tile.copy_async(n1, 0, nxt)
                        v_tile.copy_async(0, n1, nxt)

                    if table is None:
                        copy_next()
                    else:
                        last = table_shape[1] - 1
                        code = table_at(arith.minui(g.add(j, 1), g.c(last)))
                        live = arith.cmpi(arith.CmpIPredicate.ne, code, arith.constant(code.type, DEAD))
                        fetch = arith.andi(g.lt(g.add(j, 1), last + 1),
                                           arith.ori(live, arith.xori(allow, arith.constant(allow.type, 1))))
                        g.when(fetch, copy_next)
                    nvvm.cp_async_commit_group()
                    nvvm.cp_async_wait_group(1)
                    fence_and_publish()
                    return cur

                def copy_block(n0, stage):
                    k_tile.copy_async(n0, 0, stage)
                    v_tile.copy_async(0, n0, stage)

                if table is not None and table_shape[1] <= TABLE_WALK_MAX_BLOCKS:
                    final = _table_walk(g, ch, table, qblock, table_shape[1], bn, bm, tid, init, rows, key_block,
                                        copy_block, fence_and_publish)
                else:
                    final = skipping_loop(g, pw, ch, key_block, init, rows, tig2, bm, bn, s_lead,
                                                    stage_block, start_pass, whole_blocks=True,
                                                    block_class=block_class if table is not None else None,
                                                    uniform=_uniform)
            elif stages == 3 and not plan.get("overlap_pv"):
                # OVERLAP_SCORES: block j + 1's S = Q K^T runs on the tensor cores during
                # block j's softmax. Three stages: j (its V read by P V), j + 1 (its K by
                # the early S), j + 2 (copies in flight).
                first = first_scores()

                def overlapped(n0, carried):
                    j = g.div(n0, bn)
                    nvvm.cp_async_wait_group(0)  # block j + 1
                    # and every warpgroup is done with block j - 1's stage, (j + 2) % 3
                    fence_and_publish()
                    n2 = g.add(n0, 2 * bn)  # past the keys: zero-filled, never read
                    k_tile.copy_async(n2, 0, g.rem(g.add(j, 2), 3))
                    v_tile.copy_async(0, n2, g.rem(g.add(j, 2), 3))
                    nvvm.cp_async_commit_group()
                    # the last block's early S is of a zero-filled stage, and unused
                    nxt = issue_scores(g.rem(g.add(j, 1), 3))
                    return key_block(n0, carried[:-1], g.rem(j, 3), scores=carried[-1]) + [nxt]

                final = g.loop(0, Sk, bn, init + [first], overlapped)[:-1]
            elif stages == 3:
                barriers.initialize(128, 256)
                final = None

                def consumers():
                    if persistent:
                        tile_loop(lambda k: store_output(pipelined(base=g.mul(k, n_blocks))))
                    else:
                        store_output(pipelined())

                split(producer, consumers)
            else:
                k_tile.copy_async(0, 0, 0)
                v_tile.copy_async(0, 0, 0)
                nvvm.cp_async_commit_group()

                def step(n0, carried):
                    j = g.div(n0, bn)
                    nvvm.cp_async_wait_group(0)
                    fence_and_publish()  # also: every warpgroup is done with the other stage
                    nxt = g.rem(g.add(j, 1), 2)
                    n1 = g.add(n0, bn)
                    k_tile.copy_async(n1, 0, nxt)
                    v_tile.copy_async(0, n1, nxt)
                    nvvm.cp_async_commit_group()
                    return key_block(n0, carried, g.rem(j, 2))

                final = g.loop(0, Sk, bn, init, step)
            if final is not None:
                nvvm.cp_async_wait_group(0)
                store_output(final)
        g.finish()
    return EmittedKernel(view.name, tuple(plan["grid"]), (threads, 1, 1), g.dynamic_shared_bytes,
                         {"strategy": "attention", "tensor_cores": f"wgmma.m64n{bn}k{k_inst}+m64n{Dv}k{k_inst}"
                                                                   + (f".{FP8_ELEMS[elem]}" if fp8 else ""),
                          "workgroup_bytes": plan["shared_bytes"], "block_m": bm, "block_n": bn, "stages": stages},
                         prelude=prelude,
                         prelude_output=ir.RankedTensorType.get(ir.MemRefType(table_t).shape, ir.IntegerType.get_signless(32))
                         if table_shape else None)


#: Whether ``linear_softmax`` (the unmasked wgmma kernels) takes 2^x as ``ex2.approx.ftz.f32`` (one
#: MUFU.EX2) rather than ``math.exp2``, which NVPTX lowers to ``ex2.approx.f32``: without
#: ftz, ptxas keeps subnormal results by wrapping each MUFU.EX2 in an FSETP (x < -126),
#: a predicated FMUL by 0.5 before and a predicated squaring after -- three more
#: instructions per score (the fp8 kernel's key loop, sm_90a SASS: 64 MUFU.EX2 beside
#: 262 FMUL and 68 FSETP). Flushed are only probabilities below 2^-126 of the row's
#: maximum, which no bf16 or fp8 P, and no f32 row sum, can tell from 0. The masked
#: wgmma kernel and the mma.sync one keep ``math.exp2``: with it they spilled (8 and 48
#: bytes at their register limits, ptxas 13.0).
FTZ_EXP2 = True


def softmax_exp2(x: ir.Value) -> ir.Value:
    """2^x in f32 for ``linear_softmax`` (``FTZ_EXP2``): ``math.exp2`` with
    ``fastmath<afn>``, which kf-to-cuda makes the ``ex2.approx.ftz`` intrinsic, as it does
    for scalar_math's short forms (passes/to_cuda.py, ``_approximate_math``)."""
    if not FTZ_EXP2:
        return mmath.exp2(x)
    return mmath.exp2(x, fastmath=ir.Attribute.parse(scalar_math.AFN))
