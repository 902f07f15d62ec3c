"""kf.explain: the kernel plan of a specialization (fusion groups with the user's lines,
strategy and plan, launch geometry, shared memory, vector width, bytes, FLOPs, the
roofline floor) on the CPU and Vulkan targets, and for CUDA from the PTX ptxas accepts."""

import io
import os
import shutil

import pytest
import torch

import kf
import seed_examples as se
from kf import costs
from kf.runtime import vulkan


@pytest.fixture(autouse=True)
def _env(tmp_path, monkeypatch):
    monkeypatch.setenv("KF_CACHE_DIR", str(tmp_path))
    monkeypatch.setenv("KF_HOST_PEAK", "10,100")
    monkeypatch.setattr(costs, "_HOST_PEAK", None)


def softmax_of_product(a, b):
    s = torch.matmul(a, b)
    return torch.softmax(s, dim=-1)


def test_cpu_plan_counts_bytes_and_flops_and_gives_the_floor():
    out = io.StringIO()
    e = kf.explain(kf.jit(softmax_of_product, target="cpu"), torch.randn(32, 16), torch.randn(16, 24), file=out)
    (k,) = e.kernels
    assert e.target == "cpu" and k.strategy == "cpu"
    assert k.nbytes == (32 * 16 + 16 * 24 + 32 * 24) * 4
    assert k.matmul_flops == 2 * 32 * 24 * 16 and k.flops == k.matmul_flops + 5 * 32 * 24
    assert k.floor_s == pytest.approx(max(k.nbytes / 10e9, k.flops / 100e9))
    text = out.getvalue()
    first = softmax_of_product.__code__.co_firstlineno
    assert f"test_explain.py:{first + 1}  s = torch.matmul(a, b)" in text
    assert f"test_explain.py:{first + 2}  return torch.softmax(s, dim=-1)" in text
    assert "roofline floor" in text and "whole call: at least" in text


def test_explain_reads_the_cache_the_call_filled():
    f = kf.jit(softmax_of_product, target="cpu")
    a, b = torch.randn(4, 4), torch.randn(4, 4)
    f(a, b)
    from kf import driver

    def no_build(*args, **kwargs):
        raise AssertionError("explain compiled again")

    import unittest.mock

    with unittest.mock.patch.object(driver, "build", no_build):
        assert kf.explain(f, a, b, file=None).kernels[0].flops > 0


@pytest.mark.skipif(not vulkan.is_available(), reason="no Vulkan device")
def test_vulkan_attention_plan():
    q = torch.randn(1, 2, 64, 32)
    e = kf.explain(se.fused_attention.with_options(target="vulkan"), q, q, q, file=None)
    (k,) = e.kernels
    assert k.strategy == "attention" and {"block_m", "block_n", "threads"} <= set(k.plan)
    assert k.block[0] == k.plan["threads"] and list(k.grid) == k.plan["grid"]
    assert k.matmul_flops == 2 * (2 * 64 * 64 * 32) * 2
    assert len(k.fused_lines) == 3
    text = str(e)
    assert "strategy=attention" in text and "block_m=" in text and "torch.softmax(scores, dim=-1)" in text


@pytest.mark.skipif(not vulkan.is_available(), reason="no Vulkan device")
def test_vulkan_several_kernels_each_with_lines():
    def two_kernels(x, w):
        h = torch.matmul(x, w)
        return torch.softmax(h, dim=0)  # along the matmul's rows: not one rowwise kernel

    e = kf.explain(kf.jit(two_kernels, target="vulkan"), torch.randn(16, 8), torch.randn(8, 12), file=None)
    assert len(e.kernels) >= 1
    assert all(k.fused_lines and k.nbytes > 0 for k in e.kernels)
    assert sum(k.matmul_flops for k in e.kernels) == 2 * 16 * 12 * 8
    assert e.floor_s == pytest.approx(sum(k.floor_s for k in e.kernels))


def test_named_device_peaks_for_a_cuda_kernel():
    if shutil.which("ptxas") is None and not os.path.exists("/usr/local/cuda/bin/ptxas"):
        pytest.skip("needs ptxas")
    x, w, b = torch.randn(8, 1024), torch.randn(1024), torch.randn(1024)
    e = kf.explain(se.metal_layer_norm.with_options(target="cuda"), x, w, b, device="H200", file=None)
    (k,) = e.kernels
    assert e.peak.name == "NVIDIA H200" and k.bound == "memory"
    assert k.floor_s == pytest.approx(k.nbytes / 4.25e12)
    assert k.ptxas["registers"] > 0 and k.occupancy["occupancy"] > 0
    assert "ptxas:" in str(e) and "occupancy" in str(e)


def test_explain_and_inspect_return_their_text_as_repr(capsys):
    f = kf.jit(softmax_of_product, target="cpu")
    a, b = torch.randn(4, 3), torch.randn(3, 5)
    e = kf.explain(f, a, b)
    assert capsys.readouterr().out == ""  # returned, not printed: a REPL shows the repr once
    assert repr(e) == str(e) and "softmax_of_product" in repr(e) and "kernel 0" in repr(e)
    i = kf.inspect(f, a, b)
    assert "kf.matmul" in repr(i) and repr(i).startswith("kf.inspect softmax_of_product")


def test_named_device_peaks_cite_no_path_outside_kf():
    from kf import costs

    source = costs.peak_for("cuda", "H200").source
    assert ".library" not in source and "bench/" in source
