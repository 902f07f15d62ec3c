// An ill-typed kf op: kf-opt verifies after parsing, as mlir-opt does.
func.func @f(%a: tensor<4x8xf32>) -> tensor<4x8xf32> {
  %0 = "kf.matmul"(%a, %a) : (tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<4x8xf32>
  return %0 : tensor<4x8xf32>
}
