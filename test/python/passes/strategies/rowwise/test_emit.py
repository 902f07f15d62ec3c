"""passes/strategies/rowwise/emit.py (with loop.py and registers.py): column partials --
a group of threads walks a block of rows (``RowEmitter.rows``) and writes each block's
column sums beside the row outputs -- in both kernels, run on Vulkan against torch in
float64 and assembled by ptxas for sm_90a."""

from __future__ import annotations

import pytest
import torch
from mlir import ir
from rowwise_kernels import TORCH, kernel_of, needs_ptxas, needs_vulkan, run_kernel

from kf.dialects import builders as kb
from kf.passes import registry
from kf.passes.strategies.base import TargetInfo
from kf.passes.strategies.rowwise import RowwiseStrategy, RowwiseVariant

EPS = 1e-5


def norm_backward_body(groups: int, elem: str):
    """A norm's backward as kf-split-reductions and kf-fuse leave it: dx-like row output
    ``w * xhat`` (xhat from the row's mean and variance), and the partial sums over each
    of ``groups`` blocks of rows of ``dy * xhat`` (the weight's gradient) and of ``dy``
    (the bias's), in f32."""
    def body(x, dy, w):
        shape = list(ir.RankedTensorType(x.type).shape)
        rows, n = shape[0], shape[-1]
        mu = kb.mean(x, dims=[-1], keepdim=True)
        v = kb.var(x, dims=[-1], keepdim=True, correction=1.0)
        xhat = kb.div(kb.sub(x, mu), kb.sqrt(kb.add(v, kb.scalar(EPS, elem))))
        blocks = [groups, rows // groups, n]
        dw = kb.sum(kb.reshape(kb.mul(dy, xhat), blocks), dims=[1], keepdim=False, elem="f32")
        db = kb.sum(kb.reshape(dy, blocks), dims=[1], keepdim=False, elem="f32")
        return [kb.mul(w, xhat), dw, db]
    return body


def reference(x, dy, w, groups):
    x, dy, w = x.double(), dy.double(), w.double()
    xhat = (x - x.mean(-1, keepdim=True)) / (x.var(-1, keepdim=True) + EPS).sqrt()
    blocks = (groups, x.shape[0] // groups, x.shape[-1])
    return [w * xhat, (dy * xhat).reshape(blocks).sum(1), dy.reshape(blocks).sum(1)]


#: (rows, row length, groups): one group of all rows, groups of one row, a prime row
#: length, a workgroup of several groups with the last workgroup's groups partly missing
#: (registers mode: 13 groups of 2 rows, 40 elements), a 4096 row.
SHAPES = [(7, 40, 1), (5, 65, 5), (26, 40, 13), (24, 65, 4), (12, 4096, 3), (1, 40, 1)]


@pytest.mark.parametrize("elem", ["f32", "bf16"])
@pytest.mark.parametrize("rows,n,groups", SHAPES)
def test_partials_on_vulkan(rows, n, groups, elem):
    """Row outputs and column partials match float64 (f32: the loop kernel, the sums in
    the partial output itself; bf16: registers mode, the sums in registers)."""
    needs_vulkan()
    gen = torch.Generator().manual_seed(rows * 1000 + n)
    args = [torch.randn(rows, n, generator=gen).to(TORCH[elem]), torch.randn(rows, n, generator=gen).to(TORCH[elem]),
            torch.randn(n, generator=gen).to(TORCH[elem])]
    specs = [((rows, n), elem), ((rows, n), elem), ((n,), elem)]
    outs, plan = run_kernel(norm_backward_body(groups, elem), specs, args)
    assert plan["mode"] == ("loop" if elem == "f32" else "registers")
    assert plan["groups"] == groups and plan["group_rows"] == rows // groups
    want = reference(*args, groups)
    assert outs[1].shape == (groups, n) and outs[1].dtype == outs[2].dtype == torch.float32
    tol = {"f32": 1e-5, "bf16": 2e-2}[elem]
    torch.testing.assert_close(outs[0].double(), want[0].to(TORCH[elem]).double(), rtol=tol, atol=tol)
    for got, w in zip(outs[1:], want[1:]):
        # sums of rows // groups products, each rounded to the inputs' type once
        torch.testing.assert_close(got.double(), w, rtol=1e-5, atol=1e-5 * (rows // groups) ** 0.5 * 4)


def _lowered(rows, n, groups, elem, target):
    ctx, module, kernel, gm = kernel_of(norm_backward_body(groups, elem),
                                        [((rows, n), elem), ((rows, n), elem), ((n,), elem)])
    with ctx, ir.Location.unknown():
        s = RowwiseStrategy()
        plan = s.plan(kernel, target)
        emitted = s.emit(kernel, plan, gm, target)
        for p in ("kf-promote-shared", "kf-vectorize"):
            registry.create(p).run(module.operation)
        assert module.operation.verify()
        return "module attributes {gpu.container_module} {\n" + str(gm) + "\n}\n", plan, emitted


@pytest.mark.parametrize("elem,rows,n,groups,mode", [
    ("bf16", 8192, 4096, 256, "registers"), ("bf16", 32768, 8192, 256, "registers"),
    # f32: registers mode where a group fills a workgroup (the loop kernel would keep the
    # sums in memory), the loop kernel where groups share one
    ("f32", 2048, 8192, 256, "registers"), ("f32", 8192, 4096, 256, "registers"), ("f32", 520, 65, 260, "loop"),
    ("bf16", 520, 65, 260, "registers"), ("bf16", 64, 16384, 8, "loop"),
])
def test_partials_ptx(elem, rows, n, groups, mode):
    """On CUDA: the group loop around the phases, a workgroup per ``rows_per_block``
    groups, the partial sums stored once a group; the PTX assembles for sm_90a."""
    from kf.passes.to_cuda import assemble, compile_to_ptx

    needs_ptxas()
    text, plan, emitted = _lowered(rows, n, groups, elem, TargetInfo.for_target("cuda", "sm_90a"))
    assert plan["mode"] == mode
    P = plan.get("rows_per_block", 1)
    assert emitted.grid == (-(-groups // P), 1, 1) and plan["group_rows"] == rows // groups
    assert plan.get("max_registers", 0) == 0  # the sums live beside the row: no cap
    if mode == "registers" and n <= 4096:
        # 16 values a thread (RowwiseVariant.partial_registers) where 256 threads can share the row
        assert plan["chunks"] * plan["vector_lanes"] <= RowwiseVariant().partial_registers == 16
    assert f"memref<{groups}x{n}xf32>" in text
    [ptx] = compile_to_ptx(text, chip="sm_90a").values()
    assemble(ptx, chip="sm_90a")


def test_partials_without_partials_unchanged():
    """A kernel without partials has no group loop: one row (or rows_per_block rows) a
    workgroup, as before."""
    ctx, module, kernel, gm = kernel_of(lambda x: [kb.softmax(x, dim=-1)], [((64, 4096), "bf16")])
    with ctx, ir.Location.unknown():
        t = TargetInfo.for_target("cuda")
        plan = RowwiseStrategy().plan(kernel, t, RowwiseVariant())
        emitted = RowwiseStrategy().emit(kernel, plan, gm, t)
    assert "groups" not in plan and emitted.grid == (64 // plan["rows_per_block"], 1, 1)


def _masked_softmax_backward(s, dp, n: int):
    """A causal softmax and its gradient as an attention's recomputing backward writes
    them: the mask from ``arange`` compares inside the function (``kf.iota``)."""
    keep = torch.arange(n)[:, None] >= torch.arange(n)[None, :]
    p = torch.softmax(s.masked_fill(~keep, float("-inf")), -1)
    t = dp * p.float()
    ds = (t - p.float() * t.sum(-1, keepdim=True)).to(s.dtype)
    return p, ds.masked_fill(keep.logical_not(), 0.0) * 0.125


@pytest.mark.parametrize("n", [1, 7, 257, 300])
def test_iota_mask_is_rowwise(n):
    """A mask of index compares stays in the rowwise kernel (each element's indices, not
    a generic kernel whose every element walks the row again): one rowwise kernel, and
    on Vulkan torch's results; for CUDA, its PTX."""
    import kf

    gen = torch.Generator().manual_seed(n)
    s, dp = torch.randn(2, 3, n, n, generator=gen).bfloat16(), torch.randn(2, 3, n, n, generator=gen)
    cuda_fn = kf.jit(_masked_softmax_backward, target="cuda")
    seen = kf.inspect(cuda_fn, s, dp, n)
    assert seen.fused.count('kf.kernel = "rowwise"') == 1 and "generic" not in seen.fused
    assert seen.ptx.count(".entry") == 1
    needs_vulkan()
    got = kf.jit(_masked_softmax_backward, target="vulkan")(s, dp, n)
    for a, b in zip(got, _masked_softmax_backward(s, dp, n)):
        torch.testing.assert_close(a.float(), b.float(), rtol=2e-2, atol=2e-3)


@pytest.mark.parametrize("fn,shape,dim", [
    (lambda x, dim: torch.log_softmax(x, dim), (257, 257, 1), -1),    # 66049 rows of one
    (lambda x, dim: torch.softmax(x, dim), (65536, 3), -1),           # one row past 65535
    (lambda x, dim: x - x.mean(dim, keepdim=True), (70001, 5), -1),
])
def test_rows_past_the_grid_limit(fn, shape, dim):
    """More rows than Vulkan's grid x guarantees (65535 workgroups): the grid folds into a
    second dim and the spare workgroups idle (rowwise/__init__.py, ``folded_grid``);
    torch's results (a VulkanError naming the grid limit before)."""
    import kf
    from kf.passes.strategies.rowwise import folded_grid

    assert folded_grid(66049, 65535) == (33025, 2, 1) and folded_grid(65535, 65535) == (65535, 1, 1)
    needs_vulkan()
    x = torch.randn(shape, generator=torch.Generator().manual_seed(7))
    got = kf.jit(fn, target="vulkan")(x, dim)
    torch.testing.assert_close(got, fn(x, dim), rtol=1e-5, atol=1e-5)
