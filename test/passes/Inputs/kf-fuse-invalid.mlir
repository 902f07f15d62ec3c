// Invalid inputs of kf-fuse, run by test/passes/kf-fuse.mlir with --verify-diagnostics:
// the ops it partitions into kernels are type-checked by kf-opt's verifier before it runs.

func.func @softmax_dim_out_of_range(%a: tensor<4x8xf32>) -> tensor<4x8xf32> {
  // expected-error @below {{'kf.softmax' op dimension 2 is out of range for rank 2}}
  %0 = "kf.softmax"(%a) {dim = 2 : i64} : (tensor<4x8xf32>) -> tensor<4x8xf32>
  return %0 : tensor<4x8xf32>
}

// -----

func.func @operands_do_not_broadcast(%a: tensor<4x8xf32>, %b: tensor<5x8xf32>) -> tensor<4x8xf32> {
  // expected-error @below {{'kf.add' op shapes [4, 8] and [5, 8] do not broadcast}}
  %0 = "kf.add"(%a, %b) : (tensor<4x8xf32>, tensor<5x8xf32>) -> tensor<4x8xf32>
  return %0 : tensor<4x8xf32>
}

// -----

func.func @dynamic_shape(%a: tensor<?x8xf32>) -> tensor<?x8xf32> {
  // expected-error @below {{'kf.exp' op expected a static shape, got tensor<?x8xf32>}}
  %0 = "kf.exp"(%a) : (tensor<?x8xf32>) -> tensor<?x8xf32>
  return %0 : tensor<?x8xf32>
}
