"""Handlers that make values: fills, arange, tril and triu (from kf.iota: indices
computed where they are used, so a mask made inside the function is never a tensor in
memory), triu_indices and tril_indices (constants), and random numbers (rand, randn,
bernoulli) drawn from the program's Philox state (the dropout family is dropout.py)."""

from __future__ import annotations

import math
from typing import Callable

import torch

from kf.dialects import builders as kb
from kf.dialects import spec_of

from ..dtypes import kf_elem
from ..errors import Unsupported
from .core import Converter, HANDLERS, fake_value, handles, shape_of


def _fill_like(value_of: Callable[[list, dict], float]):
    def handler(c: Converter, node, args, kwargs):
        val = fake_value(node)
        return kb.fill(tuple(val.shape), kf_elem(val.dtype), float(value_of(args, kwargs)))

    return handler


for _n, _f in [("zeros_like.default", lambda a, k: 0.0), ("ones_like.default", lambda a, k: 1.0),
               ("empty_like.default", lambda a, k: 0.0), ("zeros.default", lambda a, k: 0.0),
               ("ones.default", lambda a, k: 1.0), ("empty.memory_format", lambda a, k: 0.0),
               ("full.default", lambda a, k: a[1]), ("full_like.default", lambda a, k: a[1]),
               ("new_zeros.default", lambda a, k: 0.0), ("new_ones.default", lambda a, k: 1.0),
               ("new_full.default", lambda a, k: a[2]), ("scalar_tensor.default", lambda a, k: a[0]),
               ("new_empty.default", lambda a, k: 0.0), ("empty_strided.default", lambda a, k: 0.0),
               ("new_empty_strided.default", lambda a, k: 0.0)]:
    HANDLERS["aten." + _n] = _fill_like(_f)


#: The largest integer each type holds exactly, with every integer below it.
_EXACT_INTS = {"i32": 2**31 - 1, "i64": 2**63 - 1, "f64": 2**53, "f32": 2**24, "f16": 2**11, "bf16": 2**8}


@handles("aten.arange.default", "aten.arange.start", "aten.arange.start_step")
def _arange(c, node, args, kwargs):
    """start + i * step from kf.iota where every value is an integer the result type
    holds exactly (then any order of computing it gives eager's values); a constant
    otherwise (torch computes float steps in double)."""
    val = fake_value(node)
    elem = kf_elem(val.dtype)
    bounds = [args[0], 0, 1] if len(args) == 1 else [args[1], args[0], 1] if len(args) == 2 else \
        [args[1], args[0], args[2]]
    end, start, step = bounds
    n = val.shape[0]
    ints = all(isinstance(b, int) and not isinstance(b, bool) for b in bounds)
    if not ints or elem not in _EXACT_INTS or max(abs(start), abs(start + (n - 1) * step)) > _EXACT_INTS[elem]:
        return c.constant_tensor(torch.arange(*args, dtype=val.dtype))
    v = kb.iota((n,), 0, "i64")
    if step != 1:
        v = kb.mul(v, kb.scalar(step, "i64"))
    if start != 0:
        v = kb.add(v, kb.scalar(start, "i64"))
    return v if elem == "i64" else kb.cast(v, elem)


def _triangle(lower: bool):
    """tril (lower) or triu: x where col - row <= k (>= k for triu), 0 elsewhere; the
    condition from two kf.iota, so a mask ``torch.ones(L, S).tril()`` is computed in the
    kernel that reads it."""

    def handler(c: Converter, node, args, kwargs):
        x = args[0]
        k = int(args[1] if len(args) > 1 else kwargs.get("diagonal", 0))
        shape = shape_of(x)
        if len(shape) < 2:
            raise Unsupported(f"{'tril' if lower else 'triu'} needs a tensor of 2 or more dimensions, "
                              f"got {len(shape)}")
        rows, cols = shape[-2:]
        offset = kb.sub(kb.iota((1, cols), 1), kb.iota((rows, 1), 0))
        keep = kb.cmp(offset, kb.scalar(k, "i64"), predicate="le" if lower else "ge")
        elem = spec_of(x.type).elem
        return kb.select(keep, x, kb.scalar(0.0, elem))

    return handler


HANDLERS["aten.tril.default"] = _triangle(True)
HANDLERS["aten.triu.default"] = _triangle(False)


def _no_generator(name: str, generator) -> None:
    if generator is not None:
        raise Unsupported(f"{name} with a generator of its own is not supported by kf",
                          cause="kf draws from torch's default generator (torch.manual_seed)")


@handles("aten.triu_indices.default", "aten.tril_indices.default")
def _triangle_indices(c, node, args, kwargs):
    """triu_indices / tril_indices: a constant (they depend only on the sizes given)."""
    from .reductions import bound_args

    p = bound_args(node, args, kwargs)
    make = torch.triu_indices if node.target._opname == "triu_indices" else torch.tril_indices
    return c.constant_tensor(make(p["row"], p["col"], p["offset"] or 0, dtype=fake_value(node).dtype))


@handles("aten.rand.default", "aten.rand_like.default", "aten.randn.default", "aten.randn_like.default")
def _rand(c, node, args, kwargs):
    val = fake_value(node)
    shape, elem = tuple(val.shape), kf_elem(val.dtype)
    if math.prod(shape) == 0:
        return kb.fill(shape, elem, 0.0)
    if node.target._opname.startswith("randn"):
        return c.tensor(c.rand(shape, "normal"), elem)
    u = c.tensor(c.rand(shape), elem)
    if elem in ("f32", "f64"):
        return u
    # a narrower type rounds samples near 1 up to 1: those become 0, as torch's CUDA
    # uniform_ does, so the samples stay in [0, 1)
    return kb.select(kb.cmp(u, c.tensor(1.0, elem), predicate="eq"), c.tensor(0.0, elem), u)


@handles("aten.bernoulli.default", "aten.bernoulli.p")
def _bernoulli(c, node, args, kwargs):
    x = args[0]
    if node.target._overloadname == "p":
        p = args[1] if len(args) > 1 else kwargs.get("p", 0.5)
        _no_generator("bernoulli", args[2] if len(args) > 2 else kwargs.get("generator"))
    else:
        p = x
        _no_generator("bernoulli", kwargs.get("generator"))
    elem = c.out_elem(node)
    if math.prod(shape_of(x)) == 0:
        return kb.fill(shape_of(x), elem, 0.0)
    u = c.rand(shape_of(x))
    ce = c.compute_elem(u, p)
    return c.tensor(kb.cmp(c.tensor(u, ce), c.tensor(p, ce), predicate="lt"), elem)


@handles("kf.philox_rand.default")
def _philox_rand(c, node, args, kwargs):
    """kf.rand reading an explicit state (a generated backward's: random_state.py)."""
    state, offset, size, distribution = args
    return kb.rand(state, tuple(size), offset=int(offset), distribution=distribution)


@handles("aten._assert_tensor_metadata.default", "aten._assert_scalar.default", "aten.sym_constrain_range.default",
         "aten._assert_async.msg", "aten._functional_assert_async.msg")
def _assertion(c, node, args, kwargs):
    # Checks that export inserts about tensor metadata; the signature already fixes it.
    return None
