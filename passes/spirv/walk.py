"""Walking a gpu.module's ops, nested regions included, for the rewrites of kf-to-spirv."""

from __future__ import annotations

from mlir import ir


def walk_ops(block: ir.Block):
    """Every op under block, parents before children (a snapshot, safe to mutate). The
    walk runs in MLIR's C++ (Operation.walk): a Python visit of every region and block
    took most of kf-to-spirv's time."""
    out = []

    def keep(op):
        out.append(op)
        return ir.WalkResult.ADVANCE

    for op in block.operations:
        op.operation.walk(keep, ir.WalkOrder.PRE_ORDER)
    return out


def walk_blocks(op: ir.Operation):
    for r in op.regions:
        for b in r.blocks:
            yield b
            for inner in b.operations:
                yield from walk_blocks(inner.operation)
