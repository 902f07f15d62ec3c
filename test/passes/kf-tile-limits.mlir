// RUN: kf-opt %s --pass-pipeline='builtin.module(kf-tile{target=spirv})' | FileCheck %s --check-prefix=DEFAULT
// RUN: kf-opt %s --pass-pipeline='builtin.module(kf-tile{target=spirv limits=shared=32768,invocations=1024,size=1024x1024x1024,subgroup=8,ops=basic+vote+arithmetic+ballot+shuffle+shuffle_relative+quad,float=preserve16+preserve32+preserve64+rte16+rte32+rte64,loops=65535})' | FileCheck %s --check-prefix=LAVAPIPE
// RUN: kf-opt %s --pass-pipeline='builtin.module(kf-tile{target=spirv limits=shared=49152,invocations=1024,size=1024x1024x64,subgroup=32,ops=basic+vote+arithmetic+ballot+shuffle+shuffle_relative+clustered+quad,float=preserve16+preserve32+preserve64+denorm16+denorm32+denorm64+rte16+rte32+rte64,coopmat=16x16x16:f16:f16:f32:f32+16x16x16:f16:f16:f16:f16+16x8x16:f16:f16:f32:f32+16x8x16:f16:f16:f16:f16+16x8x8:f16:f16:f32:f32+16x8x8:f16:f16:f16:f16+16x16x16:bf16:bf16:f32:f32})' | FileCheck %s --check-prefix=NVIDIA
// RUN: not kf-opt %s --pass-pipeline='builtin.module(kf-tile{target=spirv limits=shared=lots})' 2>&1 | FileCheck %s --check-prefix=BAD

// SPIR-V plans from the device's limits (kf.runtime.abi.DeviceLimits: the limits of
// lavapipe and of NVIDIA's driver on an H200, test/python/devices/), against the
// defaults (16 KiB, 256 invocations, no subgroup operations).
// BAD: kf-tile: device limits 'shared=lots' must give exactly

// The seed's layer norm over rows of 8192 f32 (32 KiB): cached in workgroup memory
// only where 48 KiB hold it beside the reduction's scratch; reduced with subgroup
// shuffles where a subgroup's partials suffice for 256 threads (32 lanes, not 8).
// DEFAULT-LABEL: func.func private @ln
// DEFAULT-SAME: cache_row = false{{.*}}reduction = "tree"{{.*}}threads = 256
// LAVAPIPE-LABEL: func.func private @ln
// LAVAPIPE-SAME: cache_row = false{{.*}}reduction = "tree"{{.*}}threads = 256
// NVIDIA-LABEL: func.func private @ln
// NVIDIA-SAME: cache_row = true, cached_inputs = array<i64: 0>{{.*}}reduction = "shuffle"{{.*}}scratch_bytes = 256 : i64{{.*}}threads = 256
func.func private @ln(%x: tensor<16x8192xf32>, %w: tensor<8192xf32>, %b: tensor<8192xf32>) -> tensor<16x8192xf32> attributes {kf.kernel = "rowwise"} {
  %eps = "kf.fill"() {value = 1.0e-05 : f64} : () -> tensor<f32>
  %mean = "kf.mean"(%x) {dims = array<i64: 1>, keepdim = true} : (tensor<16x8192xf32>) -> tensor<16x1xf32>
  %var = "kf.var"(%x) {correction = 1.0 : f64, dims = array<i64: 1>, keepdim = true} : (tensor<16x8192xf32>) -> tensor<16x1xf32>
  %d = "kf.sub"(%x, %mean) : (tensor<16x8192xf32>, tensor<16x1xf32>) -> tensor<16x8192xf32>
  %ve = "kf.add"(%var, %eps) : (tensor<16x1xf32>, tensor<f32>) -> tensor<16x1xf32>
  %s = "kf.sqrt"(%ve) : (tensor<16x1xf32>) -> tensor<16x1xf32>
  %n = "kf.div"(%d, %s) : (tensor<16x8192xf32>, tensor<16x1xf32>) -> tensor<16x8192xf32>
  %m = "kf.mul"(%w, %n) : (tensor<8192xf32>, tensor<16x8192xf32>) -> tensor<16x8192xf32>
  %o = "kf.add"(%m, %b) : (tensor<16x8192xf32>, tensor<8192xf32>) -> tensor<16x8192xf32>
  return %o : tensor<16x8192xf32>
}

// Attention at head dim 128: the largest tiles whose Q, K/V, P and row buffers fit.
// DEFAULT-LABEL: func.func private @attn
// DEFAULT-SAME: block_m = 16 : i64, block_n = 8 : i64
// LAVAPIPE-LABEL: func.func private @attn
// LAVAPIPE-SAME: block_m = 32 : i64, block_n = 16 : i64
// NVIDIA-LABEL: func.func private @attn
// NVIDIA-SAME: block_m = 32 : i64, block_n = 32 : i64{{.*}}shared_bytes = 37760
func.func private @attn(%q: tensor<1x2x130x128xf32>, %k: tensor<1x2x130x128xf32>, %v: tensor<1x2x130x128xf32>) -> tensor<1x2x130x128xf32> attributes {kf.kernel = "attention"} {
  %c = "kf.fill"() {value = 11.313708498984761 : f64} : () -> tensor<f32>
  %kt = "kf.transpose"(%k) {perm = array<i64: 0, 1, 3, 2>} : (tensor<1x2x130x128xf32>) -> tensor<1x2x128x130xf32>
  %s = "kf.matmul"(%q, %kt) : (tensor<1x2x130x128xf32>, tensor<1x2x128x130xf32>) -> tensor<1x2x130x130xf32>
  %d = "kf.div"(%s, %c) : (tensor<1x2x130x130xf32>, tensor<f32>) -> tensor<1x2x130x130xf32>
  %p = "kf.softmax"(%d) {dim = -1 : i64} : (tensor<1x2x130x130xf32>) -> tensor<1x2x130x130xf32>
  %o = "kf.matmul"(%p, %v) : (tensor<1x2x130x130xf32>, tensor<1x2x130x128xf32>) -> tensor<1x2x130x128xf32>
  return %o : tensor<1x2x130x128xf32>
}

// An f16 matmul: cooperative matrices (16x16x16, f32 accumulators) where the device lists
// them (NVIDIA's coopmat= entries), the SIMT kernel elsewhere.
// DEFAULT-LABEL: func.func private @mm16
// DEFAULT-SAME: thread_m = 4
// LAVAPIPE-LABEL: func.func private @mm16
// LAVAPIPE-SAME: thread_m = 4
// NVIDIA-LABEL: func.func private @mm16
// NVIDIA-SAME: coopmat = true, coopmat_shape = array<i64: 16, 16, 16>{{.*}}threads = 128
func.func private @mm16(%a: tensor<100x70xf16>, %b: tensor<70x50xf16>) -> tensor<100x50xf16> attributes {kf.kernel = "matmul"} {
  %o = "kf.matmul"(%a, %b) : (tensor<100x70xf16>, tensor<70x50xf16>) -> tensor<100x50xf16>
  return %o : tensor<100x50xf16>
}
