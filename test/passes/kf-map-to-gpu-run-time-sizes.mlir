// RUN: kf-opt %s --split-input-file --pass-pipeline='builtin.module(kf-tile{target=spirv}, kf-map-to-gpu{target=spirv})' | FileCheck %s
// Both back ends take the kernels (spirv-val runs inside kf-to-spirv, ptxas assembles in test_dynamic.py):
// RUN: kf-opt %s --split-input-file --pass-pipeline='builtin.module(kf-tile{target=spirv}, kf-map-to-gpu{target=spirv}, kf-to-spirv)' | FileCheck %s --check-prefix=BIN
// RUN: kf-opt %s --split-input-file --pass-pipeline='builtin.module(kf-tile{target=cuda}, kf-map-to-gpu{target=cuda}, kf-to-cuda)' | FileCheck %s --check-prefix=BIN
// BIN: gpu.binary @kf_kernels
// BIN: gpu.binary @kf_kernels

// Run-time sizes (strategies/run_time_sizes.py): a ? is declared with the largest run-time
// size (4096) in the kernel's buffers; the kernel takes its sizes in one more buffer, last,
// and reads them once (clamped to 4096); the plan names the slots (argument, dim) and the
// grid is an expression over them: one row a workgroup, the grid is the rows' guard.
// CHECK: func.func private @softmax_rows(tensor<1x?x64xf32>) -> tensor<1x?x64xf32>
// CHECK-SAME: kf.plan = {{{.*}}sizes = [array<i64: 0, 1>, array<i64: 1, 1>]
// CHECK: gpu.func @softmax_rows(%[[X:.*]]: memref<1x4096x64xf32>, %[[Y:.*]]: memref<1x4096x64xf32>, %[[SIZES:.*]]: memref<2xi32>)
// CHECK-SAME: kf.grid_sizes = ["FloorDiv(k0*1 + {{[0-9]+}}, {{[0-9]+}})", "1", "1"]
// CHECK-SAME: kf.size_slots = [array<i64: 0, 1>, array<i64: 1, 1>]
// CHECK: %[[S:.*]] = memref.load %[[SIZES]][%{{.*}}] : memref<2xi32>
// CHECK: %[[N:.*]] = arith.index_cast %[[S]]
// CHECK: arith.minui %[[N]], %c4096
// CHECK: gpu.return
func.func private @softmax_rows(%x: tensor<1x?x64xf32>) -> tensor<1x?x64xf32> attributes {kf.kernel = "rowwise"} {
  %0 = "kf.softmax"(%x) {dim = -1 : i64} : (tensor<1x?x64xf32>) -> tensor<1x?x64xf32>
  return %0 : tensor<1x?x64xf32>
}

func.func @main(%x: tensor<1x?x64xf32>) -> tensor<1x?x64xf32> {
  %0 = call @softmax_rows(%x) : (tensor<1x?x64xf32>) -> tensor<1x?x64xf32>
  return %0 : tensor<1x?x64xf32>
}

// -----

// An elementwise chain: the thread's guard is the run-time number of elements (the
// slot times the static 5), the grid covers them.
// CHECK: gpu.func @scale(%[[X:.*]]: memref<4096x5xf32>, %[[Y:.*]]: memref<4096x5xf32>, %[[SIZES:.*]]: memref<2xi32>)
// CHECK-SAME: kf.grid_sizes = ["FloorDiv(k0*5 + 255, 256)", "1", "1"]
// CHECK: %[[N:.*]] = arith.minui %{{.*}}, %c4096
// CHECK: %[[TOTAL:.*]] = arith.muli %[[N]], %c5
// CHECK: arith.cmpi ult, %{{.*}}, %[[TOTAL]]
func.func private @scale(%x: tensor<?x5xf32>) -> tensor<?x5xf32> attributes {kf.kernel = "elementwise"} {
  %0 = "kf.exp"(%x) : (tensor<?x5xf32>) -> tensor<?x5xf32>
  return %0 : tensor<?x5xf32>
}

func.func @main(%x: tensor<?x5xf32>) -> tensor<?x5xf32> {
  %0 = call @scale(%x) : (tensor<?x5xf32>) -> tensor<?x5xf32>
  return %0 : tensor<?x5xf32>
}
