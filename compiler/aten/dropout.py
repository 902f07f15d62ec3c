"""Handlers of the dropout family and the randomized leaky ReLU: dropout and
native_dropout (the mask autograd saves), feature dropout (one draw per channel,
``dropout2d``/``dropout3d``), alpha dropout and feature alpha dropout (SELU's, which keep
the mean and variance), and rrelu. Their numbers come from the program's Philox state
(``Converter.rand``), so torch.manual_seed reproduces them and a backward recomputes
the same mask.

Each follows eager's arithmetic: the kept values are multiplied by a scale (a dropped
one by 0, so a NaN stays NaN), computed in f32 (f64 for f64 tensors) and rounded once."""

from __future__ import annotations

import math

from mlir import ir

from kf.dialects import builders as kb
from kf.dialects import spec_of

from ..errors import Unsupported
from .core import Converter, handles, shape_of

#: SELU's alpha (torch's ``_dropout_impl``): the negative saturation alpha dropout
#: drops to
_SELU_ALPHA = 1.7580993408473766


def _probability(p, what: str) -> float:
    p = float(p)
    if not 0.0 <= p <= 1.0:
        raise Unsupported(f"{what} probability has to be between 0 and 1, but got {p}")
    return p


def _compute_elem(x: ir.Value, what: str) -> tuple[str, str]:
    """(x's element type, the type the scale is computed in); floats only."""
    elem = spec_of(x.type).elem
    if not spec_of(x.type).is_float:
        raise Unsupported(f"{what} of a tensor of {elem}: torch drops out floating-point tensors only")
    return elem, "f64" if elem == "f64" else "f32"


def _keep(c: Converter, shape, p: float) -> ir.Value:
    """A mask of shape that is true with probability 1 - p (uniform sample > p)."""
    return kb.cmp(c.rand(shape), kb.scalar(p, "f32"), predicate="gt")


def _dropped(c: Converter, x: ir.Value, p: float) -> tuple[ir.Value, ir.Value]:
    """(x where its uniform sample is > p, scaled by 1 / (1 - p), and zero elsewhere;
    the keep mask); 0 < p < 1."""
    elem, ce = _compute_elem(x, "dropout")
    keep = _keep(c, shape_of(x), p)
    scale = kb.select(keep, kb.scalar(1.0 / (1.0 - p), ce), kb.scalar(0.0, ce))
    return c.tensor(kb.mul(c.tensor(x, ce), scale), elem), keep


def _arguments(args, kwargs, what: str) -> tuple[ir.Value, float, object]:
    x = args[0]
    p = _probability(args[1] if len(args) > 1 else kwargs["p"], what)
    train = args[2] if len(args) > 2 else kwargs.get("train")
    return x, p, train


def _zeroed(c: Converter, x: ir.Value) -> ir.Value:
    """x * 0: what eager gives for p = 1 (NaN stays NaN), drawing nothing."""
    return kb.mul(x, c.tensor(0.0, spec_of(x.type).elem))


@handles("aten.dropout.default")
def _dropout(c, node, args, kwargs):
    x, p, train = _arguments(args, kwargs, "dropout")
    if not train or p == 0.0 or math.prod(shape_of(x)) == 0:
        return x
    if p == 1.0:
        return _zeroed(c, x)
    return _dropped(c, x, p)[0]


@handles("aten.native_dropout.default")
def _native_dropout(c, node, args, kwargs):
    x, p, train = _arguments(args, kwargs, "dropout")
    shape = shape_of(x)
    if train is False or p == 0.0 or math.prod(shape) == 0:  # None trains, as in eager
        return x, kb.fill(shape, "i1", 1.0)
    if p == 1.0:
        return _zeroed(c, x), kb.fill(shape, "i1", 0.0)
    return _dropped(c, x, p)


def _noise_shape(x: ir.Value, feature: bool, what: str) -> tuple[int, ...]:
    """The shape of one draw: x's, or (N, C, 1, ...) for feature dropout (a channel is
    dropped whole)."""
    shape = shape_of(x)
    if not feature:
        return shape
    if len(shape) < 2:
        raise Unsupported(f"{what} needs at least 2 dimensions in the input, got {len(shape)}")
    return (shape[0], shape[1]) + (1,) * (len(shape) - 2)


def _dropout_kind(feature: bool, alpha: bool):
    what = f"{'feature ' if feature else ''}{'alpha ' if alpha else ''}dropout"

    def handler(c, node, args, kwargs):
        x, p, train = _arguments(args, kwargs, what)
        if not train or p == 0.0 or math.prod(shape_of(x)) == 0:
            return x
        if p == 1.0:
            return _zeroed(c, x)
        elem, ce = _compute_elem(x, what)
        keep = _keep(c, _noise_shape(x, feature, what), p)
        if not alpha:
            scale = kb.select(keep, kb.scalar(1.0 / (1.0 - p), ce), kb.scalar(0.0, ce))
            return c.tensor(kb.mul(c.tensor(x, ce), scale), elem)
        # kept: a x + alpha a p; dropped: x 0 + alpha a (p - 1) (the SELU saturation,
        # shifted and scaled so that the mean and variance stay those of x)
        a = 1.0 / math.sqrt((_SELU_ALPHA * _SELU_ALPHA * p + 1.0) * (1.0 - p))
        scale = kb.select(keep, kb.scalar(a, ce), kb.scalar(0.0, ce))
        shift = kb.select(keep, kb.scalar(_SELU_ALPHA * a * p, ce), kb.scalar(_SELU_ALPHA * a * (p - 1.0), ce))
        return c.tensor(kb.add(kb.mul(c.tensor(x, ce), scale), shift), elem)

    return handler


handles("aten.feature_dropout.default")(_dropout_kind(feature=True, alpha=False))
handles("aten.alpha_dropout.default")(_dropout_kind(feature=False, alpha=True))
handles("aten.feature_alpha_dropout.default")(_dropout_kind(feature=True, alpha=True))


@handles("aten.rrelu.default")
def _rrelu(c, node, args, kwargs):
    """x where x > 0 (training: x >= 0), else x times a slope: (lower + upper) / 2 in
    evaluation, a uniform sample of [lower, upper) per element in training."""
    x = args[0]
    lower = float(args[1] if len(args) > 1 else kwargs.get("lower", 1.0 / 8.0))
    upper = float(args[2] if len(args) > 2 else kwargs.get("upper", 1.0 / 3.0))
    training = bool(args[3] if len(args) > 3 else kwargs.get("training", False))
    if (args[4] if len(args) > 4 else kwargs.get("generator")) is not None:
        raise Unsupported("rrelu with a generator of its own is not supported by kf",
                          cause="kf draws from torch's default generator (torch.manual_seed)")
    elem, ce = _compute_elem(x, "rrelu")
    if math.prod(shape_of(x)) == 0:
        return x
    xc = c.tensor(x, ce)
    zero = kb.scalar(0.0, ce)
    if not training:
        slope = kb.scalar((lower + upper) / 2.0, ce)
        return c.tensor(kb.select(kb.cmp(xc, zero, predicate="gt"), xc, kb.mul(xc, slope)), elem)
    u = c.tensor(c.rand(shape_of(x)), ce)
    slope = kb.add(kb.mul(u, kb.scalar(upper - lower, ce)), kb.scalar(lower, ce))
    return c.tensor(kb.select(kb.cmp(xc, zero, predicate="le"), kb.mul(xc, slope), xc), elem)
