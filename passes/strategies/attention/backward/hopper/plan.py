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


@dataclass(frozen=True)
class Workspace:
    """The prelude's f32 buffer: D and the log2-scaled logsumexp of every (padded) query
    row, the f32 dQ sums, and a mask's block table (i32 codes, ``table``: key blocks x
    query blocks, then a query block's dead-row flags)."""

    rows: int  # batch x padded queries
    head_dim: int
    table_size: int = 0

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
    def size(self) -> int:
        return self.table_at + self.table_size


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
        return Workspace(self.rows, self.head_dim)


def shared_bytes(bm: int, d: int) -> int:
    """K and V (128 keys), Q and dO (``STAGES`` of bm queries), dS (``STAGES`` of bm x
    128), 16-bit; the stages' D and logsumexp; the barriers; 1 KiB of alignment."""
    tiles = 2 * (2 * BLOCK_N * d + 2 * STAGES * bm * d + STAGES * bm * BLOCK_N)
    stats = -(-STAGES * 2 * bm * 4 // _wg.ATOM_BYTES) * _wg.ATOM_BYTES
    return tiles + stats + 2 * _wg.ATOM_BYTES


def plan(ch: BackwardChain, target: TargetInfo) -> dict | None:
    """The wgmma backward's plan, or None where another kernel takes the chain: not
    sm_90a, q, k, v, dO not f16/bf16 arguments read as they lie (k and v through
    transposes), head dims other than 64 and 128 or unequal, a chain that is not
    ``LinearForm``, or a mask (those take the SIMT kernel)."""
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
    if form is None or form.masked:
        return None
    batch = math.prod(ch.batch)
    if batch > 65535:
        return None
    bm = BLOCK_M[d]
    shared = shared_bytes(bm, d)
    if shared > target.max_dynamic_shared_bytes:
        return None
    sqp = -(-ch.seq_q // bm) * bm
    layout = Workspace(batch * sqp, d)
    return dataclasses.asdict(HopperBackwardPlan(
        block_m=bm, block_n=BLOCK_N, threads=384, stages=STAGES, grid=[-(-ch.seq_k // BLOCK_N), batch, 1],
        shared_bytes=shared, seq_q=ch.seq_q, seq_k=ch.seq_k, seq_q_padded=sqp, head_dim=d, batch=list(ch.batch),
        elem=elem, score_scale=form.score_scale, grad_scale=form.grad_scale, masked=form.masked,
        workspace=layout.size))
