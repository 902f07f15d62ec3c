"""How the OpInfo suite judges kf's result against eager's (test/conformance/
opinfo_compare.py): within the tolerance, or no further from float64 than twice eager's
error; infinities where eager has them, unless eager overflowed where float64 is finite
and kf is right there."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import torch

_DIR = Path(__file__).resolve().parents[2] / "conformance"
if str(_DIR) not in sys.path:
    sys.path.insert(0, str(_DIR))
_spec = importlib.util.spec_from_file_location("opinfo_compare", _DIR / "opinfo_compare.py")
compare_module = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(compare_module)
compare = compare_module.compare


def _half(*values):
    return torch.tensor(values, dtype=torch.float16)


def test_equal_results_match():
    assert compare(_half(1.0, 2.0), _half(1.0, 2.0), None, 1e-3, 1e-5) == ""


def test_a_result_further_from_float64_than_eager_is_a_mismatch():
    ref = torch.tensor([4.0, 1.0], dtype=torch.float64)
    assert "beyond" in compare(_half(4.5, 1.0), _half(4.0, 1.0), ref, 1e-3, 1e-5)


def test_a_result_closer_to_float64_than_eager_matches():
    ref = torch.tensor([4.0029, 1.0], dtype=torch.float64)
    assert compare(_half(4.0, 1.0), _half(4.0117, 1.0), ref, 1e-3, 1e-5) == ""


def test_eager_overflowing_where_float64_is_finite_is_decided_by_float64():
    """soft_margin_loss in float16: eager's exp overflows to inf, float64 gives 10.396;
    kf's 10.398 is right."""
    ref = torch.tensor([10.395880061898442, 2.0], dtype=torch.float64)
    assert compare(_half(10.3984375, 2.0), _half(float("inf"), 2.0), ref, 1e-3, 1e-5) == ""


def test_infinities_that_float64_does_not_back_are_a_mismatch():
    ref = torch.tensor([10.4, 2.0], dtype=torch.float64)
    assert "infinities" in compare(_half(float("inf"), 2.0), _half(10.4, 2.0), ref, 1e-3, 1e-5)
    assert "infinities" in compare(_half(3.0, 2.0), _half(float("inf"), 2.0), ref, 1e-3, 1e-5)  # kf wrong too
    assert "infinities" in compare(_half(10.4, 2.0), _half(float("inf"), 2.0), None, 1e-3, 1e-5)  # no float64
