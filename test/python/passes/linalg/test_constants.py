"""torch-mlir's resource literals written as dense ones (passes/linalg/constants.py): the
same values for every element type (bool as packed bits), and a torch-mlir function with
a tensor literal (as_strided's gather indices) running on vulkan as on cpu."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from mlir import ir

import kf
from kf.passes.linalg.constants import inline_dense_resources, resource_blobs
from kf.runtime import vulkan

TARGETS = ["cpu", pytest.param("vulkan", marks=pytest.mark.skipif(not vulkan.is_available(),
                                                                   reason="no Vulkan device"))]


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("KF_CACHE_DIR", str(tmp_path))


def _module(values: dict[str, tuple[np.ndarray, str]]) -> str:
    """A module of one constant a literal (name -> (values, tensor type)), in torch-mlir's form."""
    body = "\n".join(f"  %c{i} = arith.constant dense_resource<{name}> : {t}" for i, (name, (_, t)) in
                     enumerate(values.items()))
    blobs = ",\n".join(f'      {name}: "0x08000000{a.tobytes().hex().upper()}"' for name, (a, _) in values.items())
    return f"func.func @f() {{\n{body}\n  return\n}}\n{{-#\n  dialect_resources: {{\n    builtin: {{\n{blobs}\n    }}\n  }}\n#-}}\n"


def test_resource_literals_become_dense_literals_of_the_same_values():
    gen = np.random.default_rng(0)
    values = {
        "torch_tensor_2_3_torch.int64": (gen.integers(-2**62, 2**62, (2, 3)), "tensor<2x3xi64>"),
        "torch_tensor_257_torch.float32": (gen.standard_normal(257).astype(np.float32), "tensor<257xf32>"),
        "torch_tensor_3_5_torch.bool": (gen.integers(0, 2, (3, 5)).astype(np.uint8), "tensor<3x5xi1>"),
        "torch_tensor_7_torch.int32": (gen.integers(-100, 100, 7).astype(np.int32), "tensor<7xi32>"),
        "torch_tensor_1_torch.float64": (np.array([-1.5]), "tensor<1xf64>"),
    }
    text = _module(values)
    assert set(resource_blobs(text)) == set(values)
    out = inline_dense_resources(text)
    assert "dense_resource<" not in out.split("{-#")[0]
    with ir.Context() as ctx, ir.Location.unknown():
        ctx.load_all_available_dialects()
        m = ir.Module.parse(out)
        consts = [op for op in m.body.operations[0].regions[0].blocks[0].operations if op.name == "arith.constant"]
        for c, (a, _) in zip(consts, values.values()):
            got = np.array(ir.DenseElementsAttr(c.attributes["value"]))
            want = a.astype(bool) if got.dtype == bool else a
            assert got.shape == want.shape and np.array_equal(got, want)


def test_text_without_resources_is_unchanged():
    text = "func.func @f() {\n  %c = arith.constant dense<1> : tensor<2xi64>\n  return\n}\n"
    assert inline_dense_resources(text) == text


def _as_strided(x):
    return torch.as_strided(x, (25, 5), (1, 2))


@pytest.mark.parametrize("target", TARGETS)
def test_torch_mlir_literal_on_every_target(target):
    """as_strided's torch-mlir lowering gathers through a literal of indices: a
    kf.constant on the GPU targets."""
    x = torch.randn(60)
    got = kf.jit(_as_strided, target=target)(x)
    assert torch.equal(got, _as_strided(x))
