"""The tensors of the light tracer (trace.py) and what it knows of their layout.

A ``Traced`` tensor has a shape, dtype, strides (or none known) and the device the real
tensor would be on, and no data; ``Fallback`` is how every part of the tracer says that
torch.export must trace the function instead.
"""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.fx

Shape = tuple[int, ...]


class Fallback(Exception):
    """The light tracer cannot stand in for torch.export on this function (the message says
    why); ``stack_trace``: where the function wrote to a tensor, in export's format, when
    that is why (export's path reports its errors there)."""

    def __init__(self, reason: str, stack_trace: str = ""):
        super().__init__(reason)
        self.stack_trace = stack_trace


def need(cond: bool, what: str) -> None:
    """Raise Fallback(what) unless cond holds."""
    if not cond:
        raise Fallback(what)


class Traced(torch.Tensor):
    """A tensor of the trace: shape, dtype, strides (``_strides``, None where unknown),
    the device the real tensor would be on -- so that ``x.device``, ``x.is_cuda`` and
    ``torch.zeros(n, device=x.device)`` read as in eager -- and the FX node that made it."""

    _strides: "tuple[int, ...] | None"
    _node: torch.fx.Node
    _rec: Any  # the trace.Recorder that made it: its fail() ends the trace

    @staticmethod
    def __new__(cls, val: torch.Tensor, known: bool, device: torch.device, node: torch.fx.Node,
                rec: Any) -> "Traced":
        t = torch.Tensor._make_wrapper_subclass(cls, val.shape, strides=val.stride(), dtype=val.dtype,
                                                device=device, requires_grad=False)
        t._strides, t._node, t._rec = (tuple(val.stride()) if known else None), node, rec
        return t

    def __repr__(self) -> str:  # a print in the function must not run ops on no data
        return f"TracedTensor({list(self.shape)}, dtype={self.dtype}, device={self.device})"

    @classmethod
    def __torch_function__(cls, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in _STORAGE_QUERIES or (func in _STRIDE_QUERIES and args[0]._strides is None):
            args[0]._rec.fail(f"Tensor.{func.__name__}() of a tensor whose layout the light tracer does not know")
        elif func is torch.Tensor.contiguous and args[0]._strides is None:
            # C++'s contiguous() would ask the wrapper's placeholder strides
            return torch.ops.aten.contiguous.default(*args, **kwargs)
        with torch._C.DisableTorchFunctionSubclass():
            return func(*args, **kwargs)

    @classmethod
    def __torch_dispatch__(cls, func, types, args=(), kwargs=None):
        raise Fallback(f"{func} ran on a traced tensor outside the trace")


_STRIDE_QUERIES = frozenset({torch.Tensor.stride, torch.Tensor.is_contiguous})
_STORAGE_QUERIES = frozenset({torch.Tensor.storage_offset, torch.Tensor.data_ptr, torch.Tensor.untyped_storage})


def contiguous_strides(shape: Shape) -> tuple[int, ...]:
    """The strides of a contiguous tensor of this shape (torch's, size-0 dims as 1)."""
    strides, acc = [], 1
    for s in reversed(shape):
        strides.append(acc)
        acc *= max(s, 1)
    return tuple(reversed(strides))


def is_contiguous(shape: Shape, strides: "tuple[int, ...] | None") -> bool:
    """Tensor.is_contiguous() of a tensor with these strides (None: unknown, so False)."""
    if strides is None:
        return False
    if math.prod(shape) == 0:
        return True
    acc = 1
    for s, st in zip(reversed(shape), reversed(strides)):
        if s != 1:
            if st != acc:
                return False
            acc *= s
    return True

