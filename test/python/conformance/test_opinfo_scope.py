"""The scope of the OpInfo conformance suite's coverage (test/conformance/opinfo_scope.py):
each reason is decided from the op and its sample, never from what kf does."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

_DIR = Path(__file__).resolve().parents[2] / "conformance"


def _load(name):
    if str(_DIR) not in sys.path:
        sys.path.insert(0, str(_DIR))
    spec = importlib.util.spec_from_file_location(name, _DIR / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


classify = _load("opinfo_classify")
cases = _load("opinfo_cases")
scope = _load("opinfo_scope")


@pytest.mark.parametrize("name, reason", [
    ("add#0", ""),
    ("nn.functional.layer_norm#0", ""),
    ("nn.functional.scaled_dot_product_attention#0", ""),  # seeds itself, but dropout_p is 0
    ("cfloat#0", "complex"),
    ("fft.fft#0", "complex"),
    ("to_sparse#0", "sparse"),
    ("normal#0", "random"),
    ("bernoulli#0", "random"),
    ("nonzero#0", "data-dependent"),
    ("masked_select#0", "data-dependent"),
    ("linalg.inv#0", "library"),
    ("fft.irfft#0", "library"),
])
def test_scope_of_a_case(name, reason, tmp_path, monkeypatch):
    monkeypatch.setenv("KF_CACHE_DIR", str(tmp_path))
    op, variant, index = cases.parse_case_name(name)
    assert classify.scope_case(cases.Case(op, variant, index, "cpu", "float32")) == reason


def test_coverage_counts_in_scope_cases_that_are_not_skipped():
    results = [{"cls": "PASS", "scope": ""}, {"cls": "KF_ERROR", "scope": ""}, {"cls": "SKIP", "scope": ""},
               {"cls": "KF_ERROR", "scope": "complex"}, {"cls": "PASS", "scope": "library"}]
    got = scope.coverage(results)
    assert (got["passed"], got["in_scope"], got["coverage"]) == (1, 2, 0.5)
    assert got["out_of_scope"]["complex"] == 1 and got["out_of_scope"]["library"] == 1


def test_the_fake_run_launches_no_jiterator_kernel(monkeypatch):
    """The data-dependence check runs the op on fake tensors: a torch.cuda.jiterator op
    would launch its CUDA C++ on their address 0 and break the worker's CUDA context for
    every later case (28 INTERNAL on an H100). The launch is refused there instead."""
    import torch

    name = "_cuda_jiterator_compile_and_launch_kernel"
    launched = []
    monkeypatch.setattr(torch._C, name, lambda *a, **k: launched.append(a), raising=False)

    class Sample:
        input, args, kwargs = torch.randn(3), (), {}

    assert scope._data_dependent(lambda x: getattr(torch._C, name)("code", "f", False, 0, (x,), {}), Sample) is False
    assert launched == []
