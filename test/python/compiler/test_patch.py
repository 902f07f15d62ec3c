"""kf.patch / kf.unpatch: standard modules and functions swapped for kf functions."""

import warnings

import pytest
import torch
import torch.nn.functional as F

import importlib

import kf

kf_patch = importlib.import_module("kf.patching")


@kf.jit(target="cpu")
def layer_norm(x, weight, bias, eps=1e-5):
    mean = x.mean(dim=-1, keepdim=True)
    var = ((x - mean) * (x - mean)).mean(dim=-1, keepdim=True)  # biased, as nn.LayerNorm
    return weight * (x - mean) / torch.sqrt(var + eps) + bias


@kf.jit(target="cpu")
def gelu(x):
    return torch.nn.functional.gelu(x)


@kf.jit(target="cpu")
def linear(x, weight, bias):
    return torch.matmul(x, weight.t()) + bias


@kf.jit(target="cpu")
def wrong_gelu(x):
    return torch.relu(x)  # close to GELU only far from zero


class MLP(torch.nn.Module):
    def __init__(self, d=32):
        super().__init__()
        self.norm = torch.nn.LayerNorm(d)
        self.up = torch.nn.Linear(d, 2 * d)
        self.act = torch.nn.GELU()
        self.down = torch.nn.Linear(2 * d, d)
        self.norm2d = torch.nn.LayerNorm([4, d])  # over two dims: the kf layer norm cannot stand in

    def forward(self, x):
        h = self.down(self.act(self.up(self.norm(x))))
        return self.norm2d(h + x)


def _model():
    torch.manual_seed(0)
    m = MLP()
    with torch.no_grad():
        m.norm.weight.uniform_(0.5, 1.5)
        m.norm.bias.uniform_(-0.5, 0.5)
    return m


def test_modules_replaced_and_restored():
    m = _model()
    x = torch.randn(2, 4, 32)
    with torch.no_grad():
        ref = m(x)
    report = kf.patch(m, {torch.nn.LayerNorm: layer_norm, torch.nn.Linear: linear, torch.nn.GELU: gelu})
    replaced = {e.where: e for e in report.replaced}
    assert set(replaced) == {"norm", "up", "act", "down"}
    (skipped,) = report.skipped
    assert skipped.where == "norm2d" and "2 dims" in skipped.reason
    assert "4 replaced, 1 left alone" in str(report)
    with torch.no_grad():
        out = m(x)
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-4)
    assert all(e.calls == 1 for e in report.replaced)
    assert m.norm.forward.__kf_patch__ is replaced["norm"]
    kf.unpatch(m)
    assert "forward" not in m.norm.__dict__ and "forward" not in m.up.__dict__
    with torch.no_grad():
        torch.testing.assert_close(m(x), ref)
    assert all(e.calls == 1 for e in report.replaced)  # the kf functions ran no more


def test_patched_model_trains_with_kf_gradients():
    m = _model()
    ref = _model()
    x = torch.randn(2, 4, 32)
    kf.patch(m, {torch.nn.LayerNorm: layer_norm, torch.nn.Linear: linear})
    m(x).square().mean().backward()
    ref(x).square().mean().backward()
    for (n, p), (_, q) in zip(m.named_parameters(), ref.named_parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-5, msg=n)
    kf.unpatch(m)


def test_module_attributes_are_read_at_each_call():
    m = _model()
    kf.patch(m, {torch.nn.LayerNorm: layer_norm})
    x = torch.randn(2, 4, 32)
    with torch.no_grad():
        m.norm.bias.add_(1.0)  # an optimizer step
        got = m.norm(x)
    want = F.layer_norm(x, (32,), m.norm.weight, m.norm.bias)
    torch.testing.assert_close(got, want.detach(), rtol=1e-4, atol=1e-4)
    kf.unpatch(m)


def test_function_form_patches_torch_nn_functional():
    x = torch.randn(8, 32)
    report = kf.patch(None, {F.gelu: gelu, F.layer_norm: layer_norm})
    try:
        assert F.gelu is not torch._C._nn.gelu
        torch.testing.assert_close(F.gelu(x), torch._C._nn.gelu(x))
        # nn.GELU calls F.gelu: it goes through kf too
        torch.nn.GELU()(x)
        w, b = torch.rand(32) + 0.5, torch.randn(32)
        torch.testing.assert_close(F.layer_norm(x, (32,), w, b), F.layer_norm.__wrapped__(x, (32,), w, b),
                                   rtol=1e-4, atol=1e-4)
        # a call the kf function cannot express runs torch's own
        F.gelu(x, approximate="tanh")
        gelu_entry, ln_entry = report.entries
        assert gelu_entry.calls == 2 and ln_entry.calls == 1  # the tanh call ran torch's
        assert gelu_entry.status == "replaced"
    finally:
        kf.unpatch(report)
    assert F.gelu is torch._C._nn.gelu
    assert not hasattr(F.layer_norm, "__kf_patch__")


def test_validate_falls_back_and_warns_once():
    m = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.GELU())
    report = kf.patch(m, {torch.nn.GELU: wrong_gelu}, validate=1.0)
    x = torch.randn(4, 16)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with torch.no_grad():
            first = m(x)
            second = m(x)
    ours = [w for w in caught if "kf.patch" in str(w.message)]
    assert len(ours) == 1
    message = str(ours[0].message)
    assert "differs from torch's" in message and "max abs difference" in message and "float32" in message
    (entry,) = report.entries
    assert entry.status == "fell back" and entry.validated == 1 and entry.calls == 1
    with torch.no_grad():
        want = F.gelu(m[0](x))
    torch.testing.assert_close(first, want)
    torch.testing.assert_close(second, want)
    kf.unpatch(m)


def test_validate_fraction_and_a_correct_kernel_stays():
    m = torch.nn.Sequential(torch.nn.Linear(16, 16), torch.nn.GELU())
    report = kf.patch(m, {torch.nn.GELU: gelu}, validate=0.25, seed=1)
    x = torch.randn(4, 16)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with torch.no_grad():
            for _ in range(40):
                m(x)
    (entry,) = report.entries
    assert entry.status == "replaced" and entry.calls == 40
    assert 3 <= entry.validated <= 20  # about a quarter, from a seeded generator
    kf.unpatch(m)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
def test_tolerances_follow_the_dtype(dtype):
    want = torch.linspace(1, 2, 64).to(dtype)
    rtol, atol = kf_patch.TOLERANCES[dtype]
    assert kf_patch._difference(want + (rtol * 0.5) * want, want) is None
    assert kf_patch._difference(want + 10 * (atol + rtol * 2) * torch.ones_like(want), want) is not None


def test_compile_failure_falls_back_to_torch():
    @kf.jit(target="cpu")
    def uses_airy_ai(x):
        return torch.special.airy_ai(x)

    m = torch.nn.Sequential(torch.nn.GELU())
    report = kf.patch(m, {torch.nn.GELU: uses_airy_ai})
    x = torch.randn(3, 5)
    with pytest.warns(RuntimeWarning, match="kf could not compile it"):
        out = m(x)
    torch.testing.assert_close(out, F.gelu(x))
    assert report.entries[0].status == "fell back"
    kf.unpatch(m)


def test_bad_keys_are_refused():
    with pytest.raises(TypeError, match="nn.Module"):
        kf.patch(torch.nn.Linear(2, 2), {int: gelu})
    with pytest.raises(TypeError, match="torch.nn.functional"):
        kf.patch(None, {torch.relu: gelu})
    with pytest.raises(ValueError):
        kf.patch(None, {}, validate=2.0)


def test_patched_model_under_torch_compile_fullgraph():
    m = _model()
    ref = _model()
    report = kf.patch(m, {torch.nn.LayerNorm: layer_norm, torch.nn.Linear: linear}, validate=0.5)
    compiled = torch.compile(m, fullgraph=True)
    x = torch.randn(2, 4, 32)
    torch.testing.assert_close(compiled(x), ref(x), rtol=1e-4, atol=1e-4)
    assert all(e.status == "replaced" for e in report.replaced)
    kf.unpatch(m)


def test_patched_model_compiles_once_under_torch_compile():
    # Python state the patched forward changes inside the compiled region (a call counter)
    # would be a guard that fails on every call: Dynamo would recompile until its limit.
    m = _model()
    kf.patch(m, {torch.nn.LayerNorm: layer_norm, torch.nn.Linear: linear, torch.nn.GELU: gelu})
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    compiled = torch.compile(m, backend=backend, fullgraph=True)
    x = torch.randn(2, 4, 32)
    for _ in range(4):
        compiled(x)
    assert len(graphs) == 1
    kf.unpatch(m)


@kf.jit(target="cpu")
def rms_norm_w(x, w, eps):
    return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + eps) * w


@kf.jit(target="cpu")
def rms_norm(x, weight, eps):
    return x * torch.rsqrt((x * x).mean(-1, keepdim=True) + eps) * weight


def test_patch_leaves_a_module_whose_arguments_it_cannot_fill():
    # 'w' is no attribute of nn.RMSNorm and its forward gives only the input: the patch
    # would fail at the first call, so it leaves the module alone and says why
    m = torch.nn.RMSNorm(16)
    report = kf.patch(m, {torch.nn.RMSNorm: rms_norm_w})
    assert not report.replaced and "forward" not in m.__dict__
    (entry,) = report.skipped
    assert "'w'" in entry.reason and "weight" in entry.reason
    x = torch.randn(3, 16)
    torch.testing.assert_close(m(x), F.rms_norm(x, (16,), m.weight))


@pytest.mark.parametrize("eps", [None, 1e-3])
def test_rms_norm_module_eps(eps):
    # nn.RMSNorm's eps=None is the input dtype's machine epsilon, as torch reads it
    m = torch.nn.RMSNorm(16, eps=eps)
    with torch.no_grad():
        m.weight.uniform_(0.5, 1.5)
    x = torch.randn(5, 16) * 1e-3
    want = m(x)
    report = kf.patch(m, {torch.nn.RMSNorm: rms_norm})
    assert len(report.replaced) == 1
    torch.testing.assert_close(m(x), want, rtol=1e-5, atol=1e-6)
    assert report.entries[0].calls == 1
    kf.unpatch(m)


def test_function_form_for_a_builtin_with_several_arguments():
    import seed_examples as se

    attention = se.fused_attention.with_options(target="cpu")
    q, k, v = (torch.randn(1, 2, 16, 8) for _ in range(3))
    report = kf.patch(None, {F.scaled_dot_product_attention: attention})
    try:
        want = torch._C._nn.scaled_dot_product_attention(q, k, v)
        torch.testing.assert_close(F.scaled_dot_product_attention(q, k, v), want, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(F.scaled_dot_product_attention(q, k, v, dropout_p=0.0), want, rtol=1e-4, atol=1e-5)
        # is_causal=True is not something the seed's attention takes: torch runs it
        causal = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        torch.testing.assert_close(causal, torch._C._nn.scaled_dot_product_attention(q, k, v, is_causal=True))
        assert report.entries[0].calls == 2 and report.entries[0].status == "replaced"
    finally:
        kf.unpatch(report)
    assert F.scaled_dot_product_attention is torch._C._nn.scaled_dot_product_attention


@kf.jit(target="cpu")
def batch_norm(x, running_mean, running_var, weight, bias, momentum=0.1, eps=1e-5):
    return F.batch_norm(x, running_mean, running_var, weight, bias, training=True, momentum=momentum, eps=eps)


def test_validated_writes_reach_the_module_once():
    torch.manual_seed(0)
    eager, patched = torch.nn.BatchNorm1d(5), torch.nn.BatchNorm1d(5)
    patched.load_state_dict(eager.state_dict())
    report = kf.patch(patched, {torch.nn.BatchNorm1d: batch_norm}, validate=1.0)
    try:
        for _ in range(3):
            x = torch.randn(8, 5, 3) * 2 + 1
            with torch.no_grad():
                torch.testing.assert_close(patched(x), eager(x))
        assert report.entries[0].status == "replaced" and report.entries[0].validated == 3
        # kf's writes were undone before torch's original wrote them: one update a call
        torch.testing.assert_close(patched.running_mean, eager.running_mean)
        torch.testing.assert_close(patched.running_var, eager.running_var)
    finally:
        kf.unpatch(patched)
