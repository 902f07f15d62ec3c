// RUN: kf-opt %s --split-input-file --pass-pipeline='builtin.module(kf-tile{target=cuda}, kf-map-to-gpu{target=cuda})' | FileCheck %s
// RUN: kf-opt %s --split-input-file --pass-pipeline='builtin.module(kf-map-to-gpu{target=spirv})' | FileCheck %s --check-prefix=SPIRV
// Both back ends take what the strategies write (spirv-val runs inside kf-to-spirv):
// RUN: kf-opt %s --split-input-file --pass-pipeline='builtin.module(kf-map-to-gpu{target=spirv}, kf-to-spirv)' | FileCheck %s --check-prefix=BIN
// RUN: kf-opt %s --split-input-file --pass-pipeline='builtin.module(kf-map-to-gpu{target=cuda}, kf-to-cuda)' | FileCheck %s --check-prefix=BIN
// Invalid inputs (Inputs/kf-map-to-gpu-invalid.mlir) and options:
// RUN: kf-opt %S/Inputs/kf-map-to-gpu-invalid.mlir --split-input-file --verify-diagnostics --pass-pipeline='builtin.module(kf-map-to-gpu{target=cuda})'
// RUN: kf-opt %S/Inputs/kf-map-to-gpu-invalid.mlir --split-input-file --verify-diagnostics --pass-pipeline='builtin.module(kf-map-to-gpu{target=spirv})'
// RUN: not kf-opt %S/Inputs/kf-map-to-gpu-invalid.mlir --split-input-file --pass-pipeline='builtin.module(kf-map-to-gpu{target=rocm})' 2>&1 | FileCheck %s --check-prefix=BAD-TARGET
// RUN: not kf-opt %S/Inputs/kf-map-to-gpu-invalid.mlir --split-input-file --pass-pipeline='builtin.module(kf-map-to-gpu{target=spirv limits=shared=lots})' 2>&1 | FileCheck %s --check-prefix=BAD-LIMITS
// RUN: not kf-opt %S/Inputs/kf-map-to-gpu-invalid.mlir --split-input-file --pass-pipeline='builtin.module(kf-map-to-gpu{target=cuda chip=sm90})' 2>&1 | FileCheck %s --check-prefix=BAD-CHIP
// RUN: not kf-opt %S/Inputs/kf-map-to-gpu-invalid.mlir --split-input-file --pass-pipeline='builtin.module(kf-map-to-gpu{target=cuda multiprocessors=-1})' 2>&1 | FileCheck %s --check-prefix=BAD-MP
// BAD-TARGET: error: kf-map-to-gpu: target must be one of cuda, spirv, vulkan, metal, got 'rocm'
// BAD-CHIP: error: kf-map-to-gpu: chip must be a CUDA chip such as sm_80, sm_90 or sm_90a, got 'sm90'
// BAD-MP: error: kf-map-to-gpu: multiprocessors must be 0 (not known) or more, got -1
// BAD-LIMITS: error: kf-map-to-gpu: device limits 'shared=lots' must give exactly invocations, ops, shared, size, subgroup
// BIN: gpu.binary @kf_kernels
// BIN: gpu.binary @kf_kernels

// Two kernel functions become gpu.funcs in one gpu.module @kf_kernels; each kernel
// function stays as a declaration that names its gpu.func, and the host's calls are the
// launch schedule, untouched.
// CHECK-LABEL: module attributes {gpu.container_module}
// CHECK: func.func private @bias_relu(tensor<4x8xf32>, tensor<8xf32>) -> tensor<4x8xf32>
// CHECK-SAME: kf.gpu_func = @kf_kernels::@bias_relu, kf.kernel = "elementwise"
// CHECK-NOT: kf.add
// CHECK: func.func private @row_sum(tensor<3x257xf16>) -> tensor<3xf16>
// CHECK-SAME: kf.gpu_func = @kf_kernels::@row_sum
// CHECK: func.func @main
// CHECK-NEXT: call @bias_relu(%arg0, %arg1)
// CHECK-NEXT: call @row_sum(%arg2)
// CHECK: gpu.module @kf_kernels

// The elementwise strategy: 8 threads of 4 contiguous elements each; the bias (8
// elements along the innermost dim) is read as a vector like x, the result stored as one.
// CHECK: gpu.func @bias_relu(%[[X:.*]]: memref<4x8xf32>, %[[B:.*]]: memref<8xf32>, %[[Y:.*]]: memref<4x8xf32>) kernel
// CHECK-SAME: kf.block = array<i64: 256, 1, 1>, kf.fused_lines = ["model.py:3", "model.py:4"], kf.grid = array<i64: 1, 1, 1>, kf.shared_bytes = 0 : i64, kf.strategy = "elementwise", known_block_size = array<i32: 256, 1, 1>
// CHECK: %[[BID:.*]] = gpu.block_id x
// CHECK: %[[TID:.*]] = gpu.thread_id x
// CHECK: %[[BASE:.*]] = arith.muli %[[BID]], %c256
// CHECK: %[[I:.*]] = arith.addi %[[BASE]], %[[TID]]
// CHECK: %[[IN:.*]] = arith.cmpi ult, %[[I]], %c8
// CHECK: scf.if %[[IN]]
// CHECK: %[[E:.*]] = arith.muli %[[I]], %c4
// CHECK: %[[COL:.*]] = arith.remui %[[E]], %c8
// CHECK: %[[ROW:.*]] = arith.divui %[[E]], %c8
// CHECK: %[[XV:.*]] = vector.load %[[X]][%[[ROW]], %[[COL]]] {alignment = 16 : i64} : memref<4x8xf32>, vector<4xf32>
// CHECK: %[[BV:.*]] = vector.load %[[B]][%[[COL]]] {alignment = 16 : i64} : memref<8xf32>, vector<4xf32>
// CHECK-COUNT-4: arith.maximumf
// CHECK: %[[R:.*]] = vector.from_elements
// CHECK: vector.store %[[R]], %[[Y]][%[[ROW]], %[[COL]]] {alignment = 16 : i64} : memref<4x8xf32>, vector<4xf32>
// CHECK: gpu.return

// The generic strategy: one thread per output element, the reduction an inner loop
// accumulating in f32 (kf's precision policy), rounded to f16 once, at the store.
// CHECK: gpu.func @row_sum(%[[A:.*]]: memref<3x257xf16>, %[[S:.*]]: memref<3xf16>) kernel
// CHECK-SAME: kf.strategy = "generic"
// CHECK: scf.if
// CHECK: %[[ACC:.*]] = scf.for %[[J:.*]] = %c0 to %c257 step %c1 iter_args(%[[C:.*]] = %cst) -> (f32)
// CHECK: %[[H:.*]] = memref.load %[[A]][%{{.*}}, %[[J]]] : memref<3x257xf16>
// CHECK: %[[F:.*]] = arith.extf %[[H]] : f16 to f32
// CHECK: arith.addf %[[C]], %[[F]] : f32
// CHECK: %[[T:.*]] = arith.truncf %[[ACC]] : f32 to f16
// CHECK: memref.store %[[T]], %[[S]]

// Without kf-tile the pass makes the plans itself; SPIR-V gets the same 4-lane f32
// vectors (kf-to-spirv turns them into scalar accesses).
// SPIRV: gpu.func @bias_relu
// SPIRV-SAME: kf.grid = array<i64: 1, 1, 1>
// SPIRV: vector.load
// SPIRV: gpu.func @row_sum
func.func private @bias_relu(%x: tensor<4x8xf32>, %b: tensor<8xf32>) -> tensor<4x8xf32> attributes {kf.kernel = "elementwise", kf.fused_lines = ["model.py:3", "model.py:4"]} {
  %0 = "kf.add"(%x, %b) : (tensor<4x8xf32>, tensor<8xf32>) -> tensor<4x8xf32>
  %1 = "kf.relu"(%0) : (tensor<4x8xf32>) -> tensor<4x8xf32>
  return %1 : tensor<4x8xf32>
}
func.func private @row_sum(%x: tensor<3x257xf16>) -> tensor<3xf16> attributes {kf.kernel = "generic", kf.fused_lines = ["model.py:5"]} {
  %0 = "kf.sum"(%x) {dims = array<i64: 1>, keepdim = false} : (tensor<3x257xf16>) -> tensor<3xf16>
  return %0 : tensor<3xf16>
}
func.func @main(%x: tensor<4x8xf32>, %b: tensor<8xf32>, %y: tensor<3x257xf16>) -> (tensor<4x8xf32>, tensor<3xf16>) {
  %0 = call @bias_relu(%x, %b) : (tensor<4x8xf32>, tensor<8xf32>) -> tensor<4x8xf32>
  %1 = call @row_sum(%y) : (tensor<3x257xf16>) -> tensor<3xf16>
  return %0, %1 : tensor<4x8xf32>, tensor<3xf16>
}

// -----

// Booleans: bytes for CUDA (memref<i8>: upstream's LLVM lowering refuses i1 stores),
// memref<i1> for SPIR-V (kf-to-spirv stores it as bytes itself); the comparison's
// result is stored zero-extended. A gpu.module @kf_kernels that exists is reused.
// CHECK-LABEL: gpu.func @other
// CHECK: gpu.func @less(%{{.*}}: memref<1000xf32>, %{{.*}}: memref<1000xf32>, %[[M:.*]]: memref<1000xi8>)
// CHECK: %[[LT:.*]] = arith.cmpf olt
// CHECK: %[[BYTE:.*]] = arith.extui %[[LT]] : i1 to i8
// CHECK: memref.store %[[BYTE]], %[[M]]
// SPIRV-LABEL: gpu.func @other
// SPIRV: gpu.func @less(%{{.*}}: memref<1000xf32>, %{{.*}}: memref<1000xf32>, %[[M:.*]]: memref<1000xi1>)
// SPIRV: %[[LT:.*]] = arith.cmpf olt
// SPIRV: memref.store %[[LT]], %[[M]]
module attributes {gpu.container_module} {
  gpu.module @kf_kernels {
    gpu.func @other() kernel attributes {known_block_size = array<i32: 32, 1, 1>} {
      gpu.return
    }
  }
  func.func private @less(%a: tensor<1000xf32>, %b: tensor<1000xf32>) -> tensor<1000xi1> attributes {kf.kernel = "elementwise"} {
    %0 = "kf.cmp"(%a, %b) {predicate = "lt"} : (tensor<1000xf32>, tensor<1000xf32>) -> tensor<1000xi1>
    return %0 : tensor<1000xi1>
  }
}

// -----

// Dropout in one elementwise kernel: the state's two words are loaded once a thread
// (they do not narrow the vector: 4 f32 lanes), and the thread's 4 elements are the 4
// words of one Philox block (20 widening multiplies), the block at the thread's item
// (item * 4 / 4) + the op's offset; x is read and the result written as vectors.
// CHECK-LABEL: gpu.func @dropout
// CHECK-SAME: (%[[S:.*]]: memref<2xi64>, %[[X:.*]]: memref<4x8xf32>, %[[Y:.*]]: memref<4x8xf32>) kernel
// CHECK-SAME: kf.strategy = "elementwise"
// CHECK: %[[E:.*]] = arith.muli %{{.*}}, %c4 : index
// CHECK: %[[COL:.*]] = arith.remui %[[E]], %c8
// CHECK: %[[ROW:.*]] = arith.divui %[[E]], %c8
// CHECK: vector.load %[[X]][%[[ROW]], %[[COL]]] {alignment = 16 : i64} : memref<4x8xf32>, vector<4xf32>
// CHECK: %[[SEED:.*]] = memref.load %[[S]][%c0] : memref<2xi64>
// CHECK: %[[OFF:.*]] = memref.load %[[S]][%c1] : memref<2xi64>
// CHECK: %[[B:.*]] = arith.index_cast %[[ITEM:.*]] : index to i64
// CHECK: %[[C:.*]] = arith.addi %[[B]], %[[OFF]] : i64
// CHECK: arith.addi %[[C]], %c64_i64 : i64
// CHECK-COUNT-20: arith.mului_extended
// CHECK-NOT: arith.mului_extended
// CHECK-NOT: memref.load %[[S]]
// CHECK: %[[R:.*]] = vector.from_elements
// CHECK: vector.store %[[R]], %[[Y]][%[[ROW]], %[[COL]]] {alignment = 16 : i64} : memref<4x8xf32>, vector<4xf32>
// SPIRV-LABEL: gpu.func @dropout
// SPIRV-SAME: kf.strategy = "elementwise"
// SPIRV: arith.mului_extended
func.func private @dropout(%state: tensor<2xi64>, %x: tensor<4x8xf32>) -> tensor<4x8xf32> attributes {kf.kernel = "elementwise", kf.fused_lines = ["model.py:7"]} {
  %u = "kf.rand"(%state) {distribution = "uniform", offset = 64 : i64} : (tensor<2xi64>) -> tensor<4x8xf32>
  %p = "kf.fill"() {value = 0.25 : f64} : () -> tensor<f32>
  %keep = "kf.cmp"(%u, %p) {predicate = "gt"} : (tensor<4x8xf32>, tensor<f32>) -> tensor<4x8xi1>
  %s = "kf.fill"() {value = 1.3333333333333333 : f64} : () -> tensor<f32>
  %z = "kf.fill"() {value = 0.0 : f64} : () -> tensor<f32>
  %scale = "kf.select"(%keep, %s, %z) : (tensor<4x8xi1>, tensor<f32>, tensor<f32>) -> tensor<4x8xf32>
  %y = "kf.mul"(%x, %scale) : (tensor<4x8xf32>, tensor<4x8xf32>) -> tensor<4x8xf32>
  return %y : tensor<4x8xf32>
}
func.func @dropout_main(%x: tensor<4x8xf32>, %state: tensor<2xi64>) -> tensor<4x8xf32> {
  %0 = call @dropout(%state, %x) : (tensor<2xi64>, tensor<4x8xf32>) -> tensor<4x8xf32>
  return %0 : tensor<4x8xf32>
}

// -----

// A normal sample in a generic kernel (a reshape of it): Box-Muller's log, sqrt and cos
// lower on both back ends.
// CHECK-LABEL: gpu.func @noise
// CHECK-SAME: kf.strategy = "generic"
// CHECK: math.log
// CHECK: math.cos
// SPIRV-LABEL: gpu.func @noise
// SPIRV: math.cos
func.func private @noise(%state: tensor<2xi64>) -> tensor<15xbf16> attributes {kf.kernel = "generic"} {
  %n = "kf.rand"(%state) {distribution = "normal", offset = 0 : i64} : (tensor<2xi64>) -> tensor<3x5xf32>
  %r = "kf.reshape"(%n) : (tensor<3x5xf32>) -> tensor<15xf32>
  %b = "kf.cast"(%r) : (tensor<15xf32>) -> tensor<15xbf16>
  return %b : tensor<15xbf16>
}
func.func @noise_main(%state: tensor<2xi64>) -> tensor<15xbf16> {
  %0 = call @noise(%state) : (tensor<2xi64>) -> tensor<15xbf16>
  return %0 : tensor<15xbf16>
}

// -----

// Indices are checked where a kernel uses them: the gpu.func takes the program's error
// flag last (memref<4xi32>) and lists its sites (kf.index_sites, numbered across the
// gpu.module); each index is compared unsigned with its bound and clamped to 0 when
// out of range, the thread's first bad (site + 1, value) kept in private words, and
// reported once after the loop with an atomic or into word 0. A kernel whose results
// have no elements is not written (kf.empty on its declaration).
// CHECK-LABEL: func.func private @nothing
// CHECK-SAME: kf.empty
// CHECK: gpu.func @pick(%[[X:.*]]: memref<7x5xf32>, %[[I:.*]]: memref<3xi64>, %[[Y:.*]]: memref<3x5xf32>, %[[FLAG:.*]]: memref<4xi32>) kernel
// CHECK-SAME: kf.index_sites = [{bound = 7 : i64, dim = 0 : i64, id = 0 : i64, op = "kf.index_select", where = "model.py:8"}]
// CHECK: %[[FIRST:.*]] = memref.alloca() : memref<2xi64, #gpu.address_space<private>>
// CHECK: %[[IDX:.*]] = memref.load %[[I]]
// CHECK: %[[BAD:.*]] = arith.cmpi uge, %[[IDX]], %c7_i64 : i64
// CHECK: %[[SAFE:.*]] = arith.select %[[BAD]], %c0_i64, %[[IDX]] : i64
// CHECK: %[[ROW:.*]] = arith.index_cast %[[SAFE]] : i64 to index
// CHECK: memref.load %[[X]][%[[ROW]]
// CHECK: scf.if
// CHECK: memref.atomic_rmw ori %c1_i32, %[[FLAG]][%c0] : (i32, memref<4xi32>) -> i32
// CHECK-NOT: gpu.func @nothing
// SPIRV: gpu.func @pick({{.*}}, %{{.*}}: memref<4xi32>) kernel
// SPIRV: memref.atomic_rmw ori
func.func private @pick(%x: tensor<7x5xf32>, %i: tensor<3xi64>) -> tensor<3x5xf32> attributes {kf.kernel = "generic", kf.fused_lines = ["model.py:8"]} {
  %0 = "kf.index_select"(%x, %i) {dim = 0} : (tensor<7x5xf32>, tensor<3xi64>) -> tensor<3x5xf32> loc("model.py":8:3)
  return %0 : tensor<3x5xf32>
}
func.func private @nothing(%x: tensor<0x5xf32>) -> tensor<0x5xf32> attributes {kf.kernel = "elementwise"} {
  %0 = "kf.relu"(%x) : (tensor<0x5xf32>) -> tensor<0x5xf32>
  return %0 : tensor<0x5xf32>
}
func.func @main(%x: tensor<7x5xf32>, %i: tensor<3xi64>, %e: tensor<0x5xf32>) -> (tensor<3x5xf32>, tensor<0x5xf32>) {
  %0 = call @pick(%x, %i) : (tensor<7x5xf32>, tensor<3xi64>) -> tensor<3x5xf32>
  %1 = call @nothing(%e) : (tensor<0x5xf32>) -> tensor<0x5xf32>
  return %0, %1 : tensor<3x5xf32>, tensor<0x5xf32>
}
