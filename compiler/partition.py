"""What the forward saves for its backward: the split of a joint forward+backward graph.

``autograd.derive`` traces the joint function of one specialization -- the forward's
outputs and the gradients, from the inputs and the output gradients -- as one ATen graph.
``split`` cuts it in two: a forward graph that returns the user's outputs and then the
values its backward needs, and a backward graph that takes them. Each becomes a kf
function, so under autograd the forward runs once, as the same fused kernels as without
it (plus the outputs it saves), and the backward starts from what was saved.

kf's rule for what crosses (where AOTAutograd's partitioner solves a min-cut, kf saves
by kind, so that what is saved is known before anything is measured):

- the inputs (autograd holds them anyway) and the user's outputs;
- per-row statistics: the results of reductions (a norm's mean and variance, or its
  mean square; ``native_layer_norm``'s mean and rstd): a value per row; what the forward computes from them alone (``rstd =
  rsqrt(var + eps)``) the backward recomputes, once per row;
- for a softmax the backward reads, unless it is an output itself: its row logsumexp
  ``lse = kf::logsumexp(scores, [-1], keepdim)`` in f32, shape ``[..., Sq, 1]`` (the
  row's length is not its innermost dim, which the GPU targets keep static: a sequence
  length that changes stays a run-time size of the backward); the backward
  recomputes the probabilities as ``exp(scores - lse) (``scores - lse`` for
  log_softmax) from the scores, which it recomputes too;
- products of matmuls (GEMM outputs an MLP's backward reads): recomputing one costs a
  GEMM, saving it one activation, as eager and torch.compile save it -- except the
  products that feed a softmax (attention's ``q @ k^T``: a score matrix is never saved,
  the backward recomputes it block by block as FlashAttention does).

Everything else the backward reads (elementwise chains, views, comparisons of a mask,
casts) is recomputed inside the backward's kernels from what was saved: cheap, and no
activation of that size outlives the forward.

The interface attention kernels build on (a forward whose kf IR kf-fuse recognizes as
attention): the forward saves q, k, v, the mask (the inputs), O (the output) and lse;
its kf IR holds ``kf.logsumexp(scores) {dims = [-1]}`` beside the ``kf.softmax(scores)``
of the same scores value (the attention recognizer folds it into the attention kernel
as a second output); the backward's kf IR recomputes the scores from q and k with the
forward's own ops (scale, mask) and ``P = exp(scores - lse)``, rounded to the
softmax's type, where the forward had the softmax's output.
"""

from __future__ import annotations

import math
import operator
from dataclasses import dataclass

import torch
import torch.fx as fx

aten = torch.ops.aten


# ----------------------------------------------------------------------------- the lse op


def lse_dtype(dtype: torch.dtype) -> torch.dtype:
    """The type a softmax's saved logsumexp has for scores of ``dtype``: f32, f64 for f64."""
    return torch.float64 if dtype == torch.float64 else torch.float32


def _define_logsumexp():
    @torch.library.custom_op("kf::logsumexp", mutates_args=(), schema="(Tensor x, int[] dims, bool keepdim) -> Tensor")
    def logsumexp(x: torch.Tensor, dims, keepdim: bool) -> torch.Tensor:
        return torch.logsumexp(x.to(lse_dtype(x.dtype)), list(dims), keepdim=keepdim)

    @logsumexp.register_fake
    def _(x, dims, keepdim):
        return torch.logsumexp(x.to(lse_dtype(x.dtype)), list(dims), keepdim=keepdim)

    return logsumexp


#: ``kf::logsumexp(x, dims, keepdim)``: torch.logsumexp in f32 (f64 for f64) whatever x's
#: type; kf's capture makes it ``kf.logsumexp``. A softmax's saved statistic.
logsumexp = _define_logsumexp()


# ----------------------------------------------------------------------------- kinds of nodes

#: reductions: their results are per-row (or per-column) statistics
_REDUCTIONS = {aten.sum.dim_IntList, aten.sum.default, aten.mean.dim, aten.mean.default, aten.amax.default,
               aten.amin.default, aten.var.correction, aten.var.dim, aten.var_mean.correction,
               aten.std.correction, aten.logsumexp.default, torch.ops.kf.logsumexp.default,
               aten.max.dim, aten.min.dim, aten.max.default, aten.min.default, aten.prod.dim_int}

#: ops whose results at these indices are per-row statistics (a layer norm's mean and rstd)
_STATISTICS_AT = {aten.native_layer_norm.default: (1, 2)}

#: products whose results are saved rather than recomputed (outside attention's scores)
_PRODUCTS = {aten.mm.default, aten.bmm.default, aten.addmm.default, aten.baddbmm.default,
             aten.convolution.default, aten._scaled_mm.default}

_SOFTMAX = {aten._softmax.default, aten._log_softmax.default}

#: ops a softmax's scores pass through from their product: views, casts, scales, masks
_SCORE_PATH = {aten.view.default, aten._unsafe_view.default, aten.reshape.default, aten.expand.default,
               aten.permute.default, aten.transpose.int, aten.t.default, aten.alias.default, aten.clone.default,
               aten._to_copy.default, aten.div.Tensor, aten.div.Scalar, aten.mul.Tensor, aten.mul.Scalar,
               aten.add.Tensor, aten.sub.Tensor, aten.where.self, aten.masked_fill.Scalar,
               aten.masked_fill.Tensor, aten.unsqueeze.default, aten.squeeze.dim, aten.contiguous.default}


def _val(n) -> torch.Tensor | None:
    v = n.meta.get("val") if isinstance(n, fx.Node) else None
    return v if isinstance(v, torch.Tensor) else None


def _numel(n) -> int:
    """Elements of n's value; of a graph traced on symbolic sizes, at the sizes it was
    traced with (a hint: no guard on them)."""
    v = _val(n)
    return 1 if v is None else math.prod(s if isinstance(s, int) else int(s.node.hint) for s in v.shape)


def _tensor_args(n: fx.Node) -> list[fx.Node]:
    return [a for a in n.all_input_nodes if _val(a) is not None or a.op == "placeholder"]


# ----------------------------------------------------------------------------- the split


@dataclass
class Split:
    """The two graphs of one specialization.

    ``forward``: (inputs) -> (*outputs, *extras). ``backward``: (inputs, the outputs
    ``saved_outputs`` names, extras, output gradients) -> input gradients. ``extras``
    holds (shape, dtype, kind) of each saved value that is neither input nor output,
    kind "statistic", "lse" or "product"."""

    forward: fx.GraphModule
    backward: fx.GraphModule
    saved_outputs: tuple[int, ...]
    extras: tuple[tuple[tuple[int, ...], torch.dtype, str], ...]


def cse(gm: fx.GraphModule) -> None:
    """Merge call_function nodes with the same target and arguments (the joint graph
    computes a var's mean again for its backward): one statistic, saved once."""
    seen: dict = {}
    for n in list(gm.graph.nodes):
        if n.op != "call_function":
            continue
        target = n.target
        if isinstance(target, torch._ops.OpOverload) and (
                torch.Tag.nondeterministic_seeded in target.tags or target._schema.is_mutable):
            continue
        try:
            key = (target, _hashable(n.args), _hashable(n.kwargs))
            hash(key)
        except TypeError:
            continue
        other = seen.get(key)
        if other is None:
            seen[key] = n
        else:
            n.replace_all_uses_with(other)
            gm.graph.erase_node(n)
    gm.graph.lint()


def _hashable(x):
    if isinstance(x, (list, tuple)):
        return (type(x).__name__, tuple(_hashable(v) for v in x))
    if isinstance(x, dict):
        return tuple(sorted((k, _hashable(v)) for k, v in x.items()))
    if isinstance(x, (torch.dtype, torch.device, torch.layout, torch.memory_format)):
        return str(x)
    if isinstance(x, torch.Tensor):
        raise TypeError("a tensor constant")
    return x


def out_of_place(gm: fx.GraphModule) -> None:
    """In-place ops whose mutated operand nothing reads afterwards (``F.rms_norm`` writes
    ``mean(x * x).add_(eps)``) become their out-of-place forms: the value the graph
    computes is the same, the saved statistic is the reduction's own result, and the
    backward does not write into a tensor autograd saved (nor leave kf's light tracer)."""
    position = {n: i for i, n in enumerate(gm.graph.nodes)}
    for n in list(gm.graph.nodes):
        t = n.target
        if not (isinstance(t, torch._ops.OpOverload) and t._schema.is_mutable and t._opname.endswith("_")
                and n.args and isinstance(n.args[0], fx.Node)):
            continue
        packet = getattr(aten, t._opname[:-1], None)
        functional = getattr(packet, t._overloadname, None) if packet is not None else None
        if functional is None or any(position[u] > position[n] for u in n.args[0].users if u is not n):
            continue
        n.target = functional
    gm.graph.lint()


def split(gm: fx.GraphModule, n_inputs: int, n_outputs: int) -> Split:
    """Split the joint graph ``gm``: placeholders (inputs, output gradients), returning
    (*the forward's ``n_outputs`` outputs, *input gradients)."""
    out_of_place(gm)
    cse(gm)
    graph = gm.graph
    places = [n for n in graph.nodes if n.op == "placeholder"]
    primals, tangents = places[:n_inputs], places[n_inputs:]
    out_node = next(n for n in graph.nodes if n.op == "output")
    results = list(out_node.args[0])
    outputs, grads = results[:n_outputs], results[n_outputs:]

    # backward nodes: those that read an output gradient
    backward: set = set(tangents)
    for n in graph.nodes:
        if n.op == "call_function" and any(a in backward for a in n.all_input_nodes):
            backward.add(n)
    output_index: dict = {}
    for i, o in enumerate(outputs):
        if isinstance(o, fx.Node) and o.op != "placeholder" and o not in output_index:
            output_index[o] = i
    scores = _score_products(graph)
    _delta_from_output(graph, backward, outputs, tangents)

    def statistic(n: fx.Node) -> bool:
        """A reduction's result (or one of a reduction's results)."""
        if n.op != "call_function" or n in backward:
            return False
        if n.target is operator.getitem:
            src = n.args[0]
            if isinstance(src, fx.Node) and src.target in _STATISTICS_AT:
                return n.args[1] in _STATISTICS_AT[src.target]
            return isinstance(src, fx.Node) and statistic(src)
        return n.target in _REDUCTIONS

    # what the backward reads from the forward, decided value by value
    saved_outputs: dict = {}
    extras: list = []
    kinds: dict = {}
    recompute: set = set()
    via_lse: dict = {}  # softmax node -> its lse node (a forward node added to the graph)
    decided: set = set()

    def need(n) -> None:
        if not isinstance(n, fx.Node) or n in decided:
            return
        decided.add(n)
        if n.op in ("placeholder", "get_attr"):
            return
        if n in backward:
            for a in n.all_input_nodes:
                need(a)
            return
        if n in output_index:
            saved_outputs[n] = output_index[n]
        elif statistic(n):
            extras.append(n)
            kinds[n] = "statistic"
        elif n.target in _PRODUCTS and n not in scores:
            extras.append(n)
            kinds[n] = "product"
        elif n.target in _SOFTMAX and _last_dim(n) and _val(n) is not None and _val(n).is_floating_point():
            lse = _add_lse(graph, n)
            via_lse[n] = lse
            extras.append(lse)
            kinds[lse] = "lse"
            need(n.args[0])
        else:
            recompute.add(n)
            for a in n.all_input_nodes:
                need(a)

    for g in grads:
        need(g)
    position = {n: i for i, n in enumerate(graph.nodes)}
    extras.sort(key=position.__getitem__)  # the forward's order: mean before var

    # the forward graph: the user's outputs, then the extras
    fwd = fx.Graph()
    env: dict = {}
    for n in graph.nodes:
        if n.op == "placeholder":
            if n in primals:
                env[n] = fwd.node_copy(n)
            continue
        if n.op == "output" or n in backward:
            continue
        env[n] = fwd.node_copy(n, lambda a: env[a])
    fwd.output(tuple(env[o] if isinstance(o, fx.Node) else o for o in outputs) + tuple(env[e] for e in extras))
    fwd.eliminate_dead_code()

    # the backward graph: inputs, saved outputs, extras, gradients; then what it recomputes
    # and its own nodes, in the joint graph's order
    bwd = fx.Graph()
    benv: dict = {}
    for n in primals:
        benv[n] = bwd.node_copy(n)
    saved_order = sorted(saved_outputs.items(), key=lambda kv: kv[1])
    for n, i in saved_order:
        benv[n] = bwd.placeholder(f"out{i}")
        benv[n].meta = dict(n.meta)
    for k, e in enumerate(extras):
        benv[e] = bwd.placeholder(f"saved_{e.name}")
        benv[e].meta = dict(e.meta)
    for n in tangents:
        benv[n] = bwd.node_copy(n)
    for n in graph.nodes:
        if n in benv or n.op in ("placeholder", "output"):
            continue
        if n.op == "get_attr" or n in recompute or n in backward:
            benv[n] = bwd.node_copy(n, lambda a: benv[a])
        elif n in via_lse:
            benv[n] = _probabilities(bwd, n, benv[n.args[0]], benv[via_lse[n]])
    bwd.output(tuple(benv[g] if isinstance(g, fx.Node) else g for g in grads))
    bwd.eliminate_dead_code()

    metas = []
    for e in extras:
        v = _val(e)
        metas.append((tuple(v.shape), v.dtype, kinds[e]))  # symbolic sizes stay expressions
    return Split(fx.GraphModule(gm, fwd), fx.GraphModule(gm, bwd), tuple(i for _, i in saved_order), tuple(metas))


#: ops that move or widen a tensor without changing its values' meaning
_MOVES = {aten.alias.default, aten.view.default, aten._unsafe_view.default, aten.reshape.default,
          aten.expand.default, aten._to_copy.default, aten.clone.default, aten.contiguous.default}


def _source(n):
    """n with the moves (_MOVES) that lead to it walked back."""
    while isinstance(n, fx.Node) and n.op == "call_function" and n.target in _MOVES:
        n = n.args[0]
    return n


def _delta_from_output(graph: fx.Graph, backward: set, outputs: list, tangents: list) -> None:
    """Attention's ``D = rowsum(dP * P)`` in the backward as ``rowsum(dO * O)``, as
    FlashAttention computes it (the two are equal: ``dP = dO V^T``, ``O = P V``): O
    is saved (an output), and the backward reads neither P nor dP for it. Only where the
    graph is that attention: a softmax whose probabilities reach an output O only through
    ``P @ V``, and ``dP = dO @ V^T`` with dO the gradient of O."""
    float_outputs = [o for o in outputs if isinstance(o, fx.Node) and _val(o) is not None
                     and _val(o).is_floating_point()]
    tangent_of = {id(o): t for o, t in zip(float_outputs, tangents)}
    for sm in [n for n in graph.nodes if n.op == "call_function" and n.target is aten._softmax.default]:
        found = _product_output(sm, backward, outputs)
        if found is None:
            continue
        out, v = found
        tangent = tangent_of.get(id(out))
        if tangent is None:
            continue
        for red in [n for n in graph.nodes if n in backward and n.target is aten.sum.dim_IntList]:
            if list(red.args[1]) != [-1] or not (len(red.args) > 2 and red.args[2]):
                continue
            mul = red.args[0]
            if not (isinstance(mul, fx.Node) and mul.target is aten.mul.Tensor and len(mul.users) >= 1):
                continue
            a, b = (_source(x) for x in mul.args)
            dp = b if a is sm else a if b is sm else None
            if not (isinstance(dp, fx.Node) and dp.target is aten.bmm.default):
                continue
            g, vt = dp.args
            if _source(g) is not tangent or not (isinstance(vt, fx.Node) and vt.target is aten.permute.default
                                                 and _source(vt.args[0]) is _source(v)):
                continue
            ct = _val(mul).dtype
            if tuple(_val(out).shape[:-1]) != tuple(_val(red).shape[:-1]):
                continue
            made = []
            with graph.inserting_before(red):
                do, o = tangent, out
                if _val(do).dtype != ct:
                    do = graph.call_function(aten._to_copy.default, (do,), {"dtype": ct})
                    made.append(do)
                if _val(o).dtype != ct:
                    # (a forward node: saved with O's type, widened in the backward)
                    o = graph.call_function(aten._to_copy.default, (o,), {"dtype": ct})
                    made.append(o)
                prod = graph.call_function(aten.mul.Tensor, (do, o))
                delta = graph.call_function(aten.sum.dim_IntList, (prod, [-1], True))
            made += [prod, delta]
            for n in made:
                n.meta = {"stack_trace": red.meta.get("stack_trace", "")}
            red.replace_all_uses_with(delta)
            backward.update(made)


def _product_output(sm: fx.Node, backward: set, outputs: list):
    """(the output O, V) where sm's probabilities reach O only as ``P @ V`` (moves
    aside), else None."""
    # the forward's own uses: nodes an output depends on (not those only the backward reads)
    live, stack = set(), [o for o in outputs if isinstance(o, fx.Node)]
    while stack:
        n = stack.pop()
        if n not in live:
            live.add(n)
            stack.extend(n.all_input_nodes)
    users, stack = [], [sm]
    while stack:
        n = stack.pop()
        for u in n.users:
            if u in backward or u not in live:
                continue
            if u.target in _MOVES:
                stack.append(u)
            else:
                users.append((n, u))
    if len(users) != 1:
        return None
    p, prod = users[0]
    if prod.target is not aten.bmm.default or prod.args[0] is not p:
        return None
    o = prod
    while True:
        if o in outputs:
            return o, prod.args[1]
        nxt = [u for u in o.users if u not in backward and u in live]
        if len(nxt) != 1 or nxt[0].target not in _MOVES:
            return None
        o = nxt[0]


def _last_dim(sm: fx.Node) -> bool:
    v = _val(sm.args[0])
    return v is not None and v.dim() > 0 and int(sm.args[1]) % v.dim() == v.dim() - 1


def _score_products(graph: fx.Graph) -> set:
    """The matmuls whose products reach a softmax through views, casts, scales and masks
    alone: a score matrix, which the backward recomputes rather than saves."""
    out: set = set()
    for n in graph.nodes:
        if n.op != "call_function" or n.target not in _SOFTMAX:
            continue
        stack, seen = [n.args[0]], set()
        while stack:
            m = stack.pop()
            if not isinstance(m, fx.Node) or m in seen or m.op != "call_function":
                continue
            seen.add(m)
            if m.target in _PRODUCTS:
                out.add(m)
            elif m.target in _SCORE_PATH:
                stack.extend(m.all_input_nodes)
    return out


def _add_lse(graph: fx.Graph, sm: fx.Node) -> fx.Node:
    """``kf::logsumexp(scores, [-1], keepdim)`` right after the softmax ``sm`` (a forward
    node)."""
    scores = sm.args[0]
    with graph.inserting_after(sm):
        lse = graph.call_function(torch.ops.kf.logsumexp.default, (scores, [-1], True))
    v = _val(scores)
    lse.meta = {k: val for k, val in sm.meta.items() if k in ("stack_trace", "nn_module_stack")}
    lse.meta["val"] = logsumexp(v, [-1], True) if v is not None else None
    return lse


def _probabilities(g: fx.Graph, sm: fx.Node, scores: fx.Node, lse: fx.Node) -> fx.Node:
    """The softmax's output, from the scores and the saved lse: ``exp(scores - lse)``
    (``scores - lse`` for log_softmax), in the softmax's own type."""
    shifted = g.call_function(aten.sub.Tensor, (scores, lse))
    value = g.call_function(aten.exp.default, (shifted,)) if sm.target is aten._softmax.default else shifted
    dtype = _val(sm).dtype
    if dtype != _val(lse).dtype:
        value = g.call_function(aten._to_copy.default, (value,), {"dtype": dtype})
    for n in (shifted, value):
        n.meta = {k: v for k, v in sm.meta.items() if k == "stack_trace"}
    return value
