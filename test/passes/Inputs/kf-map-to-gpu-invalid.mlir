// Invalid inputs of kf-map-to-gpu, run by test/passes/kf-map-to-gpu.mlir with --verify-diagnostics.

// A kernel function holds kf ops: the strategies write gpu code for those only.
// expected-error @below {{kf-map-to-gpu: cannot write kernel @tensor_arith: the generic strategy has no rule for arith.addf}}
func.func private @tensor_arith(%a: tensor<4x8xf32>) -> tensor<4x8xf32> attributes {kf.kernel = "elementwise"} {
  %c = arith.constant dense<1.0> : tensor<4x8xf32>
  %0 = arith.addf %a, %c : tensor<4x8xf32>
  return %0 : tensor<4x8xf32>
}

// -----

// kf.plan is what kf-tile records: a dictionary.
// expected-error @below {{kf-map-to-gpu: kernel @bad_plan: kf.plan is "rowwise", not a plan (a dictionary such as kf-tile records)}}
func.func private @bad_plan(%a: tensor<4x8xf32>) -> tensor<4x8xf32> attributes {kf.kernel = "elementwise", kf.plan = "rowwise"} {
  %0 = "kf.exp"(%a) : (tensor<4x8xf32>) -> tensor<4x8xf32>
  return %0 : tensor<4x8xf32>
}

// -----

// expected-error @below {{kf-map-to-gpu: kernel @plan_list: kf.plan is [1, 2], not a plan}}
func.func private @plan_list(%a: tensor<4x8xf32>) -> tensor<4x8xf32> attributes {kf.kernel = "elementwise", kf.plan = [1, 2]} {
  %0 = "kf.exp"(%a) : (tensor<4x8xf32>) -> tensor<4x8xf32>
  return %0 : tensor<4x8xf32>
}

// -----

// An ill-typed kf op in a kernel: kf-opt's verifier reports it before any pass runs.
func.func private @ill_typed(%a: tensor<4x8xf32>, %b: tensor<5x8xf32>) -> tensor<4x8xf32> attributes {kf.kernel = "elementwise"} {
  // expected-error @below {{'kf.add' op shapes [4, 8] and [5, 8] do not broadcast}}
  %0 = "kf.add"(%a, %b) : (tensor<4x8xf32>, tensor<5x8xf32>) -> tensor<4x8xf32>
  return %0 : tensor<4x8xf32>
}
