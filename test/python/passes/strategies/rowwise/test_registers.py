"""passes/strategies/rowwise/registers.py: registers mode's straight-line IR and its PTX
(loads issued before the reductions, the register cap, weights loaded a chunk ahead)."""

from __future__ import annotations

from rowwise_kernels import lower, needs_ptxas, ptx_for

from kf.passes.strategies.base import TargetInfo
from kf.passes.strategies.rowwise import RowwiseVariant


def test_registers_mode_ir():
    """Registers mode writes straight-line code: no row loops (so kf-promote-shared and
    kf-vectorize leave it alone), one vector load a chunk of each input (bf16 read as
    32-bit words on CUDA), one barrier a reduction, one division a row for
    1 / sqrt(var + eps), and stores guarded only where a chunk or a row can be missing."""
    text, plan, emitted = lower("layer_norm", (4, 8192), "bf16", TargetInfo.for_target("cuda"))
    assert plan["mode"] == "registers" and emitted.grid == (4, 1, 1) and emitted.block == (256, 1, 1)
    assert "scf.for" not in text and "kf.row_loop" not in text and "kf.promote" not in text
    assert text.count("vector.load") == 3 * 4 and text.count("vector.store") == 4
    assert text.count("vector.bitcast") == 3 * 4 and "vector<4xi32>" in text
    assert text.count("gpu.barrier") == 2 and "scf.if" in text  # the warp partials' store
    assert "kf.assumed_alignment = 16" in text
    # sum / R, m2 / (R - 1) and 1 / sqrt(var + eps): none per element
    assert text.count("arith.divf") == 3 and text.count("arith.mulf") >= 3 * 32
    text, plan, emitted = lower("layer_norm", (7, 1000), "bf16", TargetInfo.for_target("cuda"))
    # 125 vectors over 32 threads: chunk 3 exists for threads < 29 only; 7 rows in 8 groups
    assert plan["rows_per_block"] == 8 and text.count("scf.if") >= 4 and "arith.minui" in text
    text, plan, _ = lower("layer_norm", (7, 1000), "bf16", TargetInfo.for_target("spirv"))
    assert "vector.bitcast" not in text and "vector.load" not in text and plan["vector_lanes"] == 1


def test_registers_mode_ptx():
    """In the PTX of registers mode (sm_90): each thread's loads of x are issued before
    any reduction; exp once an element in the softmax (32 a thread), no division an
    element in the layer norm; no spills."""
    needs_ptxas()
    from kf.passes.to_cuda import assemble

    ptx, plan = ptx_for("layer_norm", (4, 8192), "bf16")
    first_sync = ptx.index("bar.sync")
    assert ptx[:first_sync].count("ld.global.v4") == 4 and ptx.count("ld.global.v4") == 12
    assert ptx.count("st.global.v4") == 4 and ptx.count("div.rn.f32") <= 3
    report = assemble(ptx, "sm_90").kernels["layer_norm"]
    assert report["spill_store_bytes"] == 0 and report["spill_load_bytes"] == 0, report
    ptx, plan = ptx_for("softmax", (4, 8192), "bf16")
    assert ptx.count("ex2.approx") == 32 and "div.rn.f32" not in ptx and ptx.count("bar.sync") == 2
    ptx, plan = ptx_for("rms_norm", (4, 8192), "bf16")
    assert ptx.count("ld.global.v4") == 8 and ptx.count("bar.sync") == 1


def test_register_cap_and_pipelined_weights():
    """row_max_registers reaches the PTX as .maxnreg (one row a workgroup only) and holds
    the bf16 layer norm at 32768 x 8192 to 64 registers without spills; "pipelined"
    issues the weights of chunk c + 1 before chunk c's stores."""
    needs_ptxas()
    from kf.passes.to_cuda import assemble

    capped = RowwiseVariant(row_max_registers=64, row_preload="pipelined")
    ptx, plan = ptx_for("layer_norm", (4, 8192), "bf16", "sm_90", variant=capped)
    assert plan["max_registers"] == 64 and ".maxnreg 64" in ptx
    report = assemble(ptx, "sm_90").kernels["layer_norm"]
    assert report["registers"] <= 64 and report["spill_store_bytes"] == 0 and report["spill_load_bytes"] == 0
    # after the reductions: w and b of chunks 0 and 1, then a store before chunk 2's
    tail = ptx[ptx.rindex("bar.sync"):]
    assert tail[:tail.index("st.global.v4")].count("ld.global.v4") == 4
    ptx, plan = ptx_for("layer_norm", (7, 1000), "bf16", "sm_90", variant=capped)
    assert plan["rows_per_block"] > 1 and not plan["max_registers"] and ".maxnreg" not in ptx
