"""kf-to-spirv's bound on the loop iterations of one invocation (``loop_iterations``),
which the Vulkan launcher compares with the device's limit: lavapipe stops a shader
invocation after 65535 loop iterations in all and silently drops the rest of its work.
The bound is checked here on hand-written kernels, against the count the loops really
make; the launcher's refusal is in test/python/runtime/test_vulkan.py."""

from __future__ import annotations

import pytest

from kf.passes.to_spirv import compile_spirv, loop_iterations
from mlir import ir


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
