"""The one table of element types (dialects/elements.py): it agrees with torch and with
MLIR, every other view of element types is read from it, and reading it loads no MLIR."""

import subprocess
import sys

import pytest
import torch

from kf.dialects import elements
from kf.dialects.elements import ELEMENTS, FP8, LOW_PRECISION


@pytest.mark.parametrize("name", list(ELEMENTS))
def test_each_element_matches_torch_and_mlir(name):
    """The torch dtype of each row exists and has the row's size and kind; MLIR parses
    the name."""
    from mlir import ir

    e = ELEMENTS[name]
    dtype = getattr(torch, e.torch_name)
    assert torch.empty(0, dtype=dtype).element_size() == e.nbytes
    assert dtype.is_floating_point == e.is_float
    with ir.Context():
        assert str(ir.Type.parse(name)) == name


def test_derived_sets():
    assert FP8 == ("f8E4M3FN", "f8E5M2")
    assert LOW_PRECISION == ("f16", "bf16", "f8E4M3FN", "f8E5M2")
    assert elements.FLOAT_TYPES + elements.INT_TYPES == elements.ELEMENT_TYPES


def test_every_view_reads_the_table():
    """The verifier's types, capture's dtype mapping, the runtime's buffer sizes and the
    passes' sets are the table's, not copies that could drift."""
    from kf import dtypes
    from kf.dialects import types
    from kf.passes import apply_precision
    from kf.passes.linalg import build as linalg_build
    from kf.passes.strategies import emit, kernel_ir
    from kf.runtime.abi import ELEM_INFO

    assert types.ELEMENT_TYPES is elements.ELEMENT_TYPES
    assert {n: (t, b) for n, (t, b) in ELEM_INFO.items()} == {n: (e.torch_name, e.nbytes) for n, e in ELEMENTS.items()}
    assert set(dtypes.KF_TO_TORCH) == set(ELEMENTS)
    assert apply_precision.LOW_PRECISION is LOW_PRECISION and linalg_build.LOW_PRECISION is LOW_PRECISION
    assert emit.FP8 is FP8 and kernel_ir.FP8_ELEMS is FP8 and emit.ELEM_BYTES is elements.ELEM_BYTES


def test_reading_the_table_loads_no_mlir():
    """The runtime sizes buffers from the table on a cache hit, which imports no MLIR."""
    code = ("import sys; import kf.dialects.elements, kf.runtime.abi, kf.dialects as kd; kd.ELEMENT_TYPES; "
            "print('mlir' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_narrow_integers():
    """int8, uint8 and int16: computed in i32 (kf-widen-integers), uint8 held in a
    signless i8 below kf ops, and wrap_int keeps the low bits as each type reads them."""
    assert elements.NARROW_INTS == ("i8", "ui8", "i16")
    assert elements.UNSIGNED == ("ui8",) and elements.STORAGE_INTS == {"ui8": "i8"}
    wrap = elements.wrap_int
    assert [wrap(v, "i8") for v in (127, 128, -129, 255, 256)] == [127, -128, 127, -1, 0]
    assert [wrap(v, "ui8") for v in (255, 256, -1, -5, 300)] == [255, 0, 255, 251, 44]
    assert [wrap(v, "i16") for v in (32767, 32768, -32769)] == [32767, -32768, 32767]
    assert wrap(2 ** 31, "i32") == -2 ** 31 and wrap(2 ** 63, "i64") == -2 ** 63
    for name in elements.NARROW_INTS:
        info = torch.iinfo(getattr(torch, ELEMENTS[name].torch_name))
        assert wrap(info.max + 1, name) == info.min
