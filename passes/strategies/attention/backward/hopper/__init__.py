"""The attention backward on ``wgmma.mma_async`` (sm_90a): FlashAttention-3's backward.

A workgroup owns a key block (128 keys: two consumer warpgroups of 64, and a producer
warpgroup that copies) and walks the query blocks, recomputing P from the forward's
logsumexp; dK and dV stay in registers until the end, dQ of each step is added into f32
sums in global memory (atomic vector reductions), which a postprocess converts. Three
launches: ``preprocess`` (D, the scaled logsumexp, zeroed dQ sums), the main kernel
(``kernel``, ``producer``, ``consumer``), ``postprocess``. ``plan`` says where it applies.
"""

from __future__ import annotations

from mlir import ir

from ....base import EmittedKernel, TargetInfo
from .kernel import HopperBackward
from .plan import HopperBackwardPlan, plan


def emit(ch, kernel: ir.Operation, plan: dict, gpu_module: ir.Operation, target: TargetInfo) -> EmittedKernel:
    """The wgmma backward of a ``plan()`` plan."""
    return HopperBackward(ch, kernel, plan, gpu_module, target).emit()


__all__ = ["HopperBackward", "HopperBackwardPlan", "emit", "plan"]
