"""The attention strategy's Hopper kernel: FlashAttention on ``wgmma.mma_async`` (sm_90a).

The mma.sync kernel reads every K and V fragment from shared memory with ldmatrix into
registers, 16 query rows a warp. Here the tensor cores read K and V from shared memory
themselves, through matrix descriptors, and a warpgroup (4 warps) owns 64 query rows:

- Q (the workgroup's 128 rows) is copied once into 128-byte swizzled shared memory; K and
  V blocks of 128 keys are staged in the same layout (``nvidia.wgmma.SwizzledTile``: Q
  and K K-major over the head dim, V as it lies, keys by head dim, which wgmma reads
  transposed), in two or three stages (``plan``).
- Per key block, S = Q K^T by descriptor wgmmas, the online softmax on the accumulators
  (mma.sync's C layout per 8 columns), and O += P V with P from registers: the A
  fragment of a register-A wgmma is the layout the scores are in (``mma``).
- Where shared memory has room, a producer warpgroup copies K and V while two consumer
  warpgroups only compute, block j's S and block j - 1's P V in flight together
  (FlashAttention-3's warp specialization and intra-warpgroup pipeline; ``producer``,
  ``consumer``), and the kernel is persistent, one workgroup an SM over the tiles
  (``scheduler``).
- A mask every head shares gets a table of its key blocks, made by a kernel of its own
  before this one (``block_table``): dead blocks are skipped at no cost, blocks the mask
  leaves whole or gives the causal pattern take the softmax without reading it.
- fp8 q, k, v (``precision="fp8"``): both products are m64nNk32 e4m3/e5m2 wgmmas, K's rows
  staged so that the score accumulators are already P's fp8 A fragment, V read K-major
  from its transpose, which the precision policy stores.

The parts, one role a module: ``plan`` (whether the kernel applies, its shape and
variants), ``kernel`` (``HopperAttention``: the state the parts share), ``scheduler``,
``producer``, ``consumer``, ``mma``, ``softmax``, ``epilogue``, ``block_table``; the
barriers they meet on are ``nvidia.barriers``' (``StageBarriers``, ``NamedBarrier``).
"""

from __future__ import annotations

from mlir import ir

from ...base import EmittedKernel, TargetInfo
from .kernel import HopperAttention
from .plan import AttentionVariant, plan


def emit(ch, kernel: ir.Operation, plan: dict, gpu_module: ir.Operation, target: TargetInfo) -> EmittedKernel:
    """The wgmma attention kernel of a ``plan()`` plan (see the module docstring)."""
    return HopperAttention(ch, kernel, plan, gpu_module, target).emit()


__all__ = ["AttentionVariant", "HopperAttention", "emit", "plan"]
