// RUN: kf-opt %s --split-input-file --pass-pipeline='builtin.module(kf-tile{target=cuda})' | FileCheck %s --check-prefix=CUDA
// RUN: kf-opt %s --split-input-file --pass-pipeline='builtin.module(kf-tile{target=spirv})' | FileCheck %s --check-prefix=SPIRV
// RUN: not kf-opt %s --split-input-file --pass-pipeline='builtin.module(kf-tile{target=rocm})' 2>&1 | FileCheck %s --check-prefix=BAD
// RUN: kf-opt %s --split-input-file --pass-pipeline='builtin.module(kf-tile{target=cuda chip=sm_80 matmul.stages=2 matmul.group_m=0 rowwise.row_registers=0 elementwise.items_per_thread=1 elementwise.short_forms=false})' | FileCheck %s --check-prefix=VARIANT
// RUN: not kf-opt %s --pass-pipeline='builtin.module(kf-tile{matmul.stage=2})' 2>&1 | FileCheck %s --check-prefix=BADFIELD
// RUN: not kf-opt %s --pass-pipeline='builtin.module(kf-tile{matmul.stages=two})' 2>&1 | FileCheck %s --check-prefix=BADVALUE
// RUN: not kf-opt %s --pass-pipeline='builtin.module(kf-tile{transpose.stages=2})' 2>&1 | FileCheck %s --check-prefix=BADKIND
// RUN: not kf-opt %s --pass-pipeline='builtin.module(kf-tile{multiprocessors=many})' 2>&1 | FileCheck %s --check-prefix=BADINT
// RUN: not kf-opt %s --split-input-file --pass-pipeline='builtin.module(kf-tile{target=cuda chip=ampere})' 2>&1 | FileCheck %s --check-prefix=BADCHIP
// Invalid inputs (Inputs/kf-tile-invalid.mlir):
// RUN: kf-opt %S/Inputs/kf-tile-invalid.mlir --split-input-file --verify-diagnostics --pass-pipeline='builtin.module(kf-tile{target=cuda})'
// RUN: kf-opt %S/Inputs/kf-tile-invalid.mlir --split-input-file --verify-diagnostics --pass-pipeline='builtin.module(kf-tile{target=spirv})'

// kf-tile records each kernel function's plan as kf.plan and touches nothing else.
// BAD: kf-tile: target must be one of cuda, spirv, vulkan, metal, got 'rocm'

// Kernel variants (the fields of a strategy's VARIANT) are kf-tile options
// <kind>.<field>=<value>; an unknown field, a bad value or a kind without variants is an
// error that names what there is.
// BADFIELD: matmul: no variant 'stage' (variants: cooperative_matrix, coopmat_tiles, group_m, inflight, k_bytes, max_block_n, stages, warp_tiles)
// BADVALUE: matmul: variant 'stages' takes an int, not 'two'
// BADKIND: kernels of kind 'transpose' have no variants (kinds with variants: attention, elementwise, matmul, moe_gemm, rowwise)
// BADINT: error: pass 'kf-tile' option 'multiprocessors' takes an int, got 'many'
// BADCHIP: error: kf-tile: chip must be a CUDA chip such as sm_80, sm_90 or sm_90a, got 'ampere'

// 1000 f32 elements: one thread per 4 (16-byte accesses, 1000 = 250 x 4), 256 threads,
// one block; the last block is partial (250 < 256), so the kernel guards its tail.
// CUDA-LABEL: func.func private @add_1000
// CUDA-SAME: kf.plan = {block = 256 : i64, grid = 1 : i64, grid_stride = false, numel = 1000 : i64, strategy = "elementwise", target = "cuda", variant = {items_per_thread = 2 : i64, short_forms = true}, vector_width = 4 : i64}
// CUDA: "kf.add"
// SPIRV-LABEL: func.func private @add_1000
// SPIRV-SAME: kf.plan = {block = 256 : i64, grid = 1 : i64, grid_stride = false, numel = 1000 : i64, strategy = "elementwise", target = "spirv", variant = {items_per_thread = 2 : i64, short_forms = true}, vector_width = 4 : i64}
func.func private @add_1000(%a: tensor<1000xf32>, %b: tensor<1000xf32>) -> tensor<1000xf32> attributes {kf.kernel = "elementwise"} {
  %0 = "kf.add"(%a, %b) : (tensor<1000xf32>, tensor<1000xf32>) -> tensor<1000xf32>
  return %0 : tensor<1000xf32>
}

// -----

// 8192 x 4096 f16 with a broadcast bias: 8 halves per vector on CUDA (16 bytes), two
// vectors a thread there (the variant's items_per_thread), 4 halves and one vector on
// SPIR-V (its vectors have 4 components), an exact grid and so no tail. The options
// elementwise.items_per_thread=1 elementwise.short_forms=false give one vector a thread
// and the accurate math, and the plan says so.
// CUDA-LABEL: func.func private @bias_8192x4096
// CUDA-SAME: kf.plan = {block = 256 : i64, grid = 8192 : i64, grid_stride = false, items_per_thread = 2 : i64, numel = 33554432 : i64, strategy = "elementwise", target = "cuda", variant = {items_per_thread = 2 : i64, short_forms = true}, vector_width = 8 : i64}
// SPIRV-LABEL: func.func private @bias_8192x4096
// SPIRV-SAME: kf.plan = {block = 256 : i64, grid = 32768 : i64, grid_stride = false, numel = 33554432 : i64, strategy = "elementwise", target = "spirv", variant = {items_per_thread = 2 : i64, short_forms = true}, vector_width = 4 : i64}
// VARIANT-LABEL: func.func private @bias_8192x4096
// VARIANT-SAME: kf.plan = {block = 256 : i64, grid = 16384 : i64, grid_stride = false, numel = 33554432 : i64, short_forms = false, strategy = "elementwise", target = "cuda", variant = {items_per_thread = 1 : i64, short_forms = false}, vector_width = 8 : i64}
func.func private @bias_8192x4096(%x: tensor<8192x4096xf16>, %b: tensor<4096xf16>) -> tensor<8192x4096xf16> attributes {kf.kernel = "elementwise"} {
  %0 = "kf.add"(%x, %b) : (tensor<8192x4096xf16>, tensor<4096xf16>) -> tensor<8192x4096xf16>
  %1 = "kf.gelu"(%0) {approximate = "tanh"} : (tensor<8192x4096xf16>) -> tensor<8192x4096xf16>
  return %1 : tensor<8192x4096xf16>
}

// -----

// The same size through the generic strategy (one element per thread): 131072 blocks
// fit CUDA's grid, but Vulkan promises only 65535 workgroups, so SPIR-V strides.
// CUDA-LABEL: func.func private @transpose_8192x4096
// CUDA-SAME: kf.plan = {block = 256 : i64, grid = 131072 : i64, grid_stride = false, numel = 33554432 : i64, strategy = "generic", target = "cuda"}
// SPIRV-LABEL: func.func private @transpose_8192x4096
// SPIRV-SAME: kf.plan = {block = 256 : i64, grid = 65535 : i64, grid_stride = true, numel = 33554432 : i64, strategy = "generic", target = "spirv"}
func.func private @transpose_8192x4096(%x: tensor<8192x4096xf32>) -> tensor<4096x8192xf32> attributes {kf.kernel = "generic"} {
  %0 = "kf.transpose"(%x) {perm = array<i64: 1, 0>} : (tensor<8192x4096xf32>) -> tensor<4096x8192xf32>
  return %0 : tensor<4096x8192xf32>
}

// -----

// Booleans keep one element per thread (LLVM packs vector<Nxi1> into bits); an
// innermost dimension of 257 is no multiple of 4 either.
// CUDA-LABEL: func.func private @mask_3x257
// CUDA-SAME: vector_width = 1
// CUDA-LABEL: func.func private @odd_3x257
// CUDA-SAME: grid = 4 : i64{{.*}}numel = 771 : i64{{.*}}vector_width = 1
func.func private @mask_3x257(%a: tensor<3x256xf32>, %m: tensor<3x256xi1>) -> tensor<3x256xf32> attributes {kf.kernel = "elementwise"} {
  %0 = "kf.masked_fill"(%a, %m) {value = 0.0 : f64} : (tensor<3x256xf32>, tensor<3x256xi1>) -> tensor<3x256xf32>
  return %0 : tensor<3x256xf32>
}
func.func private @odd_3x257(%a: tensor<3x257xf32>) -> tensor<3x257xf32> attributes {kf.kernel = "elementwise"} {
  %0 = "kf.exp"(%a) : (tensor<3x257xf32>) -> tensor<3x257xf32>
  return %0 : tensor<3x257xf32>
}

// -----

// A kernel its kind's strategy refuses (a reduction is not elementwise) gets the generic
// plan, and says so; the host function is left alone.
// CUDA-LABEL: func.func private @sum_rows
// CUDA-SAME: kf.plan = {block = 256 : i64, grid = 1 : i64, grid_stride = false, numel = 3 : i64, strategy = "generic", target = "cuda"}
// CUDA: func.func @main
// CUDA-NOT: kf.plan
// CUDA: call @sum_rows
func.func private @sum_rows(%a: tensor<3x257xf32>) -> tensor<3xf32> attributes {kf.kernel = "elementwise"} {
  %0 = "kf.sum"(%a) {dims = array<i64: 1>, keepdim = false} : (tensor<3x257xf32>) -> tensor<3xf32>
  return %0 : tensor<3xf32>
}
func.func @main(%a: tensor<3x257xf32>) -> tensor<3xf32> {
  %0 = call @sum_rows(%a) : (tensor<3x257xf32>) -> tensor<3xf32>
  return %0 : tensor<3xf32>
}

// -----

// A GEMM's plan records the variant it was planned with (the matmul strategy's defaults,
// or kf-tile's matmul.* options): here a two-stage cp.async pipeline (mma.sync, sm_80)
// and workgroups in the grid's own order.
// CUDA-LABEL: func.func private @gemm_256
// CUDA-SAME: group_m = 8 : i64
// CUDA-SAME: stages = 4 : i64
// CUDA-SAME: variant = {cooperative_matrix = true, coopmat_tiles = array<i64: 2, 2>, group_m = 8 : i64, inflight = 1 : i64, k_bytes = 0 : i64, max_block_n = 256 : i64, stages = 4 : i64, warp_tiles = array<i64: 4, 8>}
// VARIANT-LABEL: func.func private @gemm_256
// VARIANT-SAME: group_m = 0 : i64
// VARIANT-SAME: stages = 2 : i64
// VARIANT-SAME: variant = {cooperative_matrix = true, coopmat_tiles = array<i64: 2, 2>, group_m = 0 : i64, inflight = 1 : i64, k_bytes = 0 : i64, max_block_n = 256 : i64, stages = 2 : i64, warp_tiles = array<i64: 4, 8>}
func.func private @gemm_256(%a: tensor<256x256xbf16>, %b: tensor<256x256xbf16>) -> tensor<256x256xbf16> attributes {kf.kernel = "matmul"} {
  %0 = "kf.matmul"(%a, %b) : (tensor<256x256xbf16>, tensor<256x256xbf16>) -> tensor<256x256xbf16>
  return %0 : tensor<256x256xbf16>
}

// -----

// A rowwise kernel's plan records its variant too: f16 rows of 1000 keep their share of
// the row in registers by default; rowwise.row_registers=0 selects the loop kernel.
// CUDA-LABEL: func.func private @softmax_1000
// CUDA-SAME: mode = "registers"
// CUDA-SAME: variant = {max_lanes = 0 : i64, max_row_threads = 256 : i64, partial_registers = 16 : i64, row_block = 256 : i64, row_max_registers = 64 : i64, row_preload = "pipelined", row_reciprocal = "narrow", row_registers = 32 : i64, row_registers_wide_capped = true, row_registers_widest = 2 : i64}
// VARIANT-LABEL: func.func private @softmax_1000
// VARIANT-SAME: mode = "loop"
// VARIANT-SAME: variant = {{{.*}}row_registers = 0 : i64
func.func private @softmax_1000(%x: tensor<4x1000xf16>) -> tensor<4x1000xf16> attributes {kf.kernel = "rowwise"} {
  %0 = "kf.softmax"(%x) {dim = -1 : i64} : (tensor<4x1000xf16>) -> tensor<4x1000xf16>
  return %0 : tensor<4x1000xf16>
}

// -----

// A run-time size after the heads (run-time strides) in an elementwise kernel: the
// elementwise strategy's kernels address static strides, so the generic strategy's plan
// takes it, its sizes the slots (argument 0 and the result, dim 2).
// CUDA-LABEL: func.func private @strided_run_time
// CUDA-SAME: sizes = [array<i64: 0, 2>, array<i64: 1, 2>], strategy = "generic"
// SPIRV-LABEL: func.func private @strided_run_time
// SPIRV-SAME: sizes = [array<i64: 0, 2>, array<i64: 1, 2>], strategy = "generic"
func.func private @strided_run_time(%a: tensor<1x4x?x8xf32>) -> tensor<1x4x?x8xf32> attributes {kf.kernel = "elementwise"} {
  %0 = "kf.exp"(%a) : (tensor<1x4x?x8xf32>) -> tensor<1x4x?x8xf32>
  return %0 : tensor<1x4x?x8xf32>
}
