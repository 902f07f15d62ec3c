"""Index checks of the ops that index through a tensor (gather, index_select, index_add,
scatter_add): indices outside their dimension read as 0, and the function's index error
flag (runtime/abi.py) says which op and which value."""

from __future__ import annotations

import contextvars
import re

from mlir import ir
from mlir.dialects import arith, linalg, tensor

from .. import scalar_math as sm
from ..base import PassError
from .build import empty, generic, i64_attr, identity_map, map_elements, projection_map, shape_of, tensor_type


def as_index(v: ir.Value) -> ir.Value:
    return arith.index_cast(ir.IndexType.get(), v)


class Sites:
    """The index checks of one function being lowered: per op, whether an index was
    out of range and the first such value (i1, i64 scalars); ``finish`` makes the flag."""

    def __init__(self) -> None:
        self.checks: list[tuple[dict, ir.Value, ir.Value]] = []

    def finish(self, f: ir.Operation) -> None:
        """Return the flag from f (last result) and record ``kf.index_sites`` on it."""
        from mlir.dialects import func

        i1, i32, i64 = (ir.IntegerType.get_signless(w) for w in (1, 32, 64))
        ret = list(f.regions[0].blocks[0].operations)[-1].operation
        with ir.InsertionPoint(ret), ret.location:
            hit, site, value = arith.constant(i1, 0), arith.constant(i32, 0), arith.constant(i64, 0)
            for n, (_, bad, v) in enumerate(self.checks):
                take = arith.andi(bad, arith.xori(hit, arith.constant(i1, 1)))
                site = arith.select(take, arith.constant(i32, n), site)
                value = arith.select(take, v, value)
                hit = arith.ori(hit, bad)
            words = [arith.extui(i32, hit), site, arith.trunci(i32, value),
                     arith.trunci(i32, arith.shrsi(value, arith.constant(i64, 32)))]
            flag = tensor.from_elements(tensor_type([len(words)], i32), words)
            func.ReturnOp([*ret.operands, flag])
        ret.erase()
        ftype = ir.FunctionType(ir.TypeAttr(f.attributes["function_type"]).value)
        f.attributes["function_type"] = ir.TypeAttr.get(
            ir.FunctionType.get(list(ftype.inputs), [*ftype.results, flag.type]))
        if "res_attrs" in f.attributes:
            f.attributes["res_attrs"] = ir.ArrayAttr.get([*ir.ArrayAttr(f.attributes["res_attrs"]),
                                                          ir.DictAttr.get({})])
        f.attributes["kf.index_sites"] = ir.ArrayAttr.get([ir.DictAttr.get({
            "op": ir.StringAttr.get(s["op"]), "where": ir.StringAttr.get(s["where"]),
            "dim": i64_attr(s["dim"]), "bound": i64_attr(s["bound"])}) for s, _, _ in self.checks])


#: The sites of the function the running kf-lower-to-linalg is lowering (per thread).
SITES: contextvars.ContextVar[Sites | None] = contextvars.ContextVar("kf_index_sites", default=None)


def checked_index(op: ir.Operation, index: ir.Value, bound: int, dim: int) -> ir.Value:
    """``index`` with every element outside [0, bound) replaced by 0, and a check of it
    recorded for the function's error flag (see the module docstring)."""
    sites = SITES.get()
    if sites is None:
        raise PassError(f"{op.name} needs its indices checked; lower it with kf-lower-to-linalg", op.location)
    i64 = ir.IntegerType.get_signless(64)
    shape, t = shape_of(index), ir.RankedTensorType(index.type).element_type
    rank = len(shape)

    def lowest_highest(a):
        v = sm.convert(a[0], i64) if t != i64 else a[0]
        return [arith.minsi(v, a[1]), arith.maxsi(v, a[2])]

    inits = [linalg.fill(arith.constant(i64, ext), outs=[empty([], i64)]) for ext in (2 ** 63 - 1, -2 ** 63)]
    lo, hi = generic([index], inits, [identity_map(rank), projection_map(rank, []), projection_map(rank, [])],
                     ["reduction"] * rank, lowest_highest)
    lo, hi = tensor.extract(lo, []), tensor.extract(hi, [])
    below = arith.cmpi(arith.CmpIPredicate.slt, lo, arith.constant(i64, 0))
    above = arith.cmpi(arith.CmpIPredicate.sge, hi, arith.constant(i64, bound))
    where = re.search(r'loc\("([^"]+)":(\d+)', str(op.location))
    site = {"op": op.name, "where": f"{where.group(1)}:{where.group(2)}" if where else "", "dim": dim,
            "bound": bound}
    sites.checks.append((site, arith.ori(below, above), arith.select(below, lo, hi)))

    def clamp(a):
        bad = arith.cmpi(arith.CmpIPredicate.uge, a[0], arith.constant(t, bound))
        return arith.select(bad, arith.constant(t, 0), a[0])

    return map_elements([index], shape, t, clamp, maps=[identity_map(rank)])
