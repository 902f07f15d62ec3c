"""compiler/cpu_codegen.py: a program's symbol in its shared object cannot meet a C
library's. A user function named step, exp, round, malloc or free defined that symbol:
the program's entry called glibc's step (a segfault), or the program's allocations called
the user's malloc."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

_CHILD = r'''
import sys, torch, kf
name = sys.argv[1]
src = f"def {name}(p, g, lr, wd=0.01):\n    return p - lr * (g + wd * p)\n"
scope = {}
exec(compile(src, f"<{name}>", "exec"), scope)
f = kf.jit(scope[name], target="cpu")
for dtype, n, same in ((torch.float32, 257, False), (torch.bfloat16, 257, False), (torch.bfloat16, 4, True)):
    p = torch.randn(n, dtype=dtype)
    g = p if same else torch.randn(n, dtype=dtype)
    want = p.double() - 0.1 * (g.double() + 0.01 * p.double())
    tol = dict(atol=2e-2, rtol=2e-2) if dtype == torch.bfloat16 else {}
    torch.testing.assert_close(f(p, g, 0.1).double(), want, **tol)
print("ok")
'''


@pytest.mark.parametrize("name", ["step", "exp", "round", "malloc", "free", "memcpy"])
def test_functions_named_like_c_library_functions(name, tmp_path):
    r = subprocess.run([sys.executable, "-c", _CHILD, name], capture_output=True, text=True, timeout=600,
                       env={**os.environ, "KF_CACHE_DIR": str(tmp_path)})
    assert r.returncode == 0 and r.stdout.strip() == "ok", (r.returncode, r.stderr[-2000:])
