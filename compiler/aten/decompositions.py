"""ATen ops kf compiles as torch's own decomposition of them (``torch._decomp``): the
decomposition is traced on fake tensors of the node's shapes into a small graph of other
ATen ops, and each of those converts as any node does (its own kf handler, its own
decomposition, or torch-mlir). An op is listed here only where its decomposition keeps
every index checked: the indices it makes itself are in range by construction, and
those it takes from its inputs reach a kf op that checks them (gather, index_select)."""

from __future__ import annotations

import torch

from ..errors import Unsupported
from .core import _lookup, _target_name, fake_value, handles

#: ATen ops converted through torch's decomposition: (overload name, what it becomes)
DECOMPOSED = (
    "aten.addmv.default",               # mv, mul, add
    "aten.block_diag.default",          # zeros and cat
    "aten.dist.default",                # sub and norm
    "aten.isin.Tensor_Tensor",          # eq and any over the test elements
    "aten.isin.Tensor_Scalar",
    "aten.isin.Scalar_Tensor",
    "aten.multi_margin_loss.default",   # gather of the targets (checked), clamp, where, mean
    "aten.pdist.default",               # mm, diagonal and the upper triangle's index_select
)


@handles(*DECOMPOSED)
def _decomposed(c, node, args, kwargs):
    from torch._decomp import decomposition_table
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.proxy_tensor import make_fx

    name = _target_name(node.target)
    decomposition = decomposition_table[node.target]
    _refuse_meta_mismatch(node, name)
    values, examples = [], []
    mode = FakeTensorMode()

    def slot(a_fx, a_kf):
        """The tensors of an argument become the traced function's inputs."""
        if isinstance(a_fx, torch.fx.Node):
            val = fake_value(a_fx)
            values.append(a_kf)
            with mode:
                examples.append(torch.empty(tuple(val.shape), dtype=val.dtype))
            return _Input(len(values) - 1)
        if isinstance(a_fx, (list, tuple)):
            return type(a_fx)(slot(x, y) for x, y in zip(a_fx, a_kf))
        return a_fx

    op_args = [slot(a, b) for a, b in zip(node.args, args)]
    op_kwargs = {k: slot(node.kwargs[k], v) for k, v in kwargs.items()}

    def run(*tensors):
        def fill(a):
            if isinstance(a, _Input):
                return tensors[a.index]
            if isinstance(a, (list, tuple)):
                return type(a)(fill(x) for x in a)
            return a

        return decomposition(*fill(op_args), **{k: fill(v) for k, v in op_kwargs.items()})

    try:
        gm = make_fx(run, tracing_mode="fake")(*examples)
    except Exception as e:  # the decomposition's own checks (torch's errors for bad arguments)
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise Unsupported(f"{name}: torch's decomposition of it failed", cause=first[:300]) from None
    env = {}
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    for p, v in zip(placeholders, values):
        env[p] = v
    for n in gm.graph.nodes:
        if n.op == "call_function":
            if n.target is node.target:
                raise Unsupported(f"{name}: torch's decomposition of it calls it again")
            env[n] = c.convert(n, env)
        elif n.op == "output":
            return _lookup(n.args[0], env)
    raise Unsupported(f"{name}: torch's decomposition of it has no output")


def _refuse_meta_mismatch(node, name: str) -> None:
    """Unsupported where torch's shape rule (which the traced graph follows) differs from
    eager's result: multi_margin_loss of a 1-D input without reduction is 0-d in eager,
    1-element in the rule and in the decomposition."""
    if name == "aten.multi_margin_loss.default":
        x = fake_value(node.args[0])
        reduction = node.args[5] if len(node.args) > 5 else node.kwargs.get("reduction", 1)
        if x.dim() == 1 and reduction == 0:
            raise Unsupported("multi_margin_loss of a 1-D input with reduction='none' is not supported by kf",
                              cause="torch's shape rule gives a 1-element tensor, eager a 0-d one; add a batch "
                                    "dim (x[None], y[None])")


class _Input:
    def __init__(self, index: int):
        self.index = index


