"""compiler/trace_shapes.py: the light tracer's shape rules give torch's shapes and view
strides, and refuse (Fallback) what torch refuses."""

import pytest
import torch

from kf.trace_shapes import ARANGE, RULES, _broadcast, _infer_size, _view_strides
from kf.trace_tensor import Fallback


@pytest.mark.parametrize("shapes", [[(3, 1), (1, 5)], [(7,), (2, 1, 7)], [(), (4, 4)], [(0, 3), (1, 3)],
                                    [(257, 1), (257, 2)]], ids=str)
def test_broadcast_is_torchs(shapes):
    assert _broadcast(shapes) == tuple(torch.broadcast_shapes(*shapes))


def test_broadcast_refuses_what_torch_refuses():
    with pytest.raises(RuntimeError):
        torch.broadcast_shapes((3,), (4,))
    with pytest.raises(Fallback, match="do not broadcast"):
        _broadcast([(3,), (4,)])


@pytest.mark.parametrize("size,numel,want", [((-1, 3), 12, (4, 3)), ((5, -1), 0, (5, 0)), ((2, 3), 6, (2, 3))])
def test_infer_size(size, numel, want):
    assert _infer_size(size, numel) == want


@pytest.mark.parametrize("size,numel", [((-1, -1), 6), ((4, -1), 6), ((2, 2), 5)])
def test_infer_size_refuses_bad_shapes(size, numel):
    with pytest.raises(Fallback):
        _infer_size(size, numel)


@pytest.mark.parametrize("case", [
    ((6, 5), (1, 0), (30,)),           # contiguous: any view
    ((6, 5), (1, 0), (3, 2, 5)),
    ((4, 6), (0, 1), (6, 4)),          # transposed: only views that keep the dims apart
    ((4, 6), (0, 1), (24,)),
    ((3, 4, 5), (0, 2, 1), (3, 20)),
    ((3, 4, 5), (0, 2, 1), (12, 5)),
    ((7, 1, 3), (2, 1, 0), (3, 7)),
    ((0, 5), (1, 0), (5, 0)),
], ids=str)
def test_view_strides_are_torchs(case):
    shape, perm, new = case
    base = torch.empty([shape[p] for p in perm]).permute([perm.index(i) for i in range(len(perm))])
    assert tuple(base.shape) == shape
    got = _view_strides(shape, tuple(base.stride()), new)
    try:
        want = tuple(base.view(new).stride())
    except RuntimeError:
        want = None
    assert got == want


def test_every_rule_names_an_aten_overload():
    for name in list(RULES) + list(ARANGE):
        _, op, overload = name.split(".")
        assert hasattr(getattr(torch.ops.aten, op), overload), name


@pytest.mark.parametrize("n", [0, 1, 4, 7])
@pytest.mark.parametrize("r", [0, 1, 2, 3, 5])
@pytest.mark.parametrize("with_replacement", [False, True])
def test_combinations_shape_is_torchs(n, r, with_replacement):
    x = torch.randn(n)
    out = RULES["aten.combinations.default"]({"self": x, "r": r, "with_replacement": with_replacement})
    assert out.shape == tuple(torch.combinations(x, r, with_replacement).shape)
