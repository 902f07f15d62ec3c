"""The Hopper backward's plan: whether the wgmma kernel applies, its shape, and where
its workspace keeps what.

A workgroup is two consumer warpgroups (64 keys each, a key block of ``BLOCK_N``) and a
producer warpgroup; per step it takes a block of ``block_m`` queries: 64 at head dim 128,
128 at head dim 64, so that each consumer's registers hold dK and dV (64 keys by the head
dim), S^T and dP^T (64 keys by ``block_m``) and dQ (64 by 64): 224 f32 either way, as
FlashAttention-3's hdim-64 and -128 kernels.
"""

from __future__ import annotations

import dataclasses
import math
from dataclasses import dataclass

from kf.dialects import spec_of

from ....base import TargetInfo
from ....kernel_ir import contiguous_last
from ....nvidia import wgmma as _wg
from ...chain import transposed_source
from ..chain import BackwardChain, linear_form

#: Keys a workgroup (two consumer warpgroups of 64).
BLOCK_N = 128

#: Queries a step, by head dim.
BLOCK_M = {64: 128, 128: 64}

#: Q and dO stages (and the dS buffers: a consumer writes dS of step i + 2 only once both
#: passed step i + 1's barrier, after their dQ products of step i).
STAGES = 2


#: Rows of a dead-row flag (the preprocess's workgroups).
FLAG_ROWS = 64

#: The most query blocks a key block's walk takes (its bit masks are i64).
WALK_MAX_BLOCKS = 64


@dataclass(frozen=True)
class Workspace:
    """The prelude's f32 buffer: D and the log2-scaled logsumexp of every (padded) query
    row, the f32 dQ sums, and with a mask its block table (i32: a code a (key block,
    query block), ``codes_at`` + key block x query blocks + query block), a flag a
    ``FLAG_ROWS`` rows of a batch element, whether one of them is masked everywhere
    (``dead_at``), and, where the flag is set, those rows' share of every key's dV
    (``dead_dv_at``: the sum of their dO over Sk, head dim floats a flag)."""

    rows: int  # batch x padded queries
    head_dim: int
    key_blocks: int = 0  # with a mask
    query_blocks: int = 0

    @property
    def d_at(self) -> int:
        return 0

    @property
    def lse_at(self) -> int:
        return self.rows

    @property
    def dq_at(self) -> int:
        return 2 * self.rows

    @property
    def table_at(self) -> int:
        return self.dq_at + self.rows * self.head_dim

    @property
    def codes_at(self) -> int:
        return self.table_at

    @property
    def dead_at(self) -> int:
        return self.codes_at + self.key_blocks * self.query_blocks

    @property
    def dead_dv_at(self) -> int:
        return self.dead_at + self.rows // FLAG_ROWS

    @property
    def size(self) -> int:
        if not self.key_blocks:
            return self.table_at
        return self.dead_dv_at + self.rows // FLAG_ROWS * self.head_dim


@dataclass(frozen=True)
class HopperBackwardPlan:
    """What the Hopper backward is written from (recorded in ``kf.plan``)."""

    block_m: int
    block_n: int
    threads: int
    stages: int
    grid: list
    shared_bytes: int
    seq_q: int
    seq_k: int
    seq_q_padded: int
    head_dim: int
    batch: list
    elem: str
    score_scale: float
    grad_scale: float
    masked: bool
    mask_fill: float
    workspace: int
    kernel: str = "hopper"

    @staticmethod
    def from_dict(plan: dict) -> "HopperBackwardPlan":
        names = {f.name for f in dataclasses.fields(HopperBackwardPlan)}
        return HopperBackwardPlan(**{k: v for k, v in plan.items() if k in names})

    @property
    def query_blocks(self) -> int:
        return self.seq_q_padded // self.block_m

    @property
    def key_blocks(self) -> int:
        return -(-self.seq_k // self.block_n)

    @property
    def rows(self) -> int:
        return math.prod(self.batch) * self.seq_q_padded

    @property
    def layout(self) -> Workspace:
        if self.masked:
            return Workspace(self.rows, self.head_dim, self.key_blocks, self.query_blocks)
        return Workspace(self.rows, self.head_dim)


def shared_bytes(bm: int, d: int, masked: bool = False) -> int:
    """K and V (128 keys), Q and dO (``STAGES`` of bm queries), dS (``STAGES`` of bm x
    128), 16-bit; the stages' D and logsumexp; the barriers; under a mask the step list;
    1 KiB of alignment."""
    tiles = 2 * (2 * BLOCK_N * d + 2 * STAGES * bm * d + STAGES * bm * BLOCK_N)
    stats = -(-STAGES * 2 * bm * 4 // _wg.ATOM_BYTES) * _wg.ATOM_BYTES
    return tiles + stats + (3 if masked else 2) * _wg.ATOM_BYTES


def plan(ch: BackwardChain, target: TargetInfo) -> dict | None:
    """The wgmma backward's plan, or None where another kernel takes the chain: not
    sm_90a, q, k, v, dO not f16/bf16 arguments read as they lie (k and v through
    transposes), head dims other than 64 and 128 or unequal, a chain that is not
    ``LinearForm``, a mask that is not every head's or over more than ``WALK_MAX_BLOCKS``
    query blocks."""
    if not _wg.available(target):
        return None
    view = ch.view
    elems = {spec_of(x.type).elem for x in (ch.q, ch.kt, ch.vt, ch.do)}
    if len(elems) != 1 or (elem := elems.pop()) not in ("f16", "bf16"):
        return None
    d = ch.head_dim
    if d != ch.head_dim_v or d not in BLOCK_M:
        return None
    for value, swapped in ((ch.q, False), (ch.do, False), (ch.kt, True), (ch.vt, True)):
        source = transposed_source(value) if swapped else value
        if view.arg_index(source) is None or contiguous_last(view, value) == swapped:
            return None
    form = linear_form(ch)
    if form is None:
        return None
    batch = math.prod(ch.batch)
    if batch > 65535:
        return None
    bm = BLOCK_M[d]
    shared = shared_bytes(bm, d, form.masked)
    if shared > target.max_dynamic_shared_bytes:
        return None
    sqp = -(-ch.seq_q // bm) * bm
    nq, nk = sqp // bm, -(-ch.seq_k // BLOCK_N)
    if form.masked and (nq > WALK_MAX_BLOCKS or not head_shared_mask(ch)):
        return None
    layout = Workspace(batch * sqp, d, nk, nq) if form.masked else Workspace(batch * sqp, d)
    return dataclasses.asdict(HopperBackwardPlan(
        block_m=bm, block_n=BLOCK_N, threads=384, stages=STAGES, grid=[-(-ch.seq_k // BLOCK_N), batch, 1],
        shared_bytes=shared, seq_q=ch.seq_q, seq_k=ch.seq_k, seq_q_padded=sqp, head_dim=d, batch=list(ch.batch),
        elem=elem, score_scale=form.score_scale, grad_scale=form.grad_scale, masked=form.masked,
        mask_fill=ch.mask_fill if form.masked else 0.0, workspace=layout.size))


def head_shared_mask(ch: BackwardChain) -> bool:
    """Whether the mask reads nothing but [.., Sq, Sk] arguments whose leading dims are
    1 (and constants): one mask for every head and batch element, as a causal mask is,
    so one block table serves every workgroup."""
    from kf.dialects.types import defining

    view = ch.view
    seen, stack = set(), [ch.mask_cond]
    while stack:
        v = stack.pop()
        if v in seen:
            continue
        seen.add(v)
        i = view.arg_index(v)
        if i is not None:
            spec = view.arg_specs[i]
            if spec.rank and (spec.rank < 2 or tuple(spec.shape[-2:]) != (ch.seq_q, ch.seq_k)
                              or any(x != 1 for x in spec.shape[:-2])):
                return False
            continue
        op = defining(v)
        if op is None or op in (ch.mm_s, ch.mm_dp):
            return False
        stack.extend(op.operands)
    return True
