"""torch.compile(backend="kf") on small modules: registration, options, the partition
rule, fallbacks and what the report and the ``kf.backend`` logger say about them."""

from __future__ import annotations

import logging
import subprocess
import sys
import textwrap

import pytest
import torch

import kf
from kf.backend import parse_options
from kf.runtime import vulkan


def test_entry_point_registers_kf_without_importing_it():
    """A fresh process that never imports kf finds backend="kf" through the entry point."""
    code = textwrap.dedent("""
        import sys, torch
        assert "kf" not in sys.modules
        f = torch.compile(lambda x: (x * 2).relu() + 1, backend="kf", options={"target": "cpu", "fallback": "eager"})
        x = torch.randn(5, 7)
        torch.testing.assert_close(f(x), (x * 2).relu() + 1)
        print("ok", "kf" in sys.modules)
    """)
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["ok", "True"]


def test_options_are_checked():
    with pytest.raises(ValueError, match="unknown option"):
        parse_options({"targt": "cpu"}, [])
    with pytest.raises(ValueError, match="fallback must be one of"):
        parse_options({"fallback": "aot_eager"}, [])
    with pytest.raises(ValueError, match="target"):
        parse_options({"target": "tpu"}, [])
    opts = parse_options(None, [torch.randn(2)])
    assert opts.fallback == "inductor"
    # CPU tensors: vulkan only where the Vulkan device is a GPU (lavapipe is not)
    from kf.backend import best_target

    assert opts.target == best_target("cpu")[0]


class _Lgamma(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.lin = torch.nn.Linear(16, 16)

    def forward(self, x):
        h = torch.relu(self.lin(x))
        h = torch.igamma(torch.full_like(h, 2.0), h + 1)  # no kf op: falls back
        return (h * 2 + 1).softmax(-1)


@pytest.mark.parametrize("fallback", ["eager", "inductor"])
def test_fallback_runs_what_kf_leaves_and_report_names_it(fallback, caplog):
    torch.manual_seed(0)
    model = _Lgamma()
    x = torch.randn(7, 16)
    compiled = torch.compile(model, backend="kf", options={"target": "cpu", "fallback": fallback})
    with caplog.at_level(logging.INFO, logger="kf.backend"):
        out = compiled(x)
    want = model(x)
    torch.testing.assert_close(out, want)
    g = torch.randn_like(want)
    (out * g).sum().backward()
    got = model.lin.weight.grad.clone()
    model.zero_grad()
    (want * g).sum().backward()
    torch.testing.assert_close(got, model.lin.weight.grad)

    report = kf.explain(compiled, x, backward=True)
    falls = [f for f in report.fallbacks if f.op == "aten.igamma.default"]
    assert falls and all(f.to == fallback for f in falls)
    assert falls[0].line.endswith(f"test_backend.py:{_Lgamma.forward.__code__.co_firstlineno + 2}")
    assert "kf has no op for aten.igamma.default" in falls[0].reason
    assert any("addmm" in op for r in report.regions for op in r.ops)
    assert "fallback: aten.igamma.default" in str(report)
    assert any("aten.igamma.default" in r.getMessage() for r in caplog.records if r.name == "kf.backend")


def test_views_alone_are_no_region():
    """A region made only of views would copy what the fallback returns as a view."""
    f = torch.compile(lambda x: x.t().reshape(-1)[:5], backend="kf", options={"target": "cpu", "fallback": "eager"})
    x = torch.randn(3, 4)
    torch.testing.assert_close(f(x), x.t().reshape(-1)[:5])
    report = kf.explain(f, x)
    assert not report.regions
    assert report.fallbacks and all("only views" in fb.reason for fb in report.fallbacks)


def test_op_refused_at_compile_falls_back_alone():
    """A handler that refuses its arguments (an index_put with two index tensors) sends
    that op alone to the fallback; the ops around it still run in kf."""
    def f(x, i, j, v):
        y = x * 2
        y = torch.index_put(y, (i, j), v)
        return y + 1

    x, v = torch.randn(6, 5), torch.randn(3)
    i, j = torch.tensor([0, 2, 4]), torch.tensor([1, 3, 0])
    c = torch.compile(f, backend="kf", options={"target": "cpu", "fallback": "eager"})
    torch.testing.assert_close(c(x, i, j, v), f(x, i, j, v))
    report = kf.explain(c, x, i, j, v)
    put = [fb for fb in report.fallbacks if fb.op == "aten.index_put.default"]
    assert put and "UnsupportedOpError" in put[0].reason
    assert report.regions


@pytest.mark.parametrize("n", [1, 7, 257])
def test_odd_sizes_and_strided_outputs(n):
    """Odd sizes; an output that is a transposed view keeps eager's strides."""
    def f(x, w):
        return (x @ w).relu().t(), x.sum(0)

    x, w = torch.randn(n, 3), torch.randn(3, n)
    c = torch.compile(f, backend="kf", options={"target": "cpu", "fallback": "eager"})
    got, want = c(x, w), f(x, w)
    for a, b in zip(got, want):
        torch.testing.assert_close(a, b)
        assert a.shape == b.shape


def test_broadcast_outputs_keep_eager_strides():
    """An output eager returns as an expand (stride 0 on a dim longer than 1) comes back
    with those strides and eager's values; writing kf's contiguous result into such a
    layout is an overlapping copy that torch refuses."""
    def f(x, w):
        y = (x * w).sum(-1, keepdim=True)
        return y.expand(-1, 5) + 0 * y.expand(-1, 5), (x + 1)[:, None, :].expand(-1, 3, -1)

    x, w = torch.randn(7, 4), torch.randn(4)
    c = torch.compile(f, backend="kf", options={"target": "cpu", "fallback": "eager"})
    for got, want in zip(c(x, w), f(x, w)):
        torch.testing.assert_close(got, want)
        assert got.shape == want.shape


def test_restride_of_a_broadcast_layout():
    from kf.backend.regions import _restride

    want = torch.randn(2, 1, 5).expand(2, 4, 5)  # strides (5, 0, 1)
    got = _restride(want.contiguous(), want.stride())
    assert got.stride() == want.stride() and torch.equal(got, want)


def test_empty_input():
    f = torch.compile(lambda x: (x * 3).exp(), backend="kf", options={"target": "cpu", "fallback": "eager"})
    x = torch.randn(0, 4)
    assert f(x).shape == (0, 4)


TARGETS = ["cpu", pytest.param("vulkan", marks=pytest.mark.skipif(not vulkan.is_available(),
                                                                    reason="no Vulkan device"))]


def _regions(c, *args):
    return kf.explain(c, *args).regions


@pytest.mark.parametrize("target", TARGETS)
def test_symbolic_sizes_one_program_serves_every_length(target, caplog):
    """Under Dynamo's symbolic sizes one graph serves every length, and on a target
    whose programs take run-time sizes one kf program serves the region at every
    length too: 5, 9, 17, 257 and 9 again compile it once, each result eager's."""
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    w = torch.randn(16)

    def f(x):
        return torch.softmax(x * w + 1, dim=-1).exp() * 2

    c = torch.compile(f, backend="kf", options={"target": target, "fallback": "eager"})
    with caplog.at_level(logging.INFO, logger="kf.recompiles"):
        for n in (5, 9, 17, 257, 9):
            x = torch.randn(n, 16)
            torch._dynamo.mark_dynamic(x, 0)  # the length alone: the width stays 16
            torch.testing.assert_close(c(x), f(x))
    assert counters["stats"]["unique_graphs"] == 1
    x = torch.randn(9, 16)
    torch._dynamo.mark_dynamic(x, 0)
    (region,) = _regions(c, x)
    assert region.compiles == 1 and region.calls == 6 and not region.static
    assert len(region.sizes.split(", ")) == 1, region.sizes
    assert "run-time sizes" in str(kf.explain(c, x))
    assert not [r for r in caplog.records if r.name == "kf.recompiles" and "compiled for each size" in r.getMessage()]


def test_every_dim_symbolic_on_cpu():
    """``dynamic=True`` makes every dim symbolic (the width and the weight's too): the
    cpu target's program takes them all as run-time sizes, one program in all."""
    torch._dynamo.reset()
    w = torch.randn(16, 16)

    def f(x):
        return torch.softmax(x @ w, dim=-1) * 2

    c = torch.compile(f, backend="kf", dynamic=True, options={"target": "cpu", "fallback": "eager"})
    for n in (5, 9, 17, 257):
        x = torch.randn(n, 16)
        torch.testing.assert_close(c(x), f(x))
    (region,) = _regions(c, torch.randn(9, 16))
    assert region.compiles == 1 and len(region.sizes.split(", ")) == 2, region


@pytest.mark.skipif(not vulkan.is_available(), reason="no Vulkan device")
def test_gpu_kernels_hold_the_sizes_that_do_not_change(caplog):
    """vulkan's kernels take one run-time size each: under ``dynamic=True`` the first
    length compiles for its sizes (the log says why), and once the length changes the
    length alone is run-time, the width held: two programs for four lengths."""
    torch._dynamo.reset()
    w = torch.randn(16)

    def f(x):
        return torch.softmax(x * w + 1, dim=-1).exp() * 2

    c = torch.compile(f, backend="kf", dynamic=True, options={"target": "vulkan", "fallback": "eager"})
    with caplog.at_level(logging.INFO, logger="kf.recompiles"):
        for n in (5, 9, 17, 257):
            x = torch.randn(n, 16)
            torch.testing.assert_close(c(x), f(x))
    (region,) = _regions(c, torch.randn(9, 16))
    assert region.compiles == 2 and "=16 fixed" in region.sizes, region
    assert "more than one run-time size" in region.static
    assert "the sizes that change are tried alone" in caplog.text


def test_size_used_as_a_float_compiles_each_size_and_says_why(caplog):
    """``x.shape[0] ** 0.5``: the size is a value of the region that computes it, which
    kf compiles as a constant, so that region gets a program per length and the report
    and the ``kf.recompiles`` logger say why; the rest of the graph is one program."""
    torch._dynamo.reset()

    def f(x):
        return torch.softmax(x, dim=-1) / x.shape[0] ** 0.5

    c = torch.compile(f, backend="kf", dynamic=True, options={"target": "cpu", "fallback": "eager"})
    with caplog.at_level(logging.INFO, logger="kf.recompiles"):
        for n in (5, 9, 17):
            x = torch.randn(n, 16)
            torch.testing.assert_close(c(x), f(x))
    regions = _regions(c, torch.randn(9, 16))
    static = [r for r in regions if r.static]
    assert len(static) == 1 and static[0].compiles == 3 and "a size used as a value" in static[0].static
    assert "a size used as a value" in str(kf.explain(c, torch.randn(9, 16)))
    assert all(r.compiles == 1 for r in regions if r not in static)
    assert "compiled for each size" in caplog.text


def test_views_and_new_tensors_of_run_time_size_stay_outside(caplog):
    """``table[:n]`` of a graph input and ``torch.zeros(n, 2)`` would put a run-time
    size where kf's IR holds numbers: they run on the fallback (Inductor here) and the
    region takes them as inputs; ``h[:, :16]`` (dim 0 sliced whole) is no slice. One
    program serves every length."""
    torch._dynamo.reset()
    table = torch.randn(64, 16)

    def f(x):
        h = torch.cat([x * 2, torch.zeros(x.shape[0], 2)], 1).softmax(-1)
        return h[:, :16] * table[: x.shape[0]] + 1

    c = torch.compile(f, backend="kf", dynamic=True, options={"target": "cpu", "fallback": "inductor"})
    for n in (5, 9, 17, 33):
        x = torch.randn(n, 16)
        torch.testing.assert_close(c(x), f(x))
    report = kf.explain(c, torch.randn(9, 16))
    (region,) = report.regions
    assert region.compiles == 1 and region.sizes and not region.static, report
    outside = {fb.op: fb.reason for fb in report.fallbacks}
    assert "run-time size" in outside["aten.full.default"] and "run-time size" in outside["aten.slice.Tensor"]


def test_sizes_zero_one_and_past_the_limit_get_programs_of_their_own():
    """A region's program of run-time sizes serves sizes 2..MAX_DYNAMIC_SIZE only:
    sizes 0 and 1 and longer ones are compiled for their own values, as kf.jit's."""
    from kf.backend import regions, sizes
    from kf.options import Options
    from kf.signature import MAX_DYNAMIC_SIZE

    from torch.fx.experimental.proxy_tensor import make_fx

    gm = make_fx(lambda x: (x * 2).exp(), tracing_mode="symbolic")(torch.randn(5, 3))
    plan = sizes.plan(gm)
    assert not isinstance(plan, str) and plan.dims == [[0, 1]] and len(plan.symbols) == 2, plan
    assert plan.serves([torch.randn(7, 3)])
    for n in (0, 1, MAX_DYNAMIC_SIZE + 1):
        assert not plan.serves([torch.randn(n, 3)])
    # on GPU targets every run-time dim of the graph is bounded, a flattened one too
    flat = make_fx(lambda x: x.reshape(-1) * 2, tracing_mode="symbolic")(torch.randn(5, 3))
    big = [torch.randn(2048, 3)]
    assert sizes.plan(flat).serves(big) and not sizes.plan(flat, bound_all=True).serves(big)
    assert sizes.plan(flat, bound_all=True).serves([torch.randn(1024, 3)])
    # the GPU targets' programs take them too
    for target in ("cuda", "vulkan", "metal"):
        assert not isinstance(regions._size_plan(gm, Options(target=target)), str), target
    record = regions.Region("r", "inference", [], [])
    runner = regions.RegionRunner(gm, Options(target="cpu"), record, gm, lambda *a: None)
    for n in (7, 0, 1, 9, MAX_DYNAMIC_SIZE + 1):
        x = torch.randn(n, 3)
        out = runner(x)
        out = out[0] if isinstance(out, (list, tuple)) else out
        torch.testing.assert_close(out, (x * 2).exp())
    assert record.compiles == 4  # run-time sizes (7, 9), 0, 1, MAX_DYNAMIC_SIZE + 1


@pytest.mark.parametrize("how", ["kf", "math"])
@pytest.mark.parametrize("causal", [True, False])
def test_attention_forward_and_backward(how, causal):
    """SDPA (grouped-query, odd length) as kf's attention function (one op with kf's
    fused backward) or as its math form in a kf region: eager's output and gradients."""
    import torch.nn.functional as F

    def f(q, k, v):
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True).relu()

    torch.manual_seed(0)
    q = torch.randn(2, 4, 13, 8, requires_grad=True)
    k, v = (torch.randn(2, 2, 13, 8, requires_grad=True) for _ in range(2))
    c = torch.compile(f, backend="kf", options={"target": "cpu", "fallback": "eager", "attention": how})
    out, want = c(q, k, v), f(q, k, v)
    torch.testing.assert_close(out, want, rtol=1e-4, atol=1e-5)
    g = torch.randn_like(want)
    for a, b in zip(torch.autograd.grad((out * g).sum(), (q, k, v)), torch.autograd.grad((want * g).sum(), (q, k, v))):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)
    report = kf.explain(c, q, k, v, backward=True)
    own = [fb for fb in report.fallbacks if fb.to == "kf"]
    if how == "kf":
        assert {fb.op.split("_")[0] for fb in own} == {"kf.attention"} and len(own) == 2  # forward, backward
    else:
        assert not own and any("aten._softmax.default" in r.ops for r in report.regions)


def test_inductor_compiles_each_segment_between_regions():
    """Two ops kf has no op for, with a kf region between them: two Inductor segments in
    one graph (each compiled on its own, beside AOTAutograd's record of the graph)."""
    def f(x):
        h = torch.igamma(torch.full_like(x, 2.0), x.abs() + 1)
        h = (h * 0.1).exp()
        return torch.igamma(torch.full_like(h, 2.0), h + 1).softmax(-1)

    x = torch.randn(5, 7, requires_grad=True)
    c = torch.compile(f, backend="kf", options={"target": "cpu", "fallback": "inductor"})
    out, want = c(x), f(x)
    torch.testing.assert_close(out, want)
    g = torch.randn_like(want)
    torch.testing.assert_close(torch.autograd.grad((out * g).sum(), x)[0], torch.autograd.grad((want * g).sum(), x)[0])
    report = kf.explain(c, x)
    assert [fb.op for fb in report.fallbacks if fb.to == "inductor"] == ["aten.igamma.default"] * 2


def test_inductor_segment_reads_its_sizes_symbols_from_the_graph():
    """A segment whose inputs' sizes are expressions of a symbol (``[3 * s]``: an
    embedding's rows flattened, the labels viewed as one dim) and that takes nothing of
    size ``s`` itself: it gets the graph's input that binds ``s``, so Inductor can
    compile it at the second length, where Dynamo makes the length symbolic."""
    torch._dynamo.reset()
    emb, head = torch.nn.Embedding(97, 16), torch.nn.Linear(16, 97, bias=False)

    def f(idx, tgt):
        logits = head(torch.tanh(emb(idx)))
        return torch.nn.functional.cross_entropy(logits.view(-1, 97), tgt.view(-1))

    c = torch.compile(f, backend="kf", options={"target": "cpu", "fallback": "inductor"})
    for n in (17, 31, 64):
        idx, tgt = torch.randint(0, 97, (3, n)), torch.randint(0, 97, (3, n))
        out, want = c(idx, tgt), f(idx, tgt)
        torch.testing.assert_close(out, want)
        got = torch.autograd.grad(out, [emb.weight, head.weight])
        torch.testing.assert_close(got, torch.autograd.grad(want, [emb.weight, head.weight]))


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("threads", ["1", "4"])
def test_a_graphs_regions_compile_together_and_repeats_come_from_the_cache(target, threads, tmp_path, monkeypatch):
    """A graph's regions are compiled at once, in threads (``regions.precompile_all``);
    a region that repeats another (the same layer again between attention calls) is
    compiled after them, from the cache the first filled. Outputs and gradients are
    eager's either way, with one thread or several."""
    monkeypatch.setenv("KF_CACHE_DIR", str(tmp_path / "cache"))
    monkeypatch.setenv("KF_COMPILE_THREADS", threads)
    torch._dynamo.reset()
    torch.manual_seed(0)

    class Block(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.a, self.b = torch.nn.Linear(16, 16), torch.nn.Linear(16, 16)

        def forward(self, x):
            h = torch.nn.functional.layer_norm(x, (16,))
            q = self.a(h).view(2, 9, 2, 8).transpose(1, 2)
            o = torch.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True)
            return x + self.b(o.transpose(1, 2).reshape(2, 9, 16)).relu()

    model = torch.nn.Sequential(*[Block() for _ in range(4)])
    c = torch.compile(model, backend="kf", options={"target": target, "fallback": "eager"})
    x = torch.randn(2, 9, 16, requires_grad=True)
    want = model(x)
    (gx_want,) = torch.autograd.grad(want.square().sum(), x)
    got = c(x)
    (gx,) = torch.autograd.grad(got.square().sum(), x)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(gx, gx_want, atol=1e-4, rtol=1e-4)
    regions = _regions(c, x)
    assert len(regions) >= 5, regions
    by_graph = {}
    for r in regions:
        by_graph.setdefault(tuple(r.ops), []).append(r)
    repeated = [rs for rs in by_graph.values() if len(rs) > 1]
    # (the first layer's region reads the graph's input where the others read the layer
    # before: its graph differs; the later ones are the same graph)
    assert repeated and all(sum(r.cached for r in rs) >= 1 for rs in repeated), \
        [[(r.name, r.compiles, r.cached, len(r.ops)) for r in rs] for rs in by_graph.values()]
