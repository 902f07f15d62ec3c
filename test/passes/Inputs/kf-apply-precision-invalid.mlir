// Invalid inputs of kf-apply-precision, run by test/passes/kf-apply-precision.mlir with
// --verify-diagnostics: the products and reductions it rewrites are type-checked by
// kf-opt's verifier before it runs.

func.func @contracting_dims_differ(%a: tensor<4x8xf32>, %b: tensor<5x3xf32>) -> tensor<4x3xf32> {
  // expected-error @below {{'kf.matmul' op contracting dimensions differ: lhs [4, 8] has 8, rhs [5, 3] has 5}}
  %0 = "kf.matmul"(%a, %b) : (tensor<4x8xf32>, tensor<5x3xf32>) -> tensor<4x3xf32>
  return %0 : tensor<4x3xf32>
}

// -----

func.func @sum_dim_out_of_range(%a: tensor<4x8xf32>) -> tensor<4xf32> {
  // expected-error @below {{'kf.sum' op dimension 2 is out of range for rank 2}}
  %0 = "kf.sum"(%a) {dims = array<i64: 2>, keepdim = false} : (tensor<4x8xf32>) -> tensor<4xf32>
  return %0 : tensor<4xf32>
}

// -----

func.func @unknown_op(%a: tensor<4x8xf32>) -> tensor<4x8xf32> {
  // expected-error @below {{unregistered operation 'kf.amax' found in dialect ('kf') that does not allow unknown operations}}
  %0 = "kf.amax"(%a) : (tensor<4x8xf32>) -> tensor<4x8xf32>
  return %0 : tensor<4x8xf32>
}
