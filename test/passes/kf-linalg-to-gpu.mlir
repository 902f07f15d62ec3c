// RUN: kf-opt %s --split-input-file --pass-pipeline='builtin.module(kf-linalg-to-gpu{target=spirv})' | FileCheck %s
// Both back ends take the kernels (spirv-val runs inside kf-to-spirv, ptxas where installed):
// RUN: kf-opt %s --split-input-file --pass-pipeline='builtin.module(kf-linalg-to-gpu{target=spirv}, kf-to-spirv)' | FileCheck %s --check-prefix=BIN
// RUN: kf-opt %s --split-input-file --pass-pipeline='builtin.module(kf-linalg-to-gpu{target=cuda}, kf-to-cuda)' | FileCheck %s --check-prefix=BIN
// Booleans are bytes on CUDA (the CUDA prefix):
// RUN: kf-opt %s --split-input-file --pass-pipeline='builtin.module(kf-linalg-to-gpu{target=cuda})' | FileCheck %s --check-prefix=CUDA
// What the pass cannot write is an error at the call:
// RUN: kf-opt %S/Inputs/kf-linalg-to-gpu-invalid.mlir --split-input-file --verify-diagnostics --pass-pipeline='builtin.module(kf-linalg-to-gpu{target=spirv})'

// An elementwise generic: one kernel, one point a thread, writing a buffer the
// schedule allocates (kf.empty) in place (kf.tied names the operand it writes).
// CHECK-LABEL: func.func private @kf_round_c0_buffer0() -> tensor<3x5xf32> attributes {kf.empty}
// CHECK: func.func private @kf_round_c0_k0(tensor<3x5xf32>, tensor<3x5xf32>) -> tensor<3x5xf32>
// CHECK-SAME: kf.gpu_func = @kf_kernels::@kf_round_c0_k0, kf.tied = array<i64: 1>
// CHECK: func.func @f(%[[X:.*]]: tensor<3x5xf32>)
// CHECK: %[[B:.*]] = call @kf_round_c0_buffer0()
// CHECK: %[[R:.*]] = call @kf_round_c0_k0(%[[X]], %[[B]])
// CHECK: return %[[R]]
// CHECK: gpu.func @kf_round_c0_k0(%[[IN:.*]]: memref<3x5xf32>, %[[OUT:.*]]: memref<3x5xf32>) kernel
// CHECK-SAME: kf.block = array<i64: 256, 1, 1>, kf.fused_lines = ["-:{{[0-9]+}}"], kf.grid = array<i64: 1, 1, 1>
// CHECK-SAME: kf.strategy = "linalg"
// CHECK: arith.cmpi ult, %{{.*}}, %c15
// CHECK: math.roundeven
// CHECK: memref.store %{{.*}}, %[[OUT]]
// CHECK-NOT: kf.aten
// BIN: gpu.binary @kf_kernels
func.func private @kf_round(%arg0: tensor<3x5xf32>) -> tensor<3x5xf32> attributes {kf.aten = "aten.round.default"} {
  %0 = tensor.empty() : tensor<3x5xf32>
  %1 = linalg.generic {indexing_maps = [affine_map<(d0, d1) -> (d0, d1)>, affine_map<(d0, d1) -> (d0, d1)>], iterator_types = ["parallel", "parallel"]} ins(%arg0 : tensor<3x5xf32>) outs(%0 : tensor<3x5xf32>) {
  ^bb0(%in: f32, %out: f32):
    %2 = math.roundeven %in : f32
    linalg.yield %2 : f32
  } -> tensor<3x5xf32>
  return %1 : tensor<3x5xf32>
}
func.func @f(%x: tensor<3x5xf32>) -> tensor<3x5xf32> {
  %r = call @kf_round(%x) : (tensor<3x5xf32>) -> tensor<3x5xf32>
  return %r : tensor<3x5xf32>
}

// -----

// A sum over the rows (the reduction loop first in the generic): the fill is one kernel,
// the sum another whose threads each own a column and loop over the rows, so no two
// threads write one element. Both write the same buffer: the second is tied to the first.
// CHECK-LABEL: func.func private @kf_sum_c0_buffer0() -> tensor<7xf32> attributes {kf.empty}
// CHECK: func.func private @kf_sum_c0_k0(tensor<7xf32>) -> tensor<7xf32> attributes {{{.*}}kf.tied = array<i64: 0>}
// CHECK: func.func private @kf_sum_c0_k1(tensor<5x7xf32>, tensor<7xf32>) -> tensor<7xf32> attributes {{{.*}}kf.tied = array<i64: 1>}
// CHECK: %[[B:.*]] = call @kf_sum_c0_buffer0()
// CHECK: %[[Z:.*]] = call @kf_sum_c0_k0(%[[B]])
// CHECK: %[[S:.*]] = call @kf_sum_c0_k1(%{{.*}}, %[[Z]])
// CHECK: return %[[S]]
// CHECK: gpu.func @kf_sum_c0_k1(%[[IN:.*]]: memref<5x7xf32>, %[[OUT:.*]]: memref<7xf32>) kernel
// CHECK: scf.if
// CHECK: scf.for %[[ROW:.*]] = %c0 to %c5 step %c1
// CHECK: memref.load %[[IN]][%[[ROW]], %{{.*}}]
// CHECK: arith.addf
// CHECK: memref.store %{{.*}}, %[[OUT]]
func.func private @kf_sum(%arg0: tensor<5x7xf32>) -> tensor<7xf32> attributes {kf.aten = "aten.sum.dim_IntList"} {
  %cst = arith.constant 0.000000e+00 : f32
  %0 = tensor.empty() : tensor<7xf32>
  %1 = linalg.fill ins(%cst : f32) outs(%0 : tensor<7xf32>) -> tensor<7xf32>
  %2 = linalg.generic {indexing_maps = [affine_map<(d0, d1) -> (d0, d1)>, affine_map<(d0, d1) -> (d1)>], iterator_types = ["reduction", "parallel"]} ins(%arg0 : tensor<5x7xf32>) outs(%1 : tensor<7xf32>) {
  ^bb0(%in: f32, %out: f32):
    %3 = arith.addf %in, %out : f32
    linalg.yield %3 : f32
  } -> tensor<7xf32>
  return %2 : tensor<7xf32>
}
func.func @g(%x: tensor<5x7xf32>) -> tensor<7xf32> {
  %r = call @kf_sum(%x) : (tensor<5x7xf32>) -> tensor<7xf32>
  return %r : tensor<7xf32>
}

// -----

// tensor.pad: a fill of the whole result, then a copy into its middle (a subview, which
// becomes index arithmetic on the buffer).
// CHECK-LABEL: func.func private @kf_pad_c0_buffer0() -> tensor<3x8xf32>
// CHECK: gpu.func @kf_pad_c0_k0(%{{.*}}: memref<3x8xf32>) kernel
// CHECK: arith.cmpi ult, %{{.*}}, %c24
// CHECK: gpu.func @kf_pad_c0_k1(%[[IN:.*]]: memref<3x5xf32>, %[[OUT:.*]]: memref<3x8xf32>) kernel
// CHECK-NOT: memref.subview
// CHECK: %[[COL:.*]] = arith.addi %{{.*}}, %c1
// CHECK: memref.store %{{.*}}, %[[OUT]][%{{.*}}, %[[COL]]]
func.func private @kf_pad(%arg0: tensor<3x5xf32>) -> tensor<3x8xf32> attributes {kf.aten = "aten.pad.default"} {
  %cst = arith.constant 0.000000e+00 : f32
  %padded = tensor.pad %arg0 low[0, 1] high[0, 2] {
  ^bb0(%arg1: index, %arg2: index):
    tensor.yield %cst : f32
  } : tensor<3x5xf32> to tensor<3x8xf32>
  return %padded : tensor<3x8xf32>
}
func.func @h(%x: tensor<3x5xf32>) -> tensor<3x8xf32> {
  %r = call @kf_pad(%x) : (tensor<3x5xf32>) -> tensor<3x8xf32>
  return %r : tensor<3x8xf32>
}

// -----

// A comparison to a boolean tensor: i1 buffers on SPIR-V (kf-to-spirv stores them as
// bytes), i8 on CUDA, where a store writes 0 or 1.
// CHECK-LABEL: func.func private @kf_gt_c0_buffer0() -> tensor<9xi1>
// CHECK: gpu.func @kf_gt_c0_k0(%{{.*}}: memref<9xf32>, %[[OUT:.*]]: memref<9xi1>) kernel
// CHECK: %[[B:.*]] = arith.cmpf ogt
// CHECK: memref.store %[[B]], %[[OUT]]
// CUDA: gpu.func @kf_gt_c0_k0(%{{.*}}: memref<9xf32>, %[[OUT:.*]]: memref<9xi8>) kernel
// CUDA: %[[B:.*]] = arith.cmpf ogt
// CUDA: %[[BYTE:.*]] = arith.extui %[[B]] : i1 to i8
// CUDA: memref.store %[[BYTE]], %[[OUT]]
func.func private @kf_gt(%arg0: tensor<9xf32>) -> tensor<9xi1> attributes {kf.aten = "aten.gt.Scalar"} {
  %cst = arith.constant 0.5 : f32
  %0 = tensor.empty() : tensor<9xi1>
  %1 = linalg.generic {indexing_maps = [affine_map<(d0) -> (d0)>, affine_map<(d0) -> (d0)>], iterator_types = ["parallel"]} ins(%arg0 : tensor<9xf32>) outs(%0 : tensor<9xi1>) {
  ^bb0(%in: f32, %out: i1):
    %2 = arith.cmpf ogt, %in, %cst : f32
    linalg.yield %2 : i1
  } -> tensor<9xi1>
  return %1 : tensor<9xi1>
}
func.func @k(%x: tensor<9xf32>) -> tensor<9xi1> {
  %r = call @kf_gt(%x) : (tensor<9xf32>) -> tensor<9xi1>
  return %r : tensor<9xi1>
}

// -----

// math.fpowi (torch-mlir's square in mse_loss) by squaring: SPIR-V has no fpowi, and NVVM
// would call compiler-rt (the exponent's sign is known here: no reciprocal is left).
// A 0-d result: the kernel is one thread.
// CHECK-LABEL: func.func private @kf_square_c0_buffer0() -> tensor<f32>
// CHECK: gpu.func @kf_square_c0_k0(%[[IN:.*]]: memref<f32>, %[[OUT:.*]]: memref<f32>) kernel
// CHECK-SAME: kf.block = array<i64: 1, 1, 1>
// CHECK-NOT: math.fpowi
// CHECK: scf.for %{{.*}} = %c0 to %c32 step %c1 iter_args
// CHECK: arith.mulf
// CHECK: memref.store %{{.*}}, %[[OUT]][]
func.func private @kf_square(%arg0: tensor<f32>) -> tensor<f32> attributes {kf.aten = "aten.mse_loss.default"} {
  %c2 = arith.constant 2 : i32
  %0 = tensor.empty() : tensor<f32>
  %1 = linalg.generic {indexing_maps = [affine_map<() -> ()>, affine_map<() -> ()>], iterator_types = []} ins(%arg0 : tensor<f32>) outs(%0 : tensor<f32>) {
  ^bb0(%in: f32, %out: f32):
    %2 = math.fpowi %in, %c2 : f32, i32
    linalg.yield %2 : f32
  } -> tensor<f32>
  return %1 : tensor<f32>
}
func.func @m(%x: tensor<f32>) -> tensor<f32> {
  %r = call @kf_square(%x) : (tensor<f32>) -> tensor<f32>
  return %r : tensor<f32>
}

// -----

// float64 tensors: the kernel computes in f64 (kf-to-spirv records the Float64 capability).
// CHECK-LABEL: gpu.func @kf_neg64_c0_k0
// CHECK-SAME: memref<4xf64>
// CHECK: arith.negf %{{.*}} : f64
// BIN: gpu.binary @kf_kernels
func.func private @kf_neg64(%arg0: tensor<4xf64>) -> tensor<4xf64> attributes {kf.aten = "aten.neg.default"} {
  %0 = tensor.empty() : tensor<4xf64>
  %1 = linalg.generic {indexing_maps = [affine_map<(d0) -> (d0)>, affine_map<(d0) -> (d0)>], iterator_types = ["parallel"]} ins(%arg0 : tensor<4xf64>) outs(%0 : tensor<4xf64>) {
  ^bb0(%in: f64, %out: f64):
    %2 = arith.negf %in : f64
    linalg.yield %2 : f64
  } -> tensor<4xf64>
  return %1 : tensor<4xf64>
}
func.func @g(%x: tensor<4xf64>) -> tensor<4xf64> {
  %r = call @kf_neg64(%x) : (tensor<4xf64>) -> tensor<4xf64>
  return %r : tensor<4xf64>
}
