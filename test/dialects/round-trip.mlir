// RUN: kf-opt %s | kf-opt | FileCheck %s
// Every kf op parses, verifies and prints back the same (generic form: the dialect is IRDL).

// CHECK-LABEL: func.func @elementwise
func.func @elementwise(%a: tensor<4x8xf32>, %b: tensor<8xf32>, %i: tensor<4x8xi32>) -> tensor<4x8xf32> {
  // CHECK: "kf.add"(%arg0, %arg1) : (tensor<4x8xf32>, tensor<8xf32>) -> tensor<4x8xf32>
  %0 = "kf.add"(%a, %b) : (tensor<4x8xf32>, tensor<8xf32>) -> tensor<4x8xf32>
  %1 = "kf.sub"(%0, %a) : (tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<4x8xf32>
  %2 = "kf.mul"(%1, %a) : (tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<4x8xf32>
  %3 = "kf.div"(%2, %b) : (tensor<4x8xf32>, tensor<8xf32>) -> tensor<4x8xf32>
  %4 = "kf.pow"(%3, %a) : (tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<4x8xf32>
  %5 = "kf.max"(%4, %a) : (tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<4x8xf32>
  %6 = "kf.min"(%5, %a) : (tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<4x8xf32>
  %7 = "kf.neg"(%6) : (tensor<4x8xf32>) -> tensor<4x8xf32>
  %8 = "kf.exp"(%7) : (tensor<4x8xf32>) -> tensor<4x8xf32>
  %9 = "kf.log"(%8) : (tensor<4x8xf32>) -> tensor<4x8xf32>
  %10 = "kf.sqrt"(%9) : (tensor<4x8xf32>) -> tensor<4x8xf32>
  %11 = "kf.rsqrt"(%10) : (tensor<4x8xf32>) -> tensor<4x8xf32>
  %12 = "kf.tanh"(%11) : (tensor<4x8xf32>) -> tensor<4x8xf32>
  %13 = "kf.erf"(%12) : (tensor<4x8xf32>) -> tensor<4x8xf32>
  %14 = "kf.sigmoid"(%13) : (tensor<4x8xf32>) -> tensor<4x8xf32>
  %15 = "kf.relu"(%14) : (tensor<4x8xf32>) -> tensor<4x8xf32>
  // CHECK: "kf.gelu"(%{{.*}}) {approximate = "tanh"}
  %16 = "kf.gelu"(%15) {approximate = "tanh"} : (tensor<4x8xf32>) -> tensor<4x8xf32>
  // CHECK: "kf.cmp"(%{{.*}}, %arg1) {predicate = "gt"} : (tensor<4x8xf32>, tensor<8xf32>) -> tensor<4x8xi1>
  %17 = "kf.cmp"(%16, %b) {predicate = "gt"} : (tensor<4x8xf32>, tensor<8xf32>) -> tensor<4x8xi1>
  %18 = "kf.select"(%17, %16, %a) : (tensor<4x8xi1>, tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<4x8xf32>
  // CHECK: "kf.masked_fill"(%{{.*}}, %{{.*}}) {value = -1.000000e+09 : f64}
  %19 = "kf.masked_fill"(%18, %17) {value = -1.0e9 : f64} : (tensor<4x8xf32>, tensor<4x8xi1>) -> tensor<4x8xf32>
  // CHECK: "kf.cast"(%arg2) : (tensor<4x8xi32>) -> tensor<4x8xbf16>
  %20 = "kf.cast"(%i) : (tensor<4x8xi32>) -> tensor<4x8xbf16>
  %21 = "kf.cast"(%20) : (tensor<4x8xbf16>) -> tensor<4x8xf32>
  %22 = "kf.add"(%21, %19) : (tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<4x8xf32>
  return %22 : tensor<4x8xf32>
}

// CHECK-LABEL: func.func @reductions
func.func @reductions(%a: tensor<2x3x257xf16>) -> (tensor<2x3x1xf16>, tensor<2xf16>, tensor<2x3xf16>, tensor<2x3x1xf16>, tensor<2x3xi64>, tensor<2x3x257xf16>, tensor<2x3x257xf16>) {
  // CHECK: "kf.mean"(%arg0) {dims = array<i64: -1>, keepdim = true}
  %0 = "kf.mean"(%a) {dims = array<i64: -1>, keepdim = true} : (tensor<2x3x257xf16>) -> tensor<2x3x1xf16>
  %1 = "kf.sum"(%a) {dims = array<i64: 1, 2>, keepdim = false} : (tensor<2x3x257xf16>) -> tensor<2xf16>
  %2 = "kf.reduce_max"(%a) {dims = array<i64: 2>, keepdim = false} : (tensor<2x3x257xf16>) -> tensor<2x3xf16>
  %3 = "kf.reduce_min"(%a) {dims = array<i64: 2>, keepdim = false} : (tensor<2x3x257xf16>) -> tensor<2x3xf16>
  // CHECK: "kf.var"(%arg0) {correction = 1.000000e+00 : f64, dims = array<i64: 2>, keepdim = true}
  %4 = "kf.var"(%a) {dims = array<i64: 2>, correction = 1.0 : f64, keepdim = true} : (tensor<2x3x257xf16>) -> tensor<2x3x1xf16>
  %5 = "kf.argmax"(%a) {dim = 2 : i64, keepdim = false} : (tensor<2x3x257xf16>) -> tensor<2x3xi64>
  %6 = "kf.softmax"(%a) {dim = -1 : i64} : (tensor<2x3x257xf16>) -> tensor<2x3x257xf16>
  %7 = "kf.log_softmax"(%a) {dim = -1 : i64} : (tensor<2x3x257xf16>) -> tensor<2x3x257xf16>
  return %0, %1, %2, %4, %5, %6, %7 : tensor<2x3x1xf16>, tensor<2xf16>, tensor<2x3xf16>, tensor<2x3x1xf16>, tensor<2x3xi64>, tensor<2x3x257xf16>, tensor<2x3x257xf16>
}

// CHECK-LABEL: func.func @contraction_and_layout
func.func @contraction_and_layout(%q: tensor<2x8x256x64xbf16>, %k: tensor<2x8x256x64xbf16>, %w: tensor<64x32xbf16>) -> (tensor<2x8x256x256xbf16>, tensor<2x8x256x32xbf16>) {
  // CHECK: "kf.transpose"(%arg1) {perm = array<i64: 0, 1, 3, 2>}
  %kt = "kf.transpose"(%k) {perm = array<i64: 0, 1, 3, 2>} : (tensor<2x8x256x64xbf16>) -> tensor<2x8x64x256xbf16>
  %s = "kf.matmul"(%q, %kt) : (tensor<2x8x256x64xbf16>, tensor<2x8x64x256xbf16>) -> tensor<2x8x256x256xbf16>
  // Batch dimensions broadcast: a 2-D rhs against a 4-D lhs.
  // CHECK: "kf.matmul"(%arg0, %arg2) : (tensor<2x8x256x64xbf16>, tensor<64x32xbf16>) -> tensor<2x8x256x32xbf16>
  %p = "kf.matmul"(%q, %w) : (tensor<2x8x256x64xbf16>, tensor<64x32xbf16>) -> tensor<2x8x256x32xbf16>
  %r = "kf.reshape"(%p) : (tensor<2x8x256x32xbf16>) -> tensor<16x256x32xbf16>
  %b = "kf.broadcast_to"(%w) : (tensor<64x32xbf16>) -> tensor<3x64x32xbf16>
  // CHECK: "kf.slice"(%{{.*}}) {dim = 1 : i64, end = 200 : i64, start = 10 : i64, step = 3 : i64} : (tensor<16x256x32xbf16>) -> tensor<16x64x32xbf16>
  %sl = "kf.slice"(%r) {dim = 1 : i64, start = 10 : i64, end = 200 : i64, step = 3 : i64} : (tensor<16x256x32xbf16>) -> tensor<16x64x32xbf16>
  // CHECK: "kf.concat"(%{{.*}}, %{{.*}}) {dim = 0 : i64} : (tensor<16x64x32xbf16>, tensor<3x64x32xbf16>) -> tensor<19x64x32xbf16>
  %c = "kf.concat"(%sl, %b) {dim = 0 : i64} : (tensor<16x64x32xbf16>, tensor<3x64x32xbf16>) -> tensor<19x64x32xbf16>
  return %s, %p : tensor<2x8x256x256xbf16>, tensor<2x8x256x32xbf16>
}

// CHECK-LABEL: func.func @selection_and_indexing
func.func @selection_and_indexing(%x: tensor<16x8xf32>, %idx: tensor<5xi64>, %g: tensor<16x2xi64>, %src: tensor<5x8xf32>) -> (tensor<16x2xf32>, tensor<16x2xi64>, tensor<5x8xf32>, tensor<16x2xf32>, tensor<16x8xf32>, tensor<16x8xf32>) {
  // CHECK: "kf.topk"(%arg0) {dim = 1 : i64, k = 2 : i64, largest = true} : (tensor<16x8xf32>) -> (tensor<16x2xf32>, tensor<16x2xi64>)
  %v:2 = "kf.topk"(%x) {k = 2 : i64, dim = 1 : i64, largest = true} : (tensor<16x8xf32>) -> (tensor<16x2xf32>, tensor<16x2xi64>)
  %rows = "kf.index_select"(%x, %idx) {dim = 0 : i64} : (tensor<16x8xf32>, tensor<5xi64>) -> tensor<5x8xf32>
  %ga = "kf.gather"(%x, %g) {dim = 1 : i64} : (tensor<16x8xf32>, tensor<16x2xi64>) -> tensor<16x2xf32>
  %ia = "kf.index_add"(%x, %idx, %src) {dim = 0 : i64} : (tensor<16x8xf32>, tensor<5xi64>, tensor<5x8xf32>) -> tensor<16x8xf32>
  %sa = "kf.scatter_add"(%x, %g, %ga) {dim = 1 : i64} : (tensor<16x8xf32>, tensor<16x2xi64>, tensor<16x2xf32>) -> tensor<16x8xf32>
  return %v#0, %v#1, %rows, %ga, %ia, %sa : tensor<16x2xf32>, tensor<16x2xi64>, tensor<5x8xf32>, tensor<16x2xf32>, tensor<16x8xf32>, tensor<16x8xf32>
}

// CHECK-LABEL: func.func @values_and_types
func.func @values_and_types() -> (tensor<3xf32>, tensor<2x2xf8E4M3FN>, tensor<4xf8E5M2>, tensor<2xi1>, tensor<2xi64>) {
  // CHECK: "kf.constant"() {value = dense<[1.000000e+00, 2.000000e+00, 3.000000e+00]> : tensor<3xf32>} : () -> tensor<3xf32>
  %c = "kf.constant"() {value = dense<[1.0, 2.0, 3.0]> : tensor<3xf32>} : () -> tensor<3xf32>
  // CHECK: "kf.fill"() {value = 5.000000e-01 : f64} : () -> tensor<2x2xf8E4M3FN>
  %f = "kf.fill"() {value = 0.5 : f64} : () -> tensor<2x2xf8E4M3FN>
  %e = "kf.fill"() {value = 2.0 : f64} : () -> tensor<4xf8E5M2>
  %b = "kf.fill"() {value = 1.0 : f64} : () -> tensor<2xi1>
  %i = "kf.fill"() {value = 7.0 : f64} : () -> tensor<2xi64>
  return %c, %f, %e, %b, %i : tensor<3xf32>, tensor<2x2xf8E4M3FN>, tensor<4xf8E5M2>, tensor<2xi1>, tensor<2xi64>
}

// CHECK-LABEL: func.func @indices
func.func @indices() -> (tensor<3x257xi64>, tensor<5xi32>) {
  // CHECK: "kf.iota"() {dim = 1 : i64} : () -> tensor<3x257xi64>
  %a = "kf.iota"() {dim = 1 : i64} : () -> tensor<3x257xi64>
  // CHECK: "kf.iota"() {dim = -1 : i64} : () -> tensor<5xi32>
  %b = "kf.iota"() {dim = -1 : i64} : () -> tensor<5xi32>
  return %a, %b : tensor<3x257xi64>, tensor<5xi32>
}

// CHECK-LABEL: func.func @scans
func.func @scans(%x: tensor<3x257xf32>, %i: tensor<7xi32>) -> (tensor<3x257xf32>, tensor<7xi32>) {
  // CHECK: "kf.scan"(%arg0) {dim = 1 : i64, kind = "logsumexp"} : (tensor<3x257xf32>) -> tensor<3x257xf32>
  %a = "kf.scan"(%x) {dim = 1 : i64, kind = "logsumexp"} : (tensor<3x257xf32>) -> tensor<3x257xf32>
  // CHECK: "kf.scan"(%arg1) {dim = 0 : i64, kind = "prod"} : (tensor<7xi32>) -> tensor<7xi32>
  %b = "kf.scan"(%i) {dim = 0 : i64, kind = "prod"} : (tensor<7xi32>) -> tensor<7xi32>
  return %a, %b : tensor<3x257xf32>, tensor<7xi32>
}

// CHECK-LABEL: func.func @scatter_reduce
func.func @scatter_reduce(%x: tensor<5x7xf32>, %i: tensor<3x7xi64>, %s: tensor<4x7xf32>) -> tensor<5x7xf32> {
  // CHECK: "kf.scatter_reduce"(%arg0, %arg1, %arg2) {dim = 0 : i64, include_self = false, reduce = "mean"}
  %0 = "kf.scatter_reduce"(%x, %i, %s) {dim = 0 : i64, reduce = "mean", include_self = false} : (tensor<5x7xf32>, tensor<3x7xi64>, tensor<4x7xf32>) -> tensor<5x7xf32>
  return %0 : tensor<5x7xf32>
}

// CHECK-LABEL: func.func @random
func.func @random(%state: tensor<2xi64>) -> (tensor<3x257xf32>, tensor<f32>) {
  // CHECK: "kf.rand"(%arg0) {distribution = "uniform", offset = 0 : i64} : (tensor<2xi64>) -> tensor<3x257xf32>
  %u = "kf.rand"(%state) {distribution = "uniform", offset = 0 : i64} : (tensor<2xi64>) -> tensor<3x257xf32>
  // CHECK: "kf.rand"(%arg0) {distribution = "normal", offset = 771 : i64} : (tensor<2xi64>) -> tensor<f32>
  %n = "kf.rand"(%state) {distribution = "normal", offset = 771 : i64} : (tensor<2xi64>) -> tensor<f32>
  return %u, %n : tensor<3x257xf32>, tensor<f32>
}

// CHECK-LABEL: func.func @trigonometry
func.func @trigonometry(%x: tensor<7xf32>) -> (tensor<7xf32>, tensor<7xf32>) {
  // CHECK: "kf.sin"(%arg0) : (tensor<7xf32>) -> tensor<7xf32>
  %a = "kf.sin"(%x) : (tensor<7xf32>) -> tensor<7xf32>
  // CHECK: "kf.cos"(%arg0) : (tensor<7xf32>) -> tensor<7xf32>
  %b = "kf.cos"(%x) : (tensor<7xf32>) -> tensor<7xf32>
  return %a, %b : tensor<7xf32>, tensor<7xf32>
}

// CHECK-LABEL: func.func @integer_ops
func.func @integer_ops(%x: tensor<7xi32>, %y: tensor<7xi32>) -> (tensor<7xi32>, tensor<7xi32>, tensor<7xi32>) {
  // CHECK: "kf.bitwise"(%arg0, %arg1) {kind = "shl"} : (tensor<7xi32>, tensor<7xi32>) -> tensor<7xi32>
  %a = "kf.bitwise"(%x, %y) {kind = "shl"} : (tensor<7xi32>, tensor<7xi32>) -> tensor<7xi32>
  // CHECK: "kf.div"(%arg0, %arg1) : (tensor<7xi32>, tensor<7xi32>) -> tensor<7xi32>
  %b = "kf.div"(%x, %y) : (tensor<7xi32>, tensor<7xi32>) -> tensor<7xi32>
  // CHECK: "kf.fmod"(%arg0, %arg1) : (tensor<7xi32>, tensor<7xi32>) -> tensor<7xi32>
  %c = "kf.fmod"(%x, %y) : (tensor<7xi32>, tensor<7xi32>) -> tensor<7xi32>
  return %a, %b, %c : tensor<7xi32>, tensor<7xi32>, tensor<7xi32>
}

// CHECK-LABEL: func.func @special_values
func.func @special_values(%x: tensor<7xf32>) -> (tensor<7xf32>, tensor<7xf32>, tensor<7xf32>, tensor<7xi1>) {
  // CHECK: "kf.erfc"(%arg0) : (tensor<7xf32>) -> tensor<7xf32>
  %a = "kf.erfc"(%x) : (tensor<7xf32>) -> tensor<7xf32>
  // CHECK: "kf.trunc"(%arg0) : (tensor<7xf32>) -> tensor<7xf32>
  %b = "kf.trunc"(%x) : (tensor<7xf32>) -> tensor<7xf32>
  // CHECK: "kf.round"(%arg0) : (tensor<7xf32>) -> tensor<7xf32>
  %c = "kf.round"(%x) : (tensor<7xf32>) -> tensor<7xf32>
  // CHECK: "kf.signbit"(%arg0) : (tensor<7xf32>) -> tensor<7xi1>
  %d = "kf.signbit"(%x) : (tensor<7xf32>) -> tensor<7xi1>
  return %a, %b, %c, %d : tensor<7xf32>, tensor<7xf32>, tensor<7xf32>, tensor<7xi1>
}
