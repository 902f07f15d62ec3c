// Invalid inputs of kf-canonicalize, run by test/passes/kf-canonicalize.mlir with
// --verify-diagnostics. kf-opt verifies every kf op after parsing, so the shape rules
// kf-canonicalize folds by (broadcasts, reshapes, transposes) are checked before it runs.

func.func @bad_broadcast(%a: tensor<4x8xf32>) -> tensor<5x8xf32> {
  // expected-error @below {{'kf.broadcast_to' op shapes [4, 8] and [5, 8] do not broadcast}}
  %0 = "kf.broadcast_to"(%a) {shape = [5, 8]} : (tensor<4x8xf32>) -> tensor<5x8xf32>
  return %0 : tensor<5x8xf32>
}

// -----

func.func @bad_reshape(%a: tensor<4x8xf32>) -> tensor<4x9xf32> {
  // expected-error @below {{'kf.reshape' op cannot reshape tensor<4x8xf32> into tensor<4x9xf32>}}
  %0 = "kf.reshape"(%a) {shape = [4, 9]} : (tensor<4x8xf32>) -> tensor<4x9xf32>
  return %0 : tensor<4x9xf32>
}

// -----

func.func @bad_transpose(%a: tensor<4x8xf32>) -> tensor<8x4xf32> {
  // expected-error @below {{'kf.transpose' op perm [0, 0] is not a permutation of the 2 dimensions}}
  %0 = "kf.transpose"(%a) {perm = array<i64: 0, 0>} : (tensor<4x8xf32>) -> tensor<8x4xf32>
  return %0 : tensor<8x4xf32>
}

// -----

// An op kf does not define.
func.func @unknown_op(%a: tensor<4x8xf32>) -> tensor<4x8xf32> {
  // expected-error @below {{unregistered operation 'kf.frobnicate' found in dialect ('kf') that does not allow unknown operations}}
  %0 = "kf.frobnicate"(%a) : (tensor<4x8xf32>) -> tensor<4x8xf32>
  return %0 : tensor<4x8xf32>
}
