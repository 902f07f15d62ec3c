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
