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
