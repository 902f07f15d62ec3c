"""What an attention kernel function computes, as the attention kernels read it
(``Chain``): q @ k^T, the elementwise chain of the scores (scale, mask, bias), the
softmax, the P chain (what the second product reads of it: the precision policy's
rounding and scales), the epilogue after P @ V and the optional row logsumexp of the
scores; the two chains applied to one value (``apply_p_chain``, ``apply_epilogue``),
and the logsumexp from the online softmax's running max and sum (``row_lse``).

Every kernel that takes an attention chain (the SIMT one, mma.sync, the Hopper kernels)
writes the logsumexp where the chain has it: ``m + log(l)`` with m the row's running
max and l the sum of ``exp(s - m)`` -- both kept anyway --, which is torch's logsumexp
of the scaled, masked scores (a row masked everywhere: the fill plus log(Sk), as the
kernels sum that row's fills over every key)."""

from __future__ import annotations

import math

from kf.dialects import spec_of
from kf.dialects.attrs import op_attrs
from kf.dialects.types import broadcast_shapes, defining
from kf.passes import scalar_math
from mlir import ir
from mlir.dialects import arith
from mlir.dialects import math as mmath

from ..base import NotApplicable
from ..kernel_ir import KernelView, Pointwise, contiguous_last, pointwise_closure

class Chain:
    """The recognized parts of an attention kernel function.

    ``mm1``, ``sm``, ``mm2``: q @ k^T, the softmax, the second product; ``q``, ``kt``,
    ``v``: the products' operands (``kt`` and, for fp8's K-major V, ``v`` may be
    transposes of arguments: ``_transposed_source``). ``p_value``: mm2's A operand,
    ``sm.result`` itself or the end of the P chain (casts and rank-0 scales of the
    softmax); ``p_scale``: the constant c with P chain = c * P up to its casts (1.0
    without scales), None where a multiplier is not a constant fill; ``p_elem``: the
    element type of mm2's A operand ("bf16", "f8E4M3FN", "f32"); ``epilogue_value``:
    the kernel's result, ``mm2.result`` itself or the end of the rank-0 scales and casts
    after it. ``out_pos``: that result's place among the kernel's results; ``lse_pos``:
    the place of the second result, ``kf.logsumexp`` of the softmax's operand over its
    last dim (the row logsumexp kf's autograd saves, of shape ``[..., Sq]``, or
    ``[..., Sq, 1]`` with ``lse_keepdim``), or None where the kernel returns O alone."""

    def __init__(self, kernel: ir.Operation):
        view = KernelView(kernel)
        self.view = view
        # The row logsumexp of the scores, where the kernel function returns it beside O
        lse_pos = [i for i, r in enumerate(view.results)
                   if defining(r) is not None and defining(r).name == "kf.logsumexp"]
        if len(view.results) - len(lse_pos[:1]) != 1:
            raise NotApplicable(f"@{view.name} returns {len(view.results)} values; attention returns O "
                                f"and optionally its scores' row logsumexp")
        self.out_pos = 1 - lse_pos[0] if lse_pos else 0
        self.lse_pos = lse_pos[0] if lse_pos else None
        # The epilogue: rank-0 scales and casts after P @ V (fp8's dequantization).
        self.epilogue_value = view.results[self.out_pos]
        mm2 = defining(view.results[self.out_pos])
        while mm2 is not None and _link(mm2) is not None:
            mm2 = defining(_link(mm2)[0])
        if mm2 is None or mm2.name != "kf.matmul":
            raise NotApplicable("the result is not matmul(softmax(...), v)")
        # The P chain: casts and rank-0 scales from the softmax to P @ V's A operand (the
        # precision policy's rounding of P). It is homogeneous of degree 1 in P, which is
        # what lets the kernels apply it to unnormalized probabilities.
        self.p_value, self.p_scale = mm2.operands[0], 1.0
        self.p_elem = spec_of(self.p_value.type).elem
        sm = defining(self.p_value)
        while sm is not None and _link(sm) is not None:
            x, c = _link(sm)
            self.p_scale = None if self.p_scale is None or math.isnan(c) else self.p_scale * c
            sm = defining(x)
        if sm is None or sm.name != "kf.softmax":
            raise NotApplicable("the first operand of the last matmul is not a softmax, or casts and rank-0 "
                                "scales of one")
        s_spec = spec_of(sm.result.type)
        if op_attrs(sm)["dim"] % s_spec.rank != s_spec.rank - 1:
            raise NotApplicable("softmax is not over the last dimension")
        if len(list(sm.result.uses)) != 1:
            raise NotApplicable("the softmax is used outside the last matmul")
        # The one matmul below the softmax through elementwise ops is q @ k^T.
        mm1s, stack, seen = [], [sm.operands[0]], set()
        while stack:
            v = stack.pop()
            if v in seen or view.arg_index(v) is not None:
                continue
            seen.add(v)
            op = defining(v)
            if op.name == "kf.matmul":
                mm1s.append(op)
                continue
            stack.extend(op.operands)
        if len(mm1s) != 1:
            raise NotApplicable(f"{len(mm1s)} matmuls feed the softmax; attention needs exactly q @ k^T")
        mm1 = mm1s[0]
        pointwise_closure(view, [sm.operands[0]], [mm1.result])
        scores = spec_of(mm1.result.type)
        for v in seen:
            if broadcast_shapes(spec_of(v.type).shape, scores.shape) != scores.shape:
                raise NotApplicable(f"{v.type} between the matmuls does not broadcast to the scores")
        q, kt = mm1.operands
        vv = mm2.operands[1]
        pointwise_closure(view, [q, kt, vv], [])
        self.mm1, self.sm, self.mm2 = mm1, sm, mm2
        self.q, self.kt, self.v = q, kt, vv
        self.scores = scores
        self.out = view.result_specs[self.out_pos]
        self.lse_keepdim = False
        if self.lse_pos is not None:
            lse = defining(view.results[self.lse_pos])
            lse_spec = view.result_specs[self.lse_pos]
            rows = self.out.shape[:-1]
            if lse.operands[0] != sm.operands[0] or lse_spec.shape not in (rows, rows + (1,)) or \
                    [d % scores.rank for d in op_attrs(lse).get("dims") or []] != [scores.rank - 1]:
                raise NotApplicable("the logsumexp the kernel returns is not that of the softmax's rows")
            self.lse_keepdim = lse_spec.shape == rows + (1,)
        qs, ks, vs = spec_of(q.type), spec_of(kt.type), spec_of(vv.type)
        self.seq_q, self.head_dim = qs.shape[-2], qs.shape[-1]
        self.seq_k = ks.shape[-1]
        self.head_dim_v = vs.shape[-1]
        self.batch = self.out.shape[:-2]
        self.k_d_contiguous = not contiguous_last(view, kt)  # k^T read through a transpose of k
        # A mask applied last, with a fill far below any real score (the seed's
        # masked_fill(mask == 0, -1e9)): key blocks where it masks every score add exactly
        # nothing to rows that have a real score somewhere, so the kernel may skip them.
        self.mask_cond, self.mask_fill = None, None
        last = defining(sm.operands[0])
        self.unmasked_scores = None  # the scores before the mask: a block the mask leaves whole
        if last is not None and last.name == "kf.masked_fill" and op_attrs(last)["value"] <= -1e4:
            self.mask_cond, self.mask_fill = last.operands[1], float(op_attrs(last)["value"])
            self.unmasked_scores = last.operands[0]


def _float_cast(op: ir.Operation) -> bool:
    return op.name == "kf.cast" and spec_of(op.operands[0].type).is_float and spec_of(op.result.type).is_float


def _link(op: ir.Operation) -> tuple[ir.Value, float] | None:
    """A link of the P chain or the epilogue: (its operand x, its factor) for a float
    cast of x (1), ``x * c``, ``c * x`` (c) or ``x / c`` (1 / c) with c rank-0 and x not;
    the factor is NaN where c is not a constant fill (an argument: fp8's scales). None for
    any other op."""
    if _float_cast(op):
        return op.operands[0], 1.0
    if op.name not in ("kf.mul", "kf.div"):
        return None
    a, b = op.operands
    rank0 = [not spec_of(v.type).shape for v in (a, b)]
    if rank0[1] and not rank0[0]:
        x, c = a, b
    elif op.name == "kf.mul" and rank0[0] and not rank0[1]:
        x, c = b, a
    else:
        return None
    fill = defining(c)
    if fill is None or fill.name != "kf.fill":
        return x, math.nan
    v = float(op_attrs(fill)["value"])
    return x, (v if op.name == "kf.mul" else 1.0 / v if v else math.nan)


def apply_p_chain(pw: Pointwise, ch: "Chain", p: ir.Value, index: list) -> ir.Value:
    """The P chain (what the second product reads of the softmax: fp8's ``cast(P * 256)``,
    bf16's ``cast(P)``) applied to an unnormalized probability p, in f32: the kernels
    round before the row sums divide (the chain is homogeneous in P, so the division
    commutes with everything but the rounding)."""
    if ch.p_value == ch.sm.result:
        return p
    pw.reset()
    pw.bind(ch.sm.result, p)
    out = scalar_math.convert(pw.eval(ch.p_value, index), ir.F32Type.get())
    pw.reset()
    return out


def apply_epilogue(pw: Pointwise, ch: "Chain", o: ir.Value, index: list) -> ir.Value:
    """The ops after P @ V (rank-0 scales, casts) on one output element o."""
    if ch.epilogue_value == ch.mm2.result:
        return o
    pw.reset()
    pw.bind(ch.mm2.result, o)
    out = pw.eval(ch.epilogue_value, index)
    pw.reset()
    return out


def transposed_source(v: ir.Value) -> ir.Value:
    """The operand of a kf.transpose that defines v (K for K^T), else v."""
    op = defining(v)
    return op.operands[0] if op is not None and op.name == "kf.transpose" else v


def row_lse(m: ir.Value, total: ir.Value, log2_domain: bool = False) -> ir.Value:
    """The row logsumexp from the online softmax's running max m and the row's sum
    ``total`` of ``exp(s - m)``: ``m + log(total)``; with ``log2_domain`` (m a max of
    scores times log2 e, total a sum of ``2^(s log2 e - m)``: the Hopper kernel's linear
    softmax) ``(m + log2(total)) ln 2``. -inf for a row with no finite score (torch's
    too)."""
    if log2_domain:
        return arith.mulf(arith.addf(m, mmath.log2(total)), arith.constant(ir.F32Type.get(), math.log(2.0)))
    return arith.addf(m, mmath.log(total))


def lse_index(ch: "Chain", lead: list, row: ir.Value, zero: ir.Value) -> list:
    """The index of query row ``row`` (batch index ``lead``) in the logsumexp result
    (``zero``: the index 0 of a kept dim)."""
    return [*lead, row, *([zero] if ch.lse_keepdim else [])]
