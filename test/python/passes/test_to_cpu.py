"""kf-to-cpu: conversions from f64 to the 16-bit float types.

LLVM lowers an f64 -> bf16 (or f16) truncation on x86 to a call of compiler-rt's
__truncdfbf2 (__truncdfhf2), which the JIT that makes kf's object code cannot resolve:
it aborted the process. kf-to-cpu converts through f32, as torch does; the case runs in
a subprocess so that an abort fails the test instead of ending the run.
"""

import json
import os
import subprocess
import sys

import pytest

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
