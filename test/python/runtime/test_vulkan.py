"""kf-to-spirv + runtime/vulkan.py end to end: hand-written gpu-dialect kernels
(vulkan_kernels.py) are compiled by kf's passes, checked by spirv-val, and run on whatever
Vulkan device exists (lavapipe on CPU-only machines) against torch on fresh random
inputs; the launcher's errors. Device memory (residency, staging) is in
test_vulkan_memory.py, Metal in test_metal.py.
"""

from __future__ import annotations

import dataclasses
import math
import shutil
import subprocess
import sys
import zlib

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

import kf
from kf.passes.base import PassError
from kf.passes.to_spirv import compile_spirv
from kf.runtime import vulkan
from kf.runtime.abi import DeviceLimits, ProgramABI, TensorArg

from vulkan_kernels import (TORCH, compile_one, elementwise_kernel, kernel_abi, needs_spirv_val,
                            needs_vulkan, op_kernel, random, row_stats_kernel, select_kernel,
                            transpose_kernel, vector_kernel)


@needs_spirv_val
@pytest.mark.parametrize("elem", ["f32", "f16", "bf16", "i32", "i64"])
def test_spirv_val_accepts(elem, tmp_path):
    """spirv-val runs inside the pass too; this checks the returned bytes themselves."""
    binary, kernel = compile_one(elementwise_kernel(1000, elem, 256))
    path = tmp_path / "k.spv"
    path.write_bytes(binary)
    r = subprocess.run(["spirv-val", "--target-env", "vulkan1.2", str(path)], capture_output=True, text=True)
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
def test_run_time_sizes_past_the_loop_limit_compile_each_size():
    """A kernel whose loops run to a run-time size could pass the loop limit at the size's
    bound (a whole-tensor max of [n, 8, 13] loops over up to 4096 * 104 elements): the
    driver compiles each size instead, and every call is right, none refused."""
    if not vulkan.device().limits["max_loop_iterations"]:
        pytest.skip(f"{vulkan.device().name} has no loop limit")
    f = kf.jit(lambda x: torch.amax(x), target="vulkan")
    for n in (5, 6, 9):
        x = torch.randn(n, 8, 13)
        assert f(x).item() == x.amax().item()
    assert all("?" not in r.signature for r in f.compiles)


@needs_vulkan
def test_run_program_chains_kernels_through_a_temporary():
    """Two kernels in one submission: t = a*b + exp(a); out = t*b + exp(t), with a
    barrier between them; the program ABI drives buffers and launch order."""
    n = 1000
    binary, k = compile_one(elementwise_kernel(n, "f32", 256))
    arg = TensorArg("a", (n,), "f32")
    k1 = dataclasses.replace(kernel_abi(k, (4, 1, 1)), args=(0, 1, 3))
    k2 = dataclasses.replace(kernel_abi(k, (4, 1, 1)), args=(3, 1, 2))
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
        (dataclasses.replace(kernel_abi(ke, (math.ceil(n / 256), 1, 1)), args=(0, 1, 5), artifact="m.spv"),
         dataclasses.replace(kernel_abi(ks, (rows, 1, 1)), args=(5, 2, 3, 4), artifact="m.spv")))
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
        vulkan.launch(binary, dataclasses.replace(abi, grid=(2 ** 31, 1, 1)), [torch.zeros(16)] * 3)


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


@needs_vulkan
def test_float_controls_the_device_lacks_are_refused(monkeypatch):
    """A kernel declares float-controls modes for the device it was compiled for; on a
    device without them it is refused with the property named, never run with other
    results: DenormPreserve (compiled for NVIDIA's float controls) on lavapipe, which
    flushes subnormals; SignedZeroInfNanPreserve on a device without it (kf has no kernel
    that may lose inf, NaN or -0.0)."""
    dev = vulkan.device()
    n = 37
    text = elementwise_kernel(n, "f32", 64)
    gen = torch.Generator().manual_seed(0)
    x, y = random((n,), "f32", gen), random((n,), "f32", gen)
    [binary] = compile_spirv(text, float_controls="preserve32+denorm32+rte32")
    [kernel] = binary.kernels.values()
    assert "DenormPreserve" in kernel.capabilities and "RoundingModeRTE" in kernel.capabilities
    abi = kernel_abi(kernel, (1, 1, 1))
    if not dev.features.get("shaderDenormPreserveFloat32"):
        with pytest.raises(vulkan.VulkanError, match="DenormPreserve .needs shaderDenormPreserveFloat32"):
            vulkan.launch(binary.binary, abi, [x, y, torch.empty(n)])
    plain, kernel = compile_one(text)
    monkeypatch.setattr(dev, "features", dict(dev.features, shaderSignedZeroInfNanPreserveFloat32=False))
    with pytest.raises(vulkan.VulkanError, match="SignedZeroInfNanPreserve .needs shaderSignedZeroInfNanPreserveFloat32"):
        vulkan.launch(plain, kernel_abi(kernel, (1, 1, 1)), [x, y, torch.empty(n)])


def test_cooperative_matrix_kernels_need_the_feature():
    """A kernel with cooperative matrices (and the Vulkan memory model they need) is refused
    on a device where the runtime did not enable VK_KHR_cooperative_matrix -- lavapipe, or
    a driver without it -- with the feature named."""
    from types import SimpleNamespace

    from kf.runtime.abi import DeviceLimits, KernelABI
    from kf.runtime.vulkan_device import Device, VulkanError

    device = SimpleNamespace(features={"vulkanMemoryModel": True}, name="a device",
                             target_limits=lambda: DeviceLimits())
    kernel = KernelABI("k", (0,), extra={"spirv_capabilities": ["Shader", "CooperativeMatrixKHR",
                                                                "VulkanMemoryModel"]})
    with pytest.raises(VulkanError, match="CooperativeMatrixKHR .needs cooperativeMatrix"):
        Device.require(device, kernel)


@needs_vulkan
def test_device_properties_say_whether_it_has_cooperative_matrices():
    """The device's properties list its cooperative-matrix shapes (empty without the
    extension, as on lavapipe), and its limits keep those kf can use."""
    dev = vulkan.device()
    assert isinstance(dev.properties["cooperativeMatrix"], list)
    assert bool(dev.properties["cooperativeMatrix"]) <= dev.features.get("cooperativeMatrix", False)
    if not dev.features.get("cooperativeMatrix"):
        assert dev.target_limits().cooperative_matrix == ()


def test_float64_kernels_need_the_64_bit_float_controls():
    """A kernel with the Float64 capability declares SignedZeroInfNanPreserve for 64 bits
    too: a device with it for 32 bits only is refused, naming the 64-bit property."""
    from types import SimpleNamespace

    from kf.runtime.abi import KernelABI
    from kf.runtime.vulkan_device import Device, VulkanError

    features = {"shaderFloat64": True, "shaderSignedZeroInfNanPreserveFloat32": True,
                "shaderSignedZeroInfNanPreserveFloat64": False}
    device = SimpleNamespace(features=features, name="a device",
                             target_limits=lambda: SimpleNamespace(subgroup_ops=()))
    kernel = KernelABI("k", (0, 1), extra={"spirv_capabilities": ["Shader", "Float64", "SignedZeroInfNanPreserve"]})
    with pytest.raises(VulkanError, match="shaderSignedZeroInfNanPreserveFloat64"):
        Device.require(device, kernel)
    features["shaderFloat64"] = False
    with pytest.raises(VulkanError, match="Float64 \\(needs shaderFloat64\\)"):
        Device.require(device, kernel)
