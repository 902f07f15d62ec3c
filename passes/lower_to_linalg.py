"""kf-lower-to-linalg: rewrite every kf op into linalg, tensor, arith, math and scf on
tensors (linalg-on-tensors, the level torch-mlir hands over), so that upstream tiling,
fusion, bufferization and the target pipelines apply to kf programs.

How each family is lowered (test/passes/kf-lower-to-linalg.mlir shows representative
cases; test/python/passes/test_lower_to_linalg_cpu.py runs every op against torch):
- elementwise ops: one ``linalg.generic`` whose indexing maps do torch broadcasting
  (a size-1 operand dim reads index 0, missing leading dims are dropped, rank-0
  operands map to ``()``); the scalar body comes from ``scalar_math.emit``;
- reductions (sum, mean, reduce_max/min, var, argmax): a ``linalg.generic`` with
  reduction iterators into a filled accumulator, then a parallel generic that
  finishes (divides, rounds) and ``tensor.expand_shape`` for ``keepdim``;
- softmax/log_softmax: max, then sum of ``exp(x - max)``, then the normalized value,
  so that large inputs do not overflow;
- matmul: ``linalg.matmul`` / ``linalg.batch_matmul`` when the ranks allow, otherwise
  a generic contraction whose maps broadcast the batch dims;
- layout: ``linalg.transpose``, ``tensor.collapse_shape``/``expand_shape``,
  ``tensor.extract_slice``, ``tensor.insert_slice`` into ``tensor.empty`` (concat);
- topk: an ``scf.for`` over k that runs a masked arg-best reduction and marks the
  element it picked; gather/index_select: a generic that ``tensor.extract``s;
  index_add/scatter_add: ``scf.for`` loops over the index with extract/insert;
- rand: a parallel generic computing each element's sample from its Philox block, found
  from its linear index (``linalg.index``) and the state's two words (``passes/philox.py``).

Index checks: an op that indexes through a tensor (gather, index_select, index_add,
scatter_add) reads its indices through a copy in which each one outside the dimension
it indexes is 0 (so no extract or insert leaves the tensor), and one reduction over the
indices (their minimum and maximum) tells whether any was outside. The function gets
one more result, last: the index error flag of runtime/abi.py (``tensor<4xi32>``: set,
which op, the value), and the attribute ``kf.index_sites`` listing the ops in the
flag's numbering (op, the user's file:line, dim, bound), from which the driver makes
``ProgramABI.index_sites``.

Precision policy: f16, bf16 and fp8 elementwise math is computed in f32 and rounded
once to the result type; a bf16/f16 result that only elementwise ops read is not rounded
at all but stays an f32 tensor (``keeps_wide``: rounded once, where something else reads
it, as in a fused GPU kernel); reductions and matmul accumulate in f32 (f64 stays f64,
integers accumulate in their own type). torch-mlir's functions (the ATen ops kf has no op
for) compute bf16/f16 in f32 and round where they return (``compute_in_f32``), as torch's
CPU kernels do.
"""

from __future__ import annotations

import dataclasses

from mlir import ir

from kf.dialects.elements import STORAGE_INTS

from .base import KfPass, PassError
from .linalg.index_checks import SITES, Sites
from .linalg.narrow import compute_in_f32
from .linalg.ops import keeps_wide, lower_op


@dataclasses.dataclass(frozen=True)
class LowerToLinalgPass(KfPass):
    NAME = "kf-lower-to-linalg"
    DESCRIPTION = "rewrite kf ops into linalg/tensor/arith/math/scf on tensors"

    def run(self, module: ir.Operation) -> None:
        ops: list[ir.Operation] = []

        def visit(op):
            if op.name.startswith("kf."):
                ops.append(op.operation)
            return ir.WalkResult.ADVANCE

        module.walk(visit)
        for op in module.regions[0].blocks[0].operations:
            op = op.operation
            if op.name == "func.func" and "kf.aten" in op.attributes:
                compute_in_f32(op)
        # Decided before any op is lowered (lowering replaces the users' operands).
        wide = {id(op) for op in ops if keeps_wide(op)}
        unsigned = {id(op) for op in ops if op.name == "kf.cast" and _is_unsigned(op.operands[0].type)}
        _signless_unsigned(module)
        # Producers before users is the walk's order; each op's operands are already
        # lowered values (or block arguments) when its turn comes.
        by_function: dict = {}
        for op in ops:
            by_function.setdefault(_function_of(op), []).append(op)
        for f, members in by_function.items():
            sites = Sites()
            token = SITES.set(sites)
            try:
                for op in members:
                    lower_op(op, wide=id(op) in wide, unsigned_source=id(op) in unsigned)
            finally:
                SITES.reset(token)
            if sites.checks:
                if f is None or f.name != "func.func":
                    raise PassError("index checks need the indexing op inside a func.func", members[0].location)
                sites.finish(f)


def _is_unsigned(t: ir.Type) -> bool:
    return isinstance(t, ir.RankedTensorType) and str(ir.RankedTensorType(t).element_type) in STORAGE_INTS


def _signless(t: ir.Type) -> ir.Type:
    """t with uint8 elements held as i8 (STORAGE_INTS), else t."""
    if not _is_unsigned(t):
        return t
    rt = ir.RankedTensorType(t)
    return ir.RankedTensorType.get(list(rt.shape), ir.Type.parse(STORAGE_INTS[str(rt.element_type)]))


def _signless_unsigned(module: ir.Operation) -> None:
    """Every uint8 tensor of the module's functions (arguments, results, kf ops' results)
    as an i8 tensor of the same bits: linalg and arith take signless integers. The kf.casts
    that read uint8 are noted before (``unsigned_source``) and zero-extend."""
    for f in module.regions[0].blocks[0].operations:
        f = f.operation
        if f.name != "func.func":
            continue
        ft = ir.FunctionType(ir.TypeAttr(f.attributes["function_type"]).value)
        if any(_is_unsigned(t) for t in [*ft.inputs, *ft.results]):
            f.attributes["function_type"] = ir.TypeAttr.get(ir.FunctionType.get(
                [_signless(t) for t in ft.inputs], [_signless(t) for t in ft.results]))
        for block in f.regions[0].blocks:
            for a in block.arguments:
                if _is_unsigned(a.type):
                    a.set_type(_signless(a.type))
            for op in block.operations:
                for r in op.operation.results:
                    if _is_unsigned(r.type):
                        r.set_type(_signless(r.type))


def _function_of(op: ir.Operation) -> ir.Operation | None:
    """The func.func (or other top-level op) that holds op."""
    parent = op.parent
    while parent is not None and parent.name not in ("func.func", "builtin.module"):
        parent = parent.parent
    return parent
