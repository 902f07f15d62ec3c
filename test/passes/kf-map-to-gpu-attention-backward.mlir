// kf-map-to-gpu on an attention backward (passes/strategies/attention/backward/): on
// sm_90a the wgmma kernel with its preprocess and postprocess, scheduled around it; on
// SPIR-V the SIMT kernel after its preprocess.
// RUN: kf-opt %s --pass-pipeline='builtin.module(kf-fuse, kf-map-to-gpu{target=cuda chip=sm_90a})' | FileCheck %s
// RUN: kf-opt %s --pass-pipeline='builtin.module(kf-fuse, kf-map-to-gpu{target=spirv})' | FileCheck %s --check-prefix=SPIRV

// bf16 (B, H, S, D) = (2, 4, 300, 128), no mask. The preprocess: a workgroup a 64 rows,
// 5 blocks of the 320 padded rows; the main kernel: a workgroup (384 threads: two
// consumer warpgroups and the producer) a block of 128 keys; the postprocess writes dq
// (the kernel function's first result), which the main kernel does not take. The
// workspace (f32: D and the log2 logsumexp of the 2 x 4 x 320 rows, and their 128 dQ
// sums) is the preprocess's result.
// CHECK-LABEL: func.func @backward
// CHECK: %[[W:.*]] = call @backward_k0_attention_backward_pre({{.*}}) : ({{.*}}) -> tensor<332800xf32>
// CHECK-NEXT: %[[R:.*]]:2 = call @backward_k0_attention_backward({{.*}}, %[[W]])
// CHECK-NEXT: %[[Q:.*]] = call @backward_k0_attention_backward_post({{.*}}, %[[W]])
// CHECK-NEXT: return %[[Q]], %[[R]]#1, %[[R]]#0
// CHECK-LABEL: gpu.func @backward_k0_attention_backward_pre
// CHECK-SAME: kf.grid = array<i64: 5, 8, 1>
// CHECK-LABEL: gpu.func @backward_k0_attention_backward_post
// CHECK-SAME: kf.grid = array<i64: 10, 8, 1>
// CHECK-LABEL: gpu.func @backward_k0_attention_backward(
// CHECK-SAME: kf.block = array<i64: 384, 1, 1>
// CHECK-SAME: kf.grid = array<i64: 3, 8, 1>
// CHECK: nvvm.setmaxregister  decrease 24
// CHECK: nvvm.setmaxregister  increase 240
// CHECK: nvvm.wgmma.mma_async {{.*}} <m = 64, n = 64, k = 16>, D[<f32>, <zero>], A[<bf16>, <one>, <row>], B[<bf16>, <one>, <col>]
// CHECK: llvm.inline_asm has_side_effects "red.global.add.v2.f32

// SPIRV-LABEL: func.func @backward
// SPIRV: %[[W:.*]] = call @backward_k0_attention_backward_pre({{.*}}) : ({{.*}}) -> tensor<2x2400xf32>
// SPIRV-NEXT: %[[R:.*]]:3 = call @backward_k0_attention_backward({{.*}}, %[[W]])
// SPIRV-LABEL: gpu.func @backward_k0_attention_backward_pre
// SPIRV-LABEL: gpu.func @backward_k0_attention_backward(
// SPIRV-SAME: kf.strategy = "attention_backward"
func.func @backward(%q: tensor<2x4x300x128xbf16>, %k: tensor<2x4x300x128xbf16>, %v: tensor<2x4x300x128xbf16>, %o: tensor<2x4x300x128xbf16>, %lse: tensor<2x4x300xf32>, %do: tensor<2x4x300x128xbf16>) -> (tensor<2x4x300x128xbf16>, tensor<2x4x300x128xbf16>, tensor<2x4x300x128xbf16>) {
  %kt = "kf.transpose"(%k) {perm = array<i64: 0, 1, 3, 2>} : (tensor<2x4x300x128xbf16>) -> tensor<2x4x128x300xbf16>
  %s = "kf.matmul"(%q, %kt) : (tensor<2x4x300x128xbf16>, tensor<2x4x128x300xbf16>) -> tensor<2x4x300x300xbf16>
  %c = "kf.fill"() {value = 11.313708498984761 : f64} : () -> tensor<bf16>
  %x = "kf.div"(%s, %c) : (tensor<2x4x300x300xbf16>, tensor<bf16>) -> tensor<2x4x300x300xbf16>
  %xf = "kf.cast"(%x) : (tensor<2x4x300x300xbf16>) -> tensor<2x4x300x300xf32>
  %l1 = "kf.reshape"(%lse) : (tensor<2x4x300xf32>) -> tensor<2x4x300x1xf32>
  %d = "kf.sub"(%xf, %l1) : (tensor<2x4x300x300xf32>, tensor<2x4x300x1xf32>) -> tensor<2x4x300x300xf32>
  %e = "kf.exp"(%d) : (tensor<2x4x300x300xf32>) -> tensor<2x4x300x300xf32>
  %p = "kf.cast"(%e) : (tensor<2x4x300x300xf32>) -> tensor<2x4x300x300xbf16>
  %pt = "kf.transpose"(%p) {perm = array<i64: 0, 1, 3, 2>} : (tensor<2x4x300x300xbf16>) -> tensor<2x4x300x300xbf16>
  %dv = "kf.matmul"(%pt, %do) : (tensor<2x4x300x300xbf16>, tensor<2x4x300x128xbf16>) -> tensor<2x4x300x128xbf16>
  %vt = "kf.transpose"(%v) {perm = array<i64: 0, 1, 3, 2>} : (tensor<2x4x300x128xbf16>) -> tensor<2x4x128x300xbf16>
  %dp = "kf.matmul"(%do, %vt) : (tensor<2x4x300x128xbf16>, tensor<2x4x128x300xbf16>) -> tensor<2x4x300x300xbf16>
  %dpf = "kf.cast"(%dp) : (tensor<2x4x300x300xbf16>) -> tensor<2x4x300x300xf32>
  %pf = "kf.cast"(%p) : (tensor<2x4x300x300xbf16>) -> tensor<2x4x300x300xf32>
  %mul = "kf.mul"(%dpf, %pf) : (tensor<2x4x300x300xf32>, tensor<2x4x300x300xf32>) -> tensor<2x4x300x300xf32>
  %dof = "kf.cast"(%do) : (tensor<2x4x300x128xbf16>) -> tensor<2x4x300x128xf32>
  %of = "kf.cast"(%o) : (tensor<2x4x300x128xbf16>) -> tensor<2x4x300x128xf32>
  %dd = "kf.mul"(%dof, %of) : (tensor<2x4x300x128xf32>, tensor<2x4x300x128xf32>) -> tensor<2x4x300x128xf32>
  %dsum = "kf.sum"(%dd) {dims = array<i64: -1>, keepdim = true} : (tensor<2x4x300x128xf32>) -> tensor<2x4x300x1xf32>
  %mul1 = "kf.mul"(%pf, %dsum) : (tensor<2x4x300x300xf32>, tensor<2x4x300x1xf32>) -> tensor<2x4x300x300xf32>
  %sub = "kf.sub"(%mul, %mul1) : (tensor<2x4x300x300xf32>, tensor<2x4x300x300xf32>) -> tensor<2x4x300x300xf32>
  %ds = "kf.cast"(%sub) : (tensor<2x4x300x300xf32>) -> tensor<2x4x300x300xbf16>
  %dss = "kf.div"(%ds, %c) : (tensor<2x4x300x300xbf16>, tensor<bf16>) -> tensor<2x4x300x300xbf16>
  %dq = "kf.matmul"(%dss, %k) : (tensor<2x4x300x300xbf16>, tensor<2x4x300x128xbf16>) -> tensor<2x4x300x128xbf16>
  %qt = "kf.transpose"(%q) {perm = array<i64: 0, 1, 3, 2>} : (tensor<2x4x300x128xbf16>) -> tensor<2x4x128x300xbf16>
  %dkt = "kf.matmul"(%qt, %dss) : (tensor<2x4x128x300xbf16>, tensor<2x4x300x300xbf16>) -> tensor<2x4x128x300xbf16>
  %dk = "kf.transpose"(%dkt) {perm = array<i64: 0, 1, 3, 2>} : (tensor<2x4x128x300xbf16>) -> tensor<2x4x300x128xbf16>
  return %dq, %dk, %dv : tensor<2x4x300x128xbf16>, tensor<2x4x300x128xbf16>, tensor<2x4x300x128xbf16>
}
