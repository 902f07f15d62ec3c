"""The Hopper attention plan: whether the kernel applies, and its shape.

The workgroup is ``WARPGROUPS`` consumer warpgroups of 64 query rows each, over key blocks
of ``BLOCK_N``; K and V in two stages, or three where shared memory has room (from head
dim ``THREE_STAGES_FROM`` without a mask), and then a producer warpgroup that copies while
the consumers only compute. A mask every head shares gets the block table and, up to
``TABLE_WALK_MAX_BLOCKS`` key blocks, the walk over its live blocks. Persistent kernels
(one workgroup an SM over the tiles) where the keys and values of the tiles in flight stay
within ``PERSISTENT_WINDOW_BYTES`` of L2.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from kf.dialects import spec_of
from kf.dialects.types import defining

from ...base import TargetInfo
from ...kernel_ir import contiguous_last
from ...nvidia import wgmma as _wg
from ...nvidia.mma_sync import FP8_PTX
from ..chain import transposed_source

#: Query rows a workgroup: two consumer warpgroups of 64 rows each.
WARPGROUPS = 2
BLOCK_M = 64 * WARPGROUPS

#: Keys a block.
BLOCK_N = 128

#: Keys a block of a masked kernel with run-time lengths past head dim 64 (its S
#: accumulators then take 32 registers a thread, not 64: see ``plan``).
BOUNDED_MASKED_BLOCK_N = 64

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

#: The most key blocks a walk over live blocks takes (its bit masks are i64); more take
#: the per-block loop, which loads each block's table entry.
TABLE_WALK_MAX_BLOCKS = 64


@dataclass(frozen=True)
class AttentionVariant:
    """The attention kernels' variants (``kf-tile{attention.<field>=<value>}``)."""

    #: where blocks may be skipped and tiles are not claimed in turn, workgroups take the
    #: query blocks last to first: under a causal mask the last query blocks have the most
    #: live key blocks, and started first they do not trail the grid (workgroups start in
    #: block index order)
    reverse_q_blocks: bool = True
    #: SPIR-V: the SIMT kernel's two products on cooperative matrices, for f16 q, k, v
    #: where the device lists an f16 shape (attention/coopmat.py); false: SIMT throughout
    cooperative_matrix: bool = True
    #: sm_90a at run-time sequence lengths: the producer warpgroup (FlashAttention-3's warp
    #: specialization, its copies testing each slot against the keys' end) instead of the
    #: consumers' own three-stage copies (false). At head dim 128 on an H100, bf16
    #: [4, 32, n, 128]: 0.89-1.00x the static kernel against the copies' 0.67-0.91x
    #: (bench/dynamic_shapes.py --only attention_seed, both in one run)
    run_time_producer: bool = True


@dataclass(frozen=True)
class HopperPlan:
    """What the Hopper kernel is written from (recorded in ``kf.plan``; ``plan`` makes it).

    ``stages``: K and V stages (2 or 3); ``warp_specialized``: a producer warpgroup (and
    with it the overlap of a block's P V with the next block's softmax, ``overlap_pv``);
    ``block_table``: [query blocks, key blocks] of the mask's table, or []; ``persistent``:
    [query blocks, batch] of the unmasked kernel's tiles taken in turn, or [];
    ``persistent_walk``: [query blocks, batch, heads a claim group] of the walk's tiles
    claimed from the table's counter, or []; ``max_registers``: ptxas's bound a thread
    (0: its own)."""

    block_m: int
    block_n: int
    threads: int
    stages: int
    grid: list
    shared_bytes: int
    seq_q: int
    seq_k: int
    head_dim: int
    head_dim_v: int
    batch: list
    skip_masked_blocks: bool
    elem: str
    block_table: list
    reverse_q_blocks: bool
    max_registers: int
    overlap_pv: bool
    warp_specialized: bool
    persistent: list
    persistent_walk: list
    dynamic_shared: bool = True
    mma: bool = True
    wgmma: bool = True

    @staticmethod
    def from_dict(plan: dict) -> "HopperPlan":
        """The plan of a recorded ``kf.plan`` (its other entries ignored)."""
        names = {f.name for f in dataclasses.fields(HopperPlan)}
        return HopperPlan(**{k: v for k, v in plan.items() if k in names})


def plan(ch, target: TargetInfo, skip: bool, variant: AttentionVariant, bounded: bool = False) -> dict | None:
    """The wgmma attention plan (a ``HopperPlan`` as a dict), or None where the mma.sync
    kernel stays: not sm_90a, q/k/v not f16/bf16 arguments read as they lie (K through
    its transpose), head dims not multiples of 64 (whole 128-byte swizzled rows) up to
    256, or shared memory short.

    ``bounded``: the kernel has run-time sequence lengths (``ch``'s are the bound): the
    plan is for every length, so what holds only for some is not taken -- fp8 (whole
    key blocks), the block table of a mask (its shape is the lengths'; a mask made from
    the indices is tested per block by the skipping loop, in blocks of 64 keys past head
    dim 64, and up to head dim 128), persistent grids (the tiles' count); the producer
    warpgroup where ``variant.run_time_producer`` (the default) asks for it."""
    if not _wg.available(target):
        return None
    view = ch.view
    elems = {spec_of(x.type).elem for x in (ch.q, ch.kt, ch.v)}
    if len(elems) != 1 or (elem := elems.pop()) not in ("f16", "bf16") + tuple(FP8_PTX):
        return None
    fp8 = elem in FP8_PTX
    d, dv = ch.head_dim, ch.head_dim_v
    if d % 64 or dv % 64 or max(d, dv) > 256:
        return None
    if view.arg_index(ch.q) is None or not contiguous_last(view, ch.q):
        return None
    if view.arg_index(transposed_source(ch.kt)) is None or not ch.k_d_contiguous:
        return None
    if fp8:
        if bounded or not _fp8_applies(ch, elem):
            return None
    elif view.arg_index(ch.v) is None or not contiguous_last(view, ch.v):
        return None
    elif p_scale(ch) is None:
        return None
    bm, bn = BLOCK_M, BLOCK_N
    if bounded and ch.mask_cond is not None and max(d, dv) > 64:
        # without its table a mask takes the per-block skipping loop, which spilled past
        # head dim 64 with tails in blocks of 128 keys (64 bytes at head dim 128 and 257
        # keys; 32 at run-time lengths): blocks of BOUNDED_MASKED_BLOCK_N keys, up to
        # head dim 128 (256 spilled even so); past it the mma.sync kernel
        if max(d, dv) > 128:
            return None
        bn = BOUNDED_MASKED_BLOCK_N
    stages = 2
    esize = 1 if fp8 else 2
    if not skip and ch.mask_cond is None and max(d, dv) >= THREE_STAGES_FROM and \
            esize * (bm * d + 3 * bn * (d + dv)) + _wg.ATOM_BYTES <= target.max_dynamic_shared_bytes:
        stages = 3
    shared = esize * (bm * d + stages * bn * (d + dv)) + _wg.ATOM_BYTES
    if shared > target.max_dynamic_shared_bytes:
        return None
    table = skip and ch.mask_cond is not None and not bounded and _head_shared_mask(ch)
    if fp8 and (skip or ch.mask_cond is not None):
        return None
    batch = math.prod(ch.batch)
    if batch > 65535:
        return None
    # unmasked, two workgroups an SM where their shared memory fits: ptxas is then held
    # to the registers that two leave a thread (SM_REGISTERS / (2 x threads) = 128),
    # which it otherwise may pass (head dim 64 bf16 took 136 with ex2.approx.ftz: one
    # workgroup an SM). Masked kernels need more (at 128, head dim 64 spilled 176 bytes);
    # at exactly half the SM's shared memory ncu reports one workgroup an SM (fp8 head
    # dim 128), hence the strict bound.
    pair_registers = SM_REGISTERS // (2 * 128 * WARPGROUPS)
    pair = not skip and ch.mask_cond is None and 2 * (shared + DRIVER_SHARED_BYTES) < SM_SHARED_BYTES \
        and pair_registers >= 128
    if bounded and 0 < -(-ch.seq_q // bm) * batch <= target.multiprocessors:
        # at run-time lengths the grid is at most the bound's: where that is one workgroup
        # an SM or fewer, no second one shares an SM, and the cap only spills (one head
        # at head dim 64: 4 bytes)
        pair = False
    # the producer warpgroup (one more 128-thread warpgroup and the stages' mbarriers),
    # with FlashAttention-3's overlap of a block's P V with the next block's softmax: up
    # to head dim 128 (V's; O, S and two blocks of P spill at 256) and from three key
    # blocks (two, a loop of one trip that LLVM removes, spilled in fp8; at run-time
    # lengths the loop stays)
    specialized = stages == 3 and dv <= 128 and \
        (variant.run_time_producer if bounded else ch.seq_k > 2 * bn) and \
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
    persistent = specialized and not table and not bounded \
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
    return dataclasses.asdict(HopperPlan(
        block_m=bm, block_n=bn, threads=128 * (WARPGROUPS + specialized), stages=stages, grid=grid,
        shared_bytes=shared, seq_q=ch.seq_q, seq_k=ch.seq_k, head_dim=d, head_dim_v=dv, batch=list(ch.batch),
        skip_masked_blocks=skip, elem=elem, block_table=[-(-ch.seq_q // bm), -(-ch.seq_k // bn)] if table else [],
        reverse_q_blocks=bool(variant.reverse_q_blocks and skip and ch.mask_cond is not None and not persistent_walk),
        max_registers=pair_registers if pair else 0, overlap_pv=specialized, warp_specialized=specialized,
        persistent=[-(-ch.seq_q // bm), batch] if persistent else [],
        persistent_walk=[-(-ch.seq_q // bm), batch, group] if persistent_walk else []))


def p_scale(ch) -> float | None:
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
    """The fp8 kernel's conditions: no mask, V the transpose of an argument stored
    [.., Dv, Sk] (K-major: fp8 wgmma takes K-major operands only), head dims whole
    128-byte rows, keys whole blocks (no tail: key order is permuted within blocks), no
    per-key operand in the score chain, and a P chain that rounds c * P to q's fp8 type."""
    if ch.mask_cond is not None:
        return False
    view = ch.view
    vt = transposed_source(ch.v)
    if vt == ch.v or view.arg_index(vt) is None or not contiguous_last(view, vt):
        return False
    if ch.head_dim % 128 or ch.seq_k % BLOCK_N or _reads_per_key(ch):
        return False
    return getattr(ch, "p_elem", None) == elem and p_scale(ch) is not None


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
