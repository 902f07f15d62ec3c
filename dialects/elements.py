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
    #: an unsigned integer (torch's uint8): zero-extended where it widens
    is_unsigned: bool = False

    @property
    def is_narrow_int(self) -> bool:
        """An integer narrower than i32 other than i1 (int8, uint8, int16): a storage
        type, computed in i32 and wrapped once when stored (kf-widen-integers)."""
        return not self.is_float and self.name != "i1" and self.nbytes < 4

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
    Element("i8", 1, "int8", False),
    Element("ui8", 1, "uint8", False, is_unsigned=True),
    Element("i16", 2, "int16", False),
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
#: the integers narrower than i32 but i1: stored as they are, computed in i32
NARROW_INTS: tuple[str, ...] = tuple(n for n, e in ELEMENTS.items() if e.is_narrow_int)
#: the unsigned integers
UNSIGNED: tuple[str, ...] = tuple(n for n, e in ELEMENTS.items() if e.is_unsigned)
#: an unsigned integer -> the signless integer its bits are held in below kf ops (MLIR's
#: arithmetic takes signless integers; the lowerings zero-extend what they load of it)
STORAGE_INTS: dict[str, str] = {n: f"i{e.nbytes * 8}" for n, e in ELEMENTS.items() if e.is_unsigned}


def wrap_int(value: int, elem: str) -> int:
    """An integer as an element of the integer type elem holds it: modulo 2**bits, in
    the type's range (torch's integer arithmetic wraps: 127 + 1 is -128 in int8, 255 + 1
    is 0 in uint8)."""
    bits = 1 if elem == "i1" else ELEMENTS[elem].nbytes * 8
    value = int(value) & ((1 << bits) - 1)
    if elem in UNSIGNED or elem == "i1":
        return value
    return value - (1 << bits) if value >> (bits - 1) else value


#: bytes per element
ELEM_BYTES: dict[str, int] = {n: e.nbytes for n, e in ELEMENTS.items()}
