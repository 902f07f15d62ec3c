"""passes/strategies/rowwise/analysis.py: the kernel functions the rowwise strategy
refuses (NotApplicable), so that kf-map-to-gpu falls back to generic."""

from __future__ import annotations

import pytest
from mlir import ir
from rowwise_kernels import kernel_of

from kf.dialects import builders as kb
from kf.passes.strategies.base import NotApplicable, TargetInfo
from kf.passes.strategies.rowwise import RowwiseStrategy


@pytest.mark.parametrize("why,body,specs", [
    ("not the trailing dims", lambda x: [kb.mean(x, dims=[0], keepdim=True)], [((4, 8), "f32")]),
    ("no reduction", lambda x: [kb.exp(x)], [((4, 8), "f32")]),
    ("not a rowwise op", lambda x, y: [kb.matmul(x, y)], [((4, 8), "f32"), ((8, 4), "f32")]),
    ("different row spaces", lambda x: [kb.sum(x, dims=[-1], keepdim=True), kb.sum(x, dims=[-2, -1])],
     [((4, 8), "f32")]),
    ("keepdim=False", lambda x: [kb.sub(x, kb.mean(x, dims=[-1]))], [((8, 8), "f32")]),
    ("reduces floats", lambda x: [kb.sum(x, dims=[-1])], [((4, 8), "i32")]),
])
def test_not_applicable(why, body, specs):
    """What the strategy refuses, so that kf-map-to-gpu falls back to generic."""
    ctx, _, kernel, gm = kernel_of(body, specs)
    with ctx, ir.Location.unknown(), pytest.raises(NotApplicable, match=why):
        RowwiseStrategy().plan(kernel, TargetInfo.for_target("cuda"))
