// kf-map-to-gpu on the kernel functions kf-fuse makes for attention and for a matmul
// with an epilogue: the attention and matmul strategies write their gpu.funcs.
// RUN: kf-opt %s --split-input-file --pass-pipeline='builtin.module(kf-map-to-gpu{target=cuda})' | FileCheck %s --check-prefixes=CHECK,CUDA
// RUN: kf-opt %s --split-input-file --pass-pipeline='builtin.module(kf-map-to-gpu{target=spirv})' | FileCheck %s --check-prefixes=CHECK,SPIRV
// Both back ends take what the strategies write:
// RUN: kf-opt %s --split-input-file --pass-pipeline='builtin.module(kf-map-to-gpu{target=spirv}, kf-to-spirv)' | FileCheck %s --check-prefix=SPV
// RUN: kf-opt %s --split-input-file --pass-pipeline='builtin.module(kf-map-to-gpu{target=cuda}, kf-to-cuda)' | FileCheck %s --check-prefix=PTX

// The seed's fused_attention in f16 with a [seq, seq] mask; 257 is a multiple of no
// block size. One workgroup per (batch*head, block of query rows), the score matrix
// nowhere in global memory. For SPIR-V the SIMT kernel: Q, the K/V tile (K, then V, in
// one buffer), P and the row-maximum exchange live in workgroup memory (rows padded by
// one word). For CUDA the tensor-core kernel: K and V tiles in f16 (rows padded by 8),
// everything else in registers, mma.sync m16n8k16 for both products.
// CHECK-LABEL: func.func private @attn_k0_attention(tensor<2x8x257x64xf16>, tensor<2x8x257x64xf16>, tensor<2x8x257x64xf16>, tensor<257x257xf32>) -> tensor<2x8x257x64xf16>
// CHECK-SAME: kf.gpu_func = @kf_kernels::@attn_k0_attention
// CHECK: gpu.module @kf_kernels
// CHECK: gpu.func @attn_k0_attention(%arg0: memref<2x8x257x64xf16>, %arg1: memref<2x8x257x64xf16>, %arg2: memref<2x8x257x64xf16>, %arg3: memref<257x257xf32>, %arg4: memref<2x8x257x64xf16>)
// SPIRV-SAME: workgroup(%[[Q:.*]] : memref<32x65xf32, #gpu.address_space<workgroup>> {llvm.align = 16 : i64}, %[[KV:.*]] : memref<16x65xf32, #gpu.address_space<workgroup>> {llvm.align = 16 : i64}, %[[P:.*]] : memref<32x17xf32, #gpu.address_space<workgroup>> {llvm.align = 16 : i64}, %[[RED:.*]] : memref<32x4xf32, #gpu.address_space<workgroup>> {llvm.align = 16 : i64})
// CUDA-SAME: workgroup(%[[K:.*]] : memref<64x72xf16, #gpu.address_space<workgroup>> {llvm.align = 16 : i64}, %[[V:.*]] : memref<64x72xf16, #gpu.address_space<workgroup>> {llvm.align = 16 : i64})
// CHECK-SAME: kernel
// SPIRV-SAME: kf.grid = array<i64: 9, 16, 1>
// CUDA-SAME: kf.grid = array<i64: 5, 16, 1>
// CHECK-SAME: kf.strategy = "attention"
// CHECK-SAME: known_block_size = array<i32: 128, 1, 1>

// SIMT. Q staged once, extended to f32, rows past 257 zero:
// SPIRV: memref.load %arg0
// SPIRV: arith.extf {{.*}} : f16 to f32
// SPIRV: memref.store {{.*}}, %[[Q]]
// The key-block loop carries the running max, the lane's partial sum and its accumulators:
// SPIRV: scf.for {{.*}} = %c0 to %c257 step %c16 iter_args({{.*}}) -> (f32, f32, f32
// SPIRV-NEXT: gpu.barrier
// SPIRV: memref.load %arg1
// SPIRV: memref.store {{.*}}, %[[KV]]
// SPIRV: gpu.barrier
// Scores: dot products over the head dim from workgroup memory, in f32:
// SPIRV: scf.for {{.*}} = %c0 to %c64 step %c4
// SPIRV: memref.load %[[Q]]
// SPIRV: memref.load %[[KV]]
// SPIRV: math.fma
// The kernel function's own scale and mask, per score; keys past 257 score -inf:
// SPIRV: arith.cmpi ult, {{.*}}, %c257
// SPIRV: arith.divf
// SPIRV: memref.load %arg3
// SPIRV: arith.cmpf oeq
// SPIRV: arith.select
// Online softmax: block maximum through workgroup memory, rescaling, P to workgroup memory:
// SPIRV: arith.maximumf
// SPIRV: memref.store {{.*}}, %[[RED]]
// SPIRV-NEXT: gpu.barrier
// SPIRV: memref.load %[[RED]]
// SPIRV: math.exp
// SPIRV: memref.store {{.*}}, %[[P]]
// SPIRV: gpu.barrier
// V overwrites K, then P @ V into the registers:
// SPIRV: memref.load %arg2
// SPIRV: memref.store {{.*}}, %[[KV]]
// SPIRV: gpu.barrier
// SPIRV: scf.for {{.*}} = %c0 to %c16 step %c4
// SPIRV: memref.load %[[P]]
// SPIRV: memref.load %[[KV]]
// SPIRV: math.fma
// Row sums from the lanes, one division, one rounding to f16, rows past 257 not stored:
// SPIRV: memref.store {{.*}}, %[[RED]]
// SPIRV-NEXT: gpu.barrier
// SPIRV: arith.divf
// SPIRV: arith.truncf {{.*}} : f32 to f16
// SPIRV: memref.store {{.*}}, %arg4

// Tensor cores. Q's A fragments read once into registers:
// CUDA: memref.load %arg0
// CUDA: vector.from_elements {{.*}} : vector<2xf16>
// The mask is applied last with a fill of -1e9, so key blocks it masks entirely are
// skipped: an outer loop of at most two passes (the second only when a query row turns
// out masked everywhere) around the key-block loop, which carries two running maxima
// and sums (rows gid, gid + 8), the output fragments (8 tiles of 8 columns x 4 values)
// and whether it skipped a block. Each thread tests its scores' mask entries, the
// workgroup ORs them:
// CUDA: scf.for {{.*}} = %c0 to %c2 step %c1 iter_args({{.*}}) -> (i1, {{(f32, ){35}f32}})
// CUDA: scf.for {{.*}} = %c0 to %c257 step %c64 iter_args({{.*}}) -> ({{(f32, ){36}i1}})
// CUDA: memref.load %arg3
// CUDA: arith.cmpf oeq
// CUDA: nvvm.barrier #nvvm.reduction<or>
// CUDA: scf.if {{.*}} -> ({{(f32, ){35}f32}})
// CUDA-NEXT: gpu.barrier
// K and V are arguments read as they are: 128-bit loads and stores, tails guarded per vector
// (plans with prefetch = true load the next block's before this block's products):
// CUDA: vector.load %arg1[{{.*}}] {alignment = 16 : i64} : memref<2x8x257x64xf16>, vector<8xf16>
// CUDA: vector.store {{.*}}, %[[K]][{{.*}}] {alignment = 16 : i64} : memref<64x72xf16, #gpu.address_space<workgroup>>, vector<8xf16>
// CUDA: vector.load %arg2[{{.*}}] {alignment = 16 : i64} : memref<2x8x257x64xf16>, vector<8xf16>
// CUDA: vector.store {{.*}}, %[[V]]
// CUDA: gpu.barrier
// S = Q K^T from K's B fragments, two 8-key tiles per ldmatrix:
// CUDA: memref.extract_aligned_pointer_as_index %[[K]]
// CUDA: nvvm.ldmatrix {{.*}}layout = #nvvm.mma_layout<row>, num = 4
// CUDA: nvvm.mma.sync A[{{.*}}] B[{{.*}}] C[{{.*}}] {layoutA = #nvvm.mma_layout<row>, layoutB = #nvvm.mma_layout<col>, shape = #nvvm.shape<m = 16, n = 8, k = 16>} : (vector<2xf16>, vector<2xf16>, f32) -> !llvm.struct<(f32, f32, f32, f32)>
// The scale is a multiply by 1/8 (a constant's reciprocal), then the mask:
// CUDA: arith.mulf {{.*}}, %cst
// CUDA: memref.load %arg3
// CUDA: arith.cmpf oeq
// Row maxima over the quad of threads that holds a row, exponentials as exp2:
// CUDA: arith.maximumf
// CUDA: gpu.shuffle  xor
// CUDA: math.exp2
// P @ V with P straight from the S registers, rounded to f16, V's fragments by
// ldmatrix.trans (V is [key, d]):
// CUDA: arith.truncf {{.*}} : f32 to f16
// CUDA: memref.extract_aligned_pointer_as_index %[[V]]
// CUDA: nvvm.ldmatrix {{.*}}layout = #nvvm.mma_layout<col>, num = 4
// CUDA: nvvm.mma.sync
// CUDA: scf.yield
// A row masked everywhere sends the workgroup through the second pass:
// CUDA: arith.cmpf ole
// CUDA: nvvm.barrier #nvvm.reduction<or>
// CUDA: gpu.shuffle  xor
// CUDA: arith.divf
// CUDA: arith.truncf {{.*}} : f32 to f16
// CUDA: memref.store {{.*}}, %arg4
// CUDA-NOT: gpu.barrier
// CHECK: gpu.return
// CHECK-NOT: 257x257xf16

// SPV: gpu.binary @kf_kernels
// SPV-SAME: attn_k0_attention = {bindings = [{{.*}}], {{.*}}workgroup_bytes = 15168 : i64, workgroup_size = array<i64: 128, 1, 1>}
// PTX: gpu.binary @kf_kernels
// PTX-SAME: .shared .align 16 .b8 __wg_attn_k0_attention_0[9216];
// PTX-SAME: bar.sync
// PTX-SAME: mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32
func.func private @attn_k0_attention(%q: tensor<2x8x257x64xf16>, %k: tensor<2x8x257x64xf16>, %v: tensor<2x8x257x64xf16>, %mask: tensor<257x257xf32>) -> tensor<2x8x257x64xf16> attributes {kf.kernel = "attention", kf.fused_lines = ["attn.py:3", "attn.py:5", "attn.py:6", "attn.py:7"]} {
  %scale = "kf.fill"() {value = 8.0 : f64} : () -> tensor<f16>
  %zero = "kf.fill"() {value = 0.0 : f64} : () -> tensor<f32>
  %kt = "kf.transpose"(%k) {perm = array<i64: 0, 1, 3, 2>} : (tensor<2x8x257x64xf16>) -> tensor<2x8x64x257xf16>
  %s = "kf.matmul"(%q, %kt) : (tensor<2x8x257x64xf16>, tensor<2x8x64x257xf16>) -> tensor<2x8x257x257xf16>
  %d = "kf.div"(%s, %scale) : (tensor<2x8x257x257xf16>, tensor<f16>) -> tensor<2x8x257x257xf16>
  %m = "kf.cmp"(%mask, %zero) {predicate = "eq"} : (tensor<257x257xf32>, tensor<f32>) -> tensor<257x257xi1>
  %f = "kf.masked_fill"(%d, %m) {value = -1.0e9 : f64} : (tensor<2x8x257x257xf16>, tensor<257x257xi1>) -> tensor<2x8x257x257xf16>
  %p = "kf.softmax"(%f) {dim = -1 : i64} : (tensor<2x8x257x257xf16>) -> tensor<2x8x257x257xf16>
  %o = "kf.matmul"(%p, %v) : (tensor<2x8x257x257xf16>, tensor<2x8x257x64xf16>) -> tensor<2x8x257x64xf16>
  return %o : tensor<2x8x257x64xf16>
}
func.func @attn(%q: tensor<2x8x257x64xf16>, %k: tensor<2x8x257x64xf16>, %v: tensor<2x8x257x64xf16>, %mask: tensor<257x257xf32>) -> tensor<2x8x257x64xf16> {
  %0 = call @attn_k0_attention(%q, %k, %v, %mask) : (tensor<2x8x257x64xf16>, tensor<2x8x257x64xf16>, tensor<2x8x257x64xf16>, tensor<257x257xf32>) -> tensor<2x8x257x64xf16>
  return %0 : tensor<2x8x257x64xf16>
}

// -----

// A linear layer with bias and GELU, x @ w^T: the matmul strategy stages A and B tiles
// (A k-major, its rows padded by one word) in workgroup memory, runs the K loop between two
// barriers, and computes bias + GELU on the f32 accumulators before the guarded stores.
// CHECK-LABEL: func.func private @mlp_k0_matmul
// CHECK: gpu.func @mlp_k0_matmul(%arg0: memref<257x65xf32>, %arg1: memref<129x65xf32>, %arg2: memref<129xf32>, %arg3: memref<257x129xf32>)
// CUDA-SAME: workgroup(%[[A:.*]] : memref<32x65xf32, #gpu.address_space<workgroup>> {llvm.align = 16 : i64}, %[[B:.*]] : memref<32x64xf32, #gpu.address_space<workgroup>> {llvm.align = 16 : i64})
// SPIRV-SAME: workgroup(%[[A:.*]] : memref<16x65xf32, #gpu.address_space<workgroup>> {llvm.align = 16 : i64}, %[[B:.*]] : memref<16x64xf32, #gpu.address_space<workgroup>> {llvm.align = 16 : i64})
// CHECK-SAME: kf.grid = array<i64: 3, 5, 1>
// CHECK-SAME: kf.strategy = "matmul"
// CHECK-SAME: known_block_size = array<i32: 256, 1, 1>
// 64x64 tiles, 4x4 accumulators per thread (15 workgroups: too few for 128x128 tiles);
// BLOCK_K is 32 within CUDA's 48 KiB, 16 within Vulkan's guaranteed 16 KiB:
// CUDA: scf.for {{.*}} = %c0 to %c65 step %c32 iter_args({{.*}}) -> ({{(f32, ){15}f32}})
// SPIRV: scf.for {{.*}} = %c0 to %c65 step %c16 iter_args({{.*}}) -> ({{(f32, ){15}f32}})
// CHECK-NEXT: gpu.barrier
// w^T is read along k, its contiguous dimension:
// CHECK: memref.load %arg0
// CHECK: memref.store {{.*}}, %[[A]]
// CHECK: memref.load %arg1
// CHECK: memref.store {{.*}}, %[[B]]
// CHECK: gpu.barrier
// CHECK: memref.load %[[A]]
// CHECK: memref.load %[[B]]
// CHECK: math.fma
// CHECK: memref.load %arg2
// CHECK: arith.addf
// CHECK: math.erf
// CHECK: memref.store {{.*}}, %arg3
// SPV: gpu.binary @kf_kernels
// PTX: gpu.binary @kf_kernels
func.func private @mlp_k0_matmul(%x: tensor<257x65xf32>, %w: tensor<129x65xf32>, %b: tensor<129xf32>) -> tensor<257x129xf32> attributes {kf.kernel = "matmul", kf.fused_lines = ["mlp.py:2", "mlp.py:3"]} {
  %wt = "kf.transpose"(%w) {perm = array<i64: 1, 0>} : (tensor<129x65xf32>) -> tensor<65x129xf32>
  %y = "kf.matmul"(%x, %wt) : (tensor<257x65xf32>, tensor<65x129xf32>) -> tensor<257x129xf32>
  %z = "kf.add"(%y, %b) : (tensor<257x129xf32>, tensor<129xf32>) -> tensor<257x129xf32>
  %g = "kf.gelu"(%z) {approximate = "none"} : (tensor<257x129xf32>) -> tensor<257x129xf32>
  return %g : tensor<257x129xf32>
}
func.func @mlp(%x: tensor<257x65xf32>, %w: tensor<129x65xf32>, %b: tensor<129xf32>) -> tensor<257x129xf32> {
  %0 = call @mlp_k0_matmul(%x, %w, %b) : (tensor<257x65xf32>, tensor<129x65xf32>, tensor<129xf32>) -> tensor<257x129xf32>
  return %0 : tensor<257x129xf32>
}

// -----

// The same layer in f16 on CUDA takes the tensor cores: A and B tiles in f16 (B
// n-major, as the transposed weight lies in memory; 128 bytes of K a row), staged
// synchronously (rows of 65 elements are not whole 16-byte pieces, so no cp.async),
// mma.sync m16n8k16 from fragments
// that ldmatrix reads of both, bias and GELU on the f32
// accumulators; SPIR-V keeps the SIMT GEMM.
// CHECK-LABEL: func.func private @mlp16_k0_matmul
// CUDA: gpu.func @mlp16_k0_matmul
// CUDA-SAME: workgroup(%[[A:.*]] : memref<64x72xf16, #gpu.address_space<workgroup>> {llvm.align = 16 : i64}, %[[B:.*]] : memref<64x72xf16, #gpu.address_space<workgroup>> {llvm.align = 16 : i64})
// CUDA-SAME: known_block_size = array<i32: 128, 1, 1>
// CUDA: scf.for {{.*}} = %c0 to %c65 step %c64 iter_args({{.*}}) -> ({{(f32, ){31}f32}})
// CUDA: gpu.barrier
// CUDA: memref.store {{.*}}, %[[A]]
// CUDA: memref.store {{.*}}, %[[B]]
// CUDA: gpu.barrier
// CUDA: memref.extract_aligned_pointer_as_index %[[A]]
// CUDA: nvvm.ldmatrix {{.*}}layout = #nvvm.mma_layout<row>, num = 4
// CUDA: memref.extract_aligned_pointer_as_index %[[B]]
// CUDA: nvvm.ldmatrix {{.*}}layout = #nvvm.mma_layout<row>, num = 4
// CUDA: nvvm.mma.sync
// CUDA: scf.yield
// CUDA: math.erf
// CUDA: arith.truncf {{.*}} : f32 to f16
// SPIRV: gpu.func @mlp16_k0_matmul
// SPIRV-SAME: workgroup(%{{.*}} : memref<16x65xf32, #gpu.address_space<workgroup>> {llvm.align = 16 : i64}, %{{.*}} : memref<16x64xf32, #gpu.address_space<workgroup>> {llvm.align = 16 : i64})
// SPIRV-NOT: nvvm
// SPV: gpu.binary @kf_kernels
// PTX: gpu.binary @kf_kernels
// PTX-SAME: mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32
func.func private @mlp16_k0_matmul(%x: tensor<257x65xf16>, %w: tensor<129x65xf16>, %b: tensor<129xf16>) -> tensor<257x129xf16> attributes {kf.kernel = "matmul", kf.fused_lines = ["mlp.py:2", "mlp.py:3"]} {
  %wt = "kf.transpose"(%w) {perm = array<i64: 1, 0>} : (tensor<129x65xf16>) -> tensor<65x129xf16>
  %y = "kf.matmul"(%x, %wt) : (tensor<257x65xf16>, tensor<65x129xf16>) -> tensor<257x129xf16>
  %z = "kf.add"(%y, %b) : (tensor<257x129xf16>, tensor<129xf16>) -> tensor<257x129xf16>
  %g = "kf.gelu"(%z) {approximate = "none"} : (tensor<257x129xf16>) -> tensor<257x129xf16>
  return %g : tensor<257x129xf16>
}
func.func @mlp16(%x: tensor<257x65xf16>, %w: tensor<129x65xf16>, %b: tensor<129xf16>) -> tensor<257x129xf16> {
  %0 = call @mlp16_k0_matmul(%x, %w, %b) : (tensor<257x65xf16>, tensor<129x65xf16>, tensor<129xf16>) -> tensor<257x129xf16>
  return %0 : tensor<257x129xf16>
}

// -----

// Rows of whole 16-byte pieces (K 128, N 136), for CUDA the tiles are a 4-stage cp.async
// pipeline, stacked four times in workgroup memory (4 x 64 rows of A, 4 x 32 k-rows of B
// as it lies, n-major); three K blocks are in flight before the loop, and each step waits
// for its own (wait.group 2), passes one barrier, issues the block three ahead and
// multiplies with ldmatrix fragments of its stage. SPIR-V stages synchronously.
// CHECK-LABEL: func.func private @gemm16_k0_matmul
// CUDA: gpu.func @gemm16_k0_matmul
// CUDA-SAME: workgroup(%[[A:.*]] : memref<256x40xf16, #gpu.address_space<workgroup>> {llvm.align = 16 : i64}, %[[B:.*]] : memref<128x72xf16, #gpu.address_space<workgroup>> {llvm.align = 16 : i64})
// CUDA-COUNT-3: nvvm.cp.async.commit.group
// CUDA: scf.for {{.*}} = %c0 to %c128 step %c32 iter_args({{.*}}) -> ({{(f32, ){31}f32}})
// CUDA: nvvm.cp.async.wait.group 2
// CUDA-NEXT: gpu.barrier
// CUDA: nvgpu.device_async_copy {{.*}}, %[[A]]{{.*}}, 8, {{.*}} {bypassL1}
// CUDA: nvgpu.device_async_copy {{.*}}, %[[B]]{{.*}}, 8, {{.*}} {bypassL1}
// CUDA: nvvm.cp.async.commit.group
// CUDA: nvvm.ldmatrix
// CUDA: nvvm.mma.sync
// CUDA: scf.yield
// CUDA: nvvm.cp.async.wait.group 0
// SPIRV: gpu.func @gemm16_k0_matmul
// SPIRV-NOT: nvgpu
// PTX: gpu.binary @kf_kernels
// PTX-SAME: cp.async.cg.shared.global
func.func private @gemm16_k0_matmul(%x: tensor<200x128xf16>, %w: tensor<128x136xf16>) -> tensor<200x136xf16> attributes {kf.kernel = "matmul", kf.fused_lines = ["gemm.py:2"]} {
  %y = "kf.matmul"(%x, %w) : (tensor<200x128xf16>, tensor<128x136xf16>) -> tensor<200x136xf16>
  return %y : tensor<200x136xf16>
}
func.func @gemm16(%x: tensor<200x128xf16>, %w: tensor<128x136xf16>) -> tensor<200x136xf16> {
  %0 = call @gemm16_k0_matmul(%x, %w) : (tensor<200x128xf16>, tensor<128x136xf16>) -> tensor<200x136xf16>
  return %0 : tensor<200x136xf16>
}
