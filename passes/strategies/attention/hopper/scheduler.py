"""Which tile (query block, batch) a workgroup computes, and in which order.

Without a persistent plan, one workgroup a tile: query blocks along the grid's x (last to
first where blocks may be skipped: ``reverse_q_blocks``), the batch along y. A
persistent workgroup (one an SM) takes its tiles in turn: the unmasked kernel's tiles
t, t + grid, ... (``tile_of``: query blocks fastest, so that a head's tiles run side by
side and share its K and V in L2); the walk's tiles, whose work differs (under a causal
mask a query block's live key blocks are its index + 1), are claimed from a counter in
the block table (``claimed``) in an order that takes a group of heads' tiles by query
block, last to first (``walk_tile_of``): the longest first, the shortest last, where they
fill the ends of the others (longest-processing-time-first list scheduling).
"""

from __future__ import annotations

from typing import Callable

from mlir import ir
from mlir.dialects import arith, gpu, memref, scf

from ...nvidia.barriers import NamedBarrier, named_sync
from .block_table import table_columns

#: i64 slots after the barriers (the persistent walk): the claimed tile, its walk, whole
#: and causal masks (consumers), and two slots for the producer's claim (by tile parity).
WALK_INFO_SLOTS = 6


class TileScheduler:
    """The tile order of the kernel ``k`` (a HopperAttention): its plan's ``persistent``
    ([query blocks, batch]) or ``persistent_walk`` ([query blocks, batch, heads a
    group])."""

    def __init__(self, k):
        self.k = k
        self.persistent = k.plan.persistent
        self.walk = k.plan.persistent_walk if k.table_shape else None
        self.n_tiles = self.persistent[0] * self.persistent[1] if self.persistent else 0

    def tile_of(self, t: ir.Value) -> tuple[ir.Value, ir.Value]:
        """The persistent kernel's tile t's query block and batch (linear index), query
        blocks fastest (a head's tiles run side by side and share its K and V in L2)."""
        g = self.k.g
        return g.rem(t, self.persistent[0]), g.div(t, self.persistent[0])

    def walk_tile_of(self, u: ir.Value) -> tuple[ir.Value, ir.Value]:
        """The persistent walk's u-th tile claimed: heads in groups of ``group`` (the last
        may be smaller), a group's tiles by query block last to first, then by head."""
        g = self.k.g
        nq, heads, group = self.walk
        per_group = group * nq
        first = g.mul(g.div(u, per_group), group)
        size = arith.minui(g.c(group), arith.subi(g.c(heads), first))
        within = g.rem(u, per_group)
        block = arith.subi(g.c(nq - 1), arith.divui(within, size))
        return block, arith.addi(first, arith.remui(within, size))

    def tile(self, t: ir.Value) -> tuple[ir.Value, ir.Value]:
        """(query block, batch) of the workgroup's tile t in its order."""
        return (self.walk_tile_of if self.walk else self.tile_of)(t)

    def tile_loop(self, body: Callable[[ir.Value], None]) -> None:
        """The persistent kernel: ``body(k)`` for the workgroup's k-th tile t (t = its
        block index + k x the grid), placed (``HopperAttention.place_tile``) first."""
        k = self.k
        g = k.g
        loop = scf.ForOp(g.bid("x"), g.c(self.n_tiles), gpu.grid_dim(gpu.Dimension.x), [g.c(0)])
        with ir.InsertionPoint(loop.body):
            t, i = loop.induction_variable, loop.inner_iter_args[0]
            k.place_tile(t)
            body(i)
            scf.yield_([g.add(i, 1)])

    def info(self, slot: int) -> list[ir.Value]:
        """The persistent walk: the index of an i64 slot after the barriers."""
        g = self.k.g
        return [g.c(0), g.c(self.k.n_barriers + slot)]

    def claimed(self, i: ir.Value, leader: ir.Value) -> ir.Value:
        """The persistent walk's producer: the workgroup's next tile (its i-th), from the
        table's counter: one thread adds, the producer warpgroup reads it on a named
        barrier of its own (slot by i's parity: a thread still reading the last one's is
        not overwritten); ``leader``: the thread that adds."""
        k = self.k
        g = k.g
        i32, i64 = ir.IntegerType.get_signless(32), ir.IntegerType.get_signless(64)
        slot = arith.addi(g.c(k.n_barriers + 4), g.rem(i, 2))

        def take():
            u = memref.atomic_rmw(arith.AtomicRMWKind.addi, arith.constant(i32, 1), k.table,
                                  [g.c(0), g.c(table_columns(k.table_shape[1], True) - 1)])
            memref.store(arith.extui(i64, u), k.barrier_mem, [g.c(0), slot])

        g.when(leader, take)
        named_sync(NamedBarrier.PRODUCER, 128)
        return arith.index_cast(ir.IndexType.get(), memref.load(k.barrier_mem, [g.c(0), slot]))
