// Invalid inputs of kf-vectorize, run by test/passes/kf-vectorize.mlir with --verify-diagnostics.
// (Row loops kf-vectorize cannot vectorize are not errors: they stay scalar and say why
// in kf.vectorize_skipped, kf-vectorize.mlir checks those.)

// The lanes the strategy plans for a row loop are a power of two.
module attributes {gpu.container_module} {
  gpu.module @kf_kernels {
    gpu.func @three_lanes(%x: memref<8x1024xf32>, %out: memref<8xf32>) kernel
        attributes {known_block_size = array<i32: 128, 1, 1>} {
      %tid = gpu.thread_id x
      %row = gpu.block_id x
      %n = arith.constant 1024 : index
      %t = arith.constant 128 : index
      %init = arith.constant 1.0 : f32
      // expected-error @below {{kf-vectorize: kf.vector_lanes is 3 : i64: the lanes of a row loop are a power of two (an integer attribute)}}
      %s = scf.for %j = %tid to %n step %t iter_args(%acc = %init) -> (f32) {
        %v = memref.load %x[%row, %j] : memref<8x1024xf32>
        %a = arith.addf %acc, %v : f32
        scf.yield %a : f32
      } {kf.row_loop, kf.vector_lanes = 3 : i64}
      memref.store %s, %out[%row] : memref<8xf32>
      gpu.return
    }
  }
}

// -----

module attributes {gpu.container_module} {
  gpu.module @kf_kernels {
    gpu.func @named_lanes(%x: memref<8x1024xf32>, %out: memref<8xf32>) kernel
        attributes {known_block_size = array<i32: 128, 1, 1>} {
      %tid = gpu.thread_id x
      %row = gpu.block_id x
      %n = arith.constant 1024 : index
      %t = arith.constant 128 : index
      %init = arith.constant 1.0 : f32
      // expected-error @below {{kf-vectorize: kf.vector_lanes is "v4": the lanes of a row loop are a power of two (an integer attribute)}}
      %s = scf.for %j = %tid to %n step %t iter_args(%acc = %init) -> (f32) {
        %v = memref.load %x[%row, %j] : memref<8x1024xf32>
        %a = arith.addf %acc, %v : f32
        scf.yield %a : f32
      } {kf.row_loop, kf.vector_lanes = "v4"}
      memref.store %s, %out[%row] : memref<8xf32>
      gpu.return
    }
  }
}
