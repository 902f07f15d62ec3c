// Invalid inputs of kf-recognize-moe, run by test/passes/kf-recognize-moe.mlir with
// --verify-diagnostics: the expert products and routing it matches are type-checked by
// kf-opt's verifier before it runs.

func.func @expert_weights_of_another_width(%x: tensor<5x16xf32>, %w: tensor<3x8x32xf32>) -> tensor<5x32xf32> {
  %0 = "kf.slice"(%w) {dim = 0 : i64, start = 0 : i64, end = 1 : i64, step = 1 : i64} : (tensor<3x8x32xf32>) -> tensor<1x8x32xf32>
  %1 = "kf.reshape"(%0) {shape = [8, 32]} : (tensor<1x8x32xf32>) -> tensor<8x32xf32>
  // expected-error @below {{'kf.matmul' op contracting dimensions differ: lhs [5, 16] has 16, rhs [8, 32] has 8}}
  %2 = "kf.matmul"(%x, %1) : (tensor<5x16xf32>, tensor<8x32xf32>) -> tensor<5x32xf32>
  return %2 : tensor<5x32xf32>
}

// -----

// The routing compares expert indices with arange(E) by equality.
func.func @unknown_predicate(%idx: tensor<5x2xi64>) -> tensor<5x2xi1> {
  // expected-error @below {{'kf.cmp' op predicate must be one of eq, ne, lt, le, gt, ge, got 'bogus'}}
  %0 = "kf.cmp"(%idx, %idx) {predicate = "bogus"} : (tensor<5x2xi64>, tensor<5x2xi64>) -> tensor<5x2xi1>
  return %0 : tensor<5x2xi1>
}
