// RUN: kf-opt %s --split-input-file --pass-pipeline='builtin.module(kf-fuse)' | FileCheck %s

// The backward of the seed's masked attention as kf's autograd writes it (bf16; the
// scores and P = exp(x - lse) recomputed, D = rowsum(dO * O) in f32, the mask's and the
// scale's backward): one attention_backward kernel with dq, dk and dv as its results. The
// logsumexp's reshape stays a view in the schedule.
// CHECK-LABEL: func.func private @backward_k0_attention_backward
// CHECK-SAME: -> (tensor<2x8x257x64xbf16>, tensor<2x8x257x64xbf16>, tensor<2x8x257x64xbf16>)
// CHECK-SAME: kf.kernel = "attention_backward"
// CHECK-COUNT-5: "kf.matmul"
// CHECK-NOT: "kf.matmul"
// CHECK-LABEL: func.func @backward
// CHECK-NEXT: "kf.reshape"
// CHECK-NEXT: %[[R:.*]]:3 = call @backward_k0_attention_backward
// CHECK-NEXT: return %[[R]]#1, %[[R]]#2, %[[R]]#0
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

// f32, no mask, the scale a multiplication, dk as (dS^T q): still one kernel.
// CHECK-LABEL: func.func private @plain_k0_attention_backward
// CHECK-SAME: kf.kernel = "attention_backward"
// CHECK-LABEL: func.func @plain
// CHECK-NEXT: "kf.reshape"
// CHECK-NEXT: call @plain_k0_attention_backward
// CHECK-NOT: call
func.func @plain(%q: tensor<1x3x40x16xf32>, %k: tensor<1x3x40x16xf32>, %v: tensor<1x3x40x16xf32>, %o: tensor<1x3x40x16xf32>, %lse: tensor<1x3x40xf32>, %do: tensor<1x3x40x16xf32>) -> (tensor<1x3x40x16xf32>, tensor<1x3x40x16xf32>, tensor<1x3x40x16xf32>) {
  %kt = "kf.transpose"(%k) {perm = array<i64: 0, 1, 3, 2>} : (tensor<1x3x40x16xf32>) -> tensor<1x3x16x40xf32>
  %s = "kf.matmul"(%q, %kt) : (tensor<1x3x40x16xf32>, tensor<1x3x16x40xf32>) -> tensor<1x3x40x40xf32>
  %c = "kf.fill"() {value = 0.25 : f64} : () -> tensor<f32>
  %x = "kf.mul"(%s, %c) : (tensor<1x3x40x40xf32>, tensor<f32>) -> tensor<1x3x40x40xf32>
  %l1 = "kf.reshape"(%lse) : (tensor<1x3x40xf32>) -> tensor<1x3x40x1xf32>
  %d = "kf.sub"(%x, %l1) : (tensor<1x3x40x40xf32>, tensor<1x3x40x1xf32>) -> tensor<1x3x40x40xf32>
  %p = "kf.exp"(%d) : (tensor<1x3x40x40xf32>) -> tensor<1x3x40x40xf32>
  %pt = "kf.transpose"(%p) {perm = array<i64: 0, 1, 3, 2>} : (tensor<1x3x40x40xf32>) -> tensor<1x3x40x40xf32>
  %dv = "kf.matmul"(%pt, %do) : (tensor<1x3x40x40xf32>, tensor<1x3x40x16xf32>) -> tensor<1x3x40x16xf32>
  %vt = "kf.transpose"(%v) {perm = array<i64: 0, 1, 3, 2>} : (tensor<1x3x40x16xf32>) -> tensor<1x3x16x40xf32>
  %dp = "kf.matmul"(%do, %vt) : (tensor<1x3x40x16xf32>, tensor<1x3x16x40xf32>) -> tensor<1x3x40x40xf32>
  %dd = "kf.mul"(%do, %o) : (tensor<1x3x40x16xf32>, tensor<1x3x40x16xf32>) -> tensor<1x3x40x16xf32>
  %dsum = "kf.sum"(%dd) {dims = array<i64: 3>, keepdim = true} : (tensor<1x3x40x16xf32>) -> tensor<1x3x40x1xf32>
  %diff = "kf.sub"(%dp, %dsum) : (tensor<1x3x40x40xf32>, tensor<1x3x40x1xf32>) -> tensor<1x3x40x40xf32>
  %ds = "kf.mul"(%p, %diff) : (tensor<1x3x40x40xf32>, tensor<1x3x40x40xf32>) -> tensor<1x3x40x40xf32>
  %dss = "kf.mul"(%ds, %c) : (tensor<1x3x40x40xf32>, tensor<f32>) -> tensor<1x3x40x40xf32>
  %dq = "kf.matmul"(%dss, %k) : (tensor<1x3x40x40xf32>, tensor<1x3x40x16xf32>) -> tensor<1x3x40x16xf32>
  %dst = "kf.transpose"(%dss) {perm = array<i64: 0, 1, 3, 2>} : (tensor<1x3x40x40xf32>) -> tensor<1x3x40x40xf32>
  %dk = "kf.matmul"(%dst, %q) : (tensor<1x3x40x40xf32>, tensor<1x3x40x16xf32>) -> tensor<1x3x40x16xf32>
  return %dq, %dk, %dv : tensor<1x3x40x16xf32>, tensor<1x3x40x16xf32>, tensor<1x3x40x16xf32>
}

// -----

// D as rowsum(dP * P) -- the softmax's backward as ATen writes it, not rewritten with the
// forward's output -- needs every key of a row before any block: no attention_backward
// kernel; the products and the row-wise softmax backward are kernels of their own.
// CHECK-LABEL: func.func @raw
// CHECK-NOT: attention_backward
func.func @raw(%q: tensor<1x3x40x16xf32>, %k: tensor<1x3x40x16xf32>, %v: tensor<1x3x40x16xf32>, %lse: tensor<1x3x40xf32>, %do: tensor<1x3x40x16xf32>) -> (tensor<1x3x40x16xf32>, tensor<1x3x40x16xf32>, tensor<1x3x40x16xf32>) {
  %kt = "kf.transpose"(%k) {perm = array<i64: 0, 1, 3, 2>} : (tensor<1x3x40x16xf32>) -> tensor<1x3x16x40xf32>
  %s = "kf.matmul"(%q, %kt) : (tensor<1x3x40x16xf32>, tensor<1x3x16x40xf32>) -> tensor<1x3x40x40xf32>
  %l1 = "kf.reshape"(%lse) : (tensor<1x3x40xf32>) -> tensor<1x3x40x1xf32>
  %d = "kf.sub"(%s, %l1) : (tensor<1x3x40x40xf32>, tensor<1x3x40x1xf32>) -> tensor<1x3x40x40xf32>
  %p = "kf.exp"(%d) : (tensor<1x3x40x40xf32>) -> tensor<1x3x40x40xf32>
  %pt = "kf.transpose"(%p) {perm = array<i64: 0, 1, 3, 2>} : (tensor<1x3x40x40xf32>) -> tensor<1x3x40x40xf32>
  %dv = "kf.matmul"(%pt, %do) : (tensor<1x3x40x40xf32>, tensor<1x3x40x16xf32>) -> tensor<1x3x40x16xf32>
  %vt = "kf.transpose"(%v) {perm = array<i64: 0, 1, 3, 2>} : (tensor<1x3x40x16xf32>) -> tensor<1x3x16x40xf32>
  %dp = "kf.matmul"(%do, %vt) : (tensor<1x3x40x16xf32>, tensor<1x3x16x40xf32>) -> tensor<1x3x40x40xf32>
  %mul = "kf.mul"(%dp, %p) : (tensor<1x3x40x40xf32>, tensor<1x3x40x40xf32>) -> tensor<1x3x40x40xf32>
  %dsum = "kf.sum"(%mul) {dims = array<i64: 3>, keepdim = true} : (tensor<1x3x40x40xf32>) -> tensor<1x3x40x1xf32>
  %mul1 = "kf.mul"(%p, %dsum) : (tensor<1x3x40x40xf32>, tensor<1x3x40x1xf32>) -> tensor<1x3x40x40xf32>
  %ds = "kf.sub"(%mul, %mul1) : (tensor<1x3x40x40xf32>, tensor<1x3x40x40xf32>) -> tensor<1x3x40x40xf32>
  %dq = "kf.matmul"(%ds, %k) : (tensor<1x3x40x40xf32>, tensor<1x3x40x16xf32>) -> tensor<1x3x40x16xf32>
  %dst = "kf.transpose"(%ds) {perm = array<i64: 0, 1, 3, 2>} : (tensor<1x3x40x40xf32>) -> tensor<1x3x40x40xf32>
  %dk = "kf.matmul"(%dst, %q) : (tensor<1x3x40x40xf32>, tensor<1x3x40x16xf32>) -> tensor<1x3x40x16xf32>
  return %dq, %dk, %dv : tensor<1x3x40x16xf32>, tensor<1x3x40x16xf32>, tensor<1x3x40x16xf32>
}
