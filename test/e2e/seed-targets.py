# RUN: %PYTHON %s | FileCheck %s
# REQUIRES: ptxas, spirv-val, spirv-cross
# The seed's functions compiled for every GPU target without running them: PTX that
# ptxas assembles for sm_80 and sm_90, SPIR-V that spirv-val accepts, MSL from SPIRV-Cross.
import torch

import kf
from kf.passes.to_cuda import assemble
from moe import moe_layer_fused
from seed_examples import fused_attention, metal_layer_norm

x, w, b = torch.randn(1, 257, 1000), torch.randn(1000), torch.randn(1000)
q = torch.randn(1, 2, 257, 64)
mask = torch.ones(257, 257)
xm, gate, w_in, w_out = torch.randn(1, 5, 64), torch.randn(4, 64), torch.randn(4, 64, 96), torch.randn(4, 96, 64)

for chip in ("sm_80", "sm_90"):
    for name, fn, args in [("layer_norm", metal_layer_norm.with_options(target="cuda", arch=chip), (x, w, b)),
                           ("attention", fused_attention.with_options(arch=chip), (q, q, q, mask)),
                           ("moe", moe_layer_fused.with_options(arch=chip), (xm, gate, [w_in, w_out]))]:
        ptx = kf.inspect(fn, *args).ptx
        report = assemble(ptx, chip).kernels
        print(f"PTX {name} {chip}: .target {chip} in PTX: {('.target ' + chip) in ptx}, kernels: {len(report)}, "
              f"spills: {sum(k['spill_store_bytes'] for k in report.values())}")
# CHECK: PTX layer_norm sm_80: .target sm_80 in PTX: True, kernels: 1, spills: 0
# CHECK: PTX attention sm_80: .target sm_80 in PTX: True, kernels: 1
# CHECK: PTX moe sm_80: .target sm_80 in PTX: True
# CHECK: PTX layer_norm sm_90: .target sm_90 in PTX: True, kernels: 1, spills: 0
# CHECK: PTX attention sm_90: .target sm_90 in PTX: True, kernels: 1
# CHECK: PTX moe sm_90: .target sm_90 in PTX: True

ln = kf.inspect(metal_layer_norm, x, w, b)
print(ln.spirv)
# CHECK: OpEntryPoint GLCompute %{{.*}} "metal_layer_norm_k0_rowwise"
# CHECK: OpControlBarrier
print(ln.msl)
# CHECK: #include <metal_stdlib>
# CHECK: kernel void metal_layer_norm_k0_rowwise(
# CHECK-SAME: {{\[\[buffer\(0\)\]\]}}
# CHECK: threadgroup float
# CHECK: threadgroup_barrier(mem_flags::mem_threadgroup)

att = kf.inspect(fused_attention.with_options(target="metal"), q, q, q, mask)
print(att.msl)
# CHECK: kernel void fused_attention_k0_attention(
# CHECK: threadgroup
