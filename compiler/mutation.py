"""Writes to a function's tensor arguments (``x.add_(1)``, ``y[0] = 5``, a batch norm's
running statistics), done as torch.compile does them.

Capture functionalizes a function that writes to an argument (torch.export's
``run_decompositions``, capture.py): its program computes each written argument's new
value as one more output, and the call copies that output into the caller's tensor with
``copy_`` after the launch. A result that is the written argument itself (``return
x.add_(1)``) is the caller's tensor, as in eager.

Where no copy can give eager's result the call raises MutationError at the line that
writes, before anything runs:

- a call through kf's torch op (torch.compile, torch.export, autograd): the op's schema
  promises that it writes to none of its inputs, and autograd would differentiate the
  function as if it did not write;
- a written argument that shares memory with another argument (``f(x, x)``): eager
  sees the write through the other one too, a program reads the values it was given;
- a written argument with elements that share memory (an expanded view), which eager
  refuses to write into.
"""

from __future__ import annotations

import contextlib
import contextvars
from dataclasses import asdict, dataclass
from typing import Iterator

import torch

from .errors import MutationError, SourceLoc


@dataclass(frozen=True)
class Mutation:
    """One argument the function writes to."""

    output: int  # the program's flat output that holds the argument's new value
    input: int  # the flat tensor argument it is copied into
    name: str  # the argument's name
    file: str  # the user's line that writes it
    line: int
    function: str = ""

    def to_json(self) -> dict:
        return asdict(self)

    @staticmethod
    def from_json(d: dict) -> "Mutation":
        return Mutation(**d)

    @property
    def loc(self) -> SourceLoc | None:
        return SourceLoc(self.file, self.line, 1, self.function) if self.file else None


#: why writes to arguments are refused in this context (a call through kf's torch op), or None
_REFUSED: contextvars.ContextVar[str | None] = contextvars.ContextVar("kf_mutation_refused", default=None)


@contextlib.contextmanager
def refused(why: str) -> Iterator[None]:
    """Calls in this context raise MutationError if their function writes to an argument."""
    token = _REFUSED.set(why)
    try:
        yield
    finally:
        _REFUSED.reset(token)


def _extent(t: torch.Tensor) -> tuple[int, int, int] | None:
    """(storage, first byte, one past the last byte) that t's elements occupy."""
    if t.numel() == 0:
        return None
    size = t.element_size()
    start = t.storage_offset() * size
    last = sum((n - 1) * s for n, s in zip(t.shape, t.stride()))
    return t.untyped_storage().data_ptr(), start, start + (last + 1) * size


def check(mutations: tuple[Mutation, ...], function: str, tensors: list[torch.Tensor]) -> None:
    """Raise MutationError where the writes cannot be copied back to give eager's result."""
    first = mutations[0]
    why = _REFUSED.get()
    if why is not None:
        raise MutationError(f"{function} writes to its argument '{first.name}', which kf cannot do {why}",
                            first.loc, cause="write the new value as a result and assign it outside the kf function")
    for m in mutations:
        t = tensors[m.input]
        if torch._debug_has_internal_overlap(t) == 1:
            raise MutationError(f"{function} writes to its argument '{m.name}', whose elements share memory "
                                f"(an expanded tensor); torch refuses to write into it", m.loc,
                                cause="pass a tensor with memory of its own (x.clone() or x.contiguous())")
        span = _extent(t)
        if span is None:
            continue
        for j, other in enumerate(tensors):
            theirs = _extent(other) if j != m.input else None
            if theirs is not None and theirs[0] == span[0] and theirs[1] < span[2] and span[1] < theirs[2]:
                raise MutationError(f"{function} writes to its argument '{m.name}', which shares memory with "
                                    f"another tensor argument; eager would see the write through both", m.loc,
                                    cause="pass tensors that do not overlap (a .clone() of one of them)")


def copy_back(mutations: tuple[Mutation, ...], tensors: list[torch.Tensor], outs: list) -> list:
    """Copy each written argument's new value into the caller's tensor; the output that
    held it becomes the caller's tensor (a result that is the argument itself)."""
    outs = list(outs)
    # a new value that is (a view of) a written argument itself -- a program may return an
    # input as it is (``x.copy_(y); y.copy_(x0)`` swaps) -- is read before any copy writes
    written = {tensors[m.input].untyped_storage().data_ptr() for m in mutations if tensors[m.input].numel()}
    values = []
    for m in mutations:
        v = outs[m.output]
        values.append(v.clone() if v.numel() and v.untyped_storage().data_ptr() in written else v)
    for m, v in zip(mutations, values):
        t = tensors[m.input]
        t.copy_(v)
        outs[m.output] = t
    return outs
