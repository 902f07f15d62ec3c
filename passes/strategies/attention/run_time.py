"""The tensor-core attention kernels at run-time sequence lengths (strategies/
run_time_sizes.py): what the mma.sync and wgmma kernels share to be written once for
every length up to BOUND.

A plan with ``sizes`` is made on the bounded kernel; its kernel then reads the lengths
of the queries and the keys from the size slots at its start and puts them in the chain
(``Chain.seq_q`` / ``seq_k`` become index values), where every part of the kernel reads
them: the key loops run to the run-time ``Sk``, and every tail is guarded
(``run_time_sizes.ragged`` is true of a run-time size). Buffers whose run-time sequence
follows a dim that is not 1 (heads) are declared flat and addressed with run-time
strides: ``flat`` gives their strides, which Pointwise (``Pointwise.flat``), the tiles'
Direct sources (``direct_source(..., flat=)``) and the stores (``at``) linearize with.
The grid's x is the run-time number of query blocks.
"""

from __future__ import annotations

from mlir import ir
from mlir.dialects import arith, memref

from .. import run_time_sizes
from ..base import TargetInfo
from ..kernel_ir import GpuFunc, KernelView, gpu_arg_types, linearize
from .chain import Chain
from .chain import transposed_source as _transposed_source


def seq_slots(ch: Chain, slots: list[tuple[int, int]], keys_only: bool = False) -> tuple[int | None, int]:
    """(the slot of the queries' length, the slot of the keys'): the run-time dims of
    the attention kernels are the sequences of its output and of the argument K or V is
    read from, and a mask's or bias's last two dims (its queries and keys), which it reads
    with its own slots' strides; ValueError for any other (a batch dim). ``keys_only``
    (the SIMT kernel): the queries' length may be static (None: decoding one token
    against a cache of run-time length)."""
    view = ch.view
    n_in = len(view.args)
    rank = len(ch.scores.shape)
    sources = {view.arg_index(x) for x in (_transposed_source(ch.kt), ch.v)} - {None}
    q = [k for k, (pos, dim) in enumerate(slots) if pos == n_in + ch.out_pos and dim == rank - 2]
    kv = [k for k, (pos, dim) in enumerate(slots) if pos in sources and dim == rank - 2]
    # (the logsumexp's run-time dim is its sequence too: [..., Sq] or [..., Sq, 1])
    allowed = sources | {n_in + ch.out_pos, view.arg_index(ch.q)} | \
        ({n_in + ch.lse_pos} if ch.lse_pos is not None else set())
    specs = [*view.arg_specs, *view.result_specs]

    def fits(pos: int, dim: int) -> bool:
        if pos in allowed:
            return dim == rank - 2
        # a mask's or bias's (an input broadcast to the scores): its last two dims
        return pos < n_in and dim >= specs[pos].rank - 2

    if (not q and not keys_only) or not kv or not all(fits(pos, dim) for pos, dim in slots):
        raise ValueError(f"the attention kernel takes run-time sequence lengths only (its run-time dims: {slots})")
    return (q[0] if q else None), kv[0]


def arg_types(view: KernelView, target: TargetInfo, slots: list[tuple[int, int]]) -> tuple[list, dict]:
    """(the gpu.func's argument types, {argument position: run-time dim} of the buffers
    declared flat): the kernel's buffers, then with run-time sizes the slots' buffer."""
    types = gpu_arg_types(view, target)
    if not slots:
        return types, {}
    specs = [*view.arg_specs, *view.result_specs]
    strided = run_time_sizes.strided_positions(specs, slots)
    for pos in strided:
        types[pos] = run_time_sizes.flat_type(types[pos])
    return types + [run_time_sizes.slot_type(len(slots))], strided


class SeqLengths:
    """The run-time sequence lengths of an attention kernel being written (``g``, whose
    last argument is the slots' buffer): made, it has set ``ch.seq_q`` and ``ch.seq_k``
    to the run-time lengths (index values at the top of the kernel)."""

    def __init__(self, g: GpuFunc, ch: Chain, slots: list[tuple[int, int]], strided: dict):
        self.g, self.ch = g, ch
        self.slots = [tuple(s) for s in slots]
        self.sizes = sizes = run_time_sizes.SizeSlots(g.entry, g.args[-1], self.slots)
        self.q_slot, k_slot = seq_slots(ch, self.slots)
        ch.seq_q, ch.seq_k = sizes.size(self.q_slot), sizes.size(k_slot)
        view = ch.view
        self.specs = [*view.arg_specs, *view.result_specs]
        self.strided = dict(strided)
        # each buffer's run-time dim is one of the two lengths: the keys' where K or V is
        # read from it, else the queries' (the same value for K and V: one address base)
        sources = {view.arg_index(x) for x in (_transposed_source(ch.kt), ch.v)} - {None}
        self.slot_of = {pos: k_slot if pos in sources else self.q_slot for pos, _ in self.slots}
        self.qkv = sources | {view.arg_index(ch.q)}
        #: the flat inputs' strides (``Pointwise.flat``, ``direct_source(..., flat=)``),
        #: computed at the kernel's top: the key loop reads K and V with them
        self.flat_inputs = {pos: sizes.strides_at(self.specs[pos].shape, self._dims(pos))
                            for pos in strided if pos < len(view.args)}

    def _dims(self, pos: int) -> dict[int, int]:
        """{run-time dim: slot} of the input at pos: q's, K's and V's sequence at the slot
        of its length (``slot_of``: one address base for K and V), a mask's or bias's
        each at its own slot (its keys, its queries or both)."""
        dims = run_time_sizes.dims_of(self.slots, pos)
        return {dim: self.slot_of[pos] for dim in dims} if pos in self.qkv else dims

    def size_here(self, k: int) -> ir.Value:
        """Slot k's size loaded again at the insertion point: the epilogue's, where one
        loaded at the top would stay in registers through the key loop (at the 128
        registers of the head dim 64 wgmma kernel, that spilled)."""
        g = self.g
        size = arith.index_cast(g.index, memref.load(self.sizes.arg, [g.c(k)]))
        return arith.minui(size, g.c(run_time_sizes.BOUND))

    def epilogue(self) -> "Epilogue":
        """The queries' length and the flat results' strides, computed at the insertion
        point (``size_here``) for the stores of O and the logsumexp."""
        g = self.g
        size = self.size_here(self.q_slot)
        flat = {}
        for pos, dim in self.strided.items():
            if pos < len(self.ch.view.args):
                continue
            shape = self.specs[pos].shape
            strides: list = [1] * len(shape)
            for d in range(len(shape) - 2, -1, -1):  # row-major, the run-time dim's size at dim
                inner, prev = (size if d + 1 == dim else shape[d + 1]), strides[d + 1]
                if isinstance(inner, int) and isinstance(prev, int):
                    strides[d] = prev * inner
                elif isinstance(inner, int):
                    strides[d] = g.mul(prev, inner)
                else:
                    strides[d] = arith.muli(inner, prev if not isinstance(prev, int) else g.c(prev))
            flat[pos] = strides
        return Epilogue(g, size, flat)

    def q_blocks(self, bm: int) -> ir.Value:
        """The run-time number of query blocks of ``bm`` rows (the grid's x)."""
        g = self.g
        return g.div(g.add(self.ch.seq_q, bm - 1), bm)

    def grid(self, bm: int, batch: int) -> tuple[str, str, str]:
        """The grid as the launcher evaluates it: a workgroup a (query block, batch)."""
        return run_time_sizes.grid_text(self.q_slot, 1, bm), str(batch), "1"


def out_position(ch: Chain) -> int:
    """The output's position among the kernel's buffers (inputs, then results)."""
    return len(ch.view.args) + ch.out_pos


def lse_position(ch: Chain) -> int:
    """The logsumexp's position among the kernel's buffers."""
    return len(ch.view.args) + ch.lse_pos


class Epilogue:
    """What the stores of a kernel with run-time lengths read (``SeqLengths.epilogue``):
    ``seq_q``, the queries' length, and where a result is flat its strides."""

    def __init__(self, g: GpuFunc, seq_q: ir.Value, flat: dict):
        self.g, self.seq_q, self.flat = g, seq_q, flat

    def at(self, pos: int, index: list) -> list:
        """The memref index of buffer ``pos``'s element at ``index``."""
        return index if pos not in self.flat else [linearize(self.g, index, self.flat[pos])]
