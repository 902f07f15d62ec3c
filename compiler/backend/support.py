"""Which nodes of a Dynamo/AOTAutograd graph kf compiles, and which regions are worth it.

A node is kf's when kf's own ATen table (``aten_to_kf.HANDLERS``, the table capture
converts with) has its overload, every tensor it reads and makes has a dtype kf has, and
its results are tensors (a SymInt-valued node -- ``sym_size`` -- stays outside). Nodes
that a region's compile refused (``refused``: a handler's ``Unsupported`` for these
arguments, found at compile time) are not kf's either.

A region is kept only where it computes: one made of views and layout changes alone
(``view``, ``permute``, ``t``, ``expand``, ``slice``, ...) would copy what the fallback
gets for free as a view, so it costs more than it saves. Any region with at least one
op that computes (an add, a matmul, a norm) is one kf program.
"""

from __future__ import annotations

import operator

import torch
from torch.fx.passes.operator_support import OperatorSupport

#: ATen ops that only change how a tensor is seen (no arithmetic): a region of these alone
#: is left to the fallback.
LAYOUT_OPS = frozenset({
    "aten.view.default", "aten._unsafe_view.default", "aten.reshape.default", "aten.permute.default",
    "aten.transpose.int", "aten.t.default", "aten.expand.default", "aten.squeeze.dim", "aten.squeeze.dims",
    "aten.squeeze.default", "aten.unsqueeze.default", "aten.slice.Tensor", "aten.select.int", "aten.alias.default",
    "aten.detach.default", "aten.clone.default", "aten.contiguous.default", "aten.split.Tensor",
    "aten.split_with_sizes.default", "aten.unsafe_split.Tensor", "aten.narrow.default", "aten.flatten.using_ints",
    "aten.unflatten.int", "aten.view_as.default", "aten.reshape_as.default", "aten.expand_as.default",
    "aten.broadcast_to.default", "aten.lift_fresh_copy.default", "aten.numpy_T.default",
})


#: why a kf function's own op (``torch.ops.kf.<name>``, attention.py) is outside the regions
KF_FUNCTION = "a kf function's op: its own kf program, called as it is"


def op_name(node: torch.fx.Node) -> str:
    """The node's ATen overload as kf's table names it (``aten.add.Tensor``), or ""."""
    from kf.aten_to_kf import _target_name

    if node.op != "call_function" or node.target is operator.getitem:
        return ""
    try:
        return _target_name(node.target)
    except Exception:
        return getattr(node.target, "__name__", str(node.target))


def _values(x) -> list:
    if isinstance(x, (list, tuple)):
        return [v for y in x for v in _values(y)]
    return [x]


def _dtype_ok(val) -> bool:
    from kf.dtypes import TORCH_TO_KF

    return all(v.dtype in TORCH_TO_KF for v in _values(val) if isinstance(v, torch.Tensor))


def why_not(node: torch.fx.Node, refused: dict[str, str]) -> str:
    """Why kf does not compile this node ("" where it does)."""
    from kf.aten_to_kf import HANDLERS

    if node.op != "call_function":
        return "not an op"
    if node.name in refused:
        return refused[node.name]
    if node.target is operator.getitem:
        src = node.args[0]
        return "" if isinstance(src, torch.fx.Node) and not why_not(src, refused) else "takes a result of an op kf leaves"
    name = op_name(node)
    if name.startswith("kf.") and name not in HANDLERS:
        return KF_FUNCTION
    if name not in HANDLERS:
        return f"kf has no op for {name}"
    val = node.meta.get("val")
    outs = _values(val)
    if not outs or not all(isinstance(v, torch.Tensor) for v in outs):
        return f"{name} gives a value that is not a tensor"
    if not _dtype_ok(val):
        return f"{name} gives a dtype kf has no type for"
    for a in _values(list(node.args) + list(node.kwargs.values())):
        if isinstance(a, torch.fx.Node):
            v = a.meta.get("val")
            if isinstance(v, torch.Tensor) and not _dtype_ok(v):
                return f"{name} reads a {v.dtype} tensor, a dtype kf has no type for"
    return ""


#: views whose bounds are arguments after the tensor: a slice, a narrow, a select
BOUNDED_VIEWS = frozenset({"aten.slice.Tensor", "aten.narrow.default", "aten.select.int"})

#: why such a view of a graph input, bounded by a run-time size, is left outside the regions
RUN_TIME_BOUNDS = ("a view of a graph input bounded by a run-time size: left outside the regions, so that "
                   "they take its result as an input of run-time size (kf's slice bounds are static)")


#: ops that make a tensor of the sizes in their arguments (the sizes' position)
FACTORIES = {"aten.full.default": 0, "aten.zeros.default": 0, "aten.ones.default": 0,
             "aten.empty.memory_format": 0, "aten.new_full.default": 1, "aten.new_zeros.default": 1,
             "aten.new_ones.default": 1, "aten.new_empty.default": 1}

#: why such an op sized by a run-time size is left outside the regions
RUN_TIME_FACTORY = ("a new tensor of a run-time size: left outside the regions, so that they take it as an input "
                    "(kf's fill is sized by its type, which holds no run-time size)")


#: float reductions, and where their reduced dims are: (position of the dims argument, or
#: None for all dims), or "nll" for the loss (its batch dim, under a reduction)
SUMS = {"aten.sum.default": None, "aten.sum.dim_IntList": 1, "aten.mean.default": None, "aten.mean.dim": 1,
        "aten.nll_loss_forward.default": "nll"}

#: why such a reduction is left outside the regions
RUN_TIME_SUM = ("a float sum over more elements of run-time sizes than kf adds in one stage (a loss over a "
                "flattened batch of run-time length): left outside the regions, so that they stay one program "
                "for every size")


def _long_run_time_sum(node: torch.fx.Node) -> bool:
    """Whether node adds up floats over dims of run-time sizes that kf cannot stage: a
    dim that is an expression of sizes (``2*s0``, the rows of a flattened batch), or
    several such dims, that may come to more than a stage's elements at their bound
    (compiler/dynamic.long_sum, which would compile the whole region for each size)."""
    at = SUMS.get(op_name(node), False)
    if at is False or not node.args or not isinstance(node.args[0], torch.fx.Node):
        return False
    val = node.args[0].meta.get("val")
    if not isinstance(val, torch.Tensor) or not val.dtype.is_floating_point or val.dim() == 0:
        return False
    if at == "nll":
        if len(node.args) > 3 and node.args[3] == 0 or val.dim() < 2:  # reduction="none", or one row
            return False
        dims = [0]
    elif at is None or len(node.args) <= at or not node.args[at]:
        dims = list(range(val.dim()))
    else:
        dims = [d % val.dim() for d in node.args[at]]
    from ..dynamic import _REDUCTION_BLOCK
    from ..signature import MAX_DYNAMIC_SIZE

    exprs = [val.shape[d].node.expr for d in dims if isinstance(val.shape[d], torch.SymInt)
             and not val.shape[d].node.expr.is_number]
    if not exprs or (len(exprs) == 1 and exprs[0].is_Symbol):  # none, or one staged (dynamic.stage_run_time_sums)
        return False
    bound = 1
    for d in dims:
        n = val.shape[d]
        e = n.node.expr if isinstance(n, torch.SymInt) else None
        bound *= int(e.subs({x: MAX_DYNAMIC_SIZE for x in e.free_symbols})) if e is not None else int(n)
    return bound > _REDUCTION_BLOCK


#: ops that join or pad tensors along a dim
JOINS = frozenset({"aten.cat.default", "aten.constant_pad_nd.default"})

#: why such an op, longer than a run-time size, is left outside the regions
RUN_TIME_JOIN = ("a concatenation or pad along a run-time dim that comes out longer than a run-time size (a "
                 "shift of labels: n + 1): left outside the regions, whose kernels are planned at the largest "
                 "run-time size")


def _longer_than_a_size(node: torch.fx.Node) -> bool:
    """Whether node joins or pads along a dim of run-time size into a dim that is a
    size plus more (``n + 1``): kf's kernels plan every run-time dim at the largest size
    (passes/strategies/run_time_sizes.bounded), which that dim can pass."""
    if op_name(node) not in JOINS:
        return False
    val = node.meta.get("val")
    if not isinstance(val, torch.Tensor):
        return False
    from .sizes import times_symbol

    for n in val.shape:
        e = n.node.expr if isinstance(n, torch.SymInt) else None
        if e is not None and not e.is_number and not e.is_Symbol and times_symbol(e) is None:
            return True
    return False


def run_time_bounds(gm: torch.fx.GraphModule) -> dict[str, str]:
    """Ops that would make a region of run-time sizes compile for each size, by node
    name, with why they stay out of the regions: the views of graph inputs that a
    symbolic size bounds (``freqs[:seq]`` of a table of positions; kf's slice bounds are
    numbers), new tensors of a symbolic size (the zeros a slice's backward fills;
    kf's fill takes its sizes from its type), and float sums over more run-time elements
    than kf stages (``_long_run_time_sum``), and joins into a dim longer than a run-time
    size (``_longer_than_a_size``). Outside, they run on the fallback and the
    region takes their result as an input whose size is ``seq``."""
    out = {}
    for node in gm.graph.nodes:
        at = FACTORIES.get(op_name(node))
        if at is not None and len(node.args) > at and any(
                isinstance(b.meta.get("val") if isinstance(b, torch.fx.Node) else b, torch.SymInt)
                for b in _values(node.args[at])):
            out[node.name] = RUN_TIME_FACTORY
            continue
        if _long_run_time_sum(node):
            out[node.name] = RUN_TIME_SUM
            continue
        if _longer_than_a_size(node):
            out[node.name] = RUN_TIME_JOIN
            continue
        if op_name(node) not in BOUNDED_VIEWS or not node.args:
            continue
        src = node.args[0]
        if not isinstance(src, torch.fx.Node) or src.op != "placeholder":
            continue
        bounds = _values(list(node.args[1:]) + list(node.kwargs.values()))
        if any(isinstance(b.meta.get("val") if isinstance(b, torch.fx.Node) else b, torch.SymInt) for b in bounds):
            out[node.name] = RUN_TIME_BOUNDS
    return out


class KfSupport(OperatorSupport):
    """The OperatorSupport of CapabilityBasedPartitioner: kf's table decides."""

    def __init__(self, refused: dict[str, str] | None = None):
        super().__init__()
        self.refused = refused if refused is not None else {}

    def is_node_supported(self, submodules, node: torch.fx.Node) -> bool:
        return not why_not(node, self.refused)


def computes(nodes) -> bool:
    """Whether a region does arithmetic (holds an op other than views and getitem)."""
    return any(op_name(n) and op_name(n) not in LAYOUT_OPS for n in nodes)
