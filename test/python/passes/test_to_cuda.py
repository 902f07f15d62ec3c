"""kf-to-cuda on hand-written gpu-dialect kernels in the input contract that kf's GPU
mapping will produce: PTX comes out, ptxas assembles it for sm_80 and sm_90, and its
resource report says what the kernel should cost.

The kernel builders here are also what test/python/runtime/test_cuda.py and
bench/device_cuda_smoke.py launch, so the kernels compiled, run and timed are one set.
They need no GPU; the ptxas tests skip (saying why) where ptxas is absent.
"""

from __future__ import annotations

import math
import re

import pytest

# ----------------------------------------------------------------------------- kernels
# Each builder returns (module text, entry name, grid, block, dynamic shared bytes).

_TORCH = {"f32": "float32", "bf16": "bfloat16", "f16": "float16"}


# For f32 the conversions are a multiplication by 1.0, exact (unlike + 0.0, which turns
# -0.0 into +0.0) and folded away by the pipeline's canonicalize; %fone is in every kernel.
def _to_f32(v: str, t: str, out: str) -> str:
    return f"{out} = arith.extf {v} : {t} to f32" if t != "f32" else f"{out} = arith.mulf {v}, %fone : f32"


def _from_f32(v: str, t: str, out: str) -> str:
    return f"{out} = arith.truncf {v} : f32 to {t}" if t != "f32" else f"{out} = arith.mulf {v}, %fone : f32"


def elementwise_kernel(n: int = 1000, elem: str = "f32", block: int = 128):
    """z = 0.5·x·(1 + erf(x/√2)) + tanh(y) · rsqrt(1 + exp(-x)) over n elements, with a
    tail guard (``i < n``) because the grid is rounded up to whole blocks. Exercises
    exp, erf, tanh and rsqrt (libdevice) and f32/bf16/f16 loads and stores."""
    t = elem
    text = f"""
module attributes {{gpu.container_module}} {{
  gpu.module @kf_kernels {{
    gpu.func @ew(%x: memref<{n}x{t}>, %y: memref<{n}x{t}>, %z: memref<{n}x{t}>) kernel
        attributes {{known_block_size = array<i32: {block}, 1, 1>}} {{
      %fone = arith.constant 1.0 : f32
      %bid = gpu.block_id x
      %tid = gpu.thread_id x
      %cb = arith.constant {block} : index
      %base = arith.muli %bid, %cb : index
      %i = arith.addi %base, %tid : index
      %n = arith.constant {n} : index
      %inside = arith.cmpi ult, %i, %n : index
      scf.if %inside {{
        %xv = memref.load %x[%i] : memref<{n}x{t}>
        %yv = memref.load %y[%i] : memref<{n}x{t}>
        {_to_f32("%xv", t, "%xf")}
        {_to_f32("%yv", t, "%yf")}
        %half = arith.constant 0.5 : f32
        %rsqrt2 = arith.constant {1 / math.sqrt(2):.9f} : f32
        %xs = arith.mulf %xf, %rsqrt2 : f32
        %e = math.erf %xs : f32
        %e1 = arith.addf %e, %fone : f32
        %hx = arith.mulf %xf, %half : f32
        %gelu = arith.mulf %hx, %e1 : f32
        %nx = arith.negf %xf : f32
        %ex = math.exp %nx : f32
        %ex1 = arith.addf %ex, %fone : f32
        %rs = math.rsqrt %ex1 : f32
        %th = math.tanh %yf : f32
        %p = arith.mulf %th, %rs : f32
        %r = arith.addf %gelu, %p : f32
        {_from_f32("%r", t, "%rt")}
        memref.store %rt, %z[%i] : memref<{n}x{t}>
      }}
      gpu.return
    }}
  }}
}}
"""
    return text, "ew", ((n + block - 1) // block, 1, 1), (block, 1, 1), 0


def elementwise_reference(x, y):
    import torch

    xf, yf = x.double(), y.double()
    return 0.5 * xf * (1 + torch.erf(xf / math.sqrt(2))) + torch.tanh(yf) * torch.rsqrt(1 + torch.exp(-xf))


def _block_reduce(p: str, value: str, block: int, out: str) -> str:
    """Tree sum of one f32 per thread through workgroup memory %sh; every thread gets the
    total in ``out``. The last barrier keeps %sh from being overwritten while others read it."""
    steps = int(math.log2(block))
    return f"""
      memref.store {value}, %sh[%tid] : memref<{block}xf32, #gpu.address_space<workgroup>>
      gpu.barrier
      %{p}steps = arith.constant {steps} : index
      scf.for %{p}k = %c0 to %{p}steps step %c1 {{
        %{p}k1 = arith.addi %{p}k, %c1 : index
        %{p}h = arith.shrui %cB, %{p}k1 : index
        %{p}act = arith.cmpi ult, %tid, %{p}h : index
        scf.if %{p}act {{
          %{p}o = arith.addi %tid, %{p}h : index
          %{p}a = memref.load %sh[%tid] : memref<{block}xf32, #gpu.address_space<workgroup>>
          %{p}b = memref.load %sh[%{p}o] : memref<{block}xf32, #gpu.address_space<workgroup>>
          %{p}s = arith.addf %{p}a, %{p}b : f32
          memref.store %{p}s, %sh[%tid] : memref<{block}xf32, #gpu.address_space<workgroup>>
        }}
        gpu.barrier
      }}
      {out} = memref.load %sh[%c0] : memref<{block}xf32, #gpu.address_space<workgroup>>
      gpu.barrier"""


def row_stats_kernel(rows: int = 64, cols: int = 1024, elem: str = "f32", block: int = 256):
    """Per row, the mean and the biased variance (torch.var_mean(correction=0)), one block
    per row: two passes over the row (sum, then sum of squared deviations, accumulated in
    f32), each followed by a tree reduction in workgroup memory with gpu.barrier."""
    t = elem
    m = f"memref<{rows}x{cols}x{t}>"
    text = f"""
module attributes {{gpu.container_module}} {{
  gpu.module @kf_kernels {{
    gpu.func @row_stats(%x: {m}, %mean: memref<{rows}x{t}>, %var: memref<{rows}x{t}>)
        workgroup(%sh: memref<{block}xf32, #gpu.address_space<workgroup>>) kernel
        attributes {{known_block_size = array<i32: {block}, 1, 1>}} {{
      %fzero = arith.constant 0.0 : f32
      %fone = arith.constant 1.0 : f32
      %row = gpu.block_id x
      %tid = gpu.thread_id x
      %c0 = arith.constant 0 : index
      %c1 = arith.constant 1 : index
      %cB = arith.constant {block} : index
      %cC = arith.constant {cols} : index
      %inv = arith.constant {1.0 / cols!r} : f32
      %s = scf.for %j = %tid to %cC step %cB iter_args(%acc = %fzero) -> (f32) {{
        %v = memref.load %x[%row, %j] : {m}
        {_to_f32("%v", t, "%vf")}
        %a = arith.addf %acc, %vf : f32
        scf.yield %a : f32
      }}
      {_block_reduce("r1", "%s", block, "%sum")}
      %mu = arith.mulf %sum, %inv : f32
      %q = scf.for %j = %tid to %cC step %cB iter_args(%acc = %fzero) -> (f32) {{
        %v = memref.load %x[%row, %j] : {m}
        {_to_f32("%v", t, "%vf")}
        %d = arith.subf %vf, %mu : f32
        %a = math.fma %d, %d, %acc : f32
        scf.yield %a : f32
      }}
      {_block_reduce("r2", "%q", block, "%sq")}
      %vr = arith.mulf %sq, %inv : f32
      %first = arith.cmpi eq, %tid, %c0 : index
      scf.if %first {{
        {_from_f32("%mu", t, "%mut")}
        {_from_f32("%vr", t, "%vrt")}
        memref.store %mut, %mean[%row] : memref<{rows}x{t}>
        memref.store %vrt, %var[%row] : memref<{rows}x{t}>
      }}
      gpu.return
    }}
  }}
}}
"""
    return text, "row_stats", (rows, 1, 1), (block, 1, 1), 0


def tile_reverse_kernel(tiles: int = 8, tile: int = 16384, block: int = 1024):
    """Reverse each tile of ``tile`` f32 through *dynamic* workgroup memory
    (gpu.dynamic_shared_memory): 64 KiB per block by default, above the 48 KiB that a
    launch gets without cuFuncSetAttribute, so it tests that path of the launcher."""
    n = tiles * tile
    per = tile // block
    ws = "#gpu.address_space<workgroup>"
    text = f"""
module attributes {{gpu.container_module}} {{
  gpu.module @kf_kernels {{
    gpu.func @tile_reverse(%x: memref<{n}xf32>, %y: memref<{n}xf32>) kernel
        attributes {{known_block_size = array<i32: {block}, 1, 1>}} {{
      %raw = gpu.dynamic_shared_memory : memref<?xi8, {ws}>
      %c0 = arith.constant 0 : index
      %c1 = arith.constant 1 : index
      %cB = arith.constant {block} : index
      %cT = arith.constant {tile} : index
      %cT1 = arith.constant {tile - 1} : index
      %cP = arith.constant {per} : index
      %buf = memref.view %raw[%c0][] : memref<?xi8, {ws}> to memref<{tile}xf32, {ws}>
      %bid = gpu.block_id x
      %tid = gpu.thread_id x
      %base = arith.muli %bid, %cT : index
      scf.for %k = %c0 to %cP step %c1 {{
        %kb = arith.muli %k, %cB : index
        %j = arith.addi %kb, %tid : index
        %g = arith.addi %base, %j : index
        %v = memref.load %x[%g] : memref<{n}xf32>
        memref.store %v, %buf[%j] : memref<{tile}xf32, {ws}>
      }}
      gpu.barrier
      scf.for %k = %c0 to %cP step %c1 {{
        %kb = arith.muli %k, %cB : index
        %j = arith.addi %kb, %tid : index
        %rj = arith.subi %cT1, %j : index
        %v = memref.load %buf[%rj] : memref<{tile}xf32, {ws}>
        %g = arith.addi %base, %j : index
        memref.store %v, %y[%g] : memref<{n}xf32>
      }}
      gpu.return
    }}
  }}
}}
"""
    return text, "tile_reverse", (tiles, 1, 1), (block, 1, 1), tile * 4


def axpy_kernel(n: int = 1 << 24, block: int = 256):
    """y_out = 2·x + y over f32, one element per thread: the bandwidth-bound kernel of the
    device smoke run (DESIGN.md measured 3.1 TB/s for this form)."""
    text = f"""
module attributes {{gpu.container_module}} {{
  gpu.module @kf_kernels {{
    gpu.func @axpy(%x: memref<{n}xf32>, %y: memref<{n}xf32>, %z: memref<{n}xf32>) kernel
        attributes {{known_block_size = array<i32: {block}, 1, 1>}} {{
      %bid = gpu.block_id x
      %tid = gpu.thread_id x
      %cb = arith.constant {block} : index
      %base = arith.muli %bid, %cb : index
      %i = arith.addi %base, %tid : index
      %n = arith.constant {n} : index
      %inside = arith.cmpi ult, %i, %n : index
      scf.if %inside {{
        %a = arith.constant 2.0 : f32
        %xv = memref.load %x[%i] : memref<{n}xf32>
        %yv = memref.load %y[%i] : memref<{n}xf32>
        %r = math.fma %a, %xv, %yv : f32
        memref.store %r, %z[%i] : memref<{n}xf32>
      }}
      gpu.return
    }}
  }}
}}
"""
    return text, "axpy", ((n + block - 1) // block, 1, 1), (block, 1, 1), 0


def vector_axpy_kernel(n: int = 1 << 24, block: int = 256, width: int = 4):
    """axpy with one ``vector<4xf32>`` per thread: ``vector.load/store {alignment = 16}``
    is what makes LLVM emit 128-bit ``ld.global.v4`` (without the attribute the vector is
    only element-aligned and splits into four scalar accesses). n must be a multiple of
    block·width, and every buffer 16-byte aligned (torch's allocations are)."""
    assert n % (block * width) == 0
    v = f"vector<{width}xf32>"
    text = f"""
module attributes {{gpu.container_module}} {{
  gpu.module @kf_kernels {{
    gpu.func @vaxpy(%x: memref<{n}xf32>, %y: memref<{n}xf32>, %z: memref<{n}xf32>) kernel
        attributes {{known_block_size = array<i32: {block}, 1, 1>}} {{
      %bid = gpu.block_id x
      %tid = gpu.thread_id x
      %cb = arith.constant {block} : index
      %cw = arith.constant {width} : index
      %base = arith.muli %bid, %cb : index
      %t = arith.addi %base, %tid : index
      %i = arith.muli %t, %cw : index
      %a = arith.constant dense<2.0> : {v}
      %xv = vector.load %x[%i] {{alignment = 16}} : memref<{n}xf32>, {v}
      %yv = vector.load %y[%i] {{alignment = 16}} : memref<{n}xf32>, {v}
      %r = vector.fma %a, %xv, %yv : {v}
      vector.store %r, %z[%i] {{alignment = 16}} : memref<{n}xf32>, {v}
      gpu.return
    }}
  }}
}}
"""
    return text, "vaxpy", (n // (block * width), 1, 1), (block, 1, 1), 0


def empty_kernel():
    """A kernel with one pointer argument and no work: launch overhead alone."""
    text = """
module attributes {gpu.container_module} {
  gpu.module @kf_kernels {
    gpu.func @nop(%x: memref<1xf32>) kernel {
      gpu.return
    }
  }
}
"""
    return text, "nop", (1, 1, 1), (32, 1, 1), 0


# ----------------------------------------------------------------------------- tests

from kf.passes import to_cuda  # noqa: E402  (the builders above need no MLIR)

needs_ptxas = pytest.mark.skipif(to_cuda.ptxas_path() is None, reason="ptxas not found (no CUDA toolkit here)")


def _ptx(builder, chip="sm_90", **kw):
    text, entry, *_ = builder(**kw)
    ptx = to_cuda.compile_to_ptx(text, chip=chip)
    assert list(ptx) == ["kf_kernels"]
    return ptx["kf_kernels"], entry


@pytest.mark.parametrize("elem", ["f32", "bf16", "f16"])
def test_elementwise_ptx(elem):
    ptx, entry = _ptx(elementwise_kernel, elem=elem)
    assert f".visible .entry {entry}(" in ptx
    # bare pointers: one .u64 parameter per memref
    assert len(re.findall(r"\.param \.u64 \.ptr", ptx)) == 3
    assert ".extern" not in ptx, "libdevice was not linked: a math call is left unresolved"
    assert "__nv_" not in ptx
    width = "b32" if elem == "f32" else "b16"
    assert f"ld.global.{width}" in ptx and f"st.global.{width}" in ptx
    assert "setp" in ptx  # the tail guard
    assert ".reqntid 128" in ptx or ".maxntid 128" in ptx


@pytest.mark.parametrize("cols", [257, 1024])
@pytest.mark.parametrize("elem", ["f32", "bf16"])
def test_row_stats_ptx(elem, cols):
    ptx, entry = _ptx(row_stats_kernel, cols=cols, elem=elem)
    assert "bar.sync" in ptx
    assert re.search(r"\.shared \.align \d+ \.b8 \w+\[1024\]", ptx), "256 f32 of workgroup memory"
    assert "ld.shared" in ptx and "st.shared" in ptx


def test_dynamic_shared_ptx():
    ptx, _ = _ptx(tile_reverse_kernel)
    assert re.search(r"\.extern \.shared \.align \d+ \.b8 \w+\[\]", ptx)


def test_vector_loads_are_128_bit():
    ptx, _ = _ptx(vector_axpy_kernel, n=4096)
    assert ptx.count("ld.global.v4.b32") == 2 and ptx.count("st.global.v4.b32") == 1


def test_vector_transfer_and_bf16_math():
    """vector.transfer_read/write lower (convert-vector-to-llvm runs after
    convert-gpu-to-nvvm), and math on bf16 vectors is computed through f32 libdevice."""
    text = """
module attributes {gpu.container_module} {
  gpu.module @kf_kernels {
    gpu.func @t(%h: memref<1024xbf16>, %g: memref<1024xbf16>) kernel {
      %tid = gpu.thread_id x
      %c4 = arith.constant 4 : index
      %i = arith.muli %tid, %c4 : index
      %c0 = arith.constant 0.0 : bf16
      %v = vector.transfer_read %h[%i], %c0 {in_bounds = [true]} : memref<1024xbf16>, vector<4xbf16>
      %e = math.tanh %v : vector<4xbf16>
      vector.transfer_write %e, %g[%i] {in_bounds = [true]} : vector<4xbf16>, memref<1024xbf16>
      gpu.return
    }
  }
}"""
    ptx = to_cuda.compile_to_ptx(text)["kf_kernels"]
    assert ptx.count("ld.global.b16") == 4 and ptx.count("st.global.b16") == 4
    assert ".extern .func" not in ptx and "cvt.f32.bf16" in ptx


def test_ftz_selects_libdevice_ftz_paths():
    text, *_ = elementwise_kernel()
    exact = to_cuda.compile_to_ptx(text)["kf_kernels"]
    ftz = to_cuda.compile_to_ptx(text, ftz=True)["kf_kernels"]
    assert ftz.count(".ftz") > exact.count(".ftz")


def test_pass_textual_options():
    p = to_cuda.ToCudaPass.from_options({"chip": "sm_80", "index-bitwidth": "32", "ftz": "true"})
    assert p.chip == "sm_80" and p.index_bitwidth == 32 and p.ftz
    assert p.textual() == "kf-to-cuda{chip=sm_80 ftz=true index-bitwidth=32}"
    assert "index-bitwidth=32" in p.upstream_pipeline()


def test_registered():
    from kf.passes import registry

    assert registry.pass_class("kf-to-cuda") is to_cuda.ToCudaPass


def test_dynamic_shape_is_refused():
    text = """
module attributes {gpu.container_module} {
  gpu.module @kf_kernels {
    gpu.func @k(%x: memref<?xf32>) kernel { gpu.return }
  }
}"""
    with pytest.raises(to_cuda.CudaCompileError) as e:
        to_cuda.compile_to_ptx(text)
    assert "static shape" in str(e.value) and "kf-opt --pass-pipeline" in str(e.value)


def test_no_gpu_module_is_refused():
    with pytest.raises(to_cuda.CudaCompileError, match="no gpu.module"):
        to_cuda.compile_to_ptx("module {}")


def test_parse_ptxas_report():
    log = """ptxas info    : 0 bytes gmem
ptxas info    : Compiling entry function 'k' for 'sm_90'
ptxas info    : Function properties for k
    16 bytes stack frame, 8 bytes spill stores, 4 bytes spill loads
ptxas info    : Used 40 registers, used 1 barriers, 1024 bytes smem, 368 bytes cmem[0]
"""
    assert to_cuda.parse_ptxas_report(log) == {"k": dict(
        registers=40, shared_bytes=1024, stack_bytes=16, spill_store_bytes=8, spill_load_bytes=4, barriers=1,
        cmem_bytes=368)}


@needs_ptxas
@pytest.mark.parametrize("chip", ["sm_80", "sm_90"])
@pytest.mark.parametrize("elem", ["f32", "bf16"])
def test_elementwise_ptxas(chip, elem):
    ptx, entry = _ptx(elementwise_kernel, chip=chip, elem=elem)
    a = to_cuda.assemble(ptx, chip)
    r = a.kernels[entry]
    assert a.cubin[:4] == b"\x7fELF"
    assert 0 < r["registers"] <= 64
    assert r["shared_bytes"] == 0 and r["barriers"] == 0
    assert r["stack_bytes"] == 0 and r["spill_store_bytes"] == 0 and r["spill_load_bytes"] == 0


@needs_ptxas
@pytest.mark.parametrize("chip", ["sm_80", "sm_90"])
@pytest.mark.parametrize("cols", [257, 1024])
@pytest.mark.parametrize("elem", ["f32", "bf16"])
def test_row_stats_ptxas(chip, elem, cols):
    ptx, entry = _ptx(row_stats_kernel, chip=chip, cols=cols, elem=elem)
    r = to_cuda.assemble(ptx, chip).kernels[entry]
    assert r["shared_bytes"] == 256 * 4
    assert r["barriers"] == 1
    assert r["stack_bytes"] == 0 and r["spill_store_bytes"] == 0
    assert 0 < r["registers"] <= 64


@needs_ptxas
def test_vector_axpy_ptxas():
    ptx, entry = _ptx(vector_axpy_kernel)
    r = to_cuda.assemble(ptx, "sm_90").kernels[entry]
    assert r["stack_bytes"] == 0 and r["spill_store_bytes"] == 0 and 0 < r["registers"] <= 32


@needs_ptxas
def test_dynamic_shared_ptxas():
    ptx, entry = _ptx(tile_reverse_kernel)
    r = to_cuda.assemble(ptx, "sm_90").kernels[entry]
    # dynamic shared memory is sized at launch, not by ptxas (kf-to-cuda makes it extern)
    assert r["shared_bytes"] == 0
    assert r["barriers"] == 1


@needs_ptxas
def test_ptxas_rejection_names_the_command():
    with pytest.raises(to_cuda.CudaCompileError) as e:
        to_cuda.assemble(".version 7.8\n.target sm_90\n.address_size 64\n.visible .entry k() { bogus; }\n")
    msg = str(e.value)
    assert "ptxas rejected" in msg and "ptxas" in msg and ".ptx" in msg


@needs_ptxas
def test_integer_abs_in_a_checked_index_assembles():
    """math.absi in a kernel a strategy wrote (a generic kernel whose indices, |i - 4|, are
    checked): kf-to-cuda expands it to arith (NVVM has no lowering of its own)."""
    import torch

    import kf

    x = torch.randn(7, 5)
    assert ".entry" in kf.inspect(kf.jit(lambda x: x[(torch.arange(9) - 4).abs()], target="cuda", arch="sm_90a"),
                                  x).ptx
