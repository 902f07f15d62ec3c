"""passes/strategies/rowwise/loop.py: the loop kernel's row loops and the markers
kf-vectorize and kf-promote-shared read, and the workgroup-memory limit they respect."""

from __future__ import annotations

from mlir import ir
from rowwise_kernels import build, lower

from kf.passes import registry
from kf.passes.strategies.base import TargetInfo
from kf.passes.strategies.rowwise import RowwiseStrategy, RowwiseVariant


def test_markers_and_plan():
    """The plan's choices reach the IR: lanes on the loops, kf.promote on the loads of
    cached rows, the target's shared limit on the gpu.func (the loop kernel)."""
    text, plan, emitted = lower("layer_norm", (3, 1000), "f16", TargetInfo.for_target("cuda"), passes=(),
                                variant=RowwiseVariant(row_registers=0))
    assert plan["vector_lanes"] == 8 and plan["threads"] == 128 and plan["cached_inputs"] == [0]
    assert plan["reduction"] == "shuffle" and emitted.grid == (3, 1, 1) and emitted.block == (128, 1, 1)
    assert text.count("kf.vector_lanes = 8") == 3 and text.count("{kf.promote}") == 3
    assert "kf.max_shared_bytes = 49152" in text and "gpu.shuffle" in text
    text, plan, _ = lower("layer_norm", (3, 1000), "bf16", TargetInfo.for_target("spirv"), passes=())
    assert plan["vector_lanes"] == 1 and plan["reduction"] == "tree" and "gpu.shuffle" not in text
    text, plan, _ = lower("layer_norm", (3, 1000), "f16", TargetInfo.for_target("spirv"))
    assert plan["vector_lanes"] == 4 and "vector<4xf16>" in text and "vector<8xf16>" not in text


def test_shared_memory_limit_is_respected():
    """A 4096-wide f32 row (16 KiB) fits in CUDA's 48 KiB but not in Vulkan's 16 KiB
    beside the reduction scratch: the plan caches it only on CUDA, and
    kf-promote-shared, given a smaller limit than the plan assumed, leaves it in global
    memory."""
    cuda = lower("softmax", (4, 4096), "f32", TargetInfo.for_target("cuda"))
    spirv = lower("softmax", (4, 4096), "f32", TargetInfo.for_target("spirv"))
    assert cuda[1]["cache_row"] and not spirv[1]["cache_row"]
    assert "memref<4096xf32, #gpu.address_space<workgroup>>" in cuda[0]
    assert "memref<4096xf32, #gpu.address_space<workgroup>>" not in spirv[0]
    ctx, module, kernel, gm = build("softmax", (4, 4096), "f32")
    with ctx, ir.Location.unknown():
        t = TargetInfo.for_target("cuda")
        RowwiseStrategy().emit(kernel, RowwiseStrategy().plan(kernel, t), gm, t)
        registry.create("kf-promote-shared", {"max-shared-bytes": "8192"}).run(module.operation)
        assert "4096xf32, #gpu.address_space<workgroup>" not in str(gm)
        registry.create("kf-promote-shared").run(module.operation)
        assert str(gm).count("gpu.barrier") >= 3 and "4096xf32, #gpu.address_space<workgroup>" in str(gm)
