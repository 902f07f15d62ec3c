"""int8, uint8 and int16 tensors (kf-widen-integers, the narrow integers' loads and stores
in every lowering) against torch on fresh random inputs over each type's whole range,
on cpu and vulkan: arithmetic that wraps (127 + 1 in int8, 255 + 1 in uint8), uint8
unsigned in comparisons, division, shifts, reductions and casts to float, casts from
float (torch's truncation and wrap), type promotion with other types, kf's element-moving
ops and torch-mlir's ops on them, wraps fused into reductions; odd sizes (1, 7, 257),
size 0 and non-contiguous arguments; the CUDA kernels as PTX that ptxas assembles for
sm_90a."""

from __future__ import annotations

import os
import shutil

import pytest
import torch

import kf
from kf.runtime import vulkan

TARGETS = ["cpu", pytest.param("vulkan", marks=pytest.mark.skipif(not vulkan.is_available(),
                                                                   reason="no Vulkan device"))]
_PTXAS = shutil.which("ptxas") is not None or os.path.exists("/usr/local/cuda/bin/ptxas")
DTYPES = [torch.int8, torch.uint8, torch.int16]


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("KF_CACHE_DIR", str(tmp_path))


def _random(shape, dtype, seed, nonzero=False):
    """Values over dtype's whole range, its limits included."""
    g = torch.Generator().manual_seed(seed)
    info = torch.iinfo(dtype)
    x = torch.randint(info.min, info.max + 1, shape, generator=g, dtype=torch.int64)
    flat = x.view(-1)
    if flat.numel() >= 2:
        flat[0], flat[1] = info.max, info.min
    if nonzero:
        x[x == 0] = 1
    return x.to(dtype)


def _check(fn, args, target):
    got, want = kf.jit(fn, target=target)(*args), fn(*args)
    gots, wants = (got, want) if isinstance(want, tuple) else ((got,), (want,))
    for g, w in zip(gots, wants, strict=True):
        assert g.dtype == w.dtype and g.shape == w.shape, (g.dtype, w.dtype, g.shape, w.shape)
        if w.is_floating_point():
            torch.testing.assert_close(g, w, rtol=1e-5, atol=1e-5)
        else:
            assert torch.equal(g, w), (g, w)


OPS = {
    "add": lambda a, b: a + b, "sub": lambda a, b: a - b, "mul": lambda a, b: a * b, "neg": lambda a, b: -a,
    "abs": lambda a, b: a.abs(), "plus_one": lambda a, b: a + 1, "floor_divide": lambda a, b: a // b,
    "remainder": lambda a, b: a % b, "true_divide": lambda a, b: a / b, "compare": lambda a, b: (a < b, a >= b),
    "maximum": lambda a, b: torch.maximum(a, b), "where": lambda a, b: torch.where(a > b, a, b),
    "clamp": lambda a, b: a.clamp(-5, 100), "shifts": lambda a, b: (a << 3, a >> 2),
    "bitwise": lambda a, b: (a & b, a | b, a ^ b, ~a), "sign": lambda a, b: a.sign(),
    "to_float": lambda a, b: a.float() * 0.5, "to_long": lambda a, b: a.long() * 3, "to_bool": lambda a, b: a.bool(),
    "mixed": lambda a, b: a + b.to(torch.uint8), "with_int32": lambda a, b: a * b.int(),
    "sum": lambda a, b: a.sum(-1), "amax_amin": lambda a, b: (a.amax(-1), a.amin(0)), "argmax": lambda a, b: a.argmax(-1),
    "cumsum": lambda a, b: a.cumsum(-1), "sort": lambda a, b: a.sort(-1)[0], "prod": lambda a, b: a.prod(-1),
    "wrapped_sum": lambda a, b: (a + b).sum(-1), "wrapped_max": lambda a, b: (a * b).amax(-1),
    "wrapped_compare": lambda a, b: ((a + b) > 0).sum(-1), "wrapped_mean": lambda a, b: (a - b).float().mean(-1),
    "layout": lambda a, b: (a.t().contiguous(), a[:, 1::2], torch.cat([a, b], 0), a.t() + 1),
    "index": lambda a, b: (a.index_select(1, torch.tensor([0, 2, 2])), a.gather(1, torch.zeros(a.shape[0], 2,
                                                                                                 dtype=torch.long))),
    "matmul_float": lambda a, b: a.float() @ b.float().t(),
}


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("op", list(OPS))
def test_ops_match_torch(op, dtype, target):
    fn = OPS[op]
    for k, shape in enumerate([(5, 7), (1, 257)]):
        a, b = _random(shape, dtype, 2 * k), _random(shape, dtype, 2 * k + 1, nonzero=True)
        _check(fn, (a, b), target)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_wraparound_at_the_limits(dtype, target):
    info = torch.iinfo(dtype)
    x = torch.tensor([info.max, info.min, 0, 1, -1 if info.min else 200], dtype=dtype)
    got = kf.jit(lambda x: (x + 1, x - 1, x * 2, -x, (x + 1) > x), target=target)(x)
    want = (x + 1, x - 1, x * 2, -x, (x + 1) > x)
    for g, w in zip(got, want):
        assert g.dtype == w.dtype and torch.equal(g, w), (g, w)
    if dtype == torch.int8:
        assert got[0][0] == -128
    if dtype == torch.uint8:
        assert got[0][0] == 0 and not got[4][0]


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_casts_from_float_truncate_and_wrap(dtype, target):
    x = torch.cat([torch.randn(257, generator=torch.Generator().manual_seed(3)) * 400,
                   torch.tensor([-1.5, -3.7, 255.9, 256.5, 300.0, -129.0, 127.5, -0.5])])
    _check(lambda x: x.to(dtype), (x,), target)
    _check(lambda x: (x.to(dtype), x.to(dtype).float() / 3), (x,), target)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_empty_and_non_contiguous_arguments(dtype, target):
    a = _random((0, 3), dtype, 5)
    _check(lambda a: (a + 1, a.sum(-1), a.float()), (a,), target)
    a, b = _random((7, 257), dtype, 6), _random((257, 7), dtype, 7)
    _check(lambda a, b: (a + b, (a * b).sum(0)), (a[:, ::2], b.t()[:, ::2]), target)
    _check(lambda a: a * 3, (a.t(),), target)


@pytest.mark.parametrize("target", TARGETS)
def test_constants_and_promotion(target):
    u = _random((3,), torch.uint8, 8)
    _check(lambda u: u + torch.tensor([200, 100, 1], dtype=torch.uint8), (u,), target)
    _check(lambda u: (u + torch.tensor([-1, 5, 7], dtype=torch.int8), u * 2.5, u + 300), (u,), target)


def test_kf_ir_computes_in_i32():
    """After kf-widen-integers no kf op but a cast takes or makes a narrow integer."""
    info = kf.inspect(kf.jit(lambda a, b: (a + b) > 0), torch.ones(3, dtype=torch.uint8),
                      torch.ones(3, dtype=torch.uint8))
    linalg = info.stages["linalg"]
    assert "arith.extui" in linalg and "arith.trunci" in linalg and "arith.addi" in linalg
    assert "ui8" not in linalg


@pytest.mark.skipif(not _PTXAS, reason="no ptxas")
@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_cuda_ptx_assembles(dtype):
    """Without a GPU: the CUDA kernels load int8 and int16 sign-extended and uint8
    zero-extended, and ptxas assembles them for sm_90a."""
    from kf.passes.to_cuda import assemble

    a, b = _random((33, 64), dtype, 9), _random((33, 64), dtype, 10, nonzero=True)
    for fn in (lambda a, b: (a + b, a.float() * 0.5), lambda a, b: (a + b).sum(-1),
               lambda a, b: torch.where(a < b, a, b - a), lambda a, b: a.t() + 1):
        ptx = kf.inspect(kf.jit(fn, target="cuda", arch="sm_90a"), a, b).ptx
        bits = 16 if dtype == torch.int16 else 8
        signed = dtype != torch.uint8
        assert f"ld.global.{'s' if signed else 'u'}{bits}" in ptx or f"ld.global.b{bits}" in ptx \
            or f".v4.b32" in ptx or f".v2.b32" in ptx or ".b64" in ptx
        assemble(ptx, "sm_90a")
