"""The light tracer: a kf function's ATen graph without torch.export.

torch.export imports torch._dynamo, sympy and much else on its first call: seconds of a
cold compile whose own work takes a tenth of that. Meta tensors are no way around it:
torch's meta kernels are Python (torch._refs) that import both on first use. This
tracer runs the function once on data-less tensors (trace_tensor.py) that carry a
shape, dtype, strides and the caller's device, under a TorchDispatchMode that records
each ATen call as an FX node. Each op's result shape comes from a shape rule
(trace_shapes.py), and its dtype from running the op itself on tiny CPU tensors of the
same ranks and dtypes (type promotion is torch's own, and so are dtype errors). Autograd's dispatch keys are excluded while it
runs, so the mode meets ops as export's training IR keeps them (``aten.matmul``,
``aten.softmax.int``, ``aten.linear``), not their decompositions (``bmm``, ``_softmax``).

The graph has export's shape: a placeholder per input tensor (``tensors_i``), one per
tensor the function reaches (a global, a closure cell, a module's parameter: the
``reached`` tensors capture is given, guards.py, read as inputs at every call:
``reached_j``), one per tensor the function made from data (``torch.tensor([...])``,
a constant),
``call_function`` nodes with ``meta["val"]`` (a meta tensor) and ``meta["stack_trace"]``
(the frames export would keep), and an output node that keeps the result's nesting.

It covers exactly what it is sure of. Anything else raises ``Fallback`` and capture runs
torch.export as it always has: an op with no shape rule (every other op kf lowers, and
all it sends to torch-mlir, which traces with export anyway), a mutation, a
data-dependent op (``.item()``, ``nonzero``, ``bool(t)``), tensors on two devices, a
view or a stride query of a tensor whose strides it does not know, a result that is not
tensors in tuples and lists, and any exception -- a user's shape error is then reported
by export's path, at the user's line, exactly as before.
"""

from __future__ import annotations

import dataclasses
import operator
import sys
import warnings
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch
import torch.fx
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves, tree_map

from . import aten_to_kf
from .aten.reductions import bind_schema
from .signature import Signature, invoke, rebuild_args
from .torch_ops import AUTOCAST_KEYS
from .trace_shapes import ARANGE, RULES, Out
from .trace_tensor import Fallback, Traced, contiguous_strides, is_contiguous, need

_META = torch.device("meta")
_CPU = torch.device("cpu")
#: the one mutating op allowed: ``torch.tensor(...)`` calls it on the fresh constant, and
#: it changes no value (kf's converter treats it as the identity, on export's path too)
_HARMLESS_MUTATIONS = frozenset({"aten.detach_.default"})


@dataclass
class Trace:
    graph_module: torch.fx.GraphModule
    #: placeholder name -> a tensor the function made from data, which becomes kf.constant
    constants: dict[str, torch.Tensor]
    #: placeholder name -> which of the reached tensors it is (an input after the arguments)
    reached: dict[str, int]
    #: constants that are neither made by the function nor reached tensors (see _Recorder.constant)
    unsourced: list[torch.Tensor]
    #: per flat output, the device eager puts it on (``torch.arange(n)`` with no tensor
    #: argument: the default device)
    output_devices: list[str] = dataclasses.field(default_factory=list)


# ----------------------------------------------------------------------------- the recorder


def _is_device(arg: torch._C.Argument) -> bool:
    return str(arg.type) in ("Device", "Optional[Device]")


class Recorder(TorchDispatchMode):
    """Records each ATen call as an FX node with its result's shape, dtype and strides."""

    def __init__(self, fn: Callable, reached: "Sequence[torch.Tensor]" = ()):
        super().__init__()
        self.graph = torch.fx.Graph()
        self.constants: dict[str, torch.Tensor] = {}
        self.reached: dict[str, int] = {}
        self._reached_index = {id(t): j for j, t in enumerate(reached)}
        self.unsourced: list[torch.Tensor] = []
        self._constant_of: dict[int, Traced] = {}  # id of a real tensor -> its constant
        self._last_constant: torch.fx.Node | None = None
        self.failed: str | None = None  # set once, so a user's try/except cannot hide it
        self.failed_at = ""  # the stack trace of a write that made it fail
        code = fn.__code__
        # export keeps the frames of functions named forward and of registered anchors
        # (torch >= 2.12 registers the user's function, see capture._traceable)
        register = getattr(torch.fx.proxy, "_register_stack_trace_anchor", None)
        if register is not None:
            register(fn)
        self._anchors = getattr(torch.fx.proxy, "_STACK_TRACE_ANCHORS", set()) | {(code.co_filename, code.co_name)}

    @classmethod
    def _should_skip_dynamo(cls) -> bool:
        # else TorchDispatchMode wraps __torch_dispatch__ in torch._disable_dynamo, whose
        # first call imports torch._dynamo: the cost this tracer exists to avoid. Capture
        # never runs inside a Dynamo trace (kf's op runs it outside, see torch_ops._opaque).
        return False

    def fail(self, reason: str, stack_trace: str = "") -> None:
        if self.failed is None:
            self.failed, self.failed_at = reason, stack_trace
        raise Fallback(reason, stack_trace)

    def wrap(self, val: torch.Tensor, known: bool, device: torch.device, node: torch.fx.Node) -> Traced:
        return Traced(val, known, device, node, self)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if self.failed:
            raise Fallback(self.failed, self.failed_at)
        if not isinstance(func, torch._ops.OpOverload):
            self.fail(f"{func} is not an ATen op")
        if func is torch.ops.aten.lift_fresh.default and not isinstance(args[0], Traced):
            return self.constant(args[0], fresh=True)  # torch.tensor([...]): the data, made into a constant
        name = aten_to_kf._target_name(func)
        if func._schema.is_mutable and name not in _HARMLESS_MUTATIONS:
            self.fail(f"{name} mutates a tensor", self._stack_trace())
        rule = RULES.get(name)
        if rule is None and name not in ARANGE:
            self.fail(f"{name}: the light tracer has no shape rule for it")
        args, kwargs = tree_map(self._as_traced, (tuple(args), dict(kwargs)))
        tensors = [a for a in tree_leaves((args, kwargs)) if isinstance(a, Traced)]
        device = self._result_device(func, name, args, kwargs, tensors)
        try:
            outs = self._outs(func, name, rule, args, kwargs)
        except Exception as e:  # the user's own error, most likely: export's path reports it
            self.fail(f"{name}: {type(e).__name__}: {e}")
        contiguous = all(is_contiguous(tuple(t.shape), t._strides) for t in tensors)
        vals, known = [], []
        for o in outs:
            strides = (contiguous_strides(o.shape) if contiguous else None) if o.strides == "auto" else o.strides
            vals.append(torch.empty_strided(o.shape, strides or contiguous_strides(o.shape), dtype=o.dtype, device=_META))
            known.append(strides is not None)
        returns = func._schema.returns
        node_args, node_kwargs = tree_map(lambda a: a._node if isinstance(a, Traced) else a, (args, kwargs))
        single = len(returns) == 1 and str(returns[0].type) == "Tensor"
        node = self._node(func, node_args, node_kwargs, vals[0] if single else vals, self._stack_trace())
        if single:
            return self.wrap(vals[0], known[0], device, node)
        trace = node.meta["stack_trace"]
        items = [self.wrap(v, k, device, self._node(operator.getitem, (node, i), {}, v, trace))
                 for i, (v, k) in enumerate(zip(vals, known))]
        return tuple(items) if len(returns) > 1 else items

    def _outs(self, func, name: str, rule, args: tuple, kwargs: dict) -> list[Out]:
        """The results' shapes, dtypes and strides."""
        if rule is None:  # arange: its values become a constant anyway, so make them
            real = func(*args, **{**kwargs, "device": _CPU})
            return [Out(tuple(real.shape), real.dtype, contiguous_strides(tuple(real.shape)))]
        outs = rule(bind_schema(func, args, kwargs))
        outs = [outs] if isinstance(outs, Out) else list(outs)
        n = len(func._schema.returns)
        if n > 1 and len(outs) == 1:
            outs = outs * n  # max.dim, min.dim: values and indices of one shape
        if any(o.dtype is None for o in outs):
            dtypes = [t.dtype for t in tree_leaves(_probe(func, args, kwargs)) if isinstance(t, torch.Tensor)]
            need(len(dtypes) == len(outs), f"{name}: {len(dtypes)} results on CPU, {len(outs)} here")
            outs = [Out(o.shape, o.dtype or d, o.strides) for o, d in zip(outs, dtypes)]
        return outs

    def _node(self, target, args, kwargs, val, stack_trace: str) -> torch.fx.Node:
        packet = getattr(target, "overloadpacket", None)  # export's node names: mul, mul_1, ...
        node = self.graph.create_node("call_function", target, args, kwargs, name=packet and packet.__name__)
        node.meta["val"] = val
        node.meta["stack_trace"] = stack_trace
        return node

    def _as_traced(self, a: Any) -> Any:
        """Tensors of the trace as they are; a real tensor (closure, Python data) as a constant."""
        if isinstance(a, torch.Tensor) and not isinstance(a, Traced):
            return self.constant(a)
        return a

    def constant(self, t: torch.Tensor, fresh: bool = False) -> Traced:
        """A placeholder for a tensor with data, before the inputs, as export lifts them;
        for a tensor the function reaches, an input after the arguments. ``fresh``: one the
        function made from Python data; any other that is not a reached tensor came from
        somewhere the walk of what the function reads did not see (``unsourced``)."""
        known = self._constant_of.get(id(t))
        if known is not None:
            return known
        j = self._reached_index.get(id(t))
        if j is not None:
            return self._reached_input(t, j)
        if t.device.type == "meta" or type(t) is not torch.Tensor:
            self.fail("a tensor without data of its own reached the trace")
        if not fresh:
            self.unsourced.append(t)
        name = f"c_lifted_tensor_{len(self.constants)}"
        if self._last_constant is not None:
            where = self.graph.inserting_after(self._last_constant)
        else:
            where = self.graph.inserting_before(next(iter(self.graph.nodes), None))
        with where:
            node = self.graph.placeholder(name)
        self._last_constant = node
        node.meta["val"] = val = torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=_META)
        self.constants[name] = t.detach()
        traced = self._constant_of[id(t)] = self.wrap(val, True, t.device, node)
        return traced

    def _reached_input(self, t: torch.Tensor, j: int) -> Traced:
        """A placeholder after the arguments' (and the reached tensors' met before) for
        reached tensor j, which the program reads at every call."""
        after = [n for n in self.graph.nodes if n.op == "placeholder" and n.name not in self.constants]
        where = self.graph.inserting_after(after[-1]) if after else self.graph.inserting_before(
            next(iter(self.graph.nodes), None))
        with where:
            node = self.graph.placeholder(f"reached_{j}")
        node.meta["val"] = val = torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=_META)
        self.reached[node.name] = j
        traced = self._constant_of[id(t)] = self.wrap(val, True, t.device, node)
        return traced

    def _result_device(self, func, name: str, args: tuple, kwargs: dict, tensors: list[Traced]) -> torch.device:
        """The device eager would put the result on: the one the op is asked for, else
        its tensors' (a CPU scalar tensor goes with any); two devices fall back."""
        for i, arg in enumerate(func._schema.arguments):
            if _is_device(arg):
                value = kwargs.get(arg.name) if arg.kwarg_only or i >= len(args) else args[i]
                if value is not None:
                    return torch.device(value)
        devices = {t.device for t in tensors if not (t.device.type == "cpu" and t.dim() == 0)}
        if len(devices) > 1:
            self.fail(f"{name} meets tensors on {sorted(map(str, devices))}")
        if devices:
            return devices.pop()
        return tensors[0].device if tensors else torch.get_default_device()

    def _stack_trace(self) -> str:
        """The frames export would keep, outermost first, in the traceback format
        ``capture._user_loc`` reads."""
        lines = []
        frame = sys._getframe(2)
        while frame is not None:
            code = frame.f_code
            if code.co_name == "forward" or (code.co_filename, code.co_name) in self._anchors:
                lines.append(f'  File "{code.co_filename}", line {frame.f_lineno}, in {code.co_name}')
            frame = frame.f_back
        return "\n".join(reversed(lines))


_PROBE_SIZES = frozenset({"size", "normalized_shape"})


def _probe(func, args: tuple, kwargs: dict) -> Any:
    """The op run on tiny CPU tensors of the operands' ranks and dtypes (ones; zeros for
    integers, which index safely): its results' dtypes are the op's."""
    def small(a):
        if isinstance(a, Traced):
            shape = [min(s, 2) for s in a.shape]
            return (torch.ones if a.dtype.is_floating_point else torch.zeros)(shape, dtype=a.dtype)
        return a

    args, kwargs = tree_map(small, (list(args), dict(kwargs)))
    for i, arg in enumerate(func._schema.arguments):
        if _is_device(arg) or arg.name in _PROBE_SIZES:
            positional = not arg.kwarg_only and i < len(args)
            value = args[i] if positional else kwargs.get(arg.name)
            if _is_device(arg):
                value = _CPU
            elif value is not None:
                value = [min(s, 2) for s in value]
            if positional:
                args[i] = value
            elif _is_device(arg) or arg.name in kwargs:
                kwargs[arg.name] = value
    with warnings.catch_warnings():  # var() of one element warns; the dtype is all it is for
        warnings.simplefilter("ignore")
        return func(*args, **kwargs)


def _output_devices(x: Any) -> list[str]:
    """The device of each tensor of the function's result, in _output's order."""
    if isinstance(x, Traced):
        return [str(x.device)]
    return [d for y in x for d in _output_devices(y)] if type(x) in (tuple, list) else []


def _output(x: Any) -> Any:
    """The function's result with nodes for tensors, nested as it was."""
    if isinstance(x, Traced):
        return x._node
    if x is None:  # the function only writes to its arguments
        return None
    if type(x) in (tuple, list) and x:
        return type(x)(_output(y) for y in x)
    raise Fallback(f"the function returns a {type(x).__name__}")


def trace(fn: Callable, sig: Signature, tensors: list[torch.Tensor], reached: Sequence[torch.Tensor] = ()) -> Trace:
    """The ATen graph of fn specialized to sig; raises Fallback where export must trace it.
    ``reached``: tensors fn reads besides its arguments (guards.Reads.tensors), which
    become inputs where it uses them.

    Like capture.export_graph, it traces outside any torch.autocast region of the caller,
    and below autograd (no_grad's semantics: nothing records a backward)."""
    rec = Recorder(fn, reached)
    inputs = []
    for i, t in enumerate(tensors):
        node = rec.graph.placeholder(f"tensors_{i}")
        node.meta["val"] = val = torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=_META)
        inputs.append(rec.wrap(val, True, t.device, node))
    try:
        with torch._C._ExcludeDispatchKeyGuard(AUTOCAST_KEYS), torch._C._AutoDispatchBelowAutograd(), rec:
            result = invoke(fn, rebuild_args(sig, inputs))
    except Fallback:
        raise
    except Exception as e:
        raise Fallback(rec.failed or f"the function raised {type(e).__name__}: {e}", rec.failed_at) from None
    if rec.failed:
        raise Fallback(rec.failed, rec.failed_at)
    rec.graph.output(_output(result))
    return Trace(torch.fx.GraphModule(torch.nn.Module(), rec.graph), rec.constants, rec.reached, rec.unsourced,
                 _output_devices(result))
