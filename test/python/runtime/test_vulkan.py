"""kf-to-spirv + runtime/vulkan.py end to end: hand-written gpu-dialect kernels (the input
contract of the SPIR-V back end) are compiled by kf's passes, checked by spirv-val, and run
on whatever Vulkan device exists (lavapipe on CPU-only machines) against torch on fresh
random inputs. Also: kf-to-metal's MSL for the same kernels, and the Metal launcher's
refusal off macOS.
"""

from __future__ import annotations

import gc
import math
import re
import shutil
import subprocess
import sys
import threading
import zlib

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from kf.passes.base import PassError
from kf.passes.to_spirv import compile_spirv
from kf.runtime import vulkan
import kf
from kf.runtime.abi import DeviceLimits, KernelABI, ProgramABI, TensorArg

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


# ---- tests ---------------------------------------------------------------------------

@needs_spirv_val
@pytest.mark.parametrize("elem", ["f32", "f16", "bf16", "i32", "i64"])
def test_spirv_val_accepts(elem, tmp_path):
    """spirv-val runs inside the pass too; this checks the returned bytes themselves."""
    binary, kernel = compile_one(elementwise_kernel(1000, elem, 256))
    path = tmp_path / "k.spv"
    path.write_bytes(binary)
    r = subprocess.run(["spirv-val", "--target-env", "vulkan1.1", str(path)], capture_output=True, text=True)
    assert r.returncode == 0, r.stdout + r.stderr
    assert [b.binding for b in kernel.bindings] == [0, 1, 2] and {b.set for b in kernel.bindings} == {0}
    assert kernel.workgroup_size == (256, 1, 1)


def test_binding_layout_and_storage():
    _, k = compile_one(select_kernel(100, 64))
    assert [(b.binding, b.elem, b.storage, b.shape) for b in k.bindings] == [
        (0, "i1", "i8", (100,)), (1, "f32", "f32", (100,)), (2, "f32", "f32", (100,)), (3, "f32", "f32", (100,)),
        (4, "i1", "i8", (100,))]
    _, k = compile_one(elementwise_kernel(8, "bf16", 8))
    assert [b.storage for b in k.bindings] == ["i16"] * 3 and "Float16" not in k.capabilities
    _, k = compile_one(row_stats_kernel(4, 257, "f32", 256))
    assert k.workgroup_bytes == 2 * 256 * 4


def test_missing_workgroup_size_is_an_error():
    text = elementwise_kernel(64, "f32", 64).replace(" attributes {known_block_size = array<i32: 64, 1, 1>}", "")
    with pytest.raises(PassError, match="no workgroup size"):
        compile_spirv(text)
    [b] = compile_spirv(text, (64,))
    assert b.kernels["ew"].workgroup_size == (64, 1, 1)


@needs_vulkan
@pytest.mark.parametrize("elem", ["f32", "f16", "bf16", "i32", "i64"])
def test_elementwise_tail(elem):
    n, block = 1000, 256  # 1000 is not a multiple of 256: the last workgroup is partial
    binary, k = compile_one(elementwise_kernel(n, elem, block))
    gen = torch.Generator().manual_seed(zlib.crc32(elem.encode()))  # varied per dtype, reproducible
    a, b = random((n,), elem, gen), random((n,), elem, gen)
    sentinel = random((n,), elem, gen)
    c = sentinel.clone()
    vulkan.launch(binary, kernel_abi(k, (math.ceil(n / block), 1, 1)), [a, b, c], written=[2])
    if elem in ("i32", "i64"):
        assert torch.equal(c, a * b + a)
    else:
        want = (a.float() * b.float() + a.float().exp())
        tol = {"f32": 1e-5, "f16": 2e-2, "bf16": 2e-2}[elem]
        torch.testing.assert_close(c.float(), want.to(TORCH[elem]).float(), rtol=tol, atol=tol)


@needs_vulkan
@settings(max_examples=12, deadline=None)
@given(n=st.integers(1, 5000), block=st.sampled_from([32, 64, 128, 256, 1024]), data=st.data())
def test_elementwise_any_length(n, block, data):
    """Any length with any workgroup size: the grid is ceil(n / block) and the guard
    keeps the last partial workgroup in bounds."""
    binary, k = compile_one(elementwise_kernel(n, "f32", block))
    gen = torch.Generator().manual_seed(data.draw(st.integers(0, 2 ** 31 - 1)))
    a, b, c = torch.randn(n, generator=gen), torch.randn(n, generator=gen), torch.empty(n)
    vulkan.launch(binary, kernel_abi(k, (math.ceil(n / block), 1, 1)), [a, b, c], written=[2])
    torch.testing.assert_close(c, a * b + a.exp())


@needs_vulkan
@pytest.mark.parametrize("elem", ["f16", "bf16"])
def test_half_precision_rounding(elem):
    """Bit-exact rounding: f16 is native (each op rounds to f16, as torch eager does);
    bf16 is emulated in f32 and rounds once, at the store (round to nearest even), i.e.
    it equals the f32 computation rounded to bf16. NaN and inf go through."""
    n = 4096
    text = elementwise_kernel(n, elem, 256).replace(f"%e = math.exp %x : {elem}", f"%e = arith.addf %x, %x : {elem}")
    binary, k = compile_one(text)
    gen = torch.Generator().manual_seed(3)
    a, b = random((n,), elem, gen), random((n,), elem, gen)
    a[0], a[1] = float("nan"), float("inf")
    c = torch.empty(n, dtype=TORCH[elem])
    vulkan.launch(binary, kernel_abi(k, (n // 256, 1, 1)), [a, b, c], written=[2])
    want = a * b + (a + a) if elem == "f16" else (a.float() * b.float() + 2 * a.float()).to(TORCH[elem])
    assert torch.equal(c[1:], want[1:]) and c[0].isnan()


MATH_CASES = [  # (op, torch reference, input transform, rtol, atol)
    ("math.erf %x", torch.erf, None, 1e-6, 2e-7),
    ("math.erfc %x", torch.erfc, None, 1e-6, 2e-7),
    ("math.exp2 %x", torch.exp2, None, 1e-5, 1e-6),
    ("math.trunc %x", torch.trunc, lambda a: a * 10, 0, 0),
    ("math.cbrt %x", lambda a: a.sign() * a.abs().pow(1 / 3), None, 1e-5, 1e-6),
    ("math.atan2 %x, %y", torch.atan2, None, 1e-5, 1e-6),
    ("math.tanh %x", torch.tanh, lambda a: a * 5, 1e-5, 1e-6),
    ("math.log1p %x", torch.log1p, lambda a: a.abs(), 1e-5, 1e-6),
    ("math.powf %x, %y", torch.pow, lambda a: a.abs(), 1e-5, 1e-6),
    ("arith.maximumf %x, %y", torch.maximum, None, 0, 0),
]


@needs_vulkan
@pytest.mark.parametrize("op,ref,prep,rtol,atol", MATH_CASES, ids=[c[0].split()[0] for c in MATH_CASES])
def test_math_ops(op, ref, prep, rtol, atol):
    """Math that SPIR-V has (GLSL.std.450) and that kf expands (erf, erfc, exp2, trunc,
    cbrt, atan2) against torch, on a range that includes zeros and signs."""
    n = 2000
    binary, k = compile_one(op_kernel(n, "f32", op))
    gen = torch.Generator().manual_seed(11)
    a, b = torch.randn(n, generator=gen) * 3, torch.randn(n, generator=gen)
    a[:4] = torch.tensor([0.0, -0.0, 0.49999, -0.5])
    b[:2] = torch.tensor([0.0, -1.0])
    if prep is not None:
        a = prep(a)
    c = torch.empty(n)
    vulkan.launch(binary, kernel_abi(k, (math.ceil(n / 128), 1, 1)), [a, b, c], written=[2])
    want = ref(a, b) if "%y" in op else ref(a)
    torch.testing.assert_close(c, want, rtol=rtol, atol=atol, equal_nan=True)


@needs_vulkan
def test_powf_negative_and_special_bases():
    """math.powf where GLSL's pow is undefined (x <= 0) gets torch's values: NaN for a
    negative base and a non-integer exponent, the sign of an odd integer exponent, signed
    zeros and infinities for zero bases, 1 for pow(x, 0), pow(1, y) and pow(-1, +-inf);
    random negative bases with integer and non-integer exponents besides."""
    inf, nan = math.inf, math.nan
    bases = [-inf, -3.0, -2.0, -1.0, -0.5, -0.0, 0.0, 0.5, 1.0, 2.0, inf, nan]
    exps = [-inf, -3.0, -2.0, -1.5, -1.0, -0.5, -0.0, 0.0, 0.5, 1.0, 2.0, 3.0, 2.5, 1e10, 3e7 + 1, inf, nan]
    grid_a = torch.tensor([b for b in bases for _ in exps])
    grid_b = torch.tensor([e for _ in bases for e in exps])
    gen = torch.Generator().manual_seed(13)
    m = 1000
    ra = -torch.rand(m, generator=gen) * 4 - 0.01
    rb = torch.randint(-6, 7, (m,), generator=gen).float() + torch.where(
        torch.rand(m, generator=gen) < 0.5, 0.0, torch.rand(m, generator=gen))
    a, b = torch.cat([grid_a, ra]), torch.cat([grid_b, rb])
    n = a.numel()
    binary, k = compile_one(op_kernel(n, "f32", "math.powf %x, %y"))
    c = torch.empty(n)
    vulkan.launch(binary, kernel_abi(k, (math.ceil(n / 128), 1, 1)), [a, b, c], written=[2])
    want = torch.pow(a, b)
    torch.testing.assert_close(c, want, rtol=2e-5, atol=0, equal_nan=True)
    assert torch.equal(c.isnan(), want.isnan())
    assert torch.equal(torch.signbit(c[~want.isnan()]), torch.signbit(want[~want.isnan()]))


@needs_vulkan
@pytest.mark.parametrize("elem", ["i32", "i64"])
@pytest.mark.parametrize("op", ["math.ipowi %x, %y", "arith.floordivsi %x, %y", "arith.remsi %x, %y",
                                "arith.maxsi %x, %y", "math.absi %x"])
def test_integer_ops(op, elem):
    n = 1000
    binary, k = compile_one(op_kernel(n, elem, op))
    gen = torch.Generator().manual_seed(5)
    if op.startswith("math.ipowi"):
        a = torch.randint(-4, 5, (n,), generator=gen, dtype=TORCH[elem])
        b = torch.randint(-2, 12, (n,), generator=gen, dtype=TORCH[elem])
    else:
        a = torch.randint(-1000, 1000, (n,), generator=gen, dtype=TORCH[elem])
        b = torch.randint(1, 50, (n,), generator=gen, dtype=TORCH[elem]) * torch.where(
            torch.rand(n, generator=gen) < 0.5, -1, 1).to(TORCH[elem])
    c = torch.empty(n, dtype=TORCH[elem])
    vulkan.launch(binary, kernel_abi(k, (math.ceil(n / 128), 1, 1)), [a, b, c], written=[2])
    name = op.split()[0]
    if name == "math.ipowi":  # negative exponents: 0 except for bases 1 and -1
        pos = a ** b.clamp(min=0)
        neg = torch.where(a == 1, 1, torch.where(a == -1, torch.where(b % 2 == 1, -1, 1), 0)).to(a.dtype)
        want = torch.where(b < 0, neg, pos)
    else:
        want = {"arith.floordivsi": lambda: torch.div(a, b, rounding_mode="floor"),
                "arith.remsi": lambda: torch.fmod(a, b), "arith.maxsi": lambda: torch.maximum(a, b),
                "math.absi": lambda: a.abs()}[name]()
    assert torch.equal(c, want)


@needs_vulkan
def test_elementwise_guard_keeps_memory_past_n():
    """The kernel is compiled for n = 1000 but run over a 1024-element grid: the guard must
    stop the 24 extra threads (the buffers are exactly n long, so an unguarded store would
    be out of bounds; here we check no garbage reaches c)."""
    n = 1000
    binary, k = compile_one(elementwise_kernel(n, "f32", 256))
    a, b = torch.randn(n), torch.randn(n)
    c = torch.full((n,), float("nan"))
    vulkan.launch(binary, kernel_abi(k, (4, 1, 1)), [a, b, c], written=[2])
    assert not c.isnan().any()
    torch.testing.assert_close(c, a * b + a.exp())


@needs_vulkan
def test_bool_buffers():
    n = 1000
    binary, k = compile_one(select_kernel(n, 128))
    gen = torch.Generator().manual_seed(7)
    m, a, b = random((n,), "i1", gen), torch.randn(n, generator=gen), torch.randn(n, generator=gen)
    c, g = torch.empty(n), torch.empty(n, dtype=torch.bool)
    vulkan.launch(binary, kernel_abi(k, (math.ceil(n / 128), 1, 1)), [m, a, b, c, g], written=[3, 4])
    assert torch.equal(c, torch.where(m, a, b))
    assert torch.equal(g, a > b)


@needs_vulkan
@pytest.mark.parametrize("cols", [257, 1024, 100])  # 100 < 256: threads with an empty slice
@pytest.mark.parametrize("elem", ["f32", "f16", "bf16"])
def test_row_stats_workgroup_memory(cols, elem):
    rows, block = 6, 256
    binary, k = compile_one(row_stats_kernel(rows, cols, elem, block))
    gen = torch.Generator().manual_seed(cols)
    x = (torch.randn(rows, cols, generator=gen) * 3 + 1).to(TORCH[elem])
    s, m, v = torch.empty(rows), torch.empty(rows), torch.empty(rows)
    timings = []
    vulkan.launch(binary, kernel_abi(k, (rows, 1, 1)), [x, s, m, v], written=[1, 2, 3], timings=timings)
    xf = x.float()
    torch.testing.assert_close(s, xf.sum(1), rtol=1e-4, atol=1e-3)
    torch.testing.assert_close(m, xf.mean(1), rtol=1e-4, atol=1e-5)
    torch.testing.assert_close(v, xf.var(1, unbiased=False), rtol=1e-4, atol=1e-4)
    if vulkan.device().timestamps:
        assert len(timings) == 1 and timings[0] > 0


@needs_vulkan
def test_transpose_2d_workgroup():
    rows, cols = 100, 70
    binary, k = compile_one(transpose_kernel(rows, cols))
    assert k.workgroup_size == (16, 16, 1) and k.workgroup_bytes == 16 * 17 * 4
    x, y = torch.randn(rows, cols), torch.full((cols, rows), float("nan"))
    vulkan.launch(binary, kernel_abi(k, (math.ceil(cols / 16), math.ceil(rows / 16), 1)), [x, y], written=[1])
    assert torch.equal(y, x.t())


@needs_vulkan
def test_vector_loads_and_stores():
    n, block = 1024, 64
    binary, k = compile_one(vector_kernel(n, block))
    a, b, c = torch.randn(n), torch.randn(n), torch.empty(n)
    vulkan.launch(binary, kernel_abi(k, (n // (4 * block), 1, 1)), [a, b, c], written=[2])
    z = (a + b).view(-1, 4)
    torch.testing.assert_close(c, (z.exp().sum(1, keepdim=True) + z).view(-1), rtol=1e-5, atol=1e-5)


def subgroup_kernel(n: int, width: int) -> str:
    """gpu.shuffle xor 1 (swap neighbours) and gpu.subgroup_reduce add over each subgroup."""
    t = f"memref<{n}xf32>"
    return f"""
module attributes {{gpu.container_module}} {{
  gpu.module @kf_kernels {{
    gpu.func @sg(%a: {t}, %c: {t}, %d: {t}) kernel attributes {{known_block_size = array<i32: 64, 1, 1>}} {{
      %tid = gpu.thread_id x
      %bid = gpu.block_id x
      %c64 = arith.constant 64 : index
      %base = arith.muli %bid, %c64 : index
      %i = arith.addi %base, %tid : index
      %x = memref.load %a[%i] : {t}
      %one = arith.constant 1 : i32
      %w = arith.constant {width} : i32
      %s, %ok = gpu.shuffle xor %x, %one, %w : f32
      memref.store %s, %c[%i] : {t}
      %r = gpu.subgroup_reduce add %x : (f32) -> f32
      memref.store %r, %d[%i] : {t}
      gpu.return
    }}
  }}
}}
"""


@needs_vulkan
def test_subgroup_ops():
    """Compiled for the device's subgroup size (lavapipe: 8); another size is refused."""
    size = vulkan.device().subgroup_size
    n = 256
    [b] = compile_spirv(subgroup_kernel(n, size), subgroup_size=size)
    k = b.kernels["sg"]
    assert k.subgroup_size == size
    a, c, d = torch.randn(n), torch.empty(n), torch.empty(n)
    vulkan.launch(b.binary, kernel_abi(k, (n // 64, 1, 1)), [a, c, d], written=[1, 2])
    assert torch.equal(c, a.view(-1, 2).flip(1).reshape(-1))
    torch.testing.assert_close(d, a.view(-1, size).sum(1, keepdim=True).expand(-1, size).reshape(-1))
    other = 64 if size != 64 else 32
    [b] = compile_spirv(subgroup_kernel(n, other), subgroup_size=other)
    with pytest.raises(vulkan.VulkanError, match=f"subgroup size {other}"):
        vulkan.launch(b.binary, kernel_abi(b.kernels["sg"], (n // 64, 1, 1)), [a, c, d])
    with pytest.raises(PassError, match="gpu.shuffle"):  # width != subgroup-size: upstream cannot lower it
        compile_spirv(subgroup_kernel(n, other), subgroup_size=size)


def counting_kernel(trips: int) -> str:
    """c[0] = the number of times a loop of `trips` iterations ran (one invocation)."""
    return f"""
module attributes {{gpu.container_module}} {{
  gpu.module @kf_kernels {{
    gpu.func @count(%a: memref<1xf32>, %c: memref<1xf32>) kernel attributes {{known_block_size = array<i32: 1, 1, 1>}} {{
      %c0 = arith.constant 0 : index
      %c1 = arith.constant 1 : index
      %n = arith.constant {trips} : index
      %one = memref.load %a[%c0] : memref<1xf32>
      %zero = arith.constant 0.0 : f32
      %s = scf.for %i = %c0 to %n step %c1 iter_args(%acc = %zero) -> (f32) {{
        %t = arith.addf %acc, %one : f32
        scf.yield %t : f32
      }}
      memref.store %s, %c[%c0] : memref<1xf32>
      gpu.return
    }}
  }}
}}
"""


@needs_vulkan
def test_loop_limit_refused_not_dropped():
    """A device with a loop limit (lavapipe: 65535 iterations an invocation, after which
    the rest of the work is silently dropped) refuses a kernel whose bound is over it,
    naming the kernel and the limit; under it the count is exact."""
    most = vulkan.device().limits["max_loop_iterations"]
    if not most:
        pytest.skip(f"{vulkan.device().name} has no loop limit")
    a, c = torch.ones(1), torch.empty(1)
    binary, k = compile_one(counting_kernel(most - 1))
    vulkan.launch(binary, kernel_abi(k, (1, 1, 1)), [a, c], written=[1])
    assert c.item() == most - 1
    binary, k = compile_one(counting_kernel(most + 2))
    assert k.loop_iterations == most + 3
    with pytest.raises(vulkan.VulkanError, match=f"kernel count runs up to {most + 3} loop iterations .*{most}"):
        vulkan.launch(binary, kernel_abi(k, (1, 1, 1)), [a, c], written=[1])


@needs_vulkan
def test_run_program_chains_kernels_through_a_temporary():
    """Two kernels in one submission: t = a*b + exp(a); out = t*b + exp(t), with a
    barrier between them; the program ABI drives buffers and launch order."""
    n = 1000
    binary, k = compile_one(elementwise_kernel(n, "f32", 256))
    arg = TensorArg("a", (n,), "f32")
    k1 = dataclass_replace(kernel_abi(k, (4, 1, 1)), args=(0, 1, 3))
    k2 = dataclass_replace(kernel_abi(k, (4, 1, 1)), args=(3, 1, 2))
    abi = ProgramABI("vulkan", (arg, TensorArg("b", (n,), "f32")), (TensorArg("out", (n,), "f32"),),
                     (TensorArg("t", (n,), "f32"),), (k1, k2))
    abi = ProgramABI.from_json(abi.to_json())  # what a cache hit in a new process sees
    a, b = torch.randn(n), torch.randn(n)
    timings = []
    [out] = vulkan.run_program(abi, {"ew.spv": binary}, [a, b], timings=timings)
    t = a * b + a.exp()
    torch.testing.assert_close(out, t * b + t.exp(), rtol=1e-4, atol=1e-5)  # exp of exp: large values
    assert [e for e, _ in timings] == ["ew", "ew"]


def _funcs(text: str) -> str:
    """The gpu.func(s) of a one-gpu.module text, to merge kernels into one module."""
    start = text.index("    gpu.func")
    return text[start:text.rindex("  }\n}")].rstrip() + "\n"


@needs_vulkan
def test_two_entry_points_in_one_binary():
    """One gpu.module with two kernels is one SPIR-V binary with two entry points; a
    program runs them in order, the second reading the first's temporary as a matrix."""
    rows, cols = 5, 300
    n = rows * cols
    ew = elementwise_kernel(n, "f32", 256)
    stats = row_stats_kernel(rows, cols, "f32", 128)
    text = ew[:ew.index("    gpu.func")] + _funcs(ew) + _funcs(stats) + "  }\n}\n"
    [b] = compile_spirv(text)
    assert set(b.kernels) == {"ew", "row_stats"}
    ke, ks = b.kernels["ew"], b.kernels["row_stats"]
    abi = ProgramABI(
        "vulkan", (TensorArg("a", (n,), "f32"), TensorArg("b", (n,), "f32")),
        tuple(TensorArg(name, (rows,), "f32") for name in ("sum", "mean", "var")), (TensorArg("t", (n,), "f32"),),
        (dataclass_replace(kernel_abi(ke, (math.ceil(n / 256), 1, 1)), args=(0, 1, 5), artifact="m.spv"),
         dataclass_replace(kernel_abi(ks, (rows, 1, 1)), args=(5, 2, 3, 4), artifact="m.spv")))
    gen = torch.Generator().manual_seed(1)
    a, bb = torch.randn(n, generator=gen), torch.randn(n, generator=gen)
    s, m, v = vulkan.run_program(abi, {"m.spv": b.binary}, [a, bb])
    t = (a * bb + a.exp()).view(rows, cols)
    torch.testing.assert_close(s, t.sum(1), rtol=1e-4, atol=1e-3)
    torch.testing.assert_close(m, t.mean(1), rtol=1e-4, atol=1e-4)
    torch.testing.assert_close(v, t.var(1, unbiased=False), rtol=1e-4, atol=1e-4)
    if shutil.which("spirv-cross"):
        from kf.passes.to_metal import compile_metal

        msl = compile_metal(text)
        assert "threadgroup float" not in msl["ew"].source and "threadgroup float" in msl["row_stats"].source


@needs_vulkan
def test_clear_errors():
    binary, k = compile_one(elementwise_kernel(16, "f32", 16))
    abi = kernel_abi(k, (1, 1, 1))
    with pytest.raises(vulkan.VulkanError, match="compiled for torch.float32"):
        vulkan.launch(binary, abi, [torch.zeros(16, dtype=torch.float64)] * 3)
    with pytest.raises(vulkan.VulkanError, match="takes 3 buffers"):
        vulkan.launch(binary, abi, [torch.zeros(16)] * 2)
    with pytest.raises(vulkan.VulkanError, match="not a SPIR-V binary"):
        vulkan.launch(b"nope", abi, [torch.zeros(16)] * 3)
    with pytest.raises(vulkan.VulkanError, match="grid"):
        vulkan.launch(binary, dataclass_replace(abi, grid=(2 ** 31, 1, 1)), [torch.zeros(16)] * 3)


def test_no_device_is_a_clear_error(tmp_path):
    """With no driver, the launcher says so (a fresh process with an empty ICD list)."""
    code = ("from kf.runtime import vulkan\n"
            "try:\n    vulkan.device()\nexcept vulkan.VulkanUnavailable as e:\n    print('UNAVAILABLE', e)\n")
    env = {"VK_ICD_FILENAMES": str(tmp_path / "none.json"), "VK_DRIVER_FILES": str(tmp_path / "none.json"),
           "PATH": "/usr/bin:/bin"}
    r = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert "UNAVAILABLE" in r.stdout, r.stdout + r.stderr


def test_runtime_does_not_import_mlir():
    """The launchers take bytes and the ABI: neither module may import mlir or kf.passes
    (checked on their source: importing kf.runtime also runs the kf package's __init__)."""
    import ast
    import pathlib

    import kf.runtime

    for name in ("vulkan.py", "residency.py", "metal.py", "abi.py"):
        tree = ast.parse((pathlib.Path(kf.runtime.__file__).parent / name).read_text())
        for node in ast.walk(tree):
            mods = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module or ""] if isinstance(node, ast.ImportFrom) and not node.level else []
            for m in mods:
                assert not (m == "mlir" or m.startswith("mlir.") or m.startswith("kf.passes")), (name, m)


# ---- device memory: residency, staging, one submit a call --------------------------------

@pytest.fixture(params=[False, True], ids=["mapped", "staged"])
def memory_path(request):
    """Run a test with the device buffers mapped (lavapipe's unified memory) and through
    staging buffers and vkCmdCopyBuffer (a discrete GPU's path), each from an empty
    residency table and pool."""
    dev = vulkan.device()
    before = dev.staged
    if not request.param and not dev.memory.unified:
        pytest.skip(f"{dev.name} has no unified memory: its buffers are always staged")
    dev.residency.clear()
    dev.release_pool()
    dev.staged = request.param
    try:
        yield dev
    finally:
        dev.residency.clear()
        dev.release_pool()
        dev.staged = before


def ew_program(n: int):
    """out = a*b + exp(a), t = a*b + exp(a) then out2 = t*b + exp(t): one or two kernels."""
    binary, k = compile_one(elementwise_kernel(n, "f32", 256))
    grid = (math.ceil(n / 256), 1, 1)
    arg = lambda name: TensorArg(name, (n,), "f32")  # noqa: E731
    one = ProgramABI("vulkan", (arg("a"), arg("b")), (arg("out"),), (),
                     (dataclass_replace(kernel_abi(k, grid), args=(0, 1, 2)),))
    two = ProgramABI("vulkan", (arg("a"), arg("b")), (arg("out"), arg("t")), (),
                     (dataclass_replace(kernel_abi(k, grid), args=(0, 1, 3)),
                      dataclass_replace(kernel_abi(k, grid), args=(3, 1, 2))))
    return {"ew.spv": binary}, one, two


def ew_ref(a, b):
    return a * b + a.exp()


def uploads(dev):
    return dev.uploads


@needs_vulkan
def test_chained_calls_upload_once(memory_path):
    """A chain of calls on the same tensors uploads each once; an output fed back to the
    next call is not uploaded at all (its buffer became resident when it was written)."""
    dev = memory_path
    bins, one, _ = ew_program(1000)
    gen = torch.Generator().manual_seed(3)
    a, b = torch.randn(1000, generator=gen), torch.rand(1000, generator=gen)
    u, before = dev.uploads, dev.upload_bytes
    [y] = vulkan.run_program(one, bins, [a, b])
    assert dev.uploads - u == 2 and dev.upload_bytes - before == 8000
    torch.testing.assert_close(y, ew_ref(a, b))
    u = dev.uploads
    for _ in range(3):
        [y2] = vulkan.run_program(one, bins, [a, b])
    [z] = vulkan.run_program(one, bins, [y2, b])
    assert dev.uploads == u
    torch.testing.assert_close(y2, ew_ref(a, b))
    torch.testing.assert_close(z, ew_ref(y2, b))


@needs_vulkan
def test_changes_between_calls_are_seen(memory_path):
    """Whatever changes a tensor between calls -- in place, through indexing, copy_, a
    view, .data, numpy -- the next call sees it (and uploads it again)."""
    dev = memory_path
    bins, one, _ = ew_program(257)
    gen = torch.Generator().manual_seed(5)
    a, b = torch.randn(257, generator=gen), torch.rand(257, generator=gen)
    vulkan.run_program(one, bins, [a, b])
    arr = np.random.default_rng(0).standard_normal(257).astype(np.float32)
    from_numpy = torch.from_numpy(arr)
    vulkan.run_program(one, bins, [from_numpy, b])
    changes = [lambda: a.add_(1), lambda: a.__setitem__(0, 5.0), lambda: a.copy_(torch.randn(257, generator=gen)),
               lambda: a[10:20].mul_(-1), lambda: a.view(257, 1)[100].fill_(3), lambda: a.data.mul_(0.5),
               lambda: arr.__setitem__(slice(None), 2.0)]
    for i, change in enumerate(changes):
        change()
        x = from_numpy if i == len(changes) - 1 else a
        u = dev.uploads
        [y] = vulkan.run_program(one, bins, [x, b])
        assert dev.uploads == u + 1, i
        torch.testing.assert_close(y, ew_ref(x, b), msg=f"change {i}")


@needs_vulkan
def test_outputs_fed_back_then_changed(memory_path):
    dev = memory_path
    bins, one, two = ew_program(1000)
    a, b = torch.randn(1000), torch.rand(1000)
    out, t = vulkan.run_program(two, bins, [a, b])  # two outputs, one submit
    t_ref = ew_ref(a, b)
    torch.testing.assert_close(t, t_ref)
    torch.testing.assert_close(out, ew_ref(t_ref, b), rtol=1e-4, atol=1e-5)
    u = dev.uploads
    [y] = vulkan.run_program(one, bins, [t, b])
    assert dev.uploads == u
    t.mul_(0.5)
    [y] = vulkan.run_program(one, bins, [t, b])
    assert dev.uploads == u + 1
    torch.testing.assert_close(y, ew_ref(t, b), rtol=1e-5, atol=1e-5)  # exp of exp: large values


@needs_vulkan
def test_downloads_batch_into_the_calls_one_submit(memory_path):
    dev = memory_path
    bins, _, two = ew_program(300)
    a, b = torch.randn(300), torch.rand(300)
    s, d = dev.submits, dev.downloads
    vulkan.run_program(two, bins, [a, b])
    assert dev.submits == s + 1 and dev.downloads == d + 2


@needs_vulkan
def test_views_are_keyed_by_their_storage(memory_path):
    """A transposed, a strided and an offset view are uploaded as they lie (made dense on
    the way) and stay resident; changing their base through another view is seen."""
    dev = memory_path
    f = kf.jit(lambda x, w: x * w + 1, target="vulkan")
    base = torch.randn(70, 66)
    w = torch.randn(33)
    dense = lambda: base.view(-1)[66 * 36 + 5:66 * 36 + 5 + 33 * 33].view(33, 33)  # noqa: E731 (odd offset)
    for view in (lambda: base.t()[:33, :33], lambda: base[:33, ::2], lambda: base[3:36, 1:34], dense):
        x = view()
        y = f(x, w)
        u = dev.uploads
        y = f(view(), w)  # another view object of the same bytes
        assert dev.uploads == u
        torch.testing.assert_close(y, x * w + 1)
    base[40].fill_(7)  # through the base: the views share its version counter
    x = dense()
    u = dev.uploads
    torch.testing.assert_close(f(x, w), x * w + 1)
    assert dev.uploads == u + 1


@needs_vulkan
def test_eviction_under_a_small_limit(memory_path, monkeypatch):
    """KF_VULKAN_RESIDENT_BYTES bounds what stays resident (LRU by bytes); 0 turns
    residency off. Results are right either way."""
    dev = memory_path
    bins, one, _ = ew_program(1000)
    ts = [torch.randn(1000) for _ in range(3)]
    b = torch.rand(1000)
    monkeypatch.setenv("KF_VULKAN_RESIDENT_BYTES", "12000")  # b, and two 4000-byte tensors
    try:
        dev.trim()
        for t in ts:  # each call keeps its input and its output: 16 KB > 12 KB
            [y] = vulkan.run_program(one, bins, [t, b])
            torch.testing.assert_close(y, ew_ref(t, b))
            assert dev.residency.resident_bytes <= 12000
        u = dev.uploads
        vulkan.run_program(one, bins, [ts[0], b])  # evicted long ago
        assert dev.uploads > u
        monkeypatch.setenv("KF_VULKAN_RESIDENT_BYTES", "0")
        dev.trim()
        assert len(dev.residency) == 0
        u = dev.uploads
        for _ in range(2):
            [y] = vulkan.run_program(one, bins, [ts[1], b])
        assert dev.uploads == u + 4 and len(dev.residency) == 0
        torch.testing.assert_close(y, ew_ref(ts[1], b))
    finally:
        monkeypatch.delenv("KF_VULKAN_RESIDENT_BYTES")
        dev.trim()


@needs_vulkan
def test_freed_tensors_give_their_buffers_back(memory_path):
    dev = memory_path
    bins, one, _ = ew_program(1000)
    b = torch.rand(1000)
    vulkan.run_program(one, bins, [torch.randn(1000), b])  # input and output die at once
    gc.collect()
    dev.trim()
    assert len(dev.residency) == 1  # b's
    x = torch.zeros(1000)
    [y] = vulkan.run_program(one, bins, [x, b])
    del x, y
    gc.collect()
    x = torch.zeros(1000)  # a new storage, perhaps where the last one was: uploaded
    u = dev.uploads
    [y] = vulkan.run_program(one, bins, [x, b])
    assert dev.uploads == u + 1
    torch.testing.assert_close(y, ew_ref(x, b))


@needs_vulkan
def test_threads_share_the_device(memory_path):
    """Calls from several threads, on tensors of their own and shared ones, changed in
    between: every result right, and the table's byte count matches its entries."""
    dev = memory_path
    bins, one, two = ew_program(4096)
    shared = torch.rand(4096)
    errors = []

    def work(seed):
        gen = torch.Generator().manual_seed(seed)
        a = torch.randn(4096, generator=gen)
        try:
            for i in range(12):
                if i % 4 == 3:
                    a.add_(0.25)
                [y] = vulkan.run_program(one, bins, [a, shared])
                torch.testing.assert_close(y, ew_ref(a, shared))
                out, t = vulkan.run_program(two, bins, [y.clamp(-3, 3), shared])
                torch.testing.assert_close(t, ew_ref(y.clamp(-3, 3), shared))
        except Exception as e:  # reported below, with the thread's seed
            errors.append((seed, e))

    threads = [threading.Thread(target=work, args=(s,)) for s in range(4)]
    for th in threads:
        th.start()
    for th in threads:
        th.join()
    assert not errors, errors
    res = dev.residency
    assert res.resident_bytes == sum(e.nbytes for e in res._entries.values())
    assert all(e.pins == 0 for e in res._entries.values())


@needs_vulkan
def test_size_zero_and_scalars(memory_path):
    dev = memory_path
    f = kf.jit(lambda x, w: x * w + 1, target="vulkan")
    x, w = torch.randn(0, 5), torch.randn(5)
    u = dev.uploads
    assert f(x, w).shape == (0, 5)
    g = kf.jit(lambda x: x.sum() * 2, target="vulkan")
    x = torch.randn(7)
    torch.testing.assert_close(g(x), x.sum() * 2)
    torch.testing.assert_close(g(x), x.sum() * 2)
    assert dev.uploads == u + 2  # w, then x once (nothing of x of size 0)


@needs_vulkan
def test_inference_mode_tensors(memory_path):
    """Inference tensors have no version counter: uploaded on every call, never stale;
    outputs made inside inference_mode are plain tensors, so they stay resident."""
    dev = memory_path
    bins, one, _ = ew_program(100)
    b = torch.rand(100)
    with torch.inference_mode():
        a = torch.randn(100)
        [y] = vulkan.run_program(one, bins, [a, b])
        a.add_(1)
        [y2] = vulkan.run_program(one, bins, [a, b])
        torch.testing.assert_close(y2, ew_ref(a, b))
        assert not y2.is_inference()
        u = dev.uploads
        vulkan.run_program(one, bins, [y2, b])
        assert dev.uploads == u


@needs_vulkan
def test_program_owned_buffer_in_and_out(memory_path):
    """A buffer a call owns, filled from bytes and read back after the kernels (what a
    flag the kernels set needs), beside tensors read and written."""
    dev = memory_path
    n = 64
    binary, k = compile_one(elementwise_kernel(n, "f32", 64))
    a, b = torch.randn(n), torch.rand(n)
    c = torch.full((n,), float("nan"))
    call = dev.call()
    flag = call.scratch(4 * n, fill=c.numpy().tobytes(), read_back=True)
    call.dispatch(kernel_abi(k, (1, 1, 1)), binary, [call.read(a), call.read(b), flag])
    call.finish()
    got = torch.frombuffer(bytearray(call.results[flag]), dtype=torch.float32)
    torch.testing.assert_close(got, ew_ref(a, b))


@needs_vulkan
def test_copy_rate_is_measured_on_the_device():
    dev = vulkan.device()
    if not dev.timestamps:
        pytest.skip("no timestamp queries")
    seconds = dev.copy_seconds(1 << 20, repeats=3)
    assert 0 < seconds < 1


@needs_vulkan
def test_recorded_lavapipe_is_this_lavapipe(recorded_device):
    """The recorded lavapipe of the device-limit tests is what lavapipe reports here
    (where the same lavapipe runs: its subgroup size follows the host's vector width)."""
    rec = recorded_device("lavapipe")
    dev = vulkan.device()
    if dev.name != rec["deviceName"]:
        pytest.skip(f"this device is {dev.name}")
    for part in ("limits", "subgroup"):
        assert dev.properties[part] == rec[part]
    assert dev.target_limits() == DeviceLimits.from_vulkan(rec)


# ---- Metal: codegen here, execution on a Mac ------------------------------------------

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


def dataclass_replace(obj, **changes):
    import dataclasses

    return dataclasses.replace(obj, **changes)
