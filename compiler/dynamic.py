"""Capture with run-time sizes: one kf function for every size of some dims.

A signature whose tensors have ``DYN`` dims (signature.generalize) is traced by
torch.export with ``Dim.AUTO`` on those dims: torch's ShapeEnv gives each one a symbol,
every result's sizes as expressions over the symbols, and specializes a dim where the
trace needs its value (a guard ``s0 == 64``, a view that divides by it). kf keeps a dim
dynamic only where torch did; the specialization rule is Triton's and dynamo's: sizes 0
and 1 are never dynamic (``generalize`` leaves them static), so a symbol ranges over
``[2, inf)``, which is what torch assumed while tracing (a ``?`` dim never broadcasts,
``squeeze`` never drops it). Where a target's code depends on a size's divisibility by
16 (``Target.divisibility``) that bit is part of the signature too.

The graph is converted to kf IR by the ordinary converter twice, with the symbols
replaced by two sets of sizes (``_hints``): kf's converters read sizes as numbers, and
the two conversions agree on every op and attribute exactly when nothing of the kf IR but
the sizes in its types depends on the symbols' values. Where they agree, each type's dims
that differ become ``?``; where they do not (a constant sized by the input), the
function is compiled for static sizes instead (``DynamicFallback``). A slice whose bound
is at or before a run-time dim's end (``x[:, 1:]``, ``x[:, :-1]``) differs between the two
by the size itself: that bound is counted from the end (``_slice_from_end``). The guards
torch's trace needed (``Ne(s0 - 1, 1)``: the slice is not of length 1) stay with the
program, which the API checks at each new shape (``Captured.size_guards``). The kf function then records, per input and output dim, its size
as an expression over the symbols (``Captured.input_dims``, ``output_dims``), which the
runtime evaluates at each call (runtime/abi.py).
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import torch
from mlir import ir

from kf.dialects.types import DYN, KfTypeError, mlir_type, spec_of
from kf.dialects.attrs import SIZES_FROM, set_sizes_from

from .errors import CompileError, DynamicFallback
from .signature import MIN_SIZE, is_dynamic

#: passes/to_cpu.REDUCTION_BLOCK (test_dynamic checks they agree): a float sum longer than
#: this runs in stages on the cpu target
_REDUCTION_BLOCK = 4096

# ----------------------------------------------------------------------------- export


def _export(user: Callable, sig, tensors: list[torch.Tensor], dynamic: list[list[int]]):
    """torch.export of the function with Dim.AUTO on each input's dynamic dims."""
    from torch.export import Dim

    from .capture import _traceable, _trace_inputs, _Wrapper
    from .torch_ops import AUTOCAST_KEYS

    shapes = tuple({d: Dim.AUTO for d in dims} or None for dims in dynamic)
    # traced on contiguous tensors of the inputs' shapes: the kernels take their inputs
    # contiguous, and a strided view's strides (q, k and v split from one projection)
    # would be symbols of their own, products of which reach the graph's sizes
    laid_out = [t if t.is_contiguous() else torch.empty(t.shape, dtype=t.dtype, device=t.device)
                for t in _trace_inputs(tensors)]
    try:
        with torch._C._ExcludeDispatchKeyGuard(AUTOCAST_KEYS):
            return torch.export.export(_Wrapper(_traceable(user), sig), tuple(laid_out),
                                       dynamic_shapes=(shapes,), strict=False)
    except Exception as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise DynamicFallback(f"torch.export with dynamic dims failed: {type(e).__name__}: {first[:200]}") from None


def _symbols(ep, n_inputs: int, dynamic: list[list[int]],
             names: Sequence[str]) -> tuple[list[tuple[str, ...]], dict, dict, tuple[str, ...], frozenset]:
    """(each user input's dims as text: a size or a symbol, symbol name -> sympy symbol,
    sympy symbol -> the equal one that stands for it, the guards on the sizes that the
    program holds for: _size_guards, the input dims the first guard reads) of the
    exported program; a dim asked to be dynamic that torch specialized is a
    DynamicFallback naming it."""
    import sympy
    from torch.export.graph_signature import InputKind
    from torch.utils._sympy.numbers import int_oo

    users = [s.arg.name for s in ep.graph_signature.input_specs if s.kind == InputKind.USER_INPUT]
    nodes = {n.name: n for n in ep.graph_module.graph.nodes if n.op == "placeholder"}
    dims, symbols = [], {}

    def of(exprs) -> frozenset:
        return _dims_of(exprs, names, dims)

    for i, name in enumerate(users[:n_inputs]):
        val = nodes[name].meta["val"]
        row = []
        for d, size in enumerate(val.shape):
            if isinstance(size, torch.SymInt) and size.node.expr.is_number:
                size = int(size.node.expr)
            if isinstance(size, int):
                if d in dynamic[i]:
                    raise DynamicFallback(f"torch specialized {names[i]} dim {d} to {size} (the function "
                                          f"needs that size)", {(names[i], d)})
                row.append(str(size))
                continue
            expr = size.node.expr
            if not isinstance(expr, sympy.Symbol):
                raise DynamicFallback(f"{names[i]} dim {d} is {expr} of other dims", {(names[i], d)})
            symbols[str(expr)] = expr
            row.append(str(expr))
        dims.append(tuple(row))
    # A guard the trace needed (``Ne(s0, 7)`` from an if on a size, ``Ne(s0 - 1, 1)`` from a
    # slice) holds for some sizes only; export keeps no check of it in the graph: the
    # program keeps it (_size_guards), and a call whose sizes fail it compiles for its
    # own sizes. Two dims found equal (``Eq(s0, s1)``: the keys of an attention and its
    # values) become one symbol, which the launcher checks is one size
    # (runtime/abi.bind_sizes).
    env = next(iter(nodes.values())).meta["val"].fake_mode.shape_env if nodes else None
    equal: dict = {}
    needed: list = []
    if env is not None:
        pairs = _attention_pairs(ep.graph_module, symbols)
        for g in env.guards:
            e = g.expr
            if not {str(x) for x in e.free_symbols} & symbols.keys():
                continue
            if isinstance(e, sympy.Eq) and all(isinstance(a, sympy.Symbol) for a in e.args):
                inputs = sorted(str(a) for a in e.args if str(a) in symbols)
                if len(inputs) == 2:
                    pairs.append((inputs[0], inputs[1]))
                # else torch replaced the other symbol by this one everywhere already
            else:
                needed.append(e)
        needed += [a.expr for items in env.deferred_runtime_asserts.values() for a in items]
        same = _merged(pairs)
        if same:
            dims = [tuple(same.get(x, x) for x in row) for row in dims]
            equal = {symbols[b]: symbols[a] for b, a in same.items()}
    for sym, vr in ep.range_constraints.items():
        if str(sym) in symbols and int(vr.lower) != MIN_SIZE:
            needed.append(sympy.Ge(sym, int(vr.lower)))
        if str(sym) in symbols and vr.upper != int_oo:
            needed.append(sympy.Le(sym, int(vr.upper)))
    guards = _size_guards(needed, symbols, equal, env, of)
    symbols = {k: v for k, v in symbols.items() if v not in equal}
    return dims, symbols, equal, guards, of(needed[:1])


def _size_guards(needed: list, symbols: dict, equal: dict, env, of) -> tuple[str, ...]:
    """The guards a trace needed as text over the input symbols that stand
    (runtime/abi.eval_guard evaluates it at each call); DynamicFallback naming the first
    one's dims where one reads a symbol of no input dim or is not a comparison of sizes
    (the dims then compile static, api)."""
    import sympy

    from kf.runtime.abi import eval_guard

    known = {str(s) for s in symbols}
    hints = {str(s): int(v) for s, v in ((getattr(env, "backed_var_to_val", None) or env.var_to_val).items()
                                          if env is not None else ())}
    out: list[str] = []
    for e in needed:
        if env is not None:  # in torch's terms: a symbol it replaced by another is that one
            e = env.simplify(e)
        if e is sympy.true:
            continue
        text = str(e.xreplace(equal))
        try:
            if not {str(x) for x in e.free_symbols} <= known or not eval_guard(text, hints):
                raise ValueError(text)
        except (ValueError, KeyError, ZeroDivisionError, TypeError):
            raise DynamicFallback(f"the trace holds for some sizes only (guard {e}), which kf cannot check "
                                  f"at run time", of([e])) from None
        if text not in out:
            out.append(text)
    return tuple(out)


def _dims_of(exprs, names: Sequence[str], input_dims: Sequence[Sequence[str]]) -> frozenset:
    """The (tensor name, dim) pairs of the inputs whose symbols (``input_dims``: each
    input's dims as text) the sympy expressions read."""
    read = {str(x) for e in exprs for x in e.free_symbols}
    return frozenset((name, d) for name, row in zip(names, input_dims) for d, text in enumerate(row)
                     if text in read)


def _sizes_used_as_values(gm: torch.fx.GraphModule, input_dims: Sequence[Sequence[str]],
                          names: Sequence[str]) -> frozenset:
    """The (tensor name, dim) pairs whose run-time sizes the graph computes a float from
    (``q.shape[-1] ** -0.5``: a SymFloat), which kf's converters take as numbers only."""
    floats = [node.meta["val"].node.expr for node in gm.graph.nodes
              if isinstance(node.meta.get("val"), torch.SymFloat)]
    return _dims_of(floats, names, input_dims)


def _attention_pairs(gm: torch.fx.GraphModule, symbols: dict) -> list[tuple[str, str]]:
    """Input symbols that an attention op (one aten op, whose fake kernel checks no sizes)
    needs equal: the keys' and values' lengths, and the queries' and keys' head dims."""
    pairs = []
    for node in gm.graph.nodes:
        if node.op != "call_function" or "scaled_dot_product_attention" not in str(node.target):
            continue
        q, k, v = (a.meta.get("val") if isinstance(a, torch.fx.Node) else None for a in node.args[:3])
        if not all(isinstance(t, torch.Tensor) and t.dim() >= 2 for t in (q, k, v)):
            continue
        for a, b in ((k.shape[-2], v.shape[-2]), (q.shape[-1], k.shape[-1])):
            if isinstance(a, torch.SymInt) and isinstance(b, torch.SymInt):
                x, y = str(a.node.expr), str(b.node.expr)
                if x != y and x in symbols and y in symbols:
                    pairs.append((x, y))
    return pairs


def _merged(pairs: list[tuple[str, str]]) -> dict[str, str]:
    """symbol -> the one that stands for it, for symbols found equal in pairs (each set
    of equal symbols stands as its first by name)."""
    parent: dict[str, str] = {}

    def find(x: str) -> str:
        while parent.get(x, x) != x:
            x = parent[x]
        return x

    for a, b in pairs:
        ra, rb = find(a), find(b)
        if ra != rb:
            lo, hi = sorted((ra, rb))
            parent[hi] = lo
    return {x: find(x) for x in parent if find(x) != x}


def _hints(symbols: dict, equal: dict, which: int) -> dict:
    """Sizes that stand for the symbols in one of the two conversions: primes, far from
    each other and from any size a program is likely to hold (so a size derived from a
    symbol differs between the two)."""
    import sympy

    out, p = {}, (1009 if which == 0 else 4001)
    for name in sorted(symbols):
        p = sympy.nextprime(p)
        out[symbols[name]] = sympy.Integer(p)
    for b, a in equal.items():  # a symbol found equal to another: its size
        out[b] = out[a]
    return out


def _concrete(x: Any, hints: dict) -> Any:
    """x (a SymInt, a number, a list of them) with the symbols replaced by hints."""
    if isinstance(x, torch.SymInt):
        value = x.node.expr.xreplace(hints)
        if not value.is_number:
            raise DynamicFallback(f"the size {x.node.expr} has symbols of no input")
        return int(value)
    if isinstance(x, (list, tuple)):
        return type(x)(_concrete(y, hints) for y in x)
    return x


#: graph nodes that check sizes at run time: a program without them would skip the check
_ASSERTS = ("_assert", "sym_constrain_range")


def _metadata_only(node: torch.fx.Node) -> bool:
    """Whether an assertion node checks a tensor's dtype, device or layout and no size or
    stride (export's ``_assert_tensor_metadata`` after ``x.float()``): the signature fixes
    those, and the program needs no check of it."""
    if "_assert_tensor_metadata" not in str(node.target):
        return False
    size = node.kwargs.get("size", node.args[1] if len(node.args) > 1 else None)
    stride = node.kwargs.get("stride", node.args[2] if len(node.args) > 2 else None)
    return size is None and stride is None


def _hinted(gm: torch.fx.GraphModule, hints: dict) -> torch.fx.GraphModule:
    """A copy of a graph with symbolic sizes (export's, or a region of Dynamo's) with
    every size a number: the nodes that compute sizes (``sym_size``, arithmetic on them)
    and the inputs that are sizes replaced by their values under hints, each tensor's
    ``meta["val"]`` a meta tensor of its sizes."""
    graph = torch.fx.Graph()
    env: dict = {}
    sizes: dict = {}  # node that computes a size -> its number
    for node in gm.graph.nodes:
        val = node.meta.get("val")
        if node.op == "call_function" and any(a in str(node.target) for a in _ASSERTS) and \
                not _metadata_only(node):
            raise DynamicFallback(f"the trace checks sizes at run time ({node.target})")
        if node.op in ("call_function", "placeholder") and isinstance(val, (torch.SymInt, int)) and \
                not isinstance(val, bool):
            sizes[node] = _concrete(val, hints)
            continue
        new = graph.node_copy(node, lambda n: sizes[n] if n in sizes else env[n])
        if node.op == "call_function":  # a size written into the node's arguments
            new.args = torch.fx.node.map_aggregate(new.args, lambda a: _concrete(a, hints))
            new.kwargs = torch.fx.node.map_aggregate(new.kwargs, lambda a: _concrete(a, hints))
        if isinstance(val, torch.Tensor):
            new.meta["val"] = _meta(val, hints)
        elif isinstance(val, (list, tuple)) and any(isinstance(v, torch.Tensor) for v in val):
            new.meta["val"] = type(val)(_meta(v, hints) if isinstance(v, torch.Tensor) else v for v in val)
        env[node] = new
    return torch.fx.GraphModule(gm, graph)


def _meta(val: torch.Tensor, hints: dict) -> torch.Tensor:
    shape, strides = _concrete(list(val.shape), hints), _concrete(list(val.stride()), hints)
    return torch.empty_strided(shape, strides, dtype=val.dtype, device="meta")


# ----------------------------------------------------------------------------- unification


def _ops(module: ir.Module) -> list[ir.Operation]:
    found: list[ir.Operation] = []
    module.operation.walk(lambda op: found.append(op.operation) or ir.WalkResult.ADVANCE, ir.WalkOrder.PRE_ORDER)
    return found


#: kf ops that add up what they reduce, and the attribute naming the reduced dims (max,
#: min and the arg ops are exact in any order; a matmul adds over its operands' last dim)
_SUMS = {"kf.sum": "dims", "kf.mean": "dims", "kf.var": "dims", "kf.logsumexp": "dims", "kf.softmax": "dim",
         "kf.log_softmax": "dim", "kf.matmul": None}


def stage_run_time_sums(module: ir.Module, block: int) -> None:
    """Rewrite each float kf.sum and kf.mean over run-time dims and static dims together
    (``loss.mean()`` of a ``[b, n, d]`` tensor) whose element count can pass ``block``
    as two stages: over the run-time dims first (at most MAX_DYNAMIC_SIZE elements a
    sum, within ``block``), then over the rest, whose extent is static, so the targets'
    staged sums take it as they take any static reduction (long_sum then finds nothing
    to refuse). A mean of means over groups of one size is the mean. The first stage is
    f32 for narrow floats, so the result rounds once, as eager's."""
    import math

    from kf.dialects import builders as kb
    from kf.dialects.attrs import op_attrs
    from kf.dialects.elements import LOW_PRECISION

    from .signature import MAX_DYNAMIC_SIZE

    for op in _ops(module):
        if op.name not in ("kf.sum", "kf.mean") or not isinstance(op.operands[0].type, ir.RankedTensorType):
            continue
        t = ir.RankedTensorType(op.operands[0].type)
        if not isinstance(t.element_type, ir.FloatType) or t.rank == 0:
            continue
        attrs = op_attrs(op)
        dims = sorted({d % t.rank for d in attrs.get("dims") or range(t.rank)})
        run_time = [d for d in dims if t.is_dynamic_dim(d)]
        static = [d for d in dims if not t.is_dynamic_dim(d)]
        if not run_time or not static or MAX_DYNAMIC_SIZE ** len(run_time) > block or \
                MAX_DYNAMIC_SIZE ** len(run_time) * math.prod(t.shape[d] for d in static) <= block:
            continue
        elem = spec_of(t).elem
        stage = kb.sum if op.name == "kf.sum" else kb.mean
        with ir.InsertionPoint(op), op.location:
            x = op.operands[0]
            if elem in LOW_PRECISION:
                x = kb.cast(x, "f32")
            partial = stage(x, dims=run_time, keepdim=True)
            out = stage(partial, dims=dims, keepdim=bool(attrs.get("keepdim")))
            if elem in LOW_PRECISION:
                out = kb.cast(out, spec_of(op.results[0].type).elem)
        op.results[0].replace_all_uses_with(out)
        op.erase()


def long_sum(module: ir.Module, block: int, top: ir.Module | None = None) -> str | None:
    """Why a float sum of the kf IR over a run-time dim may add more than ``block``
    elements, or None: its run-time dims at MAX_DYNAMIC_SIZE, or the sizes that the same
    op has in ``top``, the graph converted at the largest sizes it takes (a region of a
    Dynamo graph whose symbols Dynamo bounds: compiler/backend/sizes.py). The cpu target
    adds longer sums in stages (passes/to_cpu.blocked_reductions), which needs their
    extent: over a run-time extent the sum would be one sequential chain, far less
    exact."""
    import math

    from kf.dialects.attrs import op_attrs

    from .signature import MAX_DYNAMIC_SIZE

    ops = _ops(module)
    tops = _ops(top) if top is not None else None
    if tops is not None and (len(tops) != len(ops) or any(a.name != b.name for a, b in zip(ops, tops))):
        tops = None  # not the same ops: every run-time dim at MAX_DYNAMIC_SIZE
    for k, op in enumerate(ops):
        if op.name not in _SUMS or not isinstance(op.operands[0].type, ir.RankedTensorType):
            continue
        t = ir.RankedTensorType(op.operands[0].type)
        if not isinstance(t.element_type, ir.FloatType):
            continue
        shape = list(t.shape)
        if _SUMS[op.name] is None:
            dims = [len(shape) - 1] if shape else []
        else:
            given = op_attrs(op)[_SUMS[op.name]]
            given = list(given) if isinstance(given, (list, tuple)) else [given]
            dims = [d % len(shape) for d in given] if given else list(range(len(shape)))
        sizes = [shape[d] for d in dims if shape]
        if not any(ir.ShapedType.is_dynamic_size(n) for n in sizes):
            continue
        largest = [MAX_DYNAMIC_SIZE] * len(shape)
        if tops is not None and isinstance(tops[k].operands[0].type, ir.RankedTensorType):
            at_top = list(ir.RankedTensorType(tops[k].operands[0].type).shape)
            if len(at_top) == len(shape):
                largest = at_top
        bound = math.prod(largest[d] if ir.ShapedType.is_dynamic_size(shape[d]) else shape[d] for d in dims)
        if bound > block:
            return (f"{op.name} over dims {dims} of {t} adds up to {bound} elements, which kf sums in stages of "
                    f"{block} only for static sizes")
    return None


def _attrs(op: ir.Operation) -> dict[str, str]:
    named = [op.attributes[i] for i in range(len(op.attributes))]
    return {a.name: str(a.attr) for a in named if a.name not in ("function_type", SIZES_FROM)}


def _mark_source_sizes(ops_a: list, ops_b: list) -> None:
    """Mark each op of a that takes no operands (kf.iota, kf.fill: ``torch.arange(L)``,
    ``torch.ones(L, L)``) and whose result has a dim that differs between the two
    conversions with ``SIZES_FROM``: for each dim of the result, the function argument
    and dim of that size (-1, -1 where static), found as the argument dim whose sizes in
    the two conversions are the result's. A size of no argument dim (``L + 1``) is left
    unmarked: its lowering refuses it."""
    pairs: dict[tuple[int, int], tuple[int, int]] = {}
    for x, y in zip(ops_a, ops_b):
        if x.name == "func.func" and len(x.regions[0].blocks):
            pairs = {}
            args = zip(x.regions[0].blocks[0].arguments, y.regions[0].blocks[0].arguments)
            for i, (u, v) in enumerate(args):
                if isinstance(u.type, ir.RankedTensorType) and isinstance(v.type, ir.RankedTensorType):
                    for d, (m, n) in enumerate(zip(u.type.shape, v.type.shape)):
                        if m != n:
                            pairs.setdefault((m, n), (i, d))
            continue
        if len(x.operands) or len(x.results) != 1 or not isinstance(x.results[0].type, ir.RankedTensorType):
            continue
        shape_a, shape_b = x.results[0].type.shape, ir.RankedTensorType(y.results[0].type).shape
        if shape_a == shape_b or len(shape_a) != len(shape_b):
            continue
        found = [(-1, -1) if m == n else pairs.get((m, n)) for m, n in zip(shape_a, shape_b)]
        if all(f is not None for f in found):
            set_sizes_from(x, found)


def _general(a: ir.Type, b: ir.Type) -> ir.Type:
    """The type of both a and b: their dims that differ made ``?``."""
    if a == b:
        return a
    try:
        sa, sb = spec_of(a), spec_of(b)
    except KfTypeError:
        raise DynamicFallback(f"types {a} and {b} differ with the sizes") from None
    if sa.elem != sb.elem or sa.rank != sb.rank:
        raise DynamicFallback(f"types {a} and {b} differ with the sizes")
    return mlir_type(sa.with_shape([x if x == y else DYN for x, y in zip(sa.shape, sb.shape)]))


def _check_paired_reshape(x: ir.Operation, y: ir.Operation) -> None:
    """A reshape whose general form has several run-time dims and keeps each as it is
    (``paired_runtime_dims``: what its lowering reads it as) keeps them in both
    conversions: the sizes at its operand's run-time positions are, in order, those at
    its result's; else DynamicFallback."""
    from kf.passes.linalg.build import paired_runtime_dims, shape_count

    src = spec_of(_general(x.operands[0].type, y.operands[0].type)).shape
    dst = spec_of(_general(x.results[0].type, y.results[0].type)).shape
    if shape_count(dst) < 2 or not paired_runtime_dims(src, dst):
        return
    for op in (x, y):
        a, b = spec_of(op.operands[0].type).shape, spec_of(op.results[0].type).shape
        if [n for n, g in zip(a, src) if g == DYN] != [n for n, g in zip(b, dst) if g == DYN]:
            raise DynamicFallback(f"a reshape of {list(src)} to {list(dst)} with run-time sizes moves "
                                  f"elements between them")


def _slice_from_end(x: ir.Operation, y: ir.Operation) -> None:
    """A kf.slice along a dim whose size differs between the two conversions, whose start
    or end differ by as much (``x[:, 1:]`` ends at the size, ``x[:, :-1]`` one before it):
    that bound counted from the dim's end, as kf.slice takes it along a run-time dim
    (dialects.ops.slice_bounds). Anything else is left for unify to refuse."""
    from kf.dialects.attrs import op_attrs

    a, b = op_attrs(x), op_attrs(y)
    if a == b or a["dim"] != b["dim"] or a.get("step", 1) != b.get("step", 1):
        return
    ta, tb = spec_of(x.operands[0].type), spec_of(y.operands[0].type)
    d = int(a["dim"]) % ta.rank
    na, nb = ta.shape[d], tb.shape[d]
    if na == nb:
        return
    bounds = {}
    for key, from_end_ok in (("start", lambda v: v < 0), ("end", lambda v: v <= 0)):
        u, v = int(a[key]), int(b[key])
        if u == v:
            if key == "end" and u == 0 or key == "start" and u < 0:
                return
            bounds[key] = u
        elif u - na == v - nb and from_end_ok(u - na):
            bounds[key] = u - na
        else:
            return
    i64 = ir.IntegerType.get_signless(64)
    for key, value in bounds.items():
        x.attributes[key] = ir.IntegerAttr.get(i64, value)
        y.attributes[key] = ir.IntegerAttr.get(i64, value)


def unify(a: ir.Module, b: ir.Module) -> None:
    """Make a, in place, the kf IR of both conversions (see the module docstring): every
    op and attribute equal (a slice's bound at a run-time dim's end counted from it:
    _slice_from_end), each type the general one of a's and b's; else DynamicFallback."""
    ops_a, ops_b = _ops(a), _ops(b)
    if len(ops_a) != len(ops_b):
        raise DynamicFallback("the kf IR differs with the sizes (a different number of ops)")
    for x, y in zip(ops_a, ops_b):
        if x.name == "kf.slice" and y.name == "kf.slice":
            _slice_from_end(x, y)
    for x, y in zip(ops_a, ops_b):
        if x.name != y.name or _attrs(x) != _attrs(y) or len(x.results) != len(y.results) or \
                len(x.operands) != len(y.operands):
            raise DynamicFallback(f"the kf IR differs with the sizes ({x.name}: {_attrs(x)} / {_attrs(y)})")
    _mark_source_sizes(ops_a, ops_b)
    for x, y in zip(ops_a, ops_b):
        if x.name == "kf.reshape":
            _check_paired_reshape(x, y)
    for x, y in zip(ops_a, ops_b):
        for r, s in zip(x.results, y.results):
            r.set_type(_general(r.type, s.type))
        if x.name == "func.func":
            for block_x, block_y in zip(x.regions[0].blocks, y.regions[0].blocks):
                for u, v in zip(block_x.arguments, block_y.arguments):
                    u.set_type(_general(u.type, v.type))
    for op in ops_a:
        if op.name == "func.func" and len(op.regions[0].blocks):
            block = op.regions[0].blocks[0]
            ret = list(block.operations)[-1]
            op.attributes["function_type"] = ir.TypeAttr.get(
                ir.FunctionType.get([v.type for v in block.arguments], [v.type for v in ret.operands]))


def _dims_text(val: torch.Tensor, same: dict) -> tuple[str, ...]:
    """A tensor's dims as text over the inputs' symbols (``same``: symbol -> the equal
    one that stands for both)."""
    return tuple(str(s.node.expr.xreplace(same)) if isinstance(s, torch.SymInt) else str(int(s)) for s in val.shape)


# ----------------------------------------------------------------------------- capture


def capture_dynamic(fn: Callable, sig, tensors: list[torch.Tensor], reached: Sequence[torch.Tensor] = (),
                    reached_names: Sequence[str] = ()):
    """The Captured kf function of a signature with DYN dims (see the module docstring);
    DynamicFallback where it cannot be one program for every size."""
    from .capture import (_convert, _export_constants, _reached_constants, _user_code, _written_inputs)

    user = _user_code(fn)
    specs = sig.tensor_sigs()
    dynamic = [[d for d, s in enumerate(spec.shape) if is_dynamic(s)] for spec in specs]
    names = sig.tensor_names()
    # a call at size 1 (api: one served by the dynamic program) traces at size 2: torch
    # specializes a size 1
    tensors = [torch.zeros([2 if d in dims and n == 1 else n for d, n in enumerate(t.shape)], dtype=t.dtype,
                           device=t.device) if any(t.shape[d] == 1 for d in dims) else t
               for t, dims in zip(tensors, dynamic + [[]] * (len(tensors) - len(dynamic)))]
    ep = _export(user, sig, tensors, dynamic)
    if _written_inputs(ep, user):
        raise DynamicFallback("the function writes to its arguments")
    input_dims, symbols, equal, size_guards, guarded = _symbols(ep, len(tensors), dynamic, names)
    constants = _export_constants(ep)
    of_reached = _reached_constants(constants, reached)
    caps = []
    for which in (0, 1):
        hints = _hints(symbols, equal, which)
        gm = _hinted(ep.graph_module, hints)
        metas = []
        for t, dims in zip(tensors, input_dims):
            shape = [int(sz) if sz.lstrip("-").isdigit() else int(hints[symbols[sz]]) for sz in dims]
            metas.append(torch.empty(shape, dtype=t.dtype, device="meta"))
        try:
            caps.append(_convert(user, sig, metas, gm, constants, ep.call_spec.out_spec, "export", of_reached,
                                 reached, reached_names))
        except CompileError as e:
            # a size used as a value (q.shape[-1] ** 0.5 is sym_float of a run-time size,
            # q.shape[1] // k.shape[1] repeats under a branch on those sizes): those dims
            # are static (api), or the static capture compiles it or raises the same
            # error at the user's line
            used = _sizes_used_as_values(ep.graph_module, input_dims, names)
            raise DynamicFallback(f"kf cannot convert the graph with run-time sizes: {e.message}",
                                  used or guarded) from None
    out_node = next(n for n in ep.graph_module.graph.nodes if n.op == "output")
    outs = [a.meta["val"] for a in out_node.args[0] if isinstance(a, torch.fx.Node)]
    input_dims = list(input_dims) + [tuple(str(s) for s in t.shape) for t in (reached[j] for j in caps[0].reached)]
    if caps[0].random_input is not None:
        input_dims.append(("2",))
    cap = unified(caps[0], caps[1], outs, input_dims, equal)
    cap.size_guards = size_guards
    cap.tracer = "export-dynamic"
    return cap


def unified(cap, other, outs: Sequence[torch.Tensor], input_dims: list, equal: dict, top=None):
    """cap, the first of two conversions of one graph under the two sets of hints
    (``_hints``), made in place the kf function of every size: its types unified with
    other's (``unify``), verified, its float sums checked (``long_sum``), and each input
    and output dim's size recorded as text (``input_dims`` as given; ``outs``: the graph's
    result values, whose sizes are expressions over the symbols; ``top``: a conversion
    at the largest sizes, for ``long_sum``). DynamicFallback where it cannot be one
    program."""
    from kf.dialects import verify

    if cap.fallbacks:
        raise DynamicFallback("ops of the function go through torch-mlir, which kf compiles for static sizes")
    with cap.context, ir.Location.unknown():
        unify(cap.module, other.module)
        errors = verify(cap.module.operation)
        if errors:
            raise DynamicFallback(f"the kf IR with run-time sizes does not verify: {errors[0][1]}")
        # (where this stages a sum, a region's conversion at the top sizes no longer lines
        # up op for op, and long_sum takes every run-time dim at its bound)
        stage_run_time_sums(cap.module, _REDUCTION_BLOCK)
        too_long = long_sum(cap.module, _REDUCTION_BLOCK, top.module if top is not None else None)
        if too_long:
            raise DynamicFallback(too_long)
    if len(outs) != len(cap.output_specs):
        raise DynamicFallback("the results do not match the graph's outputs")
    cap.output_dims = [_dims_text(o, equal) for o in outs]
    cap.input_dims = list(input_dims)
    with cap.context:
        entry = next(op for op in _ops(cap.module) if op.name == "func.func")
        ftype = ir.FunctionType(ir.TypeAttr(entry.attributes["function_type"]).value)
        cap.output_specs = [spec_of(t) for t in ftype.results]
    for dims, spec in zip(cap.output_dims, cap.output_specs):
        for text, size in zip(dims, spec.shape):
            if size != DYN and text != str(size):
                raise DynamicFallback(f"a result's size {text} is {size} in the kf IR")
    cap.fallback_reason = None
    return cap


# ----------------------------------------------------------------------------- size 1


def _same_but_sizes(static: ir.Module, dynamic: ir.Module) -> str | None:
    """Why the kf IR of a static capture is not the dynamic one's with some ``?`` at
    their sizes, or None: the same ops with the same attributes, every type of the same
    element and rank, each static dim of the dynamic IR the static IR's."""
    ops_s, ops_d = _ops(static), _ops(dynamic)
    if len(ops_s) != len(ops_d):
        return f"{len(ops_s)} ops, not {len(ops_d)}"
    for x, y in zip(ops_s, ops_d):
        if x.name != y.name or _attrs(x) != _attrs(y) or len(x.results) != len(y.results):
            return f"{x.name}: {_attrs(x)} / {y.name}: {_attrs(y)}"
        values = list(zip(x.results, y.results))
        if x.name == "func.func":
            for bx, by in zip(x.regions[0].blocks, y.regions[0].blocks):
                values += list(zip(bx.arguments, by.arguments))
        for u, v in values:
            if u.type == v.type:
                continue
            try:
                su, sv = spec_of(u.type), spec_of(v.type)
            except KfTypeError:
                return f"{u.type} / {v.type}"
            if su.elem != sv.elem or su.rank != sv.rank or any(
                    b != DYN and a != b for a, b in zip(su.shape, sv.shape)):
                return f"{x.name}: {u.type} is not {v.type}"
    return None


def serves_size_one(fn: Callable, dynamic_sig, tensors: list[torch.Tensor], ones: Sequence[tuple[int, int]],
                    static_sig) -> str | None:
    """None where the program of ``dynamic_sig`` computes what eager torch does for a
    call whose run-time dims ``ones`` ((tensor, dim)) have size 1, else why not.

    torch traces a run-time size as one of at least 2 and never records what it assumed
    of it there: a ``squeeze`` of it is no op, broadcasting never meets it as a 1. So the
    call's own trace (``static_sig``, its sizes) is compared with the dynamic trace (made
    with those dims at 2): the same kf ops and attributes, their types the dynamic ones
    at the call's sizes, is the same computation with the size taken at run time."""
    from .capture import capture_signature

    examples = list(tensors)
    for i, d in ones:
        shape = list(examples[i].shape)
        shape[d] = 2
        examples[i] = torch.zeros(shape, dtype=examples[i].dtype, device=examples[i].device)
    try:
        dyn = capture_dynamic(fn, dynamic_sig, examples)
    except DynamicFallback as e:
        return str(e)
    try:
        static = capture_signature(fn, static_sig, tensors)
    except CompileError as e:
        return f"{type(e).__name__}: {e.message}"
    with dyn.context:
        other = ir.Module.parse(static.module.operation.get_asm(print_generic_op_form=True))
        return _same_but_sizes(other, dyn.module)
