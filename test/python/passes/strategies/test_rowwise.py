"""The rowwise strategy end to end (passes/strategies/rowwise/), on the kernel functions
of rowwise_kernels.py, under each variant of MODES:

- compiled by kf-to-spirv and run on Vulkan (lavapipe here) against torch on fresh
  random inputs (rows of 1024, 1000 and 257: full vectors, vectors only, scalar tails);
- compiled by kf-to-cuda and assembled by ptxas for sm_80 and sm_90, checking the PTX
  has 128-bit global accesses and that ptxas reports no spills.

``python test/python/passes/strategies/test_rowwise.py`` prints the ptxas report of
every kernel (``--bench``: times on a CUDA GPU).
"""

from __future__ import annotations

import re

import pytest
import torch
from mlir import ir
from rowwise_kernels import (CASES, EPS, MODES, TOL, cuda_kernel, inputs_for, kernel_of, needs_cuda, needs_ptxas,
                             needs_vulkan, ptx_for, reference, run_kernel, run_vulkan)

from kf.dialects import builders as kb
from kf.passes import registry
from kf.passes.strategies.base import TargetInfo
from kf.passes.strategies.rowwise import RowwiseStrategy


@pytest.fixture(params=list(MODES))
def mode(request):
    """The name of a variant of MODES."""
    return request.param


@pytest.mark.parametrize("elem", ["f32", "f16", "bf16"])
@pytest.mark.parametrize("shape,name", CASES, ids=[f"{n}-{'x'.join(map(str, s))}" for s, n in CASES])
def test_vulkan_matches_torch(shape, name, elem, mode):
    needs_vulkan()
    outs, want, plan, _ = run_vulkan(name, shape, elem, seed=hash((name, shape, elem)) % 2 ** 31, variant=MODES[mode])
    if mode == "loop":
        assert plan["mode"] == "loop"
    for o, w in zip(outs, want):
        assert not o.isnan().any(), "an element was not written"
        torch.testing.assert_close(o.float(), w.float(), rtol=TOL[elem], atol=TOL[elem])


CUDA_CASES = [((1, 256, 1024), "layer_norm"), ((3, 1000), "layer_norm"), ((7, 257), "layer_norm"),
              ((3, 4096), "layer_norm"), ((5, 1024), "softmax"), ((4, 4096), "softmax"), ((5, 1024), "log_softmax"),
              ((8, 4096), "rms_norm"), ((7, 257), "rms_norm"), ((2, 3, 1000), "stats")]


@pytest.mark.parametrize("chip", ["sm_80", "sm_90"])
@pytest.mark.parametrize("elem", ["f32", "f16", "bf16"])
@pytest.mark.parametrize("shape,name", CUDA_CASES, ids=[f"{n}-{'x'.join(map(str, s))}" for s, n in CUDA_CASES])
def test_cuda_ptxas(shape, name, elem, chip, mode):
    """PTX for sm_80/sm_90: 128-bit global loads where rows allow them, warp shuffles,
    and no spills."""
    needs_ptxas()
    if chip == "sm_80" and mode != "default":
        pytest.skip("the variants are checked on sm_90 (the H200's)")
    from kf.passes.to_cuda import assemble

    ptx, plan = ptx_for(name, shape, elem, chip, variant=MODES[mode])
    report = assemble(ptx, chip).kernels[name]
    assert report["spill_store_bytes"] == 0 and report["spill_load_bytes"] == 0, report
    assert "shfl.sync.bfly" in ptx
    if shape[-1] % 8 == 0:
        assert "ld.global.v4" in ptx, "rows of a multiple of 8 elements load 128 bits at a time"
        assert "st.global.v4" in ptx or (name == "stats" and "st.global" in ptx)
    if plan["cache_row"]:
        assert "st.shared" in ptx and report["shared_bytes"] >= shape[-1] * (4 if elem == "f32" else 2)


@pytest.mark.parametrize("elem", ["f32", "f16", "bf16"])
@pytest.mark.parametrize("shape,name", CASES, ids=[f"{n}-{'x'.join(map(str, s))}" for s, n in CASES])
def test_cuda_matches_torch(shape, name, elem, mode):
    """On a CUDA device: the same kernels launched through runtime/cuda.py."""
    needs_cuda()
    k, plan = cuda_kernel(name, shape, elem, variant=MODES[mode])
    args = [a.cuda() for a in inputs_for(name, shape, elem, hash((name, shape, elem)) % 2 ** 31)]
    want = reference(name, args, elem)
    outs = [torch.full_like(w, float("nan")) for w in want]
    k(*args, *outs)
    torch.cuda.synchronize()
    for o, w in zip(outs, want):
        assert not o.isnan().any(), "an element was not written"
        torch.testing.assert_close(o.float(), w.float(), rtol=TOL[elem], atol=TOL[elem])


TORCH_OPS = {
    "layer_norm": lambda x, w, b: torch.nn.functional.layer_norm(x, x.shape[-1:], w, b, EPS),
    "softmax": lambda x: torch.softmax(x, -1),
    "log_softmax": lambda x: torch.log_softmax(x, -1),
    "rms_norm": lambda x, w: torch.nn.functional.rms_norm(x, x.shape[-1:], w, EPS),
}


def bench(shapes=((8192, 4096), (4096, 1000), (1, 256, 1024)), elems=("f32", "bf16")):
    """CUDA-event times of each kernel with and without kf-promote-shared / kf-vectorize,
    against torch's own op (median of 50 launches after 5 warm-ups)."""
    import statistics

    def ms(fn):
        for _ in range(5):
            fn()
        ev = [(torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)) for _ in range(50)]
        for s, e in ev:
            s.record()
            fn()
            e.record()
        torch.cuda.synchronize()
        return statistics.median(s.elapsed_time(e) for s, e in ev)

    variants = {"scalar": (), "promote": ("kf-promote-shared",), "vectorize": ("kf-vectorize",),
                "both": ("kf-promote-shared", "kf-vectorize")}
    print(f"{'kernel':12s} {'shape':12s} {'elem':5s} " + " ".join(f"{v:>16s}" for v in variants)
          + f" {'torch':>16s}   (µs, GB/s of one read and one write)")
    for name in TORCH_OPS:
        for shape in shapes:
            for elem in elems:
                args = [a.cuda() for a in inputs_for(name, shape, elem, 1)]
                out = torch.empty_like(args[0])
                nbytes = 2 * args[0].numel() * args[0].element_size()
                cells = []
                for v, passes in variants.items():
                    k, _ = cuda_kernel(name, shape, elem, passes)
                    t = ms(lambda: k(*args, out))
                    cells.append(f"{t * 1e3:7.1f} {nbytes / t / 1e6:6.0f}")
                want = reference(name, [a.cpu() for a in args], elem)[0]
                err = (out.cpu().double() - want.double()).abs().max().item()
                t = ms(lambda: TORCH_OPS[name](*args))
                cells.append(f"{t * 1e3:7.1f} {nbytes / t / 1e6:6.0f}")
                print(f"{name:12s} {'x'.join(map(str, shape)):12s} {elem:5s} " + " ".join(f"{c:>16s}" for c in cells)
                      + f"   max err {err:.1e}")


def ptxas_report():
    """Registers, spills and shared memory of every CUDA case (python test_rowwise.py)."""
    from kf.passes.to_cuda import assemble

    for shape, name in CUDA_CASES:
        for elem in ("f32", "f16", "bf16"):
            for chip in ("sm_80", "sm_90"):
                ptx, plan = ptx_for(name, shape, elem, chip)
                r = assemble(ptx, chip).kernels[name]
                print(f"{name:12s} {'x'.join(map(str, shape)):10s} {elem:5s} {chip}: {r['registers']:3d} regs, "
                      f"{r['spill_store_bytes']}/{r['spill_load_bytes']} B spill st/ld, {r['shared_bytes']:6d} B smem, "
                      f"threads {plan['threads']}, lanes {plan['vector_lanes']}, "
                      f"v4 loads {len(re.findall(r'ld[.]global[.]v4', ptx))}, cached {plan['cached_inputs']}")


def test_variance_is_two_pass():
    """Rows with |mean| / std = 1e4: E[x²] - E[x]² in f32 loses every digit of the
    variance (x² ~ 1e8, its f32 ulp ~ 8); the two-pass variance keeps them."""
    needs_vulkan()
    gen = torch.Generator().manual_seed(3)
    x = 1e4 + torch.randn(6, 1000, generator=gen, dtype=torch.float64)
    [v], _ = run_kernel(lambda a: [kb.var(a, dims=[-1], keepdim=False, correction=1.0)], [((6, 1000), "f32")],
                         [x.float()])
    torch.testing.assert_close(v.double(), x.float().double().var(-1), rtol=1e-3, atol=0)


def test_short_rows_and_several_trailing_dims():
    """Rows of 20 (threads with empty slices: the reductions see neutral partials) and a
    reduction over the last two dims (rows of 6 x 50 = 300, not vectorized: the column
    index is not the loop index), with a per-row input of shape [..., 1]."""
    needs_vulkan()
    gen = torch.Generator().manual_seed(4)
    x, s = torch.randn(5, 20, generator=gen), torch.rand(5, 1, generator=gen) + 0.5
    [y], plan = run_kernel(lambda a, b: [kb.mul(kb.softmax(a, dim=-1), b)], [((5, 20), "f32"), ((5, 1), "f32")],
                            [x, s])
    assert plan["threads"] == 32
    torch.testing.assert_close(y, torch.softmax(x, -1) * s)
    x = torch.randn(3, 6, 50, generator=gen)
    [y, m], plan = run_kernel(lambda a: [kb.sub(a, kb.reduce_max(a, dims=[-2, -1], keepdim=True)),
                                          kb.reduce_min(a, dims=[-2, -1], keepdim=False)],
                               [((3, 6, 50), "f32")], [x])
    assert plan["vector_lanes"] == 1 and not plan["cache_row"]
    torch.testing.assert_close(y, x - x.amax((-2, -1), keepdim=True))
    torch.testing.assert_close(m, x.amin((-2, -1)))


def test_per_row_values_without_keepdim():
    """keepdim=False results combined with each other and with per-row inputs and
    scalars of any rank stay per-row outputs: (max - min) * scale[row] + 1."""
    needs_vulkan()
    gen = torch.Generator().manual_seed(5)
    x, s = torch.randn(4, 300, generator=gen), torch.rand(4, generator=gen)
    [y], _ = run_kernel(lambda a, b: [kb.add(kb.mul(kb.sub(kb.reduce_max(a, dims=[-1]), kb.reduce_min(a, dims=[-1])),
                                                     b), kb.fill((1, 1), "f32", 1.0))],
                         [((4, 300), "f32"), ((4,), "f32")], [x, s])
    torch.testing.assert_close(y, ((x.amax(-1) - x.amin(-1)) * s + 1).view(1, 4))


def _masked_softmax_backward(s, keep, g):
    """The softmax backward of the GPT attention with its bool mask argument (kf-fuse makes
    the mask == 0 compare a kernel of its own, so the rowwise kernel takes an i1 tensor)."""
    p = kb.softmax(kb.masked_fill(s, keep, value=-1e9), dim=-1)
    return [kb.mul(p, kb.sub(g, kb.sum(kb.mul(g, p), dims=[-1], keepdim=True)))]


BOOL_SPECS = [((2, 3, 128, 128), "f32"), ((128, 128), "i1"), ((2, 3, 128, 128), "f32")]


def test_bool_arguments_are_bytes_on_cuda():
    """A regression: the rowwise kernel took i1 memrefs on CUDA, whose 16-lane vector loads
    read 16 bits where torch.bool has 16 bytes (the GPT's attention gradients were off by
    84% on the H200). Booleans are i8 on CUDA like in every other strategy; SPIR-V keeps
    i1 (kf-to-spirv stores it as bytes itself)."""
    for target, want in (("cuda", "memref<128x128xi8>"), ("spirv", "memref<128x128xi1>")):
        ctx, module, kernel, gm = kernel_of(_masked_softmax_backward, BOOL_SPECS)
        with ctx, ir.Location.unknown():
            t = TargetInfo.for_target(target)
            s = RowwiseStrategy()
            s.emit(kernel, s.plan(kernel, t), gm, t)
            for p in ("kf-promote-shared", "kf-vectorize"):
                registry.create(p).run(module.operation)
            text = str(gm)
        assert want in text.split("gpu.func @k(")[1].split(")")[0]
        if target == "cuda":
            # bytes, never bits: the loop kernel loads 16 of them at a time, the registers
            # mode (the default for a mask this narrow) one at a time
            assert "memref<128x128xi8>, vector<16xi8>" in text or "memref.load %arg1[%4, %8] : memref<128x128xi8>" \
                in text or re.search(r"memref<128x128xi8>, vector<\d+xi8>", text)
            assert not re.search(r"memref<[0-9x]*xi1>, vector<", text) and ": memref<128x128xi1>" not in text


def _bool_mask_inputs(seed):
    gen = torch.Generator().manual_seed(seed)
    s, g = torch.randn(2, 3, 128, 128, generator=gen), torch.randn(2, 3, 128, 128, generator=gen)
    keep = torch.tril(torch.ones(128, 128, dtype=torch.bool)).logical_not()  # True = masked
    p = torch.softmax(s.masked_fill(keep, -1e9), -1)
    return [s, keep, g], p * (g - (g * p).sum(-1, keepdim=True))


def test_bool_argument_vulkan():
    needs_vulkan()
    args, want = _bool_mask_inputs(3)
    (out,), _ = run_kernel(_masked_softmax_backward, BOOL_SPECS, args)
    torch.testing.assert_close(out, want, rtol=1e-5, atol=1e-5)


def test_bool_argument_cuda():
    needs_cuda()
    from kf.passes import to_cuda
    from kf.runtime import cuda as kcuda

    ctx, module, kernel, gm = kernel_of(_masked_softmax_backward, BOOL_SPECS)
    with ctx, ir.Location.unknown():
        t = TargetInfo.for_target("cuda")
        s = RowwiseStrategy()
        emitted = s.emit(kernel, s.plan(kernel, t), gm, t)
        for p in ("kf-promote-shared", "kf-vectorize"):
            registry.create(p).run(module.operation)
        text = "module attributes {gpu.container_module} {\n" + str(gm) + "\n}\n"
    ptx = to_cuda.compile_to_ptx(text)["kf_kernels"]
    args, want = _bool_mask_inputs(4)
    out = torch.full(want.shape, float("nan"), device="cuda")
    k = kcuda.CudaKernel(kcuda.CudaModule(ptx), emitted.name, emitted.grid, emitted.block, 0, 4)
    k(*[a.cuda() for a in args], out)
    torch.cuda.synchronize()
    torch.testing.assert_close(out.cpu(), want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_softmax_over_a_row_of_one(dtype):
    """A regression: softmax over [.., 1] (the MoE's top-1 gate) stores its output after
    the sum's loop, where the exp memoized inside that loop did not dominate
    (kf-map-to-gpu failed); on Vulkan here, and assembled by ptxas for sm_90a."""
    import kf

    def softmax(x):
        return torch.softmax(x, dim=-1)

    x = torch.randn(37, 1, dtype=dtype)
    assert "ld.global" in kf.inspect(kf.jit(softmax, target="cuda", arch="sm_90a"), x).ptx
    needs_vulkan()
    torch.testing.assert_close(kf.jit(softmax, target="vulkan")(x), torch.softmax(x.float(), -1).to(dtype))


if __name__ == "__main__":
    import sys

    bench() if "--bench" in sys.argv else ptxas_report()


@pytest.mark.parametrize("shape", [(1,), (50,), (257,), (7, 33), (0, 5)])
def test_float64_statistics_of_float32_inputs(shape):
    """softmax(x, dtype=torch.float64) of float32 rows: the kernel casts its input up, and
    its row statistics (f64) fit the workgroup scratch, which is sized for the widest
    statistic, not only for the inputs."""
    import kf

    needs_vulkan()
    fn = lambda x: torch.softmax(x, -1, dtype=torch.float64)  # noqa: E731
    x = torch.randn(shape, generator=torch.Generator().manual_seed(5)) * 10
    if len(shape) == 2:
        x = x.t().contiguous().t()  # non-contiguous
    got, want = kf.jit(fn, target="vulkan")(x), fn(x)
    assert got.dtype == torch.float64
    torch.testing.assert_close(got, want, rtol=1e-13, atol=1e-13)
