"""kf's fp8 scaling helpers on the CPU target (the same kf kernels run on CUDA): the amax
and quantize kernels against torch, delayed scaling's history, and an fp8 matmul step with
delayed-scaled operands through torch._scaled_mm."""

from __future__ import annotations

import pytest
import torch

import kf
from kf.fp8_scaling import FP8_MAX

E4M3, E5M2 = torch.float8_e4m3fn, torch.float8_e5m2


def _rel(a, b):
    a, b = a.double(), b.double()
    return ((a - b).norm() / b.norm()).item()


def test_amax_kernel_matches_torch():
    x = torch.randn(77, 131) * 3
    x[5, 7] = -41.0
    got = kf.fp8_amax(x, target="cpu")
    assert got.dtype == torch.float32 and got.shape == () and got.item() == 41.0


@pytest.mark.parametrize("dtype", [E4M3, E5M2])
def test_quantize_saturates_and_matches_torch(dtype):
    x = torch.randn(64, 96) * 10
    x[0, 0] = 1e9  # far past the range: saturates, never NaN
    s = torch.tensor(2.0)
    x8, inv = kf.fp8_quantize(x, s, dtype, target="cpu")
    want = (x * 2).clamp(-FP8_MAX[dtype], FP8_MAX[dtype]).to(dtype)
    assert x8.dtype == dtype and inv.item() == 0.5
    assert torch.equal(x8.view(torch.uint8), want.view(torch.uint8))
    assert x8[0, 0].float().item() == FP8_MAX[dtype]


def test_current_scale_uses_the_whole_range():
    x = torch.randn(300, 200) * 0.01  # tiny values: an unscaled cast would flush many to 0
    x8, inv = kf.fp8_quantize(x, target="cpu")
    assert x8.float().abs().max().item() == 448.0
    err = _rel(x8.float() * inv, x)
    unscaled = _rel(x.to(E4M3).float(), x)
    assert err < 0.04 and err < unscaled / 2, (err, unscaled)


def test_delayed_scaling_follows_the_history():
    ds = kf.DelayedScaling(E4M3, history=3, target="cpu")
    assert ds.scale().item() == 1.0  # nothing seen yet
    xs = [torch.randn(50, 40) * m for m in (1.0, 8.0, 2.0, 0.5, 0.25)]
    scales = []
    for x in xs:
        scales.append(ds.scale(x.device).item())
        ds.quantize(x)
    amaxes = [x.abs().max().item() for x in xs]
    # the scale at step t is 448 / max(amax of the last 3 steps before t)
    for t in range(1, len(xs)):
        window = amaxes[max(0, t - 3):t]
        assert scales[t] == pytest.approx(448.0 / max(window), rel=1e-6), t
    # after five steps the window is the last three: the x8 one has dropped out
    assert ds.scale().item() == pytest.approx(448.0 / max(amaxes[2:]), rel=1e-6)


def test_margin_and_e5m2():
    x = torch.randn(32, 32)
    a = x.abs().max().item()
    ds = kf.DelayedScaling(E5M2, history=4, margin=2, target="cpu")
    ds.record(x)
    assert ds.scale().item() == pytest.approx(57344.0 / (a * 4), rel=1e-6)
    st = ds.state_dict()
    other = kf.DelayedScaling(E5M2, history=4, margin=2, target="cpu")
    other.load_state_dict(st)
    assert other.scale().item() == ds.scale().item() and other.steps == 1


def test_bad_arguments():
    with pytest.raises(ValueError, match="float8"):
        kf.DelayedScaling(torch.bfloat16)
    with pytest.raises(ValueError, match="history"):
        kf.DelayedScaling(history=0)


def _scaled_matmul(a8, b8, inv_a, inv_b):
    return torch._scaled_mm(a8, b8.t(), inv_a, inv_b, out_dtype=torch.float32)


def test_fp8_matmul_steps_with_delayed_scaling():
    """A few steps of an fp8 GEMM whose operand a grows by up to 2x a step: with a margin of
    one binade for a, every product after the first step (no history yet) is within fp8's
    error of the f32 matmul; without it, a saturates the step it outgrows its history."""
    da, db = kf.DelayedScaling(margin=1, target="cpu"), kf.DelayedScaling(target="cpu")
    mm = kf.jit(_scaled_matmul, target="cpu")
    gen = torch.Generator().manual_seed(0)
    errs = []
    for step in range(5):
        a = torch.randn(96, 160, generator=gen) * (1 + step)
        b = torch.randn(112, 160, generator=gen) * 0.002
        a8, ia = da.quantize(a)
        b8, ib = db.quantize(b)
        errs.append(_rel(mm(a8, b8, ia, ib), a @ b.t()))
    # step 0 had no history: scale 1 leaves b's small values in e4m3's subnormals
    assert errs[0] > 2 * max(errs[1:]), errs
    assert max(errs[1:]) < 0.08, errs
