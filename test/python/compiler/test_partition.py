"""What a forward saves for its backward (compiler/partition.py): kf's rule, and the
interface attention's backward kernels build on."""

import re

import pytest
import torch

import kf
from kf import autograd, torch_ops

import seed_examples as se

D = torch.float64
attention = se.fused_attention.with_options(target="cpu")


@kf.jit(target="cpu")
def layer_norm(x, weight, bias, eps=1e-5):
    mean = x.mean(dim=-1, keepdim=True)
    var = x.var(dim=-1, keepdim=True)
    return weight * (x - mean) / torch.sqrt(var + eps) + bias


@kf.jit(target="cpu")
def rms_norm(x, weight, eps=1e-6):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + eps) * weight


@kf.jit(target="cpu")
def softmax(x):
    return torch.softmax(x, dim=-1)


@kf.jit(target="cpu")
def mlp(x, w1, w2):
    return torch.nn.functional.gelu(x @ w1) @ w2


def _training(kfn, *args):
    """The split forward and backward of this call (derived as autograd derives it)."""
    autograd.backward_of(kfn, *args)
    tensors, structure = torch_ops.flatten_call(kfn, args, {})
    return torch_ops.training_of(kfn, structure, [t.detach() for t in tensors])[0]


def _scores(q, k, mask):
    s = q @ k.transpose(-2, -1) / q.shape[-1] ** 0.5
    return s if mask is None else s.masked_fill(mask == 0, -1e9)


@pytest.mark.parametrize("masked", [False, True])
def test_attention_saves_q_k_v_mask_output_and_lse(masked):
    torch.manual_seed(0)
    q, k, v = (torch.randn(2, 3, 13, 5, dtype=D, requires_grad=True) for _ in range(3))
    mask = torch.tril(torch.ones(13, 13, dtype=torch.long)) if masked else None
    out = attention(q, k, v, mask)
    saved = out.grad_fn.saved_tensors
    want = [q, k, v] + ([mask] if masked else []) + [out]
    assert len(saved) == len(want) + 1
    for s, w in zip(saved, want):
        assert torch.equal(s, w)
    lse = saved[-1]
    # f32 statistic of f64 scores is f64; one value a query row, natural log
    assert lse.shape == (2, 3, 13, 1) and lse.dtype == D
    torch.testing.assert_close(lse, torch.logsumexp(_scores(q, k, mask), -1, keepdim=True))
    # nothing as large as the score matrix is saved
    assert all(t.numel() < 13 * 13 * 6 for t in saved)


def test_attention_forward_ir_holds_logsumexp_of_the_softmax_scores():
    q, k, v = (torch.randn(1, 2, 8, 4) for _ in range(3))
    mask = torch.tril(torch.ones(8, 8))
    training = _training(attention, q, k, v, mask)
    ir = kf.inspect(training.forward, q, k, v, mask).kf_ir
    (sm,) = re.findall(r'"kf.softmax"\((%\w+)\)', ir)
    (lse,) = re.findall(r'"kf.logsumexp"\((%\w+)\) \{dims = array<i64: 3>, keepdim = true\}.*-> tensor<1x2x8x1xf32>', ir)
    assert sm == lse  # the same scores value: the attention kernel can write lse beside O
    assert [e[2] for e in training.extras] == ["lse"]


def test_attention_backward_recomputes_probabilities_from_lse_and_delta_from_output():
    q, k, v = (torch.randn(1, 2, 8, 4, dtype=torch.bfloat16) for _ in range(3))
    bwd = autograd.backward_of(attention, q, k, v)
    src = open(bwd.source).read()
    args = re.search(r"def \w+\((.*)\):", src).group(1).split(", ")
    assert args[3] == "out0" and args[4].startswith("saved_logsumexp") and len(args) == 6  # q k v O lse dO
    assert "aten.exp.default" in src and "_softmax" not in src
    # D = rowsum(dO * O): the saved output times its gradient
    assert re.search(r"aten\.(mul\.Tensor|_to_copy\.default)\([^)]*\bout0\b", src)
    ir = bwd.inspect().kf_ir
    assert "kf.softmax" not in ir and "kf.exp" in ir
    # the backward takes O's and lse's types: bf16 output, f32 statistic
    assert [str(t.dtype) for t in bwd.example_args[3:5]] == ["torch.bfloat16", "torch.float32"]


def test_norm_saves_its_row_statistics_only():
    x, w, b = (torch.randn(*s, dtype=D, requires_grad=True) for s in [(7, 33), (33,), (33,)])
    # each output is held while its grad_fn's saved tensors are read: torch 2.11 frees a
    # node's saved outputs with its last output (2.13 keeps them with the node)
    out = layer_norm(x, w, b)
    saved = out.grad_fn.saved_tensors
    assert [tuple(t.shape) for t in saved] == [(7, 33), (33,), (33,), (7, 1), (7, 1)]
    torch.testing.assert_close(saved[3], x.mean(-1, keepdim=True))
    torch.testing.assert_close(saved[4], x.var(-1, keepdim=True))
    out = rms_norm(x, w)
    saved = out.grad_fn.saved_tensors
    assert [tuple(t.shape) for t in saved] == [(7, 33), (33,), (7, 1)]
    torch.testing.assert_close(saved[2], x.pow(2).mean(-1, keepdim=True))


def test_softmax_saves_its_output_not_lse():
    x = torch.randn(5, 17, dtype=D, requires_grad=True)
    y = softmax(x)
    saved = y.grad_fn.saved_tensors
    assert len(saved) == 2 and torch.equal(saved[1], y)


def test_matmul_products_are_saved_elementwise_results_recomputed():
    x, w1, w2 = (torch.randn(*s, dtype=D, requires_grad=True) for s in [(6, 8), (8, 16), (16, 4)])
    out = mlp(x, w1, w2)  # held while its saved tensors are read (torch 2.11 frees them with it)
    saved = out.grad_fn.saved_tensors
    # x @ w1 is saved (a GEMM to recompute); its GELU is recomputed from it
    assert [tuple(t.shape) for t in saved] == [(6, 8), (8, 16), (16, 4), (6, 16)]
    torch.testing.assert_close(saved[3], x @ w1)
    assert torch.autograd.gradcheck(mlp, (x, w1, w2))


def test_forward_runs_once_under_autograd_and_nothing_is_saved_without_it():
    @kf.jit(target="cpu")
    def norm(x, weight, bias):
        mean = x.mean(dim=-1, keepdim=True)
        return weight * (x - mean) * torch.rsqrt(((x - mean) ** 2).mean(-1, keepdim=True) + 1e-5) + bias

    x, w, b = (torch.randn(*s, requires_grad=True) for s in [(9, 31), (31,), (31,)])
    with torch.no_grad():
        with kf.profile() as prof:
            norm(x, w, b)
    assert [k.function for k in prof.launches] == ["norm"]
    assert not norm._trainings  # nothing derived, nothing saved
    norm(x, w, b).sum().backward()  # compiles both
    with kf.profile() as prof:
        out = norm(x, w, b)
        out.backward(torch.ones_like(out))
    assert [k.function for k in prof.launches] == ["norm_forward", "norm_backward"]


@kf.jit(target="cpu")
def f_layer_norm(x, weight, bias):
    return torch.nn.functional.layer_norm(x, x.shape[-1:], weight, bias, 1e-5)


@kf.jit(target="cpu")
def f_rms_norm(x, weight):
    return torch.nn.functional.rms_norm(x, x.shape[-1:], weight, 1e-6)


def test_torch_norms_save_their_statistics():
    """F.layer_norm (aten.native_layer_norm in the joint graph) saves its mean and rstd;
    F.rms_norm (``mean(x * x).add_(eps)``) its mean square, untouched by the backward's
    ``+ eps`` (done out of place); neither backward recomputes the norm."""
    x, w, b = (torch.randn(*s, dtype=D, requires_grad=True) for s in [(257, 31), (31,), (31,)])
    out = f_layer_norm(x, w, b)  # held while its saved tensors are read (torch 2.11 frees them with it)
    saved = out.grad_fn.saved_tensors
    assert [tuple(t.shape) for t in saved] == [(257, 31), (31,), (31,), (257, 1), (257, 1)]
    torch.testing.assert_close(saved[3], x.mean(-1, keepdim=True))
    torch.testing.assert_close(saved[4], torch.rsqrt(x.var(-1, correction=0, keepdim=True) + 1e-5))
    src = open(autograd.backward_of(f_layer_norm, x, w, b).source).read()
    assert "native_layer_norm" not in src
    out = f_rms_norm(x, w)
    saved = out.grad_fn.saved_tensors
    assert [tuple(t.shape) for t in saved] == [(257, 31), (31,), (257, 1)]
    want = x.pow(2).mean(-1, keepdim=True)
    torch.testing.assert_close(saved[2], want)
    g = torch.randn_like(out)
    for _ in range(2):  # the saved mean square is the same for a second backward
        got = torch.autograd.grad(out, (x, w), g, retain_graph=True)
        torch.testing.assert_close(saved[2], want)
    xr, wr = x.detach().requires_grad_(), w.detach().requires_grad_()
    for a, e in zip(got, torch.autograd.grad(f_rms_norm.fn(xr, wr), (xr, wr), g)):
        torch.testing.assert_close(a, e)
