"""Seeded fuzz tests of ``torch.compile(backend="kf")``: the calls a model makes through
Dynamo and AOTAutograd, on generated shapes, dtypes and layouts, forward and every input's
gradient against float64 (test_fuzz_gradients.check_grads), on ``cpu`` and ``vulkan``.

- ``F.scaled_dot_product_attention`` (the backend's own attention op): grouped-query
  heads, ``is_causal``, a bool or additive mask of [Sq, Sk] or [B, 1, Sq, Sk], with query
  rows the mask masks everywhere (a left-padded batch: torch gives them 0).
- a pre-norm transformer block's pieces: layer norm or RMSNorm, a linear, GELU or SiLU,
  the residual add.

The same ``KF_FUZZ_EXAMPLES`` and ``KF_FUZZ_RANDOM`` settings apply.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from fuzzing import FUZZ, TARGETS
from test_fuzz import DTYPES, LAYOUTS, NONZERO, SEEDS, generator, make
from test_fuzz_gradients import check_grads


@pytest.fixture(autouse=True)
def _cache(tmp_path_factory, monkeypatch):
    monkeypatch.setenv("KF_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "kf-fuzz-cache"))


def backend(fn, target: str):
    """fn under torch.compile with kf as its backend, compiled afresh (Dynamo's own cache
    would otherwise stop recompiling after a few examples)."""
    torch._dynamo.reset()
    return torch.compile(fn, backend="kf", options={"target": target, "fallback": "eager"})


MASKS = st.sampled_from(["none", "causal", "bool", "bool_dead", "additive", "additive_dead"])


def _mask(kind: str, batch: int, sq: int, sk: int, per_batch: bool, g):
    """A mask of the kind, [Sq, Sk] or [B, 1, Sq, Sk]; "..._dead": its first rows masked
    everywhere (of the last batch where it has one: padding before a sequence)."""
    if kind in ("none", "causal"):
        return None
    shape = (batch, 1, sq, sk) if per_batch else (sq, sk)
    keep = torch.rand(shape, generator=g) > 0.3
    keep[..., 0] = True
    if kind.endswith("_dead"):
        dead = max(1, sq // 3)
        if per_batch:
            keep[-1, :, :dead] = False
        else:
            keep[:dead] = False
    if kind.startswith("bool"):
        return keep
    add = torch.randn(shape, generator=g)  # f32, which SDPA takes with every query dtype
    return add.masked_fill(keep.logical_not(), float("-inf"))


def sdpa(q, k, v, mask, causal):
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, is_causal=causal,
                                          enable_gqa=q.shape[-3] != k.shape[-3])


@pytest.mark.parametrize("target", TARGETS)
@settings(FUZZ, max_examples=max(1, FUZZ.max_examples // 2))  # a forward and a backward to compile each
@given(batch=st.sampled_from([1, 2]), kv_heads=st.sampled_from([1, 2]), groups=st.sampled_from([1, 3]), sq=NONZERO,
       sk=NONZERO, dim=st.sampled_from([8, 16, 31, 64]), dtype=DTYPES, mask=MASKS, per_batch=st.booleans(),
       layout=LAYOUTS, seed=SEEDS)
def test_sdpa(target, batch, kv_heads, groups, sq, sk, dim, dtype, mask, per_batch, layout, seed):
    g = generator(seed)
    heads = kv_heads * groups
    assume(batch * heads * max(sq, sk) * dim <= 40_000)
    q = make((batch, heads, sq, dim), dtype, layout, g)
    k, v = make((batch, kv_heads, sk, dim), dtype, "contiguous", g), make((batch, kv_heads, sk, dim), dtype, layout, g)
    m = _mask(mask, batch, sq, sk, per_batch, g)
    check_grads(target, sdpa, (q, k, v), (m, mask == "causal"), ulps=64, compile=backend)


def block(x, w_norm, b_norm, w, b, norm, act):
    if norm == "layer":
        h = F.layer_norm(x, x.shape[-1:], w_norm, b_norm)
    else:  # (RMSNorm has no bias: b_norm shifts its result, as a bias would)
        h = F.rms_norm(x, x.shape[-1:], w_norm) + b_norm
    h = F.linear(h, w, b)
    return x + (F.gelu(h) if act == "gelu" else F.silu(h))


@pytest.mark.parametrize("target", TARGETS)
@settings(FUZZ, max_examples=max(1, FUZZ.max_examples // 2))
@given(rows=NONZERO, width=st.sampled_from([1, 7, 64, 257]), dtype=DTYPES, layout=LAYOUTS,
       norm=st.sampled_from(["layer", "rms"]), act=st.sampled_from(["gelu", "silu"]), seed=SEEDS)
def test_block(target, rows, width, dtype, layout, norm, act, seed):
    g = generator(seed)
    assume(rows * width <= 40_000)
    x = make((rows, width), dtype, layout, g)
    w_norm, b_norm = make((width,), dtype, "contiguous", g), make((width,), dtype, "contiguous", g)
    w, b = make((width, width), dtype, "transposed", g, -0.5, 0.5), make((width,), dtype, "contiguous", g)
    check_grads(target, block, (x, w_norm, b_norm, w, b), (norm, act), ulps=64, compile=backend)
