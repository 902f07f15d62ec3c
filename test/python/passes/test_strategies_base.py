"""passes/strategies/base.py: the strategy registry, filled on first use, from several
threads at once.

The first compile of a process imports the strategy modules; eight threads compiling at
once must all see the whole table (a thread that saw it half filled failed with
KeyError: 'generic'). Each case runs in a fresh process, where the registry is empty:
threads compile, both different functions and one shared function, call them, check
them against torch, and hit an index check.
"""

import json
import os
import subprocess
import sys

import pytest

_CHILD = r'''
import json, sys, threading
import torch, kf

target = sys.argv[1]
x, i = torch.randn(9, 5), torch.tensor([0, 8, 3])
shared = kf.jit(lambda x, i: torch.index_select(x, 0, i).sum(-1), target=target)


def make(k):
    if k % 2:  # a function of its own for each odd thread
        return kf.jit(lambda x, i: torch.softmax(torch.index_select(x, 0, i) * (k + 1), -1), target=target)
    return shared


problems, results = [], {}
barrier = threading.Barrier(8)


def work(k):
    try:
        f = make(k)
        barrier.wait()  # every thread's first compile at once
        results[k] = f(x, i)
        try:
            f(x, torch.tensor([0, 9]))
            problems.append(f"thread {k}: no IndexError")
        except IndexError:
            pass
    except Exception as e:
        problems.append(f"thread {k}: {type(e).__name__}: {str(e)[:300]}")


threads = [threading.Thread(target=work, args=(k,)) for k in range(8)]
for t in threads:
    t.start()
for t in threads:
    t.join()
for k, r in sorted(results.items()):
    want = torch.softmax(x[i] * (k + 1), -1) if k % 2 else x[i].sum(-1)
    if not torch.allclose(r, want, atol=1e-6):
        problems.append(f"thread {k}: wrong values")
print(json.dumps({"problems": problems, "done": len(results)}))
'''


def _vulkan() -> bool:
    from kf.runtime import vulkan

    return vulkan.is_available()


@pytest.mark.parametrize("target", ["cpu", pytest.param("vulkan", marks=pytest.mark.skipif(
    not _vulkan(), reason="no Vulkan device"))])
def test_eight_threads_compile_at_once(target, tmp_path):
    env = dict(os.environ, KF_CACHE_DIR=str(tmp_path), PYTHONFAULTHANDLER="1")
    done = subprocess.run([sys.executable, "-c", _CHILD, target], capture_output=True, text=True, env=env,
                          timeout=1200)
    assert done.returncode == 0, done.stderr[-2000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    assert report == {"problems": [], "done": 8}, report
