"""CI's fixed sample of the OpInfo conformance suite (test/conformance/opinfo.py): about
one OpInfo in EVERY, one sample each, on cpu float32, cpu bfloat16, cpu int64 and vulkan
float32, and compiled (not run) for cuda float32 (``cuda-ptx``: PTX assembled by ptxas).

Each op is one test. It fails when its case is a MISMATCH, an INTERNAL error or a CRASH;
a clear kf error (KF_ERROR: an op kf does not support) and a SKIP pass. A case that
fails today for a defect whose fix is pending is an expected failure (strict: when the
fix lands the test fails until the entry below goes). The cases of one configuration run
together, in worker subprocesses (a crash costs only its case), when its first test runs.

The whole suite, with its summary by class and op: see test/conformance/README.md.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path

import pytest

from kf.runtime import vulkan

_PATH = Path(__file__).resolve().parents[2] / "conformance" / "opinfo.py"


def _load_runner():
    spec = importlib.util.spec_from_file_location("kf_opinfo_conformance", _PATH)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


runner = _load_runner()

#: about one op in EVERY is in the sample (runner.ci_ops)
EVERY = 5
CONFIGS = [("cpu", "float32"), ("cpu", "bfloat16"), ("cpu", "int64"), ("vulkan", "float32"), ("cuda-ptx", "float32")]
JOBS = int(os.environ.get("KF_CONFORMANCE_JOBS", "2"))

#: (target, dtype, op) -> why its case fails today, pending its own fix (a strict expected
#: failure; test/conformance/README.md lists such cases with their reproducers). None now.
EXPECTED_FAILURES: dict[tuple[str, str, str], str] = {}


def _params():
    params = []
    for target, dtype in CONFIGS:
        marks = []
        if target == "vulkan":
            marks.append(pytest.mark.skipif(not vulkan.is_available(), reason="no Vulkan device"))
        for op, variant in runner.ci_ops(target, dtype, EVERY):
            full = op + ("." + variant if variant else "")
            why = EXPECTED_FAILURES.get((target, dtype, full))
            case_marks = marks + ([pytest.mark.xfail(strict=True, reason=why)] if why else [])
            params.append(pytest.param(target, dtype, op, variant, id=f"{target}-{dtype}-{full}", marks=case_marks))
    return params


class _Results:
    """Each configuration's results, run on first use."""

    def __init__(self):
        self.by_config: dict[tuple[str, str], dict[str, runner.Result]] = {}

    def get(self, target: str, dtype: str) -> dict:
        key = (target, dtype)
        if key not in self.by_config:
            cases = [c for op, variant in runner.ci_ops(target, dtype, EVERY)
                     if (c := runner.ci_case(op, variant, target, dtype)) is not None]
            results = runner.run_cases(cases, runner.RunOptions(jobs=JOBS, batch=24, case_timeout=240))
            self.by_config[key] = {r.case.op_name: r for r in results}
        return self.by_config[key]


@pytest.fixture(scope="module")
def results():
    return _Results()


@pytest.mark.parametrize("target,dtype,op,variant", _params())
def test_opinfo_sample(results, target, dtype, op, variant):
    full = op + ("." + variant if variant else "")
    r = results.get(target, dtype).get(full)
    if r is None:
        pytest.skip(f"{full} has no sample inputs for {dtype}")
    assert r.cls not in runner.FAILURES, f"{r.case.name}: {r.cls}: {r.detail}\n  reproduce: {r.case.reproducer()}"


def test_classes_of_errors_and_results():
    """The runner's classification: kf's own refusals are KF_ERROR, its wrapped bugs and
    foreign exceptions INTERNAL; results differing in dtype, shape or values are named."""
    import kf
    import torch

    assert runner.classify_exception(kf.UnsupportedOpError("aten.foo has no kf op"))[0] == "KF_ERROR"
    assert runner.classify_exception(kf.CompileError("f: internal compiler error", cause="KeyError: 3"))[0] == "INTERNAL"
    assert runner.classify_exception(KeyError("x"))[0] == "INTERNAL"
    x = torch.arange(6.0).reshape(2, 3)
    assert runner.compare(x, x.clone(), None, 1e-6, 1e-6) == ""
    assert "dtype" in runner.compare(x.double(), x, None, 1e-6, 1e-6)
    assert "shape" in runner.compare(x.t(), x, None, 1e-6, 1e-6)
    assert "1 of 6 values" in runner.compare(x + torch.tensor([[0, 0, 1.0], [0, 0, 0]]), x, None, 1e-6, 1e-6)
    # a fused result closer to float64 than eager's passes although it differs from eager
    exact = torch.tensor([1 / 3], dtype=torch.float64)
    eager = torch.tensor([0.3359375], dtype=torch.bfloat16)
    fused = torch.tensor([1 / 3], dtype=torch.bfloat16)
    assert runner.compare(fused, eager, exact, 1e-6, 1e-6) == ""
    assert runner.compare(eager - 0.25, eager, exact, 1e-6, 1e-6) != ""


def test_sums_of_products_are_judged_by_their_terms():
    """A sum of products after cancellation (a small result of large terms) may be off by
    a few units of float32 times its terms' magnitudes when kf sums in another order than
    eager (nn.functional.conv_transpose3d#9: 2 units); a wrong term is still a mismatch."""
    import torch

    g = torch.Generator().manual_seed(0)
    x = torch.randn(4, 5, 5, 5, generator=g) * 9
    w = torch.randn(4, 8, 3, 3, 3, generator=g) * 9
    conv = torch.nn.functional.conv_transpose3d
    eager, exact = conv(x, w), conv(x.double(), w.double())
    magnitude = conv(x.double().abs(), w.double().abs())
    eps = torch.finfo(torch.float32).eps
    reordered = (exact + 3 * eps * magnitude * torch.sign(exact - eager.double())).float()
    assert runner.compare(reordered, eager, exact, 1.3e-6, 1e-5) != ""
    assert runner.compare(reordered, eager, exact, 1.3e-6, 1e-5, magnitude=magnitude) == ""
    w_wrong = w.clone()
    w_wrong[0, 0, 1, 1, 1] += 0.1  # one term wrong
    assert runner.compare(conv(x, w_wrong), eager, exact, 1.3e-6, 1e-5, magnitude=magnitude) != ""
