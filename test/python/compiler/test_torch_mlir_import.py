"""compiler/torch_mlir_import.py: the cpu target's fallback for ATen ops with no kf op,
and, where torch-mlir (the extra ``kf[fallback]``) is not installed, the error that
names the extra at the user's line."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
import torch

import kf


def wrapped(a, b, w):
    return torch.nn.functional.bilinear(a, b, w) * 2  # _trilinear: no kf op, no decomposition of torch's


def test_an_op_without_a_kf_op_runs_through_torch_mlir_on_the_cpu(tmp_path, monkeypatch):
    pytest.importorskip("torch_mlir")
    monkeypatch.setenv("KF_CACHE_DIR", str(tmp_path))
    f = kf.jit(wrapped, target="cpu")
    args = (torch.randn(5, 3), torch.randn(5, 4), torch.randn(2, 3, 4))
    assert "@kf_aten__trilinear_default" in kf.inspect(f, *args).kf_ir  # the op is torch-mlir's function
    args = (torch.randn(257, 3), torch.randn(257, 4), torch.randn(7, 3, 4))
    torch.testing.assert_close(f(*args), wrapped(*args))


_WITHOUT = """
import sys
sys.modules["torch_mlir"] = None  # as if kf were installed without its fallback extra
import torch, kf

def wrapped(a, b, w):
    return torch.nn.functional.bilinear(a, b, w) * 2

try:
    kf.jit(wrapped, target="cpu")(torch.randn(5, 3), torch.randn(5, 4), torch.randn(2, 3, 4))
except kf.UnsupportedOpError as e:
    print(e.loc.line, e.cause)
"""


def test_without_torch_mlir_the_error_names_the_extra(tmp_path):
    script = tmp_path / "without.py"
    script.write_text(_WITHOUT)
    r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=600,
                       env={**os.environ, "KF_CACHE_DIR": str(tmp_path)})
    assert r.returncode == 0, r.stderr[-2000:]
    line, cause = r.stdout.strip().split(" ", 1)
    assert line == "7" and "pip install 'kf[fallback]'" in cause, r.stdout


def strided(x, size, stride):
    return torch.as_strided(x, size, stride) * 2


def strided_at(x, size, stride, offset):
    return torch.as_strided(x, size, stride, offset) + 1


@pytest.mark.parametrize("n,size,stride", [(257, (16, 16), (16, 1)), (13, (4, 3), (2, 3)), (7, (7, 2), (1, 0)),
                                           (1, (3,), (0,)), (5, (0, 4), (1, 1))])
def test_as_strided_of_a_contiguous_tensor_matches_torch(tmp_path, monkeypatch, n, size, stride):
    pytest.importorskip("torch_mlir")
    monkeypatch.setenv("KF_CACHE_DIR", str(tmp_path))
    x = torch.randn(n)
    torch.testing.assert_close(kf.jit(strided, target="cpu")(x, size, stride), strided(x, size, stride))


@pytest.mark.parametrize("make,size,stride,offset,says", [
    # a transposed input: eager indexes its memory, column-major
    (lambda: torch.randn(3, 5).t(), (5, 3), (3, 1), None, "not contiguous"),
    # an offset view: an explicit storage_offset counts from the start of the storage
    (lambda: torch.randn(11)[2:9], (2, 2), (1, 2), 1, "storage_offset=1"),
    (lambda: torch.randn(11), (2, 2), (1, 2), 0, "storage_offset=0"),
    # past the view's own elements, into memory of the storage kf does not hold
    (lambda: torch.randn(11)[2:9], (9,), (1,), None, "beyond the tensor"),
])
def test_as_strided_that_reads_memory_kf_does_not_hold_is_refused(tmp_path, monkeypatch, make, size, stride,
                                                                     offset, says):
    pytest.importorskip("torch_mlir")
    monkeypatch.setenv("KF_CACHE_DIR", str(tmp_path))
    x = make()
    f = kf.jit(strided if offset is None else strided_at, target="cpu")
    with pytest.raises(kf.UnsupportedOpError, match=says) as e:
        f(x, size, stride) if offset is None else f(x, size, stride, offset)
    assert e.value.loc is not None and e.value.loc.line > 0


_ZERO_DIM = """
import torch, kf

def resized(x):
    return x.resize_(()) * 3

def spread(x):
    return torch.as_strided(x, (2, 3), (0, 0))

x = torch.tensor(-8.5)
print(kf.jit(resized, target="cpu")(x.clone()).item(), kf.jit(spread, target="cpu")(x).tolist())
"""


def test_as_strided_of_a_0_dim_tensor_runs(tmp_path):
    """torch-mlir's as_strided kills the process on a 0-dim input (resize_ decomposes to
    it): kf builds the view itself. In a subprocess, so that a crash is a failure."""
    pytest.importorskip("torch_mlir")
    script = tmp_path / "zero_dim.py"
    script.write_text(_ZERO_DIM)
    r = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=600,
                       env={**os.environ, "KF_CACHE_DIR": str(tmp_path)})
    assert r.returncode == 0, r.stderr[-2000:]
    assert r.stdout.split(" ", 1) == ["-25.5", "[[-8.5, -8.5, -8.5], [-8.5, -8.5, -8.5]]\n"], r.stdout


def test_torch_mlir_diagnostics_go_into_the_error_not_the_terminal():
    """torch-mlir's pass manager prints a failed legalization to stderr; kf puts the first
    diagnostic in the error's cause, and nothing reaches the terminal."""
    import textwrap

    pytest.importorskip("torch_mlir")

    code = textwrap.dedent("""
        import torch, kf
        try:
            kf.jit(lambda a: torch.gcd(a, a + 3), target="cpu")(torch.arange(-5, 5, dtype=torch.int32))
        except kf.CompileError as e:
            print("CAUSE", e.cause)
    """)
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert "CAUSE torch-mlir:" in run.stdout and "failed to legalize operation" in run.stdout, run.stdout
    assert "error:" not in run.stderr, run.stderr


def _vector_norm(x, dims):
    return torch.linalg.vector_norm(x, dim=dims)


@pytest.mark.parametrize("shape, dims", [((1, 1), -1), ((7, 1), -1), ((1, 5, 1), (-1, 0)), ((3, 1, 257), -2),
                                         ((13, 1), [-1]), ((7, 3), -1)])
def test_vector_norm_over_size_1_dims_counted_from_the_back(tmp_path, monkeypatch, shape, dims):
    """vector_norm (torch-mlir's) drops a reduced dim of size 1 given as a negative index,
    as eager does, under every supported torch (2.11's shape rule kept it, and torch-mlir
    then failed to lower the op)."""
    pytest.importorskip("torch_mlir")
    monkeypatch.setenv("KF_CACHE_DIR", str(tmp_path))
    x = torch.randn(*shape)
    want = _vector_norm(x, dims)
    got = kf.jit(_vector_norm, target="cpu")(x, dims)
    assert got.shape == want.shape
    torch.testing.assert_close(got, want)
