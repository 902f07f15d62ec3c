"""The ``attention_backward`` strategy: the gradients of ``softmax(f(q @ k^T)) @ v`` as
FlashAttention-2/3 compute them, without the score matrix in global memory.

kf-fuse gives the backward one kernel function (``chain.BackwardChain`` says what it
holds: the scores and dP recomputed from q, k, v and dO, P from the forward's row
logsumexp, D = rowsum(dO * O), and the products dq, dk, dv). It is written as:

- a preprocess (``preprocess``), launched first: each query row's D and logsumexp into
  a workspace;
- the main kernel: a workgroup per key block accumulates dK and dV over the query
  blocks, recomputing P from the logsumexp; dQ in workgroups per query block of the
  same launch (``simt``, every target), or on sm_90a (``hopper``) by wgmma, with dQ
  added atomically into f32 sums and converted by a postprocess.

At run-time sequence lengths (strategies/run_time_sizes.py) the SIMT kernels are
written once for every length; the wgmma kernel is written for static lengths, so on
sm_90a a backward it takes compiles per length (a ValueError here: the driver then
compiles the function for static sizes rather than run the SIMT kernel there).

Measurements: bench/RESULTS.md.
"""

from __future__ import annotations

from mlir import ir

from ... import run_time_sizes
from ...base import EmittedKernel, NotApplicable, Strategy, TargetInfo, register
from . import hopper, simt
from .chain import BackwardChain


class AttentionBackwardStrategy(Strategy):
    KIND = "attention_backward"

    def plan(self, kernel: ir.Operation, target: TargetInfo, variant=None) -> dict:
        ch = BackwardChain(kernel)
        if run_time_sizes.is_bounded(kernel):
            if hopper.plan(ch, target):
                raise ValueError("the wgmma attention backward is written for static sequence lengths")
            return simt.plan(ch, target)
        return hopper.plan(ch, target) or simt.plan(ch, target)

    def emit(self, kernel: ir.Operation, plan: dict, gpu_module: ir.Operation, target: TargetInfo) -> EmittedKernel:
        ch = BackwardChain(kernel)
        if plan.get("kernel") == "simt":
            return simt.SimtBackward(ch, kernel, plan, gpu_module, target).emit()
        if plan.get("kernel") == "hopper":
            if target.name != "cuda":
                raise NotApplicable("the wgmma attention backward plan is for CUDA")
            return hopper.emit(ch, kernel, plan, gpu_module, target)
        raise NotApplicable(f"no attention backward kernel '{plan.get('kernel')}'")


register(AttentionBackwardStrategy())
