"""Random numbers in kf functions (kf/compiler/random_state.py): dropout, rand, randn and
bernoulli draw a fresh Philox state from torch's generator at each call, so
torch.manual_seed reproduces a call, two calls differ, and every target and the
interpreter compute the same numbers from one state. The CUDA cases run where a GPU
is (the H200); here the PTX is assembled with ptxas."""

import math

import pytest
import torch
import torch.nn.functional as F

import kf
from kf import random_state
from kf.dialects import philox
from kf.runtime import vulkan

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
TARGETS = ["cpu",
           pytest.param("vulkan", marks=pytest.mark.skipif(not vulkan.is_available(),
                                                           reason="no Vulkan device (install mesa-vulkan-drivers)")),
           pytest.param("cuda", marks=needs_cuda)]


def _device(target: str) -> str:
    return "cuda" if target == "cuda" else "cpu"


def dropout(x, p):
    return F.dropout(x, p, training=True)


def _drop(target):
    return kf.jit(dropout, target=target)


def _mask(seed: int, shape, p: float, device: str = "cpu") -> torch.Tensor:
    """The keep mask a call after torch.manual_seed(seed) computes: the reference."""
    torch.manual_seed(seed)
    state = random_state.draw(device)
    return random_state.samples(state, 0, shape) > p


def _within(count: int, n: int, q: float, sigmas: float = 6.0) -> bool:
    """count is a plausible Binomial(n, q) draw."""
    return abs(count - n * q) <= sigmas * math.sqrt(n * q * (1 - q))


def test_dropout_is_not_the_identity():
    y = kf.jit(lambda x: F.dropout(x, 0.5, training=True), target="cpu")(torch.ones(1000))
    assert set(y.unique().tolist()) == {0.0, 2.0}


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("p", [0.1, 0.5, 0.9])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_dropout_rate_and_scale(target, p, dtype):
    n = 1 << 18
    x = (torch.rand(n) + 0.5).to(dtype).to(_device(target))  # no zeros: a 0 output is a dropped element
    y = _drop(target)(x, p)
    assert y.dtype == dtype and y.shape == x.shape
    kept = y != 0
    assert _within(int(kept.sum()), n, 1 - p), (int(kept.sum()), n * (1 - p))
    # kept: x / (1 - p) computed in f32 and rounded once, as torch's native_dropout does
    scale = torch.tensor(1.0 / (1.0 - p), dtype=torch.float32, device=x.device)
    assert torch.equal(y[kept], (x[kept].float() * scale).to(dtype))


@pytest.mark.parametrize("target", TARGETS)
def test_manual_seed_reproduces_and_calls_differ(target):
    f = _drop(target)
    x = torch.randn(4096, device=_device(target))
    torch.manual_seed(1234)
    first, second = f(x, 0.5), f(x, 0.5)
    torch.manual_seed(1234)
    again = f(x, 0.5)
    assert torch.equal(first, again)
    assert not torch.equal(first != 0, second != 0)
    torch.manual_seed(1235)
    assert not torch.equal(f(x, 0.5) != 0, first != 0)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("shape", [(1,), (257,), (3, 5, 7), (4, 64)])
def test_targets_and_interpreter_draw_the_reference(target, shape):
    # every target and the interpreter compute kf.rand's definition from one state (rows
    # of 64: GPU lanes that share Philox blocks; the others: a block per element)
    dev = _device(target)
    x = torch.randn(shape, device=dev)
    want = _mask(7, shape, 0.3, dev)
    torch.manual_seed(7)
    got = _drop(target)(x, 0.3)
    torch.manual_seed(7)
    interpreted = kf.jit(dropout, target=target, interpret=True)(x, 0.3)
    assert torch.equal(got != 0, want) and torch.equal(interpreted, got)
    assert torch.equal(got[want], (x[want] * torch.tensor(1 / 0.7, dtype=torch.float32, device=dev)))


@pytest.mark.parametrize("target", TARGETS)
def test_non_contiguous_and_empty_inputs(target):
    dev = _device(target)
    f = _drop(target)
    x = torch.randn(40, 32, device=dev).t()  # the mask follows the logical (row-major) order
    torch.manual_seed(3)
    y = f(x, 0.25)
    assert torch.equal(y != 0, _mask(3, (32, 40), 0.25, dev))
    empty = f(torch.randn(0, 5, device=dev), 0.25)
    assert empty.shape == (0, 5)


@pytest.mark.parametrize("target", TARGETS)
def test_dropout_without_randomness(target):
    dev = _device(target)
    x = torch.randn(33, device=dev)
    f = _drop(target)
    torch.manual_seed(0)
    assert torch.equal(f(x, 0.0), x)
    assert torch.equal(kf.jit(lambda x: F.dropout(x, 0.5, training=False), target=target)(x), x)
    assert torch.equal(kf.jit(lambda x: torch.nn.Dropout(0.5).eval()(x), target=target)(x), x)
    # nothing was drawn: the generator is where manual_seed left it
    assert torch.equal(torch.rand(4, device=dev), (torch.manual_seed(0), torch.rand(4, device=dev))[1])
    zeros = f(x, 1.0)
    assert torch.equal(zeros, torch.zeros_like(x))
    if target == "cpu":  # eager multiplies by zero (Vulkan drivers may fold inf * 0 to 0)
        inf = f(torch.tensor([float("inf"), 1.0]), 1.0)
        assert inf[0].isnan() and inf[1] == 0


@pytest.mark.parametrize("target", TARGETS)
def test_module_and_torch_dropout(target):
    dev = _device(target)
    block = torch.nn.Sequential(torch.nn.Dropout(0.2))

    def fn(x):
        return block(x) + torch.dropout(x, 0.6, True)

    x = torch.rand(2, 3000, device=dev) + 1
    torch.manual_seed(11)
    y = kf.jit(fn, target=target)(x)
    # two dropouts, on consecutive counters: blocks from 0 and from 6000 / 4
    torch.manual_seed(11)
    state = random_state.draw(dev)
    k1 = random_state.samples(state, 0, x.shape) > 0.2
    k2 = random_state.samples(state, x.numel() // 4, x.shape) > 0.6
    one = torch.tensor(1.0, device=dev)
    want = x * torch.where(k1, one / 0.8, 0.0) + x * torch.where(k2, one / 0.4, 0.0)
    torch.testing.assert_close(y, want, rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize("target", TARGETS)
def test_rand_randn_bernoulli(target):
    n = 1 << 16

    def fn(x):
        return (torch.rand_like(x), torch.randn_like(x), torch.bernoulli(x), x.bernoulli(0.25),
                torch.rand(3, 5, device=x.device))

    x = torch.full((n,), 0.7, device=_device(target))
    u, z, b, b25, r = kf.jit(fn, target=target)(x)
    assert u.dtype == torch.float32 and r.shape == (3, 5)
    assert (u >= 0).all() and (u < 1).all()
    for k in range(10):  # each decile holds a tenth
        assert _within(int(((u >= k / 10) & (u < (k + 1) / 10)).sum()), n, 0.1)
    assert abs(z.mean().item()) < 6 / math.sqrt(n) and abs(z.std().item() - 1) < 6 / math.sqrt(2 * n)
    assert _within(int((z.abs() < 1).sum()), n, math.erf(1 / math.sqrt(2)))
    assert set(b.unique().tolist()) <= {0.0, 1.0} and _within(int(b.sum()), n, 0.7)
    assert _within(int(b25.sum()), n, 0.25)
    # five random ops, five counter ranges: no two draw the same numbers
    assert not torch.equal(u[:15], r.flatten())


@pytest.mark.parametrize("target", TARGETS)
def test_low_precision_uniform_stays_below_one(target):
    # rounding to bf16 takes samples above 1 - 2^-9 to 1.0; those become 0 (torch does so)
    x = torch.empty(1 << 16, dtype=torch.bfloat16, device=_device(target))
    u = kf.jit(lambda x: torch.rand_like(x), target=target)(x)
    assert u.dtype == torch.bfloat16 and (u >= 0).all() and (u < 1).all()


def philox_pair(state, n: int, m: int):
    return (torch.ops.kf.philox_rand(state, 5, [n, m], "uniform"),
            torch.ops.kf.philox_rand(state, 16, [n, m], "normal"))


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("seed,offset", [(123, 0), (-7, (1 << 32) - 2), (2 ** 63 - 1, -3)])
@pytest.mark.parametrize("n,m", [(1, 11), (6, 8)])
def test_compiled_blocks_match_the_definition(target, seed, offset, n, m):
    # an explicit state (what a generated backward passes): counters that carry into the
    # high word and wrap, a negative seed; rows of 11 (a block per element) and of 8 (GPU
    # lanes sharing blocks); uniform exactly, normal to f32 rounding
    state = torch.tensor([seed, offset], dtype=torch.int64, device=_device(target))
    u, z = kf.jit(philox_pair, target=target)(state, n, m)
    want_u = [philox.sample(seed, offset + 5, i) for i in range(n * m)]
    want_z = [philox.sample(seed, offset + 16, i, "normal") for i in range(n * m)]
    assert torch.equal(u.flatten().cpu(), torch.tensor(want_u, dtype=torch.float32))
    torch.testing.assert_close(z.flatten().double().cpu(), torch.tensor(want_z, dtype=torch.float64),
                               rtol=1e-5, atol=2e-6)


@needs_cuda
def test_cuda_graph_replays_draw_fresh_masks():
    # the state is drawn by a torch kernel, which a CUDA graph replays with the
    # generator's advancing offset: each replay drops other elements
    f = _drop("cuda")
    x = torch.randn(1 << 16, device="cuda")
    f(x, 0.5)  # compile and warm up outside the capture
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        y = f(x, 0.5)
    graph.replay()
    first = (y != 0).clone()
    graph.replay()
    assert not torch.equal(first, y != 0)
    assert _within(int(first.sum()), x.numel(), 0.5)


def test_random_ops_kf_cannot_replay_are_errors():
    # torch-mlir's random ops keep a seed of their own (torch.manual_seed would not
    # reproduce them): kf refuses them at the user's line
    with pytest.raises(kf.UnsupportedOpError, match="draws random numbers") as err:
        kf.jit(lambda x: torch.poisson(x.abs()), target="cpu")(torch.randn(2, 3, 4, 4))
    assert err.value.loc is not None and err.value.loc.file == __file__
    g = torch.Generator().manual_seed(0)
    with pytest.raises(kf.CompileError):  # a generator of its own: not kf's to draw from
        kf.jit(lambda x: x + torch.rand(x.shape, generator=g), target="cpu")(torch.randn(3))


def test_inplace_dropout_of_an_intermediate():
    """dropout_ on a tensor the function made is functionalized like the out-of-place op:
    every kept element is scaled by 1 / (1 - p), the argument is left alone, and the
    same seed draws the same mask."""
    f = kf.jit(lambda x: F.dropout(x * 2, 0.5, True, inplace=True), target="cpu")
    x = torch.randn(257) + 3
    before = x.clone()
    torch.manual_seed(1)
    a = f(x)
    torch.manual_seed(1)
    b = f(x)
    assert torch.equal(x, before) and torch.equal(a, b)
    kept = a != 0
    assert 0 < int(kept.sum()) < 257
    torch.testing.assert_close(a[kept], (x * 4)[kept])


def test_the_state_is_an_input_of_the_program():
    info = kf.inspect(kf.jit(dropout, target="cpu"), torch.randn(8), 0.5)
    assert '%arg1: tensor<2xi64> {kf.name = "kf.random_state"}' in info.kf_ir
    assert 'kf.rand"(%arg1) {distribution = "uniform", offset = 0 : i64}' in info.kf_ir
    # one program serves every call (the state is not baked in): a second call compiles nothing
    f = kf.jit(dropout, target="cpu")
    f(torch.randn(8), 0.5)
    assert len(f._table) == 1
    f(torch.randn(8), 0.5)
    assert len(f._table) == 1


def test_cuda_ptx_assembles():
    from kf.passes import to_cuda

    if to_cuda.ptxas_path() is None:
        pytest.skip("ptxas not found (no CUDA toolkit here)")

    def fn(x):
        return F.dropout(x, 0.1, training=True) + torch.randn_like(x)

    for dtype in (torch.float32, torch.bfloat16):
        ptx = kf.inspect(kf.jit(fn, target="cuda"), torch.randn(4, 257, dtype=dtype)).ptx
        assembled = to_cuda.assemble(ptx, "sm_90a")
        for entry, report in assembled.kernels.items():
            assert report["spill_store_bytes"] == 0 and report["stack_bytes"] == 0, (entry, report)
        # the Philox products stay 32-bit: no 64-bit multiply of widened words
        assert "mul.hi.u32" in ptx and "mul.lo.s64" not in ptx
