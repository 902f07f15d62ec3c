"""The CPU target (compiler/targets/cpu.py): its stage table, and a function compiled
through it that matches torch."""

import pytest
import torch

import kf
from kf import targets
from kf.errors import TargetError
from kf.options import Options


def test_attributes_and_stages():
    t = targets.get("cpu")
    assert t is targets.CPU and not t.is_gpu and not t.uses_spirv and t.torch_device == "cpu"
    assert list(t.stages()) == ["capture", "precision", "linalg", "llvm", "so", "package"]
    assert t.device_key(Options(target="cpu")) == " 0"


def test_unknown_target():
    with pytest.raises(TargetError, match="unknown target auto"):
        targets.get("auto")


@pytest.mark.parametrize("shape", [(1, 1), (13, 257), (0, 7)])
def test_compiles_and_runs(shape):
    def f(x, w, b):
        return torch.nn.functional.layer_norm(x, (x.shape[-1],), w, b, 1e-5)

    x, w, b = torch.randn(shape), torch.randn(shape[-1]), torch.randn(shape[-1])
    fn = kf.jit(f, target="cpu")
    torch.testing.assert_close(fn(x, w, b), f(x, w, b), atol=1e-5, rtol=1e-5)
    assert list(kf.inspect(fn, x, w, b).stages) == ["kf", "linalg", "llvm"]
