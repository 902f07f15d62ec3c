// kf-map-to-gpu for sm_90a: the matmul and attention strategies write wgmma kernels
// (passes/strategies/matmul/wgmma.py, attention/hopper/); for sm_90 the same functions get
// mma.sync (kf-map-to-gpu-attention.mlir).
// RUN: kf-opt %s --split-input-file --pass-pipeline='builtin.module(kf-map-to-gpu{target=cuda chip=sm_90a})' | FileCheck %s
// RUN: kf-opt %s --split-input-file --pass-pipeline='builtin.module(kf-map-to-gpu{target=cuda chip=sm_90a}, kf-to-cuda{chip=sm_90a})' | FileCheck %s --check-prefix=PTX
// RUN: kf-opt %s --split-input-file --pass-pipeline='builtin.module(kf-map-to-gpu{target=cuda chip=sm_90})' | FileCheck %s --check-prefix=SM90

// A bf16 GEMM with B as it lies (k by n), off the tile grid (M 200, N 136): two
// warpgroups (256 threads) over 128 rows; the tiles live in dynamic shared memory at a
// 1024-byte aligned offset, as rows of 128 bytes (64 bf16), four stages of 128 rows of A
// and of 64 k-rows x 64 columns of B. Each 16-byte cp.async lands at its chunk XOR the
// row's position in its 8-row atom (the 128-byte swizzle wgmma reads). Two blocks are in
// flight before the loop; a step waits for its own, fences the copies for the async
// proxy, passes one barrier, issues the block two ahead and issues 4 wgmma m64n64k16
// (K 64 / 16) by descriptor, B transposed (<row>), leaving one group in flight.
// CHECK-LABEL: gpu.func @gemm_k0_matmul
// CHECK-SAME: kf.block = array<i64: 256, 1, 1>
// CHECK: %[[WIN:.*]] = gpu.dynamic_shared_memory
// CHECK: memref.extract_aligned_pointer_as_index %[[WIN]]
// CHECK: %[[A:.*]] = memref.view %[[WIN]]{{.*}} to memref<512x64xbf16, #gpu.address_space<workgroup>>
// CHECK: %[[B:.*]] = memref.view %[[WIN]]{{.*}} to memref<256x64xbf16, #gpu.address_space<workgroup>>
// CHECK: arith.xori
// CHECK: nvgpu.device_async_copy %arg0{{.*}}, %[[A]]{{.*}}, 8, {{.*}} {bypassL1}
// CHECK: nvgpu.device_async_copy %arg1{{.*}}, %[[B]]{{.*}}, 8, {{.*}} {bypassL1}
// CHECK: nvvm.cp.async.commit.group
// CHECK: nvvm.cp.async.commit.group
// CHECK: scf.for {{.*}} = %c0 to %c128 step %c64 iter_args({{.*}}) -> (!llvm.struct<({{(f32, ){31}f32}})>)
// CHECK: nvvm.cp.async.wait.group 1
// CHECK-NEXT: nvvm.fence.proxy {kind = #nvvm.proxy_kind<async.shared>, space = #nvvm.shared_space<cta>}
// CHECK-NEXT: gpu.barrier
// CHECK: nvvm.cp.async.commit.group
// CHECK: nvvm.wgmma.fence.aligned
// CHECK-COUNT-4: nvvm.wgmma.mma_async {{.*}} <m = 64, n = 64, k = 16>, D[<f32>, <one>], A[<bf16>, <one>, <row>], B[<bf16>, <one>, <row>]
// CHECK: nvvm.wgmma.commit.group.sync.aligned
// CHECK-NEXT: nvvm.wgmma.wait.group.sync.aligned 1
// CHECK: scf.yield
// CHECK: nvvm.wgmma.wait.group.sync.aligned 0
// CHECK: nvvm.cp.async.wait.group 0
// CHECK: llvm.extractvalue
// CHECK: memref.store {{.*}}, %arg2
// PTX: gpu.binary @kf_kernels
// PTX-SAME: .target sm_90a
// PTX-SAME: fence.proxy.async.shared::cta
// PTX-SAME: wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16
// SM90-LABEL: gpu.func @gemm_k0_matmul
// SM90-NOT: wgmma
// SM90: nvvm.mma.sync
func.func private @gemm_k0_matmul(%x: tensor<200x128xbf16>, %w: tensor<128x136xbf16>) -> tensor<200x136xbf16> attributes {kf.kernel = "matmul", kf.fused_lines = ["gemm.py:2"]} {
  %y = "kf.matmul"(%x, %w) : (tensor<200x128xbf16>, tensor<128x136xbf16>) -> tensor<200x136xbf16>
  return %y : tensor<200x136xbf16>
}
func.func @gemm(%x: tensor<200x128xbf16>, %w: tensor<128x136xbf16>) -> tensor<200x136xbf16> {
  %0 = call @gemm_k0_matmul(%x, %w) : (tensor<200x128xbf16>, tensor<128x136xbf16>) -> tensor<200x136xbf16>
  return %0 : tensor<200x136xbf16>
}

// -----

// The seed's attention without a mask, head dim 128, 300 keys (not a multiple of the 128
// a block): Q (128 x 128), K and V (three stages of 128 keys) in swizzled shared memory,
// and two mbarriers a stage (WARP_SPECIALIZED). Thread 0 initializes them: full ones to
// 128 arrivals (the producer warpgroup's threads), empty ones to 256 (the consumers').
// The third warpgroup is the producer: it gives up registers, and for each block waits
// on the stage's empty barrier, issues its 16 + 16 copies of K and V (edge-tested one by
// one: the last block is past the keys' end) and arrives on the full one as they land.
// The first two compute, with the producer's registers. Block 0's S = Q K^T (8 wgmma
// m64n128k16 by descriptor, K-major B: <col>) and its softmax come before the loop,
// whose scale is one FFMA a score before ex2.approx.ftz (LINEAR_SCORES, FTZ_EXP2). In
// the loop (OVERLAP_PV, three blocks or more) a block is waited for on its full
// barrier, then the async proxy fenced (the copies wrote through the generic one);
// block j's S and block j - 1's O += P V (8 register-A wgmmas, inline PTX, V
// transposed: the trailing 1) are issued as two groups; the loop waits for S alone
// (wait 1) before its softmax and for both (wait 0) before O is rescaled, and then
// gives block j - 1's stage back on its empty barrier. No barrier of the whole
// workgroup in the loop. The last block's P V follows the loop. O is stored as 1 / l
// (one division a row) times O, a thread's two neighbouring columns a store.
// CHECK-LABEL: gpu.func @attn_k0_attention
// CHECK-SAME: kf.block = array<i64: 384, 1, 1>
// CHECK: memref.view {{.*}} to memref<256x64xbf16, #gpu.address_space<workgroup>>
// CHECK: memref.view {{.*}} to memref<768x64xbf16, #gpu.address_space<workgroup>>
// CHECK: memref.view {{.*}} to memref<768x64xbf16, #gpu.address_space<workgroup>>
// CHECK: memref.view {{.*}} to memref<1x6xi64, #gpu.address_space<workgroup>>
// CHECK: nvvm.mbarrier.init {{.*}}, %c128_i32
// CHECK: nvvm.mbarrier.init {{.*}}, %c256_i32
// CHECK-COUNT-4: nvvm.mbarrier.init
// CHECK: gpu.barrier
// CHECK-NEXT: %[[P:.*]] = arith.cmpi uge, %thread_id_x, %c256 : index
// CHECK-NEXT: scf.if %[[P]]
// CHECK-NEXT: nvvm.setmaxregister decrease 24
// CHECK: scf.for
// CHECK: nvvm.mbarrier.try_wait.parity
// CHECK-COUNT-32: nvvm.cp.async.shared.global {{.*}}, 16, cache =  cg
// CHECK: nvvm.cp.async.mbarrier.arrive {{.*}} {noinc = true}
// CHECK: } else {
// CHECK-NEXT: nvvm.setmaxregister increase 240
// CHECK: nvvm.mbarrier.try_wait.parity
// CHECK-NEXT: nvvm.fence.proxy {kind = #nvvm.proxy_kind<async.shared>, space = #nvvm.shared_space<cta>}
// CHECK-COUNT-8: nvvm.wgmma.mma_async {{.*}} <m = 64, n = 128, k = 16>, D[<f32>, <one>], A[<bf16>, <one>, <row>], B[<bf16>, <one>, <col>]
// CHECK: nvvm.wgmma.wait.group.sync.aligned 0
// CHECK: math.fma
// CHECK-NEXT: math.exp2 {{.*}} fastmath<afn> : f32
// CHECK: scf.for
// CHECK: nvvm.mbarrier.try_wait.parity
// CHECK-NEXT: nvvm.fence.proxy
// CHECK-NOT: gpu.barrier
// CHECK: nvvm.wgmma.fence.aligned
// CHECK-COUNT-8: nvvm.wgmma.mma_async {{.*}} <m = 64, n = 128, k = 16>, D[<f32>, <one>], A[<bf16>, <one>, <row>], B[<bf16>, <one>, <col>]
// CHECK-NEXT: nvvm.wgmma.commit.group.sync.aligned
// CHECK-NOT: nvvm.wgmma.wait
// CHECK: nvvm.wgmma.fence.aligned
// CHECK-COUNT-8: llvm.inline_asm has_side_effects {{.*}}wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {{.*}} p, 1, 1, 1;
// CHECK: nvvm.wgmma.commit.group.sync.aligned
// CHECK-NEXT: nvvm.wgmma.wait.group.sync.aligned 1
// CHECK: gpu.shuffle  xor
// CHECK: math.fma
// CHECK-NEXT: math.exp2 {{.*}} fastmath<afn> : f32
// CHECK: nvvm.wgmma.wait.group.sync.aligned 0
// CHECK-NOT: gpu.barrier
// CHECK: nvvm.mbarrier.arrive
// CHECK-NOT: gpu.barrier
// CHECK: scf.yield
// CHECK: nvvm.wgmma.fence.aligned
// CHECK-COUNT-8: llvm.inline_asm has_side_effects {{.*}}wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {{.*}} p, 1, 1, 1;
// CHECK: nvvm.wgmma.wait.group.sync.aligned 0
// CHECK: arith.divf %cst
// CHECK-NOT: arith.divf
// CHECK: vector.store {{.*}}, %arg3{{.*}} {alignment = 4 : i64} : memref<2x4x300x128xbf16>, vector<2xbf16>
// PTX: gpu.binary @kf_kernels
// PTX-SAME: ex2.approx.ftz.f32
// PTX-SAME: wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16
// SM90-LABEL: gpu.func @attn_k0_attention
// SM90-NOT: wgmma
// SM90: nvvm.mma.sync
func.func private @attn_k0_attention(%q: tensor<2x4x300x128xbf16>, %k: tensor<2x4x300x128xbf16>, %v: tensor<2x4x300x128xbf16>) -> tensor<2x4x300x128xbf16> attributes {kf.kernel = "attention", kf.fused_lines = ["attn.py:3"]} {
  %scale = "kf.fill"() {value = 11.3 : f64} : () -> tensor<bf16>
  %kt = "kf.transpose"(%k) {perm = array<i64: 0, 1, 3, 2>} : (tensor<2x4x300x128xbf16>) -> tensor<2x4x128x300xbf16>
  %s = "kf.matmul"(%q, %kt) : (tensor<2x4x300x128xbf16>, tensor<2x4x128x300xbf16>) -> tensor<2x4x300x300xbf16>
  %d = "kf.div"(%s, %scale) : (tensor<2x4x300x300xbf16>, tensor<bf16>) -> tensor<2x4x300x300xbf16>
  %p = "kf.softmax"(%d) {dim = -1 : i64} : (tensor<2x4x300x300xbf16>) -> tensor<2x4x300x300xbf16>
  %o = "kf.matmul"(%p, %v) : (tensor<2x4x300x300xbf16>, tensor<2x4x300x128xbf16>) -> tensor<2x4x300x128xbf16>
  return %o : tensor<2x4x300x128xbf16>
}
func.func @attn(%q: tensor<2x4x300x128xbf16>, %k: tensor<2x4x300x128xbf16>, %v: tensor<2x4x300x128xbf16>) -> tensor<2x4x300x128xbf16> {
  %0 = call @attn_k0_attention(%q, %k, %v) : (tensor<2x4x300x128xbf16>, tensor<2x4x300x128xbf16>, tensor<2x4x300x128xbf16>) -> tensor<2x4x300x128xbf16>
  return %0 : tensor<2x4x300x128xbf16>
}

// -----

// The same attention with 384 keys (whole blocks) is persistent (PERSISTENT): 24 tiles
// of (query block, head), a workgroup each up to the 132 multiprocessors kf-map-to-gpu
// is told of. The producer walks its tiles' key blocks in one i32 loop, with addresses
// from a thread index read anew (inline asm; hoisted out of the tile loop they spilled),
// and at a tile's first block copies Q (16 copies a thread) once the consumers gave it
// back on a seventh mbarrier; the consumers loop over the tiles with the grid's stride
// and give Q back when the tile's last S is complete.
// CHECK-LABEL: gpu.func @attnp_k0_attention
// CHECK-SAME: kf.block = array<i64: 384, 1, 1>
// CHECK-SAME: kf.grid = array<i64: 24, 1, 1>
// CHECK: memref.view {{.*}} to memref<1x7xi64, #gpu.address_space<workgroup>>
// CHECK: nvvm.mbarrier.init {{.*}}, %c128_i32
// CHECK: nvvm.mbarrier.init {{.*}}, %c256_i32
// CHECK-COUNT-5: nvvm.mbarrier.init
// CHECK: nvvm.setmaxregister decrease 24
// CHECK: gpu.grid_dim x
// CHECK: scf.for {{.*}} : i32
// CHECK: llvm.inline_asm has_side_effects "mov.u32 $0, %tid.x;"
// CHECK: scf.if
// CHECK: nvvm.mbarrier.try_wait.parity
// CHECK-COUNT-16: nvvm.cp.async.shared.global {{.*}}, 16, cache =  cg
// CHECK: nvvm.mbarrier.try_wait.parity
// CHECK-COUNT-32: nvvm.cp.async.shared.global {{.*}}, 16, cache =  cg
// CHECK: nvvm.cp.async.mbarrier.arrive {{.*}} {noinc = true}
// CHECK: } else {
// CHECK-NEXT: nvvm.setmaxregister increase 240
// CHECK: gpu.grid_dim x
// CHECK-NEXT: scf.for {{.*}} = %block_id_x{{.*}} to %c24 step %grid_dim_x
// CHECK: scf.for
// CHECK: nvvm.wgmma.wait.group.sync.aligned 1
// CHECK-NEXT: %[[LAST:.*]] = arith.cmpi eq, %{{.*}}, %c256 : index
// CHECK-NEXT: scf.if %[[LAST]] {
// CHECK: nvvm.mbarrier.arrive
// CHECK: vector.store {{.*}}, %arg3
// PTX: gpu.binary @kf_kernels
// PTX-SAME: cp.async.mbarrier.arrive.noinc.shared.b64
func.func private @attnp_k0_attention(%q: tensor<2x4x300x128xbf16>, %k: tensor<2x4x384x128xbf16>, %v: tensor<2x4x384x128xbf16>) -> tensor<2x4x300x128xbf16> attributes {kf.kernel = "attention", kf.fused_lines = ["attn.py:3"]} {
  %scale = "kf.fill"() {value = 11.3 : f64} : () -> tensor<bf16>
  %kt = "kf.transpose"(%k) {perm = array<i64: 0, 1, 3, 2>} : (tensor<2x4x384x128xbf16>) -> tensor<2x4x128x384xbf16>
  %s = "kf.matmul"(%q, %kt) : (tensor<2x4x300x128xbf16>, tensor<2x4x128x384xbf16>) -> tensor<2x4x300x384xbf16>
  %d = "kf.div"(%s, %scale) : (tensor<2x4x300x384xbf16>, tensor<bf16>) -> tensor<2x4x300x384xbf16>
  %p = "kf.softmax"(%d) {dim = -1 : i64} : (tensor<2x4x300x384xbf16>) -> tensor<2x4x300x384xbf16>
  %o = "kf.matmul"(%p, %v) : (tensor<2x4x300x384xbf16>, tensor<2x4x384x128xbf16>) -> tensor<2x4x300x128xbf16>
  return %o : tensor<2x4x300x128xbf16>
}

func.func @attnp(%q: tensor<2x4x300x128xbf16>, %k: tensor<2x4x384x128xbf16>, %v: tensor<2x4x384x128xbf16>) -> tensor<2x4x300x128xbf16> {
  %0 = call @attnp_k0_attention(%q, %k, %v) : (tensor<2x4x300x128xbf16>, tensor<2x4x384x128xbf16>, tensor<2x4x384x128xbf16>) -> tensor<2x4x300x128xbf16>
  return %0 : tensor<2x4x300x128xbf16>
}

// -----

// A mask every head shares (a causal [300, 300] mask): the strategy also writes the
// block table kernel, a workgroup per (query block, key block) of 128 x 128, whose
// workgroup OR / AND of "unmasked" per position, and AND of "the mask is key > query
// here" (in-range positions only), become 0 (dead), 1 (partial), 2 (whole) or 3 (causal:
// partial, and exactly the causal pattern) in an i32 [3, 3] table. The pass declares
// it, calls it before the attention kernel with the same operands, and passes its table
// as the kernel's last input.
// CHECK: func.func private @attn_k0_attention_blocks({{.*}}) -> tensor<3x3xi32> attributes {kf.gpu_func = @kf_kernels::@attn_k0_attention_blocks}
// CHECK: func.func private @attn_k0_attention({{.*}}, tensor<300x300xbf16>, tensor<3x3xi32>) -> tensor<2x4x300x128xbf16>
// CHECK: func.func @attn
// CHECK-NEXT: %[[T:.*]] = call @attn_k0_attention_blocks(%arg0, %arg1, %arg2, %arg3)
// CHECK-NEXT: call @attn_k0_attention(%arg0, %arg1, %arg2, %arg3, %[[T]])
// CHECK-LABEL: gpu.func @attn_k0_attention_blocks
// CHECK-SAME: %arg4: memref<3x3xi32>
// CHECK-SAME: kf.grid = array<i64: 3, 3, 1>
// CHECK: memref.load %arg3
// CHECK: arith.cmpi ugt
// CHECK: nvvm.barrier {{.*}}reduction<or>
// CHECK: nvvm.barrier {{.*}}reduction<and>
// CHECK: nvvm.barrier {{.*}}reduction<and>
// CHECK: arith.select {{.*}}, %c3_i32, %c1_i32
// CHECK: arith.select {{.*}}, %c2_i32,
// CHECK: memref.store {{.*}}, %arg4
// The kernel has a producer warpgroup (WARP_SPECIALIZED), which walks the same table
// row: mbarriers for three stages and one for Q (7), then the producer reads the row
// (lane l of each warp loads entry l, a ballot makes the bit mask of live key blocks),
// copies Q and arrives on Q's barrier as it lands, and copies the i-th live block (cttz
// of the live bits above the last one) into stage i % 3 when its empty barrier allows.
// CHECK-LABEL: gpu.func @attn_k0_attention(
// CHECK-SAME: %arg4: memref<3x3xi32>
// CHECK-COUNT-7: nvvm.mbarrier.init
// CHECK: gpu.barrier
// CHECK: scf.if
// CHECK-NEXT: nvvm.setmaxregister decrease 24
// CHECK: memref.load %arg4
// CHECK: nvvm.vote.sync ballot
// CHECK-NOT: nvvm.vote.sync
// CHECK: nvvm.cp.async.mbarrier.arrive {{.*}} {noinc = true}
// CHECK: llvm.intr.ctpop
// CHECK: scf.for
// CHECK: nvvm.mbarrier.try_wait.parity
// CHECK: nvvm.cp.async.mbarrier.arrive {{.*}} {noinc = true}
// CHECK: llvm.intr.cttz
// The consumers read the row too (three ballots: live, whole and causal blocks) and wait
// for Q. Of the (at most two) passes, the first walks the live blocks as the producer
// copies them: wait on the block's full barrier, fence, S = Q K^T; with tails (300
// queries and keys) a block's P V is waited for before the next S (WALK_OVERLAP_PV
// applies where blocks are whole). The second pass, only where a query row is masked
// everywhere, is the consumers' alone (their own copies, named barrier 1 of 256).
// CHECK: } else {
// CHECK-NEXT: nvvm.setmaxregister increase 240
// CHECK: memref.load %arg4
// CHECK-COUNT-3: nvvm.vote.sync ballot
// CHECK-NOT: memref.load %arg4
// CHECK: nvvm.mbarrier.try_wait.parity
// CHECK-NEXT: nvvm.fence.proxy
// CHECK: llvm.intr.ctpop
// CHECK: scf.for
// CHECK: nvvm.mbarrier.try_wait.parity
// CHECK-NEXT: nvvm.fence.proxy
// CHECK: nvvm.wgmma.mma_async
// Then the block's class picks the softmax: whole blocks without the mask and causal
// ones with it computed from the indices (row - n0 - 2 tig, once a row as i32, against
// each column's constant: 64 compares a thread, no mask element read) in the log2
// domain, one FFMA and one ex2 a score (LINEAR_MASKED_BLOCKS); the others with the mask
// read from global memory. Each branch tests a warp vote of its condition, so ptxas
// sees it uniform and keeps the wgmmas asynchronous. The block's stage goes back on its
// empty barrier after its P V.
// CHECK: %[[WHOLE:.*]] = nvvm.vote.sync  ballot
// CHECK: %[[W:.*]] = arith.cmpi ne, %[[WHOLE]]
// CHECK-NEXT: scf.if %[[W]] -> ({{(f32, ){69}f32}})
// CHECK-NOT: memref.load %arg3
// CHECK: math.fma
// CHECK-NEXT: math.exp2
// CHECK: %[[CAUSAL:.*]] = nvvm.vote.sync  ballot
// CHECK: %[[C:.*]] = arith.cmpi ne, %[[CAUSAL]]
// CHECK-NEXT: scf.if %[[C]] -> ({{(f32, ){69}f32}})
// CHECK: arith.index_cast {{.*}} : index to i32
// CHECK: arith.index_cast {{.*}} : index to i32
// CHECK-NOT: memref.load %arg3
// CHECK-COUNT-64: arith.cmpi slt, {{.*}} : i32
// CHECK: math.fma
// CHECK-NEXT: math.exp2
// CHECK: memref.load %arg3
// CHECK: llvm.inline_asm has_side_effects {{.*}}wgmma.mma_async
// CHECK: nvvm.wgmma.wait.group.sync.aligned 0
// CHECK: nvvm.mbarrier.arrive
// CHECK: nvvm.barrier id = %c1_i32{{.*}} number_of_threads = %c256_i32
// CHECK: nvgpu.device_async_copy
// CHECK: llvm.inline_asm has_side_effects {{.*}}bar.red.or.pred p, 1, 256, q
// PTX: gpu.binary @kf_kernels
// PTX-SAME: bar.red.or.pred
// PTX-SAME: bar.red.and.pred
// PTX-SAME: bar.red.and.pred
// PTX-SAME: vote.sync.ballot.b32
// PTX-SAME: popc.b64
// PTX-SAME: wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16
// SM90-LABEL: gpu.func @attn_k0_attention(
// SM90-NOT: _blocks
func.func private @attn_k0_attention(%k: tensor<2x4x300x128xbf16>, %q: tensor<2x4x300x128xbf16>, %v: tensor<2x4x300x128xbf16>, %m: tensor<300x300xbf16>) -> tensor<2x4x300x128xbf16> attributes {kf.kernel = "attention", kf.fused_lines = ["attn.py:3"]} {
  %0 = "kf.transpose"(%k) {perm = array<i64: 0, 1, 3, 2>} : (tensor<2x4x300x128xbf16>) -> tensor<2x4x128x300xbf16>
  %1 = "kf.matmul"(%q, %0) : (tensor<2x4x300x128xbf16>, tensor<2x4x128x300xbf16>) -> tensor<2x4x300x300xbf16>
  %2 = "kf.fill"() {value = 11.313708498984761 : f64} : () -> tensor<bf16>
  %3 = "kf.div"(%1, %2) : (tensor<2x4x300x300xbf16>, tensor<bf16>) -> tensor<2x4x300x300xbf16>
  %4 = "kf.fill"() {value = 0.000000e+00 : f64} : () -> tensor<bf16>
  %5 = "kf.cmp"(%m, %4) {predicate = "eq"} : (tensor<300x300xbf16>, tensor<bf16>) -> tensor<300x300xi1>
  %6 = "kf.masked_fill"(%3, %5) {value = -1.000000e+09 : f64} : (tensor<2x4x300x300xbf16>, tensor<300x300xi1>) -> tensor<2x4x300x300xbf16>
  %7 = "kf.softmax"(%6) {dim = -1 : i64} : (tensor<2x4x300x300xbf16>) -> tensor<2x4x300x300xbf16>
  %8 = "kf.matmul"(%7, %v) : (tensor<2x4x300x300xbf16>, tensor<2x4x300x128xbf16>) -> tensor<2x4x300x128xbf16>
  return %8 : tensor<2x4x300x128xbf16>
}
func.func @attn(%k: tensor<2x4x300x128xbf16>, %q: tensor<2x4x300x128xbf16>, %v: tensor<2x4x300x128xbf16>, %m: tensor<300x300xbf16>) -> tensor<2x4x300x128xbf16> {
  %0 = call @attn_k0_attention(%k, %q, %v, %m) : (tensor<2x4x300x128xbf16>, tensor<2x4x300x128xbf16>, tensor<2x4x300x128xbf16>, tensor<300x300xbf16>) -> tensor<2x4x300x128xbf16>
  return %0 : tensor<2x4x300x128xbf16>
}

// -----

// The same mask with 256 queries and keys (whole blocks): the walk is persistent
// (PERSISTENT_WALK). The table grows to 2 x 11: a code per key block, four words a block
// of which query rows see a live score there (a warp vote per row, the warps of a row's
// parity ORed in shared memory), and a tile counter that workgroup (0, 0) zeroes.
// CHECK: func.func private @attnw_k0_attention_blocks({{.*}}) -> tensor<2x11xi32>
// CHECK-LABEL: gpu.func @attnw_k0_attention_blocks
// CHECK-SAME: workgroup(%{{.*}} : memref<16xi32, #gpu.address_space<workgroup>> {llvm.align = 16 : i64})
// CHECK: nvvm.vote.sync  any
// CHECK: gpu.barrier
// CHECK: memref.store {{.*}}, %arg4[%block_id_y, {{.*}}] : memref<2x11xi32>
// CHECK: memref.store %{{.*}}, %arg4[%c0, %c10] : memref<2x11xi32>
// The attention kernel starts a workgroup a tile up to the multiprocessors (16 here),
// with an eighth mbarrier (Q given back) and Q's barrier counting one more arrival.
// The producer claims a tile (an atomic add on the counter, handed to its 128 threads
// on named barrier 3) until none is left; per tile it ORs the rows' words (redux.sync:
// a row masked everywhere makes the walk visit every block, so there is no second
// pass), copies Q, and one thread writes the tile and its masks beside the barriers and
// arrives on Q's barrier. The consumers wait for Q's k-th fill, read the tile there and
// walk it, giving Q back at its last S.
// CHECK-LABEL: gpu.func @attnw_k0_attention(
// CHECK-SAME: kf.grid = array<i64: 16, 1, 1>
// CHECK: memref.view {{.*}} to memref<1x14xi64, #gpu.address_space<workgroup>>
// CHECK-COUNT-6: nvvm.mbarrier.init
// CHECK: nvvm.mbarrier.init {{.*}}, %c129_i32
// CHECK: nvvm.mbarrier.init {{.*}}, %c256_i32
// CHECK: nvvm.setmaxregister  decrease 24
// CHECK: scf.while
// CHECK: memref.atomic_rmw addi %c1_i32, %arg4[%c0, %c10]
// CHECK: nvvm.barrier id = %c3_i32 number_of_threads = %c128_i32
// CHECK: scf.condition
// CHECK-COUNT-4: nvvm.redux.sync  or
// CHECK: nvvm.cp.async.mbarrier.arrive {{.*}} {noinc = true}
// CHECK: scf.if
// CHECK: memref.store
// CHECK: nvvm.mbarrier.arrive
// CHECK: } else {
// CHECK-NEXT: nvvm.setmaxregister  increase 240
// CHECK-NEXT: scf.while
// CHECK: nvvm.mbarrier.try_wait.parity
// CHECK-NEXT: nvvm.fence.proxy
// CHECK-COUNT-4: memref.load %view_8
// CHECK: scf.condition
// CHECK-NOT: bar.red
// CHECK: vector.store
// CHECK: scf.yield
// PTX: gpu.binary @kf_kernels
// PTX-SAME: vote.sync.any.pred
// PTX-SAME: atom.global.add.u32
// PTX-SAME: bar.sync \093, 128
// PTX-SAME: redux.sync.or.b32
func.func private @attnw_k0_attention(%k: tensor<2x4x256x128xbf16>, %q: tensor<2x4x256x128xbf16>, %v: tensor<2x4x256x128xbf16>, %m: tensor<256x256xbf16>) -> tensor<2x4x256x128xbf16> attributes {kf.kernel = "attention", kf.fused_lines = ["attn.py:3"]} {
  %0 = "kf.transpose"(%k) {perm = array<i64: 0, 1, 3, 2>} : (tensor<2x4x256x128xbf16>) -> tensor<2x4x128x256xbf16>
  %1 = "kf.matmul"(%q, %0) : (tensor<2x4x256x128xbf16>, tensor<2x4x128x256xbf16>) -> tensor<2x4x256x256xbf16>
  %2 = "kf.fill"() {value = 11.313708498984761 : f64} : () -> tensor<bf16>
  %3 = "kf.div"(%1, %2) : (tensor<2x4x256x256xbf16>, tensor<bf16>) -> tensor<2x4x256x256xbf16>
  %4 = "kf.fill"() {value = 0.000000e+00 : f64} : () -> tensor<bf16>
  %5 = "kf.cmp"(%m, %4) {predicate = "eq"} : (tensor<256x256xbf16>, tensor<bf16>) -> tensor<256x256xi1>
  %6 = "kf.masked_fill"(%3, %5) {value = -1.000000e+09 : f64} : (tensor<2x4x256x256xbf16>, tensor<256x256xi1>) -> tensor<2x4x256x256xbf16>
  %7 = "kf.softmax"(%6) {dim = -1 : i64} : (tensor<2x4x256x256xbf16>) -> tensor<2x4x256x256xbf16>
  %8 = "kf.matmul"(%7, %v) : (tensor<2x4x256x256xbf16>, tensor<2x4x256x128xbf16>) -> tensor<2x4x256x128xbf16>
  return %8 : tensor<2x4x256x128xbf16>
}
func.func @attnw(%k: tensor<2x4x256x128xbf16>, %q: tensor<2x4x256x128xbf16>, %v: tensor<2x4x256x128xbf16>, %m: tensor<256x256xbf16>) -> tensor<2x4x256x128xbf16> {
  %0 = call @attnw_k0_attention(%k, %q, %v, %m) : (tensor<2x4x256x128xbf16>, tensor<2x4x256x128xbf16>, tensor<2x4x256x128xbf16>, tensor<256x256xbf16>) -> tensor<2x4x256x128xbf16>
  return %0 : tensor<2x4x256x128xbf16>
}

// -----

// A GEMM on the tile grid (M and N multiples of 128 and 256, K of 64): every block of a
// tile lies all inside or all outside its argument, so the copies take LEAN_COPIES.
// A thread's first address is computed once; a block adds one offset and tests once
// (a block outside copies 0 bytes from the thread's first address: src-size 0), and
// each further 16-byte copy is a constant byte offset of both pointers, which becomes
// the immediate of cp.async's addresses. No per-copy index arithmetic is left.
// CHECK-LABEL: gpu.func @grid_k0_matmul
// CHECK-NOT: nvgpu.device_async_copy
// CHECK: %[[IN:.*]] = arith.cmpi ult
// CHECK: %[[SRC:.*]] = arith.select %[[IN]]
// CHECK: %[[N:.*]] = arith.select %[[IN]], %c16_i32, %c0_i32 : i32
// CHECK: %[[S:.*]] = llvm.inttoptr %[[SRC]] : i64 to !llvm.ptr<1>
// CHECK: %[[D:.*]] = llvm.inttoptr {{.*}} : i64 to !llvm.ptr<3>
// CHECK: nvvm.cp.async.shared.global %[[D]], %[[S]], 16, cache =  cg, %[[N]]
// CHECK: %[[S1:.*]] = llvm.getelementptr %[[S]][8192] : (!llvm.ptr<1>) -> !llvm.ptr<1>, i8
// CHECK: %[[D1:.*]] = llvm.getelementptr %[[D]][4096] : (!llvm.ptr<3>) -> !llvm.ptr<3>, i8
// CHECK: nvvm.cp.async.shared.global %[[D1]], %[[S1]], 16, cache =  cg, %[[N]]
// CHECK: scf.for
// CHECK-NOT: nvgpu.device_async_copy
// CHECK: nvvm.cp.async.shared.global
// CHECK: scf.yield
// PTX: gpu.binary @kf_kernels
// PTX-SAME: cp.async.cg.shared.global [%rd{{[0-9]+}}+4096], [%rd{{[0-9]+}}+8192], 16, %r{{[0-9]+}};
func.func private @grid_k0_matmul(%x: tensor<256x128xbf16>, %w: tensor<128x256xbf16>) -> tensor<256x256xbf16> attributes {kf.kernel = "matmul", kf.fused_lines = ["gemm.py:2"]} {
  %y = "kf.matmul"(%x, %w) : (tensor<256x128xbf16>, tensor<128x256xbf16>) -> tensor<256x256xbf16>
  return %y : tensor<256x256xbf16>
}
func.func @grid(%x: tensor<256x128xbf16>, %w: tensor<128x256xbf16>) -> tensor<256x256xbf16> {
  %0 = call @grid_k0_matmul(%x, %w) : (tensor<256x128xbf16>, tensor<128x256xbf16>) -> tensor<256x256xbf16>
  return %0 : tensor<256x256xbf16>
}
