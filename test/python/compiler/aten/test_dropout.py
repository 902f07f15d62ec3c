"""The dropout family and rrelu (compiler/aten/dropout.py) on cpu and vulkan: in
evaluation (or p = 0, 1, or no elements) against torch exactly; in training by what
must hold of any draw (a channel dropped whole, the two values alpha dropout gives,
slopes within [lower, upper)), by the draw's statistics, and by torch.manual_seed
reproducing it."""

from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

import kf
from kf.runtime import vulkan

TARGETS = ["cpu", pytest.param("vulkan", marks=pytest.mark.skipif(not vulkan.is_available(),
                                                                   reason="no Vulkan device"))]
SELU_ALPHA = 1.7580993408473766


def _run(fn, target, *args):
    return kf.jit(fn, target=target)(*args)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("fn", [
    lambda x: F.dropout2d(x, 0.4, training=False),
    lambda x: F.dropout3d(x.unsqueeze(-1), 0.4, training=False),
    lambda x: F.alpha_dropout(x, 0.3, training=False),
    lambda x: F.feature_alpha_dropout(x, 0.3, training=False),
    lambda x: F.dropout2d(x, 0.0, training=True),
    lambda x: F.alpha_dropout(x, 0.0, training=True),
    lambda x: F.dropout2d(x, 1.0, training=True),
    lambda x: F.feature_alpha_dropout(x, 1.0, training=True),
    lambda x: F.rrelu(x, training=False),
    lambda x: F.rrelu(x, 0.05, 0.6, training=False),
], ids=["dropout2d-eval", "dropout3d-eval", "alpha-eval", "feature-alpha-eval", "dropout2d-p0", "alpha-p0",
        "dropout2d-p1", "feature-alpha-p1", "rrelu-eval", "rrelu-eval-bounds"])
@pytest.mark.parametrize("shape", [(1, 1, 1, 1), (3, 7, 5, 2), (2, 257, 3, 1), (0, 4, 2, 3)])
def test_deterministic_cases_match_torch(target, fn, shape):
    x = torch.randn(shape, generator=torch.Generator().manual_seed(sum(shape)))
    if x.numel():
        x.view(-1)[0] = float("nan")  # p = 1 multiplies by 0: NaN stays NaN, as in eager
    torch.testing.assert_close(_run(fn, target, x), fn(x), equal_nan=True)


@pytest.mark.parametrize("target", TARGETS)
def test_non_contiguous_input_in_evaluation(target):
    x = torch.randn(6, 5, 4, 3).transpose(0, 2)
    fn = lambda x: F.rrelu(x, training=False) + F.dropout2d(x, 0.5, training=False)  # noqa: E731
    torch.testing.assert_close(_run(fn, target, x), fn(x))


@pytest.mark.parametrize("target", TARGETS)
def test_feature_dropout_drops_whole_channels(target):
    p = 0.3
    x = torch.rand(64, 32, 5, 7) + 0.5  # no zeros of its own
    out = _run(lambda x: F.dropout2d(x, p, training=True), target, x)
    dropped = out == 0
    whole = dropped.all(-1).all(-1)
    assert torch.equal(dropped.any(-1).any(-1), whole), "a channel was dropped in part"
    kept = ~whole
    torch.testing.assert_close(out[kept], x[kept] / (1 - p))
    assert abs(whole.float().mean().item() - p) < 0.05  # 2048 channels: 5 sigma is 0.05


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("feature", [False, True])
def test_alpha_dropout_keeps_mean_and_variance(target, feature):
    p = 0.2
    x = torch.randn(128, 64, 40, 1)
    fn = (lambda x: F.feature_alpha_dropout(x, p, training=True)) if feature else \
        (lambda x: F.alpha_dropout(x, p, training=True))
    out = _run(fn, target, x)
    a = 1.0 / math.sqrt((SELU_ALPHA ** 2 * p + 1) * (1 - p))
    low = SELU_ALPHA * a * (p - 1)
    kept_value = a * x + SELU_ALPHA * a * p
    is_dropped = torch.isclose(out, torch.full_like(out, low), rtol=0, atol=1e-6)
    assert torch.allclose(out[~is_dropped], kept_value[~is_dropped], atol=1e-5)
    if feature:
        per_channel = is_dropped.float().mean(-1)
        assert ((per_channel == 0) | (per_channel == 1)).float().mean() > 0.999  # a kept value can equal low
    assert abs(is_dropped.float().mean().item() - p) < 0.03
    # SELU's self-normalizing property: a standard normal input keeps mean 0 and variance 1
    assert abs(out.mean().item()) < 0.05 and abs(out.var().item() - 1) < 0.1


@pytest.mark.parametrize("target", TARGETS)
def test_rrelu_training_slopes(target):
    lower, upper = 0.1, 0.3
    x = torch.randn(200, 301)
    out = _run(lambda x: F.rrelu(x, lower, upper, training=True), target, x)
    pos = x > 0
    assert torch.equal(out[pos], x[pos])
    slope = out[~pos] / x[~pos]
    assert slope.min() >= lower - 1e-6 and slope.max() < upper + 1e-6
    assert abs(slope.mean().item() - (lower + upper) / 2) < 0.005
    assert slope.std() > 0.05  # one sample per element, not one slope for all


@pytest.mark.parametrize("target", TARGETS)
def test_the_seed_reproduces_a_draw(target):
    fn = kf.jit(lambda x: F.dropout2d(x, 0.5, training=True) + F.rrelu(x, training=True), target=target)
    x = torch.randn(8, 16, 3, 3)
    torch.manual_seed(3)
    first = fn(x)
    second = fn(x)
    torch.manual_seed(3)
    again = fn(x)
    assert torch.equal(first, again) and not torch.equal(first, second)


def test_feature_dropout_of_one_dimension_is_refused():
    with pytest.raises(kf.CompileError, match="at least 2 dimensions"):
        kf.jit(lambda x: torch.feature_dropout(x, 0.5, True), target="cpu")(torch.randn(5))
