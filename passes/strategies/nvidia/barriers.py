"""Hopper's synchronization between warpgroups of one workgroup that do different work:
the mbarriers of a producer/consumer pipeline of shared-memory stages, and named
barriers for groups of warps.

A producer warpgroup (attention's Hopper kernel) copies key blocks into stages while
consumer warpgroups compute on earlier ones. ``bar.sync`` of the whole workgroup would
make them meet every block; an mbarrier lets each side wait for exactly the other side's
progress on one stage: the consumers for its copies (*full*, arrived on by
``cp.async.mbarrier.arrive.noinc`` as they land), the producer for its readers being done
(*empty*). Named barriers (``bar.sync id, n``) order a group of warps the same way
without the rest of the workgroup; ``NamedBarrier`` gives each group its id, so that no
id is claimed by two groups.
"""

from __future__ import annotations

import enum

from mlir import ir
from mlir.dialects import arith, gpu, llvm, memref, nvvm

from ..kernel_ir import GpuFunc


def const_i32(v: int) -> ir.Value:
    """An i32 constant."""
    return arith.constant(ir.IntegerType.get_signless(32), v)


class NamedBarrier(enum.IntEnum):
    """The named barriers of kf's kernels, by the group of warps that meets on each
    (the values are the ids in the PTX; the hardware has 16)."""

    #: every warp of the workgroup (``gpu.barrier``, ``bar.sync 0``)
    WORKGROUP = 0
    #: the consumer warpgroups of a warp-specialized kernel (256 threads)
    CONSUMERS = 1
    #: the producer warpgroup (128 threads), where its threads share a value
    PRODUCER = 3


def named_sync(barrier: NamedBarrier, threads: int) -> None:
    """``bar.sync barrier, threads``: wait until ``threads`` threads (whole warps) arrived."""
    nvvm.BarrierOp(None, barrierId=const_i32(int(barrier)), numberOfThreads=const_i32(threads))


class StageBarriers:
    """A producer/consumer pipeline's mbarriers, two a stage in ``mem`` (i64 of shared
    memory, ``size()`` of them): *full* (the producer's copies of the stage's block landed) and *empty* (the
    consumers are done reading it). Block j uses stage j % stages, and is the
    (j / stages)-th phase of both: its full barrier's phase completes as its copies land,
    its empty barrier's as the consumers give it back. A wait names the parity of the
    phase it waits for; a fresh barrier counts the phase before its first as complete,
    so the producer's first ``stages`` waits return at once.

    ``q``: one more barrier after them, for a copy made once (attention's Q).
    ``q_free``: one more after Q's, on which the consumers give back a buffer that
    outlives the stages (a persistent workgroup's Q, read by every block of one tile and
    refilled for the next). ``mem`` holds ``size(stages, q, q_free)`` barriers."""

    #: the barriers' kinds, in ``mem`` by kind then stage: full, empty, then Q's
    FULL, EMPTY, Q = 0, 1, 2

    def __init__(self, g: GpuFunc, mem: ir.Value, stages: int, q: bool = False, q_free: bool = False):
        self.g, self.stages, self.q, self.q_free = g, stages, q, q_free
        i64 = ir.IntegerType.get_signless(64)
        self.base = arith.index_cast(i64, memref.extract_aligned_pointer_as_index(mem))

    @staticmethod
    def size(stages: int, q: bool, q_free: bool = False) -> int:
        """The barriers (i64) of such a pipeline."""
        return 2 * stages + q + q_free

    def _at(self, kind: int, stage: ir.Value | int) -> ir.Value:
        g = self.g
        stage = g.c(stage) if isinstance(stage, int) else stage
        i64 = ir.IntegerType.get_signless(64)
        return self._pointer(arith.index_cast(i64, g.mul(g.add(stage, kind * self.stages), 8)))

    def _pointer(self, offset: ir.Value) -> ir.Value:
        """The barrier ``offset`` (i64) bytes into ``mem``."""
        return llvm.inttoptr(ir.Type.parse("!llvm.ptr<3>"), arith.addi(self.base, offset))

    def initialize(self, producers: int, consumers: int, q_extra: int = 0) -> None:
        """Thread 0 sets the arrival counts; a barrier of the whole workgroup then
        publishes them (the last one the producer and consumers share). ``q_extra``:
        arrivals on Q's barrier beside the producers' copies (``announce_q``)."""
        g = self.g
        i32 = ir.IntegerType.get_signless(32)

        def init():
            for s in range(self.stages):
                nvvm.MBarrierInitOp(self._at(self.FULL, s), arith.constant(i32, producers))
                nvvm.MBarrierInitOp(self._at(self.EMPTY, s), arith.constant(i32, consumers))
            if self.q:
                nvvm.MBarrierInitOp(self._at(self.Q, 0), arith.constant(i32, producers + q_extra))
            if self.q_free:
                nvvm.MBarrierInitOp(self._q_free_at(), arith.constant(i32, consumers))

        g.when(arith.cmpi(arith.CmpIPredicate.eq, gpu.thread_id(gpu.Dimension.x), g.c(0)), init)
        gpu.barrier()

    def _q_free_at(self) -> ir.Value:
        return self._pointer(arith.constant(ir.IntegerType.get_signless(64), 8 * (2 * self.stages + self.q)))

    def _parity(self, j: ir.Value, per_phase: int, flip: int) -> ir.Value:
        """The parity (i32) of phase j / per_phase (``flip`` 1: of the phase before)."""
        g = self.g
        return arith.index_cast(ir.IntegerType.get_signless(32), g.rem(arith.addi(g.div(j, per_phase), g.c(flip)), 2))

    @staticmethod
    def _try_wait(barrier: ir.Value, parity: ir.Value) -> None:
        nvvm.MBarrierTryWaitParityOp(barrier, parity, arith.constant(ir.IntegerType.get_signless(32), 0x989680))

    def _wait(self, kind: int, j: ir.Value, flip: int) -> None:
        """Wait for the phase of block j (``flip`` 1: the one before) of barrier ``kind``
        of j's stage."""
        parity = self._parity(j, self.stages, flip)
        self._try_wait(self._at(kind, self.g.rem(j, self.stages)), parity)

    def wait_q_free(self, k: ir.Value) -> None:
        """Producer, before the k-th refill of the ``q_free`` buffer: the consumers gave
        back the (k - 1)-th (returns at once for k = 0)."""
        parity = self._parity(k, 1, 1)
        self._try_wait(self._q_free_at(), parity)

    def release_q(self) -> None:
        """Consumers: done reading the ``q_free`` buffer's current contents."""
        nvvm.MBarrierArriveOp(ir.IntegerType.get_signless(64), self._q_free_at())

    def wait_q(self, k: ir.Value | None = None) -> None:
        """Consumers: Q landed (the barrier after the stages', with ``q``); ``k``: its
        k-th fill (with ``q_free``), else the first."""
        self._try_wait(self._at(self.Q, 0), self._parity(self.g.c(0) if k is None else k, 1, 0))
        self._fence()

    def arrive_q(self) -> None:
        """Producer: as its copies of Q land."""
        nvvm.CpAsyncMBarrierArriveOp(self._at(self.Q, 0), noinc=True)

    def announce_q(self) -> None:
        """Producer, one thread: an arrival on Q's barrier now, with release semantics, so
        that what the thread wrote to shared memory before (the tile Q is of) is seen by
        the consumers that wait for Q (``initialize``'s ``q_extra``)."""
        nvvm.MBarrierArriveOp(ir.IntegerType.get_signless(64), self._at(self.Q, 0))

    def wait_full(self, j: ir.Value) -> None:
        """Consumers: block j is in its stage. Then the proxy fence: the copies wrote
        through the generic proxy, wgmma reads through the async one."""
        self._wait(self.FULL, j, 0)
        self._fence()

    @staticmethod
    def _fence() -> None:
        nvvm.FenceProxyOp(ir.Attribute.parse("#nvvm.proxy_kind<async.shared>"),
                          space=ir.Attribute.parse("#nvvm.shared_space<cta>"))

    def wait_empty(self, j: ir.Value) -> None:
        """Producer: block j - stages, the stage's last, is read (parity of the phase before)."""
        self._wait(self.EMPTY, j, 1)

    def arrive_full(self, stage: ir.Value) -> None:
        """Producer: each thread arrives as its copies issued so far land (noinc: counted
        in the barrier's arrivals)."""
        nvvm.CpAsyncMBarrierArriveOp(self._at(self.FULL, stage), noinc=True)

    def release(self, j: ir.Value) -> None:
        """Consumers: block j's stage may be refilled."""
        nvvm.MBarrierArriveOp(ir.IntegerType.get_signless(64),
                              self._at(self.EMPTY, self.g.rem(j, self.stages)))


def block_reduce(pred: ir.Value, how: str = "or", barrier: tuple[int, int] | None = None) -> ir.Value:
    """The workgroup's OR / AND of a predicate (``bar.red``; a barrier too). ``barrier``:
    (id, threads) of a named barrier of some of the workgroup's warps instead."""
    i32 = ir.IntegerType.get_signless(32)
    if barrier is not None:  # the NVVM op reduces on barrier 0 only
        asm = (f"{{ .reg .pred p, q; setp.ne.u32 q, $1, 0; bar.red.{how}.pred p, {barrier[0]}, {barrier[1]}, q; "
               "selp.u32 $0, 1, 0, p; }")
        r = llvm.InlineAsmOp(i32, [arith.extui(i32, pred)], asm, "=r,r", has_side_effects=True).res
    else:
        r = nvvm.BarrierOp(i32, reductionOp=ir.Attribute.parse(f"#nvvm.reduction<{how}>"),
                           reductionPredicate=arith.extui(i32, pred)).res
    return arith.cmpi(arith.CmpIPredicate.ne, r, arith.constant(i32, 0))
