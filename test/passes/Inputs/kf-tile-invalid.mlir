// Invalid inputs of kf-tile, run by test/passes/kf-tile.mlir with --verify-diagnostics.

// A kernel over an element type kf has no kernels for.
// expected-error @below {{kf-tile: cannot plan kernel @complex: element type complex<f32> is not one of f64, f32, f16, bf16, f8E4M3FN, f8E5M2, i1, i8, ui8, i16, i32, i64}}
func.func private @complex(%a: tensor<4x8xcomplex<f32>>) -> tensor<4x8xcomplex<f32>> attributes {kf.kernel = "elementwise"} {
  return %a : tensor<4x8xcomplex<f32>>
}

// -----

// expected-error @below {{kf-tile: cannot plan kernel @halfwords: element type ui16 is not one of}}
func.func private @halfwords(%a: tensor<64xui16>) -> tensor<64xui16> attributes {kf.kernel = "elementwise"} {
  return %a : tensor<64xui16>
}

// -----

// A run-time size after a tensor's first dim that is not 1 makes its strides run-time
// sizes: the generic strategy takes such kernels where its per-element work stays small
// (kf-tile's GENERIC_RUN_TIME_WORK); a softmax over rows of 2048 stays the rowwise
// strategy's, which takes no run-time strides.
// expected-error @below {{kf-tile: cannot plan kernel @dynamic: tensor<4x?x2048xf32> has a run-time size after its first dim that is not 1}}
func.func private @dynamic(%a: tensor<4x?x2048xf32>) -> tensor<4x?x2048xf32> attributes {kf.kernel = "rowwise"} {
  %0 = "kf.softmax"(%a) {dim = -1 : i64} : (tensor<4x?x2048xf32>) -> tensor<4x?x2048xf32>
  return %0 : tensor<4x?x2048xf32>
}

// -----

// Two run-time sizes in one tensor.
// expected-error @below {{kf-tile: cannot plan kernel @generic: tensor<?x?xf32> has more than one run-time size}}
func.func private @generic(%a: tensor<?x?xf32>) -> tensor<?x?xf32> attributes {kf.kernel = "generic"} {
  %0 = "kf.exp"(%a) : (tensor<?x?xf32>) -> tensor<?x?xf32>
  return %0 : tensor<?x?xf32>
}
