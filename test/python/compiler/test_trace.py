"""The light tracer (kf/trace.py) against torch.export: the same kf IR for what it traces,
torch.export's path (and its errors, at the user's line) for what it does not, and no
import of torch._dynamo on the way."""

import os
import subprocess
import sys

import pytest
import torch

import kf
import moe
import seed_examples


def _inspect(fn, *args, capture=None, **kwargs):
    old = os.environ.pop("KF_CAPTURE", None)
    if capture is not None:
        os.environ["KF_CAPTURE"] = capture
    try:
        return kf.inspect(fn, *args, **kwargs)
    finally:
        os.environ.pop("KF_CAPTURE", None)
        if old is not None:
            os.environ["KF_CAPTURE"] = old


def _both(fn, *args, **kwargs):
    light, export = _inspect(fn, *args, **kwargs), _inspect(fn, *args, capture="export", **kwargs)
    assert export.captured.tracer == "export"
    return light, export


def layer_norm_formula(x, w, b, eps: float = 1e-5):
    mu = x.mean(dim=-1, keepdim=True)
    var = ((x - mu) ** 2).mean(dim=-1, keepdim=True)
    return (x - mu) * torch.rsqrt(var + eps) * w + b


def with_constant(x):
    scale = torch.tensor([0.5, 2.0, -1.0])
    return x * scale + torch.tensor(1.5)


def returns_tuple(x, w):
    h = torch.nn.functional.linear(x, w)
    return h.softmax(-1), (h.amax(dim=-1), [h.transpose(0, 1).contiguous().view(-1)])


def factories_on_the_inputs_device(x):
    rows = torch.arange(x.shape[0], device=x.device).unsqueeze(-1)
    z = torch.zeros(x.shape, dtype=x.dtype, device=x.device)
    return torch.where(rows > 1, x, z) + x.new_ones(x.shape[-1])


def _transformer_ops(x, w, b, idx):
    h = torch.nn.functional.gelu(torch.nn.functional.linear(x, w, b), approximate="tanh")
    h = torch.nn.functional.layer_norm(h, (h.shape[-1],))
    r = torch.relu(h).sigmoid() + torch.tanh(h) * h.exp().clamp(max=3.0) - h.abs().sqrt().rsqrt().reciprocal()
    s = torch.log_softmax(r, dim=-1) + torch.where(r > 0, r, -r).pow(2)
    rows = s.index_select(0, idx)
    g = torch.gather(s, 1, idx.unsqueeze(0).expand(s.shape[0], -1))
    top, arg = torch.max(s, dim=-1)
    parts = torch.cat([s[:, :3], s[:, 3:]], dim=1) * s.std(dim=0, keepdim=True)
    a, c = parts.split([5, 15], dim=1)
    return rows.sum(0), g.mean(), top, arg, parts.permute(1, 0).reshape(-1), s.argmax(dim=1), a.flatten(), c


CASES = {
    "seed_layer_norm": lambda: (seed_examples.metal_layer_norm.fn, torch.randn(4, 7, 64), torch.randn(64), torch.randn(64)),
    "layer_norm_formula": lambda: (layer_norm_formula, torch.randn(8, 32, dtype=torch.bfloat16),
                                   torch.randn(32, dtype=torch.bfloat16), torch.randn(32, dtype=torch.bfloat16)),
    "attention": lambda: (seed_examples.fused_attention.fn, *(torch.randn(1, 2, 16, 8) for _ in range(3))),
    "attention_masked": lambda: (seed_examples.fused_attention.fn, *(torch.randn(1, 2, 16, 8) for _ in range(3)),
                                 (torch.rand(16, 16) > 0.3).float()),
    "moe": lambda: (moe.moe_layer_fused.fn, torch.randn(2, 9, 16), torch.randn(4, 16),
                    [torch.randn(4, 16, 24), torch.randn(4, 24, 16)]),
    "seed_moe": lambda: (seed_examples.moe_layer_fused.fn, torch.randn(2, 9, 16), torch.randn(4, 16), [torch.randn(4, 16, 8)]),
    "constant": lambda: (with_constant, torch.randn(5, 3)),
    "tuple": lambda: (returns_tuple, torch.randn(6, 8), torch.randn(4, 8)),
    "factories": lambda: (factories_on_the_inputs_device, torch.randn(4, 6)),
    "transformer_ops": lambda: (_transformer_ops, torch.randn(10, 33), torch.randn(20, 33), torch.randn(20),
                                torch.tensor([0, 3, 7, 3])),
}


@pytest.mark.parametrize("case", list(CASES))
def test_light_tracer_gives_exports_kf_ir(case):
    fn, *args = CASES[case]()
    light, export = _both(fn, *args)
    assert light.captured.tracer == "trace", light.captured.fallback_reason
    assert light.kf_ir == export.kf_ir
    assert light.captured.output_tree == export.captured.output_tree
    assert set(light.captured.source_locs.values()) == set(export.captured.source_locs.values())


def test_light_graph_is_shaped_like_exports():
    from kf.signature import bind
    from kf.trace import trace

    x, w = torch.randn(6, 8), torch.randn(4, 8)
    sig, tensors = bind(returns_tuple, (x, w), {})
    gm = trace(returns_tuple, sig, tensors).graph_module
    nodes = list(gm.graph.nodes)
    assert [n.name for n in nodes if n.op == "placeholder"] == ["tensors_0", "tensors_1"]
    linear = next(n for n in nodes if n.op == "call_function" and "linear" in str(n.target))
    assert linear.meta["val"].shape == (6, 4) and linear.meta["val"].device.type == "meta"
    assert f'File "{__file__}", line {returns_tuple.__code__.co_firstlineno + 1}, in returns_tuple' \
        in linear.meta["stack_trace"]


def _inplace(x):
    y = x.clone()
    y[0] = 0.0
    return y + 1


def test_in_place_op_falls_back_and_is_right():
    # export's functionalized graph: the write is a select_scatter, which kf lowers itself
    x = torch.randn(4, 5)
    cap = _inspect(_inplace, x).captured
    assert cap.tracer == "export" and "mutates" in cap.fallback_reason
    torch.testing.assert_close(kf.jit(_inplace, interpret=True)(x), _inplace(x))


def _item(x):
    return x * x.sum().item()


def _branch_on_data(x):
    if x.sum() > 0:
        return x
    return -x


@pytest.mark.parametrize("fn", [_item, _branch_on_data])
def test_data_dependent_ops_fall_back_to_exports_result(fn):
    x = torch.randn(4, 5)
    try:
        want = _inspect(fn, x, capture="export")
    except kf.CompileError as e:
        with pytest.raises(type(e)) as got:
            _inspect(fn, x)
        assert str(got.value) == str(e) and got.value.loc == e.loc
        return
    got = _inspect(fn, x)
    assert got.captured.tracer == "export" and got.kf_ir == want.kf_ir


def _shape_error(x, y):
    h = x * 2
    return h @ y


def _bad_view(x):
    return x.t().view(-1)


@pytest.mark.parametrize("fn, line", [(_shape_error, 2), (_bad_view, 1)])
def test_users_errors_keep_their_line_and_message(fn, line):
    x, y = torch.randn(4, 5), torch.randn(4, 3)
    args = (x, y) if fn is _shape_error else (x,)
    with pytest.raises(kf.CompileError) as light:
        _inspect(fn, *args)
    with pytest.raises(kf.CompileError) as export:
        _inspect(fn, *args, capture="export")
    assert str(light.value) == str(export.value)
    assert light.value.loc.file == __file__ and light.value.loc.line == fn.__code__.co_firstlineno + line


def test_unsupported_op_still_names_the_users_line():
    def f(x):
        y = x + 1
        return torch.special.airy_ai(y)

    with pytest.raises(kf.UnsupportedOpError) as e:
        _inspect(f, torch.randn(4))
    assert e.value.loc.line == f.__code__.co_firstlineno + 2 and "aten.special_airy_ai" in str(e.value)


def _layout_queries(x):
    y = x.transpose(0, 1)
    if y.is_contiguous():
        return y * 2
    return y.contiguous().view(-1) * 3


def test_strides_read_as_in_eager():
    x = torch.randn(3, 4)
    light, export = _both(_layout_queries, x)
    assert light.captured.tracer == "trace" and light.kf_ir == export.kf_ir
    torch.testing.assert_close(kf.jit(_layout_queries, interpret=True)(x), _layout_queries(x))


def test_autocast_region_of_the_caller_is_left_out():
    x, w = torch.randn(4, 8), torch.randn(3, 8)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        light, export = _both(returns_tuple, x, w)
    assert light.captured.tracer == "trace" and light.kf_ir == export.kf_ir
    # the graph has the function's own dtypes: kf applies the region's precision to its IR
    assert all(n.meta["val"].dtype == torch.float32 for n in light.captured.graph.graph.nodes if n.op == "call_function"
               and isinstance(n.meta["val"], torch.Tensor))


def test_capturing_the_layer_norm_does_not_import_dynamo():
    code = (
        "import sys, torch, kf\n"
        "sys.path.insert(0, 'examples')\n"
        "from seed_examples import metal_layer_norm\n"
        "x = torch.randn(64, 256, dtype=torch.bfloat16)\n"
        "w, b = torch.randn(256, dtype=torch.bfloat16), torch.randn(256, dtype=torch.bfloat16)\n"
        "info = metal_layer_norm.with_options(target='cuda').inspect(x, w, b)\n"
        "assert info.captured.tracer == 'trace', info.captured.fallback_reason\n"
        "print(sorted(m for m in ('torch._dynamo', 'sympy', 'torch.export._trace') if m in sys.modules))\n"
    )
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    env = {k: v for k, v in os.environ.items() if k != "KF_CAPTURE"}
    out = subprocess.run([sys.executable, "-c", code], cwd=root, env=env, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "[]"


def _dropout(x):
    return torch.nn.functional.dropout(x, 0.5, training=True) * 2


def test_tracing_draws_no_random_numbers():
    x = torch.randn(4, 5)
    light, export = _both(_dropout, x)
    assert light.captured.tracer == "trace" and light.kf_ir == export.kf_ir
    torch.manual_seed(0)
    _inspect(_dropout, x)
    after = torch.randn(3)
    torch.manual_seed(0)
    assert torch.equal(after, torch.randn(3))
