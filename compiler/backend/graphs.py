"""One graph (AOTAutograd's forward, backward or inference graph) split into kf regions
and the rest.

``CapabilityBasedPartitioner`` with ``support.KfSupport`` proposes maximal regions of
ops kf compiles (no cycles through the rest); regions that only change views are
dropped (support.py says why). Each region becomes one submodule run by a
``regions.RegionRunner``; the rest of the graph runs eagerly (``fallback="eager"``) or is
cut, between the regions, into segments that Inductor compiles (``compile_fx_inner``,
as Inductor compiles AOTAutograd's graphs itself).

Where a region's compile refuses one of its ops (a handler that does not take these
arguments), that op is marked and the graph partitioned again, so the op falls back and
the rest of the region still runs in kf; a region that fails as a whole (a pass) falls
back whole. A region of symbolic sizes is compiled at its first call (sizes.py), but
converted now at the example inputs' sizes, so that an op kf refuses at any size is
found here too. On a target with run-time sizes, the ops that would write a run-time
size into kf's IR (``support.run_time_bounds``) are left out first. Every fallback is
reported with its op, the user's line and the reason.
"""

from __future__ import annotations

import operator
from typing import Callable

import torch
from torch.fx.passes.infra.partitioner import CapabilityBasedPartitioner

from ..errors import CompileError
from . import regions, report, support

#: how often a graph is partitioned again after its regions' compiles refuse an op
MAX_ROUNDS = 8


def _copy(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """A copy of the graph whose nodes keep their names and (shared) metadata."""
    graph = torch.fx.Graph()
    out = graph.graph_copy(gm.graph, {})
    graph.output(out)
    return torch.fx.GraphModule(gm, graph)


class _Call(torch.nn.Module):
    """A callable as a submodule (what a call_module node runs)."""

    def __init__(self, fn: Callable):
        super().__init__()
        self.fn = fn

    def forward(self, *args):
        return self.fn(*args)


def compile_graph(gm: torch.fx.GraphModule, example_inputs: list, options, kind: str) -> Callable:
    """The callable AOTAutograd runs for this graph."""
    refused: dict[str, str] = {}
    rep = None
    for _ in range(MAX_ROUNDS):
        rep = report.GraphReport(kind, options.target, options.fallback)
        work = _copy(gm)
        failed = _partition(work, example_inputs, options, kind, refused, rep)
        if not failed:
            break
    _report_fallbacks(work, rep, refused)
    report.log_report(rep)
    run = work if options.fallback == "eager" else _inductor_rest(work, rep)

    def call(args: list):
        # boxed (AOTAutograd's convention): the list is cleared so that inputs can be freed
        report.note_graph(rep)
        inputs = list(args)
        args.clear()
        return run(*inputs)

    call._boxed_call = True
    call.kf_report = rep
    return call


def _partition(gm, example_inputs, options, kind, refused, rep) -> bool:
    """Partition gm in place into kf regions; compile the static ones now. True where a
    compile refused an op (recorded in ``refused``): partition again."""
    rep.ops = sum(1 for n in gm.graph.nodes if support.op_name(n))
    from .. import targets

    target = targets.get(options.target)
    if target.dynamic_shapes and target.automatic_dynamic:  # run-time sizes (sizes.py)
        for name, why in support.run_time_bounds(gm).items():
            refused.setdefault(name, why)
    partitioner = CapabilityBasedPartitioner(gm, support.KfSupport(refused), allows_single_node_partition=True)
    proposed = [p for p in partitioner.propose_partitions() if support.computes(p.nodes)]
    names_before = {n for n, _ in gm.named_children()}
    fused = partitioner.fuse_partitions(proposed)
    new = [n for n, _ in fused.named_children() if n not in names_before]
    any_failed = False
    made = []  # (node, record, runner or the CompileError that refused it), in the graph's order
    for i, node in enumerate(n for n in fused.graph.nodes if n.op == "call_module" and n.target in new):
        sub = fused.get_submodule(node.target)
        _carry_values(node, sub)
        ops = [support.op_name(n) for n in sub.graph.nodes if support.op_name(n)]
        lines = []
        for n in sub.graph.nodes:
            loc = regions.user_loc(n) if n.op == "call_function" else None
            text = f"{loc.file.rsplit('/', 1)[-1]}:{loc.line}" if loc else ""
            if text and text not in lines:
                lines.append(text)
        record = regions.Region(f"{kind}_region_{i}", kind, ops, lines)
        fallback = sub

        def on_failure(region, why, rep=rep):
            report.log.info("%s: %s falls back at run time: %s", rep.kind, region.name, why)

        examples = [a.meta.get("val") if isinstance(a, torch.fx.Node) else a for a in node.args]
        try:
            runner = regions.RegionRunner(sub, options, record, fallback, on_failure)
            if regions.symbolic(sub):  # compiled at its first call; ops kf refuses are found now
                regions.check_conversion(sub, record.name)
                made.append((node, record, runner, None))
            else:
                made.append((node, record, runner, examples))
        except CompileError as e:
            made.append((node, record, e, None))
    compiled = regions.precompile_all([(runner, examples) for _, _, runner, examples in made
                                       if examples is not None and not isinstance(runner, CompileError)])
    for node, record, runner, examples in made:
        e = runner if isinstance(runner, CompileError) else compiled.get(id(runner))
        if e is not None:
            sub = fused.get_submodule(node.target)
            bad = getattr(e, "kf_node", None)
            why = f"{type(e).__name__}: {e.message}" + (f" ({e.cause})" if e.cause else "")
            if bad is not None:
                refused[bad] = why
            else:
                for n in sub.graph.nodes:
                    if n.op == "call_function":
                        refused[n.name] = f"its region failed to compile: {why}"
            any_failed = True
            continue
        rep.regions.append(record)
        fused.add_submodule(node.target, _Call(runner))
    fused.recompile()
    return any_failed


def _carry_values(node: torch.fx.Node, sub: torch.fx.GraphModule) -> None:
    """The region's results' fake values on its call and the getitems that take them
    apart (what Inductor's segments after it read as example inputs)."""
    out = next(n for n in sub.graph.nodes if n.op == "output").args[0]
    if isinstance(out, (tuple, list)):
        node.meta["val"] = tuple(o.meta.get("val") if isinstance(o, torch.fx.Node) else o for o in out)
        for user in node.users:
            if user.target is operator.getitem:
                user.meta["val"] = node.meta["val"][user.args[1]]
    elif isinstance(out, torch.fx.Node):
        node.meta["val"] = out.meta.get("val")


def _report_fallbacks(gm, rep, refused) -> None:
    for node in gm.graph.nodes:
        if node.op != "call_function":
            continue
        name = support.op_name(node)
        if not name or not isinstance(node.target, torch._ops.OpOverload):
            continue  # size arithmetic on SymInts: Python, not a tensor op
        why = support.why_not(node, refused) or "only views and layout changes around it: left to the fallback"
        loc = regions.user_loc(node)
        line = f"{loc.file}:{loc.line}" if loc else ""
        to = "kf" if why == support.KF_FUNCTION else rep.fallback
        rep.fallbacks.append(report.Fallback(name, line, why, to))


def _inductor_rest(gm: torch.fx.GraphModule, rep) -> Callable:
    """gm with the ops outside kf's regions compiled by Inductor: the graph cut into
    segments at the regions (in node order, so no cycle), each segment that computes
    compiled with ``compile_fx_inner``."""
    from torch.fx.passes.split_module import split_module

    regions_ = {n for n, m in gm.named_children() if isinstance(m, _Call)}
    part, segment, current = {}, 0, 0
    for node in gm.graph.nodes:
        if node.op == "call_module" and node.target in regions_:
            segment += 1
            part[node] = segment
            segment += 1
            current = segment
        elif node.target is operator.getitem and node.args[0] in part and part[node.args[0]] % 2 == 1:
            part[node] = part[node.args[0]]  # a region's results are taken apart with it
        elif node.op not in ("placeholder", "output"):
            part[node] = current
    if not any(part[n] % 2 == 0 for n in part if n.op == "call_function"):
        return gm
    split = split_module(gm, None, lambda n: part[n], keep_original_order=True)
    # split_module names each segment's inputs after the nodes of gm they are
    values = {n.name: n.meta.get("val") for n in gm.graph.nodes}
    binders = _binders(gm)
    for node in split.graph.nodes:
        if node.op != "call_module":
            continue
        sub = split.get_submodule(node.target)
        if any(n.op == "call_module" and isinstance(getattr(sub, n.target, None), _Call)
               for n in sub.graph.nodes):
            continue
        if not any(n.op == "call_function" for n in sub.graph.nodes):
            continue
        for ph in (n for n in sub.graph.nodes if n.op == "placeholder"):
            ph.meta["val"] = values.get(ph.name)
        _bind_symbols(split, node, sub, binders)
        examples = [n.meta["val"] for n in sub.graph.nodes if n.op == "placeholder"]
        split.add_submodule(node.target, _Call(_inductor(sub, examples)))
    split.recompile()
    return split


def _bound(val) -> set:
    """The symbols a value binds as Inductor reads its inputs: a SymInt that is one
    symbol, or a tensor dim that is one. A SymInt binds its own symbol, before the shape
    environment's replacements (``s75`` where the graph's sizes say ``s59``)."""
    if isinstance(val, torch.SymInt):
        own, expr = val.node._expr, val.node.expr
        return {expr} if own.is_Symbol and own == expr else set()
    if isinstance(val, torch.Tensor):
        return {d.node.expr for d in val.shape if isinstance(d, torch.SymInt) and d.node.expr.is_Symbol}
    return set()


def _used(val) -> set:
    """The symbols in a value's sizes and strides (or in the SymInt)."""
    if isinstance(val, torch.SymInt):
        return set(val.node.expr.free_symbols)
    if isinstance(val, torch.Tensor):
        return {s for d in (*val.shape, *val.stride()) if isinstance(d, torch.SymInt)
                for s in d.node.expr.free_symbols}
    return set()


def _binders(gm: torch.fx.GraphModule) -> dict:
    """For each symbol of the graph's sizes, the name of a placeholder that binds it."""
    out = {}
    for n in gm.graph.nodes:
        if n.op == "placeholder":
            for sym in _bound(n.meta.get("val")):
                out.setdefault(sym, n.name)
    return out


def _bind_symbols(split: torch.fx.GraphModule, node: torch.fx.Node, sub: torch.fx.GraphModule,
                  binders: dict) -> None:
    """Give a segment the graph's placeholders that bind the symbols its inputs' sizes use
    and no input of its own binds (a segment that takes ``[3 * s0]`` but nothing of size
    ``s0``): Inductor reads every symbol off the inputs."""
    phs = [n for n in sub.graph.nodes if n.op == "placeholder"]
    vals = [p.meta.get("val") for p in phs]
    missing = set().union(*map(_used, vals)) - set().union(*map(_bound, vals)) if vals else set()
    if not missing:
        return
    outer = {n.name: n for n in split.graph.nodes if n.op == "placeholder"}
    extra = []
    for sym in sorted(missing, key=str):
        name = binders.get(sym)
        if name is None or name not in outer or name in extra or any(p.name == name for p in phs):
            continue
        extra.append(name)
    if not extra:
        return
    with sub.graph.inserting_after(phs[-1]):
        for name in reversed(extra):
            ph = sub.graph.placeholder(name)
            ph.meta["val"] = outer[name].meta.get("val")
    # placeholders keep their order: the new ones after the segment's own
    node.args = (*node.args, *(outer[name] for name in extra))
    sub.recompile()


def _inductor(sub: torch.fx.GraphModule, examples: list) -> Callable:
    """A segment compiled by Inductor (its output made a tuple, as Inductor wants)."""
    from torch._inductor.compile_fx import compile_fx_inner
    from torch._inductor.decomposition import select_decomp_table
    from torch.fx import traceback as fx_traceback
    from torch.fx.experimental.proxy_tensor import make_fx

    out = next(n for n in sub.graph.nodes if n.op == "output")
    single = not isinstance(out.args[0], (tuple, list))
    if single:
        out.args = ((out.args[0],),)
        sub.recompile()
    # the segment in the ops Inductor lowers (its own decompositions: AOTAutograd ran kf's)
    with fx_traceback.preserve_node_meta():
        sub = make_fx(torch.fx.Interpreter(sub).run, decomposition_table=select_decomp_table())(*examples)
    # Inductor records its graph's output strides for AOTAutograd in the tracing context,
    # once per graph; a segment is not the graph, so each compiles against a clean record
    # and AOTAutograd's is left as it was
    from torch._guards import TracingContext

    ctx = TracingContext.try_get()
    saved = ctx.output_strides if ctx is not None else None
    if ctx is not None:
        ctx.output_strides = []
    try:
        compiled = compile_fx_inner(sub, examples)
    finally:
        if ctx is not None:
            ctx.output_strides = saved

    def run(*args):
        result = compiled(list(args))
        return result[0] if single else tuple(result)

    return run
