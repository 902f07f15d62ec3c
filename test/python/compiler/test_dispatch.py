"""KfFunction's call path with the C dispatch (kf.runtime._launcher.dispatch) and with
the Python one (KF_DISPATCH=python): the same programs, results, routes and errors.

Each test runs under both: ``dispatch`` swaps api._c_dispatch before the functions are
made (a function reads it when made, and _kernel_call at each call). On the CPU target,
whose calls share the path up to the launcher with CUDA and Vulkan.
"""

from __future__ import annotations

import pytest
import torch

import kf
from kf import api, torch_ops
from kf.errors import TargetError

_launcher = pytest.importorskip("kf.runtime._launcher", reason="kf.runtime._launcher is not built")


@pytest.fixture(scope="module")
def _cache(tmp_path_factory):
    return str(tmp_path_factory.mktemp("kf_cache"))  # both dispatches share the compiled programs


@pytest.fixture(params=["c", "python"])
def dispatch(request, monkeypatch, _cache):
    monkeypatch.setenv("KF_CACHE_DIR", _cache)
    if request.param == "python":
        monkeypatch.setattr(api, "_c_dispatch", None)
    elif api._c_dispatch is None:
        pytest.skip(f"the C dispatch is off here: {api.DISPATCH}")
    return request.param


def _add(x, y, s):
    return x * s + y


def _mix(x, ws, k):
    return x * k + ws[0] - ws[1]


def _counting(f):
    """Wrap every entry of f's dispatch table so that its calls are counted."""
    counts = {}
    for key, entry in list(f._fast.items()):
        def counted(tensors, entry=entry, key=key):
            counts[key] = counts.get(key, 0) + 1
            return entry(tensors)
        f._fast[key] = counted
    return counts


def test_calls_agree_and_fill_the_same_table(dispatch):
    f = kf.jit(_add, target="cpu")
    x, y = torch.randn(5, 7), torch.randn(5, 7)
    calls = [(x, y, 2.0), (x, y, 2.0), (x.t().contiguous().t(), y, 2.0), (x, y, 3.0), (x, y, 2),
             (torch.randn(3, 7), torch.randn(3, 7), 2.0), (x.double(), y.double(), 2.0), (x, y, True)]
    for args in calls:
        torch.testing.assert_close(f(*args), _add(*args))
    assert set(f._fast) == {api._fast_key(a)[0] for a in calls}
    g = kf.jit(_mix, target="cpu")
    w = [torch.randn(5, 7), torch.randn(5, 7)]
    for ws in (w, tuple(w), w):
        torch.testing.assert_close(g(x, ws, 0.5), _mix(x, ws, 0.5))
    assert len(g._fast) == 2  # a list and a tuple of tensors are two signatures


def test_table_keeps_the_newest_entries(dispatch, monkeypatch):
    """A dynamic function meets a new shape at every call: its table keeps the newest
    FAST_ENTRIES, and a shape whose entry went takes the bound path and is added again."""
    monkeypatch.setattr(api, "FAST_ENTRIES", 4)
    f = kf.jit(lambda x: x * 2 + 1, target="cpu", dynamic=True)
    for n in (3, 5, 7, 9, 11, 13, 3):
        x = torch.randn(n, 4)
        torch.testing.assert_close(f(x), x * 2 + 1)
    assert list(f._fast) == [api._fast_key((torch.randn(n, 4),))[0] for n in (9, 11, 13, 3)]
    assert len(f.compiles) == 1


def test_plain_call_takes_the_table_and_skips_needs_op(dispatch, monkeypatch):
    f = kf.jit(_add, target="cpu")
    x, y = torch.randn(8), torch.randn(8)
    f(x, y, 1.5)
    counts = _counting(f)
    seen = []
    real = torch_ops.needs_op
    monkeypatch.setattr(torch_ops, "needs_op", lambda a, k: seen.append(1) or real(a, k))
    torch.testing.assert_close(f(x, y, 1.5), x * 1.5 + y)
    assert list(counts.values()) == [1]
    assert seen == ([] if dispatch == "c" else [1])  # C checks what needs_op checks, itself


def test_requires_grad_goes_through_the_op(dispatch):
    f = kf.jit(_add, target="cpu")
    x, y = torch.randn(6), torch.randn(6)
    f(x, y, 2.0)
    counts = _counting(f)
    xg = x.clone().requires_grad_()
    out = f(xg, y, 2.0)
    assert out.grad_fn is not None
    out.sum().backward()
    torch.testing.assert_close(xg.grad, torch.full_like(x, 2.0))
    assert sum(counts.values()) == 1  # the op's implementation runs the same table entry
    with torch.no_grad():
        plain = f(xg, y, 2.0)
    assert plain.grad_fn is None and sum(counts.values()) == 2
    g = kf.jit(_mix, target="cpu")
    ws = [y, y.clone().requires_grad_()]
    out = g(x, ws, 1.0)
    out.sum().backward()
    torch.testing.assert_close(ws[1].grad, -torch.ones_like(y))


def test_dispatch_modes_see_the_op(dispatch):
    from torch.utils._python_dispatch import TorchDispatchMode

    class Record(TorchDispatchMode):
        def __init__(self):
            super().__init__()
            self.ops = []

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            self.ops.append(str(func))
            return func(*args, **(kwargs or {}))

    f = kf.jit(_add, target="cpu")
    x, y = torch.randn(4), torch.randn(4)
    f(x, y, 1.0)
    with Record() as mode:
        out = f(x, y, 1.0)
    torch.testing.assert_close(out, x + y)
    assert any(op.startswith("kf.") or "kf::" in op for op in mode.ops), mode.ops


def test_autocast_runs_the_variant(dispatch):
    f = kf.jit(lambda a, b: a @ b, target="cpu")
    a, b = torch.randn(8, 16), torch.randn(16, 4)
    full = f(a, b)
    table = dict(f._fast)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        cast = f(a, b)
        again = f(a, b)
    assert f._fast == table and "bf16" in f._variants
    assert cast.dtype == torch.float32 and torch.equal(cast, again) and not torch.equal(cast, full)
    torch.testing.assert_close(cast, full, atol=0.1, rtol=0.05)


def test_errors_are_the_python_paths(dispatch):
    f = kf.jit(_add, target="cpu")
    x = torch.randn(4)
    f(x, x, 1.0)
    with pytest.raises(TargetError, match="several devices|on 'meta'|kf has no target"):
        f(torch.randn(4, device="meta"), torch.randn(4, device="meta"), 1.0)
    with pytest.raises(TargetError, match="compiled for cuda"):
        kf.cuda_kernel(_add)(x, x, 1.0)
    with pytest.raises(Exception, match="argument|takes|missing"):
        f(x, x)


def test_torch_compile_traces_through_the_op(dispatch):
    f = kf.jit(_add, target="cpu")
    x, y = torch.randn(6), torch.randn(6)
    seen = []

    def backend(gm, example_inputs):
        seen.extend(str(n.target) for n in gm.graph.nodes if n.op == "call_function")
        return gm

    compiled = torch.compile(lambda a, b: f(a, b, 3.0) * 2, fullgraph=True, backend=backend)
    torch.testing.assert_close(compiled(x, y), (x * 3 + y) * 2)
    assert any("kf" in s for s in seen), seen


def test_choice_of_dispatch(monkeypatch):
    monkeypatch.setenv("KF_DISPATCH", "python")
    assert api._choose_dispatch() == (None, None, "Python (KF_DISPATCH=python)")
    monkeypatch.setenv("KF_DISPATCH", "cython")
    with pytest.raises(ValueError, match="KF_DISPATCH='cython'"):
        api._choose_dispatch()
    monkeypatch.setenv("KF_DISPATCH", "c")
    fn, miss, words = api._choose_dispatch()
    assert fn is _launcher.dispatch and miss is _launcher.MISS and words.startswith("C (kf.runtime._launcher")
