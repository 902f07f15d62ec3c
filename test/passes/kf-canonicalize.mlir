// RUN: kf-opt %s --split-input-file --pass-pipeline='builtin.module(kf-canonicalize)' | FileCheck %s
// Invalid inputs (Inputs/kf-canonicalize-invalid.mlir) and options:
// RUN: kf-opt %S/Inputs/kf-canonicalize-invalid.mlir --split-input-file --verify-diagnostics --pass-pipeline='builtin.module(kf-canonicalize)'
// RUN: not kf-opt %s --split-input-file --pass-pipeline='builtin.module(kf-canonicalize{max-iterations=many})' 2>&1 | FileCheck %s --check-prefix=BAD-INT
// BAD-INT: error: pass 'kf-canonicalize' option 'max-iterations' takes an int, got 'many'
// RUN: not kf-opt %s --split-input-file --pass-pipeline='builtin.module(kf-canonicalize{max-iterations=0})' 2>&1 | FileCheck %s --check-prefix=BAD-ZERO
// BAD-ZERO: error: pass 'kf-canonicalize': max-iterations must be 1 or more, got 0

// A broadcast feeding an elementwise op is dropped: kf ops broadcast implicitly.
// CHECK-LABEL: func.func @drop_broadcast
// CHECK-NOT: kf.broadcast_to
// CHECK: "kf.add"(%arg0, %arg1) : (tensor<4x8xf32>, tensor<8xf32>) -> tensor<4x8xf32>
func.func @drop_broadcast(%a: tensor<4x8xf32>, %b: tensor<8xf32>) -> tensor<4x8xf32> {
  %0 = "kf.broadcast_to"(%b) : (tensor<8xf32>) -> tensor<4x8xf32>
  %1 = "kf.add"(%a, %0) : (tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<4x8xf32>
  return %1 : tensor<4x8xf32>
}

// -----

// Arithmetic on fills folds; the product of 2 and 3 is one fill of 6.
// CHECK-LABEL: func.func @fold_fills
// CHECK: %[[SIX:.*]] = "kf.fill"() {value = 6.000000e+00 : f64} : () -> tensor<f32>
// CHECK: "kf.mul"(%arg0, %[[SIX]])
func.func @fold_fills(%a: tensor<4x8xf32>) -> tensor<4x8xf32> {
  %c = "kf.fill"() {value = 2.0} : () -> tensor<f32>
  %d = "kf.fill"() {value = 3.0} : () -> tensor<f32>
  %e = "kf.mul"(%c, %d) : (tensor<f32>, tensor<f32>) -> tensor<f32>
  %0 = "kf.mul"(%a, %e) : (tensor<4x8xf32>, tensor<f32>) -> tensor<4x8xf32>
  return %0 : tensor<4x8xf32>
}

// -----

// Identities vanish: x * 1, x + (-0), x - 0, -(-x).
// CHECK-LABEL: func.func @identities
// CHECK-NEXT: return %arg0
func.func @identities(%a: tensor<4x8xf32>) -> tensor<4x8xf32> {
  %one = "kf.fill"() {value = 1.0} : () -> tensor<f32>
  %zero = "kf.fill"() {value = 0.0} : () -> tensor<f32>
  %nzero = "kf.fill"() {value = -0.0} : () -> tensor<f32>
  %0 = "kf.mul"(%a, %one) : (tensor<4x8xf32>, tensor<f32>) -> tensor<4x8xf32>
  %1 = "kf.add"(%0, %nzero) : (tensor<4x8xf32>, tensor<f32>) -> tensor<4x8xf32>
  %2 = "kf.sub"(%1, %zero) : (tensor<4x8xf32>, tensor<f32>) -> tensor<4x8xf32>
  %3 = "kf.neg"(%2) : (tensor<4x8xf32>) -> tensor<4x8xf32>
  %4 = "kf.neg"(%3) : (tensor<4x8xf32>) -> tensor<4x8xf32>
  return %4 : tensor<4x8xf32>
}

// -----

// IEEE keeps x + 0 (it is +0 where x is -0), x - (-0) and x * 0 (NaN where x is inf
// or NaN): none of them folds.
// CHECK-LABEL: func.func @not_identities
// CHECK: "kf.add"(%arg0,
// CHECK: "kf.add"(%
// CHECK: "kf.sub"(%
// CHECK: "kf.mul"(%
func.func @not_identities(%a: tensor<4x8xf32>) -> tensor<4x8xf32> {
  %zero = "kf.fill"() {value = 0.0} : () -> tensor<f32>
  %nzero = "kf.fill"() {value = -0.0} : () -> tensor<f32>
  %0 = "kf.add"(%a, %zero) : (tensor<4x8xf32>, tensor<f32>) -> tensor<4x8xf32>
  %1 = "kf.add"(%zero, %0) : (tensor<f32>, tensor<4x8xf32>) -> tensor<4x8xf32>
  %2 = "kf.sub"(%1, %nzero) : (tensor<4x8xf32>, tensor<f32>) -> tensor<4x8xf32>
  %3 = "kf.mul"(%2, %zero) : (tensor<4x8xf32>, tensor<f32>) -> tensor<4x8xf32>
  return %3 : tensor<4x8xf32>
}

// -----

// Folds follow IEEE: 1 / -0 is -inf, max(NaN, 1) and max(1, NaN) are NaN, 0 ** -1 is inf
// and exp(1000) is inf (no Python exception).
// CHECK-LABEL: func.func @ieee_folds
// CHECK-DAG: "kf.fill"() {value = 0xFFF0000000000000 : f64}
// CHECK-DAG: "kf.fill"() {value = 0x7FF8000000000000 : f64}
// CHECK-DAG: "kf.fill"() {value = 0x7FF0000000000000 : f64}
func.func @ieee_folds() -> (tensor<f32>, tensor<f32>, tensor<f32>, tensor<f32>, tensor<f32>) {
  %one = "kf.fill"() {value = 1.0} : () -> tensor<f32>
  %nzero = "kf.fill"() {value = -0.0} : () -> tensor<f32>
  %zero = "kf.fill"() {value = 0.0} : () -> tensor<f32>
  %mone = "kf.fill"() {value = -1.0} : () -> tensor<f32>
  %big = "kf.fill"() {value = 1000.0} : () -> tensor<f32>
  %nan = "kf.fill"() {value = 0x7FF8000000000000 : f64} : () -> tensor<f32>
  %0 = "kf.div"(%one, %nzero) : (tensor<f32>, tensor<f32>) -> tensor<f32>
  %1 = "kf.max"(%one, %nan) : (tensor<f32>, tensor<f32>) -> tensor<f32>
  %2 = "kf.max"(%nan, %one) : (tensor<f32>, tensor<f32>) -> tensor<f32>
  %3 = "kf.pow"(%zero, %mone) : (tensor<f32>, tensor<f32>) -> tensor<f32>
  %4 = "kf.exp"(%big) : (tensor<f32>) -> tensor<f32>
  return %0, %1, %2, %3, %4 : tensor<f32>, tensor<f32>, tensor<f32>, tensor<f32>, tensor<f32>
}

// -----

// Integer kf.div and kf.fmod fold as C's / and % (toward zero, the dividend's sign), with
// kf's rule for divisors of 0 and -1: -7 / 2 = -3, -7 % 2 = -1, -7 / 0 = -7, -7 % 0 = 0.
// CHECK-LABEL: func.func @integer_division_folds
// CHECK-NOT: kf.div
// CHECK-NOT: kf.fmod
// CHECK-DAG: "kf.fill"() {value = -3.000000e+00 : f64} : () -> tensor<i64>
// CHECK-DAG: "kf.fill"() {value = -1.000000e+00 : f64} : () -> tensor<i64>
// CHECK-DAG: "kf.fill"() {value = -7.000000e+00 : f64} : () -> tensor<i64>
// CHECK-DAG: "kf.fill"() {value = 0.000000e+00 : f64} : () -> tensor<i64>
func.func @integer_division_folds() -> (tensor<i64>, tensor<i64>, tensor<i64>, tensor<i64>) {
  %a = "kf.fill"() {value = -7.0} : () -> tensor<i64>
  %two = "kf.fill"() {value = 2.0} : () -> tensor<i64>
  %zero = "kf.fill"() {value = 0.0} : () -> tensor<i64>
  %0 = "kf.div"(%a, %two) : (tensor<i64>, tensor<i64>) -> tensor<i64>
  %1 = "kf.fmod"(%a, %two) : (tensor<i64>, tensor<i64>) -> tensor<i64>
  %2 = "kf.div"(%a, %zero) : (tensor<i64>, tensor<i64>) -> tensor<i64>
  %3 = "kf.fmod"(%a, %zero) : (tensor<i64>, tensor<i64>) -> tensor<i64>
  return %0, %1, %2, %3 : tensor<i64>, tensor<i64>, tensor<i64>, tensor<i64>
}

// -----

// Dead kf ops are erased; chains of reshapes and transposes merge; no-op ones vanish.
// CHECK-LABEL: func.func @layout
// CHECK-NOT: kf.exp
// CHECK: %[[R:.*]] = "kf.reshape"(%arg0) : (tensor<2x3x4xf32>) -> tensor<24xf32>
// CHECK-NOT: kf.reshape
// CHECK-NOT: kf.transpose
// CHECK: return %[[R]]
func.func @layout(%a: tensor<2x3x4xf32>) -> tensor<24xf32> {
  %dead = "kf.exp"(%a) : (tensor<2x3x4xf32>) -> tensor<2x3x4xf32>
  %t0 = "kf.transpose"(%a) {perm = array<i64: 1, 0, 2>} : (tensor<2x3x4xf32>) -> tensor<3x2x4xf32>
  %t1 = "kf.transpose"(%t0) {perm = array<i64: 1, 0, 2>} : (tensor<3x2x4xf32>) -> tensor<2x3x4xf32>
  %r0 = "kf.reshape"(%t1) : (tensor<2x3x4xf32>) -> tensor<6x4xf32>
  %r1 = "kf.reshape"(%r0) : (tensor<6x4xf32>) -> tensor<24xf32>
  return %r1 : tensor<24xf32>
}

// -----

// A broadcast fill becomes a larger fill; a broadcast to its own shape is removed.
// CHECK-LABEL: func.func @broadcast_fill
// CHECK: "kf.fill"() {value = 5.000000e-01 : f64} : () -> tensor<4x8xf32>
// CHECK-NOT: kf.broadcast_to
func.func @broadcast_fill(%a: tensor<4x8xf32>) -> (tensor<4x8xf32>, tensor<4x8xf32>) {
  %h = "kf.fill"() {value = 0.5} : () -> tensor<f32>
  %b = "kf.broadcast_to"(%h) : (tensor<f32>) -> tensor<4x8xf32>
  %s = "kf.broadcast_to"(%a) : (tensor<4x8xf32>) -> tensor<4x8xf32>
  return %b, %s : tensor<4x8xf32>, tensor<4x8xf32>
}

// -----

// reshape(transpose of the last two dims) that only merges batch dims is the transpose
// of the reshape (so the reshape becomes a view and a matmul reads the transpose in place).
// CHECK-LABEL: func.func @reshape_of_transpose
// CHECK: %[[R:.*]] = "kf.reshape"(%arg0) : (tensor<2x4x128x64xf32>) -> tensor<8x128x64xf32>
// CHECK: %[[T:.*]] = "kf.transpose"(%[[R]]) {perm = array<i64: 0, 2, 1>} : (tensor<8x128x64xf32>) -> tensor<8x64x128xf32>
// CHECK: "kf.matmul"(%[[T]], %arg1)
func.func @reshape_of_transpose(%x: tensor<2x4x128x64xf32>, %y: tensor<8x128x32xf32>) -> tensor<8x64x32xf32> {
  %t = "kf.transpose"(%x) {perm = array<i64: 0, 1, 3, 2>} : (tensor<2x4x128x64xf32>) -> tensor<2x4x64x128xf32>
  %r = "kf.reshape"(%t) : (tensor<2x4x64x128xf32>) -> tensor<8x64x128xf32>
  %m = "kf.matmul"(%r, %y) : (tensor<8x64x128xf32>, tensor<8x128x32xf32>) -> tensor<8x64x32xf32>
  return %m : tensor<8x64x32xf32>
}

// -----

// A matmul of operands whose batch dims were merged (torch's 4-D matmul traced as bmm,
// k^T through a transpose of the merged reshape), reshaped back, is the 4-D matmul.
// CHECK-LABEL: func.func @batched_matmul
// CHECK: %[[T:.*]] = "kf.transpose"(%arg1) {perm = array<i64: 0, 1, 3, 2>}
// CHECK: %[[M:.*]] = "kf.matmul"(%arg0, %[[T]]) : (tensor<2x3x16x8xf32>, tensor<2x3x8x16xf32>) -> tensor<2x3x16x16xf32>
// CHECK-NOT: kf.reshape
// CHECK: return %[[M]]
func.func @batched_matmul(%q: tensor<2x3x16x8xf32>, %k: tensor<2x3x16x8xf32>) -> tensor<2x3x16x16xf32> {
  %q3 = "kf.reshape"(%q) : (tensor<2x3x16x8xf32>) -> tensor<6x16x8xf32>
  %k3 = "kf.reshape"(%k) : (tensor<2x3x16x8xf32>) -> tensor<6x16x8xf32>
  %kt = "kf.transpose"(%k3) {perm = array<i64: 0, 2, 1>} : (tensor<6x16x8xf32>) -> tensor<6x8x16xf32>
  %s = "kf.matmul"(%q3, %kt) : (tensor<6x16x8xf32>, tensor<6x8x16xf32>) -> tensor<6x16x16xf32>
  %s4 = "kf.reshape"(%s) : (tensor<6x16x16xf32>) -> tensor<2x3x16x16xf32>
  return %s4 : tensor<2x3x16x16xf32>
}

// -----

// A product whose batch dims are not those the operands were merged from stays 3-D.
// CHECK-LABEL: func.func @batched_matmul_other_dims
// CHECK: "kf.matmul"(%{{.*}}, %{{.*}}) : (tensor<6x16x8xf32>, tensor<6x8x4xf32>) -> tensor<6x16x4xf32>
func.func @batched_matmul_other_dims(%a: tensor<2x3x16x8xf32>, %b: tensor<3x2x8x4xf32>) -> tensor<2x3x16x4xf32> {
  %a3 = "kf.reshape"(%a) : (tensor<2x3x16x8xf32>) -> tensor<6x16x8xf32>
  %b3 = "kf.reshape"(%b) : (tensor<3x2x8x4xf32>) -> tensor<6x8x4xf32>
  %m = "kf.matmul"(%a3, %b3) : (tensor<6x16x8xf32>, tensor<6x8x4xf32>) -> tensor<6x16x4xf32>
  %m4 = "kf.reshape"(%m) : (tensor<6x16x4xf32>) -> tensor<2x3x16x4xf32>
  return %m4 : tensor<2x3x16x4xf32>
}

// -----

// A reshape that drops the unit dims a keepdim reduction kept is the reduction without
// keepdim (a bias's gradient, as autograd writes it); other reshapes of it stay.
// CHECK-LABEL: func.func @drop_kept_dims
// CHECK: %[[S:.*]] = "kf.sum"(%arg0) {dims = array<i64: 0>, keepdim = false} : (tensor<257x64xf32>) -> tensor<64xf32>
// CHECK-NOT: kf.reshape
// CHECK: return %[[S]]
func.func @drop_kept_dims(%x: tensor<257x64xf32>) -> tensor<64xf32> {
  %s = "kf.sum"(%x) {dims = array<i64: 0>, keepdim = true} : (tensor<257x64xf32>) -> tensor<1x64xf32>
  %r = "kf.reshape"(%s) : (tensor<1x64xf32>) -> tensor<64xf32>
  return %r : tensor<64xf32>
}

// CHECK-LABEL: func.func @keep_other_reshape
// CHECK: "kf.sum"(%arg0) {dims = array<i64: 1>, keepdim = true}
// CHECK: "kf.reshape"
func.func @keep_other_reshape(%x: tensor<4x6x8xf32>) -> tensor<32xf32> {
  %s = "kf.sum"(%x) {dims = array<i64: 1>, keepdim = true} : (tensor<4x6x8xf32>) -> tensor<4x1x8xf32>
  %r = "kf.reshape"(%s) : (tensor<4x1x8xf32>) -> tensor<32xf32>
  return %r : tensor<32xf32>
}

// -----

// A reshape of an iota that adds or drops unit dims is an iota of the new shape
// (arange(n)[:, None]); along a dim of size 1, a fill of 0. Other reshapes stay.
// CHECK-LABEL: func.func @iota_reshape
// CHECK-DAG: "kf.iota"() {dim = 0 : i64} : () -> tensor<37x1xi64>
// CHECK-DAG: "kf.iota"() {dim = 2 : i64} : () -> tensor<1x1x41xi64>
// CHECK-DAG: "kf.fill"() {value = 0.000000e+00 : f64} : () -> tensor<1x1xi64>
// CHECK-DAG: "kf.reshape"(%{{.*}}) : (tensor<6xi64>) -> tensor<2x3xi64>
func.func @iota_reshape() -> (tensor<37x1xi64>, tensor<1x1x41xi64>, tensor<1x1xi64>, tensor<2x3xi64>) {
  %a = "kf.iota"() {dim = 0 : i64} : () -> tensor<37xi64>
  %ra = "kf.reshape"(%a) : (tensor<37xi64>) -> tensor<37x1xi64>
  %b = "kf.iota"() {dim = -2 : i64} : () -> tensor<41x1xi64>
  %rb = "kf.reshape"(%b) : (tensor<41x1xi64>) -> tensor<1x1x41xi64>
  %c = "kf.iota"() {dim = 0 : i64} : () -> tensor<1xi64>
  %rc = "kf.reshape"(%c) : (tensor<1xi64>) -> tensor<1x1xi64>
  %d = "kf.iota"() {dim = 0 : i64} : () -> tensor<6xi64>
  %rd = "kf.reshape"(%d) : (tensor<6xi64>) -> tensor<2x3xi64>
  return %ra, %rb, %rc, %rd : tensor<37x1xi64>, tensor<1x1x41xi64>, tensor<1x1xi64>, tensor<2x3xi64>
}

// -----

// A reshape that adds unit dims to an elementwise op of iotas and fills
// (arange(n).float()[None, :, None] * 0.5) moves onto its operands, which fold: the op
// of an iota and a fill of the new shape, free for kf-fuse to compute where it is read.
// CHECK-LABEL: func.func @reshape_of_index_arithmetic
// CHECK-DAG: %[[I:.*]] = "kf.iota"() {dim = 1 : i64} : () -> tensor<1x9x1xi64>
// CHECK-DAG: %[[F:.*]] = "kf.cast"(%[[I]]) : (tensor<1x9x1xi64>) -> tensor<1x9x1xf32>
// CHECK: "kf.mul"(%[[F]], %{{.*}}) : (tensor<1x9x1xf32>, tensor<f32>) -> tensor<1x9x1xf32>
// CHECK-NOT: "kf.reshape"
func.func @reshape_of_index_arithmetic() -> tensor<1x9x1xf32> {
  %s = "kf.fill"() {value = 5.000000e-01 : f64} : () -> tensor<f32>
  %a = "kf.iota"() {dim = 0 : i64} : () -> tensor<9xi64>
  %f = "kf.cast"(%a) : (tensor<9xi64>) -> tensor<9xf32>
  %m = "kf.mul"(%f, %s) : (tensor<9xf32>, tensor<f32>) -> tensor<9xf32>
  %r = "kf.reshape"(%m) : (tensor<9xf32>) -> tensor<1x9x1xf32>
  return %r : tensor<1x9x1xf32>
}

// -----

// Of rank 0 (an index computed from fills, given to index_select as [1]), the op's
// operands are all rank 0: the reshape stays after it.
// CHECK-LABEL: func.func @reshape_of_scalar_index_arithmetic
// CHECK: %[[S:.*]] = "kf.select"(%{{.*}}, %{{.*}}, %{{.*}}) : (tensor<i1>, tensor<i64>, tensor<i64>) -> tensor<i64>
// CHECK: "kf.reshape"(%[[S]]) : (tensor<i64>) -> tensor<1xi64>
func.func @reshape_of_scalar_index_arithmetic() -> tensor<1xi64> {
  %x = "kf.fill"() {value = 1.000000e+00 : f64} : () -> tensor<i64>
  %y = "kf.fill"() {value = 5.000000e+00 : f64} : () -> tensor<i64>
  %c = "kf.cmp"(%x, %y) {predicate = "lt"} : (tensor<i64>, tensor<i64>) -> tensor<i1>
  %a = "kf.fill"() {value = 2.000000e+00 : f64} : () -> tensor<i64>
  %b = "kf.fill"() {value = 3.000000e+00 : f64} : () -> tensor<i64>
  %s = "kf.select"(%c, %a, %b) : (tensor<i1>, tensor<i64>, tensor<i64>) -> tensor<i64>
  %r = "kf.reshape"(%s) : (tensor<i64>) -> tensor<1xi64>
  return %r : tensor<1xi64>
}

// -----

// Along a run-time size the iota stays an iota (a ? is never a size of 1).
// CHECK-LABEL: func.func @iota_reshape_run_time
// CHECK-DAG: "kf.iota"() {dim = 0 : i64} : () -> tensor<?x1xi64>
// CHECK-DAG: "kf.iota"() {dim = 1 : i64} : () -> tensor<1x?xi64>
// CHECK-NOT: "kf.fill"
func.func @iota_reshape_run_time() -> (tensor<?x1xi64>, tensor<1x?xi64>) {
  %a = "kf.iota"() {dim = 0 : i64} : () -> tensor<?xi64>
  %ra = "kf.reshape"(%a) : (tensor<?xi64>) -> tensor<?x1xi64>
  %rb = "kf.reshape"(%a) : (tensor<?xi64>) -> tensor<1x?xi64>
  return %ra, %rb : tensor<?x1xi64>, tensor<1x?xi64>
}

// -----

// The run-time sizes of an iota or a fill (kf.sizes_from: the argument dim of each size)
// follow it through a reshape that adds a unit dim and through a transpose.
// CHECK-LABEL: func.func @sizes_from_kept
// CHECK-DAG: "kf.iota"() {dim = 1 : i64, kf.sizes_from = array<i64: -1, -1, 0, 1>} : () -> tensor<1x?xi64>
// CHECK-DAG: "kf.fill"() {kf.sizes_from = array<i64: 0, 1, 0, 0>, value = 1.000000e+00 : f64} : () -> tensor<?x?xf32>
func.func @sizes_from_kept(%x: tensor<?x?xf32>) -> (tensor<1x?xi64>, tensor<?x?xf32>) {
  %a = "kf.iota"() {dim = 0 : i64, kf.sizes_from = array<i64: 0, 1>} : () -> tensor<?xi64>
  %ra = "kf.reshape"(%a) : (tensor<?xi64>) -> tensor<1x?xi64>
  %one = "kf.fill"() {value = 1.0 : f64, kf.sizes_from = array<i64: 0, 0, 0, 1>} : () -> tensor<?x?xf32>
  %t = "kf.transpose"(%one) {perm = array<i64: 1, 0>} : (tensor<?x?xf32>) -> tensor<?x?xf32>
  return %ra, %t : tensor<1x?xi64>, tensor<?x?xf32>
}

// -----

// A transpose of a value made of fills and iotas alone (torch.triu(torch.ones(S, S)).T)
// moves onto them: no transpose remains, the iotas run along the permuted dims. A
// transpose of an argument stays.
// CHECK-LABEL: func.func @transpose_of_indices
// CHECK-NOT: "kf.transpose"(%{{.*}}) : (tensor<5x7xf32>)
// CHECK-DAG: "kf.iota"() {dim = 0 : i64} : () -> tensor<7x1xi64>
// CHECK-DAG: "kf.iota"() {dim = 1 : i64} : () -> tensor<1x5xi64>
// CHECK-DAG: "kf.fill"() {value = 1.000000e+00 : f64} : () -> tensor<7x5xf32>
// CHECK: "kf.transpose"(%arg0)
func.func @transpose_of_indices(%x: tensor<5x7xf32>) -> (tensor<7x5xf32>, tensor<7x5xf32>) {
  %one = "kf.fill"() {value = 1.0 : f64} : () -> tensor<5x7xf32>
  %zero = "kf.fill"() {value = 0.0 : f64} : () -> tensor<f32>
  %c = "kf.iota"() {dim = 1 : i64} : () -> tensor<1x7xi64>
  %r = "kf.iota"() {dim = -2 : i64} : () -> tensor<5x1xi64>
  %d = "kf.sub"(%c, %r) : (tensor<1x7xi64>, tensor<5x1xi64>) -> tensor<5x7xi64>
  %z = "kf.fill"() {value = 0.0 : f64} : () -> tensor<i64>
  %ge = "kf.cmp"(%d, %z) {predicate = "ge"} : (tensor<5x7xi64>, tensor<i64>) -> tensor<5x7xi1>
  %m = "kf.select"(%ge, %one, %zero) : (tensor<5x7xi1>, tensor<5x7xf32>, tensor<f32>) -> tensor<5x7xf32>
  %t = "kf.transpose"(%m) {perm = array<i64: 1, 0>} : (tensor<5x7xf32>) -> tensor<7x5xf32>
  %tx = "kf.transpose"(%x) {perm = array<i64: 1, 0>} : (tensor<5x7xf32>) -> tensor<7x5xf32>
  return %t, %tx : tensor<7x5xf32>, tensor<7x5xf32>
}

// -----

// A select of a fill and x, of x's shape and type, is x masked with the fill (autograd's
// trace of masked_fill(mask == 0, -1e9)); a select of two tensors stays.
// CHECK-LABEL: func.func @select_of_fill
// CHECK: %[[C:.*]] = "kf.cmp"
// CHECK: "kf.masked_fill"(%arg0, %[[C]]) {value = -1.000000e+09 : f64} : (tensor<2x7x7xf32>, tensor<7x7xi1>) -> tensor<2x7x7xf32>
// CHECK: "kf.select"(%[[C]], %arg0, %arg0)
// CHECK-NOT: kf.select
func.func @select_of_fill(%x: tensor<2x7x7xf32>, %mask: tensor<7x7xi64>) -> (tensor<2x7x7xf32>, tensor<2x7x7xf32>) {
  %zero = "kf.fill"() {value = 0.0 : f64} : () -> tensor<i64>
  %c = "kf.cmp"(%mask, %zero) {predicate = "eq"} : (tensor<7x7xi64>, tensor<i64>) -> tensor<7x7xi1>
  %low = "kf.fill"() {value = -1.0e9 : f64} : () -> tensor<f32>
  %0 = "kf.select"(%c, %low, %x) : (tensor<7x7xi1>, tensor<f32>, tensor<2x7x7xf32>) -> tensor<2x7x7xf32>
  %1 = "kf.select"(%c, %x, %x) : (tensor<7x7xi1>, tensor<2x7x7xf32>, tensor<2x7x7xf32>) -> tensor<2x7x7xf32>
  return %0, %1 : tensor<2x7x7xf32>, tensor<2x7x7xf32>
}

// -----

// Integer fills fold as the result's type holds them: 127 + 1 is -128 in i8, -5 cast to
// uint8 is 251, and a uint8 fill of 251 read as i32 is 251.
// CHECK-LABEL: func.func @fold_wrapping_fills
// CHECK-DAG: "kf.fill"() {value = -1.280000e+02 : f64} : () -> tensor<i8>
// CHECK-DAG: "kf.fill"() {value = 2.510000e+02 : f64} : () -> tensor<i32>
func.func @fold_wrapping_fills() -> (tensor<i8>, tensor<i32>) {
  %a = "kf.fill"() {value = 127.0} : () -> tensor<i8>
  %b = "kf.fill"() {value = 1.0} : () -> tensor<i8>
  %c = "kf.add"(%a, %b) : (tensor<i8>, tensor<i8>) -> tensor<i8>
  %d = "kf.fill"() {value = -5.0} : () -> tensor<i32>
  %e = "kf.cast"(%d) : (tensor<i32>) -> tensor<ui8>
  %f = "kf.cast"(%e) : (tensor<ui8>) -> tensor<i32>
  return %c, %f : tensor<i8>, tensor<i32>
}
