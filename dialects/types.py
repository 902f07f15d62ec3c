"""Tensor types as kf's verifiers see them: a shape and an element type name. A dim is a
size, or ``DYN`` (MLIR's ``?``): a size known only at run time, which a program reads
from its arguments (``tensor<?x64xf32>``).

The verifiers and builders reason about ``TensorSpec`` rather than MLIR type objects
so that shape rules are plain Python, shared by the builders (which infer result types
while capture runs) and by ``kf-verify`` (which checks parsed IR). This module does
not import torch: ``kf-opt`` must stay torch-free.
"""

from __future__ import annotations

from dataclasses import dataclass

from mlir import ir

from .elements import ELEMENT_TYPES, FLOAT_TYPES, INT_TYPES  # noqa: F401 (names of this module too)


class KfTypeError(ValueError):
    """An op's operands, attributes or results break its typing rules."""


#: a dim whose size is known only at run time (``?`` in MLIR's tensor types)
DYN = -1


@dataclass(frozen=True)
class TensorSpec:
    """A ranked tensor type; a dim is a size or ``DYN``."""

    shape: tuple[int, ...]
    elem: str

    @property
    def rank(self) -> int:
        return len(self.shape)

    @property
    def is_float(self) -> bool:
        return self.elem in FLOAT_TYPES

    @property
    def is_static(self) -> bool:
        return DYN not in self.shape

    def with_shape(self, shape) -> "TensorSpec":
        return TensorSpec(tuple(int(d) for d in shape), self.elem)

    def with_elem(self, elem: str) -> "TensorSpec":
        return TensorSpec(self.shape, elem)

    def __str__(self) -> str:
        dims = "".join("?x" if d == DYN else f"{d}x" for d in self.shape)
        return f"tensor<{dims}{self.elem}>"


def spec_of(t: ir.Type) -> TensorSpec:
    """The TensorSpec of an MLIR type; raises KfTypeError for anything else."""
    if not isinstance(t, ir.RankedTensorType):
        raise KfTypeError(f"expected a ranked tensor, got {t}")
    rt = t
    elem = str(rt.element_type)
    if elem not in ELEMENT_TYPES:
        raise KfTypeError(f"element type {elem} is not one of {', '.join(ELEMENT_TYPES)}")
    return TensorSpec(tuple(DYN if rt.is_dynamic_dim(i) else d for i, d in enumerate(rt.shape)), elem)


def elem_or_none(v: ir.Value) -> str | None:
    """The kf element type of a value's tensor type, None for anything else."""
    try:
        return spec_of(v.type).elem
    except KfTypeError:
        return None


def mlir_type(spec: TensorSpec) -> ir.Type:
    """The MLIR ranked tensor type of a TensorSpec (needs a current context)."""
    dyn = ir.ShapedType.get_dynamic_size()
    return ir.RankedTensorType.get([dyn if d == DYN else d for d in spec.shape], ir.Type.parse(spec.elem))


def broadcast_shapes(*shapes: tuple[int, ...]) -> tuple[int, ...]:
    """NumPy/torch broadcasting of shapes; raises KfTypeError when they do not broadcast.
    A ``DYN`` dim is never 1 (a size 1 is specialized, see compiler/dynamic.py): it meets
    a 1 or another ``DYN`` (capture checked that both have one size), and where it meets a
    size, it is that size."""
    rank = max((len(s) for s in shapes), default=0)
    out = []
    for i in range(rank):
        dims = {s[len(s) - rank + i] for s in shapes if len(s) - rank + i >= 0}
        dims.discard(1)
        if len(dims) > 1:
            dims.discard(DYN)
        if len(dims) > 1:
            shown = " and ".join(str(list(s)) for s in shapes)
            raise KfTypeError(f"shapes {shown} do not broadcast")
        out.append(dims.pop() if dims else 1)
    return tuple(out)


def defining(v: ir.Value) -> ir.Operation | None:
    """The op that makes v, or None for a block argument."""
    owner = v.owner
    return None if isinstance(owner, ir.Block) else owner.operation


def transposes_last_two(op: ir.Operation | None) -> bool:
    """Whether op is a ``kf.transpose`` that swaps the last two dims (``swaps_last_two``):
    an operand matmuls read in place, fp8's K-major V, the transpose kernel's kind."""
    from .attrs import op_attrs

    return op is not None and op.name == "kf.transpose" and swaps_last_two(op_attrs(op)["perm"])


def swaps_last_two(perm) -> bool:
    """Whether a permutation keeps every dim but the last two, which it swaps (``x.mT``:
    what matmuls read in place and fp8 tensor cores need for K-major operands)."""
    perm = list(perm)
    r = len(perm)
    return r >= 2 and perm[:-2] == list(range(r - 2)) and perm[-2:] == [r - 1, r - 2]


def normalize_dim(dim: int, rank: int) -> int:
    """A dimension index in [0, rank), accepting negative indices as torch does."""
    r = max(rank, 1)
    if not -r <= dim < r:
        raise KfTypeError(f"dimension {dim} is out of range for rank {rank}")
    return dim % r
