"""The long tail of ATen: ops with no kf op and no usable decomposition
(``aten/decompositions.py``) are lowered by torch-mlir's FX importer.

This is the only module that imports torch_mlir. torch-mlir has its own MLIR build, so
its result crosses over as text (linalg-on-tensors), is parsed into kf's context as a
private function, and the kf function calls it. Later stages lower that function with
the rest. If torch-mlir cannot lower the op either, the caller gets an error naming
the op and the user's line.
"""

from __future__ import annotations

import contextlib
import os
import re
import sys
import tempfile
import threading
import warnings

import torch
from mlir import ir
from mlir.dialects import func

from .errors import Unsupported
from .passes.linalg.asserts import drop_value_asserts
from .passes.linalg.constants import inline_dense_resources
from .passes.linalg.integer_division import guard_integer_division, integer_floor_division
from .passes.linalg.padding import crop_negative_padding


_STDERR_LOCK = threading.Lock()

#: the integer dtypes narrower than int32 (not bool), which torch-mlir is handed as int32
_NARROW_INTS = (torch.int8, torch.uint8, torch.int16)


@contextlib.contextmanager
def _stderr_captured():
    """Collects what torch-mlir's own MLIR prints to the process's stderr (file descriptor
    2: its pass manager reports a failed legalization there, not in the exception) into
    the yielded list, as one text, so that it reaches the user in the kf error's cause
    instead of as an MLIR dump on the terminal."""
    out: list[str] = []
    with _STDERR_LOCK, tempfile.TemporaryFile() as tmp:
        sys.stderr.flush()
        saved = os.dup(2)
        os.dup2(tmp.fileno(), 2)
        try:
            yield out
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
            tmp.seek(0)
            out.append(tmp.read().decode(errors="replace"))


def _first_diagnostic(text: str) -> str:
    """The first ``error:`` line of MLIR's printed diagnostics, without its location."""
    for line in text.splitlines():
        if "error:" in line:
            return line.split("error:", 1)[1].strip()
    return ""


def _with_location(text: str, loc: ir.Location) -> str:
    """torch-mlir's text with every op located at the user's line that called the op."""
    parsed = ir.Module.parse(text)
    printed = parsed.operation.get_asm(enable_debug_info=True)
    return re.sub(r'loc\("-":\d+:\d+\)', str(loc).replace("\\", "\\\\"), printed)


class _OneOp(torch.nn.Module):
    def __init__(self, target, args, kwargs, slots):
        super().__init__()
        self.target, self.args_, self.kwargs_, self.slots = target, args, kwargs, slots

    def forward(self, *tensors):
        def fill(a):
            if isinstance(a, _Slot):
                return tensors[a.index]
            if isinstance(a, (list, tuple)):
                return type(a)(fill(x) for x in a)
            return a

        return self.target(*fill(self.args_), **{k: fill(v) for k, v in self.kwargs_.items()})


class _Slot:
    def __init__(self, index: int):
        self.index = index


def _example(val) -> torch.Tensor:
    if val.dtype.is_floating_point:
        return torch.randn(tuple(val.shape), dtype=val.dtype)
    if val.dtype == torch.bool:
        return torch.rand(tuple(val.shape)) > 0.5
    return torch.zeros(tuple(val.shape), dtype=val.dtype)


#: Names of ATen arguments that hold indices into another tensor.
_INDEX_ARGS = ("index", "indices", "target", "offsets", "idx")


def _tensor_args(node: torch.fx.Node):
    """(argument name, fake tensor) of each tensor the node takes, lists flattened."""
    schema = getattr(node.target, "_schema", None)
    for i, arg in enumerate(schema.arguments if schema is not None else ()):
        value = node.args[i] if i < len(node.args) else node.kwargs.get(arg.name)
        for v in value if isinstance(value, (list, tuple)) else [value]:
            val = v.meta.get("val") if isinstance(v, torch.fx.Node) else None
            if isinstance(val, torch.Tensor):
                yield arg.name, val


def _refuse_unsafe(node: torch.fx.Node, name: str) -> None:
    """Unsupported for what kf must not hand to torch-mlir: an op that indexes through a
    tensor of indices (its lowering reads where the index points, unchecked, or aborts
    the process in an assertion), and an op on a tensor with no elements (its shape
    arithmetic divides by zero and kills the process) unless all its tensors are empty
    (``_all_empty``)."""
    tensors = list(_tensor_args(node))
    for arg, val in tensors:
        if arg in _INDEX_ARGS and not val.dtype.is_floating_point and val.dtype != torch.bool:
            raise Unsupported(f"{name} has no kf op, and its indices ('{arg}') cannot be checked on "
                              f"torch-mlir's path", cause="kf runs an op that indexes only where every index "
                                                          "is bounds-checked; rewrite it with gather, "
                                                          "index_select, index_add or scatter_add")
    empty = [(arg, val) for arg, val in tensors if val.numel() == 0]
    if empty and len(empty) < len(tensors):
        arg, val = empty[0]
        raise Unsupported(f"{name} has no kf op, and torch-mlir cannot lower it on a tensor with no "
                          f"elements ('{arg}' has shape {list(val.shape)})")


#: ATen ops that read or write their first argument's storage by explicit strides
_STORAGE_VIEWS = ("aten.as_strided.default", "aten.as_strided_.default", "aten.as_strided_copy.default",
                  "aten.as_strided_scatter.default")


def _owns_storage(arg) -> bool:
    """Whether arg is a tensor the function computed itself (not an input, nor a view
    of something else): its storage holds exactly its elements, from offset 0."""
    if not isinstance(arg, torch.fx.Node) or arg.op != "call_function":
        return False
    schema = getattr(arg.target, "_schema", None)
    return schema is not None and not any(r.alias_info is not None for r in schema.returns)


def _refuse_storage_view(node: torch.fx.Node, name: str) -> None:
    """Unsupported for an as_strided whose result eager would read from memory kf's
    program does not hold. as_strided indexes its input's storage, not its elements:
    kf's program sees an input's elements in row-major order from its first one, so it
    agrees with eager only where the input is contiguous, the view stays within the
    input's own elements, and an explicit ``storage_offset`` (counted from the start of
    the storage, which a caller's view may not share) is 0 on a tensor the function
    made itself."""
    if name not in _STORAGE_VIEWS:
        return
    schema = node.target._schema
    bound = {a.name: (node.args[i] if i < len(node.args) else node.kwargs.get(a.name, a.default_value))
             for i, a in enumerate(schema.arguments)}
    x = bound["self"].meta.get("val") if isinstance(bound["self"], torch.fx.Node) else None
    if not isinstance(x, torch.Tensor):
        return
    size, stride, offset = list(bound["size"]), list(bound["stride"]), bound.get("storage_offset")
    if not x.is_contiguous():
        raise Unsupported(f"{name} on a tensor that is not contiguous (strides {list(x.stride())}): it indexes "
                          f"the tensor's memory, which kf does not keep", cause="call .contiguous() first")
    if offset is not None and not (offset == 0 and _owns_storage(bound["self"])):
        raise Unsupported(f"{name} with storage_offset={offset}: the offset counts from the start of its input's "
                          f"storage, which kf does not keep", cause="slice the input instead, or leave out "
                                                                    "storage_offset")
    if any(s == 0 for s in size):
        return
    last = sum((s - 1) * st for s, st in zip(size, stride))
    if min(stride, default=0) < 0 or last >= x.numel():
        raise Unsupported(f"{name} of size {size} and stride {stride} reads element {last} of a tensor of "
                          f"{x.numel()} elements: beyond the tensor, in memory kf does not keep")


def _all_empty(conv, node: torch.fx.Node, one_op, slots: list):
    """The results of an op whose every tensor argument has no elements, or None when
    it has some that do: such results depend on the shapes alone (a sum over nothing
    is 0, a product 1, padding pads with its value), so torch computes them here, once,
    and they become constants."""
    tensors = list(_tensor_args(node))
    if not tensors or any(val.numel() for _, val in tensors):
        return None
    result = one_op(*[torch.empty(tuple(v.shape), dtype=v.dtype) for v in slots])
    if isinstance(result, torch.Tensor):
        return _constant(conv, result)
    return tuple(_constant(conv, t) for t in result)


def _constant(conv, t: torch.Tensor):
    from kf.dialects import builders as kb

    from .dtypes import kf_elem

    flat = t.reshape(-1)
    if t.numel() and (bool((flat == flat[0]).all()) or bool(flat.isnan().all())):
        return kb.fill(tuple(t.shape), kf_elem(t.dtype), float(flat[0]))
    return conv.constant_tensor(t)


def _vector_norm_dims(node: torch.fx.Node, op_args: list, op_kwargs: dict) -> tuple[list, dict]:
    """linalg_vector_norm's arguments with its ``dim`` counted from the front. torch 2.11's
    shape rule (torch._refs.linalg.vector_norm, which export runs) compares negative dims
    with positive ones when every reduced dim has size 1, and so keeps them in the result's
    shape: ``vector_norm(x, dim=-1)`` of a 7x1 tensor is 7x1 there (eager: 7), which
    torch-mlir cannot lower. torch 2.13 counts them from the front itself."""
    ndim = node.args[0].meta["val"].dim()

    def front(dims):
        if isinstance(dims, int):
            return dims % ndim if ndim else dims
        if isinstance(dims, (list, tuple)):
            return type(dims)(d % ndim if ndim and isinstance(d, int) else d for d in dims)
        return dims

    if len(op_args) > 2:
        op_args = [*op_args[:2], front(op_args[2]), *op_args[3:]]
    if "dim" in op_kwargs:
        op_kwargs = {**op_kwargs, "dim": front(op_kwargs["dim"])}
    return op_args, op_kwargs


def available() -> bool:
    """Whether torch-mlir can be imported."""
    try:
        from torch_mlir import fx  # noqa: F401
    except ImportError:
        return False
    return True


def import_op(conv, node: torch.fx.Node, name: str, args: list, kwargs: dict):
    """Lower one ATen node through torch-mlir; returns the kf-side value(s)."""
    _refuse_unsafe(node, name)
    _refuse_storage_view(node, name)
    if name == "aten.as_strided.default" and node.args[0].meta["val"].dim() == 0:
        # a 0-dim tensor's one element at every index (the only view inside it, as
        # _refuse_storage_view made sure); torch-mlir's lowering of as_strided kills the
        # process on a 0-dim input
        from kf.dialects import builders as kb

        shape = tuple(node.meta["val"].shape)
        return kb.broadcast_to(kb.reshape(args[0], (1,) * len(shape)), shape) if shape else args[0]
    values: list[ir.Value] = []
    examples: list[torch.Tensor] = []
    fakes: list[torch.Tensor] = []

    def slot(a_fx, a_kf):
        if isinstance(a_fx, torch.fx.Node):
            val = a_fx.meta["val"]
            fakes.append(val)
            if isinstance(val, torch.Tensor) and val.dtype in _NARROW_INTS:
                # computed in int32 and wrapped where it returns, as kf-widen-integers
                # does for kf's own ops (torch computes on them as C does)
                from kf.dialects import builders as kb

                a_kf = kb.cast(a_kf, "i32")
                val = torch.zeros(tuple(val.shape), dtype=torch.int32)
            values.append(a_kf)
            examples.append(_example(val))
            return _Slot(len(values) - 1)
        if isinstance(a_fx, (list, tuple)):
            return type(a_fx)(slot(x, y) for x, y in zip(a_fx, a_kf))
        return a_fx

    op_args = [slot(a, b) for a, b in zip(node.args, args)]
    op_kwargs = {k: slot(node.kwargs[k], v) for k, v in kwargs.items()}
    if name == "aten.linalg_vector_norm.default":
        op_args, op_kwargs = _vector_norm_dims(node, op_args, op_kwargs)
    constant = _all_empty(conv, node, _OneOp(node.target, op_args, op_kwargs, None), fakes)
    if constant is not None:
        return constant
    try:
        from torch_mlir import fx as tm_fx
    except ImportError:
        raise Unsupported(f"{name} has no kf op", cause="torch-mlir, kf's fallback for other ATen ops, "
                                                         "is not installed: pip install 'kf[fallback]'") from None
    fname = f"kf_{name.replace('.', '_')}_{conv._fallbacks}"
    conv._fallbacks += 1
    one_op = _OneOp(node.target, op_args, op_kwargs, None)
    try:
        with warnings.catch_warnings(), _stderr_captured() as printed:
            warnings.simplefilter("ignore")
            imported = tm_fx.export_and_import(one_op, *examples,
                                               output_type="linalg-on-tensors", func_name=fname)
        text = str(imported)
    except Exception as e:
        first = (str(e).strip().splitlines() or [type(e).__name__])[0]
        diagnostic = _first_diagnostic("".join(printed))
        cause = f"torch-mlir: {first[:200]}" + (f" {diagnostic[:300]}" if diagnostic else "")
        raise Unsupported(f"{name} has no kf op and torch-mlir could not lower it", cause=cause) from None
    try:
        parsed = ir.Module.parse(_with_location(inline_dense_resources(text), ir.Location.current))
    except ir.MLIRError as e:
        diag = e.error_diagnostics[0].message if e.error_diagnostics else str(e).splitlines()[0]
        raise Unsupported(f"{name} has no kf op, and torch-mlir lowers it to ops kf cannot compile",
                          cause=f"torch-mlir's output: {diag.strip()}") from None
    for op in parsed.body.operations:
        drop_value_asserts(op.operation)
        crop_negative_padding(op.operation)
        integer_floor_division(op.operation)
        guard_integer_division(op.operation)
    callee = None
    anchor = ir.InsertionPoint.at_block_begin(conv.module.body)
    for op in list(parsed.body.operations):
        op = op.operation
        op.detach_from_parent()
        anchor.insert(op)
        if op.name == "func.func" and ir.StringAttr(op.attributes["sym_name"]).value == fname:
            callee = op
    if callee is None:
        raise Unsupported(f"{name}: torch-mlir produced no function {fname}")
    conv.fallback_ops[fname] = one_op  # what the interpreter runs for this call
    callee.attributes["sym_visibility"] = ir.StringAttr.get("private")
    callee.attributes["kf.aten"] = ir.StringAttr.get(name)
    ftype = ir.FunctionType(ir.TypeAttr(callee.attributes["function_type"]).value)
    call = func.CallOp(list(ftype.results), ir.FlatSymbolRefAttr.get(fname), values)
    results = list(call.results)
    outs = node.meta.get("val")
    outs = list(outs) if isinstance(outs, (list, tuple)) else [outs]
    if any(isinstance(t, torch.Tensor) and t.dtype in _NARROW_INTS for t in outs):
        from kf.dialects import builders as kb

        from .dtypes import kf_elem

        results = [kb.cast(r, kf_elem(t.dtype)) if isinstance(t, torch.Tensor) and t.dtype in _NARROW_INTS else r
                   for r, t in zip(results, outs)]
    if isinstance(node.meta.get("val"), (list, tuple)):  # a list of one tensor stays a list
        return tuple(results)
    return results[0] if len(results) == 1 else tuple(results)
