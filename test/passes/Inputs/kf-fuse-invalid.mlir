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

// kf-fuse partitions straight-line functions, as kf's capture writes them: branches are
// an error at the function rather than a crash.
// expected-error @below {{kf-fuse: function @branches has 3 blocks: kf-fuse partitions straight-line functions (one block, as kf's capture writes them)}}
func.func @branches(%a: tensor<4xf32>, %c: i1) -> tensor<4xf32> {
  cf.cond_br %c, ^bb1, ^bb2
^bb1:
  %0 = "kf.exp"(%a) : (tensor<4xf32>) -> tensor<4xf32>
  return %0 : tensor<4xf32>
^bb2:
  %1 = "kf.neg"(%a) : (tensor<4xf32>) -> tensor<4xf32>
  return %1 : tensor<4xf32>
}

// -----

// An op on tensors that is neither a kf op nor a call sits between kernels kf-fuse
// cannot order it with (it wrote IR whose values did not dominate their uses).
func.func @foreign_tensor_op(%a: tensor<4xf32>) -> tensor<4xf32> {
  %0 = "kf.exp"(%a) : (tensor<4xf32>) -> tensor<4xf32>
  // expected-error @below {{kf-fuse: arith.addf on tensors in @foreign_tensor_op: kf-fuse partitions kf ops and calls}}
  %1 = arith.addf %0, %0 : tensor<4xf32>
  %2 = "kf.neg"(%1) : (tensor<4xf32>) -> tensor<4xf32>
  return %2 : tensor<4xf32>
}
