"""What an attention backward kernel function computes, as the backward kernels read it
(``BackwardChain``).

kf-fuse gives the backward of ``softmax(f(q @ k^T)) @ v`` one kernel function (kind
``attention_backward``) of this form, every value [.., Sq, Sk] computed one element at a
time from the two products and per-row values:

- ``S = q @ k^T`` and ``dP = dO @ v^T`` (the *inner* products);
- ``P = exp(x - L)``: x the forward's softmax operand (f of S: scale, mask, bias), L the
  forward's row logsumexp ([.., Sq, 1]); the ``exp`` op is ``p``;
- ``D = sum(h, -1, keepdim)``: FlashAttention's row term rowsum(dP * P), which kf-fuse
  writes as rowsum(dO * O) with the forward's output O, so h reads arguments only;
- the results, each an *output product* through an epilogue (casts, rank-0 scales, a
  transpose of the last two dims): ``dv = Pv^T @ dO``, ``dk = dSk^T @ q`` (or
  ``(q^T @ dSk)^T``), ``dq = dSq @ k``, where Pv depends on S only and dSk, dSq on dP too.

A kernel evaluates Pv, dSk and dSq per element with ``Pointwise`` once S, dP and D are
bound (``bind``); any of the three results may be missing. What is not of this form is
``NotApplicable``.
"""

from __future__ import annotations

from dataclasses import dataclass

from kf.dialects import spec_of
from kf.dialects.attrs import op_attrs
from kf.dialects.types import TensorSpec, defining, swaps_last_two
from mlir import ir
from mlir.dialects import arith
from mlir.dialects import math as mmath

from ...base import NotApplicable
from ...kernel_ir import KernelView, Pointwise, pointwise_closure

#: A masked score this far below zero or lower is a mask's fill: its probability is 0
#: in every row that has a real score (as in the forward's ``Chain.mask_fill``).
MASK_FILL_AT_MOST = -1e4


@dataclass
class Product:
    """An output product ``mm = matmul(A, B)`` and the kernel result it makes.

    ``region``: the operand that is (a transpose of) a [.., Sq, Sk] value of the chain,
    ``data``: the other (q, k or dO); ``over_queries``: whether the product sums over
    the queries (dk, dv) or the keys (dq); ``result``: the kernel's result index;
    ``swapped``: the result holds mm transposed (``(q^T @ dSk)^T``)."""

    role: str
    mm: ir.Operation
    region: ir.Value
    data: ir.Value
    region_is_lhs: bool
    over_queries: bool
    result: int
    swapped: bool

    def region_index(self, pw: Pointwise, batch: list, rank: int, i, j) -> list:
        """The index of ``region`` at query i, key j of the batch element ``batch`` (an
        index of the scores' ``rank`` - 2 leading dims)."""
        spec = spec_of(self.region.type)
        lead = pw.operand_index(spec.shape[:-2], batch, rank - 2)
        if self.over_queries and self.region_is_lhs:  # A = (..)^T: [.., Sk, Sq]
            return lead + [j, i]
        return lead + [i, j]

    def data_index(self, pw: Pointwise, batch: list, rank: int, r, c) -> list:
        """The index of ``data`` at sequence position r (the summed one) and column c."""
        spec = spec_of(self.data.type)
        lead = pw.operand_index(spec.shape[:-2], batch, rank - 2)
        if self.region_is_lhs:  # B: [.., r, c]
            return lead + [r, c]
        return lead + [c, r]  # A = q^T: [.., c, r]

    @property
    def width(self) -> int:
        """Columns of the result (head dim of q, k or v)."""
        spec = spec_of(self.data.type)
        return spec.shape[-1] if self.region_is_lhs else spec.shape[-2]


class BackwardChain:
    """The roles of an attention backward kernel function (see the module docstring).

    ``mm_s``, ``mm_dp``: the inner products; ``q``, ``kt``, ``do``, ``vt``: their
    operands; ``p``: the ``exp`` op of P; ``x``: the softmax operand; ``lse``: the row
    logsumexp value subtracted; ``d_sum``: the row sum of D, ``d_src`` its operand;
    ``products``: role ("dq", "dk", "dv") -> ``Product``; ``mask_cond``, ``mask_fill``:
    a mask applied last to x (``masked_fill`` or ``select`` with a fill of at most
    ``MASK_FILL_AT_MOST``), else None."""

    def __init__(self, kernel: ir.Operation | None = None, view=None):
        """Of a kernel function, or of ``view``: anything with a KernelView's ``name``,
        ``args``, ``ops``, ``results``, ``arg_specs``, ``result_specs`` and ``arg_index``
        (kf-fuse's candidate groups)."""
        view = view if view is not None else KernelView(kernel)
        self.view = view
        live = _live_ops(view)
        matmuls = [op for op in live if op.name == "kf.matmul"]
        sums = [op for op in live if op.name in ("kf.sum", "kf.mean", "kf.reduce_max", "kf.reduce_min", "kf.var",
                                                     "kf.softmax", "kf.log_softmax")]
        if len(sums) != 1 or sums[0].name != "kf.sum":
            raise NotApplicable(f"@{view.name}: an attention backward has one row sum (D), not "
                                f"{[s.name for s in sums]}")
        self.d_sum = sums[0]
        # the results, each through its epilogue down to an output product
        outs = {}
        for n, r in enumerate(view.results):
            mm, swapped = _epilogue_product(r)
            if mm is None:
                raise NotApplicable(f"@{view.name}: result {n} is not a product through casts, scales and "
                                    "transposes")
            outs[mm] = (n, swapped)
        inner = [op for op in matmuls if op not in outs]
        if len(inner) != 2:
            raise NotApplicable(f"@{view.name}: {len(inner)} products feed the results; the attention backward "
                                "has two (q @ k^T and dO @ v^T)")
        exps = [op for op in live if op.name == "kf.exp" and _exp_of_difference(op, inner)]
        if len(exps) != 1:
            raise NotApplicable(f"@{view.name}: {len(exps)} exp(x - lse) ops; the backward recomputes P once")
        self.p = exps[0]
        sub = defining(self.p.operands[0])
        self.x, self.lse = sub.operands
        reads_x = _reaches(self.x, inner)
        if len(reads_x) != 1:
            raise NotApplicable(f"@{view.name}: the softmax operand reads {len(reads_x)} products")
        self.mm_s = reads_x[0]
        self.mm_dp = inner[1] if inner[0] == self.mm_s else inner[0]
        self.q, self.kt = self.mm_s.operands
        self.do, self.vt = self.mm_dp.operands
        s_spec = spec_of(self.mm_s.result.type)
        if spec_of(self.mm_dp.result.type).shape != s_spec.shape:
            raise NotApplicable(f"@{view.name}: q @ k^T and dO @ v^T differ in shape")
        self.scores = s_spec
        self.seq_q, self.seq_k = s_spec.shape[-2:]
        self.head_dim = spec_of(self.q.type).shape[-1]
        self.head_dim_v = spec_of(self.do.type).shape[-1]
        # D reads arguments only (rowsum(dO * O)); rowsum(dP * P) would need the row first
        x_spec = spec_of(self.d_sum.operands[0].type)
        attrs = op_attrs(self.d_sum)
        dims = [d % x_spec.rank for d in attrs["dims"]]
        if dims != [x_spec.rank - 1] or not attrs["keepdim"] or x_spec.shape[-2] != self.seq_q:
            raise NotApplicable(f"@{view.name}: D is not a row sum over the last dim with keepdim")
        self.d_src = self.d_sum.operands[0]
        if _reaches(self.d_src, inner):
            raise NotApplicable(f"@{view.name}: D reads the products (kf-fuse writes it as rowsum(dO * O))")
        pointwise_closure(view, [self.d_src], [])
        if _reaches(self.lse, inner) or spec_of(self.lse.type).shape[-1:] not in ((), (1,)):
            raise NotApplicable(f"@{view.name}: the logsumexp is not a per-row value")
        # everything between the inner products and the output products is elementwise
        self.products: dict[str, Product] = {}
        for mm, (n, swapped) in outs.items():
            prod = self._product(mm, n, swapped, inner)
            if prod.role in self.products:
                raise NotApplicable(f"@{view.name}: two results are {prod.role}")
            self.products[prod.role] = prod
        bound = [self.mm_s.result, self.mm_dp.result, self.d_sum.result]
        pointwise_closure(view, [p.region for p in self.products.values()], bound)
        pointwise_closure(view, [self.q, self.kt, self.do, self.vt] + [p.data for p in self.products.values()], [])
        self.batch = list(s_spec.shape[:-2])
        self.mask_cond, self.mask_fill, self.unmasked_x = _last_mask(self.x)

    def _product(self, mm: ir.Operation, n: int, swapped: bool, inner: list) -> Product:
        a, b = mm.operands
        sq, sk = self.seq_q, self.seq_k
        view = self.view
        if _reaches(a, inner) and not _reaches(b, inner):
            region, data, lhs = a, b, True
        elif _reaches(b, inner) and not _reaches(a, inner):
            region, data, lhs = b, a, False
        else:
            raise NotApplicable(f"@{view.name}: result {n}'s product does not read the chain on one side")
        shape = spec_of(region.type).shape[-2:]
        t = defining(region)
        through_transpose = t is not None and t.name == "kf.transpose" and swaps_last_two(op_attrs(t)["perm"])
        if lhs and through_transpose and shape == (sk, sq) and not swapped:  # (..)^T @ data: dk or dv
            over_queries = True
        elif lhs and not through_transpose and shape == (sq, sk) and not swapped:  # dq = dS @ k
            over_queries = False
        elif not lhs and shape == (sq, sk) and swapped:  # dk = (q^T @ dS)^T
            over_queries = True
        else:
            raise NotApplicable(f"@{view.name}: result {n}'s product is not one of dq, dk, dv")
        reads_dp = bool([m for m in _reaches(region, inner) if m == self.mm_dp])
        if over_queries:
            role = "dk" if reads_dp else "dv"
            expected = self.q if reads_dp else self.do
        else:
            role, expected = "dq", None
            if not reads_dp:
                raise NotApplicable(f"@{view.name}: result {n} sums P over the keys, not dS")
            if not (_same_tensor(data, _untransposed(self.kt)) or _same_tensor(_untransposed(data), self.kt)):
                raise NotApplicable(f"@{view.name}: dq's product does not read k")
        if role == "dv" and not _same_tensor(data, self.do):
            raise NotApplicable(f"@{view.name}: dv's product does not read dO")
        if role == "dk" and not _same_tensor(_untransposed(data) if not lhs else data, expected):
            raise NotApplicable(f"@{view.name}: dk's product does not read q")
        return Product(role, mm, region, data, lhs, over_queries, n, swapped)

    # ---- per element

    def bind(self, pw: Pointwise, s: ir.Value | None, dp: ir.Value | None, d_row: ir.Value | None) -> None:
        """Bind the scores, dP and D for one element (after ``pw.reset()``)."""
        if s is not None:
            pw.bind(self.mm_s.result, s)
        if dp is not None:
            pw.bind(self.mm_dp.result, dp)
        if d_row is not None:
            pw.bind(self.d_sum.result, d_row)

    def probability(self, pw: Pointwise, index: list, lse: ir.Value, key_share: ir.Value | None = None
                    ) -> ir.Value:
        """P at ``index`` (S bound) from the row's logsumexp ``lse`` (f32), bound as the
        exp's result so that the chain reads it: exp(x - lse); in a row that a mask
        masks everywhere (lse within half the fill), exp((x - fill) - log Sk), which is
        1 / Sk at every masked score -- the forward's uniform softmax over the fills,
        which x - lse loses (fill + log Sk rounds to the fill in f32). ``key_share``:
        1 / Sk as an f32 value where the keys' length is a run-time size."""
        f32 = ir.F32Type.get()
        from kf.passes import scalar_math

        x = scalar_math.convert(pw.eval(self.x, index), f32)
        e = arith.subf(x, lse)
        p = None
        if self.mask_fill is not None:
            # the row's factor 1 / Sk after the exp: a subtraction of log Sk after the
            # fill's could be folded into one constant (Vulkan compilers reassociate),
            # which rounds back to the fill
            dead = arith.cmpf(arith.CmpFPredicate.OLE, lse, arith.constant(f32, self.mask_fill / 2))
            e = arith.select(dead, arith.subf(x, arith.constant(f32, self.mask_fill)), e)
            share = arith.select(dead, key_share if key_share is not None else arith.constant(f32, 1.0 / self.seq_k),
                                 arith.constant(f32, 1.0))
            p = arith.mulf(mmath.exp(e), share)
        p = p if p is not None else mmath.exp(e)
        pw.bind(self.p.result, p)
        return p

    def spec(self, role: str) -> TensorSpec:
        """The kernel result's spec of a product."""
        return self.view.result_specs[self.products[role].result]


def _live_ops(view: KernelView) -> list[ir.Operation]:
    """The kernel function's ops that its results are computed from, in order."""
    seen, stack = set(), list(view.results)
    while stack:
        op = defining(stack.pop())
        if op is None or op in seen:
            continue
        seen.add(op)
        stack.extend(op.operands)
    return [op for op in view.ops if op in seen]


def _epilogue_product(r: ir.Value) -> tuple[ir.Operation | None, bool]:
    """The output product under a result (through float casts, rank-0 scales and
    transposes of the last two dims) and whether they transpose it."""
    swapped = False
    op = defining(r)
    while op is not None and op.name != "kf.matmul":
        if op.name == "kf.cast" and spec_of(op.operands[0].type).is_float and spec_of(op.result.type).is_float:
            op = defining(op.operands[0])
        elif op.name == "kf.transpose" and swaps_last_two(op_attrs(op)["perm"]):
            swapped = not swapped
            op = defining(op.operands[0])
        elif op.name in ("kf.mul", "kf.div") and not spec_of(op.operands[1].type).shape:
            op = defining(op.operands[0])
        elif op.name == "kf.mul" and not spec_of(op.operands[0].type).shape:
            op = defining(op.operands[1])
        else:
            return None, False
    return op, swapped


def _exp_of_difference(op: ir.Operation, inner: list) -> bool:
    """Whether op is exp(x - L) with x reading a product and L none (the row's logsumexp)."""
    sub = defining(op.operands[0])
    return sub is not None and sub.name == "kf.sub" and bool(_reaches(sub.operands[0], inner)) and \
        not _reaches(sub.operands[1], inner)


def _reaches(v: ir.Value, targets: list) -> list:
    """The ops of ``targets`` whose results v is computed from (v's defining op included)."""
    found, seen, stack = [], set(), [v]
    while stack:
        w = stack.pop()
        if w in seen:
            continue
        seen.add(w)
        op = defining(w)
        if op is None:
            continue
        if op in targets:
            if op not in found:
                found.append(op)
            continue
        stack.extend(op.operands)
    return found


def _untransposed(v: ir.Value) -> ir.Value:
    op = defining(v)
    if op is not None and op.name == "kf.transpose" and swaps_last_two(op_attrs(op)["perm"]):
        return op.operands[0]
    return v


def _same_tensor(a: ir.Value, b: ir.Value) -> bool:
    """Whether a and b are the same value up to float casts and same-shape broadcasts."""
    def strip(v):
        while True:
            op = defining(v)
            if op is not None and (op.name == "kf.cast" or (op.name == "kf.broadcast_to" and
                                                             op.operands[0].type == v.type)):
                v = op.operands[0]
                continue
            return v
    return strip(a) == strip(b)


def _last_mask(x: ir.Value) -> tuple[ir.Value | None, float | None, ir.Value | None]:
    """(condition, fill, the scores before it) of a mask applied last to x with a fill
    of at most ``MASK_FILL_AT_MOST`` (``masked_fill(s, c, fill)``, ``select(c, fill, s)``,
    either through a float cast), else Nones."""
    op = defining(x)
    while op is not None and op.name == "kf.cast":
        op = defining(op.operands[0])
    if op is None:
        return None, None, None
    if op.name == "kf.masked_fill" and op_attrs(op)["value"] <= MASK_FILL_AT_MOST:
        return op.operands[1], float(op_attrs(op)["value"]), op.operands[0]
    if op.name == "kf.select":
        fill = defining(op.operands[1])
        if fill is not None and fill.name == "kf.fill" and not spec_of(op.operands[1].type).shape and \
                op_attrs(fill)["value"] <= MASK_FILL_AT_MOST:
            return op.operands[0], float(op_attrs(fill)["value"]), op.operands[2]
    return None, None, None


@dataclass(frozen=True)
class LinearForm:
    """The chain as FlashAttention's kernels compute it: x = ``score_scale`` * S (a mask
    applied last aside), Pv = P, and dSq = dSk = ``grad_scale`` * P * (dP - D), zero
    where the mask masks (``masked``), all up to roundings between floats."""

    score_scale: float
    grad_scale: float
    masked: bool


def linear_form(ch: BackwardChain) -> LinearForm | None:
    """The chain's ``LinearForm``, or None where it is anything else (a bias, another
    function of the scores, a mask that is not the forward's)."""
    x = ch.unmasked_x if ch.mask_cond is not None else ch.x
    c_s = _scaled(x, ch.mm_s.result)
    if c_s is None:
        return None
    if "dv" in ch.products and _strip_casts(_untransposed(ch.products["dv"].region)) != ch.p.result:
        return None
    scales = set()
    for role in ("dq", "dk"):
        if role not in ch.products:
            continue
        region = ch.products[role].region
        region = _untransposed(region) if ch.products[role].region_is_lhs and role == "dk" else region
        c_d = _softmax_grad(ch, region)
        if c_d is None:
            return None
        scales.add(c_d)
    if len(scales) > 1:
        return None
    return LinearForm(c_s, scales.pop() if scales else 1.0, ch.mask_cond is not None)


def _strip_casts(v: ir.Value) -> ir.Value:
    op = defining(v)
    while op is not None and op.name == "kf.cast" and spec_of(op.operands[0].type).is_float and \
            spec_of(op.result.type).is_float:
        v = op.operands[0]
        op = defining(v)
    return v


def _constant_factor(op: ir.Operation) -> tuple[ir.Value, float] | None:
    """(x, c) for ``x * c``, ``c * x``, ``x / c`` with c a rank-0 constant fill."""
    if op.name not in ("kf.mul", "kf.div"):
        return None
    a, b = op.operands
    for x, c, inverse in ((a, b, op.name == "kf.div"), (b, a, False)):
        if spec_of(c.type).shape or not spec_of(x.type).shape:
            continue
        fill = defining(c)
        if fill is None or fill.name != "kf.fill":
            continue
        value = float(op_attrs(fill)["value"])
        if inverse and value == 0:
            return None
        return x, (1.0 / value if inverse else value)
    return None


def _scaled(v: ir.Value, base: ir.Value) -> float | None:
    """c where v is c * base through casts and constant factors, else None."""
    c = 1.0
    while True:
        v = _strip_casts(v)
        if v == base:
            return c
        op = defining(v)
        found = _constant_factor(op) if op is not None else None
        if found is None:
            return None
        v, f = found
        c *= f


def _same_value(a: ir.Value, b: ir.Value) -> bool:
    """Whether a and b are one value, or the same side-effect-free ops (kf.cmp, kf.fill,
    ...) of the same values: the mask's comparison, written twice by a tracer that does
    not merge common subexpressions (``mask == 0`` in the forward and again in the
    backward), is still the forward's mask."""
    if a == b:
        return True
    x, y = defining(a), defining(b)
    if x is None or y is None or x.name != y.name or not x.name.startswith("kf.") or x.regions or \
            x.name == "kf.rand" or a.type != b.type:
        return False
    if len(x.operands) != len(y.operands) or op_attrs(x) != op_attrs(y):
        return False
    return all(_same_value(u, w) for u, w in zip(x.operands, y.operands))


def _softmax_grad(ch: BackwardChain, v: ir.Value) -> float | None:
    """c where v is c * P * (dP - D) (zero where the forward's mask masks), through casts
    and constant factors: ``P * (dP - D)`` or ``dP * P - P * D`` in any operand order."""
    c = 1.0
    p, dp, d = ch.p.result, ch.mm_dp.result, ch.d_sum.result
    while True:
        v = _strip_casts(v)
        op = defining(v)
        if op is None:
            return None
        if op.name == "kf.select" and ch.mask_cond is not None and _same_value(op.operands[0], ch.mask_cond):
            zero = defining(op.operands[1])
            if zero is None or zero.name != "kf.fill" or op_attrs(zero)["value"] != 0.0:
                return None
            v = op.operands[2]
            continue
        if op.name == "kf.masked_fill" and ch.mask_cond is not None and _same_value(op.operands[1], ch.mask_cond):
            if op_attrs(op)["value"] != 0.0:
                return None
            v = op.operands[0]
            continue
        found = _constant_factor(op)
        if found is not None:
            v, f = found
            c *= f
            continue
        break
    a, b = (_strip_casts(x) for x in op.operands)
    if op.name == "kf.mul":  # P * (dP - D)
        diff = b if a == p else a if b == p else None
        sub = defining(diff) if diff is not None else None
        if sub is not None and sub.name == "kf.sub" and _strip_casts(sub.operands[0]) == dp and \
                _strip_casts(sub.operands[1]) == d:
            return c
        return None
    if op.name == "kf.sub":  # dP * P - P * D
        m1, m2 = defining(a), defining(b)
        if m1 is None or m2 is None or m1.name != "kf.mul" or m2.name != "kf.mul":
            return None
        if {_strip_casts(x) for x in m1.operands} == {dp, p} and {_strip_casts(x) for x in m2.operands} == {p, d}:
            return c
    return None
