// kf-tile and kf-map-to-gpu for attention at run-time sequence lengths (strategies/
// run_time_sizes.py, attention/run_time.py): the tensor-core kernels, one for every length
// up to 4096.
// RUN: kf-opt %s --split-input-file --pass-pipeline='builtin.module(kf-tile{target=cuda chip=sm_90a}, kf-map-to-gpu{target=cuda chip=sm_90a})' | FileCheck %s
// RUN: kf-opt %s --split-input-file --pass-pipeline='builtin.module(kf-tile{target=cuda chip=sm_80}, kf-map-to-gpu{target=cuda chip=sm_80})' | FileCheck %s --check-prefix=SM80
// RUN: kf-opt %s --split-input-file --pass-pipeline='builtin.module(kf-tile{target=cuda chip=sm_90a}, kf-map-to-gpu{target=cuda chip=sm_90a}, kf-to-cuda{chip=sm_90a})' | FileCheck %s --check-prefix=PTX

// bf16, 2 x 3 heads, head dim 64, Sq = Sk = ?: the wgmma kernel, planned on 4096 but with
// nothing that holds for some lengths only (no persistent grid; no producer warpgroup,
// which at run-time lengths serves head dim 128).
// q, k, v and O have their sequence after the heads: flat buffers (2 * 3 * 4096 * 64
// elements) addressed with strides of the run-time length; the slots' buffer comes last.
// The lengths are read once (the queries' from O's slot, the keys' from K's), clamped to
// 4096; the key loop runs to the keys' as two loops (Consumer.key_loop): the blocks within
// the keys, up to the last block's start (SK - 1) / 128 * 128, with no tail guard, then
// the last block with it; the epilogue reads the queries' length again (at the top it
// would stay in registers through the loop); the grid is the run-time query blocks.
// CHECK-LABEL: func.func private @attn_k0_attention
// CHECK-SAME: kf.plan = {{{.*}}persistent = array<i64>{{.*}}sizes = [array<i64: 0, 2>, array<i64: 1, 2>, array<i64: 2, 2>, array<i64: 3, 2>]{{.*}}warp_specialized = false, wgmma = true}
// CHECK: gpu.func @attn_k0_attention(%{{.*}}: memref<1572864xbf16>, %{{.*}}: memref<1572864xbf16>, %{{.*}}: memref<1572864xbf16>, %{{.*}}: memref<1572864xbf16>, %[[SIZES:.*]]: memref<4xi32>)
// CHECK-SAME: kf.grid_sizes = ["FloorDiv(k3*1 + 127, 128)", "6", "1"]
// CHECK: %[[SQ:.*]] = arith.minui %{{.*}}, %c4096
// CHECK: %[[SK:.*]] = arith.minui %{{.*}}, %c4096
// CHECK: %[[ONE:.*]] = arith.maxui %[[SK]], %c1
// CHECK: %[[LAST:.*]] = arith.muli
// CHECK: %[[SPLIT:.*]] = arith.maxui %[[LAST]], %c0
// CHECK: scf.for %{{.*}} = %c0 to %[[LAST]] step %c128
// CHECK: nvvm.wgmma.mma_async
// CHECK: scf.for %{{.*}} = %[[SPLIT]] to %[[SK]] step %c128
// CHECK: nvvm.wgmma.mma_async
// CHECK: memref.load %[[SIZES]][%c3]
// CHECK: arith.cmpi ult, %{{.*}}, %{{.*}}
// CHECK: vector.store %{{.*}}, %{{.*}}[%{{.*}}] {alignment = 4 : i64} : memref<1572864xbf16>, vector<2xbf16>
// SM80-LABEL: gpu.func @attn_k0_attention
// SM80-SAME: kf.grid_sizes = ["FloorDiv(k3*1 + 63, 64)", "6", "1"]
// SM80: nvvm.mma.sync
// PTX: gpu.binary @kf_kernels
// PTX-SAME: wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16
func.func private @attn_k0_attention(%q: tensor<2x3x?x64xbf16>, %k: tensor<2x3x?x64xbf16>, %v: tensor<2x3x?x64xbf16>) -> tensor<2x3x?x64xbf16> attributes {kf.kernel = "attention"} {
  %scale = "kf.fill"() {value = 8.0 : f64} : () -> tensor<bf16>
  %kt = "kf.transpose"(%k) {perm = array<i64: 0, 1, 3, 2>} : (tensor<2x3x?x64xbf16>) -> tensor<2x3x64x?xbf16>
  %s = "kf.matmul"(%q, %kt) : (tensor<2x3x?x64xbf16>, tensor<2x3x64x?xbf16>) -> tensor<2x3x?x?xbf16>
  %d = "kf.div"(%s, %scale) : (tensor<2x3x?x?xbf16>, tensor<bf16>) -> tensor<2x3x?x?xbf16>
  %p = "kf.softmax"(%d) {dim = -1 : i64} : (tensor<2x3x?x?xbf16>) -> tensor<2x3x?x?xbf16>
  %o = "kf.matmul"(%p, %v) : (tensor<2x3x?x?xbf16>, tensor<2x3x?x64xbf16>) -> tensor<2x3x?x64xbf16>
  return %o : tensor<2x3x?x64xbf16>
}
func.func @attn(%q: tensor<2x3x?x64xbf16>, %k: tensor<2x3x?x64xbf16>, %v: tensor<2x3x?x64xbf16>) -> tensor<2x3x?x64xbf16> {
  %0 = call @attn_k0_attention(%q, %k, %v) : (tensor<2x3x?x64xbf16>, tensor<2x3x?x64xbf16>, tensor<2x3x?x64xbf16>) -> tensor<2x3x?x64xbf16>
  return %0 : tensor<2x3x?x64xbf16>
}
