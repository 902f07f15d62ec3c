"""The wgmma attention backward (passes/strategies/attention/backward/hopper/): where it
applies, its three kernels as ptxas assembles them for sm_90a (no spills, wgmmas not
serialized), and, on an H200, its gradients against float64."""

from __future__ import annotations

from collections import Counter

import pytest
import torch
from kf.dialects.types import TensorSpec
from strategy_kernels import (CUDA, HOPPER, attention_backward, attention_backward_inputs, cuda_run_program, needs_hopper,
                              needs_ptxas, ptx_entries, ptxas_reports)


def _products_wanted(bm: int, d: int) -> dict[int, int]:
    """A step's wgmmas by n: S^T and dP^T (n = bm), dQ over the 128 keys (n = 64), dV and
    dK over the step's queries (n = d)."""
    want = Counter()
    want[bm] += 2 * d // 16
    want[64] += 128 // 16
    want[d] += 2 * bm // 16
    return dict(want)


def _products(main: str, bm: int, d: int) -> dict[int, int]:
    return {n: main.count(f"m64n{n}k16.f32.bf16.bf16") for n in _products_wanted(bm, d)}


@pytest.mark.parametrize("d,bm", [(128, 64), (64, 128)])
def test_plan(d, bm):
    built = attention_backward(4, 32, 2048, 2048, d, "bf16")
    plan, emitted = built.emit(HOPPER)
    assert plan["kernel"] == "hopper" and plan["block_m"] == bm and plan["block_n"] == 128, plan
    assert plan["threads"] == 384 and plan["grid"] == [16, 128, 1] and plan["shared_bytes"] <= 227 * 1024
    assert abs(plan["score_scale"] - d ** -0.5) < 1e-12 and abs(plan["grad_scale"] - d ** -0.5) < 1e-12
    assert emitted.prelude.name.endswith("_pre") and emitted.postlude.name.endswith("_post")
    assert emitted.postlude_results == (0,)  # dq, the first result


@pytest.mark.parametrize("case,kwargs", [
    ("f32", dict(elem="f32")), ("head dim 96", dict(d=96)), ("mask a head's own", dict(mask_shape=(1, 2, 256, 256))),
    ("mask over 64 query blocks", dict(mask_shape=(4160, 256), sq=4160)),
    ("sm_80", dict(target=CUDA)), ("head dims differ", dict(dv=64))])
def test_other_kernels_where_wgmma_does_not_apply(case, kwargs):
    """Not sm_90a, not 16-bit, head dims other than 64 or 128 (or unequal), masks that
    differ between heads or walks of more than 64 query blocks: the SIMT kernel."""
    target = kwargs.pop("target", HOPPER)
    args = dict(b=1, h=2, sq=256, sk=256, d=128, elem="bf16")
    args.update(kwargs)
    b, h, sq, sk, d, elem = (args.pop(x) for x in ("b", "h", "sq", "sk", "d", "elem"))
    plan, _ = attention_backward(b, h, sq, sk, d, elem, **args).emit(target)
    assert plan["kernel"] == "simt", plan


@needs_ptxas
@pytest.mark.parametrize("d,seq", [(128, 2048), (64, 2048), (128, 257), (64, 1000)])
def test_three_kernels_ptxas(d, seq):
    """The seed attention's backward on sm_90a is three kernels (preprocess, the main
    kernel, postprocess); the main one: setmaxnreg 240/24 for consumers and producer, no
    spills, ptxas neither serializes the wgmmas nor injects waits (C75xx), 5 products a
    step (S^T, dP^T, dQ by descriptors; dV, dK with A from registers), the 64 x 64 dQ
    added by 16 red.global.add.v2.f32 a thread."""
    built = attention_backward(2, 2, seq, seq, d, "bf16")
    plan, emitted = built.emit(HOPPER)
    ptx, reports, log = ptxas_reports(built)
    entries = ptx_entries(ptx)
    assert set(entries) == {emitted.name, emitted.prelude.name, emitted.postlude.name}
    main = entries[emitted.name]
    r = reports[emitted.name]
    assert r["spill_store_bytes"] == 0 and r["spill_load_bytes"] == 0, r
    assert "C75" not in log, log
    assert "setmaxnreg.inc.sync.aligned.u32 \t240" in main and "setmaxnreg.dec.sync.aligned.u32 \t24" in main
    assert _products(main, plan["block_m"], d) == _products_wanted(plan["block_m"], d)
    assert main.count("red.global.add.v2.f32") == 16
    for name in (emitted.prelude.name, emitted.postlude.name):
        assert reports[name]["spill_store_bytes"] == 0, reports[name]


@pytest.mark.parametrize("mask_shape", [(256, 256), (1, 1, 256, 256)])
def test_masked_plan(mask_shape):
    """A mask every head shares: the wgmma kernel, its workspace with the block table
    (a code a key block and query block), a dead-row flag and dV share a 64 rows."""
    plan, emitted = attention_backward(2, 2, 256, 256, 128, "bf16", mask_shape=mask_shape).emit(HOPPER)
    assert plan["kernel"] == "hopper" and plan["masked"] and plan["mask_fill"] == -1e9, plan
    rows = 2 * 2 * 256
    assert plan["workspace"] == 2 * rows + rows * 128 + 2 * 4 + rows // 64 + rows // 64 * 128
    # the 2 x 4 table workgroups in the first 2 columns of the 4 rows, then row workgroups
    assert emitted.prelude.grid == (2 + 4, 4, 1)


@needs_ptxas
@pytest.mark.parametrize("d,seq", [(128, 2048), (64, 2048), (128, 257), (64, 257), (64, 1000), (128, 4096)])
def test_masked_ptxas(d, seq):
    """Under a mask the main kernel walks the query blocks its key block's column of the
    table keeps: as unmasked, no spills and no serialized wgmmas, the same products; the
    walk's list (the consumers') and bit mask (the producer's), the mask read only in
    blocks the table calls partial."""
    built = attention_backward(1, 2, seq, seq, d, "bf16", mask_shape=(seq, seq))
    plan, emitted = built.emit(HOPPER)
    assert plan["kernel"] == "hopper" and plan["masked"]
    ptx, reports, log = ptxas_reports(built)
    entries = ptx_entries(ptx)
    assert set(entries) == {emitted.name, emitted.prelude.name, emitted.postlude.name}
    for name, r in reports.items():
        assert r["spill_store_bytes"] == 0 and r["spill_load_bytes"] == 0, (name, r)
    assert "C75" not in log, log
    main = entries[emitted.name]
    assert _products(main, plan["block_m"], d) == _products_wanted(plan["block_m"], d)
    assert main.count("red.global.add.v2.f32") == 16
    assert "popc.b64" in main and "vote.sync.ballot" in main
    assert "bar.red.or.pred" in entries[emitted.prelude.name]


@needs_hopper
@pytest.mark.parametrize("b,h,seq,d", [(1, 2, 257, 128), (2, 1, 300, 64), (1, 2, 2048, 128), (1, 1, 1000, 64)])
def test_gradients_h200(b, h, seq, d):
    """The three kernels on the H200 against float64 gradients (bf16 inputs)."""
    built = attention_backward(b, h, seq, seq, d, "bf16")
    plan, emitted = built.emit(HOPPER)
    assert plan["kernel"] == "hopper"
    args, want = attention_backward_inputs(b, h, seq, seq, d, "bf16")
    outs, _ = cuda_run_program(built, emitted, args, [TensorSpec((b, h, seq, d), "bf16")] * 3)
    for name, got, ref in zip(("dq", "dk", "dv"), outs, want):
        err = (got.double() - ref).abs().max().item()
        assert err <= 3e-2 * ref.abs().max().item(), f"{name}: {err}"
    assert torch.isfinite(outs[0]).all()


@needs_hopper
@pytest.mark.parametrize("sq,sk,d,how", [(257, 257, 128, "random"), (300, 300, 64, "random"), (257, 257, 64, "causal"),
                                         (1000, 1000, 128, "causal"), (2048, 2048, 64, "causal"),
                                         (257, 257, 128, "dead row"), (300, 300, 64, "dead row"),
                                         (300, 1000, 64, "random"), (1000, 257, 128, "causal")])
def test_masked_gradients_h200(sq, sk, d, how):
    """The masked kernels on the H200 against float64 gradients: a random mask (blocks the
    table calls partial), a causal one (dead, causal and whole blocks), a row masked
    everywhere (its P is 1 / Sk: dV takes the preprocess's share, dS and dQ are 0),
    cross lengths."""
    b, h = 1, 2
    built = attention_backward(b, h, sq, sk, d, "bf16", mask_shape=(sq, sk))
    plan, emitted = built.emit(HOPPER)
    assert plan["kernel"] == "hopper" and plan["masked"]
    dead = sq - 2 if how == "dead row" else None
    args, want = attention_backward_inputs(b, h, sq, sk, d, "bf16", mask_shape=(sq, sk), causal=how == "causal",
                                           dead_row=dead)
    outs, _ = cuda_run_program(built, emitted, args, [TensorSpec((b, h, sq, d), "bf16"),
                                                      TensorSpec((b, h, sk, d), "bf16"),
                                                      TensorSpec((b, h, sk, d), "bf16")])
    for name, got, ref in zip(("dq", "dk", "dv"), outs, want):
        err = (got.double() - ref).abs().max().item()
        assert err <= 3e-2 * ref.abs().max().item(), f"{name}: {err}"
    if dead is not None:
        assert (outs[0][..., dead, :] == 0).all()
