"""aten.convolution (compiler/aten/convolution.py): conv1d/2d/3d and conv_transpose1d/
2d/3d against torch with strides, padding, dilation, groups, output_padding and bias, on
odd sizes, an empty batch and non-contiguous inputs, on cpu and vulkan with torch-mlir
hidden; PTX that ptxas assembles for sm_90a."""

from __future__ import annotations

import os
import shutil
import sys

import pytest
import torch
import torch.nn.functional as F

import kf
from kf.runtime import vulkan

TARGETS = ["cpu", pytest.param("vulkan", marks=pytest.mark.skipif(not vulkan.is_available(),
                                                                   reason="no Vulkan device"))]
_PTXAS = shutil.which("ptxas") is not None or os.path.exists("/usr/local/cuda/bin/ptxas")


@pytest.fixture(autouse=True)
def _no_torch_mlir(monkeypatch):
    monkeypatch.setitem(sys.modules, "torch_mlir", None)


#: (conv, input shape, weight shape, keyword arguments)
CASES = [
    (F.conv1d, (2, 3, 11), (5, 3, 3), {}),
    (F.conv1d, (1, 4, 257), (6, 2, 4), {"stride": 3, "padding": 2, "dilation": 2, "groups": 2}),
    (F.conv2d, (2, 3, 7, 5), (4, 3, 3, 2), {"padding": (1, 0)}),
    (F.conv2d, (1, 6, 9, 8), (6, 2, 3, 3), {"stride": (2, 1), "dilation": (1, 2), "groups": 3}),
    (F.conv3d, (1, 2, 5, 4, 6), (3, 2, 2, 3, 1), {"stride": 2, "padding": 1}),
    (F.conv_transpose1d, (2, 3, 7), (3, 5, 3), {}),
    (F.conv_transpose1d, (1, 4, 13), (4, 3, 4), {"stride": 3, "padding": 2, "output_padding": 1, "groups": 2,
                                                 "dilation": 2}),
    (F.conv_transpose2d, (2, 3, 5, 4), (3, 2, 3, 2), {"stride": (2, 3), "padding": (1, 0), "output_padding": (1, 2)}),
    (F.conv_transpose3d, (1, 2, 3, 4, 2), (2, 3, 2, 2, 3), {"stride": 2, "padding": 1}),
]


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("case", range(len(CASES)))
def test_convolution(case, target):
    conv, xs, ws, kw = CASES[case]
    gen = torch.Generator().manual_seed(case)
    x, w = torch.randn(*xs, generator=gen), torch.randn(*ws, generator=gen)
    out_channels = ws[1] * kw.get("groups", 1) if "transpose" in conv.__name__ else ws[0]
    b = torch.randn(out_channels, generator=gen)
    f = kf.jit(lambda x, w, b: (conv(x, w, b, **kw), conv(x, w, **kw)), target=target)
    for got, want in zip(f(x, w, b), (conv(x, w, b, **kw), conv(x, w, **kw)), strict=True):
        torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    xt = torch.randn(*reversed(xs), generator=gen).permute(*reversed(range(len(xs))))  # not contiguous
    torch.testing.assert_close(f(xt, w, b)[0], conv(xt, w, b, **kw), rtol=1e-4, atol=1e-4)
    empty = torch.randn(0, *xs[1:])
    assert f(empty, w, b)[0].shape == conv(empty, w, b, **kw).shape


@pytest.mark.skipif(not _PTXAS, reason="needs ptxas")
def test_convolution_assembles_for_cuda():
    x, w = torch.randn(2, 3, 7, 5), torch.randn(4, 3, 3, 2)
    fn = kf.jit(lambda x, w: (F.conv2d(x, w, padding=1), F.conv_transpose2d(x, w.transpose(0, 1), stride=2)),
                target="cuda", arch="sm_90a")
    assert ".entry" in kf.inspect(fn, x, w).ptx
