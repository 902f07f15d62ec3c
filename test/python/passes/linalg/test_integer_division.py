"""Integer division in torch-mlir's functions (passes/linalg/integer_division.py): exact
past 2**53, and never a CPU trap (the process killed by SIGFPE) on a divisor of 0 or on
INT_MIN / -1."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch

import kf
from kf.runtime import vulkan

pytest.importorskip("torch_mlir", reason="integer division by tensors goes through torch-mlir (kf[fallback])")

TARGETS = ["cpu", pytest.param("vulkan", marks=pytest.mark.skipif(not vulkan.is_available(), reason="no Vulkan device"))]
OPS = {"floordiv": lambda x, y: x // y, "floor": lambda x, y: torch.div(x, y, rounding_mode="floor"),
       "remainder": lambda x, y: torch.remainder(x, y), "fmod": lambda x, y: torch.fmod(x, y)}


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("op", list(OPS))
def test_int64_past_2_53_and_int_min_by_minus_one(op, target):
    fn = OPS[op]
    x = torch.tensor([2**62 + 1, -(2**62) - 3, -(2**63), 2**63 - 1, 7, -7, 0, 2**53 + 1])
    y = torch.tensor([1, 2, -1, -1, -2, 2, -5, 3])
    assert kf.jit(fn, target=target)(x, y).tolist() == fn(x, y).tolist()
    # a strided divisor and int32
    x32, y32 = x.clamp(-(2**31), 2**31 - 1).int(), torch.tensor([1, 2, -1, -1, -2, 2, -5, 3] * 2, dtype=torch.int32)[::2]
    assert kf.jit(fn, target=target)(x32, y32).tolist() == fn(x32, y32).tolist()


@pytest.mark.parametrize("target", TARGETS)
def test_division_by_zero_does_not_kill_the_process(target):
    """torch raises ZeroDivisionError on the CPU; kf's kernels compute x // 0 as x and
    x % 0 as 0 (undefined values, as on CUDA), but the process lives."""
    code = f"""
import torch, kf
x, y = torch.tensor([5, -5, -2**63]), torch.tensor([0, 0, 0])
for fn in (lambda x, y: x // y, lambda x, y: torch.remainder(x, y), lambda x, y: torch.fmod(x, y),
           lambda x, y: torch.div(x, y, rounding_mode="trunc")):
    kf.jit(fn, target={target!r})(x, y)
print("alive")
"""
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert done.returncode == 0 and "alive" in done.stdout, done.stderr[-2000:]
