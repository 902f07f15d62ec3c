"""kf-share-kernels (passes/share_kernels.py): kernel functions that are the same function
under another name become one, and the program still launches it once per call site."""

from __future__ import annotations

import pytest
import torch

import kf
from kf.dialects import make_context
from kf.passes.share_kernels import share_kernels
from kf.runtime import vulkan
from mlir import ir

MODULE = """
func.func private @f_k0_rowwise(%x: tensor<4x64xf32>) -> tensor<4x64xf32> attributes {kf.kernel = "rowwise"} {
  %0 = "kf.softmax"(%x) {dim = -1 : i64} : (tensor<4x64xf32>) -> tensor<4x64xf32>
  return %0 : tensor<4x64xf32>
}
func.func private @f_k1_rowwise(%y: tensor<4x64xf32>) -> tensor<4x64xf32> attributes {kf.kernel = "rowwise"} {
  %s = "kf.softmax"(%y) {dim = -1 : i64} : (tensor<4x64xf32>) -> tensor<4x64xf32>
  return %s : tensor<4x64xf32>
}
func.func private @f_k2_rowwise(%y: tensor<4x64xf32>) -> tensor<4x64xf32> attributes {kf.kernel = "rowwise"} {
  %s = "kf.log_softmax"(%y) {dim = -1 : i64} : (tensor<4x64xf32>) -> tensor<4x64xf32>
  return %s : tensor<4x64xf32>
}
func.func @f(%a: tensor<4x64xf32>) -> tensor<4x64xf32> {
  %0 = call @f_k0_rowwise(%a) : (tensor<4x64xf32>) -> tensor<4x64xf32>
  %1 = call @f_k1_rowwise(%0) : (tensor<4x64xf32>) -> tensor<4x64xf32>
  %2 = call @f_k2_rowwise(%1) : (tensor<4x64xf32>) -> tensor<4x64xf32>
  return %2 : tensor<4x64xf32>
}
"""


def test_a_copy_under_another_name_and_value_names_is_shared():
    """@f_k1 is @f_k0 with other SSA names: its call calls @f_k0 and it is erased;
    @f_k2 (another op) stays."""
    with make_context() as ctx, ir.Location.unknown():
        module = ir.Module.parse(MODULE, ctx)
        assert share_kernels(module.operation) == {"f_k1_rowwise": "f_k0_rowwise"}
        text = str(module)
        assert "@f_k1_rowwise" not in text and text.count("call @f_k0_rowwise") == 2
        assert "call @f_k2_rowwise" in text
        assert share_kernels(module.operation) == {}  # nothing left to share


@pytest.mark.skipif(not vulkan.is_available(), reason="no Vulkan device")
def test_repeated_layers_are_one_kernel_launched_at_each():
    """Three identical layers (a norm, then a matmul by the same weight): each kernel is
    written once and launched three times, each on its own buffers (the result is
    eager's)."""
    w = torch.randn(64, 64) / 8

    def three(x):
        for _ in range(3):
            x = torch.nn.functional.layer_norm(x, (64,)) @ w.t()
        return x

    f = kf.jit(three, target="vulkan")
    x = torch.randn(5, 64)
    torch.testing.assert_close(f(x), three(x), atol=1e-4, rtol=1e-4)
    gpu = kf.inspect(f, x).stages["gpu"]
    kernels, calls = gpu.count("gpu.func @three_k"), gpu.count("call @three_k")
    assert calls >= 6 and kernels <= calls // 3, (kernels, calls)
