"""Metal: kf-to-metal's MSL for the hand-written kernels (vulkan_kernels.py) here, the
Metal launcher's refusal off macOS, and its run on a Mac (runtime/metal.py).
"""

from __future__ import annotations

import re
import sys

import pytest
import torch

from kf.passes.base import PassError
from kf.runtime.abi import KernelABI

from vulkan_kernels import compile_one, elementwise_kernel, needs_spirv_cross, row_stats_kernel, select_kernel


@needs_spirv_cross
def test_msl_for_row_stats():
    from kf.passes.to_metal import compile_metal

    kernels = compile_metal(row_stats_kernel(4, 257, "f32", 256))
    k = kernels["row_stats"]
    assert k.function == "row_stats" and k.threadgroup_size == (256, 1, 1)
    assert k.buffers == (0, 1, 2, 3)
    assert re.search(r"threadgroup float \w+\[256\];", k.source), k.source  # plain arrays, not structs
    assert "threadgroup_barrier(mem_flags::mem_threadgroup)" in k.source
    assert "[[buffer(0)]]" in k.source


@needs_spirv_cross
def test_msl_cli_and_library_agree():
    """The ctypes path through libspirv-cross-c-shared prints what the CLI prints."""
    from kf.passes.to_metal import spirv_to_msl

    binary, _ = compile_one(row_stats_kernel(4, 257, "f32", 256))
    try:
        lib = spirv_to_msl(binary, "row_stats", via="library")
    except PassError as e:
        pytest.skip(str(e))
    assert lib == spirv_to_msl(binary, "row_stats", via="cli")


@needs_spirv_cross
def test_msl_types():
    from kf.passes.to_metal import compile_metal

    assert "half" in compile_metal(elementwise_kernel(64, "f16", 64))["ew"].source
    assert "ushort" in compile_metal(elementwise_kernel(64, "bf16", 64))["ew"].source
    assert "uchar" in compile_metal(select_kernel(64, 64))["sel"].source
    # an argument the kernel never touches has no [[buffer]]; the others keep index = argument
    unused = elementwise_kernel(64, "f32", 64).replace("%y = memref.load %b[%i]", "%y = memref.load %a[%i]")
    assert compile_metal(unused)["ew"].buffers == (0, 2)


def test_metal_launcher_refuses_off_macos():
    from kf.runtime import metal

    if metal.is_available():
        pytest.skip("this machine has Metal: the refusal path is not reachable")
    with pytest.raises(metal.MetalUnavailable, match="macOS"):
        metal.launch("kernel void k() {}", KernelABI("k", ()), [])


@pytest.mark.skipif(sys.platform != "darwin", reason="Metal runs only on macOS (torch.mps); codegen is tested above")
def test_metal_row_stats_on_mps():
    from kf.passes.to_metal import compile_metal
    from kf.runtime import metal

    if not metal.is_available():
        pytest.skip("torch.mps is not available")
    rows, cols = 6, 257
    k = compile_metal(row_stats_kernel(rows, cols, "f32", 256))["row_stats"]
    abi = KernelABI("row_stats", (0, 1, 2, 3), grid=(rows, 1, 1), block=(256, 1, 1), extra=k.abi_extra())
    x = torch.randn(rows, cols, device="mps")
    s, m, v = (torch.empty(rows, device="mps") for _ in range(3))
    metal.launch(k.source, abi, [x, s, m, v])
    torch.testing.assert_close(m.cpu(), x.cpu().mean(1), rtol=1e-4, atol=1e-5)



@needs_spirv_cross
def test_a_kernel_past_the_buffer_table_is_refused(monkeypatch):
    """A kernel of more buffers than Metal's argument table holds (31) is a compile error
    naming it (kf-fuse never makes one: its MAX_BUFFERS is lifted here to make it); at
    the cap, the MSL of the same sum is two kernels."""
    import kf
    from kf.passes import fuse

    def total(*xs):
        out = xs[0]
        for x in xs[1:]:
            out = out + x
        return out

    xs = [torch.randn(5) for _ in range(33)]
    with monkeypatch.context() as m:
        m.setattr(fuse, "MAX_BUFFERS", 10 ** 6)
        with pytest.raises(Exception, match="binds 34 buffers; a Metal kernel's buffer argument table has 31"):
            kf.inspect(kf.metal_shader(total), *xs).stages["msl"]
    assert kf.inspect(kf.metal_shader(total), *xs).stages["msl"].count("kernel void") == 2
