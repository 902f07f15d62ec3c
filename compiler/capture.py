"""Capture: a Python function of torch tensors becomes a ``func.func`` of kf ops.

The light tracer (``trace.py``) -- or, for what it does not handle, torch.export
(non-strict) -- traces the function on data-less tensors of the call's signature into an
ATen graph; Python control flow (``if mask is not None``, ``for k in
range(top_k)``) runs at trace time, so the graph is specialized to the signature. Each
ATen node becomes kf ops through the table in ``aten_to_kf.py``, and every op's MLIR
location is the user's ``file:line`` that produced it. ATen ops with no kf op go through
torch's decomposition of them (``aten/decompositions.py``), else torch-mlir
(``torch_mlir_import.py``), or raise ``UnsupportedOpError`` at the user's line.
A function that writes to a tensor (``x.add_(1)``, ``y[0] = 5``, a batch norm in
training) is captured functionalized: the new value of each argument it writes is an
extra output of the kf function, which the call copies back (``mutation.py``).
"""

from __future__ import annotations

import inspect
import logging
import operator
import os
import re
import types
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch
from mlir import ir
from mlir.dialects import func

from kf.dialects import KfTypeError, TensorSpec, make_context, mlir_type

from . import aliasing, aten_to_kf
from .dtypes import kf_elem
from .errors import CaptureError, KfVerifyError, SourceLoc, UnsupportedOpError
from .mutation import Mutation
from .signature import Signature, bind, invoke, rebuild_args
from .torch_ops import AUTOCAST_KEYS

log = logging.getLogger(__name__)
_FRAME = re.compile(r'File "([^"]+)", line (\d+), in (\S+)')


@dataclass
class Captured:
    """The result of capturing one specialization."""

    module: ir.Module
    context: ir.Context
    name: str
    signature: Signature
    input_names: list[str]
    output_specs: list[TensorSpec]
    output_tree: Any  # how the flat results nest: ("tensor", i) | ("tuple"/"list", [...])
    graph: torch.fx.GraphModule | None = None
    source_locs: dict[str, SourceLoc] = field(default_factory=dict)
    fallbacks: dict[str, Callable] = field(default_factory=dict)  # torch-mlir callees -> ATen op
    tracer: str = "export"  # "trace": the light tracer's graph (trace.py); "export": torch.export's
    fallback_reason: str | None = None  # why the light tracer gave way to torch.export
    random_input: int | None = None  # the input that holds the random state (random_state.py), if any
    #: the arguments the function writes to: extra outputs copied back by the call (mutation.py)
    mutations: tuple[Mutation, ...] = ()
    #: the reached tensors (indices into the ``reached`` capture was given) that are the
    #: function's last inputs, in order
    reached: list[int] = field(default_factory=list)
    #: tensors made constants that the function neither made from data nor reached where
    #: the walk of what it reads looked (the light tracer's: trace.Trace.unsourced)
    unsourced: list[torch.Tensor] = field(default_factory=list)
    #: per flat output: ("input", i) / ("view", i) where eager returns user tensor i or a view of it, else None
    eager_aliases: list = field(default_factory=list)
    #: per flat output: the first earlier output that eager returns as the same tensor, or -1
    eager_repeats: list = field(default_factory=list)
    #: with run-time sizes (dynamic.py): per input and per output, each dim's size as text,
    #: a number or an expression over the inputs' symbols ("s0", "2*s0"); empty: static
    input_dims: list = field(default_factory=list)
    output_dims: list = field(default_factory=list)
    #: with run-time sizes: conditions on the symbols that the program holds for (a guard
    #: of torch's trace, ``Ne(s0 - 1, 1)``); a call whose sizes fail one compiles for them
    size_guards: tuple = ()
    #: per flat output, the device eager puts it on, where the trace says (a function of
    #: no tensors makes its results on the default device, whatever kf's target)
    output_devices: list = field(default_factory=list)

    @property
    def kf_ir(self) -> str:
        """The kf IR with the user's locations written beside each op."""
        return self.module.operation.get_asm(enable_debug_info=True, use_local_scope=True)

    def text(self, debug_info: bool = True) -> str:
        return self.module.operation.get_asm(enable_debug_info=debug_info)


class _Wrapper(torch.nn.Module):
    """Adapts a user function of structured arguments to export's flat tensor inputs."""

    def __init__(self, fn: Callable, sig: Signature):
        super().__init__()
        self.fn = fn
        self.sig = sig

    def forward(self, *tensors):
        return invoke(self.fn, rebuild_args(self.sig, list(tensors)))


def _user_code(fn: Callable) -> Callable:
    return inspect.unwrap(fn)


def _traceable(fn: Callable) -> Callable:
    """fn, arranged so that torch.export keeps its frames in node stack traces.

    Export keeps only frames of functions named ``forward`` and, since torch 2.12,
    registered anchors. Where the anchor API exists the user's function is registered;
    elsewhere (torch 2.11) kf traces a copy of it whose code is named ``forward``: same
    file, lines, globals, defaults and closure.
    """
    register = getattr(torch.fx.proxy, "_register_stack_trace_anchor", None)
    if register is not None:
        register(fn)
        return fn
    code = fn.__code__.replace(co_name="forward")
    copy = types.FunctionType(code, fn.__globals__, fn.__name__, fn.__defaults__, fn.__closure__)
    copy.__kwdefaults__ = fn.__kwdefaults__
    return copy


def _user_loc(node: torch.fx.Node, fn: Callable) -> SourceLoc | None:
    return _user_loc_in(node.meta.get("stack_trace") or "", fn)


def _user_loc_in(trace: str, fn: Callable) -> SourceLoc | None:
    """The user's line in a stack trace of export's format."""
    code = fn.__code__
    frames = _FRAME.findall(trace)
    # The innermost frame in the user's file, preferring the decorated function itself.
    best = None
    for file, line, name in frames:
        if file == code.co_filename:
            best = (file, int(line), name)
    if best is None:
        return None
    file, line, name = best
    import linecache

    text = linecache.getline(file, line)
    col = len(text) - len(text.lstrip()) + 1 if text else 1
    return SourceLoc(file, line, col, fn.__name__ if name == "forward" else name)


def _trace_inputs(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    # export turns these into fake tensors on their own device (so tensors the function
    # makes itself, torch.zeros(n) on the CPU, meet inputs on the device eager would see)
    # and never runs the function on the real data. A program does not depend on whether
    # the caller's tensors share memory (the signature does not say): one that shares an
    # earlier one's is traced as a tensor of its own (export's functionalization of a
    # write through aliased inputs fails; mutation.py refuses such calls of a function
    # that writes).
    out, seen = [], set()
    for t in tensors:
        t = t.detach()
        storage = t.untyped_storage().data_ptr() if t.numel() else 0
        if storage in seen:
            t = torch.empty_strided(t.shape, t.stride(), dtype=t.dtype, device=t.device)
        elif storage:
            seen.add(storage)
        out.append(t)
    return out


def export_graph(fn: Callable, sig: Signature, tensors: list[torch.Tensor]) -> torch.export.ExportedProgram:
    """The ATen graph of fn specialized to sig.

    It is traced outside any torch.autocast region of the caller: the graph has the
    function's own dtypes, and kf applies an autocast region's precision to its IR
    (kf-apply-precision), keeping the output dtypes."""
    user = _user_code(fn)
    traced = _traceable(user)
    try:
        with torch._C._ExcludeDispatchKeyGuard(AUTOCAST_KEYS):
            ep = torch.export.export(_Wrapper(traced, sig), tuple(_trace_inputs(tensors)), strict=False)
    except Exception as e:  # torch's own errors name the user's frame in their text
        loc = _loc_from_exception(e, user)
        from . import native_kernels

        call = native_kernels.refused(e)
        if call is not None:
            raise UnsupportedOpError(native_kernels.MESSAGE, _loc_from_exception(call, user) or loc) from None
        generator_op = _generator_refused(e)
        if generator_op is not None:
            raise _generator_error(generator_op, loc) from None
        if _data_dependent(e):
            raise CaptureError(f"{user.__name__} uses a tensor's value as a Python value (an if or while on a "
                               f"tensor, bool(), float(), int()), which kf cannot compile: it compiles the "
                               f"function once, for every value", loc,
                               cause="keep it a tensor: torch.where(cond, a, b) instead of an if on a "
                                     "tensor's value, x * x.sum() instead of x * float(x.sum())") from None
        value_op = _data_dependent_op(e)
        if value_op is not None:
            what, op = value_op
            raise CaptureError(f"{op}: the {what} of its result depends on the values of its inputs, not only on "
                               f"their shapes", loc,
                               cause="kf compiles a function once, for its arguments' shapes: keep it outside the "
                                     "kf function" + (" (torch.equal and torch.allclose give a Python bool; "
                                                      "(a == b).all() and torch.isclose(a, b).all() a tensor)"
                                                      if what == "value" else "")) from None
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise CaptureError(f"torch.export could not trace {user.__name__}", loc,
                           cause=f"{type(e).__name__}: {first}") from None
    _refuse_custom_objects(ep, user)
    writer = _first_write(ep.graph_module)
    if writer is not None:
        ep = _functionalize(ep, writer, user)
    return ep


#: Ops whose schemas say they write to no argument but which write to their running
#: statistics in training (F.batch_norm, torch.native_batch_norm): their graphs are
#: functionalized too, which turns them into ATen batch norms that return the new
#: statistics. (F.instance_norm stays one op through functionalization: aten_to_kf
#: refuses its running statistics.)
_HIDDEN_WRITERS = frozenset({"aten.batch_norm.default", "aten.native_batch_norm.default"})
#: The one writing op torch.tensor([...]) leaves in a graph, on its own fresh constant.
_HARMLESS_WRITES = frozenset({"aten.detach_.default"})


def _first_write(gm: torch.fx.GraphModule) -> torch.fx.Node | None:
    """The first node of export's graph that writes to a tensor, or None."""
    for node in gm.graph.nodes:
        if node.op == "call_function" and isinstance(node.target, torch._ops.OpOverload):
            name = aten_to_kf._target_name(node.target)
            if name in _HARMLESS_WRITES:
                continue
            if node.target._schema.is_mutable or name in _HIDDEN_WRITERS:
                return node
    return None


def _functionalize(ep, writer: torch.fx.Node, user: Callable):
    """export's graph with every write replaced by the value it writes (torch's
    functionalization, as torch.compile runs it): the new value of each written argument
    becomes an output, listed in the graph signature as a USER_INPUT_MUTATION."""
    try:
        with torch._C._ExcludeDispatchKeyGuard(AUTOCAST_KEYS):
            return ep.run_decompositions({})
    except Exception as e:
        first = str(e).strip().splitlines()[0] if str(e).strip() else type(e).__name__
        raise CaptureError(f"{user.__name__} writes to a tensor in a way kf cannot write back: kf writes back "
                           f"the values of its tensor arguments (not their shapes or strides, nor a module's "
                           f"buffers, closure or global tensors)",
                           _user_loc(writer, user), cause=f"{type(e).__name__}: {first[:200]}") from None


def _data_dependent(e: BaseException) -> bool:
    """Whether export failed on Python control flow over a tensor's value."""
    from torch.fx.experimental.symbolic_shapes import GuardOnDataDependentSymNode

    return isinstance(e, GuardOnDataDependentSymNode) or "data-dependent" in str(e)[:500]


def _data_dependent_op(e: BaseException) -> tuple[str, str] | None:
    """("value" or "shape", the op) where export failed on an op whose result is a Python
    value of its inputs' values (aten.equal, aten.allclose: a bool) or has a shape that
    depends on them (a dynamic-output-shape op such as aten.linalg_lstsq)."""
    from torch._subclasses.fake_tensor import DataDependentOutputException, DynamicOutputShapeException

    for kind, what in ((DataDependentOutputException, "value"), (DynamicOutputShapeException, "shape")):
        if isinstance(e, kind):
            func = e.args[0] if e.args else None
            return what, str(func) if func is not None else "an ATen op"
    return None


def _refuse_custom_objects(ep, fn: Callable) -> None:
    """An op that export gave an object input (a torch.Generator) is refused at its line."""
    from torch.export.graph_signature import InputKind

    for spec in ep.graph_signature.input_specs:
        if spec.kind != InputKind.CUSTOM_OBJ:
            continue
        holder = next((n for n in ep.graph_module.graph.nodes if n.op == "placeholder" and n.name == spec.arg.name),
                      None)
        user = next(iter(holder.users), None) if holder is not None else None
        op = aten_to_kf._target_name(user.target) if user is not None else "an op"
        loc = _user_loc(user, fn) if user is not None else None
        generator = isinstance(getattr(spec.arg, "class_fqn", ""), str) and "Generator" in spec.arg.class_fqn
        if generator or user is not None and "generator" in user.kwargs:
            raise _generator_error(op, loc)
        raise UnsupportedOpError(f"{op} takes a {getattr(spec.arg, 'class_fqn', 'Python object')} argument, "
                                 f"which kf does not support", loc)


def _generator_error(op: str, loc: SourceLoc | None) -> UnsupportedOpError:
    return UnsupportedOpError(f"{op} takes a generator= argument; kf draws random numbers from torch's "
                              f"default generator, so a generator= argument is not supported", loc,
                              cause="drop generator= and seed torch's default generator (torch.manual_seed) instead")


def _generator_refused(e: BaseException) -> str | None:
    """The op (its ATen name, or "an op") whose torch.Generator argument export refused
    while tracing, or None for any other failure. torch 2.13 exports a generator as a
    custom-object input (_refuse_custom_objects refuses it); torch 2.11's tracer raises
    NotImplementedError on it instead, from the proxy call of the op that took it."""
    if not isinstance(e, NotImplementedError) or "Generator" not in str(e):
        return None
    op = "an op"
    tb = e.__traceback__
    while tb is not None:
        func = tb.tb_frame.f_locals.get("func")
        if isinstance(func, torch._ops.OpOverload):
            op = aten_to_kf._target_name(func)
        tb = tb.tb_next
    return op


def _loc_from_exception(e: BaseException, fn: Callable) -> SourceLoc | None:
    tb = e.__traceback__
    found = None
    while tb is not None:
        code = tb.tb_frame.f_code
        if code.co_filename == fn.__code__.co_filename:
            # the copy of fn that _traceable names "forward" (torch 2.11) is fn to the user
            copy = code.co_name == "forward" and code.co_firstlineno == fn.__code__.co_firstlineno
            found = SourceLoc(code.co_filename, tb.tb_lineno, 1, fn.__code__.co_name if copy else code.co_name)
        tb = tb.tb_next
    return found


def capture(fn: Callable, *args, **kwargs) -> Captured:
    """Capture fn for the signature of this call; raises CompileError subclasses."""
    sig, tensors = bind(_user_code(fn), args, kwargs)
    return capture_signature(fn, sig, tensors)


def capture_signature(fn: Callable, sig: Signature, tensors: list[torch.Tensor], reached: Sequence[torch.Tensor] = (),
                      reached_names: Sequence[str] = ()) -> Captured:
    """Capture fn for a signature: with the light tracer (trace.py), which does not
    import torch._dynamo, and with torch.export wherever the light one meets anything it
    does not handle exactly, or the graph it makes fails to convert (export's path then
    reports the error, at the user's line, as it always has). ``KF_CAPTURE=export``
    skips the light tracer.

    ``reached``: the tensors fn reads besides its arguments (guards.Reads.tensors, named
    ``reached_names``); those it uses become its last inputs (``Captured.reached``), so
    that the program reads them at every call instead of keeping their values."""
    from . import native_kernels

    with native_kernels.refusing():
        return _capture_signature(fn, sig, tensors, reached, reached_names)


def _capture_signature(fn: Callable, sig: Signature, tensors: list[torch.Tensor], reached: Sequence[torch.Tensor],
                       reached_names: Sequence[str]) -> Captured:
    from . import native_kernels

    user = _user_code(fn)
    reason, written_at = "KF_CAPTURE=export", ""
    if os.environ.get("KF_CAPTURE", "") != "export":
        try:
            from .trace import trace

            traced = trace(user, sig, tensors, reached)
            cap = _convert(user, sig, tensors, traced.graph_module, traced.constants, None, "trace",
                           traced.reached, reached, reached_names)
            cap.unsourced = traced.unsourced
            cap.output_devices = traced.output_devices
            return cap
        except Exception as e:  # Fallback, or a graph the converter takes only from export
            call = native_kernels.refused(e)
            if call is not None:
                raise UnsupportedOpError(native_kernels.MESSAGE, _loc_from_exception(call, user)) from None
            reason = f"{type(e).__name__}: {_first_line(e)}"
            written_at = getattr(e, "stack_trace", "")
            log.debug("capture of %s falls back to torch.export: %s", user.__name__, reason)
    try:
        ep = export_graph(user, sig, tensors)
    except CaptureError as e:
        where = _user_loc_in(written_at, user) if written_at else None
        if e.loc is not None or where is None:
            raise
        # export failed after tracing (a write to a tensor's shape or strides, x.t_()):
        # the write the light tracer met is where it happened
        raise CaptureError(f"{e.message}: it writes to a tensor in place ({reason.split(': ', 1)[-1]})", where,
                           cause=e.cause) from None
    constants = _export_constants(ep)
    of_reached = _reached_constants(constants, reached)
    cap = _convert(user, sig, tensors, ep.graph_module, constants, ep.call_spec.out_spec, "export",
                   of_reached, reached, reached_names, _written_inputs(ep, user))
    cap.fallback_reason = reason
    cap.output_devices = _export_output_devices(ep)
    return cap


def _export_output_devices(ep) -> list[str]:
    """The device of each user output of an exported program (its fake values')."""
    from torch.export.graph_signature import OutputKind

    out_node = next(n for n in ep.graph_module.graph.nodes if n.op == "output")
    devices = []
    for spec, node in zip(ep.graph_signature.output_specs, out_node.args[0]):
        if spec.kind != OutputKind.USER_OUTPUT:
            continue
        val = node.meta.get("val") if isinstance(node, torch.fx.Node) else None
        devices.append(str(val.device) if isinstance(val, torch.Tensor) else "")
    return devices


def _written_inputs(ep, user: Callable) -> dict[int, int]:
    """Position in the graph's outputs -> index of the user input whose new value it is
    (the USER_INPUT_MUTATION outputs of a functionalized graph)."""
    from torch.export.graph_signature import InputKind, OutputKind

    inputs = [s.arg.name for s in ep.graph_signature.input_specs if s.kind == InputKind.USER_INPUT]
    out_node = next(n for n in ep.graph_module.graph.nodes if n.op == "output")
    written = {}
    for k, spec in enumerate(ep.graph_signature.output_specs):
        if spec.kind == OutputKind.USER_INPUT_MUTATION:
            written[k] = inputs.index(spec.target)
        elif spec.kind not in (OutputKind.USER_OUTPUT,):
            node = out_node.args[0][k]
            raise CaptureError(f"{user.__name__} writes to a tensor that is not one of its arguments "
                               f"({spec.kind.name.lower()} {spec.target}); kf writes back only to arguments",
                               _user_loc(node, user) if isinstance(node, torch.fx.Node) else None,
                               cause="pass the tensor as an argument")
    return written


def _reached_constants(constants: dict[str, torch.Tensor], reached: Sequence[torch.Tensor]) -> dict[str, int]:
    """Export's constants that are reached tensors (the tensor itself, or export's detached
    alias of it: the same storage, offset, shape, strides and dtype), taken out of
    ``constants``: placeholder name -> index into reached."""
    def where(t: torch.Tensor) -> tuple:
        return (t.device, t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), t.stride(), t.dtype)

    index = {}
    for j, t in enumerate(reached):
        if t.device.type != "meta":
            index.setdefault(where(t), j)
    out = {}
    for name, value in list(constants.items()):
        j = next((j for j, t in enumerate(reached) if t is value), None)
        if j is None and value.device.type != "meta":
            j = index.get(where(value))
        if j is not None:
            out[name] = j
            del constants[name]
    return out


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def _convert(user: Callable, sig: Signature, tensors: list[torch.Tensor], gm: torch.fx.GraphModule,
             constants: dict[str, torch.Tensor], out_spec: Any, tracer: str, of_reached: dict[str, int],
             reached: Sequence[torch.Tensor], reached_names: Sequence[str],
             written: dict[int, int] | None = None,
             locate: Callable[[torch.fx.Node], SourceLoc | None] | None = None) -> Captured:
    """The kf function of an ATen graph (export's, or the light tracer's whose output node
    keeps the result's nesting: out_spec None). Its inputs: the arguments' tensors, then
    the reached tensors of placeholders in ``of_reached`` (placeholder name -> index
    into reached), in the graph's order. ``written`` maps positions of the graph's
    outputs that are new values of user inputs to those inputs (a functionalized graph).
    ``locate``: the user's line of a node, where it is not in ``user``'s file (a graph
    that Dynamo captured from a whole model: compiler/backend)."""
    ctx = make_context()
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    used = [of_reached[n.name] for n in placeholders if n.name in of_reached]
    names = sig.tensor_names() + [reached_names[j] if j < len(reached_names) else f"reached_{j}" for j in used]
    tensors = list(tensors) + [reached[j] for j in used]
    with ctx, ir.Location.unknown():
        module = ir.Module.create()
        in_specs = [TensorSpec(tuple(t.shape), kf_elem(t.dtype)) for t in tensors]
        out_node = next(n for n in gm.graph.nodes if n.op == "output")
        with ir.InsertionPoint(module.body):
            # The result types are known only after conversion: build the body first in a
            # function with no results, then set the type.
            code = user.__code__
            def_loc = ir.Location.file(code.co_filename, code.co_firstlineno, 1)
            f = func.FuncOp(user.__name__, ir.FunctionType.get([mlir_type(s) for s in in_specs], []), loc=def_loc)
            f.attributes["kf.source"] = ir.StringAttr.get(f"{user.__code__.co_filename}:{user.__code__.co_firstlineno}")
            arg_attrs = [ir.DictAttr.get({"kf.name": ir.StringAttr.get(n)}) for n in names]
            f.arg_attrs = ir.ArrayAttr.get(arg_attrs)
            block = f.add_entry_block(arg_locs=[def_loc] * len(in_specs))
        conv = aten_to_kf.Converter(module, block, user)
        locs: dict[str, SourceLoc] = {}
        with ir.InsertionPoint(block):
            env = _bind_placeholders(placeholders, list(block.arguments), constants, conv, set(of_reached))
            for node in gm.graph.nodes:
                if node.op != "call_function":
                    continue
                sloc = locate(node) if locate is not None else _user_loc(node, user)
                if sloc is not None:
                    locs[node.name] = sloc
                mloc = ir.Location.file(sloc.file, sloc.line, sloc.col) if sloc else ir.Location.unknown()
                try:
                    with mloc:
                        env[node] = conv.convert(node, env)
                except aten_to_kf.Unsupported as e:
                    raise UnsupportedOpError(str(e), sloc, cause=e.cause) from None
                except KfTypeError as e:
                    raise KfVerifyError(f"{node.target} produced an ill-typed kf op: {e}", sloc) from None
            outs = out_node.args[0]
            if written:
                outs = type(outs)(a for k, a in enumerate(outs) if k not in written)
            flat, tree = _flatten_outputs(outs, env, user, out_spec, structured=out_spec is None,
                                          locs=locs)
            nodes = aliasing.output_nodes(outs)
            if len(nodes) != len(flat):
                nodes = [object() for _ in flat]  # unknown: no result aliases anything
            eager = [aliasing.eager_alias(n, env) for n in nodes]
            same = [next((k for k in range(j) if nodes[k] is n), -1) for j, n in enumerate(nodes)]
            mutations = _mutation_outputs(out_node.args[0], written or {}, env, flat, names, user)
            # the written arguments' new values, appended: new tensors, copied back by the call
            eager += [None] * (len(flat) - len(eager))
            same += [-1] * (len(flat) - len(same))
            with def_loc:
                func.ReturnOp(flat)
        random_input = None
        if conv.random_state is not None:  # the state random ops read: the last input
            from .random_state import STATE_NAME, STATE_SHAPE

            random_input = len(in_specs)
            in_specs.append(TensorSpec(STATE_SHAPE, "i64"))
            names = [*names, STATE_NAME]
            f.arg_attrs = ir.ArrayAttr.get([*arg_attrs, ir.DictAttr.get({"kf.name": ir.StringAttr.get(STATE_NAME)})])
        f.attributes["function_type"] = ir.TypeAttr.get(
            ir.FunctionType.get([mlir_type(s) for s in in_specs], [v.type for v in flat]))
        _verify_captured(module, user)
        from kf.dialects import spec_of

        out_specs = [spec_of(v.type) for v in flat]
    return Captured(module, ctx, user.__name__, sig, names, out_specs, tree, gm, locs, conv.fallback_ops, tracer,
                    random_input=random_input, mutations=mutations, reached=used,
                    eager_aliases=eager, eager_repeats=same)


def _mutation_outputs(outs, written: dict[int, int], env: dict, flat: list[ir.Value], names: list[str],
                      user: Callable) -> tuple[Mutation, ...]:
    """The new value of each written input as a flat output (appended to flat, or the
    result that already is that value), with the line that writes it."""
    found = []
    for k, i in sorted(written.items(), key=lambda kv: kv[1]):
        node = outs[k]
        v = env.get(node) if isinstance(node, torch.fx.Node) else None
        if not isinstance(v, ir.Value):
            raise CaptureError(f"{user.__name__} writes to its argument '{names[i]}' a value kf did not compute")
        j = next((j for j, f in enumerate(flat) if f == v), None)
        if j is None:
            flat.append(v)
            j = len(flat) - 1
        loc = _user_loc(node, user)
        if loc is None and node.target is operator.getitem:  # a result of a batch norm
            loc = _user_loc(node.args[0], user)
        found.append(Mutation(j, i, names[i], loc.file if loc else "", loc.line if loc else 0,
                              loc.function if loc else ""))
    return tuple(found)


def source_loc(loc: ir.Location) -> SourceLoc | None:
    """The user's source location an MLIR location names, if any."""
    m = re.search(r'loc\("([^"]+)":(\d+):(\d+)', str(loc))
    return SourceLoc(m.group(1), int(m.group(2)), int(m.group(3))) if m else None


def _verify_captured(module: ir.Module, fn: Callable) -> None:
    """kf-verify on the captured IR: an ill-typed op is reported at the user's line."""
    from kf.dialects import verify

    errors = verify(module.operation)
    if errors:
        loc, message = errors[0]
        raise KfVerifyError(f"{fn.__name__}: {message}", source_loc(loc),
                            cause=f"{len(errors)} ill-typed kf op(s); a bug in kf's ATen conversion")
    try:
        module.operation.verify()
    except ir.MLIRError as e:
        diag = e.error_diagnostics[0] if e.error_diagnostics else None
        raise KfVerifyError(f"{fn.__name__}: capture produced invalid IR: {diag.message if diag else e}",
                            source_loc(diag.location) if diag else None) from None


def _export_constants(ep) -> dict[str, torch.Tensor]:
    """Export's placeholders for tensors the function made itself (``torch.tensor([...])``,
    lifted by export as constants), by name, with their values."""
    from torch.export.graph_signature import InputKind

    constants = {}
    for spec in ep.graph_signature.input_specs:
        if spec.kind == InputKind.USER_INPUT:
            continue
        if spec.kind not in (InputKind.CONSTANT_TENSOR, InputKind.BUFFER, InputKind.PARAMETER):
            raise CaptureError(f"unexpected input kind {spec.kind} in the exported graph")
        value = ep.constants.get(spec.target)
        constants[spec.arg.name] = ep.state_dict[spec.target] if value is None else value
    return constants


def _bind_placeholders(placeholders, args, constants: dict[str, torch.Tensor], conv, reached: set[str]) -> dict:
    """Map the graph's placeholders to the function's arguments (the call's tensors, then
    the reached ones), and those of tensors the function made itself to kf.constant."""
    n_reached = sum(1 for n in placeholders if n.name in reached)
    env, user_args, reached_args = {}, iter(args[:len(args) - n_reached]), iter(args[len(args) - n_reached:])
    for node in placeholders:
        value = constants.get(node.name)
        if node.name in reached:
            env[node] = next(reached_args)
        elif value is None:
            env[node] = next(user_args)
        else:
            with ir.Location.unknown():
                env[node] = conv.constant_tensor(value.detach())
    return env


def _tree_of_spec(spec, counter: list[int], fn: Callable | None = None) -> Any:
    """kf's JSON-able result structure from export's pytree spec of the outputs: kinds
    "tensor", "tuple", "list", and "named:<module>:<name>" for a namedtuple or a
    torch.return_types result (torch.max(x, 1)), which the call returns as that type."""
    if spec.is_leaf():
        counter[0] += 1
        return ("tensor", counter[0] - 1)
    kind = {tuple: "tuple", list: "list"}.get(spec.type)
    named = _named_type(spec) if kind is None else None
    if named is not None:
        kind = _named_kind(named, fn)
    if kind is None:
        loc = SourceLoc(fn.__code__.co_filename, fn.__code__.co_firstlineno, 1, fn.__name__) if fn else None
        raise CaptureError(f"{fn.__name__ if fn else 'the function'} returns a "
                           f"{getattr(spec.type, '__name__', spec.type)}; kf functions return tensors, and tuples, "
                           f"lists and namedtuples of them", loc)
    children = spec.children() if hasattr(spec, "children") else spec.children_specs
    return (kind, [_tree_of_spec(c, counter, fn) for c in children])


def _named_type(spec) -> type | None:
    """The namedtuple or structseq (torch.return_types) type of a pytree node, or None."""
    import collections

    if spec.type is collections.namedtuple and isinstance(spec.context, type):
        return spec.context
    if isinstance(spec.type, type) and issubclass(spec.type, tuple) and hasattr(spec.type, "n_fields"):
        return spec.type
    return None


def _named_kind(cls: type, fn: Callable | None) -> str:
    """The tree kind of a namedtuple result type, which a later process must import (the
    cache keeps the tree)."""
    from .results import named_kind

    kind = named_kind(cls)
    if kind is None:
        loc = SourceLoc(fn.__code__.co_filename, fn.__code__.co_firstlineno, 1, fn.__name__) if fn else None
        raise CaptureError(f"{fn.__name__ if fn else 'the function'} returns a {cls.__qualname__}, a namedtuple "
                           f"type that cannot be imported by its name", loc,
                           cause="define the namedtuple at the top level of a module, or return a tuple")
    return kind


def _flatten_outputs(out: Any, env: dict, fn: Callable, out_spec=None,
                     structured: bool = False, locs: dict | None = None) -> tuple[list[ir.Value], Any]:
    """The flat result values, and how they nest (export flattens nested results; its
    out_spec keeps their structure; a structured output node keeps it itself)."""
    flat: list[ir.Value] = []

    def walk(x):
        if isinstance(x, torch.fx.Node):
            v = env.get(x)
            if not isinstance(v, ir.Value):
                op = aten_to_kf._target_name(x.target) if x.op == "call_function" else x.name
                raise CaptureError(f"{fn.__name__} returns the result of {op}, which is not a tensor",
                                   (locs or {}).get(x.name))
            flat.append(v)
            return ("tensor", len(flat) - 1)
        if isinstance(x, (tuple, list)):
            return ("tuple" if isinstance(x, tuple) else "list", [walk(y) for y in x])
        if x is None:  # the function only writes to its arguments
            return ("none", [])
        raise CaptureError(f"{fn.__name__} returns a {type(x).__name__}; kf functions return tensors")

    walked = walk(out)
    if structured:
        return flat, walked
    if not flat and isinstance(out, (tuple, list)) and len(out) == 1 and out[0] is None:
        return flat, ("none", [])  # export's one output, None: the function returns nothing
    if out_spec is not None:
        tree = _tree_of_spec(out_spec, [0], fn)
        if sum(1 for _ in _leaves(tree)) == len(flat):
            return flat, tree
    if isinstance(out, (tuple, list)) and len(out) == 1:
        # export wraps a single result in a tuple
        return flat, ("tensor", 0)
    return flat, ("tuple", [("tensor", i) for i in range(len(flat))])


def _leaves(tree):
    kind, payload = tree
    if kind == "tensor":
        yield payload
    else:
        for t in payload:
            yield from _leaves(t)
