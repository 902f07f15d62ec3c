"""ATen ops kf compiles as torch's own decomposition of them: the decomposition is traced
on fake tensors of the node's shapes into a small graph of other ATen ops, and each of
those converts as any node does (its own kf handler, its own decomposition, or
torch-mlir).

An op with no kf handler converts, in this order: through torch's decomposition of it
(``torch._decomp.decomposition_table``, else its CompositeImplicitAutograd kernel), then
through torch-mlir (``torch_mlir_import.py``). A decomposition is used only where it
keeps kf's guarantees, else the op goes to torch-mlir as if it had none:

- the traced graph holds only ATen ops (torch's reference decompositions of math
  functions end in ``prims`` ops, which kf has no ops for), none of them the op itself
  or one that draws random numbers;
- the op writes to none of its arguments, and takes no tensor of integer indices: a
  decomposition may compare indices instead of indexing with them, which eager would
  refuse where one is out of range. The ops listed in ``DECOMPOSED`` are the exception:
  their decompositions make in-range indices by construction and pass those they take
  to a kf op that checks them (gather, index_select).

Where converting the traced graph fails (an op in it that neither kf nor torch-mlir
lowers), the ops it inserted are erased and torch-mlir lowers the op itself."""

from __future__ import annotations

import torch
from mlir import ir

from ..errors import Unsupported
from ..torch_mlir_import import _INDEX_ARGS
from .core import UNHANDLED, _lookup, _target_name, fake_value, handles

#: ATen ops converted through torch's decomposition although they take indices: (overload
#: name, what it becomes)
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
    name = _target_name(node.target)
    _refuse_meta_mismatch(node, name)
    return _convert_traced(c, node, name, _trace(node, name, decomposition_of(node.target)),
                           _values(node, args, kwargs))


def convert_unhandled(c, node: torch.fx.Node, name: str, args: list, kwargs: dict):
    """An op with no kf handler: its decomposition where there is a usable one, else
    (or where the decomposition's graph fails to convert) torch-mlir."""
    from .. import torch_mlir_import

    failure = None
    decomposition = decomposition_of(node.target)
    if decomposition is not None and _decomposable(node) and node.target not in c.decomposing:
        try:
            traced = _trace(node, name, decomposition)
        except Unsupported as e:
            traced, failure = None, e
        if traced is not None and _usable(traced, node.target):
            mark = _Mark(c)
            c.decomposing.add(node.target)
            try:
                result = _convert_traced(c, node, name, traced, _values(node, args, kwargs))
                c._check(node, name, result)  # a shape rule unlike eager's: torch-mlir's turn
                return result
            except Unsupported as e:
                mark.roll_back()
                failure = e
            finally:
                c.decomposing.discard(node.target)
    try:
        return torch_mlir_import.import_op(c, node, name, args, kwargs)
    except Unsupported as e:
        if failure is not None and not torch_mlir_import.available():
            raise Unsupported(f"{name} has no kf op, and its decomposition cannot be compiled: {failure}",
                              cause=failure.cause) from None
        raise


UNHANDLED["op"] = convert_unhandled


def decomposition_of(target):
    """torch's decomposition of an ATen op (a function of the op's arguments), or None."""
    from torch._decomp import decomposition_table

    if not isinstance(target, torch._ops.OpOverload):
        return None
    if target in decomposition_table:
        return decomposition_table[target]
    if target.has_kernel_for_dispatch_key(torch._C.DispatchKey.CompositeImplicitAutograd):
        return target  # traced below autograd, its composite kernel runs: the ops it is made of
    return None


#: decompositions kf does not take for some arguments, with why: ATen op -> test on the node
_NOT_DECOMPOSED = {
    # bicubic sampling's decomposition (16 taps, 170 kernels) kills lavapipe's Vulkan
    # driver (SIGSEGV while its kernels run); torch-mlir's lowering of the op runs
    "aten.grid_sampler_2d.default": lambda node: len(node.args) > 2 and node.args[2] == 2,
}


def _decomposable(node: torch.fx.Node) -> bool:
    """Whether the op writes no argument and takes no integer tensor of indices."""
    schema = node.target._schema
    refused = _NOT_DECOMPOSED.get(_target_name(node.target))
    if schema.is_mutable or (refused is not None and refused(node)):
        return False
    for i, arg in enumerate(schema.arguments):
        if arg.name not in _INDEX_ARGS:
            continue
        value = node.args[i] if i < len(node.args) else node.kwargs.get(arg.name)
        for v in value if isinstance(value, (list, tuple)) else [value]:
            val = fake_value(v) if isinstance(v, torch.fx.Node) else None
            if isinstance(val, torch.Tensor) and not val.dtype.is_floating_point and val.dtype != torch.bool:
                return False
    return True


def _usable(gm: torch.fx.GraphModule, target) -> bool:
    """Whether a traced decomposition holds only ATen ops other than target, none random."""
    import operator

    from .core import _draws_random

    for n in gm.graph.nodes:
        if n.op != "call_function" or n.target is operator.getitem:
            continue
        if not isinstance(n.target, torch._ops.OpOverload) or n.target.namespace != "aten":
            return False
        if n.target is target or _draws_random(n.target) or n.target._schema.is_mutable:
            return False
    return True


def _trace(node, name, decomposition) -> torch.fx.GraphModule:
    """The decomposition traced on fake tensors of the node's arguments' shapes; its
    placeholders are the node's tensor arguments in order (``_values``)."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.proxy_tensor import make_fx

    examples = []
    mode = FakeTensorMode()

    def slot(a_fx):
        if isinstance(a_fx, torch.fx.Node):
            val = fake_value(a_fx)
            with mode:
                examples.append(torch.empty(tuple(val.shape), dtype=val.dtype))
            return _Input(len(examples) - 1)
        if isinstance(a_fx, (list, tuple)):
            return type(a_fx)(slot(x) for x in a_fx)
        return a_fx

    op_args = [slot(a) for a in node.args]
    op_kwargs = {k: slot(v) for k, v in node.kwargs.items()}

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
        if any(n.op == "call_function" and isinstance(n.target, torch._ops.OpOverload) and n.target._schema.is_mutable
               for n in gm.graph.nodes):
            # a decomposition that fills a new tensor in place (circular padding's copy_
            # into slices): its graph functionalized, the writes become slice_scatter and copy
            gm = make_fx(torch.func.functionalize(gm), tracing_mode="fake")(*examples)
        return gm
    except Exception as e:  # the decomposition's own checks (torch's errors for bad arguments)
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        raise Unsupported(f"{name}: torch's decomposition of it failed", cause=first[:300]) from None


def _values(node, args, kwargs) -> list:
    """The kf values of the node's tensor arguments, in the order _trace made them inputs."""
    out = []

    def walk(a_fx, a_kf):
        if isinstance(a_fx, torch.fx.Node):
            out.append(a_kf)
        elif isinstance(a_fx, (list, tuple)):
            for x, y in zip(a_fx, a_kf):
                walk(x, y)

    for a, b in zip(node.args, args):
        walk(a, b)
    for k in node.kwargs:
        walk(node.kwargs[k], kwargs[k])
    return out


def _convert_traced(c, node, name, gm: torch.fx.GraphModule, values: list):
    """The kf value(s) of the traced decomposition, its inputs bound to values."""
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


class _Mark:
    """What the converter has built so far, so that a decomposition that fails part way
    can take back what it inserted: kf ops at the end of the current block, and
    torch-mlir's functions at the start of the module."""

    def __init__(self, c):
        self.c = c
        self.block = ir.InsertionPoint.current.block
        self.ops = len(self.block.operations)
        self.module_ops = len(c.module.body.operations)
        self.fallback_ops = dict(c.fallback_ops)

    def roll_back(self) -> None:
        ops = self.block.operations
        for i in range(len(ops) - 1, self.ops - 1, -1):
            ops[i].erase()
        body = self.c.module.body.operations
        for i in range(len(body) - self.module_ops - 1, -1, -1):
            body[i].erase()
        self.c.fallback_ops = self.fallback_ops


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
