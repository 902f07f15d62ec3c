"""The SIMT attention backward at run-time sequence lengths (passes/strategies/attention/
backward/run_time.py): kernel functions with ``?`` sequences planned on their bound,
their launches (slots, grids) and the kernels that read the lengths from their size
slots (assembled by ptxas here); the gradients against torch at many lengths, through
kf's autograd, are test/python/compiler/test_autograd.py's."""

from __future__ import annotations

import re

import pytest
from strategy_kernels import CUDA, HOPPER, SPIRV, attention_backward, needs_ptxas, ptxas_reports
from kf.dialects.types import DYN
from kf.passes.strategies import run_time_sizes
from kf.passes.strategies.base import strategy_for
from mlir import ir


def emit_run_time(built, target):
    """(plan, EmittedKernel) as kf-tile and kf-map-to-gpu make them for a kernel with
    run-time sizes: planned on its bound, its slots in the plan's ``sizes``."""
    with built.ctx, ir.Location.unknown():
        strategy = strategy_for("attention_backward")
        with run_time_sizes.bounded(built.kernel.operation) as (bounded, slots):
            plan = {**strategy.plan(bounded, target), "sizes": [list(s) for s in slots]}
            emitted = strategy.emit(bounded, plan, built.gpu_module, target)
    return plan, emitted


def test_launch_reads_both_lengths():
    """q, k, v, O, lse, dO of run-time lengths: the preprocess takes the inputs' slots and
    a thread per query row; the main kernel's results follow the workspace, so their
    slots are one position further; its grid is the key blocks (from k's length) and
    then the query blocks (from q's)."""
    built = attention_backward(2, 3, DYN, DYN, 40, "f32")
    plan, emitted = emit_run_time(built, SPIRV)
    b = plan["block"]
    assert plan["kernel"] == "simt" and plan["sizes"] == [[i, 2] for i in range(9)], plan
    assert emitted.prelude.sizes == tuple((i, 2) for i in range(6)), emitted.prelude
    assert emitted.sizes == tuple((i, 2) for i in range(6)) + ((7, 2), (8, 2), (9, 2)), emitted
    assert emitted.grid_sizes == (f"FloorDiv(k1*1 + {b - 1}, {b}) + FloorDiv(k0*1 + {b - 1}, {b})", "6", "1")
    assert emitted.prelude.grid_sizes == ("FloorDiv(k0*6 + 127, 128)", "1", "1"), emitted.prelude
    # the workspace holds the rows at the bound
    assert ir.RankedTensorType(emitted.prelude_output).shape == [2, 6 * run_time_sizes.BOUND]


def test_cross_lengths_take_one_slot_each():
    """dk and dv alone, of keys whose length differs from the queries': the grid is the
    key blocks only, from the keys' slot."""
    built = attention_backward(1, 2, DYN, DYN, 32, "f32", results=("dk", "dv"))
    plan, emitted = emit_run_time(built, SPIRV)
    b = plan["block"]
    assert plan["query_blocks"] == 0 and emitted.grid_sizes[0] == f"FloorDiv(k1*1 + {b - 1}, {b})", emitted


def test_wgmma_backward_is_for_static_lengths():
    """On sm_90a at head dim 64 the wgmma backward applies; it is written for static
    lengths, so kf-tile's ValueError makes the driver compile such a backward per
    length rather than run the SIMT kernel there."""
    built = attention_backward(2, 3, DYN, DYN, 64, "bf16")
    with pytest.raises(ValueError, match="static sequence lengths"):
        emit_run_time(built, HOPPER)


@needs_ptxas
@pytest.mark.parametrize("d", [64, 40])
def test_sm80_kernels_read_the_lengths(d):
    """Off sm_90a the SIMT backward and its preprocess with run-time lengths assemble for
    sm_80 without spills; each takes the slots' buffer last and loops over the query
    blocks to a loaded length, not a constant."""
    built = attention_backward(2, 3, DYN, DYN, d, "bf16")
    plan, emitted = emit_run_time(built, CUDA)
    _, reports, _ = ptxas_reports(built, "sm_80")
    assert set(reports) == {emitted.name, emitted.prelude.name}
    for name, r in reports.items():
        assert r["spill_store_bytes"] == 0 and r["spill_load_bytes"] == 0, (name, r)
    text = built.gpu_text()
    assert re.search(rf"gpu\.func @{emitted.name}\([^)]*, %arg\d+: memref<9xi32>\)", text)
    assert re.search(rf"gpu\.func @{emitted.prelude.name}\([^)]*, %arg\d+: memref<6xi32>\)", text)
    assert re.search(rf"scf\.for %\w+ = %c0 to %\d+ step %c{plan['block']} ", text)
