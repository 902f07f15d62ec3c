"""kf-to-spirv's bound on the loop iterations of one invocation (``loop_iterations``),
which the Vulkan launcher compares with the device's limit: lavapipe stops a shader
invocation after 65535 loop iterations in all and silently drops the rest of its work.
The bound is checked here on hand-written kernels, against the count the loops really
make; the launcher's refusal is in test/python/runtime/test_vulkan.py.

kf-to-spirv's IEEE guarantees, run for real: inf, NaN and signed zeros come out of Vulkan
kernels as torch eager gives them (the SignedZeroInfNanPreserve execution mode, and the
rewrite of arithmetic on a literal +0.0, which lavapipe's code generator folds). The same
functions run on the cpu target, whose folds (kf-canonicalize) must keep those values too.
"""

from __future__ import annotations

import math

import shutil

import pytest
import torch
from mlir import ir

import kf
from kf.passes.to_spirv import compile_spirv, loop_iterations
from kf.runtime import vulkan


def kernel(body: str, block: int = 128) -> str:
    attrs = f"known_block_size = array<i32: {block}, 1, 1>"
    return f"""
module attributes {{gpu.container_module}} {{
  gpu.module @kf_kernels {{
    gpu.func @k(%a: memref<1000000xf32>, %n: memref<i32>, %c: memref<1000000xf32>) kernel attributes {{{attrs}}} {{
      %c0 = arith.constant 0 : index
      %c1 = arith.constant 1 : index
      %tid = gpu.thread_id x
      %bid = gpu.block_id x
      {body}
      gpu.return
    }}
  }}
}}
"""


def bound(text: str) -> int:
    with ir.Context() as ctx, ir.Location.unknown():
        ctx.load_all_available_dialects()
        module = ir.Module.parse(text)
        found = []
        module.operation.walk(lambda op: (found.append(op.operation) if op.name == "gpu.func" else None)
                              or ir.WalkResult.ADVANCE)
        return loop_iterations(found[0])


NESTED = """
      %c7 = arith.constant 7 : index
      %c300 = arith.constant 300 : index
      scf.for %i = %c0 to %c300 step %c1 {
        scf.for %j = %c0 to %c7 step %c1 {
          %x = memref.load %a[%j] : memref<1000000xf32>
          memref.store %x, %c[%j] : memref<1000000xf32>
        }
      }"""

# a grid-stride loop: starts at the thread's index, steps by the grid's threads
GRID_STRIDE = """
      %c128 = arith.constant 128 : index
      %total = arith.constant 1000000 : index
      %step = arith.constant 16384 : index
      %base = arith.muli %bid, %c128 : index
      %start = arith.addi %base, %tid : index
      scf.for %i = %start to %total step %step {
        %x = memref.load %a[%i] : memref<1000000xf32>
        memref.store %x, %c[%i] : memref<1000000xf32>
      }"""

# both branches of an if (a SIMD group runs both), and a bound from a thread's row
BRANCHES = """
      %c50 = arith.constant 50 : index
      %c10 = arith.constant 10 : index
      %row = arith.divui %tid, %c10 : index
      %ub = arith.addi %row, %c1 : index
      %odd = arith.cmpi ult, %tid, %c50 : index
      scf.if %odd {
        scf.for %i = %c0 to %c50 step %c1 {
          %x = memref.load %a[%i] : memref<1000000xf32>
          memref.store %x, %c[%i] : memref<1000000xf32>
        }
      } else {
        scf.for %i = %c0 to %ub step %c1 {
          %x = memref.load %a[%i] : memref<1000000xf32>
          memref.store %x, %c[%i] : memref<1000000xf32>
        }
      }"""

# a trip count read from memory: no bound
FROM_MEMORY = """
      %m = memref.load %n[] : memref<i32>
      %ub = arith.index_cast %m : i32 to index
      scf.for %i = %c0 to %ub step %c1 {
        %x = memref.load %a[%i] : memref<1000000xf32>
        memref.store %x, %c[%i] : memref<1000000xf32>
      }"""


@pytest.mark.parametrize("body,want", [
    ("", 0),
    (NESTED, 301 + 300 * 8),  # each loop: its trips and its exit test
    (GRID_STRIDE, 62 + 1),  # ceil(1000000 / 16384) from thread 0 of block 0
    (BRANCHES, 51 + (127 // 10 + 1) + 1),
    (FROM_MEMORY, -1),
], ids=["none", "nested", "grid_stride", "branches", "from_memory"])
def test_loop_iterations(body, want):
    assert bound(kernel(body)) == want


# run-time sizes: the last argument holds them (kf.size_slots), each from 1 to the bound;
# a cumulative sum's loop runs to its element's index along the run-time dim plus one
RUN_TIME = """
module attributes {gpu.container_module} {
  gpu.module @kf_kernels {
    gpu.func @k(%a: memref<1000000xf32>, %s: memref<2xi32>) kernel attributes {
        known_block_size = array<i32: 128, 1, 1>, kf.size_slots = [array<i64: 0, 1>]LARGEST} {
      %c0 = arith.constant 0 : index
      %c1 = arith.constant 1 : index
      %cb = arith.constant 4096 : index
      %tid = gpu.thread_id x
      %m = memref.load %s[%c0] : memref<2xi32>
      %n0 = arith.index_cast %m : i32 to index
      %n = arith.minui %n0, %cb : index
      %j = arith.remui %tid, %n : index
      %row = arith.divui %tid, %n : index
      %ub = arith.addi %j, %c1 : index
      scf.for %i = %c0 to %ub step %c1 {
        %x = memref.load %a[%i] : memref<1000000xf32>
        memref.store %x, %a[%row] : memref<1000000xf32>
      }
      gpu.return
    }
  }
}
"""


@pytest.mark.parametrize("largest,want", [("", 127 + 1 + 1), (", kf.largest_slot = 40 : i64", 40 + 1)])
def test_loop_iterations_over_run_time_sizes(largest, want):
    """A loop bounded by a run-time size (its remainder by one) counts the bound: the
    size is at least 1 and at most the plan's largest, so lavapipe's launcher takes it."""
    assert bound(RUN_TIME.replace("LARGEST", largest)) == want


def test_loop_iterations_recorded_for_the_launcher():
    """compile_spirv records the bound in each kernel's ABI (what runtime/vulkan.py reads)."""
    [binary] = compile_spirv(kernel(NESTED))
    [k] = binary.kernels.values()
    assert k.loop_iterations == 301 + 300 * 8 and k.abi_extra()["loop_iterations"] == k.loop_iterations


# ----------------------------------------------------------------------------- IEEE values

INF, NAN = math.inf, math.nan
#: every class of float: infinities, NaN, both zeros, normal values of both signs, the
#: largest. (No subnormals: Vulkan lets a device flush them, and lavapipe does.)
SPECIAL = [INF, -INF, NAN, 0.0, -0.0, 1.0, -1.0, 2.5, -0.75, 3.0e38, -3.0e38]

#: functions whose results are exact in IEEE arithmetic: compared bit for bit (NaN to NaN,
#: and the sign of every zero)
EXACT = {
    "x*0": lambda x: x * 0.0, "0*x": lambda x: 0.0 * x, "x*-0": lambda x: x * -0.0,
    "x+0": lambda x: x + 0.0, "0+x": lambda x: 0.0 + x, "x+-0": lambda x: x + -0.0,
    "x-0": lambda x: x - 0.0, "0-x": lambda x: 0.0 - x, "x--0": lambda x: x - -0.0,
    "x/0": lambda x: x / 0.0, "0/x": lambda x: 0.0 / x, "x/-0": lambda x: x / -0.0,
    "x*1": lambda x: x * 1.0, "x/1": lambda x: x / 1.0, "x-x": lambda x: x - x, "x/x": lambda x: x / x,
    "x*x": lambda x: x * x, "x*inf": lambda x: x * INF, "neg": lambda x: -x, "2x+0": lambda x: x * 2.0 + 0.0,
    "where": lambda x: torch.where(x > 0, x, 0.0),
}
#: transcendental functions: NaN and inf where eager has them, zeros with eager's sign,
#: the rest within float32's tolerance
APPROX = {
    "exp": lambda x: torch.exp(x), "sqrt": lambda x: torch.sqrt(x), "tanh": lambda x: torch.tanh(x),
    "sigmoid": lambda x: torch.sigmoid(x), "silu": lambda x: torch.nn.functional.silu(x),
    "erf": lambda x: torch.erf(x), "rsqrt": lambda x: torch.rsqrt(x),
}

TARGETS = ["cpu", pytest.param("vulkan", marks=pytest.mark.skipif(not vulkan.is_available(),
                                                                  reason="no Vulkan device"))]


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("KF_CACHE_DIR", str(tmp_path))


def _same_specials(x: torch.Tensor, got: torch.Tensor, want: torch.Tensor) -> list[str]:
    """Where got and want disagree on NaN, inf or the sign of a zero."""
    bad = []
    for a, g, w in zip(x.tolist(), got.tolist(), want.tolist()):
        if math.isnan(w) != math.isnan(g) or (math.isinf(w) and g != w) or \
                (w == 0 and (g != 0 or math.copysign(1, g) != math.copysign(1, w))):
            bad.append(f"x={a}: {g} != eager's {w}")
    return bad


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("name", sorted(EXACT))
def test_exact_ops_keep_inf_nan_and_signed_zeros(target, name):
    fn = EXACT[name]
    # a 1-element, a prime-sized and a 257-element tensor of the special values (scalar
    # and vectorized paths)
    for n in (1, len(SPECIAL), 257):
        x = torch.tensor(SPECIAL * (n // len(SPECIAL) + 1))[:n] if n > 1 else torch.tensor([-0.0])
        got = kf.jit(fn, target=target)(x.clone())
        want = fn(x.clone())
        assert got.dtype == want.dtype and got.shape == want.shape
        assert not _same_specials(x, got, want), f"{name} on {target}: {_same_specials(x, got, want)[:4]}"
        finite = torch.isfinite(want)
        assert torch.equal(got[finite], want[finite]), f"{name} on {target}: {got} != {want}"


@pytest.mark.parametrize("target", TARGETS)
@pytest.mark.parametrize("name", sorted(APPROX))
def test_math_keeps_inf_nan_and_signed_zeros(target, name):
    fn = APPROX[name]
    x = torch.tensor(SPECIAL)
    got = kf.jit(fn, target=target)(x.clone())
    want = fn(x.clone())
    assert not _same_specials(x, got, want), f"{name} on {target}: {_same_specials(x, got, want)}"
    torch.testing.assert_close(got, want, equal_nan=True)


@pytest.mark.skipif(not vulkan.is_available(), reason="no Vulkan device")
def test_kernels_ask_for_signed_zero_inf_nan_preserve():
    """Every float kernel's recorded capabilities include SignedZeroInfNanPreserve (the
    launcher refuses it on a device without shaderSignedZeroInfNanPreserveFloat32)."""
    from kf.passes.to_spirv import compile_spirv

    text = """
    module attributes {gpu.container_module} {
      gpu.module @kf_kernels {
        gpu.func @scale(%a: memref<8xf32>, %o: memref<8xf32>) kernel
            attributes {known_block_size = array<i32: 8, 1, 1>} {
          %i = gpu.thread_id x
          %x = memref.load %a[%i] : memref<8xf32>
          %zero = arith.constant 0.0 : f32
          %y = arith.mulf %x, %zero : f32
          memref.store %y, %o[%i] : memref<8xf32>
          gpu.return
        }
      }
    }"""
    (binary,) = compile_spirv(text)
    kernel = binary.kernels["scale"]
    assert "SignedZeroInfNanPreserve" in kernel.capabilities
    assert "SPV_KHR_float_controls" in kernel.extensions
    assert vulkan.device().features["shaderSignedZeroInfNanPreserveFloat32"]


@pytest.mark.skipif(not vulkan.is_available(), reason="no Vulkan device")
@pytest.mark.parametrize("name", sorted(EXACT) + sorted(APPROX))
def test_every_float_kernel_declares_the_preserve_mode(name):
    """Every entry point of every kernel that has f32 values -- also one of compares and
    selects only (``where``; ``x + 0``, rewritten so) -- declares SignedZeroInfNanPreserve
    for 32 bits: a driver may otherwise assume no NaN and no -0.0 (NVIDIA's does), and
    ``x > 0 ? x : 0`` drops NaN. The device's other float controls follow its limits
    (lavapipe: RoundingModeRTE, no DenormPreserve)."""
    import re

    fn = {**EXACT, **APPROX}[name]
    for n in (1, len(SPECIAL), 257):
        spirv = kf.inspect(kf.jit(fn, target="vulkan"), torch.ones(n)).stages.get("spirv")
        if spirv is None:
            continue  # no kernel: kf returns the input (x * 1)
        entries = re.findall(r"OpEntryPoint GLCompute %(\w+)", spirv)
        assert entries
        floats = vulkan.device().target_limits().float_controls
        for e in entries:
            assert f"OpExecutionMode %{e} SignedZeroInfNanPreserve 32" in spirv, (name, n)
            assert (f"OpExecutionMode %{e} RoundingModeRTE 32" in spirv) == ("rte32" in floats), (name, n)
            assert (f"OpExecutionMode %{e} DenormPreserve 32" in spirv) == ("denorm32" in floats), (name, n)


@pytest.mark.skipif(shutil.which("spirv-dis") is None, reason="needs spirv-dis (SPIRV-Tools)")
def test_entry_points_list_their_own_workgroup_arrays(tmp_path):
    """SPIR-V 1.4 interfaces: each entry point of a module of several kernels names the
    workgroup arrays (and buffers) it uses and no other kernel's, so a driver counts only
    its own against maxComputeSharedMemorySize (under 1.3 it could not tell them apart:
    kf's MoE module, each kernel within 32 KiB, was counted 50 KiB per entry point)."""
    import re
    import subprocess

    def func(name, n):
        return f"""
    gpu.func @{name}(%a: memref<{n}xf32>, %o: memref<{n}xf32>) workgroup(%w: memref<{n}xf32, #gpu.address_space<workgroup>>)
        kernel attributes {{known_block_size = array<i32: {n}, 1, 1>}} {{
      %i = gpu.thread_id x
      %x = memref.load %a[%i] : memref<{n}xf32>
      memref.store %x, %w[%i] : memref<{n}xf32, #gpu.address_space<workgroup>>
      gpu.barrier
      %y = memref.load %w[%i] : memref<{n}xf32, #gpu.address_space<workgroup>>
      memref.store %y, %o[%i] : memref<{n}xf32>
      gpu.return
    }}"""

    text = (f"module attributes {{gpu.container_module}} {{ gpu.module @kf_kernels {{"
            f"{func('small', 64)}{func('large', 1024)} }} }}")
    (binary,) = compile_spirv(text)
    path = tmp_path / "k.spv"
    path.write_bytes(binary.binary)
    dis = subprocess.run(["spirv-dis", str(path)], capture_output=True, text=True).stdout
    assert "; Version: 1.4" in dis
    workgroup = {m.group(1): int(m.group(2)) for m in re.finditer(
        r"(%\w+) = OpVariable %_ptr_Workgroup__arr_float_uint_(\d+) Workgroup", dis)}
    assert sorted(workgroup.values()) == [64, 1024]
    for entry, n in (("small", 64), ("large", 1024)):
        interface = re.search(rf'OpEntryPoint GLCompute %\w+ "{entry}" (.*)', dis).group(1).split()
        assert [workgroup[v] for v in interface if v in workgroup] == [n], (entry, interface)
        assert binary.kernels[entry].workgroup_bytes == 4 * n


#: float64 functions SPIR-V computes in f64 (GLSL.std.450 has their instructions for 64 bits)
FLOAT64 = {
    "double": lambda x: x.double(),
    "arith": lambda x: x.double() * 3.0 + x.double() / 7.0 - 1.0,
    "full_like": lambda x: torch.full_like(x, 4.412055988104102, dtype=torch.float64),
    "sqrt_floor": lambda x: torch.sqrt(x.double().abs()) + torch.floor(x.double()),
    "back_to_float": lambda x: (x.double() * 1e-3).float(),
}


@pytest.mark.skipif(not vulkan.is_available() or not vulkan.device().features.get("shaderFloat64"),
                    reason="no Vulkan device with shaderFloat64")
@pytest.mark.parametrize("name", sorted(FLOAT64))
def test_float64_tensors_on_vulkan(name):
    """float64 buffers and arithmetic are f64 in the SPIR-V (the Float64 capability, which
    the launcher asks of the device): the values are eager's to within a few float64 ulps
    (a Vulkan sqrt may be off by one), far below what an f32 computation would give."""
    fn = FLOAT64[name]
    torch.manual_seed(0)
    for x in (torch.randn(1), torch.randn(7), torch.randn(257) * 100, torch.randn(0),
              torch.randn(6, 9).t()):  # sizes 1, prime, 257, 0 and a non-contiguous view
        got = kf.jit(fn, target="vulkan")(x)
        want = fn(x)
        assert got.dtype == want.dtype and got.shape == want.shape, name
        torch.testing.assert_close(got, want, rtol=1e-13, atol=1e-13)


def test_float64_transcendental_math_is_refused_on_spirv():
    """sin of float64 values has no GLSL.std.450 instruction (nor a kf expansion): refused
    at the user's line, never computed in f32 (a float64 result with float32's precision)."""
    if not vulkan.is_available():
        pytest.skip("no Vulkan device")
    with pytest.raises(kf.CompileError) as info:
        kf.jit(lambda x: torch.sin(x.double()), target="vulkan")(torch.randn(5))
    text = str(info.value)
    assert "sin of float64 values is not supported on SPIR-V targets" in text
    assert "test_to_spirv.py" in text  # the user's line


F64_KERNEL = """
module attributes {gpu.container_module} {
  gpu.module @kf_kernels {
    gpu.func @twice(%a: memref<8xf64>, %o: memref<8xf64>) kernel attributes {known_block_size = array<i32: 8, 1, 1>} {
      %i = gpu.thread_id x
      %x = memref.load %a[%i] : memref<8xf64>
      %y = arith.addf %x, %x : f64
      memref.store %y, %o[%i] : memref<8xf64>
      gpu.return
    }
  }
}"""


def test_float64_kernels_record_the_float64_capability():
    """An f64 kernel's bindings are f64 buffers and its capabilities name Float64 (and the
    64-bit float controls), which the Vulkan launcher checks against shaderFloat64."""
    (binary,) = compile_spirv(F64_KERNEL)
    k = binary.kernels["twice"]
    assert [b.storage for b in k.bindings] == ["f64", "f64"]
    assert "Float64" in k.capabilities


def test_float64_kernels_are_refused_by_metal():
    """Metal has no double: kf-to-metal refuses an f64 kernel with a clear error."""
    import shutil

    from kf.passes.base import PassError
    from kf.passes.to_metal import compile_metal

    if shutil.which("spirv-cross") is None:
        pytest.skip("no spirv-cross")
    with pytest.raises(PassError, match="float64, which Metal does not have"):
        compile_metal(F64_KERNEL)
