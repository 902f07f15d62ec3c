// Invalid inputs of kf-promote-shared, run by test/passes/kf-promote-shared.mlir with --verify-diagnostics.

// The limit the strategy copies from the target is a number of bytes.
module attributes {gpu.container_module} {
  gpu.module @kf_kernels {
    // expected-error @below {{kf-promote-shared: kf.max_shared_bytes is "48K", not a positive number of bytes}}
    gpu.func @named_limit(%x: memref<4x64xf32>) kernel attributes {known_block_size = array<i32: 64, 1, 1>, kf.max_shared_bytes = "48K"} {
      gpu.return
    }
  }
}

// -----

module attributes {gpu.container_module} {
  gpu.module @kf_kernels {
    // expected-error @below {{kf-promote-shared: kf.max_shared_bytes is 0 : i64, not a positive number of bytes}}
    gpu.func @zero_limit(%x: memref<4x64xf32>) kernel attributes {known_block_size = array<i32: 64, 1, 1>, kf.max_shared_bytes = 0 : i64} {
      gpu.return
    }
  }
}
