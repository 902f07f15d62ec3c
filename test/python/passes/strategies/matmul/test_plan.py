"""The matmul strategy's plans (passes/strategies/matmul/plan.py): its variants."""

from __future__ import annotations

import pytest
from strategy_kernels import CUDA, cuda_report, matmul_bias_gelu, needs_ptxas


@needs_ptxas
@pytest.mark.parametrize("variant", [{"stages": 1}, {"stages": 2}, {"stages": 3, "warp_tiles": (4, 4)},
                                     {"stages": 4, "warp_tiles": (4, 8)}, {"group_m": 0}])
def test_matmul_plan_variants_assemble(variant):
    """The GEMM plan variants bench/variants.py times assemble without spills: one staged
    tile with register prefetch (no cp.async), 2-4 pipeline stages, 64 x 64 warp tiles,
    workgroups in grid order."""
    from kf.passes.strategies.matmul import MatmulVariant

    v = MatmulVariant(**variant)
    built = matmul_bias_gelu(4096, 4096, 1024, "bf16")
    plan, emitted = built.emit(CUDA, v)
    ptx, r = cuda_report(built)
    assert r["spill_store_bytes"] == 0 and r["spill_load_bytes"] == 0, r
    assert plan["stages"] == v.stages and plan["group_m"] == v.group_m
    assert ("cp.async.cg" in ptx) == (plan["stages"] > 1)
    assert (plan["block_m"], plan["block_n"]) == (128, 32 * v.warp_tiles[1])
