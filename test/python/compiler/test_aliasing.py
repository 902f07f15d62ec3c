"""A kf result shares memory with an input only where eager's does (compiler/aliasing.py):
``x.clone()`` and ``x * 1`` give new tensors although kf computes nothing for them,
``return x`` gives x itself, and two results that eager makes separately are two
tensors. Run on the cpu and vulkan targets; the CUDA program's ABI is checked as compiled."""

import json

import pytest
import torch
import torch.nn.functional as F

import kf
from kf.runtime import vulkan

TARGETS = ["cpu", pytest.param("vulkan", marks=pytest.mark.skipif(not vulkan.is_available(),
                                                                  reason="no Vulkan device"))]

#: name -> function of one tensor x (6 elements): what eager returns decides what kf may share
FUNCTIONS = {
    "return_x": lambda x: x,
    "clone": lambda x: x.clone(),
    "contiguous": lambda x: x.contiguous(),
    "dropout_eval": lambda x: F.dropout(x, 0.5, training=False),
    "dropout_p0": lambda x: F.dropout(x, 0.0, training=True),
    "to_same_dtype": lambda x: x.to(torch.float32),
    "times_one": lambda x: x * 1,
    "plus_minus_zero": lambda x: x + (-0.0),
    "view": lambda x: x.view(2, 3),
    "reshape": lambda x: x.reshape(3, 2),
    "detach": lambda x: x.detach(),
    "clone_then_view": lambda x: x.clone().view(3, 2),
    "x_and_clone": lambda x: (x, x.clone()),
    "two_clones": lambda x: (x.clone(), x.clone()),
    "x_twice": lambda x: (x, x),
    "y_and_clone": lambda x: (lambda y: (y, y.clone()))(x * 2),
    "y_twice": lambda x: (lambda y: (y, y))(x * 2),
    "to_other_dtype": lambda x: x.to(torch.float16),
}


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("KF_CACHE_DIR", str(tmp_path))


def _results(r):
    return list(r) if isinstance(r, tuple) else [r]


def _shares(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("name", sorted(FUNCTIONS))
def test_results_share_memory_only_where_eager_does(target, name):
    fn = FUNCTIONS[name]
    x = torch.arange(6.0) + 1
    want = _results(fn(x))
    got = _results(kf.jit(fn, target=target)(x))
    assert len(got) == len(want)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w)
        if not _shares(w, x):
            assert not _shares(g, x), f"{name}: kf's result shares the input's memory, eager's is new"
        if w is x:
            assert g is x, f"{name}: eager returns the input itself"
    for i in range(len(got)):
        for j in range(i):
            if not _shares(want[i], want[j]):
                assert not _shares(got[i], got[j]), f"{name}: results {j} and {i} share memory, eager's do not"
            if want[i] is want[j]:
                assert got[i] is got[j]
    # writing into a result that eager made new leaves the input alone
    for g, w in zip(got, want):
        if not _shares(w, x) and g.dtype == x.dtype:
            g.fill_(-7.0)
    assert torch.equal(x, torch.arange(6.0) + 1) or any(_shares(w, x) for w in want)


@pytest.mark.parametrize("target", TARGETS)
def test_strided_input_returned_is_the_input(target):
    """The caller's own view comes back (not the contiguous copy a launcher may make)."""
    base = torch.arange(12.0)
    x = base[::2]
    assert kf.jit(lambda t: t, target=target)(x) is x
    y = kf.jit(lambda t: t.clone(), target=target)(x)
    assert torch.equal(y, x) and not _shares(y, base)


def _writes_x_returns_y(x, y):
    x.add_(1)
    return y, y.clone(), x * 2


@pytest.mark.parametrize("target", TARGETS)
def test_results_of_a_function_that_writes_an_argument(target):
    """A written argument's new value is one more output of the program (copied back by
    the call): the user's results keep eager's sharing, y itself and new tensors."""
    x, y = torch.arange(6.0), torch.arange(6.0) + 10
    x0 = x.clone()
    got = kf.jit(_writes_x_returns_y, target=target)(x, y)
    assert torch.equal(x, x0 + 1)
    assert got[0] is y and not _shares(got[1], y) and torch.equal(got[1], y)
    assert torch.equal(got[2], (x0 + 1) * 2)


def _abi(fn, target: str, *args):
    from kf.driver import build
    from kf.options import Options
    from kf.signature import bind
    from kf.runtime.abi import ProgramABI

    sig, tensors = bind(fn, args, {})
    meta, _ = build(fn, sig, tensors, Options(target=target), "sm_90a" if target == "cuda" else "")
    return ProgramABI.from_json(meta["abi"]), meta


def test_cuda_program_copies_what_eager_makes_new():
    """A CUDA program (compiled here, run on a GPU elsewhere) with no kernels: the clone's
    output is a copy of input 0, the identity's an alias that the call replaces by the
    input itself, and of two equal results only the eager-shared one repeats."""
    x = torch.arange(6.0)
    abi, meta = _abi(lambda t: (t, t.clone()), "cuda", x)
    assert not abi.kernels
    assert abi.output_aliases == (0, -1) and abi.output_copies == (-1, 0)
    assert meta["returns_inputs"] == [[0, 0]]
    abi, meta = _abi(lambda t: (lambda y: (y, y.clone(), y))(t * 2), "cuda", x)
    assert abi.output_copies == (-1, 1, -1) and meta["repeats"] == [-1, -1, 0]
    assert json.loads(abi.to_json())["output_copies"] == [-1, 1, -1]


def test_take_inputs_applies_aliases_and_copies():
    from kf.runtime.abi import ProgramABI, TensorArg

    a = TensorArg("x", (2, 3), "f32")
    abi = ProgramABI("vulkan", inputs=(a,), outputs=(TensorArg("r0", (6,), "f32"), TensorArg("r1", (2, 3), "f32"),
                                                     TensorArg("r2", (2, 3), "f32")),
                     output_aliases=(0, -1, -1), output_copies=(-1, 0, 2))
    x = torch.arange(6.0).reshape(2, 3)
    outs = abi.take_inputs([x], [None, None, None])
    assert _shares(outs[0], x) and outs[0].shape == (6,)
    assert torch.equal(outs[1], x) and not _shares(outs[1], x)
    assert torch.equal(outs[2], x) and not _shares(outs[2], x) and not _shares(outs[2], outs[1])
    assert [abi.unwritten(j) for j in range(3)] == [True, True, True]
