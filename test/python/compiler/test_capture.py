"""Capture against torch eager: each function is captured to kf IR and run by the kf
interpreter (the dialect's reference semantics), on fresh random inputs."""

import pytest
import torch

import kf
from kf.capture import capture
from kf.interpreter import Interpreter

import seed_examples
import moe


def _run_interpreted(fn, *args, **kwargs):
    return kf.jit(fn, interpret=True)(*args, **kwargs)


def _close(a, b, tol=1e-5):
    if isinstance(a, (tuple, list)):
        assert type(a) is type(b) and len(a) == len(b)
        for x, y in zip(a, b):
            _close(x, y, tol)
        return
    assert a.shape == b.shape and a.dtype == b.dtype, (a.shape, b.shape, a.dtype, b.dtype)
    if a.dtype.is_floating_point:
        torch.testing.assert_close(a, b, atol=tol, rtol=tol)
    else:
        assert torch.equal(a, b)


@pytest.mark.parametrize("seq", [256, 257])
@pytest.mark.parametrize("masked", [False, True])
def test_seed_attention(seq, masked):
    q, k, v = (torch.randn(1, 2, seq, 64) for _ in range(3))
    mask = (torch.rand(seq, seq) > 0.3).float() if masked else None
    _close(_run_interpreted(seed_examples.fused_attention.fn, q, k, v, mask),
           seed_examples.fused_attention.fn(q, k, v, mask))


@pytest.mark.parametrize("shape", [(1, 256, 1024), (3, 1000), (1, 7, 257)])
def test_seed_layer_norm(shape):
    x, w, b = torch.randn(*shape), torch.randn(shape[-1]), torch.randn(shape[-1])
    _close(_run_interpreted(seed_examples.metal_layer_norm.fn, x, w, b), seed_examples.metal_layer_norm.fn(x, w, b))


@pytest.mark.parametrize("top_k", [1, 2])
def test_complete_moe(top_k):
    x, gate = torch.randn(2, 9, 64), torch.randn(4, 64)
    w_in, w_out = torch.randn(4, 64, 96) / 8, torch.randn(4, 96, 64) / 10
    _close(_run_interpreted(moe.moe_layer_fused.fn, x, gate, [w_in, w_out], top_k=top_k),
           moe.moe_layer_fused.fn(x, gate, [w_in, w_out], top_k=top_k), tol=1e-4)


def test_seed_moe_as_written_returns_zeros_like_x():
    x, gate = torch.randn(2, 9, 64), torch.randn(4, 64)
    out = _run_interpreted(seed_examples.moe_layer_fused.fn, x, gate, [torch.randn(4, 64, 8)])
    assert torch.equal(out, torch.zeros_like(x))


def _transformer_ops(x, w, b, idx):
    h = torch.nn.functional.gelu(torch.nn.functional.linear(x, w, b), approximate="tanh")
    h = torch.nn.functional.layer_norm(h, (h.shape[-1],))
    r = torch.relu(h).sigmoid() + torch.tanh(h) * h.exp().clamp(max=3.0) - h.abs().sqrt().rsqrt().reciprocal()
    s = torch.log_softmax(r, dim=-1) + torch.where(r > 0, r, -r).pow(2)
    rows = s.index_select(0, idx)
    g = torch.gather(s, 1, idx.unsqueeze(0).expand(s.shape[0], -1))
    top, arg = torch.max(s, dim=-1)
    parts = torch.cat([s[:, :3], s[:, 3:]], dim=1) * s.std(dim=0, keepdim=True)
    return rows.sum(0), g.mean(), top, arg, parts.permute(1, 0).reshape(-1), s.argmax(dim=1)


def test_many_ops_against_eager():
    x, w, b = torch.randn(10, 33), torch.randn(20, 33), torch.randn(20)
    idx = torch.tensor([0, 3, 7, 3])
    _close(_run_interpreted(_transformer_ops, x, w, b, idx), _transformer_ops(x, w, b, idx), tol=1e-4)


def _indexing(x, idx, src):
    a = torch.zeros(5, x.shape[1]).index_add(0, idx, src)
    c = x.scatter_add(1, idx.reshape(-1, 1).expand(-1, 2)[: x.shape[0]], x[:, :2])
    return a, c, torch.stack([x, x * 2], dim=0).sum(dim=(0, 2)), torch.topk(x, 3, dim=1, largest=False).values


def test_indexing_against_eager():
    x = torch.randn(4, 6)
    idx = torch.tensor([1, 4, 1, 0])
    src = torch.randn(4, 6)
    _close(_run_interpreted(_indexing, x, idx, src), _indexing(x, idx, src), tol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_low_precision_types_follow_torch(dtype):
    def f(x, y):
        return torch.softmax(x * 2 + y, dim=-1).to(torch.float32), (x > y).sum(dim=-1)

    x, y = torch.randn(4, 50, dtype=dtype), torch.randn(50, dtype=dtype)
    got, want = _run_interpreted(f, x, y), f(x, y)
    _close(got[1], want[1])
    torch.testing.assert_close(got[0], want[0], atol=2e-2, rtol=2e-2)


def test_constant_arguments_specialize():
    """Which optional tensors are None and int constants specialize; a float is read at
    run time (one program for 2.0 and 3.0)."""
    def scaled(x, scale=2.0, shift=None, times=1):
        y = x * scale * times
        return y if shift is None else y + shift

    jf = kf.jit(scaled, interpret=True)
    x = torch.randn(8)
    _close(jf(x), x * 2.0)
    _close(jf(x, scale=3.0), x * 3.0)
    assert len(jf._table) == 1
    s = torch.randn(8)
    _close(jf(x, shift=s), x * 2.0 + s)
    _close(jf(x, times=3), x * 6.0)
    assert len(jf._table) == 3


def test_same_tensor_passed_twice_stays_two_parameters():
    cap = capture(seed_examples.fused_attention.fn, *(3 * [torch.randn(1, 1, 16, 8)]))
    f = next(op for op in cap.module.body.operations if op.operation.name == "func.func")
    assert len(f.regions[0].blocks[0].arguments) == 3


def test_locations_name_the_users_lines():
    cap = capture(seed_examples.metal_layer_norm.fn, torch.randn(2, 16), torch.randn(16), torch.randn(16))
    lines = {loc.line for loc in cap.source_locs.values()}
    assert lines == {41, 42, 43, 44}
    assert 'seed_examples.py":41:5' in cap.kf_ir


def test_torch_mlir_fallback_runs_in_the_interpreter():
    pytest.importorskip("torch_mlir", reason="the fallback for bilinear's _trilinear is torch-mlir's importer")
    def f(a, b, w):
        return torch.nn.functional.bilinear(a, b, w) * a.sum()

    args = (torch.randn(5, 3), torch.randn(5, 4), torch.randn(2, 3, 4))
    torch.testing.assert_close(_run_interpreted(f, *args), f(*args))
    assert "@kf_aten__trilinear_default" in kf.inspect(f, *args).kf_ir


def test_unsupported_op_names_line():
    def f(x):
        return torch.special.airy_ai(x)

    with pytest.raises(kf.UnsupportedOpError) as e:
        kf.inspect(f, torch.randn(4))
    assert e.value.loc.line == f.__code__.co_firstlineno + 1
    assert "aten.special_airy_ai" in str(e.value)


def test_unsupported_dtype_is_a_signature_error():
    with pytest.raises(kf.SignatureError, match="uint32"):
        kf.inspect(lambda x: x + 1, torch.zeros(3, dtype=torch.uint32))


def test_locations_without_the_anchor_api(monkeypatch):
    # torch 2.11 (the GPU machine) has no _register_stack_trace_anchor: kf traces a copy
    # of the function named "forward", which export keeps in stack traces.
    monkeypatch.delattr(torch.fx.proxy, "_register_stack_trace_anchor", raising=False)
    cap = capture(seed_examples.metal_layer_norm.fn, torch.randn(2, 16), torch.randn(16), torch.randn(16))
    assert {loc.line for loc in cap.source_locs.values()} == {41, 42, 43, 44}
    assert {loc.function for loc in cap.source_locs.values()} == {"metal_layer_norm"}


# ---------------------------------------------------------------- results and refusals

import collections  # noqa: E402

#: a namedtuple a kf function may return (importable by its name, as the cache needs)
Stats = collections.namedtuple("Stats", "low high")


def _line_of(fn, text: str) -> int:
    import inspect

    lines, first = inspect.getsourcelines(fn)
    return first + next(i for i, line in enumerate(lines) if text in line)


@pytest.mark.parametrize("target", ["cpu", "vulkan"])
def test_namedtuple_results_keep_their_type(target, tmp_path, monkeypatch):
    """torch.max(x, 1) and friends return torch.return_types, a user's namedtuple its own
    type: the kf function returns the same types, by field and by position."""
    from kf.runtime import vulkan

    if target == "vulkan" and not vulkan.is_available():
        pytest.skip("no Vulkan device")
    monkeypatch.setenv("KF_CACHE_DIR", str(tmp_path))

    def f(x):
        return torch.max(x, 1), torch.topk(x, 2, dim=0), Stats(x.min(), x.amax()), x * 2

    x = torch.randn(5, 7)
    got, want = kf.jit(f, target=target)(x), f(x)
    for g, w in zip(got, want):
        assert type(g) is type(w)
    assert torch.equal(got[0].values, want[0].values) and torch.equal(got[0].indices, want[0].indices)
    assert torch.equal(got[1].indices, want[1].indices) and torch.equal(got[2].high, want[2].high)
    # from the cache, in a new table: the tree names the type, which is imported again
    again = kf.jit(f, target=target)(x)
    assert type(again[0]) is torch.return_types.max and type(again[2]) is Stats


def test_namedtuple_result_with_autograd():
    f = kf.jit(lambda x: torch.max(x * 2, 1))
    x = torch.randn(3, 4, requires_grad=True)
    r = f(x)
    assert type(r) is torch.return_types.max
    r.values.sum().backward()
    assert torch.equal(x.grad, torch.zeros(3, 4).scatter_(1, r.indices[:, None], 2.0))


def test_local_namedtuple_type_is_refused_clearly():
    Local = collections.namedtuple("Local", "a b")

    def f(x):
        return Local(x, x * 2)

    with pytest.raises(kf.CaptureError, match="cannot be imported by its name") as e:
        kf.inspect(f, torch.randn(3))
    assert e.value.loc.file == __file__


def test_python_numbers_of_tensors_are_refused_at_the_users_line():
    """.item(), float(t) and an if on a tensor's value: a kf error at the line, saying what
    to write instead."""
    def item(x):
        return x.sum().item()

    def divide(x):
        return x / x.max().item()

    def branch(x):
        if x.sum() > 0:
            return x * 2
        return x

    def to_float(x):
        return x * float(x.sum())

    for fn, text, hint in [(item, "item()", ".item()"), (divide, "item()", ".item()"),
                           (branch, "if x.sum()", "torch.where"), (to_float, "* float(", "x * x.sum()")]:
        with pytest.raises(kf.CompileError) as e:
            kf.inspect(fn, torch.randn(3))
        assert "internal" not in str(e.value)
        assert e.value.loc is not None and e.value.loc.line == _line_of(fn, text), str(e.value)
        assert hint in str(e.value)


def test_generator_argument_is_refused_at_the_users_line():
    g = torch.Generator().manual_seed(0)

    def f(x):
        return torch.rand(3, generator=g) + x

    with pytest.raises(kf.UnsupportedOpError, match="generator= argument") as e:
        kf.inspect(f, torch.randn(3))
    assert e.value.loc.line == _line_of(f, "generator=g")
    assert "aten.rand" in str(e.value) and "manual_seed" in str(e.value)


def test_ops_whose_result_depends_on_values_are_named():
    """torch.equal gives a Python bool of its inputs' values and linalg.lstsq a result whose
    shape export takes as data-dependent: each is a CaptureError that names the op and
    what depends on the values, at the user's line (not 'torch.export could not trace')."""
    import kf

    def equal(x, y):
        return torch.tensor(torch.equal(x, y))

    def lstsq(a, b):
        return torch.linalg.lstsq(a, b).solution

    for fn, args, what, op in ((equal, (torch.randn(3), torch.randn(3)), "value", "aten.equal.default"),
                               (lstsq, (torch.randn(4, 3), torch.randn(4, 2)), "shape", "aten.linalg_lstsq.default")):
        with pytest.raises(kf.CompileError) as info:
            kf.jit(fn, target="cpu")(*args)
        text = str(info.value)
        assert f"{op}: the {what} of its result depends on the values of its inputs" in text, text
        assert info.value.loc is not None and info.value.loc.line == fn.__code__.co_firstlineno + 1
