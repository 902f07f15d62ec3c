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
