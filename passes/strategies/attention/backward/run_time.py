"""The SIMT attention backward at run-time sequence lengths (strategies/
run_time_sizes.py): what its preprocess and its main kernel read to be written once for
every length up to BOUND.

The plan is made on the bounded kernel, so tiles, workgroup memory and the workspace
(f32 [2, batch x BOUND]: a row per query up to the bound) are those of the longest
sequences. A kernel written from it finds the lengths of the queries and the keys
(``Lengths``) from the shapes of q and k^T over its size slots (``RunTimeShapes``), so
that a length a kernel reads through a cast, a transpose or a broadcast is still its
argument's; every loop over a sequence runs to its run-time length, and every tail is
guarded (``run_time_sizes.ragged``). Buffers whose run-time sequence follows the heads
are declared flat and addressed with run-time strides (``Lengths.flat``). The grid's x
is an expression over the slots of the two lengths.

The main kernel takes the workspace after its inputs, so its results' slots are one
position further in its launch than in the kernel function
(``run_time_sizes.launch_slots``); the
preprocess takes the inputs only, and the slots of the inputs.
"""

from __future__ import annotations

from mlir import ir
from mlir.dialects import arith

from ... import run_time_sizes
from ...kernel_ir import GpuFunc, KernelView
from .chain import BackwardChain


def strided_positions(view: KernelView, slots) -> dict[int, int]:
    """``run_time_sizes.strided_positions`` of the kernel function's buffers."""
    return run_time_sizes.strided_positions([*view.arg_specs, *view.result_specs], slots)


def declare_flat(types: list, view: KernelView, slots, shift_results: int = 0) -> list:
    """The gpu.func's argument types with the flat buffers declared flat (``types``:
    inputs, then ``shift_results`` buffers of the kernel's own, then results)."""
    out = list(types)
    n_in = len(view.args)
    for pos in strided_positions(view, slots):
        at = pos if pos < n_in else pos + shift_results
        if at < len(out):
            out[at] = run_time_sizes.flat_type(out[at])
    return out


class Lengths:
    """The run-time sequence lengths of a backward kernel being written (``g``, whose
    last argument is the slots' buffer; ``kernel``: the bounded kernel function),
    computed at the top of its entry block: ``seq_q`` and ``seq_k`` (index values, or
    ints where a length is static), ``key_share`` (1 / Sk in f32), ``flat`` ({position:
    strides} of the flat buffers) and the slots the grid reads the lengths from. A
    run-time dim that is not a sequence (a batch, a head dim) is a ValueError: the
    driver then compiles the function for static sizes."""

    def __init__(self, g: GpuFunc, kernel: ir.Operation, ch: BackwardChain, slots):
        self.g, self.ch = g, ch
        self.slots = [tuple(s) for s in slots]
        self.sizes = sizes = run_time_sizes.SizeSlots(g.entry, g.args[-1], self.slots)
        shapes = run_time_sizes.RunTimeShapes(kernel, sizes)
        # (the scores have two run-time dims, of which the bounded kernel keeps the first:
        # each length is found from the product's operand that has it)
        q, kt = shapes.shape(ch.q), shapes.shape(ch.kt)
        bound = run_time_sizes.BOUND
        if any(not isinstance(x, int) for x in q[:-2] + kt[:-2]) or bound in (ch.head_dim, ch.head_dim_v):
            raise ValueError("the attention backward takes run-time sequence lengths only")
        self.seq_q, self.seq_k = q[-2], kt[-1]
        self.q_slot, self.k_slot = (self._slot_of(n) for n in (self.seq_q, self.seq_k))
        specs = [*ch.view.arg_specs, *ch.view.result_specs]
        self.flat = {pos: sizes.strides(specs[pos].shape, dim, self.slots.index((pos, dim)))
                     for pos, dim in strided_positions(ch.view, self.slots).items()}
        self.key_share = None
        if not isinstance(self.seq_k, int):
            with sizes._ip():
                f32 = ir.F32Type.get()
                keys = arith.uitofp(f32, arith.index_cast(ir.IntegerType.get_signless(32), self.seq_k))
                self.key_share = arith.divf(arith.constant(f32, 1.0), keys)

    def _slot_of(self, n) -> int | None:
        if isinstance(n, int):
            return None
        for k in range(len(self.slots)):
            if self.sizes.size(k) == n:
                return k
        raise ValueError("a sequence length of the attention backward is not one of its arguments' sizes")

    def flat_inputs(self) -> dict:
        """The flat inputs' strides (``Pointwise.flat``, ``direct_source(..., flat=)``)."""
        n_in = len(self.ch.view.args)
        return {pos: s for pos, s in self.flat.items() if pos < n_in}

    def blocks_text(self, slot: int | None, static: int, per_slot: int, block: int) -> str:
        """ceil(length * per_slot / block) as the launcher evaluates it (``static``: the
        length where it is not a run-time size)."""
        if slot is None:
            return str(-(-static * per_slot // block))
        return run_time_sizes.grid_text(slot, per_slot, block)


def mul(a, b):
    """a * b of index values and ints."""
    if isinstance(a, int) and isinstance(b, int):
        return a * b
    g_a = a if not isinstance(a, int) else arith.constant(ir.IndexType.get(), a)
    g_b = b if not isinstance(b, int) else arith.constant(ir.IndexType.get(), b)
    return arith.muli(g_a, g_b)


def div(a: ir.Value, b):
    """a // b for an index value a and an int or index value b."""
    return arith.divui(a, b if not isinstance(b, int) else arith.constant(ir.IndexType.get(), b))


def rem(a: ir.Value, b):
    """a % b for an index value a and an int or index value b."""
    return arith.remui(a, b if not isinstance(b, int) else arith.constant(ir.IndexType.get(), b))


def ceil_div(g: GpuFunc, n, block: int):
    """ceil(n / block) of an int or an index value."""
    if isinstance(n, int):
        return -(-n // block)
    return g.div(g.add(n, block - 1), block)
