"""Every kf function as a ``torch.library`` custom op: ``torch.ops.kf.<name>``.

Why: torch.compile, torch.export and autograd see a kf call as one opaque op with a known
schema, a fake implementation and a backward, instead of tracing into kf's Python (which
calls ctypes, MLIR and the launchers and cannot be traced).

Each KfFunction registers one op when it is made (registration takes about a millisecond
and needs no torch._dynamo, so a function first called under torch.compile already has
its op). The schema is

    kf::<name>(Tensor[] tensors, str structure) -> Tensor[]

``tensors`` are the call's tensors, flattened in parameter order; ``structure`` is the
rest of the call signature written as text: ``T`` for a tensor, ``L2``/``U2`` for a list
or tuple of two tensors, ``N`` for None and ``=repr`` for a constant (``T|T|T|=1e-05``).
It is computed by plain Python that Dynamo traces without a graph break, and it is what
the signature's non-tensor part would be; shapes and dtypes travel with the tensors.

- The real implementation runs the compiled kf program (the ordinary dispatch of
  ``KfFunction``); outputs that alias an input are copied, as custom ops require.
- The fake implementation runs the user's own function on the fake tensors: it is the
  captured function itself, so its output shapes and dtypes are those of the capture,
  and it follows symbolic shapes under ``torch.compile(dynamic=True)``.
- The autograd formula (compiler/autograd.py) saves the inputs and calls the kf-compiled
  backward of the specialization.
"""

from __future__ import annotations

import ast
import inspect
import re
import threading
from typing import Any, Callable

import torch

from .errors import SignatureError
from .results import unflatten

_NAMES: set[str] = set()
_LOCK = threading.Lock()


def op_name_base(fn: Callable) -> str:
    """The function's name as an op name (identifier characters only)."""
    name = re.sub(r"\W", "_", getattr(fn, "__name__", "fn")) or "fn"
    return name if not name[0].isdigit() else f"f_{name}"


def _define(fn: Callable, impl: Callable):
    """``torch.library.custom_op`` under the function's name, or name_1, name_2, ... when
    that is taken (the seed's moe_layer_fused lives in two examples; every
    ``f.with_options(...)`` is a function of its own), in the order they are made."""
    base = op_name_base(fn)
    with _LOCK:
        i = 0
        while True:
            name = base if i == 0 else f"{base}_{i}"
            i += 1
            if name in _NAMES:
                continue
            try:
                op = torch.library.custom_op(f"kf::{name}", impl, mutates_args=(),
                                             schema="(Tensor[] tensors, str structure) -> Tensor[]")
            except RuntimeError as e:  # registered by another copy of this module
                if "already" not in str(e).lower() and "duplicate" not in str(e).lower():
                    raise
                _NAMES.add(name)
                continue
            _NAMES.add(name)
            return name, op


# ----------------------------------------------------------------------------- structure


def parameters(fn: Callable) -> tuple:
    """(name, default, kind) of each parameter, computed once so that binding a call
    needs no ``inspect`` (which Dynamo cannot trace)."""
    out = []
    for p in inspect.signature(fn).parameters.values():
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            return ()  # *args / **kwargs: bound with inspect, outside Dynamo
        out.append((p.name, p.default, p.kind == p.KEYWORD_ONLY))
    return tuple(out)


def flatten_call(kfn, args: tuple, kwargs: dict) -> tuple[list[torch.Tensor], str]:
    """(flat tensors, structure) of a call; plain Python that Dynamo traces."""
    params = kfn._params
    if not params:
        bound = inspect.signature(kfn.fn).bind(*args, **kwargs)
        bound.apply_defaults()
        values = list(bound.arguments.values())
    else:
        if len(args) > len(params):
            raise SignatureError(f"{kfn.fn.__name__}() takes {len(params)} arguments, got {len(args)}")
        values = list(args)
        for name, default, _ in params[len(args):]:
            if name in kwargs:
                values.append(kwargs[name])
            elif default is not inspect.Parameter.empty:
                values.append(default)
            else:
                raise SignatureError(f"{kfn.fn.__name__}() missing argument '{name}'")
        for name in kwargs:
            if not any(name == p[0] for p in params):
                raise SignatureError(f"{kfn.fn.__name__}() got an unexpected argument '{name}'")
    tensors, parts = [], []
    for v in values:
        if isinstance(v, torch.Tensor):
            parts.append("T")
            tensors.append(v)
        elif isinstance(v, (list, tuple)) and len(v) > 0 and isinstance(v[0], torch.Tensor):
            parts.append(("L" if isinstance(v, list) else "U") + str(len(v)))
            tensors.extend(v)
        elif v is None:
            parts.append("N")
        else:
            parts.append("=" + repr(v))
    return tensors, "|".join(parts)


def _parse_const(text: str) -> Any:
    if text.startswith("torch."):
        value = getattr(torch, text[len("torch."):], None)
        if isinstance(value, torch.dtype):
            return value
    return ast.literal_eval(text)


def _parse(structure: str) -> list[tuple[str, Any]]:
    """The structure's parts: ("T", None), ("L", n), ("U", n), ("N", None), ("=", value)."""
    out: list[tuple[str, Any]] = []
    pieces = structure.split("|") if structure else []
    i = 0
    while i < len(pieces):
        p = pieces[i]
        if p == "T" or p == "N":
            out.append((p, None))
        elif p[:1] in "LU" and p[1:].isdigit():
            out.append((p[0], int(p[1:])))
        elif p.startswith("="):
            # A constant's repr may itself hold "|" (a string): join pieces until it parses.
            text, j = p[1:], i
            while True:
                try:
                    out.append(("=", _parse_const(text)))
                    break
                except (ValueError, SyntaxError):
                    j += 1
                    if j >= len(pieces):
                        raise ValueError(f"kf: cannot read the call structure {structure!r}") from None
                    text += "|" + pieces[j]
            i = j
        else:
            raise ValueError(f"kf: cannot read the call structure {structure!r}")
        i += 1
    return out


def rebuild(kfn, structure: str, tensors: list) -> dict[str, Any]:
    """Keyword arguments of the function from a structure and its flat tensors."""
    names = [p[0] for p in kfn._params] if kfn._params else list(inspect.signature(kfn.fn).parameters)
    out, it = {}, iter(tensors)
    for name, (kind, value) in zip(names, _parse(structure)):
        if kind == "T":
            out[name] = next(it)
        elif kind in "LU":
            seq = [next(it) for _ in range(value)]
            out[name] = seq if kind == "L" else tuple(seq)
        elif kind == "N":
            out[name] = None
        else:
            out[name] = value
    return out


def flatten_results(result: Any) -> list[torch.Tensor]:
    flat: list[torch.Tensor] = []

    def walk(x):
        if isinstance(x, torch.Tensor):
            flat.append(x)
        elif isinstance(x, (tuple, list)):
            for y in x:
                walk(y)
        else:
            raise TypeError(f"kf functions return tensors, got a {type(x).__name__}")

    walk(result)
    return flat


def result_tree(result: Any, counter: list | None = None) -> Any:
    counter = counter if counter is not None else [0]
    if isinstance(result, torch.Tensor):
        counter[0] += 1
        return ("tensor", counter[0] - 1)
    return ("tuple" if isinstance(result, tuple) else "list", [result_tree(r, counter) for r in result])


# ----------------------------------------------------------------------------- the op


def register(kfn) -> Any:
    """Register ``torch.ops.kf.<name>`` for a KfFunction; returns the op."""
    kfn._trees = {}
    kfn._backwards = {}

    def real(tensors: list[torch.Tensor], structure: str) -> list[torch.Tensor]:
        result = kfn._kernel_call((), rebuild(kfn, structure, list(tensors)))
        kfn._trees[structure] = result_tree(result)
        return _fresh(flatten_results(result), tensors)

    def fake(tensors, structure):
        result = kfn.fn(**rebuild(kfn, structure, list(tensors)))
        kfn._trees[structure] = result_tree(result)
        # kf's programs return new row-major tensors
        return [o.new_empty(o.shape) for o in flatten_results(result)]

    name, op = _define(kfn.fn, real)
    kfn.op_name = f"kf::{name}"
    op.register_fake(fake)
    op.register_autograd(_backward(kfn), setup_context=_setup_context)
    return op


def _fresh(outs: list[torch.Tensor], inputs: list[torch.Tensor]) -> list[torch.Tensor]:
    """Outputs that alias an input or an earlier output, copied (a custom op's outputs
    are new tensors; a kf program may return an input reshaped, or one result twice)."""
    seen = {t.untyped_storage().data_ptr() for t in inputs if t.numel()}
    out = []
    for o in outs:
        ptr = o.untyped_storage().data_ptr() if o.numel() else None
        if ptr is not None and ptr in seen:
            o = o.clone()
            ptr = o.untyped_storage().data_ptr()
        if ptr is not None:
            seen.add(ptr)
        out.append(o)
    return out


def _setup_context(ctx, inputs, output):
    tensors, structure = inputs
    ctx.structure = structure
    ctx.outputs_meta = [(tuple(o.shape), o.dtype) for o in output]
    ctx.save_for_backward(*tensors)


def _backward(kfn):
    def backward(ctx, grads):
        from . import autograd

        tensors = list(ctx.saved_tensors)
        key = (ctx.structure, tuple((tuple(t.shape), t.dtype, t.device.type) for t in tensors))
        bwd = kfn._backwards.get(key)
        if bwd is None:
            bwd = kfn._backwards[key] = autograd.derive(kfn, ctx.structure, tensors, ctx.outputs_meta)
        tangents = []
        for g, (shape, dtype), f in zip(grads, ctx.outputs_meta, bwd.float_outputs):
            if f:
                tangents.append(torch.zeros(shape, dtype=dtype, device=tensors[0].device) if g is None
                                else g.contiguous())
        return bwd(tensors, tangents), None

    return backward


def call(kfn, args: tuple, kwargs: dict) -> Any:
    """Call a KfFunction through its op: what __call__ does under tracing or autograd."""
    tensors, structure = flatten_call(kfn, args, kwargs)
    flat = kfn._torch_op(tensors, structure)
    return unflatten(kfn._trees[structure], list(flat))


def needs_op(args: tuple, kwargs: dict) -> bool:
    """Whether a call must go through the op: under torch.compile, torch.export or any
    tracing mode, or when autograd records it. Otherwise the plain fast path runs."""
    if torch.compiler.is_compiling() or torch._C._len_torch_dispatch_stack():
        return True
    if not torch.is_grad_enabled():
        return False
    for a in args:
        if isinstance(a, torch.Tensor):
            if a.requires_grad:
                return True
        elif isinstance(a, (list, tuple)):
            if any(isinstance(t, torch.Tensor) and t.requires_grad for t in a):
                return True
    for a in kwargs.values():
        if isinstance(a, torch.Tensor) and a.requires_grad:
            return True
        if isinstance(a, (list, tuple)) and any(isinstance(t, torch.Tensor) and t.requires_grad for t in a):
            return True
    return False
