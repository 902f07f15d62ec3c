// RUN: kf-opt %s --split-input-file --pass-pipeline='builtin.module(kf-split-scans)' | FileCheck %s

// A cumsum along 5000 elements: blocks of 250 (the largest divisor of 5000 up to 256),
// each block scanned by one thread, the 20 blocks' totals scanned, shifted by one block
// (0 first) and added to every element of the next block.
// CHECK-LABEL: func.func @divisible
// CHECK: %[[Z:.*]] = "kf.fill"() {value = 0.000000e+00 : f64} : () -> tensor<3x1xf32>
// CHECK-NEXT: %[[B:.*]] = "kf.reshape"(%arg0) : (tensor<3x5000xf32>) -> tensor<3x20x250xf32>
// CHECK-NEXT: %[[S:.*]] = "kf.scan"(%[[B]]) {dim = 2 : i64, kind = "sum"} : (tensor<3x20x250xf32>) -> tensor<3x20x250xf32>
// CHECK-NEXT: %[[L:.*]] = "kf.slice"(%[[S]]) {dim = 2 : i64, end = 250 : i64, start = 249 : i64, step = 1 : i64}
// CHECK-NEXT: %[[T:.*]] = "kf.reshape"(%[[L]]) : (tensor<3x20x1xf32>) -> tensor<3x20xf32>
// CHECK-NEXT: %[[TS:.*]] = "kf.scan"(%[[T]]) {dim = 1 : i64, kind = "sum"} : (tensor<3x20xf32>) -> tensor<3x20xf32>
// CHECK-NEXT: %[[E:.*]] = "kf.slice"(%[[TS]]) {dim = 1 : i64, end = 19 : i64, start = 0 : i64, step = 1 : i64}
// CHECK-NEXT: %[[C:.*]] = "kf.concat"(%[[Z]], %[[E]]) {dim = 1 : i64}
// CHECK-NEXT: %[[CB:.*]] = "kf.reshape"(%[[C]]) : (tensor<3x20xf32>) -> tensor<3x20x1xf32>
// CHECK-NEXT: %[[A:.*]] = "kf.add"(%[[CB]], %[[S]]) : (tensor<3x20x1xf32>, tensor<3x20x250xf32>) -> tensor<3x20x250xf32>
// CHECK-NEXT: %[[R:.*]] = "kf.reshape"(%[[A]]) : (tensor<3x20x250xf32>) -> tensor<3x5000xf32>
// CHECK-NEXT: return %[[R]]
func.func @divisible(%x: tensor<3x5000xf32>) -> tensor<3x5000xf32> {
  %0 = "kf.scan"(%x) {dim = 1 : i64, kind = "sum"} : (tensor<3x5000xf32>) -> tensor<3x5000xf32>
  return %0 : tensor<3x5000xf32>
}

// -----

// A prime length along dim 0: padded by zeros to 9 blocks of 256 (no kept result reads
// them), combined by max; before the first block the row's first element (the first
// block's running maxima hold it), the padding sliced off.
// CHECK-LABEL: func.func @prime_max
// CHECK: %[[F:.*]] = "kf.slice"(%arg0) {dim = 0 : i64, end = 1 : i64, start = 0 : i64, step = 1 : i64} : (tensor<2099x2xf32>) -> tensor<1x2xf32>
// CHECK-NEXT: %[[P:.*]] = "kf.fill"() {value = 0.000000e+00 : f64} : () -> tensor<205x2xf32>
// CHECK-NEXT: %[[X:.*]] = "kf.concat"(%arg0, %[[P]]) {dim = 0 : i64} : (tensor<2099x2xf32>, tensor<205x2xf32>) -> tensor<2304x2xf32>
// CHECK-NEXT: "kf.reshape"(%[[X]]) : (tensor<2304x2xf32>) -> tensor<9x256x2xf32>
// CHECK: "kf.scan"({{.*}}) {dim = 1 : i64, kind = "max"} : (tensor<9x256x2xf32>)
// CHECK: "kf.scan"({{.*}}) {dim = 0 : i64, kind = "max"} : (tensor<9x2xf32>)
// CHECK: "kf.concat"(%[[F]], {{.*}}) {dim = 0 : i64} : (tensor<1x2xf32>, tensor<8x2xf32>) -> tensor<9x2xf32>
// CHECK: "kf.max"({{.*}}) : (tensor<9x1x2xf32>, tensor<9x256x2xf32>) -> tensor<9x256x2xf32>
// CHECK: "kf.slice"({{.*}}) {dim = 0 : i64, end = 2099 : i64, start = 0 : i64, step = 1 : i64} : (tensor<2304x2xf32>) -> tensor<2099x2xf32>
func.func @prime_max(%x: tensor<2099x2xf32>) -> tensor<2099x2xf32> {
  %0 = "kf.scan"(%x) {dim = 0 : i64, kind = "max"} : (tensor<2099x2xf32>) -> tensor<2099x2xf32>
  return %0 : tensor<2099x2xf32>
}

// -----

// bf16 is scanned in f32 and rounded once; a logsumexp combine keeps an infinite
// maximum (no NaN from -inf - -inf).
// CHECK-LABEL: func.func @bf16_logsumexp
// CHECK: "kf.cast"(%arg0) : (tensor<4096xbf16>) -> tensor<4096xf32>
// CHECK: "kf.scan"({{.*}}) {dim = 1 : i64, kind = "logsumexp"} : (tensor<16x256xf32>)
// CHECK: "kf.select"
// CHECK: "kf.cast"({{.*}}) : (tensor<4096xf32>) -> tensor<4096xbf16>
func.func @bf16_logsumexp(%x: tensor<4096xbf16>) -> tensor<4096xbf16> {
  %0 = "kf.scan"(%x) {dim = 0 : i64, kind = "logsumexp"} : (tensor<4096xbf16>) -> tensor<4096xbf16>
  return %0 : tensor<4096xbf16>
}

// -----

// Two levels: 2^20 elements are 4096 blocks, whose totals are split again (16 x 256).
// CHECK-LABEL: func.func @two_levels
// CHECK: "kf.scan"({{.*}}) {dim = 1 : i64, kind = "sum"} : (tensor<4096x256xi64>)
// CHECK: "kf.scan"({{.*}}) {dim = 1 : i64, kind = "sum"} : (tensor<16x256xi64>)
// CHECK: "kf.scan"({{.*}}) {dim = 0 : i64, kind = "sum"} : (tensor<16xi64>)
func.func @two_levels(%x: tensor<1048576xi64>) -> tensor<1048576xi64> {
  %0 = "kf.scan"(%x) {dim = 0 : i64, kind = "sum"} : (tensor<1048576xi64>) -> tensor<1048576xi64>
  return %0 : tensor<1048576xi64>
}

// -----

// Short scans and scans along a run-time size stay one loop.
// CHECK-LABEL: func.func @left_alone
// CHECK-NEXT: "kf.scan"(%arg0) {dim = 1 : i64, kind = "sum"} : (tensor<3x2048xf32>)
// CHECK-NEXT: "kf.scan"(%arg1) {dim = 0 : i64, kind = "prod"} : (tensor<?xf32>)
// CHECK-NEXT: return
func.func @left_alone(%x: tensor<3x2048xf32>, %y: tensor<?xf32>) -> (tensor<3x2048xf32>, tensor<?xf32>) {
  %0 = "kf.scan"(%x) {dim = 1 : i64, kind = "sum"} : (tensor<3x2048xf32>) -> tensor<3x2048xf32>
  %1 = "kf.scan"(%y) {dim = 0 : i64, kind = "prod"} : (tensor<?xf32>) -> tensor<?xf32>
  return %0, %1 : tensor<3x2048xf32>, tensor<?xf32>
}
