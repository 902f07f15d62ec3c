"""Values made inside a function (compiler/aten/creation.py): arange, tril and triu
from kf.iota, so that they compile on every target and a mask made of them is computed
in the kernel that reads it; against torch on fresh random inputs, odd and empty sizes,
non-contiguous views, on cpu and vulkan, and as PTX for cuda."""

from __future__ import annotations

import re
import shutil

import pytest
import torch

import kf
from kf.runtime import vulkan

TARGETS = ["cpu", pytest.param("vulkan", marks=pytest.mark.skipif(not vulkan.is_available(),
                                                                   reason="no Vulkan device"))]
needs_ptxas = pytest.mark.skipif(shutil.which("ptxas") is None and not __import__("os").path.exists(
    "/usr/local/cuda/bin/ptxas"), reason="needs ptxas")


def _tensor(shape, dtype, gen):
    if dtype == torch.bool:
        return torch.rand(shape, generator=gen) > 0.5
    if dtype.is_floating_point:
        return torch.randn(shape, generator=gen).to(dtype)
    return torch.randint(-100, 100, shape, generator=gen, dtype=dtype)


def tril(x):
    return torch.tril(x) * 1


def triu_above(x):
    return torch.triu(x, diagonal=2)


def tril_below(x):
    return x.tril(-3)


def triu_neg(x):
    return torch.triu(x, diagonal=-1)


def masked_by_ones_tril(x):
    rows, cols = x.shape[-2:]
    return x.masked_fill(torch.ones(rows, cols).tril() == 0, -1e9)


def masked_by_bool_triu(x):
    rows, cols = x.shape[-2:]
    return x.masked_fill(torch.triu(torch.ones(rows, cols, dtype=torch.bool), diagonal=1), float("-inf"))


def masked_by_arange(x):
    rows, cols = x.shape[-2:]
    keep = torch.arange(rows)[:, None] >= torch.arange(cols)[None, :]
    return torch.where(keep, x, torch.zeros_like(x))


def plus_arange(x):
    return x + torch.arange(x.shape[-1], dtype=x.dtype) * 2


def plus_arange_start_step(x):
    return x * torch.arange(3, 3 + 5 * x.shape[-1], 5).to(x.dtype)


TRIANGLES = [tril, triu_above, tril_below, triu_neg, masked_by_ones_tril, masked_by_bool_triu, masked_by_arange]
SHAPES = [(1, 1), (7, 7), (5, 257), (2, 3, 7, 5), (257, 3), (0, 4), (3, 0)]


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("shape", SHAPES, ids=str)
@pytest.mark.parametrize("fn", TRIANGLES + [plus_arange, plus_arange_start_step], ids=lambda f: f.__name__)
def test_index_made_values_follow_torch(fn, shape, target):
    gen = torch.Generator().manual_seed(sum(shape) + len(fn.__name__))
    x = _tensor(shape, torch.float32, gen)
    got = kf.jit(fn, target=target)(x)
    torch.testing.assert_close(got, fn(x), rtol=0, atol=0)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16, torch.float64, torch.int64, torch.int32, torch.bool],
                         ids=str)
@pytest.mark.parametrize("fn", [tril, triu_above, triu_neg], ids=lambda f: f.__name__)
def test_tril_triu_every_dtype(fn, dtype, target):
    if target == "vulkan" and dtype == torch.float64:
        pytest.skip("kf's SPIR-V back end stores no f64")
    gen = torch.Generator().manual_seed(7)
    x = _tensor((3, 7, 9), dtype, gen)
    f = (lambda x: torch.triu(x, diagonal=2)) if fn is triu_above and dtype == torch.bool else fn
    got = kf.jit(f, target=target)(x)
    assert got.dtype == f(x).dtype
    torch.testing.assert_close(got, f(x), rtol=0, atol=0)


@pytest.mark.parametrize("target", TARGETS)
def test_non_contiguous_input(target):
    x = torch.randn(9, 13).t()  # 13 x 9, strides (1, 13)
    y = torch.randn(4, 6, 10)[:, ::2, 1:8]
    for fn, arg in ((tril, x), (triu_above, x), (masked_by_ones_tril, y)):
        torch.testing.assert_close(kf.jit(fn, target=target)(arg), fn(arg), rtol=0, atol=0)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("dtype", [torch.int64, torch.int32, torch.float32, torch.float16, torch.bfloat16], ids=str)
def test_arange_values(dtype, target):
    """Integer bounds: kf.iota (exact in every type up to its largest exact integer);
    float bounds stay a constant (torch steps in double)."""
    def fn(x):
        ints = torch.arange(x.shape[0], dtype=dtype) + torch.arange(-7, 3 * x.shape[0] - 7, 3, dtype=dtype)
        if dtype.is_floating_point:
            return ints, torch.arange(0.5, x.shape[0] / 2, 0.5, dtype=dtype)
        return (ints,)

    x = torch.empty(23)
    for got, want in zip(kf.jit(fn, target=target)(x), fn(x)):
        torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_integer_arange_is_iota_not_a_constant():
    info = kf.inspect(kf.jit(plus_arange, target="cpu"), torch.randn(4, 300))
    ir = str(info.kf_ir)
    assert '"kf.iota"' in ir and "kf.constant" not in ir


def test_tril_of_a_vector_is_a_clear_error():
    with pytest.raises(kf.CompileError) as e:
        kf.jit(lambda x: torch.tril(x), target="cpu")(torch.randn(5))
    assert "test_creation.py" in str(e.value)


@pytest.mark.parametrize("fn", [masked_by_ones_tril, masked_by_bool_triu, masked_by_arange], ids=lambda f: f.__name__)
def test_mask_is_computed_where_it_is_read(fn):
    """The mask made of indices becomes no kernel and no buffer of its own: one kernel
    whose only input is x."""
    info = kf.inspect(kf.jit(fn, target="vulkan"), torch.randn(37, 41))
    fused = str(info.stages["fused"])
    calls = re.findall(r"call @(\w+)\((.*?)\)", fused)
    assert len(calls) == 1 and calls[0][1] == "%arg0", calls


# ---------------------------------------------------------------- attention, mask made inside


def attention_tril(q, k, v):
    s = q.shape[-2]
    scores = torch.matmul(q, k.transpose(-2, -1)) / (q.shape[-1] ** 0.5)
    mask = torch.ones(s, s, device=q.device).tril()
    scores = scores.masked_fill(mask == 0, -1e9)
    return torch.matmul(torch.softmax(scores, dim=-1), v)


def attention_triu(q, k, v):
    s = q.shape[-2]
    scores = torch.matmul(q, k.transpose(-2, -1)) / (q.shape[-1] ** 0.5)
    dead = torch.triu(torch.ones(s, s, dtype=torch.bool, device=q.device), diagonal=1)
    return torch.matmul(torch.softmax(scores.masked_fill(dead, -1e9), dim=-1), v)


def attention_triu_t(q, k, v):
    s = q.shape[-2]
    scores = torch.matmul(q, k.transpose(-2, -1)) / (q.shape[-1] ** 0.5)
    mask = torch.triu(torch.ones(s, s, device=q.device)).T  # the lower triangle, transposed
    return torch.matmul(torch.softmax(scores.masked_fill(mask == 0, -1e9), dim=-1), v)


MADE_INSIDE = [attention_tril, attention_triu, attention_triu_t]


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("seq", [1, 7, 65])
@pytest.mark.parametrize("fn", MADE_INSIDE, ids=lambda f: f.__name__)
def test_attention_with_mask_made_inside(fn, seq, target):
    gen = torch.Generator().manual_seed(seq)
    q, k, v = (torch.randn(2, 3, seq, 16, generator=gen) for _ in range(3))
    got = kf.jit(fn, target=target)(q, k, v)
    want = fn(q.double(), k.double(), v.double())
    torch.testing.assert_close(got.double(), want, rtol=1e-5, atol=1e-5)


def test_attention_with_mask_made_inside_is_one_attention_kernel_on_vulkan():
    q, k, v = (torch.randn(1, 2, 64, 32) for _ in range(3))
    fused = str(kf.inspect(kf.jit(attention_tril, target="vulkan"), q, k, v).stages["fused"])
    calls = re.findall(r"call @(\w+)\((.*?)\)", fused)
    assert len(calls) == 1 and calls[0][0].endswith("_attention") and calls[0][1].count("%arg") == 3, calls


@needs_ptxas
@pytest.mark.parametrize("fn", MADE_INSIDE, ids=lambda f: f.__name__)
def test_attention_with_mask_made_inside_on_sm90a(fn):
    """The causal mask made by ``torch.ones(S, S).tril()`` or ``torch.triu`` compiles to
    the kernels the mask given as a tensor does on sm_90a -- the block table and the
    attention kernel that walks its live blocks -- reading no mask from memory: both
    kernels take q, k, v alone (the table and the output after them)."""
    import seed_examples

    q, k, v = (torch.randn(2, 4, 512, 128).to(torch.bfloat16) for _ in range(3))
    mask = torch.tril(torch.ones(512, 512)).to(torch.bfloat16)
    given = kf.inspect(seed_examples.fused_attention.with_options(target="cuda"), q, k, v, mask).stages["ptx"]
    made = kf.inspect(kf.jit(fn, target="cuda"), q, k, v).stages["ptx"]

    def entries(ptx):
        return [re.sub(r"^\w+?_k0_", "", e) for e in re.findall(r"\.entry (\w+)", ptx)]

    assert entries(made) == entries(given) == ["attention_blocks", "attention"]
    # each kernel takes one parameter less than with the mask given (the mask's memref)
    given_params = [b.count(".param") for b in re.findall(r"\.entry \w+\((.*?)\)", given, re.S)]
    made_params = [b.count(".param") for b in re.findall(r"\.entry \w+\((.*?)\)", made, re.S)]
    assert all(m < g for m, g in zip(made_params, given_params)), (made_params, given_params)
    assert "bar.red.or" in made  # the block-skip path


@pytest.mark.parametrize("target", TARGETS)
def test_triangle_indices_are_constants(target):
    def fn(x):
        i = torch.triu_indices(5, 7, 1)
        j = torch.tril_indices(4, 3, -1)
        return x[i[0], i[1]], j, torch.triu_indices(3, 3, dtype=torch.int32)

    x = torch.randn(5, 7)
    for g, w in zip(kf.jit(fn, target=target)(x), fn(x), strict=True):
        assert g.dtype == w.dtype and torch.equal(g, w)


@pytest.mark.parametrize("target", TARGETS)
def test_masks_from_an_int64_arange_compare_as_torch(target):
    """A mask from comparing ``torch.arange(n)`` (int64) with a number, made in the
    function, broadcast against a tensor: every element masked as torch does (on
    lavapipe a sign-extended index compared as int64 came out true everywhere)."""
    g = torch.randn(2, 8, 32, generator=torch.Generator().manual_seed(5))
    cases = [lambda g: torch.where((torch.arange(8) >= 3).unsqueeze(-1), g, 0.0),
             lambda g: torch.where((torch.arange(8) < 5)[:, None], g[0], 0.0),
             lambda g: g * ((torch.arange(8) >= 0) & (torch.arange(8) < 64) & (torch.arange(8) != 4)).unsqueeze(-1),
             lambda g: torch.where(torch.arange(8) >= 3, g[0, :, 0], 0.0)]
    for fn in cases:
        torch.testing.assert_close(kf.jit(fn, target=target)(g), fn(g), rtol=0, atol=0)
