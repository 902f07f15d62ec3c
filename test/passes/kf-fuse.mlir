// RUN: kf-opt %s --split-input-file --pass-pipeline='builtin.module(kf-fuse)' | FileCheck %s
// Invalid inputs (Inputs/kf-fuse-invalid.mlir) and options:
// RUN: kf-opt %S/Inputs/kf-fuse-invalid.mlir --split-input-file --verify-diagnostics --pass-pipeline='builtin.module(kf-fuse)'
// RUN: not kf-opt %s --split-input-file --pass-pipeline='builtin.module(kf-fuse{max-ops=4})' 2>&1 | FileCheck %s --check-prefix=BAD-OPTION
// BAD-OPTION: error: pass 'kf-fuse' has no option 'max-ops' (options: none)

// The seed's layer norm is one rowwise kernel: two reductions over the last dim and the
// elementwise ops around them, with the rank-0 eps fill cloned into the kernel.
// CHECK-LABEL: func.func private @layer_norm_k0_rowwise
// CHECK-SAME: (%arg0: tensor<4x1000xf32>, %arg1: tensor<1000xf32>, %arg2: tensor<1000xf32>) -> tensor<4x1000xf32>
// CHECK-SAME: kf.fused_lines = ["ln.py:2", "ln.py:3", "ln.py:4", "ln.py:5"], kf.kernel = "rowwise"
// CHECK: "kf.fill"() {value = 1.000000e-05 : f64} : () -> tensor<f32>
// CHECK: "kf.mean"
// CHECK: "kf.var"
// CHECK: "kf.sqrt"
// CHECK: "kf.add"
// CHECK-LABEL: func.func @layer_norm
// CHECK-NEXT: %[[R:.*]] = call @layer_norm_k0_rowwise(%arg0, %arg1, %arg2)
// CHECK-NEXT: return %[[R]]
func.func @layer_norm(%x: tensor<4x1000xf32>, %w: tensor<1000xf32>, %b: tensor<1000xf32>) -> tensor<4x1000xf32> {
  %mean = "kf.mean"(%x) {dims = array<i64: -1>, keepdim = true} : (tensor<4x1000xf32>) -> tensor<4x1xf32> loc("ln.py":2:5)
  %var = "kf.var"(%x) {dims = array<i64: -1>, correction = 1.0 : f64, keepdim = true} : (tensor<4x1000xf32>) -> tensor<4x1xf32> loc("ln.py":3:5)
  %c = "kf.sub"(%x, %mean) : (tensor<4x1000xf32>, tensor<4x1xf32>) -> tensor<4x1000xf32> loc("ln.py":4:5)
  %eps = "kf.fill"() {value = 1.0e-5 : f64} : () -> tensor<f32> loc("ln.py":4:5)
  %ve = "kf.add"(%var, %eps) : (tensor<4x1xf32>, tensor<f32>) -> tensor<4x1xf32> loc("ln.py":4:5)
  %sd = "kf.sqrt"(%ve) : (tensor<4x1xf32>) -> tensor<4x1xf32> loc("ln.py":4:5)
  %n = "kf.div"(%c, %sd) : (tensor<4x1000xf32>, tensor<4x1xf32>) -> tensor<4x1000xf32> loc("ln.py":4:5)
  %y = "kf.mul"(%w, %n) : (tensor<1000xf32>, tensor<4x1000xf32>) -> tensor<4x1000xf32> loc("ln.py":5:5)
  %z = "kf.add"(%y, %b) : (tensor<4x1000xf32>, tensor<1000xf32>) -> tensor<4x1000xf32> loc("ln.py":5:5)
  return %z : tensor<4x1000xf32>
}

// -----

// matmul -> scale -> mask -> softmax -> matmul is one attention kernel: the score
// matrix is never a kernel result.
// CHECK-LABEL: func.func private @attention_k0_attention
// CHECK-SAME: -> tensor<2x8x257x64xbf16>
// CHECK-SAME: kf.kernel = "attention"
// CHECK-COUNT-2: "kf.matmul"
// CHECK-LABEL: func.func @attention
// CHECK-NEXT: call @attention_k0_attention
// CHECK-NOT: call
func.func @attention(%q: tensor<2x8x257x64xbf16>, %k: tensor<2x8x257x64xbf16>, %v: tensor<2x8x257x64xbf16>, %mask: tensor<257x257xbf16>) -> tensor<2x8x257x64xbf16> {
  %kt = "kf.transpose"(%k) {perm = array<i64: 0, 1, 3, 2>} : (tensor<2x8x257x64xbf16>) -> tensor<2x8x64x257xbf16>
  %s = "kf.matmul"(%q, %kt) : (tensor<2x8x257x64xbf16>, tensor<2x8x64x257xbf16>) -> tensor<2x8x257x257xbf16>
  %eight = "kf.fill"() {value = 8.0 : f64} : () -> tensor<bf16>
  %sc = "kf.div"(%s, %eight) : (tensor<2x8x257x257xbf16>, tensor<bf16>) -> tensor<2x8x257x257xbf16>
  %zero = "kf.fill"() {value = 0.0 : f64} : () -> tensor<bf16>
  %m = "kf.cmp"(%mask, %zero) {predicate = "eq"} : (tensor<257x257xbf16>, tensor<bf16>) -> tensor<257x257xi1>
  %mf = "kf.masked_fill"(%sc, %m) {value = -1.0e9 : f64} : (tensor<2x8x257x257xbf16>, tensor<257x257xi1>) -> tensor<2x8x257x257xbf16>
  %p = "kf.softmax"(%mf) {dim = -1 : i64} : (tensor<2x8x257x257xbf16>) -> tensor<2x8x257x257xbf16>
  %o = "kf.matmul"(%p, %v) : (tensor<2x8x257x257xbf16>, tensor<2x8x257x64xbf16>) -> tensor<2x8x257x64xbf16>
  return %o : tensor<2x8x257x64xbf16>
}

// -----

// Attention under autograd: the saved row logsumexp of the scores (kf.logsumexp beside
// the softmax, compiler/partition.py) is the attention kernel's second output, written
// from the kernel's running max and sum: one kernel, one call, no score matrix.
// CHECK-LABEL: func.func private @attention_lse_k0_attention
// CHECK-SAME: -> (tensor<2x8x257x64xbf16>, tensor<2x8x257xf32>)
// CHECK-SAME: kf.kernel = "attention"
// CHECK: "kf.softmax"
// CHECK: "kf.logsumexp"
// CHECK-LABEL: func.func @attention_lse
// CHECK-COUNT-1: call
// CHECK-NOT: call
func.func @attention_lse(%q: tensor<2x8x257x64xbf16>, %k: tensor<2x8x257x64xbf16>, %v: tensor<2x8x257x64xbf16>, %mask: tensor<257x257xbf16>) -> (tensor<2x8x257x64xbf16>, tensor<2x8x257xf32>) {
  %kt = "kf.transpose"(%k) {perm = array<i64: 0, 1, 3, 2>} : (tensor<2x8x257x64xbf16>) -> tensor<2x8x64x257xbf16>
  %s = "kf.matmul"(%q, %kt) : (tensor<2x8x257x64xbf16>, tensor<2x8x64x257xbf16>) -> tensor<2x8x257x257xbf16>
  %eight = "kf.fill"() {value = 8.0 : f64} : () -> tensor<bf16>
  %sc = "kf.div"(%s, %eight) : (tensor<2x8x257x257xbf16>, tensor<bf16>) -> tensor<2x8x257x257xbf16>
  %zero = "kf.fill"() {value = 0.0 : f64} : () -> tensor<bf16>
  %m = "kf.cmp"(%mask, %zero) {predicate = "eq"} : (tensor<257x257xbf16>, tensor<bf16>) -> tensor<257x257xi1>
  %mf = "kf.masked_fill"(%sc, %m) {value = -1.0e9 : f64} : (tensor<2x8x257x257xbf16>, tensor<257x257xi1>) -> tensor<2x8x257x257xbf16>
  %p = "kf.softmax"(%mf) {dim = -1 : i64} : (tensor<2x8x257x257xbf16>) -> tensor<2x8x257x257xbf16>
  %lse = "kf.logsumexp"(%mf) {dims = array<i64: 3>, keepdim = false} : (tensor<2x8x257x257xbf16>) -> tensor<2x8x257xf32>
  %o = "kf.matmul"(%p, %v) : (tensor<2x8x257x257xbf16>, tensor<2x8x257x64xbf16>) -> tensor<2x8x257x64xbf16>
  return %o, %lse : tensor<2x8x257x64xbf16>, tensor<2x8x257xf32>
}

// -----

// A logsumexp of the scores the attention kernel does not write (over the query dim):
// it reads a copy of the score chain, so that the attention stays one kernel; the copy
// is a matmul kernel, and the logsumexp kernels of its own after it.
// CHECK-LABEL: func.func private @attention_column_lse_k{{[0-9]+}}_attention
// CHECK-SAME: -> tensor<2x8x257x64xbf16>
// CHECK-LABEL: func.func private @attention_column_lse_k{{[0-9]+}}_matmul
// CHECK-NOT: kf.logsumexp
// CHECK-LABEL: func.func @attention_column_lse
func.func @attention_column_lse(%q: tensor<2x8x257x64xbf16>, %k: tensor<2x8x257x64xbf16>, %v: tensor<2x8x257x64xbf16>) -> (tensor<2x8x257x64xbf16>, tensor<2x8x257xf32>) {
  %kt = "kf.transpose"(%k) {perm = array<i64: 0, 1, 3, 2>} : (tensor<2x8x257x64xbf16>) -> tensor<2x8x64x257xbf16>
  %s = "kf.matmul"(%q, %kt) : (tensor<2x8x257x64xbf16>, tensor<2x8x64x257xbf16>) -> tensor<2x8x257x257xbf16>
  %eight = "kf.fill"() {value = 8.0 : f64} : () -> tensor<bf16>
  %sc = "kf.div"(%s, %eight) : (tensor<2x8x257x257xbf16>, tensor<bf16>) -> tensor<2x8x257x257xbf16>
  %p = "kf.softmax"(%sc) {dim = -1 : i64} : (tensor<2x8x257x257xbf16>) -> tensor<2x8x257x257xbf16>
  %lse = "kf.logsumexp"(%sc) {dims = array<i64: 2>, keepdim = false} : (tensor<2x8x257x257xbf16>) -> tensor<2x8x257xf32>
  %o = "kf.matmul"(%p, %v) : (tensor<2x8x257x257xbf16>, tensor<2x8x257x64xbf16>) -> tensor<2x8x257x64xbf16>
  return %o, %lse : tensor<2x8x257x64xbf16>, tensor<2x8x257xf32>
}

// -----

// A matmul takes its elementwise consumers as an epilogue (bias, GELU) and the
// transpose of its weight (read in place, not written out); ops that fuse with nothing
// are kernels of their own, launched in dependency order.
// CHECK-LABEL: func.func private @mlp_k0_matmul
// CHECK: "kf.transpose"
// CHECK: "kf.matmul"
// CHECK: "kf.add"
// CHECK: "kf.gelu"
// CHECK-LABEL: func.func private @mlp_k1_generic
// CHECK: "kf.topk"
// CHECK-LABEL: func.func @mlp
// CHECK: %[[H:.*]] = call @mlp_k0_matmul(%arg1, %arg0, %arg2)
// CHECK: call @mlp_k1_generic(%[[H]])
func.func @mlp(%x: tensor<33x64xf32>, %w: tensor<96x64xf32>, %b: tensor<96xf32>) -> (tensor<33x96xf32>, tensor<33x2xi64>) {
  %wt = "kf.transpose"(%w) {perm = array<i64: 1, 0>} : (tensor<96x64xf32>) -> tensor<64x96xf32>
  %h = "kf.matmul"(%x, %wt) : (tensor<33x64xf32>, tensor<64x96xf32>) -> tensor<33x96xf32>
  %hb = "kf.add"(%h, %b) : (tensor<33x96xf32>, tensor<96xf32>) -> tensor<33x96xf32>
  %g = "kf.gelu"(%hb) {approximate = "none"} : (tensor<33x96xf32>) -> tensor<33x96xf32>
  %v:2 = "kf.topk"(%g) {k = 2 : i64, dim = 1 : i64, largest = true} : (tensor<33x96xf32>) -> (tensor<33x2xf32>, tensor<33x2xi64>)
  return %g, %v#1 : tensor<33x96xf32>, tensor<33x2xi64>
}

// -----

// Fusing must not create a cycle: %e feeds the topk kernel, whose result feeds %f, so
// %e and %f stay in separate kernels even though both are elementwise on one shape.
// CHECK-LABEL: func.func @no_cycle
// CHECK: call @no_cycle_k0_elementwise
// CHECK: call @no_cycle_k1_generic
// CHECK: call @no_cycle_k2_elementwise
func.func @no_cycle(%x: tensor<8x16xf32>) -> tensor<8x16xf32> {
  %e = "kf.exp"(%x) : (tensor<8x16xf32>) -> tensor<8x16xf32>
  %v:2 = "kf.topk"(%e) {k = 16 : i64, dim = 1 : i64, largest = true} : (tensor<8x16xf32>) -> (tensor<8x16xf32>, tensor<8x16xi64>)
  %f = "kf.add"(%e, %v#0) : (tensor<8x16xf32>, tensor<8x16xf32>) -> tensor<8x16xf32>
  return %f : tensor<8x16xf32>
}

// -----

// A reshape between kernels is a view of its operand's buffer (kf tensors are row-major),
// so it stays in the schedule instead of becoming a copy kernel; so does a returned
// reshape of a kernel's result (returned_view: that kernel writes the output's buffer).
// CHECK-LABEL: func.func private @views_k0_elementwise
// CHECK-LABEL: func.func private @views_k1_matmul
// CHECK-NOT: func.func private
// CHECK-LABEL: func.func @views
// CHECK: %[[E:.*]] = call @views_k0_elementwise(%arg0)
// CHECK-NEXT: %[[V:.*]] = "kf.reshape"(%[[E]]) : (tensor<32x16xf32>) -> tensor<4x8x16xf32>
// CHECK-NEXT: %[[M:.*]] = call @views_k1_matmul(%[[V]], %arg1)
// CHECK-NEXT: %[[R:.*]] = "kf.reshape"(%[[M]]) : (tensor<4x8x8xf32>) -> tensor<32x8xf32>
// CHECK-NEXT: return %[[R]]
func.func @views(%x: tensor<32x16xf32>, %w: tensor<16x8xf32>) -> tensor<32x8xf32> {
  %two = "kf.fill"() {value = 2.0 : f64} : () -> tensor<f32>
  %e = "kf.mul"(%x, %two) : (tensor<32x16xf32>, tensor<f32>) -> tensor<32x16xf32>
  %v = "kf.reshape"(%e) : (tensor<32x16xf32>) -> tensor<4x8x16xf32>
  %m = "kf.matmul"(%v, %w) : (tensor<4x8x16xf32>, tensor<16x8xf32>) -> tensor<4x8x8xf32>
  %r = "kf.reshape"(%m) : (tensor<4x8x8xf32>) -> tensor<32x8xf32>
  return %r : tensor<32x8xf32>
}

// -----

// A swap of the last two dims that no matmul or attention reads in place is a transpose
// kernel, with the elementwise ops of its result's shape after it (fp8's V quantized
// K-major: the scale, the clamp and the cast to e4m3 join); the rank-0 scale is an
// input, and an op of another shape (the untransposed x + 1) keeps a kernel of its own.
// CHECK-LABEL: func.func private @quantize_kt_k{{[0-9]+}}_transpose
// CHECK-SAME: (%{{.*}}: tensor<2x300x128xbf16>, %{{.*}}: tensor<f32>) -> tensor<2x128x300xf8E4M3FN>
// CHECK: "kf.transpose"
// CHECK: "kf.mul"
// CHECK: "kf.cast"({{.*}}) : (tensor<2x128x300xf32>) -> tensor<2x128x300xf8E4M3FN>
// CHECK-LABEL: func.func private @quantize_kt_k{{[0-9]+}}_elementwise
// CHECK: "kf.add"
// CHECK-LABEL: func.func @quantize_kt
// CHECK-COUNT-2: call @quantize_kt_k
func.func @quantize_kt(%x: tensor<2x300x128xbf16>, %s: tensor<f32>) -> (tensor<2x128x300xf8E4M3FN>, tensor<2x300x128xbf16>) {
  %t = "kf.transpose"(%x) {perm = array<i64: 0, 2, 1>} : (tensor<2x300x128xbf16>) -> tensor<2x128x300xbf16>
  %0 = "kf.cast"(%t) : (tensor<2x128x300xbf16>) -> tensor<2x128x300xf32>
  %1 = "kf.mul"(%0, %s) : (tensor<2x128x300xf32>, tensor<f32>) -> tensor<2x128x300xf32>
  %2 = "kf.cast"(%1) : (tensor<2x128x300xf32>) -> tensor<2x128x300xf8E4M3FN>
  %c = "kf.fill"() {value = 1.0 : f64} : () -> tensor<bf16>
  %3 = "kf.add"(%x, %c) : (tensor<2x300x128xbf16>, tensor<bf16>) -> tensor<2x300x128xbf16>
  return %2, %3 : tensor<2x128x300xf8E4M3FN>, tensor<2x300x128xbf16>
}

// -----

// Rank-0 arithmetic that only kernels read is no kernel of its own: each kernel that
// reads the scale s = a * b / 2 computes it from a and b (fp8's scales from the amaxes
// are the same shape of thing). %r is returned, so it is a kernel, which computes s too.
// CHECK-LABEL: func.func private @scales_k0_elementwise
// CHECK-SAME: (%[[X:.*]]: tensor<4x8xf32>, %[[A:.*]]: tensor<f32>, %[[B:.*]]: tensor<f32>) -> tensor<4x8xf32>
// CHECK-SAME: kf.fused_lines = ["s.py:2", "s.py:3"]
// CHECK-NEXT: %[[AB:.*]] = "kf.mul"(%[[A]], %[[B]]) : (tensor<f32>, tensor<f32>) -> tensor<f32>
// CHECK-NEXT: %[[TWO:.*]] = "kf.fill"() {value = 2.000000e+00 : f64}
// CHECK-NEXT: %[[S:.*]] = "kf.div"(%[[AB]], %[[TWO]])
// CHECK-NEXT: "kf.mul"(%[[X]], %[[S]]) : (tensor<4x8xf32>, tensor<f32>) -> tensor<4x8xf32>
// CHECK-LABEL: func.func private @scales_k1_elementwise
// CHECK-SAME: -> tensor<16xf32>
// CHECK: "kf.div"
// CHECK: "kf.mul"({{.*}}) : (tensor<16xf32>, tensor<f32>) -> tensor<16xf32>
// CHECK-LABEL: func.func private @scales_k2_elementwise
// CHECK-SAME: (%{{.*}}: tensor<f32>, %{{.*}}: tensor<f32>) -> tensor<f32>
// CHECK: "kf.div"
// CHECK: "kf.add"
// CHECK-LABEL: func.func @scales
// CHECK-NEXT: call @scales_k0_elementwise(%arg2, %arg0, %arg1)
// CHECK-NEXT: call @scales_k1_elementwise(%arg3, %arg0, %arg1)
// CHECK-NEXT: call @scales_k2_elementwise(%arg0, %arg1)
// CHECK-NEXT: return
func.func @scales(%a: tensor<f32>, %b: tensor<f32>, %x: tensor<4x8xf32>, %y: tensor<16xf32>) -> (tensor<4x8xf32>, tensor<16xf32>, tensor<f32>) {
  %two = "kf.fill"() {value = 2.0 : f64} : () -> tensor<f32> loc("s.py":2:5)
  %ab = "kf.mul"(%a, %b) : (tensor<f32>, tensor<f32>) -> tensor<f32> loc("s.py":2:5)
  %s = "kf.div"(%ab, %two) : (tensor<f32>, tensor<f32>) -> tensor<f32> loc("s.py":2:5)
  %xs = "kf.mul"(%x, %s) : (tensor<4x8xf32>, tensor<f32>) -> tensor<4x8xf32> loc("s.py":3:5)
  %ys = "kf.mul"(%y, %s) : (tensor<16xf32>, tensor<f32>) -> tensor<16xf32> loc("s.py":4:5)
  %r = "kf.add"(%s, %a) : (tensor<f32>, tensor<f32>) -> tensor<f32> loc("s.py":5:5)
  return %xs, %ys, %r : tensor<4x8xf32>, tensor<16xf32>, tensor<f32>
}

// -----

// Dropout's kf.rand joins the elementwise kernel of the ops that read it (the mask and
// the scaling) and nothing else: the softmax before it stays a rowwise kernel and the
// matmul after it a matmul kernel (their strategies compute no random numbers), and the
// dropout of the matmul's result is an elementwise kernel of its own. Both dropout
// kernels read the one random state.
// CHECK-LABEL: func.func private @attn_dropout_k0_rowwise
// CHECK-NOT: kf.rand
// CHECK-LABEL: func.func private @attn_dropout_k1_elementwise
// CHECK-SAME: (%arg0: tensor<2xi64>, %arg1: tensor<4x64xf32>) -> tensor<4x64xf32>
// CHECK: "kf.rand"(%arg0) {distribution = "uniform", offset = 0 : i64}
// CHECK: "kf.cmp"
// CHECK: "kf.select"
// CHECK: "kf.mul"(%arg1
// CHECK-LABEL: func.func private @attn_dropout_k2_matmul
// CHECK-NOT: kf.rand
// CHECK-LABEL: func.func private @attn_dropout_k3_elementwise
// CHECK: "kf.rand"(%arg0) {distribution = "uniform", offset = 256 : i64}
// CHECK-LABEL: func.func @attn_dropout
// CHECK-NEXT: %[[P:.*]] = call @attn_dropout_k0_rowwise(%arg0)
// CHECK-NEXT: %[[D:.*]] = call @attn_dropout_k1_elementwise(%arg2, %[[P]])
// CHECK-NEXT: %[[O:.*]] = call @attn_dropout_k2_matmul(%[[D]], %arg1)
// CHECK-NEXT: call @attn_dropout_k3_elementwise(%arg2, %[[O]])
func.func @attn_dropout(%s: tensor<4x64xf32>, %v: tensor<64x16xf32>, %state: tensor<2xi64>) -> tensor<4x16xf32> {
  %p = "kf.softmax"(%s) {dim = -1 : i64} : (tensor<4x64xf32>) -> tensor<4x64xf32> loc("a.py":2:5)
  %u = "kf.rand"(%state) {distribution = "uniform", offset = 0 : i64} : (tensor<2xi64>) -> tensor<4x64xf32> loc("a.py":3:5)
  %t = "kf.fill"() {value = 0.1 : f64} : () -> tensor<f32> loc("a.py":3:5)
  %keep = "kf.cmp"(%u, %t) {predicate = "gt"} : (tensor<4x64xf32>, tensor<f32>) -> tensor<4x64xi1> loc("a.py":3:5)
  %sc = "kf.fill"() {value = 1.1111111111111112 : f64} : () -> tensor<f32> loc("a.py":3:5)
  %z = "kf.fill"() {value = 0.0 : f64} : () -> tensor<f32> loc("a.py":3:5)
  %m = "kf.select"(%keep, %sc, %z) : (tensor<4x64xi1>, tensor<f32>, tensor<f32>) -> tensor<4x64xf32> loc("a.py":3:5)
  %d = "kf.mul"(%p, %m) : (tensor<4x64xf32>, tensor<4x64xf32>) -> tensor<4x64xf32> loc("a.py":3:5)
  %o = "kf.matmul"(%d, %v) : (tensor<4x64xf32>, tensor<64x16xf32>) -> tensor<4x16xf32> loc("a.py":4:5)
  %u2 = "kf.rand"(%state) {distribution = "uniform", offset = 256 : i64} : (tensor<2xi64>) -> tensor<4x16xf32> loc("a.py":5:5)
  %keep2 = "kf.cmp"(%u2, %t) {predicate = "gt"} : (tensor<4x16xf32>, tensor<f32>) -> tensor<4x16xi1> loc("a.py":5:5)
  %m2 = "kf.select"(%keep2, %sc, %z) : (tensor<4x16xi1>, tensor<f32>, tensor<f32>) -> tensor<4x16xf32> loc("a.py":5:5)
  %y = "kf.mul"(%o, %m2) : (tensor<4x16xf32>, tensor<4x16xf32>) -> tensor<4x16xf32> loc("a.py":5:5)
  return %y : tensor<4x16xf32>
}

// -----

// A layer norm's backward (bf16, saved mean and rstd): dx is one rowwise kernel, with the
// casts of the saved statistics and of the weight computed inside it; the weight's and
// the bias's gradients (sums over the rows) are one generic kernel, which recomputes
// dy * xhat from the inputs rather than reading it from the row kernel, and rounds the
// sums to bf16 itself.
// CHECK-LABEL: func.func private @ln_backward_k0_rowwise
// CHECK-SAME: -> tensor<257x64xbf16>
// CHECK-NOT: dims = array<i64: 0>
// CHECK: return
// CHECK-LABEL: func.func private @ln_backward_k1_generic
// CHECK-SAME: -> (tensor<64xbf16>, tensor<64xbf16>)
// CHECK: "kf.sub"
// CHECK: "kf.sum"({{.*}}) {dims = array<i64: 0>, keepdim = false}
// CHECK: "kf.sum"({{.*}}) {dims = array<i64: 0>, keepdim = false}
// CHECK-LABEL: func.func @ln_backward
// CHECK-NEXT: call @ln_backward_k0_rowwise
// CHECK-NEXT: call @ln_backward_k1_generic
// CHECK-NEXT: return
func.func @ln_backward(%x: tensor<257x64xbf16>, %w: tensor<64xbf16>, %mean: tensor<257x1xbf16>, %rstd: tensor<257x1xbf16>, %dy: tensor<257x64xbf16>) -> (tensor<257x64xbf16>, tensor<64xbf16>, tensor<64xbf16>) {
  %g = "kf.cast"(%dy) : (tensor<257x64xbf16>) -> tensor<257x64xf32>
  %xf = "kf.cast"(%x) : (tensor<257x64xbf16>) -> tensor<257x64xf32>
  %wf = "kf.cast"(%w) : (tensor<64xbf16>) -> tensor<64xf32>
  %mf = "kf.cast"(%mean) : (tensor<257x1xbf16>) -> tensor<257x1xf32>
  %c = "kf.sub"(%xf, %mf) : (tensor<257x64xf32>, tensor<257x1xf32>) -> tensor<257x64xf32>
  %rf = "kf.cast"(%rstd) : (tensor<257x1xbf16>) -> tensor<257x1xf32>
  %xhat = "kf.mul"(%c, %rf) : (tensor<257x64xf32>, tensor<257x1xf32>) -> tensor<257x64xf32>
  %gw = "kf.mul"(%g, %wf) : (tensor<257x64xf32>, tensor<64xf32>) -> tensor<257x64xf32>
  %n = "kf.fill"() {value = 64.0 : f64} : () -> tensor<f32>
  %gwn = "kf.mul"(%gw, %n) : (tensor<257x64xf32>, tensor<f32>) -> tensor<257x64xf32>
  %s1 = "kf.sum"(%gw) {dims = array<i64: 1>, keepdim = true} : (tensor<257x64xf32>) -> tensor<257x1xf32>
  %p = "kf.mul"(%gw, %xhat) : (tensor<257x64xf32>, tensor<257x64xf32>) -> tensor<257x64xf32>
  %s2 = "kf.sum"(%p) {dims = array<i64: 1>, keepdim = true} : (tensor<257x64xf32>) -> tensor<257x1xf32>
  %t = "kf.mul"(%xhat, %s2) : (tensor<257x64xf32>, tensor<257x1xf32>) -> tensor<257x64xf32>
  %d1 = "kf.sub"(%gwn, %s1) : (tensor<257x64xf32>, tensor<257x1xf32>) -> tensor<257x64xf32>
  %d2 = "kf.sub"(%d1, %t) : (tensor<257x64xf32>, tensor<257x64xf32>) -> tensor<257x64xf32>
  %k = "kf.div"(%rf, %n) : (tensor<257x1xf32>, tensor<f32>) -> tensor<257x1xf32>
  %dxf = "kf.mul"(%k, %d2) : (tensor<257x1xf32>, tensor<257x64xf32>) -> tensor<257x64xf32>
  %dx = "kf.cast"(%dxf) : (tensor<257x64xf32>) -> tensor<257x64xbf16>
  %gx = "kf.mul"(%g, %xhat) : (tensor<257x64xf32>, tensor<257x64xf32>) -> tensor<257x64xf32>
  %dwf = "kf.sum"(%gx) {dims = array<i64: 0>, keepdim = false} : (tensor<257x64xf32>) -> tensor<64xf32>
  %dbf = "kf.sum"(%g) {dims = array<i64: 0>, keepdim = false} : (tensor<257x64xf32>) -> tensor<64xf32>
  %dw = "kf.cast"(%dwf) : (tensor<64xf32>) -> tensor<64xbf16>
  %db = "kf.cast"(%dbf) : (tensor<64xf32>) -> tensor<64xbf16>
  return %dx, %dw, %db : tensor<257x64xbf16>, tensor<64xbf16>, tensor<64xbf16>
}

// -----

// A broadcast of a row statistic to the row space is elementwise over its result: the
// ops that read it stay in the row kernel (RMSNorm's backward, from autograd's expand).
// CHECK-LABEL: func.func private @broadcast_in_row_k0_rowwise
// CHECK: "kf.broadcast_to"
// CHECK-LABEL: func.func @broadcast_in_row
// CHECK-NEXT: call @broadcast_in_row_k0_rowwise
// CHECK-NEXT: return
func.func @broadcast_in_row(%x: tensor<13x33xf32>, %dy: tensor<13x33xf32>) -> tensor<13x33xf32> {
  %p = "kf.mul"(%dy, %x) : (tensor<13x33xf32>, tensor<13x33xf32>) -> tensor<13x33xf32>
  %s = "kf.sum"(%p) {dims = array<i64: 1>, keepdim = true} : (tensor<13x33xf32>) -> tensor<13x1xf32>
  %e = "kf.broadcast_to"(%s) : (tensor<13x1xf32>) -> tensor<13x33xf32>
  %n = "kf.fill"() {value = 33.0 : f64} : () -> tensor<f32>
  %d = "kf.div"(%e, %n) : (tensor<13x33xf32>, tensor<f32>) -> tensor<13x33xf32>
  %r = "kf.mul"(%d, %x) : (tensor<13x33xf32>, tensor<13x33xf32>) -> tensor<13x33xf32>
  return %r : tensor<13x33xf32>
}

// -----

// An elementwise group that reads a column reduction through a view the schedule keeps
// (batch norm's running mean: reshape of mean(x, 0, keepdim)) stays its own kernel:
// merged, the view would read the kernel and feed it.
// CHECK-LABEL: func.func @column_through_view
// CHECK: %[[M:.*]] = call @column_through_view_k0_generic(%arg0)
// CHECK: %[[V:.*]] = "kf.reshape"(%[[M]])
// CHECK: call @column_through_view_k1_elementwise(%arg1, %[[V]])
func.func @column_through_view(%x: tensor<7x3xf32>, %rm: tensor<3xf32>) -> tensor<3xf32> {
  %m = "kf.mean"(%x) {dims = array<i64: 0>, keepdim = true} : (tensor<7x3xf32>) -> tensor<1x3xf32>
  %a = "kf.fill"() {value = 0.8 : f64} : () -> tensor<f32>
  %r = "kf.mul"(%rm, %a) : (tensor<3xf32>, tensor<f32>) -> tensor<3xf32>
  %v = "kf.reshape"(%m) : (tensor<1x3xf32>) -> tensor<3xf32>
  %b = "kf.fill"() {value = 0.2 : f64} : () -> tensor<f32>
  %s = "kf.mul"(%v, %b) : (tensor<3xf32>, tensor<f32>) -> tensor<3xf32>
  %n = "kf.add"(%r, %s) : (tensor<3xf32>, tensor<3xf32>) -> tensor<3xf32>
  return %n : tensor<3xf32>
}

// -----

// A mask made of indices (tril's col - row <= 0 over two kf.iota) is computed in the
// kernel that reads it, like a fill: one kernel, no mask tensor between kernels.
// CHECK-LABEL: func.func private @iota_mask_k0_elementwise(%arg0: tensor<3x5xf32>
// CHECK-DAG: "kf.iota"() {dim = 1 : i64}
// CHECK-DAG: "kf.iota"() {dim = 0 : i64}
// CHECK: "kf.cmp"
// CHECK: "kf.select"
// CHECK-LABEL: func.func @iota_mask
// CHECK-NEXT: call @iota_mask_k0_elementwise(%arg0)
// CHECK-NEXT: return
func.func @iota_mask(%x: tensor<3x5xf32>) -> tensor<3x5xf32> {
  %c = "kf.iota"() {dim = 1 : i64} : () -> tensor<1x5xi64>
  %r = "kf.iota"() {dim = 0 : i64} : () -> tensor<3x1xi64>
  %d = "kf.sub"(%c, %r) : (tensor<1x5xi64>, tensor<3x1xi64>) -> tensor<3x5xi64>
  %k = "kf.fill"() {value = 0.0 : f64} : () -> tensor<i64>
  %m = "kf.cmp"(%d, %k) {predicate = "le"} : (tensor<3x5xi64>, tensor<i64>) -> tensor<3x5xi1>
  %z = "kf.fill"() {value = 0.0 : f64} : () -> tensor<f32>
  %y = "kf.select"(%m, %x, %z) : (tensor<3x5xi1>, tensor<3x5xf32>, tensor<f32>) -> tensor<3x5xf32>
  return %y : tensor<3x5xf32>
}

// -----

// RMSNorm's backward after kf-split-reductions: the weight gradient's partial sums
// (kf.sum over dim 1 of [R, N] as [G, B, N]) join the row kernel over [R, N], with the
// reshape and the chain dy * x * rstd that only they read; the last stage reads [4, 16].
// CHECK-LABEL: func.func private @rms_backward_k0_rowwise
// CHECK-SAME: -> (tensor<4x16xf32>, tensor<8x16xf32>)
// CHECK: "kf.reshape"({{.*}}) : (tensor<8x16xf32>) -> tensor<4x2x16xf32>
// CHECK: "kf.sum"({{.*}}) {dims = array<i64: 1>, keepdim = false} : (tensor<4x2x16xf32>) -> tensor<4x16xf32>
// CHECK-LABEL: func.func private @rms_backward_k1_generic(%arg0: tensor<4x16xf32>{{.*}}) -> tensor<16xf32>
// CHECK-LABEL: func.func @rms_backward
// CHECK-NOT: kf.reshape
// CHECK: %[[K:.*]]:2 = call @rms_backward_k0_rowwise
// CHECK-NEXT: call @rms_backward_k1_generic(%[[K]]#0)
func.func @rms_backward(%x: tensor<8x16xf32>, %dy: tensor<8x16xf32>, %w: tensor<16xf32>, %rstd: tensor<8x1xf32>) -> (tensor<8x16xf32>, tensor<16xf32>) {
  %0 = "kf.mul"(%x, %rstd) : (tensor<8x16xf32>, tensor<8x1xf32>) -> tensor<8x16xf32>
  %1 = "kf.mul"(%dy, %0) : (tensor<8x16xf32>, tensor<8x16xf32>) -> tensor<8x16xf32>
  %2 = "kf.reshape"(%1) : (tensor<8x16xf32>) -> tensor<4x2x16xf32>
  %3 = "kf.sum"(%2) {dims = array<i64: 1>, keepdim = false} : (tensor<4x2x16xf32>) -> tensor<4x16xf32>
  %4 = "kf.sum"(%3) {dims = array<i64: 0>, keepdim = false} : (tensor<4x16xf32>) -> tensor<16xf32>
  %5 = "kf.mul"(%dy, %w) : (tensor<8x16xf32>, tensor<16xf32>) -> tensor<8x16xf32>
  %6 = "kf.mul"(%5, %x) : (tensor<8x16xf32>, tensor<8x16xf32>) -> tensor<8x16xf32>
  %7 = "kf.sum"(%6) {dims = array<i64: 1>, keepdim = true} : (tensor<8x16xf32>) -> tensor<8x1xf32>
  %8 = "kf.mul"(%x, %7) : (tensor<8x16xf32>, tensor<8x1xf32>) -> tensor<8x16xf32>
  %9 = "kf.sub"(%5, %8) : (tensor<8x16xf32>, tensor<8x16xf32>) -> tensor<8x16xf32>
  return %9, %4 : tensor<8x16xf32>, tensor<16xf32>
}

// -----

// Without a row kernel over its rows, the partial sums are a generic kernel of their own
// (the reshape inside it, not a view between kernels).
// CHECK-LABEL: func.func private @lone_partial_k0_generic(%arg0: tensor<8x16xf32>{{.*}}) -> tensor<4x16xf32>
// CHECK: "kf.reshape"
// CHECK-LABEL: func.func @lone_partial
// CHECK-NOT: kf.reshape
// CHECK: call @lone_partial_k0_generic(%arg0)
func.func @lone_partial(%x: tensor<8x16xf32>) -> tensor<16xf32> {
  %0 = "kf.reshape"(%x) : (tensor<8x16xf32>) -> tensor<4x2x16xf32>
  %1 = "kf.sum"(%0) {dims = array<i64: 1>, keepdim = false} : (tensor<4x2x16xf32>) -> tensor<4x16xf32>
  %2 = "kf.sum"(%1) {dims = array<i64: 0>, keepdim = false} : (tensor<4x16xf32>) -> tensor<16xf32>
  return %2 : tensor<16xf32>
}

// -----

// An epilogue that reads its GEMM's product through a host call (torch-mlir's function
// of the product) stays out of the GEMM: the call runs between the two kernels.
// CHECK-LABEL: func.func @gemm_then_call
// CHECK: %[[P:.*]] = call @gemm_then_call_k{{[0-9]+}}_matmul(%arg0, %arg1)
// CHECK-NEXT: %[[D:.*]] = call @row_sums(%[[P]])
// CHECK-NEXT: call @gemm_then_call_k{{[0-9]+}}_elementwise(%[[P]], %[[D]])
func.func private @row_sums(%p: tensor<9x9xf32>) -> tensor<9x1xf32>
func.func @gemm_then_call(%a: tensor<9x4xf32>, %b: tensor<4x9xf32>) -> tensor<9x9xf32> {
  %p = "kf.matmul"(%a, %b) : (tensor<9x4xf32>, tensor<4x9xf32>) -> tensor<9x9xf32>
  %d = call @row_sums(%p) : (tensor<9x9xf32>) -> tensor<9x1xf32>
  %s = "kf.sub"(%p, %d) : (tensor<9x9xf32>, tensor<9x1xf32>) -> tensor<9x9xf32>
  return %s : tensor<9x9xf32>
}

// -----

// SDPA of bf16 with a bf16 additive mask (compiler/aten/attention.py): the scores, the
// mask and the softmax in f32, P rounded to bf16 for P @ V. The mask's widening joins
// the attention kernel, which reads the bf16 mask as it lies: no kernel of its own.
// CHECK-LABEL: func.func private @sdpa_mask_k{{[0-9]+}}_attention
// CHECK-SAME: %{{[a-z0-9]+}}: tensor<2x5x8xbf16>, %{{[a-z0-9]+}}: tensor<2x8x5xbf16>, %[[M:[a-z0-9]+]]: tensor<5x5xbf16>
// CHECK-SAME: kf.kernel = "attention"
// CHECK: %[[W:.*]] = "kf.cast"(%[[M]]) : (tensor<5x5xbf16>) -> tensor<5x5xf32>
// CHECK: "kf.add"(%{{.*}}, %[[W]])
// CHECK: "kf.softmax"
// CHECK-LABEL: func.func @sdpa_mask
// CHECK-NOT: kf.kernel = "elementwise"
// CHECK-COUNT-1: call @sdpa_mask_k{{[0-9]+}}_attention
func.func @sdpa_mask(%q: tensor<2x5x8xbf16>, %kt: tensor<2x8x5xbf16>, %v: tensor<2x5x8xbf16>, %m: tensor<5x5xbf16>) -> tensor<2x5x8xbf16> {
  %scale = "kf.fill"() {value = 0.35 : f64} : () -> tensor<f32>
  %s = "kf.matmul"(%q, %kt) : (tensor<2x5x8xbf16>, tensor<2x8x5xbf16>) -> tensor<2x5x5xf32>
  %ss = "kf.mul"(%s, %scale) : (tensor<2x5x5xf32>, tensor<f32>) -> tensor<2x5x5xf32>
  %mw = "kf.cast"(%m) : (tensor<5x5xbf16>) -> tensor<5x5xf32>
  %sm = "kf.add"(%ss, %mw) : (tensor<2x5x5xf32>, tensor<5x5xf32>) -> tensor<2x5x5xf32>
  %p = "kf.softmax"(%sm) {dim = -1 : i64} : (tensor<2x5x5xf32>) -> tensor<2x5x5xf32>
  %pb = "kf.cast"(%p) : (tensor<2x5x5xf32>) -> tensor<2x5x5xbf16>
  %o = "kf.matmul"(%pb, %v) : (tensor<2x5x5xbf16>, tensor<2x5x8xbf16>) -> tensor<2x5x8xbf16>
  return %o : tensor<2x5x8xbf16>
}

// -----

// Logits a row kernel reads: the GEMM writes them once, in bf16; the widening cast, the
// one-hot (thin operands: cloned where read) and its product are row-kernel work.
// CHECK-LABEL: func.func private @logits_k0_matmul
// CHECK-SAME: -> tensor<32x512xbf16>
// CHECK-NOT: kf.cast
// CHECK: return
// CHECK-LABEL: func.func private @logits_k1_rowwise
// CHECK-SAME: (%arg0: tensor<32x512xbf16>, %arg1: tensor<32x1xi64>, %arg2: tensor<1x512xi64>) -> tensor<32x1xf32>
// CHECK-DAG: "kf.cast"(%arg0)
// CHECK-DAG: "kf.cmp"(%arg1, %arg2)
// CHECK: "kf.reduce_max"
func.func @logits(%h: tensor<32x64xbf16>, %w: tensor<64x512xbf16>, %t: tensor<32x1xi64>, %iota: tensor<1x512xi64>) -> tensor<32x1xf32> {
  %mm = "kf.matmul"(%h, %w) : (tensor<32x64xbf16>, tensor<64x512xbf16>) -> tensor<32x512xbf16> loc("lm.py":2:5)
  %z = "kf.cast"(%mm) : (tensor<32x512xbf16>) -> tensor<32x512xf32> loc("lm.py":2:5)
  %eq = "kf.cmp"(%t, %iota) {predicate = "eq"} : (tensor<32x1xi64>, tensor<1x512xi64>) -> tensor<32x512xi1> loc("lm.py":3:5)
  %oh = "kf.cast"(%eq) : (tensor<32x512xi1>) -> tensor<32x512xf32> loc("lm.py":3:5)
  %p = "kf.mul"(%z, %oh) : (tensor<32x512xf32>, tensor<32x512xf32>) -> tensor<32x512xf32> loc("lm.py":4:5)
  %m = "kf.reduce_max"(%z) {dims = array<i64: 1>, keepdim = true} : (tensor<32x512xf32>) -> tensor<32x1xf32> loc("lm.py":5:5)
  %picked = "kf.sum"(%p) {dims = array<i64: 1>, keepdim = true} : (tensor<32x512xf32>) -> tensor<32x1xf32> loc("lm.py":5:5)
  %r = "kf.sub"(%m, %picked) : (tensor<32x1xf32>, tensor<32x1xf32>) -> tensor<32x1xf32> loc("lm.py":5:5)
  return %r : tensor<32x1xf32>
}

// -----

// Rotary embedding's rotate_half: slices, a negation and a concat move elements; the
// elementwise kernel reads q at the moved indices, so the whole expression is one kernel.
// CHECK-LABEL: func.func private @rope_k0_elementwise
// CHECK-SAME: (%arg0: tensor<1x4x33x16xf32>, %arg1: tensor<33x16xf32>, %arg2: tensor<33x16xf32>) -> tensor<1x4x33x16xf32>
// CHECK-DAG: "kf.slice"(%arg0) {dim = 3 : i64, end = 16 : i64, start = 8 : i64, step = 1 : i64}
// CHECK-DAG: "kf.neg"
// CHECK-DAG: "kf.concat"
// CHECK: return
// CHECK-LABEL: func.func @rope
// CHECK-NEXT: %[[R:.*]] = call @rope_k0_elementwise(%arg0, %arg1, %arg2)
// CHECK-NEXT: return %[[R]]
func.func @rope(%q: tensor<1x4x33x16xf32>, %cos: tensor<33x16xf32>, %sin: tensor<33x16xf32>) -> tensor<1x4x33x16xf32> {
  %0 = "kf.mul"(%q, %cos) : (tensor<1x4x33x16xf32>, tensor<33x16xf32>) -> tensor<1x4x33x16xf32>
  %1 = "kf.slice"(%q) {dim = 3 : i64, end = 16 : i64, start = 8 : i64, step = 1 : i64} : (tensor<1x4x33x16xf32>) -> tensor<1x4x33x8xf32>
  %2 = "kf.neg"(%1) : (tensor<1x4x33x8xf32>) -> tensor<1x4x33x8xf32>
  %3 = "kf.slice"(%q) {dim = 3 : i64, end = 8 : i64, start = 0 : i64, step = 1 : i64} : (tensor<1x4x33x16xf32>) -> tensor<1x4x33x8xf32>
  %4 = "kf.concat"(%2, %3) {dim = 3 : i64} : (tensor<1x4x33x8xf32>, tensor<1x4x33x8xf32>) -> tensor<1x4x33x16xf32>
  %5 = "kf.mul"(%4, %sin) : (tensor<1x4x33x16xf32>, tensor<33x16xf32>) -> tensor<1x4x33x16xf32>
  %6 = "kf.add"(%0, %5) : (tensor<1x4x33x16xf32>, tensor<1x4x33x16xf32>) -> tensor<1x4x33x16xf32>
  return %6 : tensor<1x4x33x16xf32>
}

// -----

// A slice of a value the function also returns: that value is written at its own shape
// by its own kernel, and the slice's kernel reads it.
// CHECK-LABEL: func.func private @slice_of_result_k0_elementwise
// CHECK-SAME: -> tensor<5x12xf32>
// CHECK-LABEL: func.func private @slice_of_result_k1_elementwise
// CHECK-SAME: (%arg0: tensor<5x12xf32>) -> tensor<5x4xf32>
// CHECK: "kf.slice"(%arg0)
func.func @slice_of_result(%x: tensor<5x12xf32>) -> (tensor<5x4xf32>, tensor<5x12xf32>) {
  %a = "kf.mul"(%x, %x) : (tensor<5x12xf32>, tensor<5x12xf32>) -> tensor<5x12xf32>
  %s = "kf.slice"(%a) {dim = 1 : i64, end = 4 : i64, start = 0 : i64, step = 1 : i64} : (tensor<5x12xf32>) -> tensor<5x4xf32>
  %one = "kf.fill"() {value = 1.0 : f64} : () -> tensor<f32>
  %b = "kf.add"(%s, %one) : (tensor<5x4xf32>, tensor<f32>) -> tensor<5x4xf32>
  return %b, %a : tensor<5x4xf32>, tensor<5x12xf32>
}

// -----

// Column sums of one shape join when they read a tensor in common (a norm's weight and
// bias gradients, both of dy): one generic kernel.
// CHECK-LABEL: func.func private @norm_grads_k0_generic(%arg0: tensor<6x8xf32>, %arg1: tensor<6x8xf32>) -> (tensor<8xf32>, tensor<8xf32>)
// CHECK-LABEL: func.func @norm_grads
// CHECK-NEXT: call @norm_grads_k0_generic(%arg0, %arg1)
func.func @norm_grads(%dy: tensor<6x8xf32>, %xhat: tensor<6x8xf32>) -> (tensor<8xf32>, tensor<8xf32>) {
  %p = "kf.mul"(%dy, %xhat) : (tensor<6x8xf32>, tensor<6x8xf32>) -> tensor<6x8xf32>
  %w = "kf.sum"(%p) {dims = array<i64: 0>, keepdim = false} : (tensor<6x8xf32>) -> tensor<8xf32>
  %b = "kf.sum"(%dy) {dims = array<i64: 0>, keepdim = false} : (tensor<6x8xf32>) -> tensor<8xf32>
  return %w, %b : tensor<8xf32>, tensor<8xf32>
}

// -----

// The weight gradients of two norms (other layers: other tensors) stay kernels of their
// own: merged across a model's layers they made one kernel of more buffers than a
// Vulkan device binds.
// CHECK-LABEL: func.func @two_norms
// CHECK-NEXT: call @two_norms_k{{[0-9]+}}_generic(%arg0, %arg1)
// CHECK-NEXT: call @two_norms_k{{[0-9]+}}_generic(%arg2, %arg3)
func.func @two_norms(%dy1: tensor<6x8xf32>, %x1: tensor<6x8xf32>, %dy2: tensor<6x8xf32>, %x2: tensor<6x8xf32>) -> (tensor<8xf32>, tensor<8xf32>) {
  %p1 = "kf.mul"(%dy1, %x1) : (tensor<6x8xf32>, tensor<6x8xf32>) -> tensor<6x8xf32>
  %w1 = "kf.sum"(%p1) {dims = array<i64: 0>, keepdim = false} : (tensor<6x8xf32>) -> tensor<8xf32>
  %p2 = "kf.mul"(%dy2, %x2) : (tensor<6x8xf32>, tensor<6x8xf32>) -> tensor<6x8xf32>
  %w2 = "kf.sum"(%p2) {dims = array<i64: 0>, keepdim = false} : (tensor<6x8xf32>) -> tensor<8xf32>
  return %w1, %w2 : tensor<8xf32>, tensor<8xf32>
}

// -----

// An elementwise sum of 30 tensors: a kernel binds at most 24 buffers (MAX_BUFFERS), so
// the chain is cut into two kernels.
// CHECK-LABEL: func.func @wide_sum
// CHECK-NEXT: %[[A:.*]] = call @wide_sum_k0_elementwise(%arg0, %arg1, %arg2, %arg3, %arg4, %arg5, %arg6, %arg7, %arg8, %arg9, %arg10, %arg11, %arg12, %arg13, %arg14, %arg15, %arg16, %arg17, %arg18, %arg19, %arg20, %arg21, %arg22)
// CHECK-NEXT: %[[B:.*]] = call @wide_sum_k1_elementwise(%[[A]], %arg23, %arg24, %arg25, %arg26, %arg27, %arg28, %arg29)
// CHECK-NEXT: return %[[B]]
func.func @wide_sum(%a0: tensor<5xf32>, %a1: tensor<5xf32>, %a2: tensor<5xf32>, %a3: tensor<5xf32>, %a4: tensor<5xf32>, %a5: tensor<5xf32>, %a6: tensor<5xf32>, %a7: tensor<5xf32>, %a8: tensor<5xf32>, %a9: tensor<5xf32>, %a10: tensor<5xf32>, %a11: tensor<5xf32>, %a12: tensor<5xf32>, %a13: tensor<5xf32>, %a14: tensor<5xf32>, %a15: tensor<5xf32>, %a16: tensor<5xf32>, %a17: tensor<5xf32>, %a18: tensor<5xf32>, %a19: tensor<5xf32>, %a20: tensor<5xf32>, %a21: tensor<5xf32>, %a22: tensor<5xf32>, %a23: tensor<5xf32>, %a24: tensor<5xf32>, %a25: tensor<5xf32>, %a26: tensor<5xf32>, %a27: tensor<5xf32>, %a28: tensor<5xf32>, %a29: tensor<5xf32>) -> tensor<5xf32> {
  %s1 = "kf.add"(%a0, %a1) : (tensor<5xf32>, tensor<5xf32>) -> tensor<5xf32>
  %s2 = "kf.add"(%s1, %a2) : (tensor<5xf32>, tensor<5xf32>) -> tensor<5xf32>
  %s3 = "kf.add"(%s2, %a3) : (tensor<5xf32>, tensor<5xf32>) -> tensor<5xf32>
  %s4 = "kf.add"(%s3, %a4) : (tensor<5xf32>, tensor<5xf32>) -> tensor<5xf32>
  %s5 = "kf.add"(%s4, %a5) : (tensor<5xf32>, tensor<5xf32>) -> tensor<5xf32>
  %s6 = "kf.add"(%s5, %a6) : (tensor<5xf32>, tensor<5xf32>) -> tensor<5xf32>
  %s7 = "kf.add"(%s6, %a7) : (tensor<5xf32>, tensor<5xf32>) -> tensor<5xf32>
  %s8 = "kf.add"(%s7, %a8) : (tensor<5xf32>, tensor<5xf32>) -> tensor<5xf32>
  %s9 = "kf.add"(%s8, %a9) : (tensor<5xf32>, tensor<5xf32>) -> tensor<5xf32>
  %s10 = "kf.add"(%s9, %a10) : (tensor<5xf32>, tensor<5xf32>) -> tensor<5xf32>
  %s11 = "kf.add"(%s10, %a11) : (tensor<5xf32>, tensor<5xf32>) -> tensor<5xf32>
  %s12 = "kf.add"(%s11, %a12) : (tensor<5xf32>, tensor<5xf32>) -> tensor<5xf32>
  %s13 = "kf.add"(%s12, %a13) : (tensor<5xf32>, tensor<5xf32>) -> tensor<5xf32>
  %s14 = "kf.add"(%s13, %a14) : (tensor<5xf32>, tensor<5xf32>) -> tensor<5xf32>
  %s15 = "kf.add"(%s14, %a15) : (tensor<5xf32>, tensor<5xf32>) -> tensor<5xf32>
  %s16 = "kf.add"(%s15, %a16) : (tensor<5xf32>, tensor<5xf32>) -> tensor<5xf32>
  %s17 = "kf.add"(%s16, %a17) : (tensor<5xf32>, tensor<5xf32>) -> tensor<5xf32>
  %s18 = "kf.add"(%s17, %a18) : (tensor<5xf32>, tensor<5xf32>) -> tensor<5xf32>
  %s19 = "kf.add"(%s18, %a19) : (tensor<5xf32>, tensor<5xf32>) -> tensor<5xf32>
  %s20 = "kf.add"(%s19, %a20) : (tensor<5xf32>, tensor<5xf32>) -> tensor<5xf32>
  %s21 = "kf.add"(%s20, %a21) : (tensor<5xf32>, tensor<5xf32>) -> tensor<5xf32>
  %s22 = "kf.add"(%s21, %a22) : (tensor<5xf32>, tensor<5xf32>) -> tensor<5xf32>
  %s23 = "kf.add"(%s22, %a23) : (tensor<5xf32>, tensor<5xf32>) -> tensor<5xf32>
  %s24 = "kf.add"(%s23, %a24) : (tensor<5xf32>, tensor<5xf32>) -> tensor<5xf32>
  %s25 = "kf.add"(%s24, %a25) : (tensor<5xf32>, tensor<5xf32>) -> tensor<5xf32>
  %s26 = "kf.add"(%s25, %a26) : (tensor<5xf32>, tensor<5xf32>) -> tensor<5xf32>
  %s27 = "kf.add"(%s26, %a27) : (tensor<5xf32>, tensor<5xf32>) -> tensor<5xf32>
  %s28 = "kf.add"(%s27, %a28) : (tensor<5xf32>, tensor<5xf32>) -> tensor<5xf32>
  %s29 = "kf.add"(%s28, %a29) : (tensor<5xf32>, tensor<5xf32>) -> tensor<5xf32>
  return %s29 : tensor<5xf32>
}
