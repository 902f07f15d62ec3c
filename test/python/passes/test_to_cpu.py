"""kf-to-cpu: blocked float reductions, and conversions from f64 to the 16-bit float types.

kf-to-cpu's blocked reductions: every float sum or product over more than
``REDUCTION_BLOCK`` elements -- kf's own and those torch-mlir lowers (prod, norm,
logsumexp) -- runs in stages, checked against torch in f64 on the CPU target and on the
linalg IR. A sequential f32 sum stops growing at 2^24 (``ones(2**25).sum()`` was 2^24)
and its error grows with its length.

LLVM lowers an f64 -> bf16 (or f16) truncation on x86 to a call of compiler-rt's
__truncdfbf2 (__truncdfhf2), which the JIT that makes kf's object code cannot resolve:
it aborted the process. kf-to-cpu converts through f32, as torch does; the case runs in
a subprocess so that an abort fails the test instead of ending the run.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest
import torch

import kf
from kf import dialects as kd
from kf.passes.to_cpu import REDUCTION_BLOCK, blocked_reductions
from mlir import ir


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("KF_CACHE_DIR", str(tmp_path))


def run(fn, *args):
    return kf.jit(fn, target="cpu")(*args)


def rel(out, ref) -> float:
    ref = ref.double()
    return ((out.double() - ref).abs().max() / ref.abs().max().clamp(min=1e-30)).item()


def test_sum_and_mean_of_2_25_ones_and_randn():
    ones = torch.ones(2 ** 25)
    s, m = run(lambda x: (x.sum(), x.mean()), ones)
    assert s.item() == 2 ** 25 and m.item() == 1.0
    x = torch.randn(2 ** 25, generator=torch.Generator().manual_seed(0))
    # sequentially in f32 these are off by 5e-5 of the result
    s, m = run(lambda x: (x.sum(), (x + 1).mean()), x)
    assert rel(s, x.double().sum()) < 1e-5 and rel(m, (x.double() + 1).mean()) < 1e-6


def test_long_rows_and_leading_dims():
    """Rows of 3 x 2^23 ones (a sequential sum stops at 2^24), rows of 2^20 + 7 reduced
    through a transposed view, and a prime count over a leading dim."""
    assert run(lambda x: x.sum(-1), torch.ones(1, 3 * 2 ** 23)).item() == 3 * 2 ** 23
    gen = torch.Generator().manual_seed(1)
    y = torch.randn(2, 2 ** 20 + 7, generator=gen) + 1
    out = run(lambda y: (y.mean(-1, keepdim=True), y.t().sum(0), y.var(-1)), y)
    assert rel(out[0], y.double().mean(-1, keepdim=True)) < 1e-6
    assert rel(out[1], y.double().sum(-1)) < 1e-6 and rel(out[2], y.double().var(-1)) < 1e-6
    z = torch.randn(100003, 3, generator=gen)
    assert rel(run(lambda z: z.sum(0), z), z.double().sum(0)) < 1e-5


def test_torch_mlir_reductions():
    """norm and logsumexp have no kf op: torch-mlir's linalg sums are blocked the same.
    (Sequentially: sqrt(2^24) and log(2^24).)"""
    pytest.importorskip("torch_mlir", reason="norm and logsumexp lower through torch-mlir (the fallback extra)")
    assert run(lambda x: x.norm(), torch.ones(2 ** 25)).item() == pytest.approx(2 ** 12.5, rel=1e-7)
    assert run(lambda x: torch.logsumexp(x, 0), torch.zeros(2 ** 25)).item() == pytest.approx(25 * math.log(2),
                                                                                              rel=1e-7)
    y = torch.randn(3, 2 ** 20 + 1, generator=torch.Generator().manual_seed(2))
    out = run(lambda y: (y.norm(dim=-1), torch.logsumexp(y, -1)), y)
    assert rel(out[0], y.double().norm(dim=-1)) < 1e-6 and rel(out[1], torch.logsumexp(y.double(), -1)) < 1e-6


def _generic_types(module: ir.Module) -> list[str]:
    found = []
    module.operation.walk(lambda op: (found.append(str(op.results[0].type)) if op.name == "linalg.generic"
                                      else None) or ir.WalkResult.ADVANCE)
    return found


def test_blocked_reductions_ir():
    """The stages blocked_reductions writes: a sum of exp over 3 x 100003 along dim 1 (a
    prime: blocks of REDUCTION_BLOCK and a tail), a sum over a leading dim, and what it
    leaves: a short sum, a max (exact in any order), an integer sum."""
    n = 100003
    text = f"""
    #id = affine_map<(d0, d1) -> (d0, d1)>
    #row = affine_map<(d0, d1) -> (d0)>
    #col = affine_map<(d0, d1) -> (d1)>
    func.func @f(%x: tensor<3x{n}xf32>, %y: tensor<{n}x5xf32>, %s: tensor<3x100xf32>, %i: tensor<3x{n}xi32>)
        -> (tensor<3xf32>, tensor<5xf32>, tensor<3xf32>, tensor<3xf32>, tensor<3xi32>) {{
      %z = arith.constant 0.0 : f32
      %one = arith.constant 1.0 : f32
      %zi = arith.constant 0 : i32
      %e3 = tensor.empty() : tensor<3xf32>
      %e5 = tensor.empty() : tensor<5xf32>
      %i3 = tensor.empty() : tensor<3xi32>
      %a = linalg.fill ins(%z : f32) outs(%e3 : tensor<3xf32>) -> tensor<3xf32>
      %b = linalg.fill ins(%one : f32) outs(%e5 : tensor<5xf32>) -> tensor<5xf32>
      %c = linalg.fill ins(%zi : i32) outs(%i3 : tensor<3xi32>) -> tensor<3xi32>
      %0 = linalg.generic {{indexing_maps = [#id, #row], iterator_types = ["parallel", "reduction"]}}
          ins(%x : tensor<3x{n}xf32>) outs(%a : tensor<3xf32>) {{
        ^bb0(%v: f32, %acc: f32):
          %e = math.exp %v : f32
          %r = arith.addf %e, %acc : f32
          linalg.yield %r : f32
      }} -> tensor<3xf32>
      %1 = linalg.generic {{indexing_maps = [#id, #col], iterator_types = ["reduction", "parallel"]}}
          ins(%y : tensor<{n}x5xf32>) outs(%b : tensor<5xf32>) {{
        ^bb0(%v: f32, %acc: f32):
          %r = arith.addf %acc, %v : f32
          linalg.yield %r : f32
      }} -> tensor<5xf32>
      %2 = linalg.generic {{indexing_maps = [#id, #row], iterator_types = ["parallel", "reduction"]}}
          ins(%s : tensor<3x100xf32>) outs(%a : tensor<3xf32>) {{
        ^bb0(%v: f32, %acc: f32):
          %r = arith.addf %v, %acc : f32
          linalg.yield %r : f32
      }} -> tensor<3xf32>
      %3 = linalg.generic {{indexing_maps = [#id, #row], iterator_types = ["parallel", "reduction"]}}
          ins(%x : tensor<3x{n}xf32>) outs(%a : tensor<3xf32>) {{
        ^bb0(%v: f32, %acc: f32):
          %r = arith.maximumf %v, %acc : f32
          linalg.yield %r : f32
      }} -> tensor<3xf32>
      %4 = linalg.generic {{indexing_maps = [#id, #row], iterator_types = ["parallel", "reduction"]}}
          ins(%i : tensor<3x{n}xi32>) outs(%c : tensor<3xi32>) {{
        ^bb0(%v: i32, %acc: i32):
          %r = arith.addi %v, %acc : i32
          linalg.yield %r : i32
      }} -> tensor<3xi32>
      return %0, %1, %2, %3, %4 : tensor<3xf32>, tensor<5xf32>, tensor<3xf32>, tensor<3xf32>, tensor<3xi32>
    }}"""
    with kd.make_context(), ir.Location.unknown():
        module = ir.Module.parse(text)
        before = _generic_types(module)
        blocked_reductions(module.operation)
        module.operation.verify()
        after = _generic_types(module)
        asm = str(module)
    o = n // REDUCTION_BLOCK
    # the sum: blocks (3 x o partials), the tail into the init, the partials into that
    assert f"tensor<3x{o}xf32>" in after and f"tensor<3x{o}x{REDUCTION_BLOCK}xf32>" in asm
    assert f"tensor<3x{n - o * REDUCTION_BLOCK}xf32>" in asm
    # the sum over the leading dim: partials per block along it, before the columns
    assert f"tensor<{o}x5xf32>" in after and f"tensor<{o}x{REDUCTION_BLOCK}x5xf32>" in asm
    assert asm.count("math.exp") == 2  # the sum's body, in the blocks and in the tail
    # each split reduction is three generics (blocks, tail, partials); the rest as they were
    assert len(before) == 5 and len(after) == 9


# ---- f64 -> 16-bit floats ----------------------------------------------------------
_CHILD = r'''
import json, sys, torch, kf

dst = getattr(torch, sys.argv[1])
torch.manual_seed(0)
x = torch.randn(4099, dtype=torch.float64) * 3
# halfway between neighbouring 16-bit values, and a little off it, plus the edges
lo = x.to(dst).double()
hi = lo.nextafter(torch.tensor(float("inf"), dtype=torch.float64)).to(dst).double()
mid = (lo + hi) / 2
edges = torch.tensor([0.0, -0.0, 1e300, -1e300, float("inf"), float("nan"), 1e-300, 65519.99, 65520.0, 3.4e38],
                     dtype=torch.float64)
x = torch.cat([x, mid, mid * (1 + 1e-12), mid * (1 - 1e-12), edges])
f = kf.jit(lambda x: (x.to(dst), (x * 2).to(dst).float()), target="cpu")
got, want = f(x), (x.to(dst), (x * 2).to(dst).float())
same = [bool(((g == w) | (g.isnan() & w.isnan())).all()) for g, w in zip(got, want)]
print(json.dumps(same))
'''


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_f64_to_16_bit_floats_as_torch(dtype, tmp_path):
    env = dict(os.environ, KF_CACHE_DIR=str(tmp_path))
    done = subprocess.run([sys.executable, "-c", _CHILD, dtype], capture_output=True, text=True, env=env, timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == [True, True]


_INT_TO_BF16 = '''
import json, sys, torch, kf
torch.manual_seed(0)
src = getattr(torch, sys.argv[1])
x = (torch.randn(257) * 3).to(src) if src != torch.bool else torch.randn(257) > 0
if src == torch.int64:
    x[:4] = torch.tensor([2**40 + 1, -(2**53) - 3, 2**62, 16777217])
y = torch.randn(257).to(torch.bfloat16)
f = kf.jit(lambda x, y: (x.to(torch.bfloat16), x + y, torch.maximum(y, y * 2) - y), target="cpu")
got, want = f(x, y), (x.to(torch.bfloat16), x + y, torch.maximum(y, y * 2) - y)
rows, one = torch.randn(26, 257).to(torch.bfloat16)[::2], torch.randn(1).to(torch.bfloat16)
where = kf.jit(lambda a, b: torch.where(a > b, a, b), target="cpu")
same = [g.dtype == w.dtype and bool(torch.equal(g, w)) for g, w in zip(got, want)]
drawn = kf.jit(lambda n: torch.randn(n, dtype=torch.bfloat16), target="cpu")(10)
print(json.dumps(same + [bool(torch.equal(where(rows, one), torch.where(rows > one, rows, one))),
                         drawn.dtype == torch.bfloat16 and drawn.shape == (10,) and bool(drawn.isfinite().all()),
                         bool(torch.equal(kf.jit(lambda y: y.double(), target="cpu")(y), y.double()))]))
'''


@pytest.mark.parametrize("src", ["bool", "int8", "int32", "int64"])
def test_integers_to_bf16_and_bf16_arithmetic_as_torch(src, tmp_path):
    """Bools and integers converted to bf16 (a bool plus a bf16 tensor promotes so), bf16
    arithmetic, and a select of bf16 rows (torch.where, which LLVM vectorizes), bit for
    bit as torch: through f32, rounded in integer arithmetic; selected, loaded and
    stored as 16 bits (and torch.randn in bf16, whose stores LLVM vectorizes); widened to
    f64 exactly. Left
    to LLVM they called compiler-rt's __truncsfbf2, which the JIT making the object code
    cannot resolve: the process aborted (hence a child process here)."""
    env = dict(os.environ, KF_CACHE_DIR=str(tmp_path))
    done = subprocess.run([sys.executable, "-c", _INT_TO_BF16, src], capture_output=True, text=True, env=env,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-2000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == [True] * 6
