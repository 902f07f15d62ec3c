"""Run-time sizes (compiler/dynamic.py and the API around it): one program serves every
size of a dynamic dim, checked against torch on fresh random inputs."""

import logging
import os
import subprocess
import sys
import textwrap
import warnings

import pytest
import seed_examples as se
import torch

import kf
import kf.runtime.vulkan
from kf.dynamic import capture_dynamic
from kf.signature import bind

SIZES = (7, 257, 300, 1000)

needs_vulkan = pytest.mark.skipif(not kf.runtime.vulkan.is_available(), reason="no Vulkan device")
TARGETS = ["cpu", pytest.param("vulkan", marks=needs_vulkan)]


@pytest.fixture(autouse=True)
def _own_cache(tmp_path, monkeypatch):
    # automatic dynamic reads and writes a profile beside the cache: each test its own
    monkeypatch.setenv("KF_CACHE_DIR", str(tmp_path / "cache"))


def _layer_norm(x, weight, bias, eps=1e-5):
    mean = x.mean(dim=-1, keepdim=True)
    var = x.var(dim=-1, keepdim=True)
    return weight * (x - mean) / torch.sqrt(var + eps) + bias


def _close(got, want, tol=1e-4):
    assert got.shape == want.shape and got.dtype == want.dtype
    torch.testing.assert_close(got, want, atol=tol, rtol=tol)


def _compiled(fn):
    return [c for c in fn.compiles if not c.cached]


def test_capture_gives_run_time_dims_in_kf_ir():
    x, w, b = torch.randn(3, 7, 64), torch.randn(64), torch.randn(64)
    sig, tensors = bind(_layer_norm, (x, w, b), {})
    cap = capture_dynamic(_layer_norm, sig.generalize({("x", 0), ("x", 1)}), tensors)
    assert "tensor<?x?x64xf32>" in cap.kf_ir and "tensor<?x?x1xf32>" in cap.kf_ir
    assert cap.input_dims[1:] == [("64",), ("64",)]
    s0, s1, _ = cap.input_dims[0]
    assert cap.output_dims == [(s0, s1, "64")] and s0 != s1


def test_torch_specialized_dim_compiles_static_and_logs_why(caplog):
    @kf.jit(target="cpu", dynamic={"x": [1]})
    def f(x):
        return x + torch.arange(4.0)  # x's dim 1 must be 4: torch specializes it

    x = torch.randn(3, 4)
    with caplog.at_level(logging.INFO, logger="kf.recompiles"):
        _close(f(x), x + torch.arange(4.0))
    assert "x dim 1 compiled for static sizes" in caplog.text and "specialized" in caplog.text
    assert "[3, 4]" in f.compiles[0].signature


@pytest.mark.parametrize("target", TARGETS)
def test_seed_layer_norm_one_program_for_every_size(target):
    ln = kf.jit(se.metal_layer_norm.fn, target=target, dynamic=True)
    w, b = torch.randn(64), torch.randn(64)
    for n in SIZES:
        x = torch.randn(1, n, 64)
        _close(ln(x, w, b), se.metal_layer_norm.fn(x, w, b))
    assert len(ln.compiles) == 1 and "?" in ln.compiles[0].signature


@pytest.mark.parametrize("target", TARGETS)
def test_seed_attention_automatic_dynamic(target, caplog):
    attn = kf.jit(se.fused_attention.fn, target=target)
    with caplog.at_level(logging.INFO, logger="kf.recompiles"):
        for n in SIZES:
            q, k, v = (torch.randn(1, 2, n, 32) for _ in range(3))
            _close(attn(q, k, v), se.fused_attention.fn(q, k, v))
    # the first size compiles static; the second recompiles once with seq dynamic
    assert len(attn.compiles) == 2
    assert "'q' dim 2 changed size (7 -> 257)" in caplog.text
    assert "[1, 2, ?, 32]" in attn.compiles[1].signature
    assert "compiled with it dynamic" in attn.compiles[1].reason


def test_seed_attention_with_mask_dynamic():
    attn = kf.jit(se.fused_attention.fn, target="cpu", dynamic={"q": [2], "k": [2], "v": [2], "mask": [2, 3]})
    for n in SIZES[:3]:
        q, k, v = (torch.randn(1, 2, n, 16) for _ in range(3))
        mask = (torch.rand(1, 1, n, n) > 0.2).to(torch.int32)
        _close(attn(q, k, v, mask), se.fused_attention.fn(q, k, v, mask))
    assert len(attn.compiles) == 1


@pytest.mark.parametrize("target", TARGETS)
def test_dims_found_equal_that_differ_compile_apart(target):
    """A program whose trace found two dims equal (one symbol: here the query and key
    heads, under automatic dynamic) does not serve a call where they differ (grouped-
    query heads): that call compiles for its own sizes and gets torch's result (before,
    the launcher refused it: "'k' dim 1 is 2, but s0 is 4 in another input")."""
    def f(q, k):
        k = k.repeat_interleave(q.shape[1] // k.shape[1], dim=1)
        return torch.softmax(q @ k.transpose(-2, -1), -1)

    g = kf.jit(f, target=target)
    for heads, kv_heads, n in ((4, 4, 7), (4, 4, 12), (4, 2, 12), (4, 4, 9), (4, 1, 9), (4, 2, 15), (4, 2, 20),
                               (4, 2, 31)):
        q, k = torch.randn(2, heads, n, 8), torch.randn(2, kv_heads, n, 8)
        _close(g(q, k), f(q, k))
    if target == "cpu":  # the cpu target's program of run-time lengths serves (4, 4, 9), and
        # the grouped-query calls at new lengths run one program of their heads (on GPU
        # targets the [n, n] result, two run-time sizes, compiles for each length)
        assert len(g.compiles) <= 4, [c.signature for c in g.compiles]


@needs_vulkan
def test_grouped_query_calls_after_other_heads_share_one_program():
    """An attention function met at several heads and lengths (the heads change, so they
    are run-time sizes too), whose program of run-time heads and lengths cannot be made
    (its result would hold two run-time sizes), then called with grouped-query heads at
    new lengths: from the second such call on, one program of their heads serves every
    length, instead of one program a length."""
    from kf.api import KfFunction
    from kf.backend import attention
    from kf.options import Options

    g = KfFunction(attention.attention_lse, Options(target="vulkan"))
    counts = []
    for heads, kv_heads, n in ((4, 4, 13), (8, 8, 21), (4, 2, 30), (4, 2, 40), (4, 2, 57), (4, 2, 9)):
        q, k, v = torch.randn(2, heads, n, 16), torch.randn(2, kv_heads, n, 16), torch.randn(2, kv_heads, n, 16)
        out, _ = g(q, k, v, None, 0.25, True)
        want = torch.nn.functional.scaled_dot_product_attention(q, k, v, scale=0.25, is_causal=True, enable_gqa=True)
        _close(out, want)
        counts.append(len(g.compiles))
    assert counts[3:] == [counts[3]] * 3, counts


def test_sizes_0_and_1_are_compiled_apart():
    ln = kf.jit(_layer_norm, target="cpu", dynamic=True)
    w, b = torch.randn(16), torch.randn(16)
    for n in (1, 0, 7, 9, 1):
        x = torch.randn(n, 16)
        want = _layer_norm(x, w, b)
        got = ln(x, w, b)
        assert got.shape == want.shape
        if n:
            _close(got, want)
    sigs = [c.signature for c in ln.compiles]
    assert len(sigs) == 3 and "[1, ?]" in sigs[0] and "[0, 16]" in sigs[1] and "[?, ?]" in sigs[2]


def test_elementwise_and_reductions():
    @kf.jit(target="cpu", dynamic=True)
    def f(x, y):
        z = torch.relu(x * y + 1.0)
        # (a mean over every element could add more than REDUCTION_BLOCK of them: static,
        # test_sums_over_a_run_time_dim_and_a_long_static_one_compile_static)
        return z.sum(dim=0), z.amax(dim=1), torch.softmax(z, dim=-1), z.mean(dim=1)

    for n in (7, 257, 3):
        x, y = torch.randn(n, 5), torch.randn(n, 5)
        for got, want in zip(f(x, y), f.fn(x, y)):
            _close(got, want)
    assert len(f.compiles) == 1


def test_non_contiguous_inputs():
    f = kf.jit(_layer_norm, target="cpu", dynamic={"x": [0]})
    w, b = torch.randn(8), torch.randn(8)
    for n in (7, 257):
        x = torch.randn(8, n).t()  # [n, 8], strided
        assert not x.is_contiguous()
        _close(f(x, w, b), _layer_norm(x, w, b))
    assert len(f.compiles) == 1


def test_float_argument_over_8_steps_compiles_once():
    f = kf.jit(_layer_norm, target="cpu")
    x, w, b = torch.randn(4, 7, 32), torch.randn(32), torch.randn(32)
    for step in range(8):
        eps = 1e-5 * (step + 1)
        _close(f(x, w, b, eps), _layer_norm(x, w, b, eps))
    assert len(f.compiles) == 1


@pytest.mark.parametrize("target", TARGETS)
def test_19_lengths_compile_at_most_2_programs_per_function(target):
    ln = kf.jit(se.metal_layer_norm.fn, target=target)
    attn = kf.jit(se.fused_attention.fn, target=target)
    w, b = torch.randn(64), torch.randn(64)
    lengths = list(range(320, 2049, 96))
    assert len(lengths) == 19
    for n in lengths:
        x = torch.randn(1, n, 64)
        q, k, v = (torch.randn(1, 1, n, 32) for _ in range(3))
        _close(ln(x, w, b), se.metal_layer_norm.fn(x, w, b))
        _close(attn(q, k, v), se.fused_attention.fn(q, k, v))
    assert len(ln.compiles) <= 2 and len(attn.compiles) <= 2


def test_recompile_limit_names_the_argument_and_dim(caplog):
    f = kf.jit(lambda x: x * 2, target="cpu", dynamic=False)
    with caplog.at_level(logging.WARNING, logger="kf.recompiles"), pytest.warns(RuntimeWarning) as caught:
        for n in range(2, 12):
            f(torch.randn(3, n))
    msg = [str(w.message) for w in caught if "limit" in str(w.message)]
    assert len(msg) == 1 and "argument 'x' dim 1" in msg[0] and "keeps changing" in msg[0]
    assert "argument 'x' dim 1" in caplog.text


def test_recompile_limit_names_a_changing_value():
    @kf.jit(target="cpu")
    def f(x, k: int):
        return x * k

    with pytest.warns(RuntimeWarning, match=r"argument 'k' \(values"):
        for k in range(10):
            f(torch.randn(3), k)


def test_lowering_without_a_size_falls_back_static(caplog):
    @kf.jit(target="cpu", dynamic={"x": [0]})
    def f(x):
        # a tensor of s0 + 1 rows made in the function: no argument dim gives that size
        return torch.ones(x.shape[0] + 1, 3).cumsum(0)[1:] * x

    with caplog.at_level(logging.INFO, logger="kf.recompiles"):
        for n in (5, 9):
            x = torch.randn(n, 3)
            _close(f(x), f.fn(x))
    assert "compiled for static sizes" in caplog.text
    assert len(f.compiles) == 2 and all("?" not in c.signature for c in f.compiles)


_SLICES = {
    "shift": lambda x: x[:, 1:] - x[:, :-1],  # a language model's next-token pairs
    "tail": lambda x: x[:, -3:] * 2,
    "inner": lambda x: x[:, 2:-1] + 1,
    "every_other": lambda x: x[:, 1::2] * 3,
    "sum_of_shifted": lambda x: (x[:, 1:] * x[:, :-1]).sum(-1),
    "softmax_of_shifted": lambda x: torch.softmax(x[:, :-1], dim=1),
}


@pytest.mark.parametrize("name", sorted(_SLICES))
@pytest.mark.parametrize("target", TARGETS)
def test_slices_at_a_run_time_end_take_run_time_sizes(target, name, caplog):
    """A slice whose bound is at or before the end of a run-time dim (``x[:, 1:]``,
    ``x[:, :-1]``, ``x[:, -3:]``) counts that bound from the end: one program for every
    length. torch's trace holds where the slice is not of length 1 or where the dim
    holds the bounds (guards such as ``Ne(s0 - 1, 1)``, ``s0 >= 3``); the program checks
    them at each call, and a length that fails one (2 here) compiles for itself."""
    fn = _SLICES[name]
    f = kf.jit(fn, target=target)
    with caplog.at_level(logging.INFO, logger="kf.recompiles"):
        for n in (7, 257, 300, 1000, 5, 2):
            x = torch.randn(3, n, 8)
            _close(f(x), fn(x))
    sigs = [c.signature for c in _compiled(f)]
    assert len(sigs) <= 3 and "?" in sigs[1], sigs  # the first length, every length, 2
    if len(sigs) == 3:
        assert "?" not in sigs[2] and "fail the guard" in caplog.text, sigs


def test_shifted_labels_of_a_language_model_loss_are_one_program_on_cpu():
    """``cross_entropy(logits[:, :-1], labels[:, 1:])``: one program for every length."""
    def loss(logits, labels):
        return torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]),
                                                 labels[:, 1:].reshape(-1))

    f = kf.jit(loss, target="cpu")
    for n in SIZES + (3,):
        logits, labels = torch.randn(2, n, 11), torch.randint(0, 11, (2, n))
        _close(f(logits, labels), loss(logits, labels))
    assert len(_compiled(f)) == 2, f.compiles


def test_guard_specializes_only_the_dims_it_reads(caplog):
    """A branch on two dims (grouped-query attention's head counts) makes those two
    static; the length, which no guard reads, stays a run-time size: one program."""
    @kf.jit(target="cpu", dynamic=True)
    def f(q, k):
        if k.shape[0] != q.shape[0]:
            k = k.repeat_interleave(q.shape[0] // k.shape[0], dim=0)
        return q * 2 + k

    with caplog.at_level(logging.INFO, logger="kf.recompiles"):
        for n in (5, 9, 17):
            q, k = torch.randn(4, n), torch.randn(2, n)
            _close(f(q, k), q * 2 + k.repeat_interleave(2, dim=0))
    assert "k dim 0, q dim 0 compiled for static sizes" in caplog.text
    assert len(f.compiles) == 1 and f.compiles[0].signature.count("?") == 2, f.compiles


def test_grouped_query_attention_is_one_program_on_cpu():
    """The backend's attention (compiler/backend/attention.py) under dynamic=True: its
    branch on head counts makes them static; ``repeat_interleave``'s unsqueeze, a reshape
    of several run-time dims that only adds a dim of 1, and the causal mask keep every
    other dim a run-time size."""
    from kf.backend.attention import attention

    f = kf.jit(attention, target="cpu", dynamic=True)
    for n in (7, 257, 300):
        q, k, v = torch.randn(2, 4, n, 8), torch.randn(2, 2, n, 8), torch.randn(2, 2, n, 8)
        want = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True, scale=0.3, enable_gqa=True)
        _close(f(q, k, v, None, 0.3, True), want)
    assert len(f.compiles) == 1 and "?" in f.compiles[0].signature, f.compiles


def test_sdpa_and_cross_entropy_are_one_program_on_cpu():
    """``F.scaled_dot_product_attention`` (one aten op whose fake kernel checks no sizes:
    its keys' and values' lengths are made one size) and ``F.cross_entropy`` (a gather
    along the static class dim) over run-time lengths."""
    sdpa = kf.jit(lambda q, k, v: torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True),
                  target="cpu", dynamic={"q": [2], "k": [2], "v": [2]})
    xent = kf.jit(torch.nn.functional.cross_entropy, target="cpu", dynamic={"input": [0], "target": [0]})
    for n in (7, 257, 300, 1000):
        q, k, v = (torch.randn(1, 2, n, 64) for _ in range(3))
        _close(sdpa(q, k, v), torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True))
        logits, y = torch.randn(n, 50), torch.randint(0, 50, (n,))
        _close(xent(logits, y), torch.nn.functional.cross_entropy(logits, y))
    assert len(sdpa.compiles) == 1 and len(xent.compiles) == 1, (sdpa.compiles, xent.compiles)


@pytest.mark.parametrize("target", TARGETS)
def test_dynamic_true_settles_on_the_dims_that_change(target, caplog):
    """``dynamic=True`` on a [2, n, 64] layer norm: on vulkan the batch and the length
    together are not one program (a tensor takes one run-time size there), so the dims
    whose sizes changed since the first program are tried at once: two programs serve
    lengths 1, 7, 257, 300 and 1000."""
    ln = kf.jit(se.metal_layer_norm.fn, target=target, dynamic=True)
    w, b = torch.randn(64), torch.randn(64)
    with caplog.at_level(logging.INFO, logger="kf.recompiles"):
        for n in (1, 7, 257, 300, 1000):
            x = torch.randn(2, n, 64)
            _close(ln(x, w, b), se.metal_layer_norm.fn(x, w, b))
    assert len(ln.compiles) == 2 and "?" in ln.compiles[-1].signature, ln.compiles
    if target == "vulkan":
        assert "not one program together" in caplog.text


@pytest.mark.parametrize("target", TARGETS)
def test_one_dim_tensors_take_run_time_lengths(target):
    """A 1-d tensor's one dim is a run-time size on every target (on vulkan, where other
    tensors keep their innermost dim static, too): per-token targets of a cross entropy and
    positions, under automatic dynamic, are two programs over five lengths."""
    xent = kf.jit(torch.nn.functional.cross_entropy, target=target)
    shift = kf.jit(lambda x, pos: x * 2 + pos.float()[:, None], target=target)
    for n in (5, 7, 257, 300, 1000):
        logits, y = torch.randn(n, 50), torch.randint(0, 50, (n,))
        _close(xent(logits, y), torch.nn.functional.cross_entropy(logits, y))
        x, pos = torch.randn(n, 16), torch.arange(n)
        _close(shift(x, pos), x * 2 + pos.float()[:, None])
    assert len(xent.compiles) == 2 and len(shift.compiles) == 2, (xent.compiles, shift.compiles)


def _interleaved_rope(x, theta):
    n, d = x.shape[-2], x.shape[-1]
    inv = 1.0 / theta ** (torch.arange(0, d, 2, dtype=torch.float32) / d)
    t = torch.arange(n, dtype=torch.float32)[:, None] * inv
    c, s = t.cos(), t.sin()
    x1, x2 = x[..., ::2], x[..., 1::2]
    return torch.stack((x1 * c - x2 * s, x1 * s + x2 * c), -1).flatten(-2)


@pytest.mark.parametrize("target", TARGETS)
def test_a_table_of_the_length_named_by_the_kernels_that_read_it(target):
    """A rotary table built from the length (``arange(n)[:, None] * inv``, then cos and
    sin) is written by a kernel that takes no tensor of that length; the kernels that
    read it beside slices of ``x`` name its size (on vulkan, where it is a buffer between
    kernels). One program over the lengths after the first."""
    rope = kf.jit(_interleaved_rope, target=target)
    for n in (7, 257, 300, 1000, 13):
        x = torch.randn(3, n, 16)
        _close(rope(x, 1e4), _interleaved_rope(x, 1e4))
    assert len(rope.compiles) == 2 and "?" in rope.compiles[-1].signature, rope.compiles


def _next_token_loss(logits, labels):
    return torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]).float(),
                                             labels[:, 1:].reshape(-1))


@pytest.mark.parametrize("target", TARGETS)
def test_integer_tensors_take_a_run_time_innermost_dim(target):
    """Token ids of a batch ([b, n] int64) take a run-time length as their innermost dim on
    every target: no kernel reduces or vectorizes along an index tensor's rows, and a
    language model's shifted loss (whose labels torch's trace ties to the logits' length)
    is then one program over the lengths; so is a running count of tokens (a scan along
    the run-time dim, whose loop lavapipe's launcher must see bounded)."""
    loss = kf.jit(_next_token_loss, target=target)
    count = kf.jit(lambda ids: (ids > 3).long().cumsum(-1), target=target)
    for n in (17, 33, 49, 257, 300):
        logits, labels = torch.randn(2, n, 40), torch.randint(0, 40, (2, n))
        _close(loss(logits, labels), _next_token_loss(logits, labels))
        assert torch.equal(count(labels), (labels > 3).long().cumsum(-1))
    assert len(loss.compiles) == 2 and len(count.compiles) == 2, (loss.compiles, count.compiles)
    assert "i64[2, ?]" in loss.compiles[-1].signature


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_sums_over_a_run_time_dim_and_static_dims_take_run_time_sizes(target, dtype):
    """``loss.mean()`` of a ``[b, n, d]`` tensor and a bias gradient's ``sum((0, 1))``
    add up more elements than one stage takes (4096): they are staged over the run-time
    dim first, then over the static dims, so every length shares one program (the first
    length's and size 1's apart); bf16 is summed in f32 and rounded once."""
    mean = kf.jit(lambda x: (x.float() - 1).pow(2).mean(), target=target)
    colsum = kf.jit(lambda x: x.sum((0, 1)), target=target)
    tol = 2e-2 if dtype == torch.bfloat16 else 1e-4
    for n in (5, 17, 300, 257, 1000):
        x = torch.randn(3, n, 40).to(dtype)
        _close(mean(x), (x.double() - 1).pow(2).mean().float(), tol)
        _close(colsum(x), x.double().sum((0, 1)).to(dtype), tol)
    assert len(mean.compiles) == 2 and len(colsum.compiles) == 2, (mean.compiles, colsum.compiles)


@pytest.mark.parametrize("target", TARGETS)
def test_a_router_top_k_over_a_run_time_number_of_tokens(target):
    """A mixture-of-experts router's top 2 of 8 experts for each token: one program over
    the token counts, values and indices torch's."""
    def route(x, w):
        return torch.topk(torch.softmax(x @ w, -1), 2, dim=-1)

    f = kf.jit(route, target=target)
    w = torch.randn(16, 8)
    for n in (5, 17, 300, 257):
        x = torch.randn(n, 16)
        (v, i), (rv, ri) = f(x, w), route(x, w)
        _close(v, rv)
        assert torch.equal(i, ri)
    assert len(f.compiles) == 2, f.compiles


@pytest.mark.parametrize("target", TARGETS)
def test_views_of_one_projection_take_run_time_sizes(target):
    """q, k and v split from one projection (strided views sharing a storage, as GPT-2's
    fused q/k/v gives them): traced as tensors of their shapes, one program serves the
    later lengths."""
    f = kf.jit(se.fused_attention.fn, target=target)
    g = torch.Generator().manual_seed(0)
    for n in (7, 257, 300, 1000):
        qkv = torch.randn(2, n, 3, 4, 16, generator=g)
        q, k, v = (qkv[:, :, i].transpose(1, 2) for i in range(3))
        _close(f(q, k, v), se.fused_attention.fn(q, k, v))
    assert len(f.compiles) == 2, f.compiles
    assert "?" in f.compiles[-1].signature


def _one_hot_of_targets(x, t):
    return torch.zeros_like(x).scatter(1, t[:, None], 1.0) * x.softmax(-1)


def _embedding_gradient(tokens, g):
    return torch.zeros(50, g.shape[-1]).index_add(0, tokens, g)


def _row_amax(x, t):
    return x.scatter_reduce(1, t, x.gather(1, t) * 2.0, reduce="amax", include_self=False)


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("fn,make", [
    (_one_hot_of_targets, lambda n, g: (torch.randn(n, 31, generator=g), torch.randint(0, 31, (n,), generator=g))),
    (_embedding_gradient, lambda n, g: (torch.randint(0, 50, (n,), generator=g), torch.randn(n, 16, generator=g))),
    (_row_amax, lambda n, g: (torch.randn(n, 9, generator=g), torch.randint(0, 9, (n, 4), generator=g))),
], ids=["scatter", "index_add", "scatter_reduce"])
def test_scatters_along_a_static_dim_take_run_time_sizes(target, fn, make):
    """Scatters that write along a static dim -- a loss's one-hot gradient over a
    run-time number of rows, an embedding's gradient summed into its static table from a
    run-time number of tokens, a reduction into each row -- are one program over the
    counts (the indices are checked against the static dim), each result torch's."""
    f = kf.jit(fn, target=target)
    g = torch.Generator().manual_seed(0)
    for n in (5, 17, 300, 257, 1000):
        args = make(n, g)
        _close(f(*args), fn(*args))
    assert len(f.compiles) == 2, f.compiles
    assert "?" in f.compiles[-1].signature


@pytest.mark.parametrize("target", TARGETS)
def test_cross_entropy_training_at_changing_token_counts_compiles_once_for_them(target):
    """The backward of a cross-entropy loss (its gradient scatters into each row's target
    class) over changing token counts: one backward program serves them."""
    def loss(x, t):
        return torch.nn.functional.cross_entropy(x, t)

    f = kf.jit(loss, target=target)
    g = torch.Generator().manual_seed(0)
    counts = []
    for n in (5, 257, 2, 7, 13, 31, 300):
        x = torch.randn(n, 31, generator=g, requires_grad=True)
        t = torch.randint(0, 31, (n,), generator=g)
        f(x, t).backward()
        got = x.grad
        x.grad = None
        loss(x, t).backward()
        _close(got, x.grad)
        backwards = {id(tr.backward.fn): tr.backward.fn for tr, _ in f._trainings.values()}
        counts.append(sum(len(b.compiles) for b in backwards.values()))
    assert counts[-1] == counts[3], counts


@pytest.mark.parametrize("target", TARGETS)
def test_concatenation_along_a_run_time_dim(target):
    """``torch.cat([past, new], 1)`` (a cache grown by a step) with a run-time length: on
    cpu one program, its offsets and size the operands' at run time; on vulkan, whose
    kernels are planned with every run-time size at most 4096, a size that can pass it
    compiles static sizes. Correct at the lengths where the result passes 4096."""
    f = kf.jit(lambda x, y: torch.cat([x, y], 1) * 2, target=target)
    for n in (7, 257, 256, 4094, 4096):
        x, y = torch.randn(2, n, 4), torch.randn(2, 3, 4)
        _close(f(x, y), torch.cat([x, y], 1) * 2)
    if target == "cpu":
        assert len(f.compiles) == 2 and "?" in f.compiles[-1].signature, f.compiles


def test_scans_take_run_time_lengths_on_cpu():
    """Position ids from an attention mask (``mask.long().cumsum(-1) - 1``, as Hugging
    Face's Llama computes them) and a logcumsumexp and cumprod along a run-time length:
    one cpu program after the first, every length torch's."""
    pos = kf.jit(lambda mask: mask.long().cumsum(-1) - 1, target="cpu")
    logcum = kf.jit(lambda x: torch.logcumsumexp(x, 0) + torch.cumprod(x.sigmoid(), 0), target="cpu")
    for n in (7, 257, 1, 300, 1000):
        mask, x = (torch.rand(3, n) > 0.3).long(), torch.randn(n, 5)
        torch.testing.assert_close(pos(mask), mask.long().cumsum(-1) - 1)
        _close(logcum(x), torch.logcumsumexp(x, 0) + torch.cumprod(x.sigmoid(), 0))
    assert len(pos.compiles) == 2 and len(logcum.compiles) == 2, (pos.compiles, logcum.compiles)


_DERIVED = {
    "flatten": (lambda x: x.reshape(-1) * 2, lambda n: (torch.randn(n, 4),)),
    # a sum of up to 12288 terms, within 1e-3 of float64's where its value cancels to ~1
    "merge_then_sum": (lambda x: x.reshape(-1, 8).sum(0), lambda n: (torch.randn(3, n, 8),)),
    "repeat": (lambda x: x.repeat(3, 1) * 2, lambda n: (torch.randn(n, 4),)),
    "tokens_through_a_linear": (lambda x, w: (x.reshape(-1, 16) @ w).relu(),
                                lambda n: (torch.randn(4, n, 16), torch.randn(16, 8))),
}


@pytest.mark.parametrize("name", sorted(_DERIVED))
@pytest.mark.parametrize("target", TARGETS)
def test_sizes_derived_past_the_kernels_bound_compile_static(target, name):
    """A run-time size derived from the inputs' (``4n`` of a flattened [n, 4], ``3n`` of a
    [3, n, 8] merged inside a kernel) can pass the 4096 that GPU kernels with run-time
    sizes are planned at while n stays below it: such calls compile static sizes (vulkan
    gave wrong rows there), the others run on the run-time program. Every result torch's."""
    fn, make = _DERIVED[name]
    for dynamic in (None, True):
        f = kf.jit(fn, target=target, dynamic=dynamic)
        for n in (7, 257, 1000, 2000, 4096, 300, 2000):
            args = make(n)
            want = fn(*(a.double() for a in args)).float()
            _close(f(*args), want, 1e-3 if name == "merge_then_sum" else 1e-4)
        assert any("?" in c.signature for c in f.compiles), f.compiles
    # a float argument read at run time takes the same path (its dispatch entries)
    g = kf.jit(lambda x, s: x.reshape(-1) * s, target=target)
    for n, s in ((7, 0.5), (257, 0.7), (2000, 0.9), (300, 1.5), (2000, 0.9), (257, 0.7)):
        x = torch.randn(n, 4)
        _close(g(x, s), x.reshape(-1) * s)


def _causal_tril(q, k, v):
    n = q.shape[-2]
    s = (q @ k.transpose(-2, -1)) / q.shape[-1] ** 0.5  # the head dim as a number: it stays static
    s = s.masked_fill(torch.ones(n, n).tril() == 0, float("-inf"))
    return torch.softmax(s, -1) @ v


def _causal_arange(q, k, v):
    i = torch.arange(q.shape[-2])
    s = (q @ k.transpose(-2, -1)) * 0.125
    return torch.softmax(s.masked_fill(i[None, :] > i[:, None], float("-inf")), -1) @ v


@pytest.mark.parametrize("fn", [_causal_tril, _causal_arange])
@pytest.mark.parametrize("target", TARGETS)
def test_masks_built_in_the_function_take_run_time_sizes(target, fn):
    """``torch.ones(n, n).tril()`` and ``arange`` compares sized by the length are kf
    fills and iotas of run-time size (their sizes taken from the argument dims that give
    them): on cpu, ``dynamic=True`` is one program for every length. Where every dim at
    once is not one program (vulkan's attention takes one run-time size), the dims that
    change are tried next: one program more serves the other lengths."""
    f = kf.jit(fn, target=target, dynamic=True)
    for n in (7, 257, 300):
        q, k, v = (torch.randn(2, 3, n, 64) for _ in range(3))
        _close(f(q, k, v), fn(q, k, v))
    assert len(f.compiles) == (1 if target == "cpu" else 2), f.compiles
    assert "?" in f.compiles[-1].signature


def test_views_slices_concats_and_gathers_take_run_time_sizes():
    """The ops of a transformer block around its matmuls (compiler/backend's regions):
    a reshape that merges a run-time dim with static ones and one that splits it again,
    slices and concatenations along static dims of tensors of run-time length (rotary
    embeddings), and a gather of a static table's rows by an index of run-time length
    (an embedding): one cpu program serves every length, each result torch's."""
    table = torch.randn(64, 16)

    @kf.jit(target="cpu", dynamic={"idx": [1]})
    def f(idx, w):
        h = table[idx.reshape(-1)].reshape(2, -1, 4, 4)  # gather, then split a run-time dim
        h = torch.cat([-h[..., 2:], h[..., :2]], dim=-1) * 2  # rotate half
        return (h.reshape(-1, 16) @ w).reshape(2, -1, 8)  # merge, matmul, split

    w = torch.randn(16, 8)
    for n in (5, 9, 17, 257):
        idx = torch.randint(0, 64, (2, n))
        h = table[idx.reshape(-1)].reshape(2, -1, 4, 4)
        h = torch.cat([-h[..., 2:], h[..., :2]], dim=-1) * 2
        _close(f(idx, w), (h.reshape(-1, 16) @ w).reshape(2, -1, 8))
    assert len(_compiled(f)) == 1 and "?" in f.compiles[0].signature


FRESH = textwrap.dedent("""
    import sys
    import torch
    import kf

    @kf.jit(target=sys.argv[1])
    def ln(x, w, b):
        mean = x.mean(dim=-1, keepdim=True)
        var = x.var(dim=-1, keepdim=True)
        return w * (x - mean) / torch.sqrt(var + 1e-5) + b

    w, b = torch.randn(64), torch.randn(64)
    for n in map(int, sys.argv[2:]):
        x = torch.randn(1, n, 64)
        ref = w * (x - x.mean(-1, keepdim=True)) / torch.sqrt(x.var(-1, keepdim=True) + 1e-5) + b
        assert torch.allclose(ln(x, w, b), ref, atol=1e-4)
    print("compiled", sum(not c.cached for c in ln.compiles), "loaded", sum(c.cached for c in ln.compiles))
    print("mlir imported:", "mlir" in sys.modules)
""")


@pytest.mark.parametrize("target", TARGETS)
def test_fresh_process_compiles_nothing_for_a_new_length(tmp_path, target):
    script = tmp_path / "user_code.py"
    script.write_text(FRESH)
    env = dict(os.environ, KF_CACHE_DIR=str(tmp_path / "cache"))

    def run(*sizes):
        r = subprocess.run([sys.executable, str(script), target, *map(str, sizes)], capture_output=True, text=True,
                           env=env, timeout=300)
        assert r.returncode == 0, r.stderr
        return r.stdout

    assert "compiled 2 loaded 0" in run(7, 257)  # static, then dynamic
    out = run(300, 1000)  # new lengths: the dynamic program from the cache
    assert "compiled 0 loaded 1" in out and "mlir imported: False" in out


FRESH_MASKED = textwrap.dedent("""
    import sys
    import torch
    import kf

    @kf.jit(target=sys.argv[1])
    def attention(q, k, v, mask):
        scores = torch.matmul(q, k.transpose(-2, -1)) / 32 ** 0.5
        return torch.softmax(scores.masked_fill(mask == 0, -1e9), dim=-1) @ v

    for n in map(int, sys.argv[2:]):
        q, k, v = (torch.randn(2, 4, n, 32) for _ in range(3))
        mask = torch.ones(n, n).tril()
        ref = torch.softmax((q @ k.transpose(-2, -1) / 32 ** 0.5).masked_fill(mask == 0, -1e9), -1) @ v
        assert torch.allclose(attention(q, k, v, mask), ref, atol=1e-4)
    print("compiled", sum(not c.cached for c in attention.compiles), "loaded",
          sum(c.cached for c in attention.compiles))
""")


@needs_vulkan
def test_fresh_process_finds_the_program_of_a_mask_of_run_time_keys(tmp_path):
    """The seed's attention with its [n, n] mask: the mask's innermost dim (its keys) is a
    run-time size only once it has changed with k's length, which a fresh process's first
    call cannot see; the disk profile keeps that it did (``cache.profile_lengths``), so a
    new length in a fresh process loads the program of run-time sizes."""
    script = tmp_path / "user_code.py"
    script.write_text(FRESH_MASKED)
    env = dict(os.environ, KF_CACHE_DIR=str(tmp_path / "cache"))

    def run(*sizes):
        r = subprocess.run([sys.executable, str(script), "vulkan", *map(str, sizes)], capture_output=True, text=True,
                           env=env, timeout=300)
        assert r.returncode == 0, r.stderr
        return r.stdout

    assert "compiled 2 loaded 0" in run(7, 11, 19)  # static, then dynamic
    assert "compiled 0 loaded 1" in run(40, 257)


@needs_vulkan
def test_run_time_sizes_that_failed_are_not_tried_again(caplog):
    """Attention's probabilities returned ([b, h, n, n]: a result with two run-time sizes,
    which no GPU kernel writes): the program of run-time sizes fails once, and each later
    length compiles its own sizes without trying it again."""
    def probs(q, k):
        return torch.softmax(q @ k.transpose(-2, -1) * 0.1, -1)

    f = kf.jit(probs, target="vulkan")
    with caplog.at_level(logging.INFO, logger="kf.recompiles"):
        for n in (7, 11, 19, 30):
            q, k = torch.randn(2, 4, n, 16), torch.randn(2, 4, n, 16)
            _close(f(q, k), probs(q, k))
    assert caplog.text.count("not one program together") == 1, caplog.text
    assert len(f.compiles) == 4 and not any("?" in c.signature for c in f.compiles)


def test_branch_on_a_size_is_never_served_by_the_dynamic_program(caplog):
    # torch's trace at size 9 holds only where the size is not 7 (a guard Ne(s0, 7)); export
    # keeps no check of it in the graph: the program checks it at each call, and size 7
    # compiles for itself
    @kf.jit(target="cpu", dynamic={"x": [1]})
    def f(x):
        if x.shape[1] == 7:
            return x * 2
        return x * 3

    with caplog.at_level(logging.INFO, logger="kf.recompiles"):
        for n in (9, 7, 11, 7, 13):
            x = torch.randn(2, n)
            _close(f(x), f.fn(x))
    assert "fail the guard Ne(" in caplog.text
    assert [c.signature for c in f.compiles] == ["(x: f32[2, ?]@cpu)", "(x: f32[2, 7]@cpu)"], f.compiles


def test_size_guards_hold_through_the_bound_path(caplog):
    """A call with a float (the bound path, not the positional fast path) at a size
    that fails its program's guard compiles for its size too."""
    @kf.jit(target="cpu", dynamic={"x": [1]})
    def f(x, scale: float):
        if x.shape[1] == 7:
            return x * scale
        return x * 3

    for n, scale in ((9, 0.5), (7, 0.25), (11, 2.0), (7, 4.0)):
        x = torch.randn(2, n)
        _close(f(x, scale=scale), f.fn(x, scale))
    assert any("7]" in c.signature for c in f.compiles), f.compiles


@pytest.mark.parametrize("target", TARGETS)
def test_seed_layer_norm_one_program_serves_sizes_1_to_1000(target):
    ln = kf.jit(se.metal_layer_norm.fn, target=target, dynamic=True)
    w, b = torch.randn(64), torch.randn(64)
    for n in (7, 1, 257, 300, 1000, 1):  # a size 1 once the dim has met others
        x = torch.randn(1, n, 64)
        _close(ln(x, w, b), se.metal_layer_norm.fn(x, w, b))
    assert len(ln.compiles) == 1 and "?" in ln.compiles[0].signature


@pytest.mark.parametrize("target", TARGETS)
def test_seed_attention_one_program_serves_sizes_1_to_1000(target):
    attn = kf.jit(se.fused_attention.fn, target=target, dynamic={"q": [2], "k": [2], "v": [2]})
    for n in (7, 1, 257, 300, 1000):
        q, k, v = (torch.randn(1, 1, n, 32) for _ in range(3))
        _close(attn(q, k, v), se.fused_attention.fn(q, k, v))
    q, k, v = torch.randn(1, 1, 300, 32), torch.randn(1, 1, 77, 32), torch.randn(1, 1, 77, 32)
    _close(attn(q, k, v), se.fused_attention.fn(q, k, v))  # keys of another length
    assert len(attn.compiles) == 1 and "?" in attn.compiles[0].signature


@needs_vulkan
def test_vulkan_attention_with_heads_and_strided_inputs():
    """A run-time sequence after heads: the attention kernel addresses q, k, v and its
    output with run-time strides; keys of another length than the queries, and a
    strided q (a program of its own: the layout is part of the signature)."""
    attn = kf.jit(se.fused_attention.fn, target="vulkan", dynamic={"q": [2], "k": [2], "v": [2]})
    for n in (7, 1, 257):
        q, k, v = (torch.randn(2, 3, n, 16) for _ in range(3))
        _close(attn(q, k, v), se.fused_attention.fn(q, k, v))
    q, k, v = torch.randn(2, 3, 300, 16), torch.randn(2, 3, 77, 16), torch.randn(2, 3, 77, 16)
    _close(attn(q, k, v), se.fused_attention.fn(q, k, v))
    assert len(attn.compiles) == 1
    for n in (40, 9):
        q = torch.randn(2, n, 3, 16).transpose(1, 2)
        k, v = torch.randn(2, 3, n, 16), torch.randn(2, 3, n, 16)
        _close(attn(q, k, v), se.fused_attention.fn(q, k, v))
    assert len(attn.compiles) == 2 and all("?" in c.signature for c in attn.compiles)


def _decode(q, k, v, mask=None):
    return torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)


DECODE_TARGETS = [pytest.param("vulkan", marks=needs_vulkan),
                  pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA GPU"))]


@pytest.mark.parametrize("target", DECODE_TARGETS)
@pytest.mark.parametrize("mask", [None, "bool", "additive"])
def test_decoding_against_a_growing_cache_is_one_program(target, mask):
    """One query token against keys of run-time length (a KV cache that grows a token a
    step), with no mask, a [b, 1, 1, keys] boolean padding mask (dead rows included) or
    a [b, 1, 1, keys] additive one given as dynamic: the attention kernel takes the
    queries' length static and the keys' (and the mask's) at run time. On cuda in bf16,
    which at static sizes takes the tensor-core kernel."""
    attn = kf.jit(_decode, target=target)
    gen = torch.Generator().manual_seed(0)
    dev, dtype = ("cuda", torch.bfloat16) if target == "cuda" else ("cpu", torch.float32)
    for n in (7, 8, 1, 257, 300, 1000):
        q = torch.randn(2, 4, 1, 32, generator=gen)
        k, v = (torch.randn(2, 4, n, 32, generator=gen) for _ in range(2))
        m = None
        if mask == "bool":
            m = torch.rand(2, 1, 1, n, generator=gen) > 0.3
            m[1] = False  # the second sequence's query sees no key: its output is 0, as torch's
        elif mask == "additive":
            m = torch.randn(2, 1, 1, n, generator=gen)
        args = [t if t is None else t.to(dev, dtype if t.is_floating_point() else t.dtype) for t in (q, k, v, m)]
        want = _decode(*[t if t is None or not t.is_floating_point() else t.double() for t in args])
        _close(attn(*args).cpu().double(), want.cpu(), tol=1e-4 if dtype == torch.float32 else 2e-2)
    assert len(_compiled(attn)) <= 2 and "?" in attn.compiles[-1].signature
    if target == "vulkan":
        gpu = kf.inspect(attn, q, k, v, m).stages["gpu"]
        assert 'kf.strategy = "attention"' in gpu


def _seed_masked(q, k, v, mask):
    return se.fused_attention.fn(q, k, v, mask)


def _square_mask(kind: str, n: int, gen) -> torch.Tensor:
    """A mask of n queries x n keys: the seed's [n, n] float one (its zeros masked), or
    SDPA's [2, 1, n, n] bool or additive one whose second sequence's first three query
    rows see no key (torch gives them 0)."""
    if kind == "seed":
        return torch.ones(n, n).tril()
    if kind == "bool":
        m = torch.rand(2, 1, n, n, generator=gen) > 0.3
        m[1, :, :3] = False
        return m
    m = torch.randn(2, 1, n, n, generator=gen)
    m[1, :, :3] = float("-inf")
    return m


@pytest.mark.parametrize("target", DECODE_TARGETS)
@pytest.mark.parametrize("mask", ["seed", "bool", "additive"])
def test_attention_with_a_mask_of_every_length_is_one_program(target, mask):
    """A mask of queries x keys that grows with the sequence (the seed's attention given
    its causal mask; SDPA given a padded batch's mask, as transformers' prefill is): both
    of its dims are run-time sizes, which the attention kernel reads each from its own
    slot, and the kernel that finds SDPA's rows masked everywhere takes too. So the loop
    over lengths compiles two programs. On cuda in f32 (the SIMT kernel) and bf16 (the
    tensor-core kernels). A transposed (non-contiguous) mask after the loop."""
    fn = _seed_masked if mask == "seed" else _decode
    gen = torch.Generator().manual_seed(0)
    for dtype in ((torch.float32, torch.bfloat16) if target == "cuda" else (torch.float32,)):
        attn = kf.jit(fn, target=target)
        dev = "cuda" if target == "cuda" else "cpu"
        tol = 1e-4 if dtype == torch.float32 else 3e-2
        for n in (7, 8, 1, 257, 300, 1000):
            q, k, v = (torch.randn(2, 4, n, 32, generator=gen) for _ in range(3))
            m = _square_mask(mask, n, gen)
            args = [t.to(dev, dtype if t.is_floating_point() else t.dtype) for t in (q, k, v, m)]
            want = fn(*[t if not t.is_floating_point() else t.double() for t in args])
            _close(attn(*args).cpu().double(), want.cpu(), tol=tol)
        assert len(_compiled(attn)) <= 2 and "?" in attn.compiles[-1].signature, attn.compiles
        n = 40
        q, k, v = (torch.randn(2, 4, n, 32, generator=gen) for _ in range(3))
        m = _square_mask(mask, n, gen).transpose(-2, -1).contiguous().transpose(-2, -1)
        args = [t.to(dev, dtype if t.is_floating_point() else t.dtype) for t in (q, k, v, m)]
        want = fn(*[t if not t.is_floating_point() else t.double() for t in args])
        _close(attn(*args).cpu().double(), want.cpu(), tol=tol)


def _seed_masked_by_zeros(q, k, v, mask):
    s = q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5
    return torch.softmax(s.masked_fill(mask == 0, -1e9), -1) @ v


@needs_vulkan
@pytest.mark.parametrize("fn", [_decode, _seed_masked_by_zeros], ids=["sdpa", "masked_fill"])
@pytest.mark.parametrize("shape", ["qk", "1k", "b1qk", "bhqk"])
def test_vulkan_masks_of_random_lengths_and_layouts(fn, shape):
    """Query and key lengths drawn apart (1 to 130), a mask of [q, k], [1, k], [b, 1, q, k]
    or [b, h, q, k], bool or float, contiguous or transposed, called in turn on one kf
    function: each call matches torch in float64, whichever program serves it."""
    import random

    rnd, gen = random.Random(shape), torch.Generator().manual_seed(len(shape))
    attn = kf.jit(fn, target="vulkan")
    for _ in range(6):
        sq, sk = rnd.choice([1, 2, 7, 16, 33, 64, 100]), rnd.choice([1, 3, 8, 17, 64, 130])
        q = torch.randn(2, 4, sq, 16, generator=gen)
        k, v = (torch.randn(2, 4, sk, 16, generator=gen) for _ in range(2))
        dims = {"qk": (sq, sk), "1k": (1, sk), "b1qk": (2, 1, sq, sk), "bhqk": (2, 4, sq, sk)}[shape]
        m = torch.randn(*dims, generator=gen) if fn is _decode and rnd.random() < 0.5 else \
            torch.rand(*dims, generator=gen) > 0.3
        if fn is _seed_masked_by_zeros:
            m = m.float()
        if rnd.random() < 0.3:
            m = m.transpose(-2, -1).contiguous().transpose(-2, -1)
        want = fn(q.double(), k.double(), v.double(), m.double() if m.is_floating_point() else m)
        _close(attn(q, k, v, m).double(), want)


@needs_vulkan
def test_vulkan_profile_dims_that_fail_together_leave_the_changing_ones_dynamic():
    """The disk profile holds every dim another process saw change (here the batch and the
    heads too), which vulkan's attention cannot take at once; under automatic dynamic the
    dims this process sees change are tried next, so the loop over lengths still takes two
    programs, not one a length."""
    from kf import cache

    def attention(q, k, v):
        return se.fused_attention.fn(q, k, v)

    cache.add_dynamic_profile(attention, {(n, d) for n in "qkv" for d in (0, 1, 2)})
    attn = kf.jit(attention, target="vulkan")
    for n in (17, 33, 65, 40):
        q, k, v = (torch.randn(2, 3, n, 16) for _ in range(3))
        _close(attn(q, k, v), se.fused_attention.fn(q, k, v))
    assert len(attn.compiles) == 2, attn.compiles
    assert "?" in attn.compiles[-1].signature


@needs_vulkan
def test_a_static_fallback_serves_only_its_own_sizes():
    """The profile's dims (heads and lengths) cannot be one vulkan program together, so the
    first call compiles its own sizes; a later call at other heads and lengths binds the
    same signature with run-time sizes and must get a program of its own, not the first
    one (which refuses other sizes at launch). A float argument takes the runtime-scalar
    path, as the backend's attention does."""
    from kf import cache

    def attention(q, k, v, scale: float):
        return torch.softmax(q @ k.transpose(-2, -1) * scale, -1) @ v

    cache.add_dynamic_profile(attention, {(n, d) for n in "qkv" for d in (1, 2)})
    attn = kf.jit(attention, target="vulkan")
    for heads, n in ((2, 7), (4, 8), (4, 5), (2, 7), (3, 11)):
        q, k, v = (torch.randn(2, heads, n, 8) for _ in range(3))
        _close(attn(q, k, v, 0.35), attention(q, k, v, 0.35))


@needs_vulkan
def test_new_heads_and_lengths_take_run_time_lengths_again():
    """A long-lived function (the backend's attention, shared by every model of a process)
    whose heads and lengths both change: vulkan's attention cannot take both at run time,
    so the first call at new heads compiles its own sizes, and from there the lengths are
    run-time sizes again; back at the first heads, the program of those heads serves
    every length."""
    def attention(q, k, v, scale: float):
        return torch.softmax(q @ k.transpose(-2, -1) * scale, -1) @ v

    attn = kf.jit(attention, target="vulkan")
    counts = []
    for heads, n in ((2, 7), (2, 12), (2, 30), (4, 8), (4, 5), (4, 11), (4, 20), (2, 9), (2, 40)):
        q, k, v = (torch.randn(2, heads, n, 8) for _ in range(3))
        _close(attn(q, k, v, 0.35), attention(q, k, v, 0.35))
        counts.append(len(attn.compiles))
    assert counts == [1, 2, 2, 3, 4, 4, 4, 4, 4], counts


def _masked_attention(q, k, v, mask=None):
    s = q @ k.transpose(-2, -1) * 0.35
    if mask is not None:
        s = s.masked_fill(mask.logical_not(), -1e9)
    return torch.softmax(s, -1) @ v


def test_a_mask_passed_later_takes_the_lengths_at_run_time():
    """Generation as Hugging Face's ``generate`` calls attention: a prompt, then one token
    a step against a growing cache, first without a mask, then with a padding mask. The
    mask's first call is at static sizes, so its trace ties the lengths to them; once the
    mask's own dims change, the lengths are tried at run time again, and one program
    serves every later step (before, each step compiled its own). On the cpu: the GPU
    targets' attention kernel takes no mask of a run-time key length yet."""
    attn = kf.jit(_masked_attention, target="cpu")
    counts = []
    for masked in (False, True):
        for n in (11, 12, 13, 14, 15, 16):
            rows = 11 if n == 11 else 1
            q, k, v = torch.randn(2, 4, rows, 8), torch.randn(2, 4, n, 8), torch.randn(2, 4, n, 8)
            mask = None
            if masked:
                mask = torch.ones(2, 1, rows, n, dtype=torch.bool)
                mask[1, ..., :3] = False
            _close(attn(q, k, v, mask), _masked_attention(q.double(), k.double(), v.double(), mask).float())
            counts.append(len(attn.compiles))
    assert counts[-1] - counts[7] == 0 and counts[-1] <= 5, counts


def _attention_and_lse(q, k, v):
    s = q @ k.transpose(-2, -1) * 0.125
    return torch.softmax(s, -1) @ v, torch.logsumexp(s, -1)


@pytest.mark.parametrize("target", TARGETS)
def test_attention_with_its_row_logsumexp_at_run_time_sizes(target):
    """O and the scores' row logsumexp of one program for every sequence length, heads
    before the run-time dim (on vulkan one attention kernel writes both, the logsumexp
    [.., ?] addressed with run-time strides)."""
    f = kf.jit(_attention_and_lse, target=target, dynamic={"q": [2], "k": [2], "v": [2]})
    for sq, sk in ((7, 257), (257, 7), (1, 1), (100, 33)):
        q, k, v = torch.randn(2, 3, sq, 64), torch.randn(2, 3, sk, 64), torch.randn(2, 3, sk, 64)
        (o, lse), (want_o, want_lse) = f(q, k, v), _attention_and_lse(q.double(), k.double(), v.double())
        assert lse.shape == (2, 3, sq) and lse.dtype == torch.float32
        _close(o, want_o.float())
        _close(lse, want_lse.float())
    assert len(f.compiles) == 1 and "?" in f.compiles[0].signature
    if target == "vulkan":
        fused = kf.inspect(f, q, k, v).stages["fused"]
        assert fused.count("call @") == 1 and "_attention(" in fused


@pytest.mark.parametrize("target", TARGETS)
def test_a_size_1_that_changes_the_trace_compiles_apart(target, caplog):
    @kf.jit(target=target, dynamic={"x": [0]})
    def f(x):
        return x.squeeze(0) * 2  # drops dim 0 only at size 1

    with caplog.at_level(logging.INFO, logger="kf.recompiles"):
        for n in (7, 1, 9):
            x = torch.randn(n, 8)
            _close(f(x), f.fn(x))
    assert "'x' dim 0 of size 1 compiled apart" in caplog.text
    assert [c.signature.count("?") for c in f.compiles] == [1, 0]


def test_a_dim_always_1_stays_static():
    f = kf.jit(lambda x: x * 2, target="cpu", dynamic=True)
    for n in (7, 9):
        f(torch.randn(1, n))
    assert "[1, ?]" in f.compiles[0].signature


@needs_vulkan
def test_vulkan_elementwise_chain_one_program():
    @kf.jit(target="vulkan", dynamic=True)
    def f(x, y):
        return torch.relu(x * y + 1.0), torch.sigmoid(x) - y

    for inner in (5, 64):  # one lane a thread, and vectors of 4
        for n in (7, 1, 257, 300, 1000):
            x, y = torch.randn(n, inner), torch.randn(n, inner)
            for got, want in zip(f(x, y), f.fn(x, y)):
                _close(got, want)
    assert [c.signature.count("?") for c in f.compiles] == [2, 2]


@needs_vulkan
def test_vulkan_half_layer_norm_several_rows_a_workgroup():
    """f16 rows of 64 take registers mode, 128 rows a workgroup: the last workgroup's
    rows past the run-time count compute and store nothing."""
    def ln(x, w, b):
        return torch.nn.functional.layer_norm(x, (x.shape[-1],), w, b)

    f = kf.jit(ln, target="vulkan", dynamic={"x": [0]})
    w, b = torch.randn(64, dtype=torch.float16), torch.randn(64, dtype=torch.float16)
    for n in (7, 1, 257, 300, 1000):
        x = torch.randn(n, 64, dtype=torch.float16)
        _close(f(x, w, b), ln(x.float(), w.float(), b.float()).half(), tol=2e-2)
    assert len(f.compiles) == 1


@needs_vulkan
def test_vulkan_non_contiguous_and_large_rows():
    ln = kf.jit(_layer_norm, target="vulkan", dynamic={"x": [0]})
    w, b = torch.randn(8), torch.randn(8)
    for n in (7, 257, 4095):  # (4096, a multiple of 16, is a program of its own: Triton's guard)
        x = torch.randn(8, n).t()  # [n, 8], strided
        _close(ln(x, w, b), _layer_norm(x, w, b))
    assert len(ln.compiles) == 1


@needs_vulkan
def test_vulkan_float_argument_over_8_steps_compiles_once():
    f = kf.jit(_layer_norm, target="vulkan")
    x, w, b = torch.randn(4, 7, 32), torch.randn(32), torch.randn(32)
    for step in range(8):
        eps = 1e-5 * (step + 1)
        _close(f(x, w, b, eps), _layer_norm(x, w, b, eps))
    assert len(f.compiles) == 1


@needs_vulkan
def test_vulkan_run_time_strides_take_the_generic_strategy():
    """A layer norm over [3, n, 16] with n dynamic: dim 0's stride is a run-time size,
    which the rowwise strategy's kernels do not take; the generic strategy's do (flat
    buffers): one program."""
    f = kf.jit(_layer_norm, target="vulkan", dynamic={"x": [1]})
    w, b = torch.randn(16), torch.randn(16)
    for n in (7, 9, 300):
        x = torch.randn(3, n, 16)
        _close(f(x, w, b), _layer_norm(x, w, b))
    assert len(_compiled(f)) == 1 and "?" in f.compiles[0].signature


@needs_vulkan
def test_vulkan_kernel_that_takes_no_run_time_sizes_compiles_each_size_and_says_why(caplog):
    """A variance over the run-time dim (a column variance: the generic strategy's needs
    its count at compile time): each size compiles, and the log says why."""
    f = kf.jit(lambda x: x.var(dim=0), target="vulkan", dynamic={"x": [0]})
    with caplog.at_level(logging.INFO, logger="kf.recompiles"):
        for n in (7, 9):
            x = torch.randn(n, 4)
            _close(f(x), x.var(dim=0))
    assert "compiled for static sizes" in caplog.text and "run-time size in the dims of a variance" in caplog.text
    assert all("?" not in c.signature for c in f.compiles)


def test_long_float_sums_keep_their_stages():
    """A float sum over more than MAX_DYNAMIC_SIZE elements runs in stages (to_cpu's
    blocked_reductions needs the extent), so such sizes compile for their own value: the
    sum of ones(2**25) after ones(3 * 2**23) is 2**25, not the 2**24 a sequential f32
    chain stops at; sizes up to the bound share one program."""
    from kf.signature import MAX_DYNAMIC_SIZE
    from kf.passes.to_cpu import REDUCTION_BLOCK

    assert MAX_DYNAMIC_SIZE <= REDUCTION_BLOCK
    f = kf.jit(lambda x: x.sum(), target="cpu")
    assert f(torch.ones(3 * 2**23)).item() == 3 * 2**23
    assert f(torch.ones(2**25)).item() == 2**25
    g = kf.jit(lambda x: x.sum(-1), target="cpu")
    for n in (300, 1000, 4096):
        x = torch.randn(3, n)
        torch.testing.assert_close(g(x), x.sum(-1), rtol=1e-5, atol=1e-4)
    assert len(g.compiles) == 2  # 300, then one program for 1000 and 4096


def test_sums_over_a_run_time_dim_and_a_long_static_one_compile_static():
    """A sum over a run-time dim and a static one whose product can pass the cpu target's
    staged-sum block compiles for static sizes (its stages need the extent): the sum of
    ones(131071, n) is exact; a softmax over one run-time dim (at most MAX_DYNAMIC_SIZE
    elements) stays one program."""
    from kf.dynamic import _REDUCTION_BLOCK
    from kf.passes.to_cpu import REDUCTION_BLOCK

    assert _REDUCTION_BLOCK == REDUCTION_BLOCK
    f = kf.jit(lambda x: x.sum(), target="cpu")
    for n in (2, 3, 128):
        assert f(torch.ones(2**17 - 1, n)).item() == (2**17 - 1) * n
    g = kf.jit(lambda x: torch.softmax(x, -1), target="cpu")
    for n in (300, 1000, 2000):
        x = torch.randn(5, n)
        torch.testing.assert_close(g(x), torch.softmax(x, -1))
    assert len(g.compiles) == 2


def _ptxas():
    from kf.passes.to_cuda import ptxas_path

    return ptxas_path()


def _causal_attention(q, k, v):
    """The seed attention under a causal mask made in the function (from the indices)."""
    s = q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5
    mask = torch.ones(q.shape[-2], k.shape[-2], device=q.device).tril()
    return torch.softmax(s.masked_fill(mask == 0, -1e9), dim=-1) @ v


def _qkv(d, dtype=torch.float32, heads=(2, 3), n=7):
    return tuple(torch.randn(*heads, n, d).to(dtype) for _ in range(3))


_SEQ = {("q", 2), ("k", 2), ("v", 2)}


@pytest.mark.skipif(not _ptxas(), reason="needs ptxas")
@pytest.mark.parametrize("case", ["layer_norm", "elementwise", "attention", "attention_heads", "attention_bf16_d64",
                                  "attention_bf16_d128", "attention_f16_d128", "causal_bf16_d64",
                                  "causal_bf16_d128"])
def test_dynamic_kernels_assemble_for_sm_90a(case):
    """Without a GPU: the kernels with run-time sizes lower to PTX that ptxas assembles
    for sm_90a without spills, each taking its size slots and a grid over them; f16/bf16
    attention takes the wgmma kernel, not a static fallback."""
    from kf.driver import build
    from kf.options import Options
    from kf.passes.to_cuda import assemble
    from kf.runtime.abi import ProgramABI

    fn, args, dims = {
        "layer_norm": (se.metal_layer_norm.fn, (torch.randn(1, 7, 64), torch.randn(64), torch.randn(64)),
                       {("x", 1)}),
        "elementwise": (lambda x, y: torch.relu(x * y + 1.0), (torch.randn(7, 64), torch.randn(7, 64)),
                        {("x", 0), ("y", 0)}),
        "attention": (se.fused_attention.fn, tuple(torch.randn(1, 1, 7, 32) for _ in range(3)),
                      {("q", 2), ("k", 2), ("v", 2)}),
        "attention_heads": (se.fused_attention.fn, tuple(torch.randn(2, 3, 7, 32) for _ in range(3)),
                            {("q", 2), ("k", 2), ("v", 2)}),
        "attention_bf16_d64": (se.fused_attention.fn, _qkv(64, torch.bfloat16), _SEQ),
        "attention_bf16_d128": (se.fused_attention.fn, _qkv(128, torch.bfloat16), _SEQ),
        "attention_f16_d128": (se.fused_attention.fn, _qkv(128, torch.float16), _SEQ),
        "causal_bf16_d64": (_causal_attention, _qkv(64, torch.bfloat16), _SEQ),
        "causal_bf16_d128": (_causal_attention, _qkv(128, torch.bfloat16), _SEQ),
    }[case]
    sig, tensors = bind(fn, args, {})
    sig = sig.generalize(dims, 16)
    meta, artifacts = build(fn, sig, tensors, Options(target="cuda"), "sm_90a")
    abi = ProgramABI.from_json(meta["abi"])
    assert not abi.is_static and all(k.sizes and k.grid_sizes for k in abi.kernels)
    ptx = next(v for k, v in artifacts.items() if k.endswith(".ptx")).decode()
    kernels = assemble(ptx, "sm_90a").kernels
    assert set(kernels) == {k.entry for k in abi.kernels}
    assert all(k["spill_store_bytes"] == 0 and k["spill_load_bytes"] == 0 for k in kernels.values()), kernels
    if "bf16" in case or "f16" in case:
        assert "wgmma.mma_async" in ptx and "mma.sync.aligned.m16n8k16" not in ptx


def _loops(ptx: str) -> list[str]:
    """The bodies of the PTX's loops: from a label to the branch back to it."""
    import re

    return [m.group(2) for m in re.finditer(r"^(\$L__BB\d+_\d+):\n(.*?)^\s*@%p\d+ bra \s*\1;", ptx, re.S | re.M)]


@pytest.mark.skipif(not _ptxas(), reason="needs ptxas")
@pytest.mark.parametrize("n,d", [(4096, 64), (2048, 128)])
def test_run_time_key_blocks_within_the_keys_are_unguarded(n, d):
    """At a run-time keys' length the key loop is two (Consumer.key_loop): the blocks
    within the keys take the static kernel's softmax, with no per-score guard against the
    length, and only the last block has it: a select a score (64 a thread, blocks of 128
    keys) more than the first loop, which keeps only its copies' edge selects."""
    from kf.driver import build
    from kf.options import Options

    args = tuple(torch.randn(2, 8, n, d).to(torch.bfloat16) for _ in range(3))
    sig, tensors = bind(se.fused_attention.fn, args, {})
    _, artifacts = build(se.fused_attention.fn, sig.generalize(_SEQ, 16), tensors, Options(target="cuda"), "sm_90a")
    ptx = next(v for k, v in artifacts.items() if k.endswith(".ptx")).decode()
    selects = [b.count("selp") for b in _loops(ptx) if "wgmma.mma_async" in b]
    assert len(selects) == 2 and selects[0] < 32 and selects[1] >= selects[0] + 64, selects


# ---- CUDA: the same programs with run-time sizes on the GPU --------------------------------
# The CUDA target takes run-time sizes where they are asked for (dynamic=True or given dims)
# and under automatic dynamic. Every size is checked against torch, and the programs counted.

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")


@pytest.fixture
def cuda_sized():
    return lambda *shape, dtype=torch.float32: torch.randn(*shape, dtype=dtype, device="cuda")


@needs_cuda
def test_cuda_seed_layer_norm_one_program_serves_sizes_1_to_1000(cuda_sized):
    ln = kf.jit(se.metal_layer_norm.fn, target="cuda", dynamic=True)
    w, b = cuda_sized(64), cuda_sized(64)
    for n in (7, 1, 257, 300, 1000, 1):
        x = cuda_sized(1, n, 64)
        _close(ln(x, w, b), se.metal_layer_norm.fn(x, w, b))
    assert len(ln.compiles) == 1 and "?" in ln.compiles[0].signature


def _attention_reference(fn, q, k, v):
    """fn in float64 (the tensor-core kernels round P to q's type: compared at 3e-2)."""
    return fn(q.double(), k.double(), v.double()).to(q.dtype)


@needs_cuda
@pytest.mark.parametrize("dtype,d", [(torch.float32, 64), (torch.bfloat16, 64), (torch.bfloat16, 128),
                                     (torch.float16, 128), (torch.bfloat16, 32), (torch.float16, 256)])
@pytest.mark.parametrize("causal", [False, True])
def test_cuda_seed_attention_one_program_serves_sizes_1_to_1000(cuda_sized, dtype, d, causal):
    """One program for every length: on the H200 f16/bf16 at head dims 64 and 128 take
    the wgmma kernel (under the causal mask at 128: in blocks of 64 keys), 32 and 256 the
    mma.sync one, f32 the SIMT one; queries and keys of the same length, then of others
    (keys longer and shorter than the queries, tails of every kind)."""
    fn = _causal_attention if causal else se.fused_attention.fn
    attn = kf.jit(fn, target="cuda", dynamic={"q": [2], "k": [2], "v": [2]})
    tol = 1e-4 if dtype == torch.float32 else 3e-2
    for n in (7, 1, 257, 300, 1000):
        q, k, v = (cuda_sized(2, 3, n, d, dtype=dtype) for _ in range(3))
        _close(attn(q, k, v), _attention_reference(fn, q, k, v), tol)
    for sq, sk in ((300, 77), (77, 1000), (1, 129), (128, 128), (129, 1)):  # keys of another length
        q = cuda_sized(2, 3, sq, d, dtype=dtype)
        k, v = cuda_sized(2, 3, sk, d, dtype=dtype), cuda_sized(2, 3, sk, d, dtype=dtype)
        _close(attn(q, k, v), _attention_reference(fn, q, k, v), tol)
    # one program for every length, and one more for lengths that are multiples of 16
    # (128 x 128: whole blocks and the wider vector loads)
    assert [c.signature.count("?16") for c in attn.compiles] == [0, 3], \
        [(c.signature, c.reason) for c in attn.compiles]


@needs_cuda
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_cuda_run_time_producer_variant(cuda_sized, dtype):
    """The producer warpgroup at run-time lengths (``attention.run_time_producer``, the
    default, asked for explicitly here): head dim 128 at every kind of tail, keys
    longer and shorter than the queries, and q read through a transpose (flat
    arguments' lean copies with run-time lead strides)."""
    attn = kf.jit(se.fused_attention.fn, target="cuda", dynamic={"q": [2], "k": [2], "v": [2]},
                  variants="attention.run_time_producer=true")
    for n in (7, 1, 128, 129, 257, 300, 1000, 2048):
        q, k, v = (cuda_sized(2, 3, n, 128, dtype=dtype) for _ in range(3))
        _close(attn(q, k, v), _attention_reference(se.fused_attention.fn, q, k, v), 3e-2)
    for sq, sk in ((300, 77), (77, 1000), (1, 129), (129, 1), (256, 384)):
        q = cuda_sized(2, 3, sq, 128, dtype=dtype)
        k, v = cuda_sized(2, 3, sk, 128, dtype=dtype), cuda_sized(2, 3, sk, 128, dtype=dtype)
        _close(attn(q, k, v), _attention_reference(se.fused_attention.fn, q, k, v), 3e-2)
    q = cuda_sized(2, 257, 3, 128, dtype=dtype).transpose(1, 2)
    k, v = cuda_sized(2, 3, 257, 128, dtype=dtype), cuda_sized(2, 3, 257, 128, dtype=dtype)
    _close(attn(q, k, v), _attention_reference(se.fused_attention.fn, q, k, v), 3e-2)


@needs_cuda
def test_cuda_attention_heads_first_and_non_contiguous(cuda_sized):
    """q read through a transpose ([b, s, h, d] stored), k and v of one head: the
    tensor-core kernels at run-time lengths with the strides of a view."""
    attn = kf.jit(se.fused_attention.fn, target="cuda", dynamic={"q": [2], "k": [2], "v": [2]})
    for n in (7, 257, 1000):
        q = cuda_sized(2, n, 3, 64, dtype=torch.bfloat16).transpose(1, 2)
        k, v = cuda_sized(1, 1, n, 64, dtype=torch.bfloat16), cuda_sized(1, 1, n, 64, dtype=torch.bfloat16)
        _close(attn(q, k, v), _attention_reference(se.fused_attention.fn, q, k, v), 3e-2)


@needs_cuda
@pytest.mark.parametrize("dtype,d", [(torch.float32, 32), (torch.bfloat16, 32), (torch.bfloat16, 64),
                                     (torch.float16, 128)])
def test_cuda_seed_attention_automatic_dynamic(cuda_sized, caplog, dtype, d):
    attn = kf.jit(se.fused_attention.fn, target="cuda")
    tol = 1e-4 if dtype == torch.float32 else 3e-2
    with caplog.at_level(logging.INFO, logger="kf.recompiles"):
        for n in SIZES:
            q, k, v = (cuda_sized(1, 2, n, d, dtype=dtype) for _ in range(3))
            _close(attn(q, k, v), _attention_reference(se.fused_attention.fn, q, k, v), tol)
    assert len(attn.compiles) == 2
    assert f"[1, 2, ?, {d}]" in attn.compiles[1].signature


def test_cuda_dim_that_changes_takes_run_time_sizes():
    """Automatic dynamic on the cuda target: the first size compiles for itself, the
    second makes the dim run-time; ``dynamic=True`` gives the signature run-time sizes
    at once, ``dynamic=False`` never. Checked on the signatures of CPU tensors taken as
    the cuda target's, which need no GPU."""
    auto = kf.jit(_layer_norm, target="cuda")
    asked = kf.jit(_layer_norm, target="cuda", dynamic=True)
    static = kf.jit(_layer_norm, target="cuda", dynamic=False)
    for f in (auto, asked, static):
        f.resolve_target = lambda sig: "cuda"
    w, b = torch.randn(64), torch.randn(64)
    assert not auto._bind((torch.randn(1, 7, 64), w, b), {})[0].is_dynamic
    assert auto._bind((torch.randn(1, 9, 64), w, b), {})[0].is_dynamic
    assert asked._bind((torch.randn(1, 7, 64), w, b), {})[0].is_dynamic
    assert not any(static._bind((torch.randn(1, n, 64), w, b), {})[0].is_dynamic for n in (7, 9))


@needs_cuda
def test_cuda_elementwise_chain_and_strided_rows(cuda_sized):
    @kf.jit(target="cuda", dynamic=True)
    def f(x, y):
        return torch.relu(x * y + 1.0), torch.sigmoid(x) - y

    for inner in (5, 64):
        for n in (7, 1, 257, 300, 1000):
            x, y = cuda_sized(n, inner), cuda_sized(n, inner)
            for got, want in zip(f(x, y), f.fn(x, y)):
                _close(got, want)
    assert [c.signature.count("?") for c in f.compiles] == [2, 2]
    ln = kf.jit(_layer_norm, target="cuda", dynamic={"x": [0]})
    w, b = cuda_sized(8), cuda_sized(8)
    for n in (7, 257, 4095):
        x = cuda_sized(8, n).t()
        _close(ln(x, w, b), _layer_norm(x, w, b))


@needs_cuda
def test_cuda_half_layer_norm_and_softmax_rows(cuda_sized):
    def ln(x, w, b):
        return torch.nn.functional.layer_norm(x, (x.shape[-1],), w, b)

    f = kf.jit(ln, target="cuda", dynamic={"x": [0]})
    sm = kf.jit(lambda x: torch.softmax(x, -1), target="cuda", dynamic={"x": [0]})
    w, b = cuda_sized(64, dtype=torch.float16), cuda_sized(64, dtype=torch.float16)
    for n in (7, 1, 257, 300, 1000):
        x = cuda_sized(n, 64, dtype=torch.float16)
        _close(f(x, w, b), ln(x.float(), w.float(), b.float()).half(), tol=2e-2)
        y = cuda_sized(n, 1000)
        _close(sm(y), torch.softmax(y, -1))
    assert len(f.compiles) == 1 and len(sm.compiles) == 1


# ---- matmul and generic kernels with run-time sizes --------------------------------------


def _linear(x, w, b):
    return torch.nn.functional.linear(x, w, b)


def _mlp(x, w1, b1, w2):
    return torch.nn.functional.gelu(x @ w1.t() + b1) @ w2


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_linear_and_mlp_one_program_for_every_row_count(target, dtype):
    """A run-time M in the matmul kernels (rows of A and C): one program serves 1, 7,
    257 and 300 rows, against torch in float64."""
    tol = 1e-4 if dtype == torch.float32 else 3e-2
    lin = kf.jit(_linear, target=target, dynamic={"x": [0]})
    mlp = kf.jit(_mlp, target=target, dynamic={"x": [0]})
    w, b = torch.randn(48, 40, dtype=dtype), torch.randn(48, dtype=dtype)
    w1, b1, w2 = torch.randn(72, 40, dtype=dtype), torch.randn(72, dtype=dtype), torch.randn(72, 24, dtype=dtype)
    for m in (7, 257, 300, 1):
        x = torch.randn(m, 40, dtype=dtype)
        want = _linear(x.double(), w.double(), b.double()).to(dtype)
        _close(lin(x, w, b), want, tol)
        if dtype == torch.float32:  # (bf16: the hidden layer's rounding is the precision policy's)
            _close(mlp(x, w1, b1, w2), _mlp(x, w1, b1, w2), 1e-3)
    assert len(_compiled(lin)) == 1 and "?" in lin.compiles[0].signature
    if dtype == torch.float32:
        assert len(_compiled(mlp)) == 1 and "?" in mlp.compiles[0].signature


@pytest.mark.parametrize("target", TARGETS)
def test_causal_mask_from_arange_over_a_run_time_length(target):
    """``arange(S)[:, None] >= arange(S)[None, :]`` with S a run-time size: kf-canonicalize
    keeps the iotas (an iota along a run-time dim is not the zeros of a dim of size 1)."""
    from kf.backend.attention import attention

    f = kf.jit(attention, target=target, dynamic={"q": [2], "k": [2], "v": [2]})
    for s in (8, 13, 21):
        q, k, v = (torch.randn(2, s, 4, 8).transpose(1, 2) for _ in range(3))
        _close(f(q, k, v, None, 0.35, True), attention(q, k, v, None, 0.35, True))


@needs_vulkan
def test_vulkan_long_rows_with_run_time_strides_keep_the_rowwise_strategy(caplog):
    """A softmax over rows of 2048 with a run-time dim after a static one: the generic
    strategy would recompute each row's statistics per element (kf-tile's
    GENERIC_RUN_TIME_WORK), so the rowwise strategy writes it for each size, and the log
    says why."""
    f = kf.jit(lambda x: torch.softmax(x, -1), target="vulkan", dynamic={"x": [1]})
    with caplog.at_level(logging.INFO, logger="kf.recompiles"):
        for n in (3, 5):
            x = torch.randn(2, n, 2048)
            _close(f(x), torch.softmax(x, -1))
    assert "strides would take run-time sizes" in caplog.text
    assert all("?" not in c.signature for c in f.compiles)
