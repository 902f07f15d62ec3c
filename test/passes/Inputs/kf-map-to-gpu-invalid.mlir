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

// -----

// A kf.plan must be whole: one cut short (here without the rowwise plan's threads,
// lanes and mode) is an error naming what it lacks, not a KeyError.
// expected-error @below {{kf-map-to-gpu: cannot write kernel @cut_plan: kf.plan has no 'threads', which the rowwise strategy's plans hold (kf-tile records whole plans)}}
func.func private @cut_plan(%a: tensor<4x8xf32>) -> tensor<4x8xf32> attributes {kf.kernel = "rowwise", kf.plan = {strategy = "rowwise"}} {
  %0 = "kf.softmax"(%a) {dim = -1 : i64} : (tensor<4x8xf32>) -> tensor<4x8xf32>
  return %0 : tensor<4x8xf32>
}

// -----

// A kf.plan names one of kf's strategies (not the generic fallback of kernel kinds).
// expected-error @below {{kf-map-to-gpu: cannot write kernel @no_such_strategy: kf.plan names the strategy 'tiled', which kf does not have (strategies: attention,}}
func.func private @no_such_strategy(%a: tensor<4x8xf32>) -> tensor<4x8xf32> attributes {kf.kernel = "elementwise", kf.plan = {strategy = "tiled", block = 256 : i64}} {
  %0 = "kf.exp"(%a) : (tensor<4x8xf32>) -> tensor<4x8xf32>
  return %0 : tensor<4x8xf32>
}

// -----

// A kernel's arguments and results have element types kf writes kernels for: complex
// numbers are not among them (kf-tile says the same where it plans first).
// expected-error @below {{kf-map-to-gpu: cannot write kernel @complex_copy: element type complex<f32> is not one of f64, f32, f16, bf16}}
func.func private @complex_copy(%a: tensor<4x8xcomplex<f32>>) -> tensor<4x8xcomplex<f32>> attributes {kf.kernel = "elementwise"} {
  return %a : tensor<4x8xcomplex<f32>>
}
