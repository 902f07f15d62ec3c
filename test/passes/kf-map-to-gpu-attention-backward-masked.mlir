// kf-map-to-gpu on the seed's masked attention backward (bf16, (B, H, S, D) = (2, 8, 257,
// 64), a [S, S] mask every head shares) for sm_90a: the wgmma kernel, its preprocess
// classifying the mask's blocks as well. The preprocess: 3 x 3 table workgroups (a key
// block of 128 and a query block of 128 each) in the grid's first column, then the 6
// row workgroups of the 384 padded rows. The workspace: D, the log2 logsumexp and the
// 64 dQ sums of the 2 x 8 x 384 rows, the 9 codes, a dead-row flag and a 64-float dV
// share a 64 rows. The main kernel walks its key block's column of the table (a warp
// ballot a 32 query blocks, counted by popc) and reads a partial block's mask.
// RUN: kf-opt %s --pass-pipeline='builtin.module(kf-fuse, kf-map-to-gpu{target=cuda chip=sm_90a})' | FileCheck %s

// CHECK-LABEL: func.func @backward
// CHECK: %[[W:.*]] = call @backward_k0_attention_backward_pre({{.*}}) : ({{.*}}) -> tensor<411753xf32>
// CHECK-NEXT: %[[R:.*]]:2 = call @backward_k0_attention_backward({{.*}}, %[[W]])
// CHECK-NEXT: %[[Q:.*]] = call @backward_k0_attention_backward_post({{.*}}, %[[W]])
// CHECK-LABEL: gpu.func @backward_k0_attention_backward_pre
// CHECK-SAME: kf.grid = array<i64: 7, 16, 1>
// CHECK: nvvm.barrier #nvvm.reduction<and>
// CHECK-LABEL: gpu.func @backward_k0_attention_backward(
// CHECK-SAME: kf.block = array<i64: 384, 1, 1>
// CHECK-SAME: kf.grid = array<i64: 3, 16, 1>
// CHECK: nvvm.setmaxregister  decrease 24
// CHECK: nvvm.vote.sync  ballot
// CHECK: llvm.intr.ctpop
// CHECK: nvvm.setmaxregister  increase 240
// CHECK: nvvm.vote.sync  ballot
// CHECK: llvm.intr.ctpop
// CHECK: nvvm.barrier id = {{.*}} number_of_threads
// CHECK: scf.for
// CHECK: nvvm.wgmma.mma_async
func.func @backward(%q: tensor<2x8x257x64xbf16>, %k: tensor<2x8x257x64xbf16>, %v: tensor<2x8x257x64xbf16>, %mask: tensor<257x257xf32>, %o: tensor<2x8x257x64xbf16>, %lse: tensor<2x8x257xf32>, %do: tensor<2x8x257x64xbf16>) -> (tensor<2x8x257x64xbf16>, tensor<2x8x257x64xbf16>, tensor<2x8x257x64xbf16>) {
  %kt = "kf.transpose"(%k) {perm = array<i64: 0, 1, 3, 2>} : (tensor<2x8x257x64xbf16>) -> tensor<2x8x64x257xbf16>
  %s = "kf.matmul"(%q, %kt) : (tensor<2x8x257x64xbf16>, tensor<2x8x64x257xbf16>) -> tensor<2x8x257x257xbf16>
  %eight = "kf.fill"() {value = 8.0 : f64} : () -> tensor<bf16>
  %sc = "kf.div"(%s, %eight) : (tensor<2x8x257x257xbf16>, tensor<bf16>) -> tensor<2x8x257x257xbf16>
  %zero = "kf.fill"() {value = 0.0 : f64} : () -> tensor<f32>
  %m = "kf.cmp"(%mask, %zero) {predicate = "eq"} : (tensor<257x257xf32>, tensor<f32>) -> tensor<257x257xi1>
  %fill = "kf.fill"() {value = -1.0e9 : f64} : () -> tensor<bf16>
  %x = "kf.select"(%m, %fill, %sc) : (tensor<257x257xi1>, tensor<bf16>, tensor<2x8x257x257xbf16>) -> tensor<2x8x257x257xbf16>
  %xf = "kf.cast"(%x) : (tensor<2x8x257x257xbf16>) -> tensor<2x8x257x257xf32>
  %l1 = "kf.reshape"(%lse) : (tensor<2x8x257xf32>) -> tensor<2x8x257x1xf32>
  %d = "kf.sub"(%xf, %l1) : (tensor<2x8x257x257xf32>, tensor<2x8x257x1xf32>) -> tensor<2x8x257x257xf32>
  %e = "kf.exp"(%d) : (tensor<2x8x257x257xf32>) -> tensor<2x8x257x257xf32>
  %p = "kf.cast"(%e) : (tensor<2x8x257x257xf32>) -> tensor<2x8x257x257xbf16>
  %pt = "kf.transpose"(%p) {perm = array<i64: 0, 1, 3, 2>} : (tensor<2x8x257x257xbf16>) -> tensor<2x8x257x257xbf16>
  %dv = "kf.matmul"(%pt, %do) : (tensor<2x8x257x257xbf16>, tensor<2x8x257x64xbf16>) -> tensor<2x8x257x64xbf16>
  %vt = "kf.transpose"(%v) {perm = array<i64: 0, 1, 3, 2>} : (tensor<2x8x257x64xbf16>) -> tensor<2x8x64x257xbf16>
  %dp = "kf.matmul"(%do, %vt) : (tensor<2x8x257x64xbf16>, tensor<2x8x64x257xbf16>) -> tensor<2x8x257x257xbf16>
  %dpf = "kf.cast"(%dp) : (tensor<2x8x257x257xbf16>) -> tensor<2x8x257x257xf32>
  %pf = "kf.cast"(%p) : (tensor<2x8x257x257xbf16>) -> tensor<2x8x257x257xf32>
  %mul = "kf.mul"(%dpf, %pf) : (tensor<2x8x257x257xf32>, tensor<2x8x257x257xf32>) -> tensor<2x8x257x257xf32>
  %dof = "kf.cast"(%do) : (tensor<2x8x257x64xbf16>) -> tensor<2x8x257x64xf32>
  %of = "kf.cast"(%o) : (tensor<2x8x257x64xbf16>) -> tensor<2x8x257x64xf32>
  %dd = "kf.mul"(%dof, %of) : (tensor<2x8x257x64xf32>, tensor<2x8x257x64xf32>) -> tensor<2x8x257x64xf32>
  %dsum = "kf.sum"(%dd) {dims = array<i64: -1>, keepdim = true} : (tensor<2x8x257x64xf32>) -> tensor<2x8x257x1xf32>
  %mul1 = "kf.mul"(%pf, %dsum) : (tensor<2x8x257x257xf32>, tensor<2x8x257x1xf32>) -> tensor<2x8x257x257xf32>
  %sub = "kf.sub"(%mul, %mul1) : (tensor<2x8x257x257xf32>, tensor<2x8x257x257xf32>) -> tensor<2x8x257x257xf32>
  %ds = "kf.cast"(%sub) : (tensor<2x8x257x257xf32>) -> tensor<2x8x257x257xbf16>
  %zb = "kf.fill"() {value = 0.0 : f64} : () -> tensor<bf16>
  %dsm = "kf.select"(%m, %zb, %ds) : (tensor<257x257xi1>, tensor<bf16>, tensor<2x8x257x257xbf16>) -> tensor<2x8x257x257xbf16>
  %dss = "kf.div"(%dsm, %eight) : (tensor<2x8x257x257xbf16>, tensor<bf16>) -> tensor<2x8x257x257xbf16>
  %dq = "kf.matmul"(%dss, %k) : (tensor<2x8x257x257xbf16>, tensor<2x8x257x64xbf16>) -> tensor<2x8x257x64xbf16>
  %qt = "kf.transpose"(%q) {perm = array<i64: 0, 1, 3, 2>} : (tensor<2x8x257x64xbf16>) -> tensor<2x8x64x257xbf16>
  %dkt = "kf.matmul"(%qt, %dss) : (tensor<2x8x64x257xbf16>, tensor<2x8x257x257xbf16>) -> tensor<2x8x64x257xbf16>
  %dk = "kf.transpose"(%dkt) {perm = array<i64: 0, 1, 3, 2>} : (tensor<2x8x64x257xbf16>) -> tensor<2x8x257x64xbf16>
  return %dq, %dk, %dv : tensor<2x8x257x64xbf16>, tensor<2x8x257x64xbf16>, tensor<2x8x257x64xbf16>
}

// -----

