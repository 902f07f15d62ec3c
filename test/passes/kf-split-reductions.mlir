// RUN: kf-opt %s --split-input-file --pass-pipeline='builtin.module(kf-split-reductions)' | FileCheck %s
// RUN: kf-opt %s --split-input-file --pass-pipeline='builtin.module(kf-split-reductions, kf-fuse)' | FileCheck %s --check-prefix=FUSED
// Invalid inputs (Inputs/kf-split-reductions-invalid.mlir) and options:
// RUN: kf-opt %S/Inputs/kf-split-reductions-invalid.mlir --split-input-file --verify-diagnostics --pass-pipeline='builtin.module(kf-split-reductions)'
// RUN: not kf-opt %s --split-input-file --pass-pipeline='builtin.module(kf-split-reductions{rows=8192})' 2>&1 | FileCheck %s --check-prefix=BAD-OPTION
// BAD-OPTION: error: pass 'kf-split-reductions' has no option 'rows' (options: column-groups)
// RUN: not kf-opt %s --split-input-file --pass-pipeline='builtin.module(kf-split-reductions{column-groups=-1})' 2>&1 | FileCheck %s --check-prefix=BAD-GROUPS
// BAD-GROUPS: error: kf-split-reductions: column-groups must be 0 (no column blocks) or positive, got -1
// RUN: kf-opt %s --split-input-file --pass-pipeline='builtin.module(kf-split-reductions{column-groups=0})' | FileCheck %s --check-prefix=NO-GROUPS

// fp8's amax over a 4x32x2048x128 tensor (2^25 elements): rows of 8192 (4096 of them),
// then the 4096 partial maxima as one row; each stage is
// a rowwise kernel (a workgroup a row) where the full reduction was one thread's loop.
// The reshape goes under abs(cast(x)): the first stage reads the bf16 x and fuses the
// chain, rebuilt on the rows; the original cast stays for the quantization, abs goes.
// CHECK-LABEL: func.func @amax
// CHECK: %[[C:.*]] = "kf.cast"(%arg0) : (tensor<4x32x2048x128xbf16>) -> tensor<4x32x2048x128xf32>
// CHECK-NOT: "kf.abs"({{.*}}) : (tensor<4x32x2048x128xf32>)
// CHECK: %[[R1:.*]] = "kf.reshape"(%arg0) : (tensor<4x32x2048x128xbf16>) -> tensor<4096x8192xbf16>
// CHECK-NEXT: %[[C1:.*]] = "kf.cast"(%[[R1]]) : (tensor<4096x8192xbf16>) -> tensor<4096x8192xf32>
// CHECK-NEXT: %[[A1:.*]] = "kf.abs"(%[[C1]]) : (tensor<4096x8192xf32>) -> tensor<4096x8192xf32>
// CHECK-NEXT: %[[M1:.*]] = "kf.reduce_max"(%[[A1]]) {dims = array<i64: 1>, keepdim = false} : (tensor<4096x8192xf32>) -> tensor<4096xf32>
// CHECK-NEXT: %[[R2:.*]] = "kf.reshape"(%[[M1]]) : (tensor<4096xf32>) -> tensor<1x4096xf32>
// CHECK-NEXT: %[[M2:.*]] = "kf.reduce_max"(%[[R2]]) {{.*}} -> tensor<1xf32>
// CHECK-NEXT: %[[S:.*]] = "kf.reshape"(%[[M2]]) : (tensor<1xf32>) -> tensor<f32>
// CHECK-NEXT: "kf.mul"(%[[C]], %[[S]])
// CHECK-NOT: dims = array<i64: 0, 1, 2, 3>
// FUSED-LABEL: func.func @amax
// FUSED: call @amax_k{{[0-9]+}}_rowwise({{.*}}) : (tensor<4096x8192xbf16>) -> tensor<4096xf32>
// FUSED: call @amax_k{{[0-9]+}}_rowwise
// FUSED: call @amax_k{{[0-9]+}}_elementwise(%arg0, {{.*}}) : (tensor<4x32x2048x128xbf16>, tensor<f32>) -> tensor<4x32x2048x128xf8E4M3FN>
// FUSED-NOT: _generic
// FUSED: return
func.func @amax(%x: tensor<4x32x2048x128xbf16>) -> tensor<4x32x2048x128xf8E4M3FN> {
  %0 = "kf.cast"(%x) : (tensor<4x32x2048x128xbf16>) -> tensor<4x32x2048x128xf32>
  %1 = "kf.abs"(%0) : (tensor<4x32x2048x128xf32>) -> tensor<4x32x2048x128xf32>
  %2 = "kf.reduce_max"(%1) {dims = array<i64: 0, 1, 2, 3>, keepdim = false} : (tensor<4x32x2048x128xf32>) -> tensor<f32>
  %3 = "kf.mul"(%0, %2) : (tensor<4x32x2048x128xf32>, tensor<f32>) -> tensor<4x32x2048x128xf32>
  %4 = "kf.cast"(%3) : (tensor<4x32x2048x128xf32>) -> tensor<4x32x2048x128xf8E4M3FN>
  return %4 : tensor<4x32x2048x128xf8E4M3FN>
}

// -----

// The amax of a transposed tensor (fp8's V, stored K-major) is its source's: the chain
// is rebuilt on the source's rows, past the transpose and a rank-0 operand; the
// transpose stays only for its other use.
// CHECK-LABEL: func.func @amax_transposed
// CHECK: %[[T:.*]] = "kf.transpose"(%arg0)
// CHECK: %[[R:.*]] = "kf.reshape"(%arg0) : (tensor<64x2048xbf16>) -> tensor<16x8192xbf16>
// CHECK-NEXT: %[[C:.*]] = "kf.cast"(%[[R]]) : (tensor<16x8192xbf16>) -> tensor<16x8192xf32>
// CHECK-NEXT: %[[M:.*]] = "kf.mul"(%[[C]], %arg1) : (tensor<16x8192xf32>, tensor<f32>) -> tensor<16x8192xf32>
// CHECK-NEXT: "kf.abs"(%[[M]]) : (tensor<16x8192xf32>) -> tensor<16x8192xf32>
// CHECK: "kf.cast"(%[[T]])
func.func @amax_transposed(%v: tensor<64x2048xbf16>, %s: tensor<f32>) -> (tensor<f32>, tensor<2048x64xf32>) {
  %t = "kf.transpose"(%v) {perm = array<i64: 1, 0>} : (tensor<64x2048xbf16>) -> tensor<2048x64xbf16>
  %0 = "kf.cast"(%t) : (tensor<2048x64xbf16>) -> tensor<2048x64xf32>
  %1 = "kf.mul"(%0, %s) : (tensor<2048x64xf32>, tensor<f32>) -> tensor<2048x64xf32>
  %2 = "kf.abs"(%1) : (tensor<2048x64xf32>) -> tensor<2048x64xf32>
  %3 = "kf.reduce_max"(%2) {dims = array<i64: 0, 1>, keepdim = false} : (tensor<2048x64xf32>) -> tensor<f32>
  %4 = "kf.cast"(%t) : (tensor<2048x64xbf16>) -> tensor<2048x64xf32>
  return %3, %4 : tensor<f32>, tensor<2048x64xf32>
}

// -----

// Left alone: a full sum of ROW (8192) elements (one generic thread walks it), a row
// reduction over rows of 65536 (the rowwise strategy's bound: its threads share a row).
// CHECK-LABEL: func.func @left_alone
// CHECK-NOT: kf.reshape
// CHECK: "kf.sum"(%arg0) {dims = array<i64: 0, 1>, keepdim = true}
// CHECK: "kf.sum"(%arg1) {dims = array<i64: 1>, keepdim = false}
func.func @left_alone(%a: tensor<64x128xf32>, %b: tensor<4x65536xf32>) -> (tensor<1x1xf32>, tensor<4xf32>) {
  %0 = "kf.sum"(%a) {dims = array<i64: 0, 1>, keepdim = true} : (tensor<64x128xf32>) -> tensor<1x1xf32>
  %1 = "kf.sum"(%b) {dims = array<i64: 1>, keepdim = false} : (tensor<4x65536xf32>) -> tensor<4xf32>
  return %0, %1 : tensor<1x1xf32>, tensor<4xf32>
}

// -----

// A prime count (no row length divides it): rows of 8192 over the first 8 x 8192
// elements, the one-element tail reduced on its own and combined.
// CHECK-LABEL: func.func @prime
// CHECK: %[[M:.*]] = "kf.slice"(%arg0) {dim = 0 : i64, end = 65536 : i64, start = 0 : i64, step = 1 : i64}
// CHECK: %[[R:.*]] = "kf.reshape"(%[[M]]) : (tensor<65536xf32>) -> tensor<8x8192xf32>
// CHECK: "kf.reduce_min"(%[[R]]) {dims = array<i64: 1>, keepdim = false} : (tensor<8x8192xf32>) -> tensor<8xf32>
// CHECK: %[[L:.*]] = "kf.reshape"({{.*}}) : (tensor<1xf32>) -> tensor<f32>
// CHECK: %[[T:.*]] = "kf.slice"(%arg0) {dim = 0 : i64, end = 65537 : i64, start = 65536 : i64, step = 1 : i64}
// CHECK: %[[TM:.*]] = "kf.reduce_min"(%[[T]]) {dims = array<i64: 0>, keepdim = false} : (tensor<1xf32>) -> tensor<f32>
// CHECK: "kf.min"(%[[L]], %[[TM]])
func.func @prime(%c: tensor<65537xf32>) -> tensor<f32> {
  %0 = "kf.reduce_min"(%c) {dims = array<i64: 0>, keepdim = false} : (tensor<65537xf32>) -> tensor<f32>
  return %0 : tensor<f32>
}

// -----

// A sum over a leading dim (the generic strategy: a thread per output element walks the
// dim): blocks of 8192 along it, then the 12 partial sums; the tail of 1699 rows beside.
// CHECK-LABEL: func.func @leading
// CHECK: "kf.slice"(%arg0) {dim = 0 : i64, end = 98304 : i64, start = 0 : i64, step = 1 : i64}
// CHECK: "kf.reshape"({{.*}}) : (tensor<98304x3xf32>) -> tensor<12x8192x3xf32>
// CHECK: "kf.sum"({{.*}}) {dims = array<i64: 1>, keepdim = false} : (tensor<12x8192x3xf32>) -> tensor<12x3xf32>
// CHECK: "kf.sum"({{.*}}) {dims = array<i64: 0>, keepdim = false} : (tensor<12x3xf32>) -> tensor<3xf32>
// CHECK: "kf.slice"(%arg0) {dim = 0 : i64, end = 100003 : i64, start = 98304 : i64, step = 1 : i64}
// CHECK: "kf.sum"({{.*}}) {dims = array<i64: 0>, keepdim = false} : (tensor<1699x3xf32>) -> tensor<3xf32>
// CHECK: "kf.add"
func.func @leading(%a: tensor<100003x3xf32>) -> tensor<3xf32> {
  %0 = "kf.sum"(%a) {dims = array<i64: 0>, keepdim = false} : (tensor<100003x3xf32>) -> tensor<3xf32>
  return %0 : tensor<3xf32>
}

// -----

// mean is the staged sum over n, var two staged sums (mean, then squared deviations);
// bf16 sums into f32 partials (one rounding, at the end). Reduced dims 0 and 2: dim 2
// (the larger) in blocks of 25 (300 x 25 elements a block, within 8192).
// CHECK-LABEL: func.func @mean_var
// CHECK: "kf.reshape"(%arg0) : (tensor<300x5x400xbf16>) -> tensor<300x5x16x25xbf16>
// CHECK: "kf.sum"({{.*}}) {dims = array<i64: 0, 3>, keepdim = false} : (tensor<300x5x16x25xbf16>) -> tensor<5x16xf32>
// CHECK: "kf.sum"({{.*}}) {dims = array<i64: 1>, keepdim = false} : (tensor<5x16xf32>) -> tensor<5xf32>
// CHECK: %[[N:.*]] = "kf.fill"() {value = 1.200000e+05 : f64} : () -> tensor<f32>
// CHECK: %[[MEAN:.*]] = "kf.div"({{.*}}, %[[N]])
// CHECK: "kf.cast"(%[[MEAN]]) : (tensor<5xf32>) -> tensor<5xbf16>
// CHECK: %[[X:.*]] = "kf.cast"(%arg0) : (tensor<300x5x400xbf16>) -> tensor<300x5x400xf32>
// CHECK: %[[D:.*]] = "kf.sub"(%[[X]], {{.*}}) : (tensor<300x5x400xf32>, tensor<1x5x1xf32>)
// CHECK: %[[SQ:.*]] = "kf.mul"(%[[D]], %[[D]])
// CHECK: "kf.reshape"(%[[SQ]]) : (tensor<300x5x400xf32>) -> tensor<300x5x16x25xf32>
// CHECK: "kf.fill"() {value = 1.199990e+05 : f64}
// CHECK: "kf.cast"({{.*}}) : (tensor<5xf32>) -> tensor<5xbf16>
func.func @mean_var(%a: tensor<300x5x400xbf16>) -> (tensor<5xbf16>, tensor<5xbf16>) {
  %0 = "kf.mean"(%a) {dims = array<i64: 0, 2>, keepdim = false} : (tensor<300x5x400xbf16>) -> tensor<5xbf16>
  %1 = "kf.var"(%a) {dims = array<i64: 0, 2>, correction = 1.0, keepdim = false} : (tensor<300x5x400xbf16>) -> tensor<5xbf16>
  return %0, %1 : tensor<5xbf16>, tensor<5xbf16>
}

// -----

// Rows longer than 65536 become blocks of 65536 (then a row of the partials); integer
// sums are staged at 8192 (the rowwise strategy does not take them: generic threads
// walk them), into i64 partials.
// CHECK-LABEL: func.func @rows
// CHECK: "kf.reshape"(%arg0) : (tensor<2x131072xf32>) -> tensor<2x2x65536xf32>
// CHECK: "kf.sum"({{.*}}) {dims = array<i64: 2>, keepdim = false} : (tensor<2x2x65536xf32>) -> tensor<2x2xf32>
// CHECK: "kf.sum"({{.*}}) {dims = array<i64: 1>, keepdim = false} : (tensor<2x2xf32>) -> tensor<2xf32>
// CHECK: "kf.reshape"(%arg1) : (tensor<3x100000xi32>) -> tensor<3x16x6250xi32>
// CHECK: "kf.sum"({{.*}}) {dims = array<i64: 2>, keepdim = false} : (tensor<3x16x6250xi32>) -> tensor<3x16xi64>
// CHECK: "kf.sum"({{.*}}) {dims = array<i64: 1>, keepdim = false} : (tensor<3x16xi64>) -> tensor<3xi64>
func.func @rows(%b: tensor<2x131072xf32>, %c: tensor<3x100000xi32>) -> (tensor<2xf32>, tensor<3xi64>) {
  %0 = "kf.sum"(%b) {dims = array<i64: 1>, keepdim = false} : (tensor<2x131072xf32>) -> tensor<2xf32>
  %1 = "kf.sum"(%c) {dims = array<i64: 1>, keepdim = false} : (tensor<3x100000xi32>) -> tensor<3xi64>
  return %0, %1 : tensor<2xf32>, tensor<3xi64>
}

// -----

// A sum with keepdim over 512x512: rows of 8192 (32 of them), then one row of the 32
// partial sums, reshaped to the kept dims.
// CHECK-LABEL: func.func @sum_keepdim
// CHECK: "kf.reshape"(%arg0) : (tensor<512x512xf32>) -> tensor<32x8192xf32>
// CHECK: "kf.sum"({{.*}}) {dims = array<i64: 1>, keepdim = false} : (tensor<32x8192xf32>) -> tensor<32xf32>
// CHECK: "kf.reshape"({{.*}}) : (tensor<32xf32>) -> tensor<1x32xf32>
// CHECK: "kf.sum"({{.*}}) -> tensor<1xf32>
// CHECK: "kf.reshape"({{.*}}) : (tensor<1xf32>) -> tensor<1x1xf32>
func.func @sum_keepdim(%a: tensor<512x512xf32>) -> tensor<1x1xf32> {
  %0 = "kf.sum"(%a) {dims = array<i64: 0, 1>, keepdim = true} : (tensor<512x512xf32>) -> tensor<1x1xf32>
  return %0 : tensor<1x1xf32>
}

// -----

// argmax along 70001 elements: each block's maximum and argmax, the argmax of the 8
// blocks' maxima, the chosen block's own argmax gathered and offset by 8192 per block;
// the tail's index (offset by 65536) where its maximum is larger or a first NaN.
// CHECK-LABEL: func.func @argmax
// CHECK: %[[B:.*]] = "kf.reshape"({{.*}}) : (tensor<65536x2xf32>) -> tensor<8x8192x2xf32>
// CHECK: %[[BM:.*]] = "kf.reduce_max"(%[[B]]) {dims = array<i64: 1>, keepdim = false} : (tensor<8x8192x2xf32>) -> tensor<8x2xf32>
// CHECK: %[[BA:.*]] = "kf.argmax"(%[[B]]) {dim = 1 : i64, keepdim = false} : (tensor<8x8192x2xf32>) -> tensor<8x2xi64>
// CHECK: %[[W:.*]] = "kf.argmax"(%[[BM]]) {dim = 0 : i64, keepdim = false} : (tensor<8x2xf32>) -> tensor<2xi64>
// CHECK: %[[W1:.*]] = "kf.reshape"(%[[W]]) : (tensor<2xi64>) -> tensor<1x2xi64>
// CHECK: "kf.gather"(%[[BA]], %[[W1]]) {dim = 0 : i64}
// CHECK: "kf.fill"() {value = 8.192000e+03 : f64} : () -> tensor<i64>
// CHECK: "kf.slice"(%arg0) {dim = 0 : i64, end = 70001 : i64, start = 65536 : i64, step = 1 : i64}
// CHECK: "kf.cmp"({{.*}}) {predicate = "gt"}
// CHECK: "kf.fill"() {value = 6.553600e+04 : f64} : () -> tensor<i64>
// CHECK: %[[I:.*]] = "kf.select"
// CHECK-NOT: "kf.select"
// CHECK: "kf.reshape"(%[[I]]) : (tensor<2xi64>) -> tensor<1x2xi64>
func.func @argmax(%a: tensor<70001x2xf32>) -> tensor<1x2xi64> {
  %0 = "kf.argmax"(%a) {dim = 0 : i64, keepdim = true} : (tensor<70001x2xf32>) -> tensor<1x2xi64>
  return %0 : tensor<1x2xi64>
}

// -----

// A column reduction (a norm's bias and weight gradients: sums over the rows) of 8192
// rows: blocks of 32 rows (8192 / 256 groups), each block's sums (f32), then the sums of
// the 256 partial results. kf-fuse puts the partial sums in the row kernel that reads the
// same rows (its outputs beside dx), and the last stage reads [256, 64], not the rows.
// CHECK-LABEL: func.func @column
// CHECK: %[[B:.*]] = "kf.reshape"(%arg0) : (tensor<8192x64xbf16>) -> tensor<256x32x64xbf16>
// CHECK-NEXT: %[[P:.*]] = "kf.sum"(%[[B]]) {dims = array<i64: 1>, keepdim = false} : (tensor<256x32x64xbf16>) -> tensor<256x64xf32>
// CHECK-NEXT: %[[S:.*]] = "kf.sum"(%[[P]]) {dims = array<i64: 0>, keepdim = false} : (tensor<256x64xf32>) -> tensor<64xf32>
// CHECK-NEXT: "kf.cast"(%[[S]]) : (tensor<64xf32>) -> tensor<64xbf16>
// CHECK: "kf.reshape"({{.*}}) : (tensor<8192x64xbf16>) -> tensor<256x32x64xbf16>
// CHECK: "kf.sum"({{.*}}) {dims = array<i64: 1>, keepdim = false} : (tensor<256x32x64xbf16>) -> tensor<256x64xf32>
// NO-GROUPS-LABEL: func.func @column
// NO-GROUPS-NOT: kf.reshape
// FUSED-LABEL: func.func @column
// FUSED: %[[K:.*]]:3 = call @column_k0_rowwise(%arg0) : (tensor<8192x64xbf16>) -> (tensor<8192x64xbf16>, tensor<256x64xf32>, tensor<256x64xf32>)
// FUSED-NEXT: %[[C:.*]]:2 = call @column_k1_generic(%[[K]]#1, %[[K]]#2) : (tensor<256x64xf32>, tensor<256x64xf32>) -> (tensor<64xbf16>, tensor<64xbf16>)
// FUSED-NOT: call
// FUSED: return
func.func @column(%x: tensor<8192x64xbf16>) -> (tensor<8192x64xbf16>, tensor<64xbf16>, tensor<64xbf16>) {
  %0 = "kf.mean"(%x) {dims = array<i64: 1>, keepdim = true} : (tensor<8192x64xbf16>) -> tensor<8192x1xbf16>
  %1 = "kf.sub"(%x, %0) : (tensor<8192x64xbf16>, tensor<8192x1xbf16>) -> tensor<8192x64xbf16>
  %2 = "kf.sum"(%x) {dims = array<i64: 0>, keepdim = false} : (tensor<8192x64xbf16>) -> tensor<64xbf16>
  %3 = "kf.mul"(%x, %1) : (tensor<8192x64xbf16>, tensor<8192x64xbf16>) -> tensor<8192x64xbf16>
  %4 = "kf.sum"(%3) {dims = array<i64: 0>, keepdim = false} : (tensor<8192x64xbf16>) -> tensor<64xbf16>
  return %1, %2, %4 : tensor<8192x64xbf16>, tensor<64xbf16>, tensor<64xbf16>
}

// -----

// Left whole: columns of 511 rows (blocks of 2 rows at least: 512 rows), of a prime
// count of rows (blocks of one row would be partial sums as large as the tensor), of
// integers, and columns with no row kernel over the same rows to compute the blocks'
// sums beside its own (bias + GELU's bias gradient: one generic kernel with the chain).
// CHECK-LABEL: func.func @column_left_alone
// CHECK-NOT: kf.reshape
// CHECK: return
func.func @column_left_alone(%a: tensor<511x8xf32>, %b: tensor<8191x8xf32>, %c: tensor<8192x8xi32>, %d: tensor<8192x8xf32>) -> (tensor<511x8xf32>, tensor<8191x8xf32>, tensor<8xf32>, tensor<8xf32>, tensor<8xi32>, tensor<8xf32>) {
  %sa = "kf.softmax"(%a) {dim = 1 : i64} : (tensor<511x8xf32>) -> tensor<511x8xf32>
  %sb = "kf.softmax"(%b) {dim = 1 : i64} : (tensor<8191x8xf32>) -> tensor<8191x8xf32>
  %0 = "kf.sum"(%a) {dims = array<i64: 0>, keepdim = false} : (tensor<511x8xf32>) -> tensor<8xf32>
  %1 = "kf.sum"(%b) {dims = array<i64: 0>, keepdim = false} : (tensor<8191x8xf32>) -> tensor<8xf32>
  %2 = "kf.sum"(%c) {dims = array<i64: 0>, keepdim = false} : (tensor<8192x8xi32>) -> tensor<8xi32>
  %3 = "kf.sum"(%d) {dims = array<i64: 0>, keepdim = false} : (tensor<8192x8xf32>) -> tensor<8xf32>
  return %sa, %sb, %0, %1, %2, %3 : tensor<511x8xf32>, tensor<8191x8xf32>, tensor<8xf32>, tensor<8xf32>, tensor<8xi32>, tensor<8xf32>
}
