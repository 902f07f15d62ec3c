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


def flipped(x):
    return torch.flip(x, [0]) * 2


def test_an_op_without_a_kf_op_runs_through_torch_mlir_on_the_cpu(tmp_path, monkeypatch):
    pytest.importorskip("torch_mlir")
    monkeypatch.setenv("KF_CACHE_DIR", str(tmp_path))
    f = kf.jit(flipped, target="cpu")
    assert "@kf_aten_flip" in kf.inspect(f, torch.randn(5, 3)).kf_ir  # the op is torch-mlir's function
    x = torch.randn(257, 3)
    torch.testing.assert_close(f(x), flipped(x))


_WITHOUT = """
import sys
sys.modules["torch_mlir"] = None  # as if kf were installed without its fallback extra
import torch, kf

def flipped(x):
    return torch.flip(x, [0]) * 2

try:
    kf.jit(flipped, target="cpu")(torch.randn(5, 3))
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
