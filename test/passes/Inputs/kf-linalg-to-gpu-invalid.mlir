// Shapes known only at run time: the kernels' launch geometry is fixed when they are written.
func.func private @kf_round(%arg0: tensor<?xf32>) -> tensor<?xf32> attributes {kf.aten = "aten.round.default"} {
  %c0 = arith.constant 0 : index
  %n = tensor.dim %arg0, %c0 : tensor<?xf32>
  %0 = tensor.empty(%n) : tensor<?xf32>
  %1 = linalg.generic {indexing_maps = [affine_map<(d0) -> (d0)>, affine_map<(d0) -> (d0)>], iterator_types = ["parallel"]} ins(%arg0 : tensor<?xf32>) outs(%0 : tensor<?xf32>) {
  ^bb0(%in: f32, %out: f32):
    %2 = math.roundeven %in : f32
    linalg.yield %2 : f32
  } -> tensor<?xf32>
  return %1 : tensor<?xf32>
}
func.func @f(%x: tensor<?xf32>) -> tensor<?xf32> {
  // expected-error @+1 {{aten.round.default: its torch-mlir lowering has dynamic shapes}}
  %r = call @kf_round(%x) : (tensor<?xf32>) -> tensor<?xf32>
  return %r : tensor<?xf32>
}
