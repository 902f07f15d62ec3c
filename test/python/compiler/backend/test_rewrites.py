"""The backend's rewrite of the loss: ``cross_entropy(linear(h, W, b) -> view -> float,
target)`` compiled with ``torch.compile(backend="kf")`` becomes kf's fused linear
cross-entropy, so neither AOTAutograd graph holds vocabulary-sized logits; the loss and
every gradient match eager on cpu and vulkan. Patterns it cannot take keep their logits,
with the reason on the ``kf.backend`` logger."""

from __future__ import annotations

import copy
import logging

import pytest
import torch
import torch.nn.functional as F

import kf
from kf.backend import graphs, parse_options
from kf.runtime import vulkan

TARGETS = ["cpu", pytest.param("vulkan", marks=pytest.mark.skipif(not vulkan.is_available(),
                                                                    reason="no Vulkan device"))]
VOCAB = 97


class _LM(torch.nn.Module):
    """A body, a head and the loss as language models write it: the logits flattened to
    rows, cast to float32, against targets with ignored positions."""

    def __init__(self, bias: bool, reduction: str = "mean", dtype=torch.float32, return_logits: bool = False):
        super().__init__()
        self.body = torch.nn.Linear(12, 12, dtype=dtype)
        self.head = torch.nn.Linear(12, VOCAB, bias=bias, dtype=dtype)
        self.reduction = reduction
        self.return_logits = return_logits

    def forward(self, x, y):
        logits = self.head(torch.relu(self.body(x)))
        loss = F.cross_entropy(logits.reshape(-1, logits.shape[-1]).float(), y.view(-1), ignore_index=-1,
                               reduction=self.reduction)
        return (loss, logits) if self.return_logits else loss


def _graphs(monkeypatch) -> list:
    """The largest tensor of each graph the backend compiles, recorded as it compiles it."""
    seen = []
    compile_graph = graphs.compile_graph

    def record(gm, example_inputs, options, kind):
        sizes = [v.numel() for n in gm.graph.nodes for v in [n.meta.get("val")] if isinstance(v, torch.Tensor)]
        seen.append((kind, max(sizes)))
        return compile_graph(gm, example_inputs, options, kind)

    monkeypatch.setattr(graphs, "compile_graph", record)
    return seen


def _batch(seq=9):
    g = torch.Generator().manual_seed(seq)
    x = torch.randn(3, seq, 12, generator=g)
    y = torch.randint(0, VOCAB, (3, seq), generator=g)
    y[0, ::2] = -1
    return x, y


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("bias,reduction", [(False, "mean"), (True, "sum")])
def test_loss_runs_fused_and_matches_eager(target, bias, reduction, monkeypatch, caplog):
    torch.manual_seed(0)
    model = _LM(bias, reduction)
    eager = copy.deepcopy(model)
    seen = _graphs(monkeypatch)
    compiled = torch.compile(model, backend="kf", options={"target": target, "fallback": "eager"})
    with caplog.at_level(logging.INFO, logger="kf.backend"):
        for seq in (9, 9, 14):  # a second call, and a new length
            x, y = _batch(seq)
            loss, want = compiled(x, y), eager(x, y)
            torch.testing.assert_close(loss, want, rtol=1e-5, atol=1e-5)
            loss.backward()
            want.backward()
            for (name, p), q in zip(model.named_parameters(), eager.parameters()):
                torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-6, msg=lambda m: f"{name}: {m}")
            model.zero_grad()
            eager.zero_grad()
    assert "run as kf's fused linear cross-entropy" in caplog.text
    tokens = 3 * 9
    assert {k for k, _ in seen} >= {"forward", "backward"}
    # the head's weight (VOCAB x 12) is the largest tensor: no tokens x VOCAB logits
    assert all(n < tokens * VOCAB for _, n in seen), seen
    report = kf.explain(compiled, *_batch(9), backward=True)
    assert any("linear_cross_entropy" in f.op and f.to == "kf" for f in report.fallbacks), report


def test_loss_logits_option_keeps_the_logits(monkeypatch):
    """``options={"loss": "logits"}``: the ops as they are (the control of the test above)."""
    torch.manual_seed(0)
    model = _LM(False)
    eager = copy.deepcopy(model)
    seen = _graphs(monkeypatch)
    compiled = torch.compile(model, backend="kf", options={"target": "cpu", "fallback": "eager", "loss": "logits"})
    x, y = _batch(9)
    loss, want = compiled(x, y), eager(x, y)
    torch.testing.assert_close(loss, want)
    loss.backward()
    assert max(n for _, n in seen) >= 3 * 9 * VOCAB


def test_logits_read_elsewhere_are_not_fused(caplog):
    """The model returns its logits too: they exist whole anyway, so the pattern is left
    alone (and the log says why)."""
    torch.manual_seed(0)
    model = _LM(True, return_logits=True)
    eager = copy.deepcopy(model)
    compiled = torch.compile(model, backend="kf", options={"target": "cpu", "fallback": "eager"})
    x, y = _batch(9)
    with caplog.at_level(logging.INFO, logger="kf.backend"):
        (loss, logits), (want, want_logits) = compiled(x, y), eager(x, y)
    torch.testing.assert_close(loss, want)
    torch.testing.assert_close(logits, want_logits)
    assert "keeps its logits: the logits are used besides the loss" in caplog.text


def test_inference_computes_no_gradients(monkeypatch):
    """Under no_grad the fused op runs kf's loss-only program: no gradient computed."""
    from kf.nn import linear_cross_entropy as lce

    ran = []
    run = lce._run

    def spy(fn, *args):
        ran.append(fn.__name__)
        return run(fn, *args)

    monkeypatch.setattr(lce, "_run", spy)
    torch.manual_seed(0)
    model = _LM(True)
    compiled = torch.compile(model, backend="kf", options={"target": "cpu", "fallback": "eager"})
    x, y = _batch(9)
    with torch.no_grad():
        torch.testing.assert_close(compiled(x, y), model(x, y))
    assert "_loss_only" in ran and "_chunk" not in ran


def test_bf16_loss_within_eager_rounding():
    """bf16 weights, the loss cast to float32 as language models do: kf's loss and
    gradients are as close to float64's as eager's."""
    torch.manual_seed(0)
    model = _LM(True, dtype=torch.bfloat16)
    eager, exact = copy.deepcopy(model), copy.deepcopy(model).double()
    compiled = torch.compile(model, backend="kf", options={"target": "cpu", "fallback": "eager"})
    x, y = _batch(9)
    loss, want, ref = compiled(x.bfloat16(), y), eager(x.bfloat16(), y), exact(x.double(), y)
    assert loss.dtype == torch.float32
    assert abs(loss.double() - ref).item() <= 2 * abs(want.double() - ref).item() + 1e-2
    for out in (loss, want, ref):
        out.backward()
    for (name, p), q, r in zip(model.named_parameters(), eager.parameters(), exact.parameters()):
        scale = r.grad.abs().max()
        assert (p.grad.double() - r.grad).abs().max() / scale <= 2 * (q.grad.double() - r.grad).abs().max() / scale + 2e-2, name


def test_loss_option_is_checked():
    with pytest.raises(ValueError, match="loss must be 'chunked' or 'logits'"):
        parse_options({"loss": "fused"}, [])
    assert parse_options({"target": "cpu"}, []).loss == "chunked"
