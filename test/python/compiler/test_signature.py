"""Signatures (signature.py): constants specialize by type and by bits, through both
dispatch tables (the positional fast key, in C and in Python, and the bound signature)."""

from __future__ import annotations

import math

import pytest
import torch

import kf
from kf import api
from kf.signature import bind, const_key


@pytest.fixture(params=["c", "python"])
def dispatch(request, monkeypatch, tmp_path_factory):
    monkeypatch.setenv("KF_CACHE_DIR", str(tmp_path_factory.getbasetemp() / "kf_cache_signature"))
    if request.param == "python":
        monkeypatch.setattr(api, "_c_dispatch", None)
    elif api._c_dispatch is None:
        pytest.skip(f"the C dispatch is off here: {api.DISPATCH}")
    return request.param


def _scale(x, k):
    return x * k


def _branch(x, flag):
    return x + 1 if flag is True else x - 1


def test_equal_constants_of_other_types_are_other_signatures():
    x = torch.randn(3)
    sigs = {bind(_scale, (x, k), {})[0] for k in (2, 2.0, True, 1, 0.0, -0.0, float("nan"))}
    assert len(sigs) == 7
    assert bind(_scale, (x, float("nan")), {})[0] == bind(_scale, (x, float("nan")), {})[0]
    assert const_key(-0.0) != const_key(0.0) and const_key((1, 2.0)) != const_key((1, 2))
    assert const_key([1]) != const_key((1,))


@pytest.mark.parametrize("by_keyword", [False, True])
def test_int_then_float_promotes_as_torch_does(dispatch, by_keyword):
    """f(x_int32, 2) then f(x_int32, 2.0): int32, then float32, as eager."""
    f = kf.jit(_scale, target="cpu")
    x = torch.randint(-50, 50, (257,), dtype=torch.int32)
    for k in (2, 2.0, True, 3, 2, 2.5, False):
        out = f(x, k=k) if by_keyword else f(x, k)
        ref = x * k
        assert out.dtype == ref.dtype, (k, out.dtype, ref.dtype)
        torch.testing.assert_close(out, ref)


@pytest.mark.parametrize("by_keyword", [False, True])
def test_true_then_one_takes_its_own_branch(dispatch, by_keyword):
    f = kf.jit(_branch, target="cpu")
    x = torch.randn(13)
    for flag in (True, 1, True, 1.0, 1):
        out = f(x, flag=flag) if by_keyword else f(x, flag)
        torch.testing.assert_close(out, _branch(x, flag))


@pytest.mark.parametrize("by_keyword", [False, True])
def test_negative_zero_keeps_its_sign(dispatch, by_keyword):
    f = kf.jit(_scale, target="cpu")
    x = torch.rand(31) + 0.5
    for k in (0.0, -0.0, 0.0, -0.0):
        out = f(x, k=k) if by_keyword else f(x, k)
        assert torch.equal(torch.signbit(out), torch.signbit(x * k)), k


@pytest.mark.parametrize("by_keyword", [False, True])
def test_nan_has_one_entry_however_often_it_comes(dispatch, by_keyword):
    f = kf.jit(_scale, target="cpu")
    x = torch.randn(7)
    for _ in range(20):
        k = float("nan")  # a new object each call
        out = f(x, k=k) if by_keyword else f(x, k)
        assert torch.isnan(out).all()
    assert len(f._table) == 1 and len(f._fast) <= 1 and len(f._entries) <= 1
    # a float is read at run time: the same program takes inf
    assert torch.equal(f(x, math.inf), x * math.inf)
    assert len(f._table) == 1


def test_lifted_floats_share_one_key_and_come_back():
    from kf.signature import bind, lift_scalars, scalar_dtype, unlift_scalars

    def f(x, lr, n=2, eps=1e-5):
        return x

    x = torch.randn(3, dtype=torch.float64)
    sigs = []
    for lr in (0.1, 0.25):
        sig, tensors = bind(f, (x, lr), {})
        assert scalar_dtype(tensors) == torch.float64
        lifted, lt = lift_scalars(sig, tensors, {"lr", "eps"}, torch.float64)
        assert [p.kind for p in lifted.params] == ["tensor", "scalar", "const", "scalar"]
        assert lt[0] is x and lt[1].dtype == torch.float64 and lt[1].item() == lr and lt[2].item() == 1e-5
        assert lifted.tensor_names() == ["x", "lr", "eps"]
        back = unlift_scalars(lifted, lt)
        assert back[0] == sig and back[1] == [x]
        sigs.append(lifted)
    assert sigs[0] == sigs[1] and hash(sigs[0]) == hash(sigs[1]) and repr(sigs[0]) == repr(sigs[1])
    assert scalar_dtype([torch.randn(2, dtype=torch.bfloat16)]) is None
    assert scalar_dtype([torch.randn(2), torch.randn(2, dtype=torch.float64)]) is None
    assert scalar_dtype([torch.arange(3)]) == torch.get_default_dtype()


@pytest.mark.parametrize("make", [lambda: torch.eye(3).to_sparse_csr(), lambda: torch.eye(3).to_sparse(),
                                  lambda: torch.eye(3).to_sparse_csc()])
def test_sparse_arguments_are_refused_by_name(dispatch, make):
    """A sparse tensor has no strides (its is_contiguous() raises): a SignatureError names
    the argument, whether the call takes a fast table (made by the first call) or binds,
    for a tensor argument or one in a list."""
    f = kf.jit(lambda x: x * 2, target="cpu")
    f(torch.ones(2))  # the fast tables exist: the next call goes through them first
    with pytest.raises(kf.SignatureError, match="argument 'x' is a sparse"):
        f(make())
    g = kf.jit(lambda xs: xs[0] * 2, target="cpu")
    g([torch.ones(2)])
    with pytest.raises(kf.SignatureError, match=r"argument 'xs\[0\]' is a sparse"):
        g([make()])
    with pytest.raises(kf.SignatureError, match="to_dense"):
        kf.inspect(lambda x: x + 1, make())


def test_star_args_and_positional_only_parameters():
    """*args and positional-only parameters are bound and passed in position, in the
    plain call and under autograd; the results match torch."""
    import kf

    x, y = torch.randn(7, 5), torch.randn(7, 5)
    f = kf.jit(lambda *a: torch.hypot(*a), target="cpu")
    torch.testing.assert_close(f(x, y), torch.hypot(x, y))

    def pos(a, b, /, scale=2.0):
        return (a - b) * scale

    g = kf.jit(pos, target="cpu")
    torch.testing.assert_close(g(x, y), (x - y) * 2.0)
    torch.testing.assert_close(g(x, y, scale=3.0), (x - y) * 3.0)
    xg = x.clone().requires_grad_()
    f(xg, y).sum().backward()
    torch.testing.assert_close(xg.grad, x / torch.hypot(x, y))


def test_callables_kf_cannot_capture_are_refused_at_decoration():
    import kf

    with pytest.raises(kf.SignatureError, match=r"Python functions.*torch\.isnan is a builtin.*lambda x: torch\.isnan\(x\)"):
        kf.jit(torch.isnan, target="cpu")
    with pytest.raises(kf.SignatureError, match=r"not \*\*kw"):
        kf.jit(lambda x, **kw: x * 2, target="cpu")
