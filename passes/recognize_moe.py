"""kf-recognize-moe: the dense mixture-of-experts formulation, rewritten as tokens
grouped by expert.

What is recognized (examples/moe.py after kf-canonicalize), all in one function::

    combine = sum_j cast(cmp(eq, slice(idx, -1, j), arange(E))) * slice(wt, -1, j)   j = 0..K-1
    (arange(E): a kf.iota, or a constant 0..E-1)
    out     = sum_e slice(combine, -1, e) * (act(x @ reshape(slice(w_in, 0, e))) @ reshape(slice(w_out, 0, e)))

with ``idx`` [..., S, K] integer (the top-k indices), ``wt`` [..., S, K] (their routing
weights), ``x`` [..., S, H], stacked weights ``w_in`` [E, H, F] and ``w_out`` [E, F, G],
``act`` a kf.gelu, every j in 0..K-1 and every expert e in 0..E-1 exactly once, the two
sums any tree of kf.add. Anything else leaves the IR unchanged (the dense path stays).

The dense form computes every expert for every token; the rewrite computes each
(token, slot) pair once, with the expert it is routed to: K/E of the expert FLOPs. It is
four kernel functions, called in order from the function (which kf-fuse then
schedules with the rest; it leaves functions that have ``kf.kernel`` alone):

1. ``moe_route`` (idx) -> offsets [E+2], row_token [N], slot_row [N]   (N = T*K, T tokens)
   A stable counting sort of the N slots by expert: packed row ``slot_row[t*K+j]`` holds
   slot (t, j); rows of expert e are ``offsets[e] .. offsets[e+1]``, in slot order. Slots
   whose index is outside [0, E) (the dense form gives them no weight) go to a last
   bucket E, which the combine ignores.
2. ``moe_gemm`` (x, w_in, offsets, row_token) -> h [N, F] = act(x[row_token[r]] @ w_in[e(r)])
   rows gathered through row_token while the A tile is loaded (no copy of x).
3. ``moe_gemm`` (h, w_out, offsets) -> y [N, G] = h[r] @ w_out[e(r)]
4. ``moe_combine`` (y, slot_row, wt, idx) -> out[t] = sum_j [0 <= idx[t,j] < E] wt[t,j] * y[slot_row[t,j]]

Each kernel function's body states what it computes in kf ops (the reference the
strategies in passes/strategies/moe.py implement; costs.py counts its FLOPs from it):
the grouped GEMMs as a gather of per-row weights and a batched matmul, the routing as
the rank of a combined (expert, slot) key. These bodies are correct but not meant to be
run as written (the routing's is quadratic in N); the moe strategies never refuse a
kernel that this pass made.

Soundness: every term the dense sum adds is kept or provably zero. combine[t, e] is the
sum of the weights of the slots routed to e, so sum_e combine[t,e] * y_e[t] equals
sum_j wt[t,j] * y_{idx[t,j]}[t] (duplicated indices included). One difference remains:
the dense form multiplies non-chosen experts' outputs by 0, so an inf or NaN there
reaches its result and not this one's. Rounding differs within the precision policy
(f32 accumulation of the K products instead of rounding after each expert's add).
"""

from __future__ import annotations

import dataclasses
import re

import numpy as np
from kf.dialects import builders as B
from kf.dialects import defining, spec_of
from kf.dialects.attrs import op_attrs
from mlir import ir
from mlir.dialects import func

from .base import KfPass, user_functions

ROUTE, GEMM, COMBINE = "moe_route", "moe_gemm", "moe_combine"

#: Packed rows the grouped GEMMs can take: their grid's y extent (at most 65535) counts
#: row tiles of 64, E + 1 of them partial. Larger layers stay dense.
MAX_ROWS = 65535 * 64


def _op(v: ir.Value, name: str) -> ir.Operation | None:
    d = defining(v)
    return d if d is not None and d.name == name else None


def _shape(v: ir.Value) -> tuple[int, ...]:
    return spec_of(v.type).shape


def _elem(v: ir.Value) -> str:
    return spec_of(v.type).elem


def _last_slice(v: ir.Value) -> tuple[ir.Value, int] | None:
    """(sliced tensor, position) when v = slice(t, dim=-1, p, p+1, step 1)."""
    s = _op(v, "kf.slice")
    if s is None:
        return None
    a = op_attrs(s)
    src = s.operands[0]
    rank = len(_shape(src))
    if int(a["dim"]) % rank != rank - 1 or int(a["step"]) != 1 or int(a["end"]) != int(a["start"]) + 1:
        return None
    return src, int(a["start"])


def _expert_matrix(v: ir.Value) -> tuple[ir.Value, int] | None:
    """(stacked weights [E, P, Q], e) when v = reshape(slice(w, dim=0, e, e+1)) to [P, Q]."""
    r = _op(v, "kf.reshape")
    s = _op(r.operands[0], "kf.slice") if r is not None else None
    if s is None:
        return None
    a = op_attrs(s)
    w = s.operands[0]
    ws = _shape(w)
    if len(ws) != 3 or int(a["dim"]) % 3 != 0 or int(a["step"]) != 1 or int(a["end"]) != int(a["start"]) + 1:
        return None
    if _shape(v) != ws[1:]:
        return None
    return w, int(a["start"])


def _sum_leaves(root: ir.Value) -> list[ir.Value]:
    """Leaves of the kf.add tree at root; inner adds must have no other user."""
    out, stack = [], [root]
    while stack:
        v = stack.pop()
        a = _op(v, "kf.add")
        inner = a is not None and (v == root or len(list(v.uses)) == 1)
        if inner and _shape(a.operands[0]) == _shape(v) and _shape(a.operands[1]) == _shape(v):
            stack.extend([a.operands[1], a.operands[0]])
            continue
        out.append(v)
    return out


def _is_zero_fill(v: ir.Value) -> bool:
    f = _op(v, "kf.fill")
    return f is not None and float(op_attrs(f)["value"]) == 0.0


@dataclasses.dataclass
class Match:
    """One dense MoE: the values the grouped form needs and the value it replaces."""

    root: ir.Value
    x: ir.Value
    idx: ir.Value
    wt: ir.Value
    w_in: ir.Value
    w_out: ir.Value
    approximate: str
    lines: dict  # kernel role -> the user's lines it replaces
    terms: list  # the kf.mul op of each expert's weighted output


def _term(v: ir.Value):
    """(combine, e, x, w_in, w_out, approximate, ops) of slice(combine, e) * (gelu(x @ w_in[e]) @ w_out[e])."""
    m = _op(v, "kf.mul")
    if m is None:
        return None
    for c, y in ((m.operands[0], m.operands[1]), (m.operands[1], m.operands[0])):
        cs = _last_slice(c)
        mm2 = _op(y, "kf.matmul")
        if cs is None or mm2 is None or _shape(y) != _shape(v):
            continue
        combine, e = cs
        wo = _expert_matrix(mm2.operands[1])
        g = _op(mm2.operands[0], "kf.gelu")
        mm1 = _op(g.operands[0], "kf.matmul") if g is not None else None
        wi = _expert_matrix(mm1.operands[1]) if mm1 is not None else None
        if wo is None or wi is None or wo[1] != e or wi[1] != e:
            continue
        x = mm1.operands[0]
        xs, cs_shape = _shape(x), _shape(combine)
        if len(xs) < 2 or cs_shape[:-1] != xs[:-1] or _shape(v) != xs[:-1] + (_shape(wo[0])[2],):
            continue
        return combine, e, x, wi[0], wo[0], op_attrs(g)["approximate"], [m, mm2, g, mm1]
    return None


def _is_arange(v: ir.Value, n: int) -> bool:
    """Whether v is 0, 1, ..., n-1: a kf.iota of n elements, or such a constant."""
    if _shape(v) != (n,):
        return False
    iota = _op(v, "kf.iota")
    if iota is not None:
        return op_attrs(iota)["dim"] == 0
    c = _op(v, "kf.constant")
    if c is None:
        return False
    from kf.dialects.attrs import from_attr

    try:
        arr = np.asarray(from_attr(c.attributes["value"])).reshape(-1)
    except (TypeError, ValueError):  # an attribute kind from_attr does not read: not an arange
        return False
    return arr.shape == (n,) and bool((arr == np.arange(n)).all())


def _routing_term(v: ir.Value, n_experts: int):
    """(idx, j, wt, j', ops) of cast(cmp(eq, slice(idx, j), arange(E))) * slice(wt, j')."""
    m = _op(v, "kf.mul")
    if m is None:
        return None
    for r, w in ((m.operands[0], m.operands[1]), (m.operands[1], m.operands[0])):
        cast = _op(r, "kf.cast")
        cmp = _op(cast.operands[0], "kf.cmp") if cast is not None else None
        ws = _last_slice(w)
        if cmp is None or ws is None or op_attrs(cmp)["predicate"] != "eq":
            continue
        for i, a in ((cmp.operands[0], cmp.operands[1]), (cmp.operands[1], cmp.operands[0])):
            isl = _last_slice(i)
            if isl is not None and _is_arange(a, n_experts) and _elem(isl[0]) in ("i32", "i64"):
                return isl[0], isl[1], ws[0], ws[1], [defining(i), defining(w), cmp, cast, m]
    return None


def match(root: ir.Value) -> Match | None:
    """The dense MoE whose output is root, or None."""
    leaves = [v for v in _sum_leaves(root) if not _is_zero_fill(v)]
    terms = [_term(v) for v in leaves]
    if not terms or any(t is None for t in terms):
        return None
    combine, _, x, w_in, w_out, approx, _ = terms[0]
    E = _shape(combine)[-1]
    if sorted(t[1] for t in terms) != list(range(E)):
        return None
    if any(t[0] != combine or t[2] != x or t[3] != w_in or t[4] != w_out or t[5] != approx for t in terms):
        return None
    H = _shape(x)[-1]
    wis, wos = _shape(w_in), _shape(w_out)
    if wis[0] != E or wos[0] != E or wis[1] != H or wos[1] != wis[2]:
        return None
    elem = _elem(x)
    if elem not in ("f32", "f16", "bf16") or any(_elem(v) != elem for v in (w_in, w_out, combine)):
        return None
    routes = [_routing_term(v, E) for v in _sum_leaves(combine) if not _is_zero_fill(v)]
    if not routes or any(r is None for r in routes):
        return None
    idx, wt = routes[0][0], routes[0][2]
    K = _shape(idx)[-1]
    if any(r[0] != idx or r[2] != wt or r[1] != r[3] for r in routes) or sorted(r[1] for r in routes) != list(range(K)):
        return None
    if _shape(idx)[:-1] != _shape(x)[:-1] or _shape(wt) != _shape(idx) or _elem(wt) != elem:
        return None
    if int(np.prod(_shape(idx))) + (E + 1) * 64 > MAX_ROWS:
        return None
    lines = {
        ROUTE: _lines([op for r in routes for op in r[4]]),
        "up": _lines([t[6][3] for t in terms] + [t[6][2] for t in terms]),
        "down": _lines([t[6][1] for t in terms]),
        COMBINE: _lines([t[6][0] for t in terms]),
    }
    return Match(root, x, idx, wt, w_in, w_out, approx, lines, [t[6][0] for t in terms])


def _lines(ops) -> list[str]:
    """The user's file:line of each op, once each, in file and line order."""
    out = set()
    for op in ops:
        m = re.search(r'loc\("([^"]+)":(\d+):\d+', str(op.location))
        if m:
            out.add((m.group(1), int(m.group(2))))
    return [f"{f}:{n}" for f, n in sorted(out)]


# --------------------------------------------------------------------------- rewrite


def _i64_const(values) -> ir.Value:
    arr = np.asarray(values, dtype=np.int64)
    t = ir.RankedTensorType.get([len(arr)], ir.IntegerType.get_signless(64))
    return B.constant(ir.DenseElementsAttr.get(arr, type=t))


def _kernel(module_block: ir.Block, before: ir.Operation, name: str, kind: str, inputs: list[ir.Type],
            results: list[ir.Type], lines: list[str], attrs: dict, body) -> func.FuncOp:
    """A private kernel function ``name`` of kind (placed before the function ``before``),
    whose body is what body(*arguments) builds."""
    with ir.InsertionPoint(module_block):
        f = func.FuncOp(name, ir.FunctionType.get(list(inputs), list(results)))
    f.attributes["sym_visibility"] = ir.StringAttr.get("private")
    f.attributes["kf.kernel"] = ir.StringAttr.get(kind)
    f.attributes["kf.fused_lines"] = ir.ArrayAttr.get([ir.StringAttr.get(s) for s in lines])
    f.attributes["kf.moe"] = ir.DictAttr.get({k: _attr(v) for k, v in attrs.items()})
    block = f.add_entry_block()
    with ir.InsertionPoint(block):
        func.ReturnOp(list(body(*block.arguments)))
    f.operation.move_before(before)
    return f


def _attr(v) -> ir.Attribute:
    if isinstance(v, bool):
        return ir.BoolAttr.get(v)
    if isinstance(v, int):
        return ir.IntegerAttr.get(ir.IntegerType.get_signless(64), v)
    return ir.StringAttr.get(str(v))


def _rank_of_rows(offsets: ir.Value, n: int, n_experts: int) -> ir.Value:
    """The (clamped) expert of each packed row: the number of expert ends at or before it."""
    rows = B.reshape(_i64_const(range(n)), [n, 1])
    ends = B.cast(B.slice(offsets, dim=0, start=1, end=n_experts + 1), "i64")
    e = B.sum(B.cmp(rows, ends, predicate="ge"), dims=[1], elem="i64")
    return B.min(e, B.fill((), "i64", float(n_experts - 1)))


def rewrite(f: ir.Operation, m: Match, module_block: ir.Block, prefix: str) -> None:
    """Replace m.root by calls of the four grouped kernels, inserted before its definition."""
    xs, E = _shape(m.x), _shape(m.w_in)[0]
    K = _shape(m.idx)[-1]
    T = int(np.prod(xs[:-1]))
    N, H, F, G = T * K, xs[-1], _shape(m.w_in)[2], _shape(m.w_out)[2]
    elem = _elem(m.x)
    i32 = ir.IntegerType.get_signless(32)
    t_i32 = lambda shape: ir.RankedTensorType.get(list(shape), i32)
    t_el = lambda shape: ir.RankedTensorType.get(list(shape), ir.Type.parse(elem))
    common = {"experts": E, "top_k": K, "tokens": T, "rows": N}
    loc = defining(m.root).location

    def route_body(idx):
        # key = expert of the slot, E when out of range; the packed row of a slot is the
        # rank of (key, slot) among all slots: a stable sort by expert.
        flat = B.reshape(idx, [N])
        if _elem(flat) != "i64":
            flat = B.cast(flat, "i64")
        big = B.fill((), "i64", float(E))
        key = B.select(B.cmp(flat, B.fill((), "i64", 0.0), predicate="lt"), big, B.min(flat, big))
        slots = _i64_const(range(N))
        ck = B.add(B.mul(key, B.fill((), "i64", float(N))), slots)
        before = B.cmp(B.reshape(ck, [1, N]), B.reshape(ck, [N, 1]), predicate="lt")
        slot_row = B.sum(before, dims=[1], elem="i32")
        tok = B.cast(_i64_const(np.arange(N) // K), "i32")
        row_token = B.scatter_add(B.fill([N], "i32", 0.0), slot_row, tok, dim=0)
        bounds = B.reshape(_i64_const(range(E + 2)), [E + 2, 1])
        offsets = B.sum(B.cmp(B.reshape(key, [1, N]), bounds, predicate="lt"), dims=[1], elem="i32")
        return offsets, row_token, slot_row

    def up_body(x, w_in, offsets, row_token):
        rows = B.index_select(B.reshape(x, [T, H]), row_token, dim=0)
        w = B.index_select(w_in, _rank_of_rows(offsets, N, E), dim=0)
        h = B.reshape(B.matmul(B.reshape(rows, [N, 1, H]), w), [N, F])
        return [B.gelu(h, approximate=m.approximate)]

    def down_body(h, w_out, offsets):
        w = B.index_select(w_out, _rank_of_rows(offsets, N, E), dim=0)
        return [B.reshape(B.matmul(B.reshape(h, [N, 1, F]), w), [N, G])]

    def combine_body(y, slot_row, wt, idx):
        picked = B.reshape(B.index_select(y, slot_row, dim=0), list(xs[:-1]) + [K, G])
        ii = idx if _elem(idx) == "i64" else B.cast(idx, "i64")
        valid = B.select(B.cmp(ii, B.fill((), "i64", 0.0), predicate="ge"),
                         B.cmp(ii, B.fill((), "i64", float(E)), predicate="lt"),
                         B.cmp(ii, ii, predicate="ne"))
        w = B.select(valid, wt, B.fill((), elem, 0.0))
        w = B.reshape(w, list(xs[:-1]) + [K, 1])
        return [B.sum(B.mul(w, picked), dims=[len(xs) - 1])]

    i_idx, i_x, i_wt = m.idx.type, m.x.type, m.wt.type
    t_off, t_rows = t_i32([E + 2]), t_i32([N])
    with loc:
        k_route = _kernel(module_block, f, f"{prefix}_route", ROUTE, [i_idx], [t_off, t_rows, t_rows],
                          m.lines[ROUTE], common, route_body)
        k_up = _kernel(module_block, f, f"{prefix}_up", GEMM, [i_x, m.w_in.type, t_off, t_rows], [t_el([N, F])],
                       m.lines["up"], {**common, "gather": True, "activation": "gelu", "approximate": m.approximate},
                       up_body)
        k_down = _kernel(module_block, f, f"{prefix}_down", GEMM, [t_el([N, F]), m.w_out.type, t_off],
                         [t_el([N, G])], m.lines["down"], {**common, "gather": False, "activation": "none"},
                         down_body)
        k_comb = _kernel(module_block, f, f"{prefix}_combine", COMBINE, [t_el([N, G]), t_rows, i_wt, i_idx],
                         [m.root.type], m.lines[COMBINE], common, combine_body)
        with ir.InsertionPoint(defining(m.root)):
            offsets, row_token, slot_row = func.CallOp(k_route, [m.idx]).results
            h = func.CallOp(k_up, [m.x, m.w_in, offsets, row_token]).result
            y = func.CallOp(k_down, [h, m.w_out, offsets]).result
            out = func.CallOp(k_comb, [y, slot_row, m.wt, m.idx]).result
    m.root.replace_all_uses_with(out)


def _erase_dead(f: ir.Operation) -> None:
    """Erase kf ops of f with no uses (kf ops have no side effects), until none is left."""
    block = f.regions[0].blocks[0]
    changed = True
    while changed:
        changed = False
        for op in reversed(list(block.operations)):
            op = op.operation
            if op.name.startswith("kf.") and all(len(list(r.uses)) == 0 for r in op.results):
                op.erase()
                changed = True


@dataclasses.dataclass(frozen=True)
class RecognizeMoePass(KfPass):
    NAME = "kf-recognize-moe"
    DESCRIPTION = "rewrite the dense MoE (every expert for every token) as route, two grouped GEMMs and combine"

    def run(self, module: ir.Operation) -> None:
        body = module.regions[0].blocks[0]  # where rewrite puts the kernel functions
        for f in user_functions(module):
            fname = re.sub(r"\W", "_", ir.StringAttr(f.attributes["sym_name"]).value).strip("_") or "kernel"
            count, taken = 0, set()
            # Any add (or, for one expert, mul) can be the sum over experts: the sum may
            # feed a residual add. From the last op up, so that of two roots over the
            # same terms (a sum and the sum plus a zero fill) the outer one is rewritten.
            for op in reversed(list(f.regions[0].blocks[0].operations)):
                op = op.operation
                if op.name not in ("kf.add", "kf.mul") or not op.results:
                    continue
                m = match(op.results[0])
                if m is None or any(t in taken for t in m.terms):
                    continue
                taken.update(m.terms)
                rewrite(f, m, body, f"{fname}_moe{count}")
                count += 1
            if count:
                _erase_dead(f)
