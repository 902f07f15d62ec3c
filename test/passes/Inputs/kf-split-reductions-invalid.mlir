// Invalid inputs of kf-split-reductions, run by test/passes/kf-split-reductions.mlir with
// --verify-diagnostics: the reductions it splits are type-checked by kf-opt's verifier
// before it runs.

func.func @dim_out_of_range(%a: tensor<4x8xf32>) -> tensor<4xf32> {
  // expected-error @below {{'kf.sum' op dimension 2 is out of range for rank 2}}
  %0 = "kf.sum"(%a) {dims = array<i64: 2>, keepdim = false} : (tensor<4x8xf32>) -> tensor<4xf32>
  return %0 : tensor<4xf32>
}

// -----

func.func @reshape_of_another_size(%a: tensor<65536xf32>) -> tensor<8x4096xf32> {
  // expected-error @below {{'kf.reshape' op cannot reshape tensor<65536xf32> into tensor<8x4096xf32>}}
  %0 = "kf.reshape"(%a) {shape = [8, 4096]} : (tensor<65536xf32>) -> tensor<8x4096xf32>
  return %0 : tensor<8x4096xf32>
}
