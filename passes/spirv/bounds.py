"""A bound on the loop iterations one invocation of a kernel runs (lavapipe ends an
invocation after 65535; the Vulkan launcher refuses a kernel over a device's limit)."""

from __future__ import annotations

import math

from mlir import ir


_INF = math.inf


def _mul(a: float, b: float) -> float:
    return 0 if a == 0 or b == 0 else a * b


class _Bounds:
    """Integer bounds (lo, hi) of a kernel's index values, from its constants, its
    workgroup size and grid (``known_block_size``, ``kf.grid``), arithmetic and loop
    induction variables; (-inf, inf) where the value comes from memory or from an op
    this does not follow."""

    def __init__(self, func: ir.Operation):
        block = tuple(ir.DenseI32ArrayAttr(func.attributes["known_block_size"])) \
            if "known_block_size" in func.attributes else ()
        grid = tuple(ir.DenseI64ArrayAttr(func.attributes["kf.grid"])) if "kf.grid" in func.attributes else ()
        self.block = {d: n for d, n in zip("xyz", block)}
        self.grid = {d: n for d, n in zip("xyz", grid)}
        self.known: dict = {}
        # a kernel with run-time sizes reads them from its last argument, each at least 1
        # and at most the largest its plan takes (runtime/abi.py's bind_sizes)
        self.slots = None
        if "kf.size_slots" in func.attributes and func.regions[0].blocks[0].arguments:
            from kf.runtime.abi import MAX_DYNAMIC_SIZE

            largest = ir.IntegerAttr(func.attributes["kf.largest_slot"]).value \
                if "kf.largest_slot" in func.attributes else MAX_DYNAMIC_SIZE
            self.slots = (func.regions[0].blocks[0].arguments[-1], largest)

    def of(self, v: ir.Value) -> tuple[float, float]:
        hit = self.known.get(v)
        if hit is None:
            hit = self.known[v] = self._compute(v)
        return hit

    def _compute(self, v: ir.Value) -> tuple[float, float]:
        if isinstance(v.owner, ir.Block):
            return -_INF, _INF
        op = v.owner.operation
        name, args = op.name, list(op.operands)
        if name == "arith.constant":
            attr = op.attributes["value"]
            return (ir.IntegerAttr(attr).value,) * 2 if isinstance(attr, ir.IntegerAttr) else (-_INF, _INF)
        if name in ("gpu.thread_id", "gpu.block_id", "gpu.block_dim", "gpu.grid_dim"):
            dim = str(op.attributes["dimension"]).rstrip(">").split()[-1]  # #gpu<dim x>
            size = (self.block if name in ("gpu.thread_id", "gpu.block_dim") else self.grid).get(dim)
            if name in ("gpu.block_dim", "gpu.grid_dim"):
                return (size, size) if size else (1, _INF)
            return 0, (size - 1 if size else _INF)
        if name in ("arith.index_cast", "arith.index_castui", "arith.extsi", "arith.extui", "arith.trunci"):
            return self.of(args[0])
        if name == "memref.load" and self.slots is not None and args and args[0] == self.slots[0]:
            return 1, self.slots[1]
        if name == "arith.select":
            (a, b), (c, d) = self.of(args[1]), self.of(args[2])
            return min(a, c), max(b, d)
        if len(args) != 2:
            return -_INF, _INF
        (a, b), (c, d) = self.of(args[0]), self.of(args[1])
        if name == "arith.addi":
            return a + c, b + d
        if name == "arith.subi":
            return a - d, b - c
        if name == "arith.muli":
            ends = [_mul(x, y) for x in (a, b) for y in (c, d)]
            return min(ends), max(ends)
        if name in ("arith.minsi", "arith.minui"):
            return min(a, c), min(b, d)
        if name in ("arith.maxsi", "arith.maxui"):
            return max(a, c), max(b, d)
        if c > 0 and a >= 0:  # by a positive divisor (a constant, or a run-time size: at least 1)
            if name in ("arith.divui", "arith.divsi", "arith.floordivsi"):
                return (a // d if d < _INF else 0), (b // c if b < _INF else _INF)
            if name in ("arith.ceildivui", "arith.ceildivsi"):
                return (-(-a // d) if d < _INF else 0), (-(-b // c) if b < _INF else _INF)
            if name in ("arith.remui", "arith.remsi"):
                return 0, min(b, d - 1)
        return -_INF, _INF

    def trips(self, loop: ir.Operation) -> float:
        """At most how many times an scf.for runs its body."""
        lb, ub, step = (self.of(x) for x in list(loop.operands)[:3])
        if step[0] <= 0:
            return _INF
        span = ub[1] - lb[0]
        return max(0, math.ceil(span / step[0])) if span < _INF else _INF


def loop_iterations(func: ir.Operation) -> int:
    """At most how many loop iterations one invocation of a kernel runs, all loops
    together (-1 where no bound is known): a loop that runs t times counts t + 1 (its
    exit test), a nested loop once per iteration of the loops around it, and both
    branches of an ``scf.if`` count (a SIMD group of invocations runs both).

    Why: Mesa's lavapipe (llvmpipe) stops every shader invocation after 65535 loop
    iterations in all, its guard against infinite loops, and the work after that is
    silently dropped; the Vulkan launcher refuses a kernel over a device's limit."""
    bounds = _Bounds(func)

    def cost(block: ir.Block) -> float:
        total = 0.0
        for op in block.operations:
            op = op.operation
            if op.name == "scf.while":
                return _INF
            if op.name == "scf.for":
                body = op.regions[0].blocks[0]
                lb, ub = bounds.of(op.operands[0]), bounds.of(op.operands[1])
                bounds.known[body.arguments[0]] = (lb[0], ub[1] - 1)
                t = bounds.trips(op)
                total += t + 1 + _mul(t, cost(body))
            else:
                total += sum(cost(b) for r in op.regions for b in r.blocks)
        return total

    n = sum(cost(b) for b in func.regions[0].blocks)
    return int(n) if n < _INF else -1
