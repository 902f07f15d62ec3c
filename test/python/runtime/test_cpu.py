"""The CPU launcher (runtime/cpu.py): its fast lane, which kf's dispatch table keeps for a
matched call signature, against the general call and eager torch."""

from __future__ import annotations

import threading

import pytest
import torch

import kf
from kf.runtime import cpu


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("KF_CACHE_DIR", str(tmp_path / "cache"))


def _norm_and_sum(x, w):
    y = torch.nn.functional.layer_norm(x, x.shape[-1:], w, None, 1e-5)
    return y, y.sum(0)


def _general_call_refused(monkeypatch):
    """From here on the general call raises: a call that still works took the lane."""
    def refused(self, *inputs, out=None):
        raise AssertionError("the general call ran")

    monkeypatch.setattr(cpu.CpuProgram, "__call__", refused)


@pytest.mark.parametrize("dynamic", [False, True])
def test_matched_calls_take_the_lane(monkeypatch, dynamic):
    """The first call of a signature runs the general call and fills the table; later
    calls of it run the lane (static sizes, and each shape of a program with run-time
    sizes), with eager's results: odd sizes, a size 1 and several outputs."""
    f = kf.jit(_norm_and_sum, target="cpu", dynamic=dynamic)
    shapes = [(13, 257), (1, 257), (300, 257)] if dynamic else [(13, 257)]
    inputs = [(torch.randn(*s), torch.randn(s[-1])) for s in shapes]
    for x, w in inputs:
        f(x, w)
    _general_call_refused(monkeypatch)
    for x, w in inputs:
        for got, want in zip(f(x, w), _norm_and_sum(x, w)):
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    assert len(f.compiles) == 1


def test_lane_from_several_threads(monkeypatch):
    """Each call fills descriptors of its own: threads calling at once get their own
    results."""
    f = kf.jit(_norm_and_sum, target="cpu")
    w = torch.randn(257)
    f(torch.randn(64, 257), w)
    _general_call_refused(monkeypatch)
    xs = [torch.randn(64, 257) for _ in range(8)]
    results, errors = [None] * len(xs), []

    def run(i):
        try:
            for _ in range(50):
                results[i] = f(xs[i], w)
        except Exception as e:  # noqa: BLE001  (reported below)
            errors.append(e)

    threads = [threading.Thread(target=run, args=(i,)) for i in range(len(xs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    for x, got in zip(xs, results):
        for a, b in zip(got, _norm_and_sum(x, w)):
            torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-4)


def test_views_and_index_checks_keep_the_general_call():
    """A view that is not contiguous is a signature of its own, run by the general call
    (made contiguous first); a program that reads indices has no lane (its error flag
    is read after each call), and a bad index still raises."""
    f = kf.jit(_norm_and_sum, target="cpu")
    x, w = torch.randn(257, 13).t(), torch.randn(257)
    for _ in range(2):
        for got, want in zip(f(x, w), _norm_and_sum(x, w)):
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-4)
    gather = kf.jit(lambda t, i: t[i] * 2, target="cpu")
    t = torch.randn(10, 4)
    for _ in range(2):
        torch.testing.assert_close(gather(t, torch.tensor([1, 9, 3])), t[torch.tensor([1, 9, 3])] * 2)
    with pytest.raises(IndexError):
        gather(t, torch.tensor([1, 10, 3]))
