"""runtime/vulkan.py's device memory on a real Vulkan device: a tensor's bytes stay
resident between calls (runtime/residency.py) until it changes, views are keyed by their
storage, buffers are evicted under a limit and given back when tensors die, downloads
share the call's one submit -- each through mapped memory (lavapipe's unified memory)
and through staging buffers (a discrete GPU's path).
"""

from __future__ import annotations

import dataclasses
import gc
import math
import threading

import numpy as np
import pytest
import torch

import kf
from kf.runtime import vulkan
from kf.runtime.abi import ProgramABI, TensorArg

from vulkan_kernels import TORCH, compile_one, elementwise_kernel, kernel_abi, needs_vulkan, random


@pytest.fixture(params=[False, True], ids=["mapped", "staged"])
def memory_path(request):
    """Run a test with the device buffers mapped (lavapipe's unified memory) and through
    staging buffers and vkCmdCopyBuffer (a discrete GPU's path), each from an empty
    residency table and pool."""
    dev = vulkan.device()
    before = dev.staged
    if not request.param and not dev.memory.unified:
        pytest.skip(f"{dev.name} has no unified memory: its buffers are always staged")
    dev.residency.clear()
    dev.release_pool()
    dev.staged = request.param
    try:
        yield dev
    finally:
        dev.residency.clear()
        dev.release_pool()
        dev.staged = before


def ew_program(n: int):
    """out = a*b + exp(a), t = a*b + exp(a) then out2 = t*b + exp(t): one or two kernels."""
    binary, k = compile_one(elementwise_kernel(n, "f32", 256))
    grid = (math.ceil(n / 256), 1, 1)
    arg = lambda name: TensorArg(name, (n,), "f32")  # noqa: E731
    one = ProgramABI("vulkan", (arg("a"), arg("b")), (arg("out"),), (),
                     (dataclasses.replace(kernel_abi(k, grid), args=(0, 1, 2)),))
    two = ProgramABI("vulkan", (arg("a"), arg("b")), (arg("out"), arg("t")), (),
                     (dataclasses.replace(kernel_abi(k, grid), args=(0, 1, 3)),
                      dataclasses.replace(kernel_abi(k, grid), args=(3, 1, 2))))
    return {"ew.spv": binary}, one, two


def ew_ref(a, b):
    return a * b + a.exp()


def uploads(dev):
    return dev.uploads


@needs_vulkan
def test_chained_calls_upload_once(memory_path):
    """A chain of calls on the same tensors uploads each once; an output fed back to the
    next call is not uploaded at all (its buffer became resident when it was written)."""
    dev = memory_path
    bins, one, _ = ew_program(1000)
    gen = torch.Generator().manual_seed(3)
    a, b = torch.randn(1000, generator=gen), torch.rand(1000, generator=gen)
    u, before = dev.uploads, dev.upload_bytes
    [y] = vulkan.run_program(one, bins, [a, b])
    assert dev.uploads - u == 2 and dev.upload_bytes - before == 8000
    torch.testing.assert_close(y, ew_ref(a, b))
    u = dev.uploads
    for _ in range(3):
        [y2] = vulkan.run_program(one, bins, [a, b])
    [z] = vulkan.run_program(one, bins, [y2, b])
    assert dev.uploads == u
    torch.testing.assert_close(y2, ew_ref(a, b))
    torch.testing.assert_close(z, ew_ref(y2, b))


@needs_vulkan
def test_changes_between_calls_are_seen(memory_path):
    """Whatever changes a tensor between calls -- in place, through indexing, copy_, a
    view, .data, numpy -- the next call sees it (and uploads it again)."""
    dev = memory_path
    bins, one, _ = ew_program(257)
    gen = torch.Generator().manual_seed(5)
    a, b = torch.randn(257, generator=gen), torch.rand(257, generator=gen)
    vulkan.run_program(one, bins, [a, b])
    arr = np.random.default_rng(0).standard_normal(257).astype(np.float32)
    from_numpy = torch.from_numpy(arr)
    vulkan.run_program(one, bins, [from_numpy, b])
    changes = [lambda: a.add_(1), lambda: a.__setitem__(0, 5.0), lambda: a.copy_(torch.randn(257, generator=gen)),
               lambda: a[10:20].mul_(-1), lambda: a.view(257, 1)[100].fill_(3), lambda: a.data.mul_(0.5),
               lambda: arr.__setitem__(slice(None), 2.0)]
    for i, change in enumerate(changes):
        change()
        x = from_numpy if i == len(changes) - 1 else a
        u = dev.uploads
        [y] = vulkan.run_program(one, bins, [x, b])
        assert dev.uploads == u + 1, i
        torch.testing.assert_close(y, ew_ref(x, b), msg=f"change {i}")


@needs_vulkan
def test_outputs_fed_back_then_changed(memory_path):
    dev = memory_path
    bins, one, two = ew_program(1000)
    a, b = torch.randn(1000), torch.rand(1000)
    out, t = vulkan.run_program(two, bins, [a, b])  # two outputs, one submit
    t_ref = ew_ref(a, b)
    torch.testing.assert_close(t, t_ref)
    torch.testing.assert_close(out, ew_ref(t_ref, b), rtol=1e-4, atol=1e-5)
    u = dev.uploads
    [y] = vulkan.run_program(one, bins, [t, b])
    assert dev.uploads == u
    t.mul_(0.5)
    [y] = vulkan.run_program(one, bins, [t, b])
    assert dev.uploads == u + 1
    torch.testing.assert_close(y, ew_ref(t, b), rtol=1e-5, atol=1e-5)  # exp of exp: large values


@needs_vulkan
def test_downloads_batch_into_the_calls_one_submit(memory_path):
    dev = memory_path
    bins, _, two = ew_program(300)
    a, b = torch.randn(300), torch.rand(300)
    s, d = dev.submits, dev.downloads
    vulkan.run_program(two, bins, [a, b])
    assert dev.submits == s + 1 and dev.downloads == d + 2


@needs_vulkan
def test_views_are_keyed_by_their_storage(memory_path):
    """A transposed, a strided and an offset view are uploaded as they lie (made dense on
    the way) and stay resident; changing their base through another view is seen."""
    dev = memory_path
    f = kf.jit(lambda x, w: x * w + 1, target="vulkan")
    base = torch.randn(70, 66)
    w = torch.randn(33)
    dense = lambda: base.view(-1)[66 * 36 + 5:66 * 36 + 5 + 33 * 33].view(33, 33)  # noqa: E731 (odd offset)
    for view in (lambda: base.t()[:33, :33], lambda: base[:33, ::2], lambda: base[3:36, 1:34], dense):
        x = view()
        y = f(x, w)
        u = dev.uploads
        y = f(view(), w)  # another view object of the same bytes
        assert dev.uploads == u
        torch.testing.assert_close(y, x * w + 1)
    base[40].fill_(7)  # through the base: the views share its version counter
    x = dense()
    u = dev.uploads
    torch.testing.assert_close(f(x, w), x * w + 1)
    assert dev.uploads == u + 1


@needs_vulkan
def test_eviction_under_a_small_limit(memory_path, monkeypatch):
    """KF_VULKAN_RESIDENT_BYTES bounds what stays resident (LRU by bytes); 0 turns
    residency off. Results are right either way."""
    dev = memory_path
    bins, one, _ = ew_program(1000)
    ts = [torch.randn(1000) for _ in range(3)]
    b = torch.rand(1000)
    monkeypatch.setenv("KF_VULKAN_RESIDENT_BYTES", "12000")  # b, and two 4000-byte tensors
    try:
        dev.trim()
        for t in ts:  # each call keeps its input and its output: 16 KB > 12 KB
            [y] = vulkan.run_program(one, bins, [t, b])
            torch.testing.assert_close(y, ew_ref(t, b))
            assert dev.residency.resident_bytes <= 12000
        u = dev.uploads
        vulkan.run_program(one, bins, [ts[0], b])  # evicted long ago
        assert dev.uploads > u
        monkeypatch.setenv("KF_VULKAN_RESIDENT_BYTES", "0")
        dev.trim()
        assert len(dev.residency) == 0
        u = dev.uploads
        for _ in range(2):
            [y] = vulkan.run_program(one, bins, [ts[1], b])
        assert dev.uploads == u + 4 and len(dev.residency) == 0
        torch.testing.assert_close(y, ew_ref(ts[1], b))
    finally:
        monkeypatch.delenv("KF_VULKAN_RESIDENT_BYTES")
        dev.trim()


@needs_vulkan
def test_freed_tensors_give_their_buffers_back(memory_path):
    dev = memory_path
    bins, one, _ = ew_program(1000)
    b = torch.rand(1000)
    vulkan.run_program(one, bins, [torch.randn(1000), b])  # input and output die at once
    gc.collect()
    dev.trim()
    assert len(dev.residency) == 1  # b's
    x = torch.zeros(1000)
    [y] = vulkan.run_program(one, bins, [x, b])
    del x, y
    gc.collect()
    x = torch.zeros(1000)  # a new storage, perhaps where the last one was: uploaded
    u = dev.uploads
    [y] = vulkan.run_program(one, bins, [x, b])
    assert dev.uploads == u + 1
    torch.testing.assert_close(y, ew_ref(x, b))


@needs_vulkan
def test_threads_share_the_device(memory_path):
    """Calls from several threads, on tensors of their own and shared ones, changed in
    between: every result right, and the table's byte count matches its entries."""
    dev = memory_path
    bins, one, two = ew_program(4096)
    shared = torch.rand(4096)
    errors = []

    def work(seed):
        gen = torch.Generator().manual_seed(seed)
        a = torch.randn(4096, generator=gen)
        try:
            for i in range(12):
                if i % 4 == 3:
                    a.add_(0.25)
                [y] = vulkan.run_program(one, bins, [a, shared])
                torch.testing.assert_close(y, ew_ref(a, shared))
                out, t = vulkan.run_program(two, bins, [y.clamp(-3, 3), shared])
                torch.testing.assert_close(t, ew_ref(y.clamp(-3, 3), shared))
        except Exception as e:  # reported below, with the thread's seed
            errors.append((seed, e))

    threads = [threading.Thread(target=work, args=(s,)) for s in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors, errors
    res = dev.residency
    assert res.resident_bytes == sum(e.nbytes for e in res._entries.values())
    assert all(e.pins == 0 for e in res._entries.values())


@needs_vulkan
def test_size_zero_and_scalars(memory_path):
    dev = memory_path
    f = kf.jit(lambda x, w: x * w + 1, target="vulkan")
    x, w = torch.randn(0, 5), torch.randn(5)
    u = dev.uploads
    assert f(x, w).shape == (0, 5)
    g = kf.jit(lambda x: x.sum() * 2, target="vulkan")
    x = torch.randn(7)
    torch.testing.assert_close(g(x), x.sum() * 2)
    torch.testing.assert_close(g(x), x.sum() * 2)
    assert dev.uploads == u + 2  # w, then x once (nothing of x of size 0)


@needs_vulkan
def test_inference_mode_tensors(memory_path):
    """Inference tensors have no version counter: uploaded on every call, never stale;
    outputs made inside inference_mode are plain tensors, so they stay resident."""
    dev = memory_path
    bins, one, _ = ew_program(100)
    b = torch.rand(100)
    with torch.inference_mode():
        a = torch.randn(100)
        [y] = vulkan.run_program(one, bins, [a, b])
        a.add_(1)
        [y2] = vulkan.run_program(one, bins, [a, b])
        torch.testing.assert_close(y2, ew_ref(a, b))
        assert not y2.is_inference()
        u = dev.uploads
        vulkan.run_program(one, bins, [y2, b])
        assert dev.uploads == u


@needs_vulkan
def test_program_owned_buffer_in_and_out(memory_path):
    """A buffer a call owns, filled from bytes and read back after the kernels (what a
    flag the kernels set needs), beside tensors read and written."""
    dev = memory_path
    n = 64
    binary, k = compile_one(elementwise_kernel(n, "f32", 64))
    a, b = torch.randn(n), torch.rand(n)
    c = torch.full((n,), float("nan"))
    call = dev.call()
    flag = call.scratch(4 * n, fill=c.numpy().tobytes(), read_back=True)
    call.dispatch(kernel_abi(k, (1, 1, 1)), binary, [call.read(a), call.read(b), flag])
    call.finish()
    got = torch.frombuffer(bytearray(call.results[flag]), dtype=torch.float32)
    torch.testing.assert_close(got, ew_ref(a, b))


@needs_vulkan
def test_copy_rate_is_measured_on_the_device():
    dev = vulkan.device()
    if not dev.timestamps:
        pytest.skip("no timestamp queries")
    seconds = dev.copy_seconds(1 << 20, repeats=3)
    assert 0 < seconds < 1


@needs_vulkan
@pytest.mark.parametrize("elem", ["f32", "bf16", "i64"])
@pytest.mark.parametrize("staged", [False, True])
def test_one_element_views_with_any_stride(elem, staged, monkeypatch):
    """A one-element tensor is contiguous whatever its stride (torch ignores the strides of
    size-1 dims): ``x[::2]`` of a 2-element tensor has stride 2. Its bytes go up and come
    back down into it, through mapped memory and through staging buffers."""
    monkeypatch.setattr(vulkan.device(), "staged", staged)
    binary, k = compile_one(elementwise_kernel(1, elem, 32))
    gen = torch.Generator().manual_seed(7)
    base = [random((2,), elem, gen) for _ in range(3)]
    a, b, c = (t[::2] for t in base)
    assert a.is_contiguous() and a.stride() == (2,)
    untouched = base[2][1].clone()
    vulkan.launch(binary, kernel_abi(k, (1, 1, 1)), [a, b, c], written=[2])
    if elem == "i64":
        assert torch.equal(c, a * b + a)
    else:
        want = (a.float() * b.float() + a.float().exp()).to(TORCH[elem])
        torch.testing.assert_close(c.float(), want.float(), rtol=2e-2, atol=1e-5)
    assert torch.equal(base[2][1], untouched)  # the element beside the view is not written
