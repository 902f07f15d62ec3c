"""passes/strategies/rowwise/analysis.py: the kernel functions the rowwise strategy
refuses (NotApplicable), so that kf-map-to-gpu falls back to generic."""

from __future__ import annotations

import pytest
from mlir import ir
from rowwise_kernels import kernel_of

from kf.dialects import builders as kb
from kf.passes.strategies.base import NotApplicable, TargetInfo
from kf.passes.strategies.rowwise import RowwiseStrategy


def _partial(x, groups):
    """The column partial of x (kf-split-reductions' form): each block of rows summed."""
    shape = list(ir.RankedTensorType(x.type).shape)
    return kb.sum(kb.reshape(x, [groups, shape[0] // groups] + shape[1:]), dims=[1], keepdim=False, elem="f32")


@pytest.mark.parametrize("why,body,specs", [
    ("not the trailing dims", lambda x: [kb.mean(x, dims=[0], keepdim=True)], [((4, 8), "f32")]),
    ("no reduction", lambda x: [kb.exp(x)], [((4, 8), "f32")]),
    ("not a rowwise op", lambda x, y: [kb.matmul(x, y)], [((4, 8), "f32"), ((8, 4), "f32")]),
    ("different row spaces", lambda x: [kb.sum(x, dims=[-1], keepdim=True), kb.sum(x, dims=[-2, -1])],
     [((4, 8), "f32")]),
    ("keepdim=False", lambda x: [kb.sub(x, kb.mean(x, dims=[-1]))], [((8, 8), "f32")]),
    ("reduces floats", lambda x: [kb.sum(x, dims=[-1])], [((4, 8), "i32")]),
    ("partials are outputs", lambda x: [kb.softmax(x, dim=-1), kb.exp(_partial(x, 2))], [((4, 8), "f32")]),
    ("one count of groups", lambda x: [kb.softmax(x, dim=-1), _partial(x, 2), _partial(x, 4)], [((4, 8), "f32")]),
    ("sums rows of the row space", lambda x, y: [kb.softmax(x, dim=-1), _partial(y, 2)],
     [((2, 4, 8), "f32"), ((4, 8), "f32")]),
])
def test_not_applicable(why, body, specs):
    """What the strategy refuses, so that kf-map-to-gpu falls back to generic."""
    ctx, _, kernel, gm = kernel_of(body, specs)
    with ctx, ir.Location.unknown(), pytest.raises(NotApplicable, match=why):
        RowwiseStrategy().plan(kernel, TargetInfo.for_target("cuda"))


def test_column_partials():
    """Column partials are outputs of shape [G, cols] indexed by the group: the analysis
    records the groups, and the plan the rows a group walks."""
    from kf.passes.strategies.rowwise.analysis import analyze, natural

    ctx, _, kernel, gm = kernel_of(lambda x, dy: [kb.softmax(x, dim=-1), _partial(kb.mul(dy, x), 3)],
                                   [((6, 40), "f32"), ((6, 40), "f32")])
    with ctx, ir.Location.unknown():
        a = analyze(kernel)
        plan = RowwiseStrategy().plan(kernel, TargetInfo.for_target("cuda"))
    [(i, p)] = a.partials
    assert i == 1 and p.shape == (3, 40) and a.groups == 3 and natural(a, p) == (("g", 0), ("c", 0))
    assert plan["groups"] == 3 and plan["group_rows"] == 2
