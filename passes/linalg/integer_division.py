"""Integer division in the functions torch-mlir gives kf, on every target: exact, and
never a trap.

torch-mlir's lowering of ``x // y`` on integers goes through double, which rounds int64
values past 2**53 (and on SPIR-V, where double becomes float, values past 2**24):
``integer_floor_division`` makes it an integer division. A CPU traps (SIGFPE, the process
dies) on an integer division by 0 and on INT_MIN / -1: ``guard_integer_division`` keeps
both divisors away from every integer division and remainder."""

from __future__ import annotations

from mlir import ir


def integer_floor_division(g: ir.Operation) -> None:
    """``fptosi(floor(sitofp(x) / sitofp(y)))`` -- torch-mlir's integer ``x // y``, in
    double -- as ``arith.floordivsi(x, y)`` on the integers.

    On SPIR-V the double becomes f32 (linalg_to_gpu's ``_f64_as_f32``): 2**24 + 1 // 1
    gave 2**24, and a driver whose division is not correctly rounded (Vulkan allows 2.5
    ulp) may give -49 // 7 = -8; in double (cpu, CUDA) int64 values past 2**53 round. The
    integer form is exact for every value, as torch's is."""
    from mlir.dialects import arith

    ops: list[ir.Operation] = []
    g.walk(lambda op: ops.append(op.operation) or ir.WalkResult.ADVANCE)

    def producer(v: ir.Value, name: str):
        owner = v.owner
        return owner if not isinstance(owner, ir.Block) and owner.name == name else None

    for op in ops:
        if op.name != "arith.fptosi" or not isinstance(op.results[0].type, ir.IntegerType):
            continue
        floor = producer(op.operands[0], "math.floor")
        div = floor and producer(floor.operands[0], "arith.divf")
        ints = div and [producer(v, "arith.sitofp") for v in div.operands]
        if not ints or not all(ints):
            continue
        x, y = (i.operands[0] for i in ints)
        t = op.results[0].type
        if x.type != t or y.type != t:
            continue
        with op.location, ir.InsertionPoint(op):
            q = arith.floordivsi(x, y)
        op.results[0].replace_all_uses_with(q)
        op.erase()
        chain = [floor, div, ints[0]] + ([ints[1]] if ints[1] != ints[0] else [])  # x // x: one sitofp
        for dead in chain:  # the float chain, where nothing else reads it
            if not any(True for _ in dead.results[0].uses):
                dead.erase()


_SIGNED = {"arith.divsi": "div", "arith.floordivsi": "div", "arith.ceildivsi": "div", "arith.remsi": "rem"}
_UNSIGNED = {"arith.divui": "div", "arith.ceildivui": "div", "arith.remui": "rem"}


def guard_integer_division(g: ir.Operation) -> None:
    """Each integer division or remainder by y divides by 1 where y is 0, and, if signed,
    where y is -1. A quotient by -1 is then -x (wrapping: INT_MIN // -1 is INT_MIN, as
    torch gives) and a remainder by -1 is 0. By 0 torch raises ZeroDivisionError on the
    CPU and CUDA leaves the value undefined; kf gives x (quotient) or 0 (remainder)."""
    from mlir.dialects import arith

    ops: list[ir.Operation] = []
    g.walk(lambda op: ops.append(op.operation) or ir.WalkResult.ADVANCE)
    for op in ops:
        kind = _SIGNED.get(op.name) or _UNSIGNED.get(op.name)
        if kind is None or "kf.guarded" in op.attributes:
            continue
        x, y = op.operands[0], op.operands[1]
        t = y.type
        if not isinstance(t, ir.IntegerType):  # (vectors: torch-mlir's scalar bodies have none)
            continue
        with op.location, ir.InsertionPoint(op):
            zero = arith.constant(t, 0)
            bad = arith.cmpi(arith.CmpIPredicate.eq, y, zero)
            negate = None
            if op.name in _SIGNED:
                negate = arith.cmpi(arith.CmpIPredicate.eq, y, arith.constant(t, -1))
                bad = arith.ori(bad, negate)
            safe = arith.select(bad, arith.constant(t, 1), y)
            guarded = ir.Operation.create(op.name, results=[op.results[0].type], operands=[x, safe],
                                          attributes={"kf.guarded": ir.UnitAttr.get()})
            result = guarded.results[0]
            if negate is not None:
                result = arith.select(negate, arith.subi(zero, x) if kind == "div" else zero, result)
        op.results[0].replace_all_uses_with(result)
        op.erase()
