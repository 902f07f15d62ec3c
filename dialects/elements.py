"""The one table of element types a kf tensor may hold.

Every part of kf that asks about an element type -- the verifiers, capture's torch
dtype mapping, the precision policy, the strategies, the back ends and the runtime's
buffer sizes -- reads it from here, so a new element type is one row. Names are MLIR's
spellings (``bf16``, ``f8E4M3FN``), which are also the names in ``ProgramABI`` and
``kf.plan``.

Plain data: this module imports neither MLIR nor torch, so the runtime can size and
type buffers from it on a cache hit (kf's package ``kf.dialects`` loads MLIR only when
a name that needs it is used).
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Element:
    """One element type: its MLIR name, its size and torch's dtype for it."""

    name: str
    nbytes: int
    #: the attribute of ``torch`` that is this dtype (``torch.float8_e4m3fn``)
    torch_name: str
    is_float: bool
    #: an 8-bit float: a storage type of fp8 tensor cores, decoded through its byte elsewhere
    is_fp8: bool = False

    @property
    def is_low_precision(self) -> bool:
        """A float narrower than f32: computed in f32 and rounded once when stored."""
        return self.is_float and self.nbytes < 4


#: Every element type, floats first, in the order error messages list them.
ELEMENTS: dict[str, Element] = {e.name: e for e in (
    Element("f64", 8, "float64", True),
    Element("f32", 4, "float32", True),
    Element("f16", 2, "float16", True),
    Element("bf16", 2, "bfloat16", True),
    Element("f8E4M3FN", 1, "float8_e4m3fn", True, is_fp8=True),
    Element("f8E5M2", 1, "float8_e5m2", True, is_fp8=True),
    Element("i1", 1, "bool", False),
    Element("i32", 4, "int32", False),
    Element("i64", 8, "int64", False),
)}

ELEMENT_TYPES: tuple[str, ...] = tuple(ELEMENTS)
FLOAT_TYPES: tuple[str, ...] = tuple(n for n, e in ELEMENTS.items() if e.is_float)
INT_TYPES: tuple[str, ...] = tuple(n for n, e in ELEMENTS.items() if not e.is_float)
#: the 8-bit floats (E4M3FN: finite, saturating at 448; E5M2: with infinities)
FP8: tuple[str, ...] = tuple(n for n, e in ELEMENTS.items() if e.is_fp8)
#: the floats kf computes in f32 (f16, bf16 and the fp8 kinds)
LOW_PRECISION: tuple[str, ...] = tuple(n for n, e in ELEMENTS.items() if e.is_low_precision)
#: bytes per element
ELEM_BYTES: dict[str, int] = {n: e.nbytes for n, e in ELEMENTS.items()}
