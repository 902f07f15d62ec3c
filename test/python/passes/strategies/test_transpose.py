"""The transpose strategy (passes/strategies/transpose.py) through kf-tile and
kf-map-to-gpu: bit for bit against torch on every back end present (gpu_harness.py), and
its tile in workgroup memory in the PTX and the gpu dialect."""


from __future__ import annotations

import shutil

import pytest
import torch
from kf.dialects import TensorSpec
from kf.dialects import builders as kb

from gpu_harness import TORCH, build_module, check_fp8, gpu_func, skip_spirv



TRANSPOSES = [((3, 70, 130), "bf16", "f8E4M3FN"), ((64, 128), "f32", "f32"), ((2, 2, 129, 64), "f16", "bf16"),
              ((1, 5, 200), "f32", "f16")]


def _swap_last_two(x):
    r = len(x.type.shape)
    return kb.transpose(x, perm=list(range(r - 2)) + [r - 1, r - 2])


@pytest.mark.parametrize("shape,elem,out", TRANSPOSES, ids=str)
def test_transpose_kernel_matches_torch(run, shape, elem, out):
    """x^T * s cast to out, fresh random values, shapes that are not multiples of the
    tile included (the guarded edges); the tiled kernel on CUDA (64x64) and on Vulkan
    (32x32). Bit for bit: both compute x * s in f32, rounded once."""
    if out.startswith("f8"):
        skip_spirv(run)
    x, s = (torch.randn(*shape) * 3).to(TORCH[elem]), torch.tensor(1.7)
    (got,) = run(lambda a, c: kb.cast(kb.mul(kb.cast(_swap_last_two(a), "f32"), c), out), x, s, kind="transpose")
    want = (x.float().transpose(-1, -2) * s).to(TORCH[out])
    if out.startswith("f8"):
        check_fp8(got, want)
    else:
        torch.testing.assert_close(got, want, rtol=0, atol=0)


def test_transpose_kernel_goes_through_workgroup_memory():
    """On CUDA the tile: coalesced global loads and stores (pairs: the input is bf16 and
    both dims even), one barrier, the rank-0 scale loaded once, e4m3 by cvt; ptxas: no
    spills, the 64x65 f32 tile. On SPIR-V (16 KiB guaranteed) a 32x33 tile."""
    from kf.passes.to_cuda import assemble, compile_to_ptx

    def build(a, c):
        return kb.cast(kb.mul(kb.cast(_swap_last_two(a), "f32"), c), "f8E4M3FN")

    specs = [TensorSpec((4, 300, 128), "bf16"), TensorSpec((), "f32")]
    ctx, module = build_module(build, specs, "transpose", target="cuda")
    with ctx:
        ptx = compile_to_ptx(module, chip="sm_90")["kf_kernels"]
    assert "bar.sync" in ptx and ptx.count("ld.global.b32") == 1, ptx.count("ld.global.b32")
    assert ptx.count("ld.shared.b32") == 16 and ptx.count("cvt.rn.satfinite.e4m3x2.f32") == 16
    # bf16 pairs in (4 bytes), e4m3 pairs out (2 bytes): 8 passes each way
    assert ptx.count("ld.global.v2.b16") == 8 and ptx.count("st.global.v2.b8") == 8
    if shutil.which("ptxas"):
        [r] = assemble(ptx, "sm_90").kernels.values()
        assert r["spill_store_bytes"] == 0 and r["shared_bytes"] == 64 * 65 * 4, r
    ctx, module = build_module(build, [TensorSpec((4, 300, 128), "f32"), specs[1]], "transpose")
    with ctx:  # SPIR-V: the 32x33 tile (4.2 KiB of Vulkan's 16 guaranteed)
        text = str(gpu_func(module))
        assert "memref<32x33xf32, #gpu.address_space<workgroup>>" in text and "gpu.barrier" in text


@pytest.mark.parametrize("shape", [(2, 100, 72), (128, 64)], ids=str)
def test_transpose_kernel_with_a_chain_before(run, shape):
    """An elementwise chain of the input before the transpose (the caller's fp8 V
    widened, scaled, and stored K-major as E4M3FN): the tile holds the input, the chain
    runs at the output index; bit for bit."""
    skip_spirv(run)
    x = (torch.randn(*shape) * 40).to(torch.float8_e4m3fn)
    s = torch.tensor(0.5)
    (got,) = run(lambda a, c: kb.cast(_swap_last_two(kb.mul(kb.cast(a, "f32"), c)), "f8E4M3FN"), x, s,
                 kind="transpose")
    check_fp8(got, (x.float() * s).transpose(-1, -2).to(torch.float8_e4m3fn))
