// RUN: kf-opt %s --split-input-file --verify-diagnostics
// kf's verifier rejects ill-typed ops with a diagnostic at the op.

func.func @matmul_contraction(%a: tensor<4x8xf32>, %b: tensor<4x8xf32>) -> tensor<4x8xf32> {
  // expected-error @+1 {{'kf.matmul' op contracting dimensions differ: lhs [4, 8] has 8, rhs [4, 8] has 4}}
  %0 = "kf.matmul"(%a, %b) : (tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<4x8xf32>
  return %0 : tensor<4x8xf32>
}

// -----

func.func @no_broadcast(%a: tensor<4x8xf32>, %b: tensor<3xf32>) -> tensor<4x8xf32> {
  // expected-error @+1 {{'kf.add' op shapes [4, 8] and [3] do not broadcast}}
  %0 = "kf.add"(%a, %b) : (tensor<4x8xf32>, tensor<3xf32>) -> tensor<4x8xf32>
  return %0 : tensor<4x8xf32>
}

// -----

func.func @mixed_element_types(%a: tensor<4xf32>, %b: tensor<4xf16>) -> tensor<4xf32> {
  // expected-error @+1 {{'kf.mul' op operands must have one element type, got f16, f32}}
  %0 = "kf.mul"(%a, %b) : (tensor<4xf32>, tensor<4xf16>) -> tensor<4xf32>
  return %0 : tensor<4xf32>
}

// -----

func.func @wrong_reduced_shape(%a: tensor<4x8xf32>) -> tensor<4x8xf32> {
  // expected-error @+1 {{'kf.mean' op result #0 has type tensor<4x8xf32>, but the operands give tensor<4x1xf32>}}
  %0 = "kf.mean"(%a) {dims = array<i64: 1>, keepdim = true} : (tensor<4x8xf32>) -> tensor<4x8xf32>
  return %0 : tensor<4x8xf32>
}

// -----

func.func @dim_out_of_range(%a: tensor<4x8xf32>) -> tensor<4x8xf32> {
  // expected-error @+1 {{'kf.softmax' op dimension 2 is out of range for rank 2}}
  %0 = "kf.softmax"(%a) {dim = 2 : i64} : (tensor<4x8xf32>) -> tensor<4x8xf32>
  return %0 : tensor<4x8xf32>
}

// -----

func.func @exp_of_integers(%a: tensor<4xi32>) -> tensor<4xi32> {
  // expected-error @+1 {{'kf.exp' op operand must have a floating-point element type, got i32}}
  %0 = "kf.exp"(%a) : (tensor<4xi32>) -> tensor<4xi32>
  return %0 : tensor<4xi32>
}

// -----

func.func @mask_not_boolean(%a: tensor<4xf32>, %m: tensor<4xf32>) -> tensor<4xf32> {
  // expected-error @+1 {{'kf.masked_fill' op mask must be a tensor of i1, got f32}}
  %0 = "kf.masked_fill"(%a, %m) {value = 0.0 : f64} : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>
  return %0 : tensor<4xf32>
}

// -----

func.func @topk_too_large(%a: tensor<4x8xf32>) -> (tensor<4x9xf32>, tensor<4x9xi64>) {
  // expected-error @+1 {{'kf.topk' op k=9 is out of range for dimension 1 of size 8}}
  %v:2 = "kf.topk"(%a) {k = 9 : i64, dim = 1 : i64, largest = true} : (tensor<4x8xf32>) -> (tensor<4x9xf32>, tensor<4x9xi64>)
  return %v#0, %v#1 : tensor<4x9xf32>, tensor<4x9xi64>
}

// -----

func.func @bad_permutation(%a: tensor<4x8xf32>) -> tensor<8x4xf32> {
  // expected-error @+1 {{'kf.transpose' op perm [1, 1] is not a permutation of the 2 dimensions}}
  %0 = "kf.transpose"(%a) {perm = array<i64: 1, 1>} : (tensor<4x8xf32>) -> tensor<8x4xf32>
  return %0 : tensor<8x4xf32>
}

// -----

func.func @reshape_changes_size(%a: tensor<4x8xf32>) -> tensor<30xf32> {
  // expected-error @+1 {{'kf.reshape' op cannot reshape tensor<4x8xf32> into tensor<30xf32>}}
  %0 = "kf.reshape"(%a) : (tensor<4x8xf32>) -> tensor<30xf32>
  return %0 : tensor<30xf32>
}

// -----

// Every attribute is required; the builders fill in torch's defaults.
func.func @missing_attribute(%a: tensor<4x8xf32>) -> tensor<4x8xf32> {
  // expected-error @+1 {{'kf.softmax' op attribute "dim" is expected but not provided}}
  %0 = "kf.softmax"(%a) : (tensor<4x8xf32>) -> tensor<4x8xf32>
  return %0 : tensor<4x8xf32>
}

// -----

// Structural errors come from the IRDL definition, at parse time.
func.func @not_a_tensor(%a: tensor<4xf32>, %b: f32) -> tensor<4xf32> {
  // expected-error @+1 {{expected base type 'builtin.tensor' but got 'builtin.f32'}}
  %0 = "kf.add"(%a, %b) : (tensor<4xf32>, f32) -> tensor<4xf32>
  return %0 : tensor<4xf32>
}

// -----

func.func @attribute_kind(%a: tensor<4x8xf32>) -> tensor<4x1xf32> {
  // expected-error @+1 {{expected base attribute 'builtin.dense_array' but got 'builtin.integer'}}
  %0 = "kf.sum"(%a) {dims = 1 : i64, keepdim = true} : (tensor<4x8xf32>) -> tensor<4x1xf32>
  return %0 : tensor<4x1xf32>
}

// -----

func.func @rand_state(%s: tensor<2xi32>) -> tensor<4xf32> {
  // expected-error @+1 {{'kf.rand' op the random state must be a tensor<2xi64> ([seed, offset]), got tensor<2xi32>}}
  %0 = "kf.rand"(%s) {distribution = "uniform", offset = 0 : i64} : (tensor<2xi32>) -> tensor<4xf32>
  return %0 : tensor<4xf32>
}

// -----

func.func @iota_float() -> tensor<4xf32> {
  // expected-error @+1 {{'kf.iota' op kf.iota gives i32 or i64 indices (cast them after), got f32}}
  %0 = "kf.iota"() {dim = 0 : i64} : () -> tensor<4xf32>
  return %0 : tensor<4xf32>
}

// -----

func.func @iota_dim() -> tensor<4x2xi64> {
  // expected-error @+1 {{'kf.iota' op dimension 2 is out of range for rank 2}}
  %0 = "kf.iota"() {dim = 2 : i64} : () -> tensor<4x2xi64>
  return %0 : tensor<4x2xi64>
}

// -----

func.func @scan_kind(%x: tensor<4xf32>) -> tensor<4xf32> {
  // expected-error @+1 {{'kf.scan' op kind must be one of sum, prod, max, min, logsumexp, got 'mean'}}
  %0 = "kf.scan"(%x) {dim = 0 : i64, kind = "mean"} : (tensor<4xf32>) -> tensor<4xf32>
  return %0 : tensor<4xf32>
}

// -----

func.func @scan_integer_logsumexp(%x: tensor<4xi32>) -> tensor<4xi32> {
  // expected-error @+1 {{'kf.scan' op a logsumexp scan needs a float tensor, got i32}}
  %0 = "kf.scan"(%x) {dim = 0 : i64, kind = "logsumexp"} : (tensor<4xi32>) -> tensor<4xi32>
  return %0 : tensor<4xi32>
}

// -----

func.func @scatter_reduce_kind(%x: tensor<4xf32>, %i: tensor<2xi64>, %s: tensor<2xf32>) -> tensor<4xf32> {
  // expected-error @+1 {{'kf.scatter_reduce' op reduce must be one of none, sum, prod, amax, amin, mean, got 'max'}}
  %0 = "kf.scatter_reduce"(%x, %i, %s) {dim = 0 : i64, reduce = "max", include_self = true} : (tensor<4xf32>, tensor<2xi64>, tensor<2xf32>) -> tensor<4xf32>
  return %0 : tensor<4xf32>
}

// -----

func.func @rand_result(%s: tensor<2xi64>) -> tensor<4xbf16> {
  // expected-error @+1 {{'kf.rand' op kf.rand gives f32 samples (cast them after), got bf16}}
  %0 = "kf.rand"(%s) {distribution = "uniform", offset = 0 : i64} : (tensor<2xi64>) -> tensor<4xbf16>
  return %0 : tensor<4xbf16>
}

// -----

func.func @rand_distribution(%s: tensor<2xi64>) -> tensor<4xf32> {
  // expected-error @+1 {{'kf.rand' op distribution must be one of uniform, normal, got 'poisson'}}
  %0 = "kf.rand"(%s) {distribution = "poisson", offset = 0 : i64} : (tensor<2xi64>) -> tensor<4xf32>
  return %0 : tensor<4xf32>
}

// -----

func.func @bitwise_of_floats(%a: tensor<4xf32>) -> tensor<4xf32> {
  // expected-error @+1 {{'kf.bitwise' op bitwise and needs integer operands, got f32}}
  %0 = "kf.bitwise"(%a, %a) {kind = "and"} : (tensor<4xf32>, tensor<4xf32>) -> tensor<4xf32>
  return %0 : tensor<4xf32>
}

// -----

func.func @bitwise_kind(%a: tensor<4xi32>) -> tensor<4xi32> {
  // expected-error @+1 {{'kf.bitwise' op kind must be one of and, or, xor, shl, shr, got 'rotate'}}
  %0 = "kf.bitwise"(%a, %a) {kind = "rotate"} : (tensor<4xi32>, tensor<4xi32>) -> tensor<4xi32>
  return %0 : tensor<4xi32>
}

// -----

func.func @division_of_booleans(%a: tensor<4xi1>) -> tensor<4xi1> {
  // expected-error @+1 {{'kf.div' op operands must be numbers, got i1 (booleans)}}
  %0 = "kf.div"(%a, %a) : (tensor<4xi1>, tensor<4xi1>) -> tensor<4xi1>
  return %0 : tensor<4xi1>
}
