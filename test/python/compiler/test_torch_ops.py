"""kf functions as torch.library custom ops: torch.compile, torch.export, opcheck."""

import pytest
import torch

import kf
from kf import torch_ops

import moe
import seed_examples as se


@kf.jit(target="cpu")
def ln(x, weight, bias, eps=1e-5):
    mean = x.mean(dim=-1, keepdim=True)
    var = x.var(dim=-1, keepdim=True)
    return weight * (x - mean) / torch.sqrt(var + eps) + bias


@kf.jit(target="cpu")
def stats(x):
    return x.sum(dim=-1), (x.amax(dim=0), x.mean(dim=0))


@kf.jit(target="cpu")
def gelu(x):
    return torch.nn.functional.gelu(x)


attention = se.fused_attention.with_options(target="cpu")
moe_cpu = moe.moe_layer_fused.with_options(target="cpu")


def _target(kfn):
    return kfn.op_name.replace("::", ".") + ".default"


class Block(torch.nn.Module):
    """A transformer-ish block whose norm, attention and activation are kf kernels."""

    def __init__(self, d=32):
        super().__init__()
        self.w = torch.nn.Parameter(1 + 0.1 * torch.randn(d))
        self.b = torch.nn.Parameter(0.1 * torch.randn(d))
        self.qkv = torch.nn.Linear(d, 3 * d)
        self.out = torch.nn.Linear(d, d)

    def forward(self, x):
        h = ln(x, self.w, self.b)
        q, k, v = self.qkv(h).unsqueeze(1).chunk(3, dim=-1)
        a = attention(q.contiguous(), k.contiguous(), v.contiguous()).squeeze(1)
        return x + gelu(self.out(a))


def test_each_function_has_its_op():
    assert ln.op_name.startswith("kf::ln_")
    name = ln.op_name.split("::")[1]
    assert getattr(torch.ops.kf, name).default is not None
    assert getattr(torch.ops.kf, name + "_backward").default is not None
    # functions of one name (two modules' moe_layer_fused, with_options variants) get
    # distinct ops, and the name does not depend on the order they are made in
    names = {moe_cpu.op_name, moe.moe_layer_fused.op_name, se.moe_layer_fused.op_name}
    assert len(names) == 3 and all(n.startswith("kf::moe_layer_fused_") for n in names)
    assert torch_ops.op_name(moe_cpu) == moe_cpu.op_name.split("::")[1]


def test_functions_of_one_qualified_name_keep_their_ops():
    """Two lambdas of one scope (one line too), and two nested functions of one name,
    share a qualified name; each keeps its own op, so a call through the op (here
    autograd's) runs its own function and returns its own result structure."""
    f, g = kf.jit(lambda x, y: x * y + 1), kf.jit(lambda x: (x + 1, x * 2))
    h = kf.jit(lambda x: x - 3)

    def make(k):
        def inner(x):
            return x * k
        return inner

    i2 = kf.jit(make(2.0))
    i3 = kf.jit(lambda x: x * 3.0)  # a lambda of another line
    assert len({f.op_name, g.op_name, h.op_name, i2.op_name, i3.op_name}) == 5
    x, y = torch.randn(5, 3, requires_grad=True), torch.randn(5, 3)
    out = f(x, y)
    assert isinstance(out, torch.Tensor)
    torch.testing.assert_close(out, x * y + 1)
    out.sum().backward()
    torch.testing.assert_close(x.grad, y)
    a, b = g(x)
    torch.testing.assert_close(a, x + 1)
    torch.testing.assert_close(b, x * 2)
    torch.testing.assert_close(h(x), x - 3)
    torch.testing.assert_close(i2(x), x * 2.0)


@pytest.mark.parametrize("args,kwargs", [
    ((torch.ones(2), [torch.ones(1), torch.ones(3)], None, 2, 1e-5), {}),
    ((torch.ones(2),), {"b": (torch.ones(1),), "c": "a|b", "d": torch.float16}),
])
def test_structure_round_trips(args, kwargs):
    @kf.jit
    def f(a, b=None, c=None, d=3, e=0.5):
        return a

    tensors, structure = torch_ops.flatten_call(f, args, kwargs)
    rebuilt = torch_ops.rebuild(f, structure, tensors)
    import inspect

    bound = inspect.signature(f.fn).bind(*args, **kwargs)
    bound.apply_defaults()
    for name, value in bound.arguments.items():
        got = rebuilt[name]
        if isinstance(value, torch.Tensor):
            assert got is value
        elif isinstance(value, (list, tuple)) and value and isinstance(value[0], torch.Tensor):
            assert type(got) is type(value) and all(g is v for g, v in zip(got, value))
        else:
            assert got == value and type(got) is type(value)


def test_torch_compile_fullgraph_keeps_kf_ops():
    torch.manual_seed(0)
    block = Block()
    x = torch.randn(2, 16, 32)
    seen = []

    def backend(gm, example_inputs):
        seen.extend(str(n.target) for n in gm.graph.nodes if n.op == "call_function")
        return gm.forward

    compiled = torch.compile(block, fullgraph=True, backend=backend)
    with torch.no_grad():
        out = compiled(x)
        ref = block(x)
    torch.testing.assert_close(out, ref, rtol=1e-4, atol=1e-4)
    kf_ops = [s for s in seen if s.startswith("kf.")]
    assert {_target(ln), _target(gelu), _target(attention)} <= set(kf_ops), seen


def test_torch_compile_inductor_trains_through_kf():
    torch.manual_seed(0)
    block = Block()
    x = torch.randn(2, 16, 32)
    compiled = torch.compile(block, fullgraph=True)
    compiled(x).square().mean().backward()
    got = {n: p.grad.clone() for n, p in block.named_parameters()}
    block.zero_grad()

    # the same block in eager torch: the kf functions' own Python
    def eager(x):
        h = ln.fn(x, block.w, block.b)
        q, k, v = block.qkv(h).unsqueeze(1).chunk(3, dim=-1)
        a = se.fused_attention.fn(q, k, v).squeeze(1)
        return x + gelu.fn(block.out(a))

    eager(x).square().mean().backward()
    for n, p in block.named_parameters():
        torch.testing.assert_close(got[n], p.grad, rtol=1e-4, atol=1e-5, msg=n)


def test_torch_export_carries_the_op():
    block = Block()
    x = torch.randn(2, 16, 32)
    ep = torch.export.export(block, (x,))
    targets = [str(n.target) for n in ep.graph.nodes if n.op == "call_function"]
    assert _target(ln) in targets and _target(gelu) in targets
    with torch.no_grad():
        torch.testing.assert_close(ep.module()(x), block(x), rtol=1e-4, atol=1e-4)


def _opcheck(kfn, *args, **kwargs):
    tensors, structure = torch_ops.flatten_call(kfn, args, kwargs)
    result = torch.library.opcheck(kfn._torch_op, (tensors, structure))
    assert all(v == "SUCCESS" for v in result.values()), result


def test_opcheck_layer_norm_and_gelu():
    d = torch.float64
    _opcheck(ln, torch.randn(4, 32, dtype=d, requires_grad=True), torch.randn(32, dtype=d, requires_grad=True),
             torch.randn(32, dtype=d, requires_grad=True))
    _opcheck(gelu, torch.randn(3, 40, requires_grad=True))


def test_opcheck_nested_results():
    _opcheck(stats, torch.randn(5, 6, dtype=torch.float64, requires_grad=True))
    # through the op (autograd records this call) results nest as the function returns them
    s, (mx, mean) = stats(torch.ones(5, 6, requires_grad=True))
    assert s.shape == (5,) and mx.shape == (6,) and mean.shape == (6,)


def test_opcheck_attention_with_mask():
    q, k, v = (torch.randn(1, 2, 8, 16, dtype=torch.float64, requires_grad=True) for _ in range(3))
    mask = torch.tril(torch.ones(8, 8, dtype=torch.long))
    _opcheck(attention, q, k, v, mask)


def test_opcheck_moe_list_argument():
    x = torch.randn(1, 4, 8, dtype=torch.float64, requires_grad=True)
    gate = torch.randn(4, 8, dtype=torch.float64, requires_grad=True)
    w_in = torch.randn(4, 8, 16, dtype=torch.float64, requires_grad=True)
    w_out = torch.randn(4, 16, 8, dtype=torch.float64, requires_grad=True)
    _opcheck(moe_cpu, x, gate, [w_in, w_out], top_k=2)


def test_outputs_never_alias_inputs():
    @kf.jit(target="cpu")
    def passthrough(x):
        return x.reshape(-1), x * 2

    x = torch.randn(3, 4, requires_grad=True)
    flat, doubled = passthrough(x)
    assert flat.data_ptr() != x.data_ptr()
    torch.testing.assert_close(flat, x.detach().reshape(-1))


def test_eager_training_calls_take_their_plan(monkeypatch):
    """An eager call that autograd records: the first of a signature takes the op's
    general path (it learns how the results nest), later ones its plan (_EagerPlan), with
    the same results and gradients as eager, and nothing derived again (training_of is
    not called); a backward that builds a graph (create_graph) goes through the op. A
    frozen weight is another signature: its plan computes no gradient for it."""
    @kf.jit(target="cpu")
    def norm(x, weight, bias):
        return torch.nn.functional.layer_norm(x, x.shape[-1:], weight, bias, 1e-5)

    def grads(f, x, w, b, create_graph=False):
        leaves = [t for t in (x, w, b) if t.requires_grad]
        out = f(x, w, b)
        return (out, *torch.autograd.grad(out.square().sum(), leaves, create_graph=create_graph))

    owner = torch_ops._OWNERS[norm._op_key]
    for frozen in (False, True):
        x = torch.randn(13, 257, requires_grad=True)
        w = torch.randn(257, requires_grad=not frozen)
        b = torch.randn(257, requires_grad=True)
        want = grads(norm.fn, x, w, b)
        for call in range(3):
            if call == 2:  # the plan's third call derives nothing
                monkeypatch.setattr(torch_ops, "training_of", lambda *a, **k: pytest.fail("derived again"))
            for got, ref in zip(grads(norm, x, w, b), want):
                torch.testing.assert_close(got, ref, rtol=1e-4, atol=1e-4)
            monkeypatch.undo()
        assert len(owner._eager_plans) == 1 + frozen
    x, w, b = (torch.randn(5, 32, requires_grad=True), torch.randn(32, requires_grad=True),
               torch.randn(32, requires_grad=True))
    for _ in range(2):
        gx = grads(norm, x, w, b, create_graph=True)[1]
        (ggx,) = torch.autograd.grad(gx.square().sum(), x)
        want_gx = grads(norm.fn, x, w, b, create_graph=True)[1]
        (want_ggx,) = torch.autograd.grad(want_gx.square().sum(), x)
        torch.testing.assert_close(ggx, want_ggx, rtol=1e-3, atol=1e-3)


def test_plain_calls_skip_the_op():
    x, w, b = torch.randn(4, 32), torch.randn(32), torch.randn(32)
    assert not torch_ops.needs_op((x, w, b), {})
    assert torch_ops.needs_op((x, w.requires_grad_(), b), {})
    with torch.no_grad():
        assert not torch_ops.needs_op((x, w, b), {})


def test_torch_compile_dynamic_shapes_with_backward():
    # the fake implementation is the function itself, so symbolic shapes flow through it;
    # each concrete size still gets its own kf specialization at run time
    step = torch.compile(lambda x, w, b: ln(x, w, b) * 2.0, dynamic=True, fullgraph=True)
    w, b = torch.randn(32), torch.randn(32)
    for rows in (3, 5, 7):
        x = torch.randn(rows, 32, requires_grad=True)
        y = step(x, w, b)
        (gx,) = torch.autograd.grad(y.square().sum(), x)
        xr = x.detach().requires_grad_()
        yr = ln.fn(xr, w, b) * 2.0
        (want,) = torch.autograd.grad(yr.square().sum(), xr)
        torch.testing.assert_close(y, yr, rtol=1e-4, atol=1e-5)
        torch.testing.assert_close(gx, want, rtol=1e-4, atol=1e-4)


def test_constants_given_and_defaulted():
    x, w, b = torch.randn(4, 32), torch.randn(32), torch.randn(32)
    _, structure = torch_ops.flatten_call(ln, (x, w, b), {})
    assert structure == "T|T|T|D"
    _, structure = torch_ops.flatten_call(ln, (x, w, b), {"eps": 1e-3})
    assert structure == "T|T|T|=0.001"
    got = ln(x, w.requires_grad_(), b, eps=1e-3)
    torch.testing.assert_close(got, ln.fn(x, w, b, 1e-3), rtol=1e-4, atol=1e-5)


def test_exported_program_saves_and_loads(tmp_path):
    block = Block()
    x = torch.randn(2, 16, 32)
    path = tmp_path / "block.pt2"
    torch.export.save(torch.export.export(block, (x,)), path)
    loaded = torch.export.load(path)  # the op is found again by its name, torch.ops.kf.<name>
    assert _target(ln) in [str(n.target) for n in loaded.graph.nodes if n.op == "call_function"]
    with torch.no_grad():
        torch.testing.assert_close(loaded.module()(x), block(x), rtol=1e-4, atol=1e-4)


def test_op_names_are_the_same_in_another_process(tmp_path):
    # an exported program (or Inductor's cached code) from this process names the ops;
    # a new process that imports the same functions registers the same names
    import os
    import subprocess
    import sys

    block = Block()
    x = torch.randn(2, 16, 32)
    torch.export.save(torch.export.export(block, (x,)), tmp_path / "block.pt2")
    torch.save({"x": x, "want": block(x).detach()}, tmp_path / "io.pt")
    root = os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", ".."))
    # this module under the name it has here (pytest's importlib mode names it after its path)
    script = (f"import sys, importlib.util; sys.path[:0] = [{os.path.join(root, 'examples')!r}]\n"
              f"spec = importlib.util.spec_from_file_location({__name__!r}, {os.path.abspath(__file__)!r})\n"
              "test_torch_ops = sys.modules[spec.name] = importlib.util.module_from_spec(spec)\n"
              "spec.loader.exec_module(test_torch_ops)\n"
              "import torch\n"
              f"io = torch.load({str(tmp_path / 'io.pt')!r})\n"
              f"ep = torch.export.load({str(tmp_path / 'block.pt2')!r})\n"
              "with torch.no_grad():\n"
              "    torch.testing.assert_close(ep.module()(io['x']), io['want'], rtol=1e-4, atol=1e-4)\n"
              "print(test_torch_ops.ln.op_name)\n")
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().splitlines()[-1] == ln.op_name
