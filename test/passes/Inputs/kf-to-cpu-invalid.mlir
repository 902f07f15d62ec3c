// Invalid inputs of kf-to-cpu, run by test/passes/kf-to-cpu.mlir with --verify-diagnostics.

// kf-to-cpu takes linalg on tensors: a kf op means kf-lower-to-linalg has not run.
func.func @not_lowered(%a: tensor<4x8xf32>) -> tensor<4x8xf32> {
  // expected-error @below {{kf-to-cpu: kf.exp is not lowered: run kf-lower-to-linalg before kf-to-cpu}}
  %0 = "kf.exp"(%a) : (tensor<4x8xf32>) -> tensor<4x8xf32>
  return %0 : tensor<4x8xf32>
}

// -----

// The compiled function takes ranked tensors (of static or run-time sizes).
// expected-error @below {{kf-to-cpu: @buffers: argument 0 is memref<4xf32>; kf-to-cpu takes ranked tensors}}
func.func @buffers(%a: memref<4xf32>) -> memref<4xf32> {
  return %a : memref<4xf32>
}

// -----

// expected-error @below {{kf-to-cpu: @unranked: result 0 is tensor<*xf32>; kf-to-cpu takes ranked tensors}}
func.func @unranked(%a: tensor<4xf32>) -> tensor<*xf32> {
  %0 = tensor.cast %a : tensor<4xf32> to tensor<*xf32>
  return %0 : tensor<*xf32>
}

// -----

// Control flow between blocks: kf functions are one block.
// expected-error @below {{kf-to-cpu: @branches has 3 blocks; kf-to-cpu takes single-block functions}}
func.func @branches(%a: tensor<4xf32>, %c: i1) -> tensor<4xf32> {
  cf.cond_br %c, ^bb1, ^bb2
^bb1:
  return %a : tensor<4xf32>
^bb2:
  return %a : tensor<4xf32>
}
