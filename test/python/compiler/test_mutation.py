"""Writes to a kf function's arguments (compiler/mutation.py): the caller's tensors hold
eager's values after the call and the results are eager's, on the CPU and Vulkan targets,
from fresh random inputs at odd sizes, size 0 and non-contiguous views; where no
copy-back gives eager's result, a MutationError at the line that writes."""

import pytest
import torch
import torch.nn.functional as F

import kf
from kf.runtime import vulkan

VULKAN = pytest.mark.skipif(not vulkan.is_available(), reason="no Vulkan device (install mesa-vulkan-drivers)")
TARGETS = ["cpu", pytest.param("vulkan", marks=VULKAN)]


@pytest.fixture(scope="module", autouse=True)
def _cache(tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("KF_CACHE_DIR", str(tmp_path_factory.mktemp("kf-cache")))
        yield


def _set(x, key, value):
    x[key] = value


def write_row(x, y):
    y[0] = 5.0
    return x + y


def add_in_place(x):
    x.add_(1)
    return x * 2


def returns_itself(x):
    return x.add_(1)


def clamp_in_place(x):
    return x.clamp_(-0.5, 0.5) + 1


def every_other_column(x):
    _set(x, (slice(None), slice(1, None, 2)), -1.0)
    return x.sum(0)


def column_from(x, v):
    _set(x, (slice(None), 2), v)
    return x.exp()


def two_writes(x, y):
    x.mul_(2)
    y.sub_(x)
    return x + y


def through_views(x):
    x.view(-1)[1:4].add_(3)
    x.t().mul_(2)
    return x.sum()


def zero_and_fill(x, y):
    x.zero_()
    y.fill_(2.5)
    return y + 1


def copy_into(x, y):
    x.copy_(y)
    return x * y


def index_put(x, i, v):
    _set(x, i, v)
    return x * 2


def index_put_columns(x, i, v):
    _set(x, (slice(None), i), v)
    return x


def index_put_accumulate(x, i, v):
    return x.index_put_((i,), v, accumulate=True)


def masked_put(x):
    _set(x, x > 0, 0.0)
    return x


def swap(x, y):
    t = x.clone()
    x.copy_(y)
    y.copy_(t)
    return x * 2


def index_add_in_place(x, i, s):
    return x.index_add_(0, i, s)


def adam_step(p, g, m, v, lr: float, step: int, b1: float = 0.9, b2: float = 0.999, eps: float = 1e-8):
    """An optimizer step: it only writes to its arguments and returns nothing."""
    m.mul_(b1).add_(g, alpha=1 - b1)
    v.mul_(b2).addcmul_(g, g, value=1 - b2)
    m_hat, v_hat = m / (1 - b1 ** step), v / (1 - b2 ** step)
    p.sub_(lr * m_hat / (v_hat.sqrt() + eps))


@pytest.mark.parametrize("target", TARGETS)
def test_a_function_that_returns_nothing_writes_and_returns_none(target):
    """Five steps at five learning rates: the parameters and both moments follow eager's,
    the call returns None as the function does, and the float learning rate is read at
    run time (one program; an int ``step`` would be a constant of it)."""
    f = kf.jit(adam_step, target=target)
    p, m, v = torch.randn(257), torch.zeros(257), torch.zeros(257)
    want = [t.clone() for t in (p, m, v)]
    for k in range(5):
        g = torch.randn(257)
        assert f(p, g, m, v, 1e-3 * (k + 1), 1) is None
        adam_step(want[0], g.clone(), want[1], want[2], 1e-3 * (k + 1), 1)
    for got, w in zip((p, m, v), want):
        torch.testing.assert_close(got, w)
    assert f.compiles == 1


def _cases():
    r = torch.randn
    return {
        "write_row": (write_row, lambda: (r(257), r(257))),
        "add_in_place": (add_in_place, lambda: (r(3, 7),)),
        "returns_itself": (returns_itself, lambda: (r(13),)),
        "clamp_in_place": (clamp_in_place, lambda: (r(7, 3),)),
        "every_other_column": (every_other_column, lambda: (r(5, 7),)),
        "column_from": (column_from, lambda: (r(5, 3), r(5))),
        "two_writes": (two_writes, lambda: (r(11), r(11))),
        "through_views": (through_views, lambda: (r(4, 3),)),
        "zero_and_fill": (zero_and_fill, lambda: (r(5, 3), r(2))),
        "copy_into": (copy_into, lambda: (r(5, 3), r(3))),
        "int": (add_in_place, lambda: (torch.randint(-9, 9, (7,)),)),
        "bf16": (lambda x, y: (x.add_(y), x.float())[1], lambda: (r(5, dtype=torch.bfloat16), r(5))),
        "size0": (add_in_place, lambda: (r(0, 3),)),
        "size1": (add_in_place, lambda: (r(1),)),
        "non_contiguous": (add_in_place, lambda: (r(5, 3).t(),)),
        "index_put_repeated": (index_put, lambda: (r(5, 3), torch.tensor([0, 3, 0, 4, 3]), r(5, 3))),
        "index_put_columns": (index_put_columns, lambda: (r(5, 7), torch.tensor([0, 3, 0, 6]), r(4))),
        "index_put_accumulate": (index_put_accumulate, lambda: (r(5, 3), torch.tensor([0, 3, 0]), r(3, 3))),
        "index_put_nan_rows": (index_put_columns, lambda: (torch.full((2, 4), float("nan")), torch.tensor([1, 2]),
                                                          r(2))),
        "masked_put": (masked_put, lambda: (r(5, 3),)),
        "index_add_in_place": (index_add_in_place, lambda: (r(5, 3), torch.tensor([0, 3, 0]), r(3, 3))),
        "swap": (swap, lambda: (r(5), r(5))),
        "index_copy": (lambda x, i, s: x.index_copy_(1, i, s), lambda: (r(3, 7), torch.tensor([6, 0, 2]), r(3, 3))),
        "index_fill": (lambda x, i: x.index_fill_(0, i, -1.0) * 2, lambda: (r(5, 3), torch.tensor([0, 3, 0]))),
    }


CASES = _cases()


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("name", list(CASES))
def test_writes_reach_the_callers_tensors(name, target):
    fn, make = CASES[name]
    args = make()
    expected_args = [a.clone() for a in args]
    expected = fn(*expected_args)
    out = kf.jit(fn, target=target)(*args)
    torch.testing.assert_close(out, expected, equal_nan=True)
    for got, want in zip(args, expected_args):
        torch.testing.assert_close(got, want, equal_nan=True)
    # a result that is the written argument is the caller's tensor, as in eager
    assert (out is args[0]) == (expected is expected_args[0])


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
@pytest.mark.parametrize("name", ["write_row", "returns_itself", "every_other_column", "index_put_repeated",
                                  "non_contiguous", "swap"])
def test_writes_reach_the_callers_tensors_on_cuda(name):
    fn, make = CASES[name]
    made = make()
    args = [a.cuda() for a in made]
    # expected from torch's CPU kernels: where an index_put index repeats, the last write
    # wins there (and in kf on every target); torch's CUDA kernel leaves which write wins
    # undefined
    expected_args = [a.clone() for a in made]
    expected = fn(*expected_args)
    out = kf.jit(fn, target="cuda")(*args)
    assert out.device.type == "cuda"
    torch.testing.assert_close(out.cpu(), expected, equal_nan=True)
    torch.testing.assert_close([a.cpu() for a in args], expected_args, equal_nan=True)
    assert (out is args[0]) == (expected is expected_args[0])


def test_a_cached_program_writes_too():
    x, y = torch.randn(6), torch.randn(6)
    kf.jit(write_row, target="cpu")(x.clone(), y.clone())  # compiled and stored
    again = kf.jit(write_row, target="cpu")  # a new function object: the program comes from the disk cache
    x2, y2 = x.clone(), y.clone()
    again(x2, y2)
    assert y2[0] == 5.0 and torch.equal(y2[1:], y[1:])


def test_interpreter_writes_too():
    x, y = torch.randn(6), torch.randn(6)
    want_y = y.clone()
    want = write_row(x.clone(), want_y)
    torch.testing.assert_close(kf.jit(write_row, interpret=True)(x, y), want)
    torch.testing.assert_close(y, want_y)


def test_batch_norm_running_statistics_move():
    x = torch.randn(7, 3, 5) * 2 + 1
    rm, rv = torch.randn(3), torch.rand(3) + 0.5
    want_rm, want_rv = rm.clone(), rv.clone()
    want = F.batch_norm(x, want_rm, want_rv, training=True, momentum=0.3)
    out = kf.jit(lambda x, rm, rv: F.batch_norm(x, rm, rv, training=True, momentum=0.3), target="cpu")(x, rm, rv)
    torch.testing.assert_close(out, want)
    torch.testing.assert_close((rm, rv), (want_rm, want_rv))


@pytest.mark.parametrize("how", ["grad", "compile"])
def test_calls_through_the_torch_op_refuse_to_write(how):
    f = kf.jit(two_writes, target="cpu")
    x, y = torch.randn(4), torch.randn(4)
    before = y.clone()
    with pytest.raises(kf.MutationError, match="writes to its argument 'x'.*torch op") as err:
        if how == "grad":
            f(x, y.requires_grad_())
        else:
            torch.compile(lambda a, b: f(a, b) * 2, fullgraph=True)(x, y)
    assert err.value.loc.line == two_writes.__code__.co_firstlineno + 1  # x.mul_(2)
    torch.testing.assert_close(y.detach(), before)  # nothing was written


def test_arguments_that_share_memory_are_refused():
    f = kf.jit(two_writes, target="cpu")
    a = torch.randn(6)
    with pytest.raises(kf.MutationError, match="shares memory"):
        f(a, a)
    with pytest.raises(kf.MutationError, match="shares memory"):
        f(a[:3], a[2:5])
    expected = two_writes(a[:3].clone(), a[3:].clone())
    torch.testing.assert_close(f(a[:3], a[3:]), expected)  # disjoint halves of one buffer are fine


def test_expanded_argument_is_refused():
    with pytest.raises(kf.MutationError, match="share memory"):
        kf.jit(add_in_place, target="cpu")(torch.randn(1).expand(4))


CLOSURE = torch.zeros(3)


def writes_a_global(x):
    CLOSURE.add_(x)
    return x * 2


def test_writing_a_tensor_that_is_not_an_argument_is_a_capture_error():
    with pytest.raises(kf.CaptureError, match="kf writes back the values of its tensor arguments") as err:
        kf.jit(writes_a_global, target="cpu")(torch.randn(3))
    assert err.value.loc.line == writes_a_global.__code__.co_firstlineno + 1


def transposes_in_place(x):
    x.t_()
    return x


def unsqueezes_in_place(x):
    x.unsqueeze_(0)
    return x


@pytest.mark.parametrize("fn", [transposes_in_place, unsqueezes_in_place])
def test_writing_a_shape_is_a_capture_error_at_its_line(fn):
    with pytest.raises(kf.CaptureError) as err:
        kf.jit(fn, target="cpu")(torch.randn(2, 3))
    assert err.value.loc is not None and err.value.loc.line == fn.__code__.co_firstlineno + 1


@pytest.mark.parametrize("target", TARGETS)
def test_returning_an_in_place_result_of_an_intermediate(target):
    """``return y.add_(1)`` on a tensor the function made is its new value (it was refused
    as 'returns add_, which is not a tensor'); the argument is left alone."""
    def scaled_then_shifted(x):
        y = x * 2
        return y.add_(1).mul_(3)

    x = torch.randn(257)
    before = x.clone()
    out = kf.jit(scaled_then_shifted, target=target)(x)
    torch.testing.assert_close(out, (before * 2 + 1) * 3)
    assert torch.equal(x, before)
