"""passes/strategies/rowwise/plan.py: registers mode or the loop kernel, threads, lanes
and rows a workgroup, and the variants (RowwiseVariant) as plan data."""

from __future__ import annotations

import dataclasses

import pytest
import torch
from mlir import ir
from rowwise_kernels import build, needs_vulkan

from kf.passes.strategies.base import TargetInfo
from kf.passes.strategies.rowwise import RowwiseStrategy, RowwiseVariant


@pytest.mark.parametrize("target,shape,elem,want", [
    # 32768 x 8192 bf16: 1024 vectors of 8, 256 threads with 4 each, one row a workgroup
    ("cuda", (32768, 8192), "bf16", {"row_threads": 256, "rows_per_block": 1, "chunks": 4, "vector_lanes": 8}),
    # 8 KiB rows: 128 threads of 32 values, two rows a workgroup of 256
    ("cuda", (8192, 4096), "bf16", {"row_threads": 128, "rows_per_block": 2, "chunks": 4, "vector_lanes": 8}),
    # an odd row: one element a vector, 16 threads a row, 8 rows a workgroup (7 rows: one idle group)
    ("cuda", (7, 257), "f16", {"row_threads": 16, "rows_per_block": 8, "chunks": 17, "vector_lanes": 1}),
    # 1000 = 125 x 8: 4 vectors of the 125 per thread, the last chunk partial
    ("cuda", (7, 1000), "bf16", {"row_threads": 32, "rows_per_block": 8, "chunks": 4, "vector_lanes": 8}),
    # SPIR-V: no bf16 vectors, so 32 scalar values a thread
    ("spirv", (32768, 8192), "bf16", {"row_threads": 256, "rows_per_block": 1, "chunks": 32, "vector_lanes": 1}),
])
def test_registers_plan(target, shape, elem, want):
    """Registers mode's plan: lanes that divide the row, threads a row for at most 32
    values each, and rows sharing a workgroup of 256 threads where a row needs fewer."""
    ctx, module, kernel, gm = build("layer_norm", shape, elem)
    with ctx, ir.Location.unknown():
        plan = RowwiseStrategy().plan(kernel, TargetInfo.for_target(target))
    assert plan["mode"] == "registers" and {k: plan[k] for k in want} == want
    assert plan["threads"] == want["row_threads"] * want["rows_per_block"] and plan["reciprocal"]
    assert plan["chunks"] * plan["vector_lanes"] <= RowwiseVariant().row_registers == 32


def test_registers_plan_falls_back():
    """The loop kernel where registers mode does not apply: f32 rows that share a
    workgroup (no register cap) or on a target without one, rows longer than 32 values
    a thread at the thread cap, reductions over several dims."""
    for target, shape, elem in (("cuda", (64, 4096), "f32"), ("spirv", (64, 8192), "f32"),
                                ("cuda", (4, 65536), "bf16"), ("cuda", (3, 8193), "bf16")):
        ctx, module, kernel, gm = build("softmax", shape, elem)
        with ctx, ir.Location.unknown():
            plan = RowwiseStrategy().plan(kernel, TargetInfo.for_target(target))
        assert plan["mode"] == "loop" and plan["reciprocal"] == (elem != "f32"), (shape, elem, plan)


def test_registers_plan_f32_capped():
    """f32 rows take registers mode on CUDA where one row fills a workgroup and the
    register cap holds it; the division stays a division (f32 outputs)."""
    ctx, module, kernel, gm = build("softmax", (64, 8192), "f32")
    with ctx, ir.Location.unknown():
        plan = RowwiseStrategy().plan(kernel, TargetInfo.for_target("cuda"))
    assert plan["mode"] == "registers" and plan["rows_per_block"] == 1, plan
    assert plan["max_registers"] == RowwiseVariant().row_max_registers == 64 and not plan["reciprocal"]


def test_variants_are_plan_data():
    """The rowwise variants are kf-tile options and the option ``variants``: the plan
    records the variant it was made with, so the IR (and the cache key) tells the
    kernels apart; a variant that selects the loop kernel computes what torch does on
    fresh inputs (an odd row of 257 on Vulkan)."""
    import kf
    from kf.passes.strategies.base import variants_by_kind

    v = variants_by_kind({"rowwise.row_registers": "0", "rowwise.row_preload": "all",
                          "rowwise.row_registers_wide_capped": "false"})["rowwise"]
    assert v == RowwiseVariant(row_registers=0, row_preload="all", row_registers_wide_capped=False)
    for fields, message in (({"row_preload": "some"}, "'row_preload' takes rows, pipelined or all, not 'some'"),
                            ({"row_reciprocal": "sometimes"}, "'row_reciprocal' takes narrow, always or never"),
                            ({"row_block": "-1"}, "'row_block' takes an int >= 0"),
                            ({"row_register": "0"}, "no variant 'row_register'")):
        with pytest.raises(ValueError, match=message):
            variants_by_kind({f"rowwise.{k}": t for k, t in fields.items()})

    def softmax(x):
        return torch.softmax(x, dim=-1)

    x = torch.randn(7, 257, dtype=torch.float16)
    plans = {}
    for variants in ("", "rowwise.row_registers=0"):
        f = kf.jit(softmax, target="vulkan", variants=variants)
        [k] = kf.explain(f, x, file=None).kernels
        plans[variants] = k.plan
    assert plans[""]["mode"] == "registers" and plans[""]["variant"] == dataclasses.asdict(RowwiseVariant())
    assert plans["rowwise.row_registers=0"]["mode"] == "loop"
    assert plans["rowwise.row_registers=0"]["variant"]["row_registers"] == 0
    needs_vulkan()
    y = torch.randn(7, 257, dtype=torch.float16)
    torch.testing.assert_close(kf.jit(softmax, target="vulkan", variants="rowwise.row_registers=0")(y),
                               torch.softmax(y.float(), -1).half(), rtol=1e-2, atol=1e-3)
