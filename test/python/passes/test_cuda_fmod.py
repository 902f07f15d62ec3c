"""passes/cuda_fmod.py: arith.remf in a gpu.module becomes a call of libdevice's exact
fmod (NVPTX's own frem divides approximately), for scalars, vectors and f16."""

from __future__ import annotations

import pytest
from mlir import ir

from kf.dialects import make_context
from kf.passes.cuda_fmod import lower_fmod

MODULE = """
module attributes {gpu.container_module} {
  gpu.module @m {
    gpu.func @k(%a: f32, %b: f32, %c: vector<2x2xf32>, %d: vector<2x2xf32>, %e: f16, %f: f16, %g: f64, %h: f64,
                %out: memref<1xf32>) kernel {
      %0 = arith.remf %a, %b : f32
      %1 = arith.remf %c, %d : vector<2x2xf32>
      %2 = arith.remf %e, %f : f16
      %3 = arith.remf %g, %h : f64
      gpu.return
    }
  }
}
"""


def test_remf_becomes_libdevice_fmod():
    with make_context():
        module = ir.Module.parse(MODULE)
        gm = next(op for op in module.body.operations if op.operation.name == "gpu.module").operation
        lower_fmod(gm)
        assert gm.verify()
        text = str(gm)
    assert "arith.remf" not in text
    assert text.count("call @__nv_fmodf") == 1 + 4 + 1  # the scalar, each vector element, the f16 in f32
    assert text.count("call @__nv_fmod(") == 1
    assert text.count("func.func private @__nv_fmodf") == 1 and text.count("func.func private @__nv_fmod(") == 1
    assert "arith.truncf" in text and "vector.shape_cast" in text
