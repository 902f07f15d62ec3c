"""The ``matmul`` strategy: a batched ``kf.matmul`` and the elementwise ops that consume
its result (bias add, GELU, scale, cast), as one tiled GEMM kernel.

What the kernel does, and why:

- One workgroup computes a BLOCK_M x BLOCK_N tile of one batch element (grid x: column
  tiles, y: row tiles, z: the flattened broadcast batch). Each thread owns a
  THREAD_M x THREAD_N register tile of f32 accumulators, whatever the element type
  (kf's precision policy: low-precision inputs, f32 accumulation, one rounding when stored).
- The K loop stages an A tile (BLOCK_K x BLOCK_M, stored k-major with one word of row
  padding so the transposing stores do not all land in one bank) and a B tile
  (BLOCK_K x BLOCK_N) in workgroup memory, with a barrier before the loads (the previous
  step's readers are done) and one after (the tile is complete). Out-of-range elements
  are loaded as zero, so the K tail needs no special inner loop.
- A thread's rows and columns are strided (row ``tr + i * BLOCK_M / THREAD_M``), so a warp
  reads consecutive B words (no bank conflicts), broadcasts A words, and stores
  consecutive output columns (coalesced).
- The epilogue is evaluated per output element by ``Pointwise`` over the kernel
  function's own ops (scalar_math gives each op's arithmetic), so any elementwise chain
  kf-fuse puts after the matmul -- with operands that broadcast to the output, such as a
  bias row -- is computed in registers and only the final values are stored; every
  output row/column is guarded for the M and N tails.

The operands of the matmul are also evaluated through ``Pointwise`` while the tiles are
loaded, so ``x @ w.T`` (a kf.transpose of an argument) and broadcast batch dims read the
arguments directly; no transposed copy is made. Tiles read straight from an argument
are loaded with 128-bit vectors on CUDA when the rows allow it (``VectorStaging``).

On CUDA with f16/bf16 (fp8 from sm_89) operands the plan takes the tensor cores instead:
on sm_90a Hopper's wgmma (``wgmma.py``: operands from 128-byte swizzled shared memory by
descriptor, a cp.async pipeline with a wgmma group in flight), elsewhere, and where
wgmma's operand layouts do not apply, mma.sync (``mma.py``: fragments by ldmatrix, B
staged as it lies in memory, a cp.async pipeline of several stages or one staged tile
with a register prefetch of the next); the same epilogue on the f32 accumulators.
On SPIR-V with f16 operands, where the device lists the shape
(VK_KHR_cooperative_matrix), the plan takes cooperative matrices (``coopmat.py``: MLIR's
gpu.subgroup_mma ops, tiles staged in workgroup memory, the epilogue through an f32 C
tile). ``plan.py`` chooses the kernel and its tiles; its ``MatmulVariant`` holds the tuning
numbers a plan can be told (``kf-tile{matmul.stages=3}``). Not used: TMA (the tiles come
by cp.async). Measurements: bench/RESULTS.md.

Run-time sizes (run_time_sizes.py, ``gemm.RunTimeRows``): every kernel takes a
run-time M (the rows of A and C: the grid's row tiles a slot expression, the row tails
always guarded), a run-time leading batch dim (the grid's z), or a run-time K (a weight
gradient over run-time rows: the K loop runs to it, its tail zero-filled as a static
tail is). A run-time N, or one after a static dim that is not 1 (a run-time stride),
is the generic strategy's.

The kernel-building toolkit (``GpuFunc``, ``Pointwise``, tile staging) is ``kernel_ir.py``;
mma.sync and its K loops are ``nvidia/mma_sync.py``, wgmma's operands ``nvidia/wgmma.py``;
the recognized GEMM is ``gemm.py``, the SIMT kernel ``simt.py``, the cooperative-matrix
kernel ``coopmat.py``.
"""

from __future__ import annotations

from mlir import ir

from ..base import EmittedKernel, NotApplicable, Strategy, TargetInfo, register
from . import coopmat, mma, simt, wgmma
from .gemm import analyze
from .plan import MatmulVariant, simt_shared_bytes
from .plan import plan as _plan


class MatmulStrategy(Strategy):
    KIND = "matmul"
    VARIANT = MatmulVariant

    def plan(self, kernel: ir.Operation, target: TargetInfo, variant: MatmulVariant | None = None) -> dict:
        """Tiles from the problem size and the target (``plan.plan``)."""
        _, gm = analyze(kernel)
        return _plan(gm, target, variant or MatmulVariant())

    @staticmethod
    def _shared(bm: int, bn: int, bk: int) -> int:
        return simt_shared_bytes(bm, bn, bk)

    def emit(self, kernel: ir.Operation, plan: dict, gpu_module: ir.Operation, target: TargetInfo) -> EmittedKernel:
        view, gm = analyze(kernel)
        if plan.get("mma"):
            if target.name != "cuda":
                raise NotApplicable("the tensor-core matmul plan is for CUDA")
            if plan.get("wgmma"):
                return wgmma.emit(view, gm, kernel, plan, gpu_module, target)
            return mma.emit(view, gm, kernel, plan, gpu_module, target)
        if plan.get("coopmat"):
            if target.name != "spirv":
                raise NotApplicable("the cooperative-matrix matmul plan is for SPIR-V")
            return coopmat.emit(view, gm, kernel, plan, gpu_module, target)
        return simt.emit(view, gm, kernel, plan, gpu_module, target)


register(MatmulStrategy())
