"""Walking a gpu.module's ops, nested regions included, for the rewrites of kf-to-spirv."""

from __future__ import annotations

from mlir import ir


def walk_ops(block: ir.Block):
    """Every op under block, parents before children (a snapshot, safe to mutate)."""
    out = []

    def visit(b):
        for op in b.operations:
            out.append(op.operation)
            for r in op.operation.regions:
                for inner in r.blocks:
                    visit(inner)

    visit(block)
    return out


def walk_blocks(op: ir.Operation):
    for r in op.regions:
        for b in r.blocks:
            yield b
            for inner in b.operations:
                yield from walk_blocks(inner.operation)
