"""Hand-written gpu-dialect kernels -- the input contract of kf-to-spirv and kf-to-metal --
and the ways the runtime's tests compile them and make their inputs."""

from __future__ import annotations

import shutil

import pytest
import torch

from kf.passes.to_spirv import compile_spirv
from kf.runtime import vulkan
from kf.runtime.abi import KernelABI

needs_vulkan = pytest.mark.skipif(not vulkan.is_available(), reason="no Vulkan device (install mesa-vulkan-drivers)")
needs_spirv_val = pytest.mark.skipif(shutil.which("spirv-val") is None, reason="spirv-val not installed")
needs_spirv_cross = pytest.mark.skipif(shutil.which("spirv-cross") is None, reason="spirv-cross not installed")

TORCH = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16, "i32": torch.int32,
         "i64": torch.int64, "i1": torch.bool}


# ---- hand-written kernels --------------------------------------------------------------

def elementwise_kernel(n: int, elem: str, block: int) -> str:
    """z = x * y + exp(x) (floats) or x * y + x (integers), one element per thread, with the
    tail guard i < n that a grid of ceil(n / block) workgroups needs."""
    t = f"memref<{n}x{elem}>"
    if elem in ("f32", "f16", "bf16"):
        body = f"""%p = arith.mulf %x, %y : {elem}
        %e = math.exp %x : {elem}
        %z = arith.addf %p, %e : {elem}"""
    else:
        body = f"""%p = arith.muli %x, %y : {elem}
        %z = arith.addi %p, %x : {elem}"""
    return f"""
module attributes {{gpu.container_module}} {{
  gpu.module @kf_kernels {{
    gpu.func @ew(%a: {t}, %b: {t}, %c: {t}) kernel attributes {{known_block_size = array<i32: {block}, 1, 1>}} {{
      %tid = gpu.thread_id x
      %bid = gpu.block_id x
      %bdim = gpu.block_dim x
      %base = arith.muli %bid, %bdim : index
      %i = arith.addi %base, %tid : index
      %n = arith.constant {n} : index
      %in = arith.cmpi ult, %i, %n : index
      scf.if %in {{
        %x = memref.load %a[%i] : {t}
        %y = memref.load %b[%i] : {t}
        {body}
        memref.store %z, %c[%i] : {t}
      }}
      gpu.return
    }}
  }}
}}
"""


def select_kernel(n: int, block: int) -> str:
    """i1 buffers both ways: z = m ? x : y and g = x > y."""
    f, b = f"memref<{n}xf32>", f"memref<{n}xi1>"
    return f"""
module attributes {{gpu.container_module}} {{
  gpu.module @kf_kernels {{
    gpu.func @sel(%m: {b}, %a: {f}, %b: {f}, %c: {f}, %g: {b}) kernel attributes {{known_block_size = array<i32: {block}, 1, 1>}} {{
      %tid = gpu.thread_id x
      %bid = gpu.block_id x
      %bdim = gpu.block_dim x
      %base = arith.muli %bid, %bdim : index
      %i = arith.addi %base, %tid : index
      %n = arith.constant {n} : index
      %in = arith.cmpi ult, %i, %n : index
      scf.if %in {{
        %k = memref.load %m[%i] : {b}
        %x = memref.load %a[%i] : {f}
        %y = memref.load %b[%i] : {f}
        %z = arith.select %k, %x, %y : f32
        memref.store %z, %c[%i] : {f}
        %gt = arith.cmpf ogt, %x, %y : f32
        memref.store %gt, %g[%i] : {b}
      }}
      gpu.return
    }}
  }}
}}
"""


def _tree(buf: str, block: int, tag: str) -> str:
    """A tree reduction of buf[0:block] into buf[0], one gpu.barrier per level."""
    lines = []
    s = block // 2
    while s >= 1:
        lines.append(f"""
      %s{tag}{s} = arith.constant {s} : index
      %lt{tag}{s} = arith.cmpi ult, %tid, %s{tag}{s} : index
      scf.if %lt{tag}{s} {{
        %o{tag}{s} = arith.addi %tid, %s{tag}{s} : index
        %u{tag}{s} = memref.load {buf}[%tid] : memref<{block}xf32, #gpu.address_space<workgroup>>
        %v{tag}{s} = memref.load {buf}[%o{tag}{s}] : memref<{block}xf32, #gpu.address_space<workgroup>>
        %w{tag}{s} = arith.addf %u{tag}{s}, %v{tag}{s} : f32
        memref.store %w{tag}{s}, {buf}[%tid] : memref<{block}xf32, #gpu.address_space<workgroup>>
      }}
      gpu.barrier""")
        s //= 2
    return "".join(lines)


def row_stats_kernel(rows: int, cols: int, elem: str, block: int) -> str:
    """One workgroup per row: sum, mean and (population) variance of x[row, :].

    Each thread sums a strided slice; the partial sums meet in workgroup memory through a
    tree with gpu.barrier between levels. The first reduction uses a gpu.func workgroup
    attribution, the second (sum of squared deviations from the mean, the stable two-pass
    variance) a memref.alloca in workgroup space: both forms of the input contract."""
    xt = f"memref<{rows}x{cols}x{elem}>"
    rt = f"memref<{rows}xf32>"
    wg = f"memref<{block}xf32, #gpu.address_space<workgroup>>"
    load = "%vf = arith.extf %v : {0} to f32".format(elem) if elem != "f32" else "%vf = arith.addf %v, %zero : f32"
    load2 = load.replace("%vf", "%qf").replace("%v ", "%q ").replace("%v,", "%q,")
    return f"""
module attributes {{gpu.container_module}} {{
  gpu.module @kf_kernels {{
    gpu.func @row_stats(%x: {xt}, %sum: {rt}, %mean: {rt}, %var: {rt})
        workgroup(%red: {wg}) kernel attributes {{known_block_size = array<i32: {block}, 1, 1>}} {{
      %row = gpu.block_id x
      %tid = gpu.thread_id x
      %c0 = arith.constant 0 : index
      %cB = arith.constant {block} : index
      %cC = arith.constant {cols} : index
      %zero = arith.constant 0.0 : f32
      %nf = arith.constant {float(cols)} : f32
      %part = scf.for %j = %tid to %cC step %cB iter_args(%acc = %zero) -> (f32) {{
        %v = memref.load %x[%row, %j] : {xt}
        {load}
        %a = arith.addf %acc, %vf : f32
        scf.yield %a : f32
      }}
      memref.store %part, %red[%tid] : {wg}
      gpu.barrier{_tree('%red', block, 'a')}
      %total = memref.load %red[%c0] : {wg}
      %m = arith.divf %total, %nf : f32
      %red2 = memref.alloca() : {wg}
      %part2 = scf.for %j = %tid to %cC step %cB iter_args(%acc = %zero) -> (f32) {{
        %q = memref.load %x[%row, %j] : {xt}
        {load2}
        %d = arith.subf %qf, %m : f32
        %dd = arith.mulf %d, %d : f32
        %a = arith.addf %acc, %dd : f32
        scf.yield %a : f32
      }}
      memref.store %part2, %red2[%tid] : {wg}
      gpu.barrier{_tree('%red2', block, 'b')}
      %ss = memref.load %red2[%c0] : {wg}
      %vr = arith.divf %ss, %nf : f32
      %first = arith.cmpi eq, %tid, %c0 : index
      scf.if %first {{
        memref.store %total, %sum[%row] : {rt}
        memref.store %m, %mean[%row] : {rt}
        memref.store %vr, %var[%row] : {rt}
      }}
      gpu.return
    }}
  }}
}}
"""


def transpose_kernel(rows: int, cols: int) -> str:
    """A 2-D workgroup (16 x 16) transposes through a padded 16 x 17 workgroup tile; both
    dimensions are guarded (rows and cols are not multiples of 16)."""
    xt, yt = f"memref<{rows}x{cols}xf32>", f"memref<{cols}x{rows}xf32>"
    wg = "memref<16x17xf32, #gpu.address_space<workgroup>>"
    return f"""
module attributes {{gpu.container_module}} {{
  gpu.module @kf_kernels {{
    gpu.func @transpose(%x: {xt}, %y: {yt}) workgroup(%tile: {wg}) kernel
        attributes {{known_block_size = array<i32: 16, 16, 1>}} {{
      %tx = gpu.thread_id x
      %ty = gpu.thread_id y
      %bx = gpu.block_id x
      %by = gpu.block_id y
      %c16 = arith.constant 16 : index
      %R = arith.constant {rows} : index
      %C = arith.constant {cols} : index
      %bx16 = arith.muli %bx, %c16 : index
      %by16 = arith.muli %by, %c16 : index
      %col = arith.addi %bx16, %tx : index
      %row = arith.addi %by16, %ty : index
      %r_ok = arith.cmpi ult, %row, %R : index
      %c_ok = arith.cmpi ult, %col, %C : index
      %ok = arith.andi %r_ok, %c_ok : i1
      scf.if %ok {{
        %v = memref.load %x[%row, %col] : {xt}
        memref.store %v, %tile[%ty, %tx] : {wg}
      }}
      gpu.barrier
      %orow = arith.addi %bx16, %ty : index
      %ocol = arith.addi %by16, %tx : index
      %or_ok = arith.cmpi ult, %orow, %C : index
      %oc_ok = arith.cmpi ult, %ocol, %R : index
      %ook = arith.andi %or_ok, %oc_ok : i1
      scf.if %ook {{
        %w = memref.load %tile[%tx, %ty] : {wg}
        memref.store %w, %y[%orow, %ocol] : {yt}
      }}
      gpu.return
    }}
  }}
}}
"""


def vector_kernel(n: int, block: int) -> str:
    """Four elements per thread through vector<4xf32>: c = a + b + sum(exp(a + b)) per quad."""
    t = f"memref<{n}xf32>"
    return f"""
module attributes {{gpu.container_module}} {{
  gpu.module @kf_kernels {{
    gpu.func @vec(%a: {t}, %b: {t}, %c: {t}) kernel attributes {{known_block_size = array<i32: {block}, 1, 1>}} {{
      %tid = gpu.thread_id x
      %bid = gpu.block_id x
      %c4 = arith.constant 4 : index
      %cb = arith.constant {block * 4} : index
      %t = arith.muli %bid, %cb : index
      %t4 = arith.muli %tid, %c4 : index
      %i = arith.addi %t, %t4 : index
      %x = vector.load %a[%i] : {t}, vector<4xf32>
      %y = vector.load %b[%i] : {t}, vector<4xf32>
      %z = arith.addf %x, %y : vector<4xf32>
      %e = math.exp %z : vector<4xf32>
      %r = vector.reduction <add>, %e : vector<4xf32> into f32
      %s = vector.broadcast %r : f32 to vector<4xf32>
      %w = arith.addf %s, %z : vector<4xf32>
      vector.store %w, %c[%i] : {t}, vector<4xf32>
      gpu.return
    }}
  }}
}}
"""


def op_kernel(n: int, elem: str, op: str, block: int = 128) -> str:
    """c[i] = op(a[i], b[i]) for one arith/math op written as '<name> %x, %y' or '<name> %x'."""
    t = f"memref<{n}x{elem}>"
    return f"""
module attributes {{gpu.container_module}} {{
  gpu.module @kf_kernels {{
    gpu.func @op(%a: {t}, %b: {t}, %c: {t}) kernel attributes {{known_block_size = array<i32: {block}, 1, 1>}} {{
      %tid = gpu.thread_id x
      %bid = gpu.block_id x
      %bdim = gpu.block_dim x
      %base = arith.muli %bid, %bdim : index
      %i = arith.addi %base, %tid : index
      %n = arith.constant {n} : index
      %in = arith.cmpi ult, %i, %n : index
      scf.if %in {{
        %x = memref.load %a[%i] : {t}
        %y = memref.load %b[%i] : {t}
        %z = {op} : {elem}
        memref.store %z, %c[%i] : {t}
      }}
      gpu.return
    }}
  }}
}}
"""


def compile_one(text: str):
    [binary] = compile_spirv(text)
    [kernel] = binary.kernels.values()
    return binary.binary, kernel


def kernel_abi(kernel, grid) -> KernelABI:
    return KernelABI(kernel.entry, tuple(range(len(kernel.bindings))), grid=grid, block=kernel.workgroup_size,
                     artifact=f"{kernel.entry}.spv", extra=kernel.abi_extra())


def random(shape, elem, gen):
    if elem in ("i32", "i64"):
        return torch.randint(-1000, 1000, shape, generator=gen, dtype=TORCH[elem])
    if elem == "i1":
        return torch.rand(shape, generator=gen) > 0.5
    return torch.randn(shape, generator=gen).to(TORCH[elem])

