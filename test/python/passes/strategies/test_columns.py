"""passes/strategies/columns.py: the generic strategy's columns plan -- column sums by
slices of rows, a workgroup a block of columns -- run on every back end present against
torch in float64 (gpu_harness.py), and the kernels that keep the plain plan."""

from __future__ import annotations

import pytest
import torch
from mlir import ir

from gpu_harness import rand
from kf.dialects import builders as kb
from kf.passes.strategies import columns
from kf.passes.strategies.base import TargetInfo
from kf.passes.strategies.generic import GenericStrategy
from rowwise_kernels import kernel_of


def _close(got, want, rows):
    # f32 sums of `rows` terms, each rounded once to the output's type
    tol = {torch.float32: 2e-6 * rows ** 0.5, torch.bfloat16: 1e-2, torch.float16: 2e-3}[got.dtype]
    scale = want.abs().max().item() if want.numel() else 1.0
    torch.testing.assert_close(got.double(), want, rtol=tol, atol=tol * max(scale, 1.0))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=["f32", "bf16"])
@pytest.mark.parametrize("shape", [(1, 40), (7, 65), (257, 33), (1000, 257), (3, 5, 40)], ids=str)
def test_column_sums(run, shape, dtype):
    """A norm's two gradients: sum(dy * xhat) and sum(dy) over the leading dims, cast to
    the inputs' type; odd column counts (the last workgroup's columns partly missing),
    fewer rows than slices, two leading dims."""
    dy, xhat = rand(*shape, dtype=dtype), rand(*shape, dtype=dtype)
    lead = list(range(len(shape) - 1))
    elem = {torch.float32: "f32", torch.bfloat16: "bf16"}[dtype]

    def body(d, x):
        return (kb.cast(kb.sum(kb.mul(d, x), dims=lead, keepdim=False, elem="f32"), elem),
                kb.sum(d, dims=lead, keepdim=True))

    dw, db = run(body, dy, xhat)
    rows = 1
    for s in shape[:-1]:
        rows *= s
    _close(dw, (dy.double() * xhat.double()).sum(lead), rows)
    _close(db, dy.double().sum(lead, keepdim=True), rows)


def test_column_mean(run):
    x = rand(300, 70)
    (got,) = run(lambda a: kb.mean(a, dims=[0], keepdim=False), x)
    _close(got, x.double().mean(0), 300)


@pytest.mark.parametrize("why,body,specs", [
    ("a row reduction", lambda x: [kb.sum(x, dims=[1])], [((8, 40), "f32")]),
    ("a max", lambda x: [kb.reduce_max(x, dims=[0])], [((8, 40), "f32")]),
    ("other shapes", lambda x, y: [kb.sum(x, dims=[0]), kb.sum(y, dims=[0])], [((8, 40), "f32"), ((4, 40), "f32")]),
    ("an integer sum", lambda x: [kb.sum(x, dims=[0])], [((8, 40), "i32")]),
    ("a matmul", lambda x, y: [kb.sum(kb.matmul(x, y), dims=[0])], [((8, 40), "f32"), ((40, 40), "f32")]),
    ("no rows", lambda x: [kb.sum(x, dims=[0])], [((0, 40), "f32")]),
    ("no columns", lambda x: [kb.sum(x, dims=[0])], [((8, 0), "f32")]),
])
def test_plain_plan_elsewhere(why, body, specs):
    """Kernels that are not column sums keep one thread an output element."""
    ctx, module, kernel, _ = kernel_of(body, specs)
    with ctx, ir.Location.unknown():
        assert columns.plan(kernel, 1024, 2 ** 31 - 1) is None, why
        assert GenericStrategy().plan(kernel, TargetInfo.for_target("cuda")).get("mode") is None


def test_columns_plan():
    """32 columns a workgroup of 8 slices: 4096 columns are 128 workgroups."""
    ctx, module, kernel, _ = kernel_of(lambda x, y: [kb.sum(x, dims=[0]), kb.sum(kb.mul(x, y), dims=[0])],
                                  [((256, 4096), "f32"), ((256, 4096), "f32")])
    with ctx, ir.Location.unknown():
        plan = GenericStrategy().plan(kernel, TargetInfo.for_target("cuda"))
    assert plan["mode"] == "columns" and plan["grid"] == 128 and plan["block"] == 256
    assert (plan["columns"], plan["slices"]) == (columns.COLUMNS, columns.SLICES) == (32, 8)


def test_each_sum_walks_the_rows_once():
    """The outputs read the slices' totals (a keepdim sum, a cast of a sum): one loop over
    the rows a sum, none in the stores' region."""
    ctx, module, kernel, gm = kernel_of(
        lambda x, y: [kb.sum(x, dims=[0], keepdim=True), kb.cast(kb.sum(kb.mul(x, y), dims=[0], elem="f32"), "bf16")],
        [((300, 65), "bf16"), ((300, 65), "bf16")])
    with ctx, ir.Location.unknown():
        t = TargetInfo.for_target("cuda")
        s = GenericStrategy()
        s.emit(kernel, s.plan(kernel, t), gm, t)
        text = str(gm)
    assert text.count("scf.for") == 2 and text.count("gpu.barrier") == 4


@pytest.mark.parametrize("shape", [(1,), (7,), (257, 3), (1000, 3, 5), (3, 1, 1)], ids=str)
def test_whole_tensor_sum(run, shape):
    """The sum and the mean of a whole tensor: one column, a workgroup of 256 slices."""
    x = rand(*shape)
    dims = list(range(len(shape)))
    got_sum, got_mean = run(lambda a: [kb.sum(a, dims=dims), kb.mean(a, dims=dims, keepdim=True)], x)
    _close(got_sum, x.double().sum(), x.numel())
    _close(got_mean, x.double().mean(dims, keepdim=True), x.numel())


def test_whole_tensor_sum_plan():
    ctx, module, kernel, _ = kernel_of(lambda x: [kb.sum(x, dims=[0, 1])], [((3000, 13), "f32")])
    with ctx, ir.Location.unknown():
        plan = GenericStrategy().plan(kernel, TargetInfo.for_target("spirv"))
    assert plan["mode"] == "columns" and plan["grid"] == 1 and (plan["columns"], plan["slices"]) == (1, 256)


def test_whole_tensor_sums_at_run_time_sizes():
    """At run-time sizes a whole tensor's sum is this plan too (kf-split-reductions cannot
    cut it): every size is right, and on lavapipe no thread passes its loop limit (one
    thread's loop over 4096 x 104 elements did)."""
    import kf
    from kf.runtime import vulkan

    if not vulkan.is_available():
        pytest.skip("no Vulkan device")

    def f(x):
        return x.sum(), (x * 2).mean()

    k = kf.jit(f, target="vulkan")
    for n in (5, 6, 9, 3000, 1):
        x = torch.randn(n, 8, 13)
        for got, want in zip(k(x), f(x)):
            torch.testing.assert_close(got, want, rtol=1e-4, atol=1e-3)
    assert any("?" in r.signature for r in k.compiles)
