"""Signatures: what a compiled specialization of a function depends on.

A call's arguments are bound to the function's parameters (defaults applied); each
parameter is a tensor (shape, dtype, device, contiguity), a list or tuple of tensors,
``None``, or a Python constant (``top_k=2``, ``eps=1e-5``) whose value is baked into the
kernel. Two calls with equal signatures run the same compiled code.

Constants are compared by type and bits, not by ``==``: ``2``, ``2.0`` and ``True`` are
three signatures (torch promotes ``x * 2`` and ``x * 2.0`` to different dtypes, and the
function may branch on ``is True``), ``0.0`` and ``-0.0`` two, and a NaN equals every
NaN of its bits (``==`` would make each new one a new signature).
"""

from __future__ import annotations

import inspect
import struct
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import torch

from .dtypes import kf_elem
from .errors import SignatureError

_CONST_TYPES = (bool, int, float, str, type(None))

#: a dim of a TensorSig whose size is known only at run time (compiler/dynamic.py)
DYN = -1
#: a DYN dim whose size is a multiple of 16 (a guard where the target's code depends on it)
DYN16 = -16
#: the sizes a run-time dim may take: [MIN_SIZE, inf) (0 and 1 are specialized)
MIN_SIZE = 2
#: the largest size a call's dim is generalized from: larger sizes compile for their own
#: value. A float sum over more than this many elements runs in stages on the cpu target
#: (passes/to_cpu.blocked_reductions, REDUCTION_BLOCK), which needs the extent: over a
#: run-time extent it would be one sequential chain (an f32 sum of ones(2**25) stops at
#: 2**24). Up to this size the staged and the sequential sum are the same program.
MAX_DYNAMIC_SIZE = 4096


def is_dynamic(size: int) -> bool:
    return size in (DYN, DYN16)


def generalize_shape(shape: Sequence[int], dims: Sequence[int], divisibility: int,
                     ones: Sequence[int] = (), largest: int = MAX_DYNAMIC_SIZE) -> tuple[int, ...]:
    """shape with each dim of ``dims`` whose size is in [MIN_SIZE, largest] made DYN
    (DYN16 for a multiple of ``divisibility`` where the target asks for it), and each dim
    of ``ones`` whose size is 1 (a size 1 the program was found to serve)."""
    out = list(shape)
    for d in dims:
        if 0 <= d < len(out) and (MIN_SIZE <= out[d] <= largest or (out[d] == 1 and d in ones)):
            out[d] = DYN16 if divisibility and out[d] % divisibility == 0 else DYN
    return tuple(out)


@dataclass(frozen=True)
class TensorSig:
    """A tensor argument. A dim of shape is a size, or -1 (-16) for a size known only at run
    time (a multiple of 16), see ``Signature.generalize``."""

    shape: tuple[int, ...]
    elem: str
    device: str  # torch device type: cpu, cuda, mps
    contiguous: bool

    @staticmethod
    def of(t: torch.Tensor) -> "TensorSig":
        return TensorSig(tuple(t.shape), kf_elem(t.dtype), t.device.type, t.is_contiguous())


def const_key(value: Any) -> Any:
    """A constant as a dispatch key: its type with its value, a float by its bits, a
    tuple or list element by element."""
    t = type(value)
    if isinstance(value, float):
        return t, struct.pack("=d", value)
    if isinstance(value, complex):
        return t, struct.pack("=dd", value.real, value.imag)
    if isinstance(value, (tuple, list)):
        return t, tuple(const_key(v) for v in value)
    return t, value


@dataclass(frozen=True)
class Param:
    """One bound parameter. kind is tensor, tensors (list/tuple), const, scalar or none.
    Equal parameters have equal keys: a constant's is ``const_key(value)``. A scalar is a
    Python float the program reads at run time (``lift_scalars``): its value is the
    TensorSig of the 0-dim tensor that carries it, so every float has the same key."""

    name: str
    kind: str
    value: Any = field(compare=False)  # TensorSig, tuple[TensorSig, ...], a constant, or None
    container: str = ""  # "list" or "tuple" for kind == tensors and for a list or tuple constant
    key: Any = field(init=False, repr=False)
    #: a scalar's float in the call that bound it (not part of the key)
    scalar: float | None = field(default=None, compare=False, repr=False)

    def __post_init__(self):
        object.__setattr__(self, "key", const_key(self.value) if self.kind == "const" else self.value)


@dataclass(frozen=True)
class Signature:
    params: tuple[Param, ...]

    def tensor_names(self) -> list[str]:
        """Names of the flattened tensor arguments, in order (``expert_weights.0`` ...)."""
        names = []
        for p in self.params:
            if p.kind in ("tensor", "scalar"):
                names.append(p.name)
            elif p.kind == "tensors":
                names.extend(f"{p.name}.{i}" for i in range(len(p.value)))
        return names

    def tensor_sigs(self) -> list[TensorSig]:
        out = []
        for p in self.params:
            if p.kind in ("tensor", "scalar"):
                out.append(p.value)
            elif p.kind == "tensors":
                out.extend(p.value)
        return out

    def devices(self) -> set[str]:
        return {s.device for s in self.tensor_sigs()}

    def generalize(self, dynamic: set[tuple[str, int]], divisibility: int = 0,
                   ones: frozenset[tuple[str, int]] = frozenset(), largest: int = MAX_DYNAMIC_SIZE) -> "Signature":
        """This signature with the dims in ``dynamic`` ((tensor name, dim), names as
        ``tensor_names``) sizes known only at run time, where the size is at least 2
        (generalize_shape: sizes 0 and 1 stay static); itself where none is, and for a
        call with an empty tensor. The dims of ``ones`` (of dynamic) are DYN at size 1 too:
        where the program of the generalized signature was found to serve it
        (dynamic.serves_size_one). Sizes past ``largest`` stay static."""
        if not dynamic or any(0 in s.shape for s in self.tensor_sigs()):
            return self  # a call with an empty tensor runs nothing: compiled for its sizes
        wanted: dict[str, list[int]] = {}
        for name, d in dynamic:
            wanted.setdefault(name, []).append(d)

        def general(name: str, s: TensorSig) -> TensorSig:
            dims = wanted.get(name)
            if not dims or not s.shape:
                return s
            one = [d for n, d in ones if n == name]
            return TensorSig(generalize_shape(s.shape, dims, divisibility, one, largest), s.elem, s.device,
                             s.contiguous)

        params = []
        for p in self.params:
            if p.kind == "tensor":
                p = Param(p.name, p.kind, general(p.name, p.value), p.container)
            elif p.kind == "tensors":
                p = Param(p.name, p.kind, tuple(general(f"{p.name}.{i}", s) for i, s in enumerate(p.value)),
                          p.container)
            params.append(p)
        out = Signature(tuple(params))
        return self if out == self else out

    def dynamic_dims(self) -> set[tuple[str, int]]:
        """(tensor name, dim) of each run-time size."""
        return {(n, d) for n, s in zip(self.tensor_names(), self.tensor_sigs()) for d, size in enumerate(s.shape)
                if size < 0}

    def sized(self, tensors: list) -> "Signature":
        """This signature with each run-time size the size of the call's tensor there."""
        sizes = iter([tuple(t.shape) for t in tensors])

        def one(s: TensorSig) -> TensorSig:
            shape = next(sizes)
            return TensorSig(tuple(shape[d] if x < 0 else x for d, x in enumerate(s.shape)), s.elem, s.device,
                             s.contiguous)

        params = []
        for p in self.params:
            if p.kind in ("tensor", "scalar"):
                p = Param(p.name, p.kind, one(p.value), p.container, scalar=p.scalar)
            elif p.kind == "tensors":
                p = Param(p.name, p.kind, tuple(one(s) for s in p.value), p.container)
            params.append(p)
        return Signature(tuple(params))

    def admits(self, call: "Signature", tensors: list, largest: int = MAX_DYNAMIC_SIZE) -> bool:
        """Whether this signature's program serves a call of signature ``call`` and these
        tensors: equal but for its run-time dims, where the call's sizes are ones that the
        dim takes (in [MIN_SIZE, largest], a multiple of 16 for DYN16)."""
        if len(self.params) != len(call.params) or len(call.tensor_sigs()) != len(tensors):
            return False
        for mine, theirs in zip(self.params, call.params):
            if (mine.name, mine.kind, mine.container) != (theirs.name, theirs.kind, theirs.container):
                return False
            if mine.kind not in ("tensor", "scalar", "tensors") and mine.key != theirs.key:
                return False
        ours, given = self.tensor_sigs(), call.tensor_sigs()
        if len(ours) != len(given):
            return False
        for s, c, t in zip(ours, given, tensors):
            if (s.elem, s.device, s.contiguous) != (c.elem, c.device, c.contiguous) or len(s.shape) != t.dim():
                return False
            for x, size in zip(s.shape, t.shape):
                if x >= 0 and x != size:
                    return False
                if x < 0 and not (MIN_SIZE <= size <= largest and (x != DYN16 or size % 16 == 0)):
                    return False
        return True

    @property
    def is_dynamic(self) -> bool:
        return any(d < 0 for s in self.tensor_sigs() for d in s.shape)

    def describe(self) -> str:
        parts = []
        for p in self.params:
            if p.kind == "tensor":
                strided = "" if p.value.contiguous else " strided"
                parts.append(f"{p.name}: {p.value.elem}{_dims(p.value.shape)}@{p.value.device}{strided}")
            elif p.kind == "tensors":
                parts.append(f"{p.name}: [{', '.join(f'{s.elem}{_dims(s.shape)}' for s in p.value)}]")
            elif p.kind == "scalar":
                parts.append(f"{p.name}: float")
            else:
                parts.append(f"{p.name}={p.value!r}")
        return "(" + ", ".join(parts) + ")"


def _dims(shape: tuple[int, ...]) -> str:
    """A shape as text: ``?`` for a run-time size, ``?16`` for one that is a multiple of 16."""
    return "[" + ", ".join("?" if d == -1 else "?16" if d == -16 else str(d) for d in shape) + "]"


def bind(fn: Callable, args: tuple, kwargs: dict) -> tuple[Signature, list[torch.Tensor]]:
    """The signature of a call of fn and its tensor arguments, flattened in order."""
    try:
        bound = inspect.signature(fn).bind(*args, **kwargs)
    except TypeError as e:
        raise SignatureError(f"{fn.__name__}(): {e}") from None
    bound.apply_defaults()
    params, tensors = [], []
    for name, value in bound.arguments.items():
        if isinstance(value, torch.Tensor):
            params.append(Param(name, "tensor", _tensor_sig(fn, name, value)))
            tensors.append(value)
        elif isinstance(value, (list, tuple)) and value and all(isinstance(v, torch.Tensor) for v in value):
            params.append(Param(name, "tensors", tuple(_tensor_sig(fn, f"{name}[{i}]", v) for i, v in enumerate(value)),
                                "list" if isinstance(value, list) else "tuple"))
            tensors.extend(value)
        elif value is None:
            params.append(Param(name, "none", None))
        elif isinstance(value, _CONST_TYPES) or (
                isinstance(value, (list, tuple)) and all(isinstance(v, _CONST_TYPES) for v in value)):
            container = "list" if isinstance(value, list) else "tuple" if isinstance(value, tuple) else ""
            params.append(Param(name, "const", tuple(value) if container == "list" else value, container))
        elif isinstance(value, torch.dtype):
            params.append(Param(name, "const", value))
        else:
            raise SignatureError(
                f"{fn.__name__}(): argument '{name}' is a {type(value).__name__}; kf functions take tensors, "
                f"lists of tensors, None and Python constants (bool, int, float, str)")
    return Signature(tuple(params)), tensors


def _tensor_sig(fn: Callable, name: str, t: torch.Tensor) -> TensorSig:
    if t.layout != torch.strided or t.is_nested:
        kind = "a nested" if t.is_nested else f"a {str(t.layout).removeprefix('torch.')}"
        raise SignatureError(f"{fn.__name__}(): argument '{name}' is {kind} tensor; kf functions take dense "
                             f"tensors (pass {name}.to_dense())")
    try:
        return TensorSig.of(t)
    except TypeError as e:
        raise SignatureError(f"{fn.__name__}(): argument '{name}': {e}") from None


def check_callable(fn: Callable) -> None:
    """Refuse what kf cannot capture as a function of named parameters: a builtin or C
    function (no Python signature) and a ``**kwargs`` parameter."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        params = None
    name = getattr(fn, "__name__", type(fn).__name__)
    if params is None or getattr(fn, "__code__", None) is None:
        module = getattr(fn, "__module__", None)
        qualified = f"{module}.{name}" if module else name
        raise SignatureError(f"kf compiles Python functions (def or lambda); {qualified} is a "
                             f"{type(fn).__name__}: wrap it, e.g. kf.jit(lambda x: {qualified}(x))")
    for p in params:
        if p.kind == p.VAR_KEYWORD:
            raise SignatureError(f"{name}(): kf functions take named parameters and *args, not **{p.name}: "
                                 f"name the arguments the function reads")


def split_call(fn: Callable, kwargs: dict[str, Any]) -> tuple[tuple, dict[str, Any]]:
    """(positional, keyword) arguments that call ``fn`` with its bound arguments by name
    (``rebuild_args``): a ``*args`` parameter's values and positional-only parameters go in
    position; for any other function, all by name."""
    code = getattr(fn, "__code__", None)
    if code is None or not (code.co_flags & inspect.CO_VARARGS or code.co_posonlyargcount):
        return (), kwargs
    args, rest = [], dict(kwargs)
    for name, p in inspect.signature(fn).parameters.items():
        if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and name in rest:
            args.append(rest.pop(name))
        elif p.kind == p.VAR_POSITIONAL:
            args.extend(rest.pop(name, ()))
            break
        else:
            break
    return tuple(args), rest


def invoke(fn: Callable, kwargs: dict[str, Any]) -> Any:
    """``fn`` called with its bound arguments by name (``split_call``)."""
    args, kw = split_call(fn, kwargs)
    return fn(*args, **kw)


def rebuild_args(sig: Signature, tensors: list) -> dict[str, Any]:
    """Keyword arguments for the function from the signature and its flattened tensors."""
    out, i = {}, 0
    for p in sig.params:
        if p.kind in ("tensor", "scalar"):  # a scalar: the 0-dim tensor that carries it
            out[p.name] = tensors[i]
            i += 1
        elif p.kind == "tensors":
            n = len(p.value)
            seq = tensors[i:i + n]
            out[p.name] = list(seq) if p.container == "list" else tuple(seq)
            i += n
        elif p.kind == "const" and p.container == "list":
            out[p.name] = list(p.value)  # the function sees the list it was given
        else:
            out[p.name] = p.value
    return out


def scalar_dtype(tensors: list) -> torch.dtype | None:
    """The dtype a runtime scalar takes among these tensors, or None where a float cannot
    be one without changing the results: the dtype of the floating tensors where they all
    have one, f32 or f64 (a Python float meets them at that precision in eager), the
    default dtype where none is floating; None for 16-bit or mixed floating tensors (eager
    computes with the float at a precision kf would not)."""
    floats = {t.dtype for t in tensors if t.is_floating_point()}
    if not floats:
        return torch.get_default_dtype()
    if len(floats) == 1 and floats <= {torch.float32, torch.float64}:
        return next(iter(floats))
    return None


def lift_scalars(sig: Signature, tensors: list, names: set[str], dtype: torch.dtype) -> tuple[Signature, list]:
    """The signature and tensors of a call with the float constants ``names`` made
    runtime scalars: each becomes a 0-dim tensor input of ``dtype`` (``scalar_dtype``) at
    its parameter's place, on the device of the call's tensors. One program then serves
    every value."""
    device = tensors[0].device if tensors else torch.device("cpu")
    params, out, i = [], [], 0
    for p in sig.params:
        if p.kind == "const" and type(p.value) is float and p.name in names:
            t = torch.tensor(p.value, dtype=dtype, device=device)
            params.append(Param(p.name, "scalar", TensorSig.of(t), "float", scalar=p.value))
            out.append(t)
            continue
        params.append(p)
        n = 1 if p.kind == "tensor" else len(p.value) if p.kind == "tensors" else 0
        out.extend(tensors[i:i + n])
        i += n
    return Signature(tuple(params)), out


def unlift_scalars(sig: Signature, tensors: list) -> tuple[Signature, list]:
    """The signature and tensors of the same call with its runtime scalars constants again."""
    params, out, i = [], [], 0
    for p in sig.params:
        n = 1 if p.kind in ("tensor", "scalar") else len(p.value) if p.kind == "tensors" else 0
        if p.kind == "scalar":
            params.append(Param(p.name, "const", p.scalar))
        else:
            params.append(p)
            out.extend(tensors[i:i + n])
        i += n
    return Signature(tuple(params)), out

