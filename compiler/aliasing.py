"""Which results of a function eager torch returns as one of its input tensors, or as a
view of one: what kf's results may share with the inputs.

kf's IR is functional: ``x.clone()``, ``x * 1`` and ``x`` itself can all become "return
the input", and a GPU program that returns an input buffer would hand back the caller's
own tensor where eager gives a new one (writing into the result would change the input).
The ATen graph still says what eager does: a result that is a placeholder is the input
itself (``return x``, ``x.contiguous()`` of a contiguous x, ``dropout(x, training=False)``);
one reached from a placeholder through view ops only (their schema's result aliases the
operand, ``Tensor(a)``) is a view of it; anything else is new memory. Ops that return
their operand where they change nothing (``to`` of the same dtype, ``contiguous`` of a
contiguous input, dropout outside training) keep it the input itself; reshape and flatten,
which view when they can and copy when they cannot, count as views only of an input whose
layout is contiguous.

The result, per flat output: ``("input", i)``, ``("view", i)`` or None (new memory), i the
index of the user's tensor argument. kf may alias a result to an input only where this
says eager does; elsewhere it copies (see gpu_codegen.schedule_abi and
driver.CompiledProgram).
"""

from __future__ import annotations

import operator
from typing import Any

import torch
from mlir import ir

#: ATen ops that return a view of their operand when its layout allows and a copy otherwise
_MAY_COPY = frozenset({"aten.reshape.default", "aten.flatten.using_ints", "aten.reshape_as.default"})
#: ops that return their operand itself where they change nothing: ``to`` of the same dtype,
#: ``contiguous`` of a contiguous tensor, dropout outside training or with p = 0
_MAY_CONVERT = frozenset({"aten.to.dtype", "aten.to.dtype_layout", "aten.to.device", "aten.to.other",
                          "aten.type_as.default"})
_DROPOUTS = frozenset({"aten.dropout.default", "aten.feature_dropout.default", "aten.alpha_dropout.default",
                       "aten.feature_alpha_dropout.default"})


def _arg(node: torch.fx.Node, name: str, index: int, default: Any) -> Any:
    if name in node.kwargs:
        return node.kwargs[name]
    return node.args[index] if len(node.args) > index else default


def _result_of(node: torch.fx.Node) -> str | None:
    """"self" where the op returns its first operand itself, "view" where a view of it,
    None where new memory (or where that depends on what the trace cannot see)."""
    target = node.target
    if not isinstance(target, torch._ops.OpOverload):
        return None
    name = str(target)
    source = node.args[0] if node.args else None
    val = source.meta.get("val") if isinstance(source, torch.fx.Node) else None
    contiguous_input = isinstance(source, torch.fx.Node) and source.op == "placeholder" and \
        isinstance(val, torch.Tensor) and val.is_contiguous()
    if name in _DROPOUTS:
        return "self" if not _arg(node, "train", 2, True) or _arg(node, "p", 1, 0.5) == 0 else None
    if name == "aten.contiguous.default":
        return "self" if contiguous_input else None
    if name in _MAY_CONVERT:
        res = node.meta.get("val")
        same = isinstance(val, torch.Tensor) and isinstance(res, torch.Tensor) and val.dtype == res.dtype
        return "self" if same else None
    schema = target._schema
    if not schema.returns or not schema.arguments:
        return None
    out, first = schema.returns[0].alias_info, schema.arguments[0].alias_info
    if out is None or first is None or out.is_write or not (set(out.before_set) & set(first.before_set)):
        return None
    if name in _MAY_COPY and not contiguous_input:
        return None
    return "view"


def eager_alias(node: Any, env: dict) -> tuple[str, int] | None:
    """("input", i), ("view", i) or None for one result node (see the module docstring);
    env maps placeholders to the kf function's block arguments."""
    kind = "input"
    while isinstance(node, torch.fx.Node):
        if node.op == "placeholder":
            value = env.get(node)
            return (kind, value.arg_number) if isinstance(value, ir.BlockArgument) else None
        if node.op != "call_function":
            return None
        if node.target is operator.getitem:  # one result of a multi-result view (split, unbind)
            node = node.args[0]
            if not isinstance(node, torch.fx.Node) or _result_of(node) != "view":
                return None
            kind = "view"
        else:
            result = _result_of(node)
            if result is None:
                return None
            kind = "view" if result == "view" else kind
        node = node.args[0]
    return None


def output_nodes(out: Any) -> list:
    """The result nodes of an output node's argument, in the order capture flattens them."""
    if isinstance(out, torch.fx.Node):
        return [out]
    if isinstance(out, (tuple, list)):
        return [n for x in out for n in output_nodes(x)]
    return []
