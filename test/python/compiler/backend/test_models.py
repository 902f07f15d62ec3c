"""The Llama-style and GPT-2-style decoders of examples/ compiled whole with
``torch.compile(backend="kf")`` on cpu and vulkan: the forward and every parameter's
gradient match eager at three sequence lengths, with ``fullgraph=True`` and with a graph
break inside the model. Sizes are small; the second and third lengths run through
Dynamo's symbolic sizes, for which a kf region is one program of run-time sizes."""

from __future__ import annotations

import copy

import pytest
import torch

import gpt2
import llama
from kf.runtime import vulkan

SEQS = (8, 13, 21)
TARGETS = ["cpu", pytest.param("vulkan", marks=pytest.mark.skipif(not vulkan.is_available(),
                                                                    reason="no Vulkan device"))]


def _llama():
    return llama.Llama(llama.LlamaConfig(vocab=64, width=32, layers=1, heads=4, kv_heads=2, hidden=48, max_seq=64))


def _gpt2():
    return gpt2.GPT2(gpt2.GPT2Config(vocab=64, width=32, layers=1, heads=2, max_seq=64))


MODELS = {"llama": _llama, "gpt2": _gpt2}


class _Printing(torch.nn.Module):
    """A block behind a print: Dynamo breaks the graph there."""

    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def forward(self, *args):
        print("kf test: a graph break")
        return self.inner(*args)


def _check(model, target: str, fullgraph: bool, dynamic: bool | None = None, fallback: str = "eager"):
    eager = copy.deepcopy(model)
    compiled = torch.compile(model, backend="kf", fullgraph=fullgraph, dynamic=dynamic,
                             options={"target": target, "fallback": fallback})
    for seq in SEQS:
        x = torch.randint(0, 64, (2, seq))
        if dynamic:
            torch._dynamo.mark_static(x, 0)  # the batch: the length alone changes
        out, want = compiled(x), eager(x)
        torch.testing.assert_close(out, want, rtol=1e-4, atol=1e-5)
        g = torch.randn_like(want)
        (out * g).sum().backward()
        (want * g).sum().backward()
        for (name, p), q in zip(model.named_parameters(), eager.parameters()):
            assert p.grad is not None, name
            torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-5, msg=lambda m: f"{name} seq {seq}: {m}")
        model.zero_grad(set_to_none=True)
        eager.zero_grad(set_to_none=True)
    return compiled


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("name", sorted(MODELS))
def test_fullgraph_matches_eager(name, target):
    torch.manual_seed(0)
    compiled = _check(MODELS[name](), target, fullgraph=True)
    import kf

    report = kf.explain(compiled, torch.randint(0, 64, (2, 8)), backward=True)
    kinds = {g.kind for g in report.graphs}
    assert {"forward", "backward"} <= kinds
    assert report.regions and report.kernels
    # attention, norms and the MLP run in kf: no matmul or softmax falls back
    assert not [f for f in report.fallbacks if "mm" in f.op or "softmax" in f.op], report


@pytest.mark.parametrize("name", sorted(MODELS))
def test_default_fallback_matches_eager(name):
    """The backend's defaults, as a user gets them: what kf leaves goes to Inductor, in
    segments between kf's regions, which take Dynamo's symbolic length from the second
    length on."""
    torch._dynamo.reset()
    torch.manual_seed(0)
    _check(MODELS[name](), "cpu", fullgraph=True, fallback="inductor")


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("name", sorted(MODELS))
def test_graph_break_matches_eager(name, target, capsys):
    torch.manual_seed(0)
    model = MODELS[name]()
    model.blocks[0] = _Printing(model.blocks[0])
    _check(model, target, fullgraph=False)
    assert "a graph break" in capsys.readouterr().out


@pytest.mark.parametrize("name, target", [("llama", "cpu")] + [pytest.param(n, "vulkan", marks=TARGETS[1].marks)
                                                                 for n in ("llama", "gpt2")])
def test_symbolic_lengths_compile_each_region_once(caplog, name, target):
    """``dynamic=True`` over three sequence lengths (the batch held): forward and every
    gradient match eager, and each kf region, forward and backward, is one program of
    run-time sizes, compiled once, except where the report says why not. On vulkan every
    region's kernels take the run-time length: matmuls with run-time rows (and K in the
    weight gradients), the generic strategy's transposes, rotary embedding, column
    sums with run-time strides, and bias gradients summed over the batch and the length
    in two stages."""
    import logging

    import kf

    torch._dynamo.reset()
    torch.manual_seed(0)
    with caplog.at_level(logging.INFO, logger="kf.recompiles"):
        compiled = _check(MODELS[name](), target, fullgraph=True, dynamic=True)
    x = torch.randint(0, 64, (2, SEQS[0]))
    torch._dynamo.mark_static(x, 0)
    report = kf.explain(compiled, x, backward=True)
    counts = {r.name: (r.compiles, r.sizes, r.static) for r in report.regions}
    one = [r for r in report.regions if r.sizes and r.compiles == 1 and not r.static]
    assert {r.graph for r in one} == {"forward", "backward"}, counts
    assert all(r in one for r in report.regions if r.graph == "forward"), counts
    for r in report.regions:  # a region that is not one program: a program per length, and why
        assert r in one or (r.static and r.compiles == len(SEQS) and r.static in caplog.text), counts
    if target == "vulkan":  # (GPT-2's position embedding gradient too: its positions' count)
        assert all(r in one for r in report.regions), counts


def test_bf16_within_eager_rounding():
    """bf16 weights: kf's forward and gradients are as far from float32's as eager's are."""
    torch.manual_seed(0)
    model = _llama().to(torch.bfloat16)
    eager, exact = copy.deepcopy(model), copy.deepcopy(model).float()
    x = torch.randint(0, 64, (2, 16))
    compiled = torch.compile(model, backend="kf", options={"target": "cpu", "fallback": "eager"})
    out, want, ref = compiled(x), eager(x), exact(x)
    assert out.dtype == torch.bfloat16
    assert (out.float() - ref).abs().max() <= 2 * (want.float() - ref).abs().max() + 1e-2
    for y in (out, want, ref):
        y.float().square().sum().backward()
    for (name, p), q, r in zip(model.named_parameters(), eager.parameters(), exact.parameters()):
        scale = r.grad.abs().max()
        assert (p.grad.float() - r.grad).abs().max() / scale <= 3 * (q.grad.float() - r.grad).abs().max() / scale + 1e-2, name


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("name", sorted(MODELS))
def test_training_loss_matches_eager_through_the_fused_loss(name, target, caplog):
    """The examples' training loop (``model(x, y)`` returns the loss): kf's losses and
    first gradients match eager's over three steps, and the loss ran as kf's fused linear
    cross-entropy (the tied embedding of GPT-2 gets both of its gradients)."""
    import logging

    import whole_model

    # a graph break inside the blocks' loop (test_graph_break_matches_eager) makes Dynamo
    # skip the model's forward frame for the rest of the process: start afresh
    torch._dynamo.reset()
    with caplog.at_level(logging.INFO, logger="kf.backend"):
        r = whole_model.compare(MODELS[name], target=target, fallback="eager", steps=3, batch=2, seq=13)
    torch.testing.assert_close(torch.tensor(r["kf"]), torch.tensor(r["eager"]), rtol=1e-4, atol=1e-5)
    assert r["grad_diff"] < 1e-4
    assert "run as kf's fused linear cross-entropy" in caplog.text, [r.getMessage() for r in caplog.records]


def test_repeated_layers_compile_once(tmp_path, monkeypatch):
    """Five layers: the regions of the layers that compute the same (the same ops at the
    same sizes, other node names) take the first one's program from kf's cache, in the
    forward and in the backward, and the model still matches eager."""
    import kf

    monkeypatch.setenv("KF_CACHE_DIR", str(tmp_path))
    torch._dynamo.reset()
    torch.manual_seed(0)
    model = llama.Llama(llama.LlamaConfig(vocab=64, width=32, layers=5, heads=4, kv_heads=2, hidden=48, max_seq=64))
    eager = copy.deepcopy(model)
    # static sizes: a length an earlier test of this process made symbolic (Dynamo's
    # automatic dynamic profile) would give regions of run-time sizes instead
    compiled = torch.compile(model, backend="kf", fullgraph=True, dynamic=False,
                             options={"target": "cpu", "fallback": "eager"})
    x = torch.randint(0, 64, (2, 8))
    out, want = compiled(x), eager(x)
    torch.testing.assert_close(out, want, rtol=1e-4, atol=1e-5)
    out.square().sum().backward()
    want.square().sum().backward()
    for (name, p), q in zip(model.named_parameters(), eager.parameters()):  # (five layers of f32 rounding)
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-3, atol=1e-4, msg=lambda m: f"{name}: {m}")
    report = kf.explain(compiled, x, backward=True)
    # (after a symbolic run of the model in this process, two middle layers' backward
    # regions keep texts of their own: at least one shares)
    for graph, least in (("forward", 2), ("backward", 1)):
        regions = [r for r in report.regions if r.graph == graph]
        assert sum(r.cached for r in regions) >= least, [(r.name, r.compiles, r.cached) for r in regions]
