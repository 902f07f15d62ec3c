// RUN: kf-opt %s --split-input-file --pass-pipeline='builtin.module(kf-recognize-moe)' | FileCheck %s
// Invalid inputs (Inputs/kf-recognize-moe-invalid.mlir) and options:
// RUN: kf-opt %S/Inputs/kf-recognize-moe-invalid.mlir --split-input-file --verify-diagnostics --pass-pipeline='builtin.module(kf-recognize-moe)'
// RUN: not kf-opt %s --split-input-file --pass-pipeline='builtin.module(kf-recognize-moe{experts=3})' 2>&1 | FileCheck %s --check-prefix=BAD-OPTION
// BAD-OPTION: error: pass 'kf-recognize-moe' has no option 'experts' (options: none)

// examples/moe.py after kf-canonicalize (top-2 of 3 experts, 5 tokens): the routing
// weights built from `idx == arange(E)`, and per expert e a slice of the stacked
// weights, GELU between, weighted by combine[..., e]. It becomes route -> grouped GEMM
// (gathering x's rows) -> grouped GEMM -> combine over N = 5 * 2 packed rows.
// CHECK-LABEL: func.func private @moe_top2_moe0_route
// CHECK-SAME: (%arg0: tensor<1x5x2xi64>) -> (tensor<5xi32>, tensor<10xi32>, tensor<10xi32>)
// CHECK-SAME: kf.fused_lines = ["moe.py:32", "moe.py:33", "moe.py:34", "moe.py:35"], kf.kernel = "moe_route"
// CHECK-SAME: kf.moe = {experts = 3 : i64, rows = 10 : i64, tokens = 5 : i64, top_k = 2 : i64}
// The packed row of a slot: the rank of (expert, slot) among all slots (a stable sort).
// CHECK: "kf.cmp"({{.*}}) {predicate = "lt"} : (tensor<1x10xi64>, tensor<10x1xi64>) -> tensor<10x10xi1>
// CHECK: "kf.scatter_add"
// CHECK-LABEL: func.func private @moe_top2_moe0_up
// CHECK-SAME: (%arg0: tensor<1x5x8xf32>, %arg1: tensor<3x8x12xf32>, %arg2: tensor<5xi32>, %arg3: tensor<10xi32>) -> tensor<10x12xf32>
// CHECK-SAME: kf.kernel = "moe_gemm"
// CHECK-SAME: kf.moe = {activation = "gelu", approximate = "tanh", {{.*}}gather = true
// CHECK: "kf.index_select"(%{{.*}}, %arg3) {dim = 0 : i64} : (tensor<5x8xf32>, tensor<10xi32>) -> tensor<10x8xf32>
// CHECK: "kf.index_select"(%arg1, %{{.*}}) {dim = 0 : i64} : (tensor<3x8x12xf32>, tensor<10xi64>) -> tensor<10x8x12xf32>
// CHECK: "kf.matmul"({{.*}}) : (tensor<10x1x8xf32>, tensor<10x8x12xf32>) -> tensor<10x1x12xf32>
// CHECK: "kf.gelu"({{.*}}) {approximate = "tanh"} : (tensor<10x12xf32>)
// CHECK-LABEL: func.func private @moe_top2_moe0_down
// CHECK-SAME: (%arg0: tensor<10x12xf32>, %arg1: tensor<3x12x8xf32>, %arg2: tensor<5xi32>) -> tensor<10x8xf32>
// CHECK-SAME: kf.kernel = "moe_gemm"
// CHECK-SAME: gather = false
// CHECK: "kf.matmul"({{.*}}) : (tensor<10x1x12xf32>, tensor<10x12x8xf32>) -> tensor<10x1x8xf32>
// CHECK-LABEL: func.func private @moe_top2_moe0_combine
// CHECK-SAME: (%arg0: tensor<10x8xf32>, %arg1: tensor<10xi32>, %arg2: tensor<1x5x2xf32>, %arg3: tensor<1x5x2xi64>) -> tensor<1x5x8xf32>
// CHECK-SAME: kf.kernel = "moe_combine"
// CHECK: "kf.sum"({{.*}}) {dims = array<i64: 2>, keepdim = false} : (tensor<1x5x2x8xf32>) -> tensor<1x5x8xf32>
// The schedule: four calls, no dense matmul left.
// CHECK-LABEL: func.func @moe_top2
// CHECK-NOT: kf.matmul
// CHECK: %[[R:.*]]:3 = call @moe_top2_moe0_route(%arg1)
// CHECK-NEXT: %[[H:.*]] = call @moe_top2_moe0_up(%arg0, %arg3, %[[R]]#0, %[[R]]#1)
// CHECK-NEXT: %[[Y:.*]] = call @moe_top2_moe0_down(%[[H]], %arg4, %[[R]]#0)
// CHECK-NEXT: %[[O:.*]] = call @moe_top2_moe0_combine(%[[Y]], %[[R]]#2, %arg2, %arg1)
// CHECK-NEXT: return %[[O]]
func.func @moe_top2(%x: tensor<1x5x8xf32>, %idx: tensor<1x5x2xi64>, %wt: tensor<1x5x2xf32>, %w_in: tensor<3x8x12xf32>, %w_out: tensor<3x12x8xf32>) -> tensor<1x5x8xf32> {
  %experts = "kf.constant"() {value = dense<[0, 1, 2]> : tensor<3xi64>} : () -> tensor<3xi64> loc("moe.py":29:5)
  %i0 = "kf.slice"(%idx) {dim = 2 : i64, end = 1 : i64, start = 0 : i64, step = 1 : i64} : (tensor<1x5x2xi64>) -> tensor<1x5x1xi64> loc("moe.py":32:9)
  %w0 = "kf.slice"(%wt) {dim = 2 : i64, end = 1 : i64, start = 0 : i64, step = 1 : i64} : (tensor<1x5x2xf32>) -> tensor<1x5x1xf32> loc("moe.py":33:9)
  %eq0 = "kf.cmp"(%i0, %experts) {predicate = "eq"} : (tensor<1x5x1xi64>, tensor<3xi64>) -> tensor<1x5x3xi1> loc("moe.py":34:9)
  %routed0 = "kf.cast"(%eq0) : (tensor<1x5x3xi1>) -> tensor<1x5x3xf32> loc("moe.py":34:9)
  %c0 = "kf.mul"(%routed0, %w0) : (tensor<1x5x3xf32>, tensor<1x5x1xf32>) -> tensor<1x5x3xf32> loc("moe.py":35:9)
  %i1 = "kf.slice"(%idx) {dim = 2 : i64, end = 2 : i64, start = 1 : i64, step = 1 : i64} : (tensor<1x5x2xi64>) -> tensor<1x5x1xi64> loc("moe.py":32:9)
  %w1 = "kf.slice"(%wt) {dim = 2 : i64, end = 2 : i64, start = 1 : i64, step = 1 : i64} : (tensor<1x5x2xf32>) -> tensor<1x5x1xf32> loc("moe.py":33:9)
  %eq1 = "kf.cmp"(%i1, %experts) {predicate = "eq"} : (tensor<1x5x1xi64>, tensor<3xi64>) -> tensor<1x5x3xi1> loc("moe.py":34:9)
  %routed1 = "kf.cast"(%eq1) : (tensor<1x5x3xi1>) -> tensor<1x5x3xf32> loc("moe.py":34:9)
  %c1 = "kf.mul"(%routed1, %w1) : (tensor<1x5x3xf32>, tensor<1x5x1xf32>) -> tensor<1x5x3xf32> loc("moe.py":35:9)
  %cs1 = "kf.add"(%c0, %c1) : (tensor<1x5x3xf32>, tensor<1x5x3xf32>) -> tensor<1x5x3xf32> loc("moe.py":35:9)
  %wi0s = "kf.slice"(%w_in) {dim = 0 : i64, end = 1 : i64, start = 0 : i64, step = 1 : i64} : (tensor<3x8x12xf32>) -> tensor<1x8x12xf32> loc("moe.py":41:9)
  %wi0 = "kf.reshape"(%wi0s) : (tensor<1x8x12xf32>) -> tensor<8x12xf32> loc("moe.py":41:9)
  %u0 = "kf.matmul"(%x, %wi0) : (tensor<1x5x8xf32>, tensor<8x12xf32>) -> tensor<1x5x12xf32> loc("moe.py":41:9)
  %h0 = "kf.gelu"(%u0) {approximate = "tanh"} : (tensor<1x5x12xf32>) -> tensor<1x5x12xf32> loc("moe.py":41:9)
  %ce0 = "kf.slice"(%cs1) {dim = 2 : i64, end = 1 : i64, start = 0 : i64, step = 1 : i64} : (tensor<1x5x3xf32>) -> tensor<1x5x1xf32> loc("moe.py":42:9)
  %wo0s = "kf.slice"(%w_out) {dim = 0 : i64, end = 1 : i64, start = 0 : i64, step = 1 : i64} : (tensor<3x12x8xf32>) -> tensor<1x12x8xf32> loc("moe.py":42:9)
  %wo0 = "kf.reshape"(%wo0s) : (tensor<1x12x8xf32>) -> tensor<12x8xf32> loc("moe.py":42:9)
  %y0 = "kf.matmul"(%h0, %wo0) : (tensor<1x5x12xf32>, tensor<12x8xf32>) -> tensor<1x5x8xf32> loc("moe.py":42:9)
  %t0 = "kf.mul"(%ce0, %y0) : (tensor<1x5x1xf32>, tensor<1x5x8xf32>) -> tensor<1x5x8xf32> loc("moe.py":42:9)
  %wi1s = "kf.slice"(%w_in) {dim = 0 : i64, end = 2 : i64, start = 1 : i64, step = 1 : i64} : (tensor<3x8x12xf32>) -> tensor<1x8x12xf32> loc("moe.py":41:9)
  %wi1 = "kf.reshape"(%wi1s) : (tensor<1x8x12xf32>) -> tensor<8x12xf32> loc("moe.py":41:9)
  %u1 = "kf.matmul"(%x, %wi1) : (tensor<1x5x8xf32>, tensor<8x12xf32>) -> tensor<1x5x12xf32> loc("moe.py":41:9)
  %h1 = "kf.gelu"(%u1) {approximate = "tanh"} : (tensor<1x5x12xf32>) -> tensor<1x5x12xf32> loc("moe.py":41:9)
  %ce1 = "kf.slice"(%cs1) {dim = 2 : i64, end = 2 : i64, start = 1 : i64, step = 1 : i64} : (tensor<1x5x3xf32>) -> tensor<1x5x1xf32> loc("moe.py":42:9)
  %wo1s = "kf.slice"(%w_out) {dim = 0 : i64, end = 2 : i64, start = 1 : i64, step = 1 : i64} : (tensor<3x12x8xf32>) -> tensor<1x12x8xf32> loc("moe.py":42:9)
  %wo1 = "kf.reshape"(%wo1s) : (tensor<1x12x8xf32>) -> tensor<12x8xf32> loc("moe.py":42:9)
  %y1 = "kf.matmul"(%h1, %wo1) : (tensor<1x5x12xf32>, tensor<12x8xf32>) -> tensor<1x5x8xf32> loc("moe.py":42:9)
  %t1 = "kf.mul"(%ce1, %y1) : (tensor<1x5x1xf32>, tensor<1x5x8xf32>) -> tensor<1x5x8xf32> loc("moe.py":42:9)
  %o1 = "kf.add"(%t0, %t1) : (tensor<1x5x8xf32>, tensor<1x5x8xf32>) -> tensor<1x5x8xf32> loc("moe.py":42:9)
  %wi2s = "kf.slice"(%w_in) {dim = 0 : i64, end = 3 : i64, start = 2 : i64, step = 1 : i64} : (tensor<3x8x12xf32>) -> tensor<1x8x12xf32> loc("moe.py":41:9)
  %wi2 = "kf.reshape"(%wi2s) : (tensor<1x8x12xf32>) -> tensor<8x12xf32> loc("moe.py":41:9)
  %u2 = "kf.matmul"(%x, %wi2) : (tensor<1x5x8xf32>, tensor<8x12xf32>) -> tensor<1x5x12xf32> loc("moe.py":41:9)
  %h2 = "kf.gelu"(%u2) {approximate = "tanh"} : (tensor<1x5x12xf32>) -> tensor<1x5x12xf32> loc("moe.py":41:9)
  %ce2 = "kf.slice"(%cs1) {dim = 2 : i64, end = 3 : i64, start = 2 : i64, step = 1 : i64} : (tensor<1x5x3xf32>) -> tensor<1x5x1xf32> loc("moe.py":42:9)
  %wo2s = "kf.slice"(%w_out) {dim = 0 : i64, end = 3 : i64, start = 2 : i64, step = 1 : i64} : (tensor<3x12x8xf32>) -> tensor<1x12x8xf32> loc("moe.py":42:9)
  %wo2 = "kf.reshape"(%wo2s) : (tensor<1x12x8xf32>) -> tensor<12x8xf32> loc("moe.py":42:9)
  %y2 = "kf.matmul"(%h2, %wo2) : (tensor<1x5x12xf32>, tensor<12x8xf32>) -> tensor<1x5x8xf32> loc("moe.py":42:9)
  %t2 = "kf.mul"(%ce2, %y2) : (tensor<1x5x1xf32>, tensor<1x5x8xf32>) -> tensor<1x5x8xf32> loc("moe.py":42:9)
  %o2 = "kf.add"(%o1, %t2) : (tensor<1x5x8xf32>, tensor<1x5x8xf32>) -> tensor<1x5x8xf32> loc("moe.py":42:9)
  return %o2 : tensor<1x5x8xf32>
}
// -----

// Top-1 (the combine is one routed * weight term, no add), bf16, 2 experts, 7 tokens.
// CHECK-LABEL: func.func private @moe_top1_bf16_moe0_route
// CHECK-SAME: (%arg0: tensor<1x7x1xi64>) -> (tensor<4xi32>, tensor<7xi32>, tensor<7xi32>)
// CHECK-LABEL: func.func private @moe_top1_bf16_moe0_up
// CHECK-SAME: -> tensor<7x12xbf16>
// CHECK-LABEL: func.func @moe_top1_bf16
// CHECK-NOT: kf.matmul
// CHECK: call @moe_top1_bf16_moe0_route
// CHECK-NEXT: call @moe_top1_bf16_moe0_up
// CHECK-NEXT: call @moe_top1_bf16_moe0_down
// CHECK-NEXT: call @moe_top1_bf16_moe0_combine
func.func @moe_top1_bf16(%x: tensor<1x7x8xbf16>, %idx: tensor<1x7x1xi64>, %wt: tensor<1x7x1xbf16>, %w_in: tensor<2x8x12xbf16>, %w_out: tensor<2x12x8xbf16>) -> tensor<1x7x8xbf16> {
  %experts = "kf.constant"() {value = dense<[0, 1]> : tensor<2xi64>} : () -> tensor<2xi64> loc("moe.py":29:5)
  %i0 = "kf.slice"(%idx) {dim = 2 : i64, end = 1 : i64, start = 0 : i64, step = 1 : i64} : (tensor<1x7x1xi64>) -> tensor<1x7x1xi64> loc("moe.py":32:9)
  %w0 = "kf.slice"(%wt) {dim = 2 : i64, end = 1 : i64, start = 0 : i64, step = 1 : i64} : (tensor<1x7x1xbf16>) -> tensor<1x7x1xbf16> loc("moe.py":33:9)
  %eq0 = "kf.cmp"(%i0, %experts) {predicate = "eq"} : (tensor<1x7x1xi64>, tensor<2xi64>) -> tensor<1x7x2xi1> loc("moe.py":34:9)
  %routed0 = "kf.cast"(%eq0) : (tensor<1x7x2xi1>) -> tensor<1x7x2xbf16> loc("moe.py":34:9)
  %c0 = "kf.mul"(%routed0, %w0) : (tensor<1x7x2xbf16>, tensor<1x7x1xbf16>) -> tensor<1x7x2xbf16> loc("moe.py":35:9)
  %wi0s = "kf.slice"(%w_in) {dim = 0 : i64, end = 1 : i64, start = 0 : i64, step = 1 : i64} : (tensor<2x8x12xbf16>) -> tensor<1x8x12xbf16> loc("moe.py":41:9)
  %wi0 = "kf.reshape"(%wi0s) : (tensor<1x8x12xbf16>) -> tensor<8x12xbf16> loc("moe.py":41:9)
  %u0 = "kf.matmul"(%x, %wi0) : (tensor<1x7x8xbf16>, tensor<8x12xbf16>) -> tensor<1x7x12xbf16> loc("moe.py":41:9)
  %h0 = "kf.gelu"(%u0) {approximate = "tanh"} : (tensor<1x7x12xbf16>) -> tensor<1x7x12xbf16> loc("moe.py":41:9)
  %ce0 = "kf.slice"(%c0) {dim = 2 : i64, end = 1 : i64, start = 0 : i64, step = 1 : i64} : (tensor<1x7x2xbf16>) -> tensor<1x7x1xbf16> loc("moe.py":42:9)
  %wo0s = "kf.slice"(%w_out) {dim = 0 : i64, end = 1 : i64, start = 0 : i64, step = 1 : i64} : (tensor<2x12x8xbf16>) -> tensor<1x12x8xbf16> loc("moe.py":42:9)
  %wo0 = "kf.reshape"(%wo0s) : (tensor<1x12x8xbf16>) -> tensor<12x8xbf16> loc("moe.py":42:9)
  %y0 = "kf.matmul"(%h0, %wo0) : (tensor<1x7x12xbf16>, tensor<12x8xbf16>) -> tensor<1x7x8xbf16> loc("moe.py":42:9)
  %t0 = "kf.mul"(%ce0, %y0) : (tensor<1x7x1xbf16>, tensor<1x7x8xbf16>) -> tensor<1x7x8xbf16> loc("moe.py":42:9)
  %wi1s = "kf.slice"(%w_in) {dim = 0 : i64, end = 2 : i64, start = 1 : i64, step = 1 : i64} : (tensor<2x8x12xbf16>) -> tensor<1x8x12xbf16> loc("moe.py":41:9)
  %wi1 = "kf.reshape"(%wi1s) : (tensor<1x8x12xbf16>) -> tensor<8x12xbf16> loc("moe.py":41:9)
  %u1 = "kf.matmul"(%x, %wi1) : (tensor<1x7x8xbf16>, tensor<8x12xbf16>) -> tensor<1x7x12xbf16> loc("moe.py":41:9)
  %h1 = "kf.gelu"(%u1) {approximate = "tanh"} : (tensor<1x7x12xbf16>) -> tensor<1x7x12xbf16> loc("moe.py":41:9)
  %ce1 = "kf.slice"(%c0) {dim = 2 : i64, end = 2 : i64, start = 1 : i64, step = 1 : i64} : (tensor<1x7x2xbf16>) -> tensor<1x7x1xbf16> loc("moe.py":42:9)
  %wo1s = "kf.slice"(%w_out) {dim = 0 : i64, end = 2 : i64, start = 1 : i64, step = 1 : i64} : (tensor<2x12x8xbf16>) -> tensor<1x12x8xbf16> loc("moe.py":42:9)
  %wo1 = "kf.reshape"(%wo1s) : (tensor<1x12x8xbf16>) -> tensor<12x8xbf16> loc("moe.py":42:9)
  %y1 = "kf.matmul"(%h1, %wo1) : (tensor<1x7x12xbf16>, tensor<12x8xbf16>) -> tensor<1x7x8xbf16> loc("moe.py":42:9)
  %t1 = "kf.mul"(%ce1, %y1) : (tensor<1x7x1xbf16>, tensor<1x7x8xbf16>) -> tensor<1x7x8xbf16> loc("moe.py":42:9)
  %o1 = "kf.add"(%t0, %t1) : (tensor<1x7x8xbf16>, tensor<1x7x8xbf16>) -> tensor<1x7x8xbf16> loc("moe.py":42:9)
  return %o1 : tensor<1x7x8xbf16>
}
// -----

// Expert 2's second projection reads w_out[1]: not the MoE pattern, the IR stays dense.
// CHECK-LABEL: func.func @moe_wrong_expert
// CHECK-NOT: call
// CHECK-COUNT-6: "kf.matmul"
// CHECK-NOT: call
func.func @moe_wrong_expert(%x: tensor<1x5x8xf32>, %idx: tensor<1x5x2xi64>, %wt: tensor<1x5x2xf32>, %w_in: tensor<3x8x12xf32>, %w_out: tensor<3x12x8xf32>) -> tensor<1x5x8xf32> {
  %experts = "kf.constant"() {value = dense<[0, 1, 2]> : tensor<3xi64>} : () -> tensor<3xi64> loc("moe.py":29:5)
  %i0 = "kf.slice"(%idx) {dim = 2 : i64, end = 1 : i64, start = 0 : i64, step = 1 : i64} : (tensor<1x5x2xi64>) -> tensor<1x5x1xi64> loc("moe.py":32:9)
  %w0 = "kf.slice"(%wt) {dim = 2 : i64, end = 1 : i64, start = 0 : i64, step = 1 : i64} : (tensor<1x5x2xf32>) -> tensor<1x5x1xf32> loc("moe.py":33:9)
  %eq0 = "kf.cmp"(%i0, %experts) {predicate = "eq"} : (tensor<1x5x1xi64>, tensor<3xi64>) -> tensor<1x5x3xi1> loc("moe.py":34:9)
  %routed0 = "kf.cast"(%eq0) : (tensor<1x5x3xi1>) -> tensor<1x5x3xf32> loc("moe.py":34:9)
  %c0 = "kf.mul"(%routed0, %w0) : (tensor<1x5x3xf32>, tensor<1x5x1xf32>) -> tensor<1x5x3xf32> loc("moe.py":35:9)
  %i1 = "kf.slice"(%idx) {dim = 2 : i64, end = 2 : i64, start = 1 : i64, step = 1 : i64} : (tensor<1x5x2xi64>) -> tensor<1x5x1xi64> loc("moe.py":32:9)
  %w1 = "kf.slice"(%wt) {dim = 2 : i64, end = 2 : i64, start = 1 : i64, step = 1 : i64} : (tensor<1x5x2xf32>) -> tensor<1x5x1xf32> loc("moe.py":33:9)
  %eq1 = "kf.cmp"(%i1, %experts) {predicate = "eq"} : (tensor<1x5x1xi64>, tensor<3xi64>) -> tensor<1x5x3xi1> loc("moe.py":34:9)
  %routed1 = "kf.cast"(%eq1) : (tensor<1x5x3xi1>) -> tensor<1x5x3xf32> loc("moe.py":34:9)
  %c1 = "kf.mul"(%routed1, %w1) : (tensor<1x5x3xf32>, tensor<1x5x1xf32>) -> tensor<1x5x3xf32> loc("moe.py":35:9)
  %cs1 = "kf.add"(%c0, %c1) : (tensor<1x5x3xf32>, tensor<1x5x3xf32>) -> tensor<1x5x3xf32> loc("moe.py":35:9)
  %wi0s = "kf.slice"(%w_in) {dim = 0 : i64, end = 1 : i64, start = 0 : i64, step = 1 : i64} : (tensor<3x8x12xf32>) -> tensor<1x8x12xf32> loc("moe.py":41:9)
  %wi0 = "kf.reshape"(%wi0s) : (tensor<1x8x12xf32>) -> tensor<8x12xf32> loc("moe.py":41:9)
  %u0 = "kf.matmul"(%x, %wi0) : (tensor<1x5x8xf32>, tensor<8x12xf32>) -> tensor<1x5x12xf32> loc("moe.py":41:9)
  %h0 = "kf.gelu"(%u0) {approximate = "tanh"} : (tensor<1x5x12xf32>) -> tensor<1x5x12xf32> loc("moe.py":41:9)
  %ce0 = "kf.slice"(%cs1) {dim = 2 : i64, end = 1 : i64, start = 0 : i64, step = 1 : i64} : (tensor<1x5x3xf32>) -> tensor<1x5x1xf32> loc("moe.py":42:9)
  %wo0s = "kf.slice"(%w_out) {dim = 0 : i64, end = 1 : i64, start = 0 : i64, step = 1 : i64} : (tensor<3x12x8xf32>) -> tensor<1x12x8xf32> loc("moe.py":42:9)
  %wo0 = "kf.reshape"(%wo0s) : (tensor<1x12x8xf32>) -> tensor<12x8xf32> loc("moe.py":42:9)
  %y0 = "kf.matmul"(%h0, %wo0) : (tensor<1x5x12xf32>, tensor<12x8xf32>) -> tensor<1x5x8xf32> loc("moe.py":42:9)
  %t0 = "kf.mul"(%ce0, %y0) : (tensor<1x5x1xf32>, tensor<1x5x8xf32>) -> tensor<1x5x8xf32> loc("moe.py":42:9)
  %wi1s = "kf.slice"(%w_in) {dim = 0 : i64, end = 2 : i64, start = 1 : i64, step = 1 : i64} : (tensor<3x8x12xf32>) -> tensor<1x8x12xf32> loc("moe.py":41:9)
  %wi1 = "kf.reshape"(%wi1s) : (tensor<1x8x12xf32>) -> tensor<8x12xf32> loc("moe.py":41:9)
  %u1 = "kf.matmul"(%x, %wi1) : (tensor<1x5x8xf32>, tensor<8x12xf32>) -> tensor<1x5x12xf32> loc("moe.py":41:9)
  %h1 = "kf.gelu"(%u1) {approximate = "tanh"} : (tensor<1x5x12xf32>) -> tensor<1x5x12xf32> loc("moe.py":41:9)
  %ce1 = "kf.slice"(%cs1) {dim = 2 : i64, end = 2 : i64, start = 1 : i64, step = 1 : i64} : (tensor<1x5x3xf32>) -> tensor<1x5x1xf32> loc("moe.py":42:9)
  %wo1s = "kf.slice"(%w_out) {dim = 0 : i64, end = 2 : i64, start = 1 : i64, step = 1 : i64} : (tensor<3x12x8xf32>) -> tensor<1x12x8xf32> loc("moe.py":42:9)
  %wo1 = "kf.reshape"(%wo1s) : (tensor<1x12x8xf32>) -> tensor<12x8xf32> loc("moe.py":42:9)
  %y1 = "kf.matmul"(%h1, %wo1) : (tensor<1x5x12xf32>, tensor<12x8xf32>) -> tensor<1x5x8xf32> loc("moe.py":42:9)
  %t1 = "kf.mul"(%ce1, %y1) : (tensor<1x5x1xf32>, tensor<1x5x8xf32>) -> tensor<1x5x8xf32> loc("moe.py":42:9)
  %o1 = "kf.add"(%t0, %t1) : (tensor<1x5x8xf32>, tensor<1x5x8xf32>) -> tensor<1x5x8xf32> loc("moe.py":42:9)
  %wi2s = "kf.slice"(%w_in) {dim = 0 : i64, end = 3 : i64, start = 2 : i64, step = 1 : i64} : (tensor<3x8x12xf32>) -> tensor<1x8x12xf32> loc("moe.py":41:9)
  %wi2 = "kf.reshape"(%wi2s) : (tensor<1x8x12xf32>) -> tensor<8x12xf32> loc("moe.py":41:9)
  %u2 = "kf.matmul"(%x, %wi2) : (tensor<1x5x8xf32>, tensor<8x12xf32>) -> tensor<1x5x12xf32> loc("moe.py":41:9)
  %h2 = "kf.gelu"(%u2) {approximate = "tanh"} : (tensor<1x5x12xf32>) -> tensor<1x5x12xf32> loc("moe.py":41:9)
  %ce2 = "kf.slice"(%cs1) {dim = 2 : i64, end = 3 : i64, start = 2 : i64, step = 1 : i64} : (tensor<1x5x3xf32>) -> tensor<1x5x1xf32> loc("moe.py":42:9)
  %wo2s = "kf.slice"(%w_out) {dim = 0 : i64, end = 2 : i64, start = 1 : i64, step = 1 : i64} : (tensor<3x12x8xf32>) -> tensor<1x12x8xf32> loc("moe.py":42:9)
  %wo2 = "kf.reshape"(%wo2s) : (tensor<1x12x8xf32>) -> tensor<12x8xf32> loc("moe.py":42:9)
  %y2 = "kf.matmul"(%h2, %wo2) : (tensor<1x5x12xf32>, tensor<12x8xf32>) -> tensor<1x5x8xf32> loc("moe.py":42:9)
  %t2 = "kf.mul"(%ce2, %y2) : (tensor<1x5x1xf32>, tensor<1x5x8xf32>) -> tensor<1x5x8xf32> loc("moe.py":42:9)
  %o2 = "kf.add"(%o1, %t2) : (tensor<1x5x8xf32>, tensor<1x5x8xf32>) -> tensor<1x5x8xf32> loc("moe.py":42:9)
  return %o2 : tensor<1x5x8xf32>
}
// -----

// Expert 2 is never applied (its tokens get nothing): unchanged.
// CHECK-LABEL: func.func @moe_missing_expert
// CHECK-NOT: call
// CHECK-COUNT-4: "kf.matmul"
// CHECK-NOT: call
func.func @moe_missing_expert(%x: tensor<1x5x8xf32>, %idx: tensor<1x5x2xi64>, %wt: tensor<1x5x2xf32>, %w_in: tensor<3x8x12xf32>, %w_out: tensor<3x12x8xf32>) -> tensor<1x5x8xf32> {
  %experts = "kf.constant"() {value = dense<[0, 1, 2]> : tensor<3xi64>} : () -> tensor<3xi64> loc("moe.py":29:5)
  %i0 = "kf.slice"(%idx) {dim = 2 : i64, end = 1 : i64, start = 0 : i64, step = 1 : i64} : (tensor<1x5x2xi64>) -> tensor<1x5x1xi64> loc("moe.py":32:9)
  %w0 = "kf.slice"(%wt) {dim = 2 : i64, end = 1 : i64, start = 0 : i64, step = 1 : i64} : (tensor<1x5x2xf32>) -> tensor<1x5x1xf32> loc("moe.py":33:9)
  %eq0 = "kf.cmp"(%i0, %experts) {predicate = "eq"} : (tensor<1x5x1xi64>, tensor<3xi64>) -> tensor<1x5x3xi1> loc("moe.py":34:9)
  %routed0 = "kf.cast"(%eq0) : (tensor<1x5x3xi1>) -> tensor<1x5x3xf32> loc("moe.py":34:9)
  %c0 = "kf.mul"(%routed0, %w0) : (tensor<1x5x3xf32>, tensor<1x5x1xf32>) -> tensor<1x5x3xf32> loc("moe.py":35:9)
  %i1 = "kf.slice"(%idx) {dim = 2 : i64, end = 2 : i64, start = 1 : i64, step = 1 : i64} : (tensor<1x5x2xi64>) -> tensor<1x5x1xi64> loc("moe.py":32:9)
  %w1 = "kf.slice"(%wt) {dim = 2 : i64, end = 2 : i64, start = 1 : i64, step = 1 : i64} : (tensor<1x5x2xf32>) -> tensor<1x5x1xf32> loc("moe.py":33:9)
  %eq1 = "kf.cmp"(%i1, %experts) {predicate = "eq"} : (tensor<1x5x1xi64>, tensor<3xi64>) -> tensor<1x5x3xi1> loc("moe.py":34:9)
  %routed1 = "kf.cast"(%eq1) : (tensor<1x5x3xi1>) -> tensor<1x5x3xf32> loc("moe.py":34:9)
  %c1 = "kf.mul"(%routed1, %w1) : (tensor<1x5x3xf32>, tensor<1x5x1xf32>) -> tensor<1x5x3xf32> loc("moe.py":35:9)
  %cs1 = "kf.add"(%c0, %c1) : (tensor<1x5x3xf32>, tensor<1x5x3xf32>) -> tensor<1x5x3xf32> loc("moe.py":35:9)
  %wi0s = "kf.slice"(%w_in) {dim = 0 : i64, end = 1 : i64, start = 0 : i64, step = 1 : i64} : (tensor<3x8x12xf32>) -> tensor<1x8x12xf32> loc("moe.py":41:9)
  %wi0 = "kf.reshape"(%wi0s) : (tensor<1x8x12xf32>) -> tensor<8x12xf32> loc("moe.py":41:9)
  %u0 = "kf.matmul"(%x, %wi0) : (tensor<1x5x8xf32>, tensor<8x12xf32>) -> tensor<1x5x12xf32> loc("moe.py":41:9)
  %h0 = "kf.gelu"(%u0) {approximate = "tanh"} : (tensor<1x5x12xf32>) -> tensor<1x5x12xf32> loc("moe.py":41:9)
  %ce0 = "kf.slice"(%cs1) {dim = 2 : i64, end = 1 : i64, start = 0 : i64, step = 1 : i64} : (tensor<1x5x3xf32>) -> tensor<1x5x1xf32> loc("moe.py":42:9)
  %wo0s = "kf.slice"(%w_out) {dim = 0 : i64, end = 1 : i64, start = 0 : i64, step = 1 : i64} : (tensor<3x12x8xf32>) -> tensor<1x12x8xf32> loc("moe.py":42:9)
  %wo0 = "kf.reshape"(%wo0s) : (tensor<1x12x8xf32>) -> tensor<12x8xf32> loc("moe.py":42:9)
  %y0 = "kf.matmul"(%h0, %wo0) : (tensor<1x5x12xf32>, tensor<12x8xf32>) -> tensor<1x5x8xf32> loc("moe.py":42:9)
  %t0 = "kf.mul"(%ce0, %y0) : (tensor<1x5x1xf32>, tensor<1x5x8xf32>) -> tensor<1x5x8xf32> loc("moe.py":42:9)
  %wi1s = "kf.slice"(%w_in) {dim = 0 : i64, end = 2 : i64, start = 1 : i64, step = 1 : i64} : (tensor<3x8x12xf32>) -> tensor<1x8x12xf32> loc("moe.py":41:9)
  %wi1 = "kf.reshape"(%wi1s) : (tensor<1x8x12xf32>) -> tensor<8x12xf32> loc("moe.py":41:9)
  %u1 = "kf.matmul"(%x, %wi1) : (tensor<1x5x8xf32>, tensor<8x12xf32>) -> tensor<1x5x12xf32> loc("moe.py":41:9)
  %h1 = "kf.gelu"(%u1) {approximate = "tanh"} : (tensor<1x5x12xf32>) -> tensor<1x5x12xf32> loc("moe.py":41:9)
  %ce1 = "kf.slice"(%cs1) {dim = 2 : i64, end = 2 : i64, start = 1 : i64, step = 1 : i64} : (tensor<1x5x3xf32>) -> tensor<1x5x1xf32> loc("moe.py":42:9)
  %wo1s = "kf.slice"(%w_out) {dim = 0 : i64, end = 2 : i64, start = 1 : i64, step = 1 : i64} : (tensor<3x12x8xf32>) -> tensor<1x12x8xf32> loc("moe.py":42:9)
  %wo1 = "kf.reshape"(%wo1s) : (tensor<1x12x8xf32>) -> tensor<12x8xf32> loc("moe.py":42:9)
  %y1 = "kf.matmul"(%h1, %wo1) : (tensor<1x5x12xf32>, tensor<12x8xf32>) -> tensor<1x5x8xf32> loc("moe.py":42:9)
  %t1 = "kf.mul"(%ce1, %y1) : (tensor<1x5x1xf32>, tensor<1x5x8xf32>) -> tensor<1x5x8xf32> loc("moe.py":42:9)
  %o1 = "kf.add"(%t0, %t1) : (tensor<1x5x8xf32>, tensor<1x5x8xf32>) -> tensor<1x5x8xf32> loc("moe.py":42:9)
  return %o1 : tensor<1x5x8xf32>
}
// -----

// ReLU between the projections: the grouped GEMM applies GELU only, so unchanged.
// CHECK-LABEL: func.func @moe_relu
// CHECK-NOT: call
// CHECK-COUNT-6: "kf.matmul"
// CHECK-NOT: call
func.func @moe_relu(%x: tensor<1x5x8xf32>, %idx: tensor<1x5x2xi64>, %wt: tensor<1x5x2xf32>, %w_in: tensor<3x8x12xf32>, %w_out: tensor<3x12x8xf32>) -> tensor<1x5x8xf32> {
  %experts = "kf.constant"() {value = dense<[0, 1, 2]> : tensor<3xi64>} : () -> tensor<3xi64> loc("moe.py":29:5)
  %i0 = "kf.slice"(%idx) {dim = 2 : i64, end = 1 : i64, start = 0 : i64, step = 1 : i64} : (tensor<1x5x2xi64>) -> tensor<1x5x1xi64> loc("moe.py":32:9)
  %w0 = "kf.slice"(%wt) {dim = 2 : i64, end = 1 : i64, start = 0 : i64, step = 1 : i64} : (tensor<1x5x2xf32>) -> tensor<1x5x1xf32> loc("moe.py":33:9)
  %eq0 = "kf.cmp"(%i0, %experts) {predicate = "eq"} : (tensor<1x5x1xi64>, tensor<3xi64>) -> tensor<1x5x3xi1> loc("moe.py":34:9)
  %routed0 = "kf.cast"(%eq0) : (tensor<1x5x3xi1>) -> tensor<1x5x3xf32> loc("moe.py":34:9)
  %c0 = "kf.mul"(%routed0, %w0) : (tensor<1x5x3xf32>, tensor<1x5x1xf32>) -> tensor<1x5x3xf32> loc("moe.py":35:9)
  %i1 = "kf.slice"(%idx) {dim = 2 : i64, end = 2 : i64, start = 1 : i64, step = 1 : i64} : (tensor<1x5x2xi64>) -> tensor<1x5x1xi64> loc("moe.py":32:9)
  %w1 = "kf.slice"(%wt) {dim = 2 : i64, end = 2 : i64, start = 1 : i64, step = 1 : i64} : (tensor<1x5x2xf32>) -> tensor<1x5x1xf32> loc("moe.py":33:9)
  %eq1 = "kf.cmp"(%i1, %experts) {predicate = "eq"} : (tensor<1x5x1xi64>, tensor<3xi64>) -> tensor<1x5x3xi1> loc("moe.py":34:9)
  %routed1 = "kf.cast"(%eq1) : (tensor<1x5x3xi1>) -> tensor<1x5x3xf32> loc("moe.py":34:9)
  %c1 = "kf.mul"(%routed1, %w1) : (tensor<1x5x3xf32>, tensor<1x5x1xf32>) -> tensor<1x5x3xf32> loc("moe.py":35:9)
  %cs1 = "kf.add"(%c0, %c1) : (tensor<1x5x3xf32>, tensor<1x5x3xf32>) -> tensor<1x5x3xf32> loc("moe.py":35:9)
  %wi0s = "kf.slice"(%w_in) {dim = 0 : i64, end = 1 : i64, start = 0 : i64, step = 1 : i64} : (tensor<3x8x12xf32>) -> tensor<1x8x12xf32> loc("moe.py":41:9)
  %wi0 = "kf.reshape"(%wi0s) : (tensor<1x8x12xf32>) -> tensor<8x12xf32> loc("moe.py":41:9)
  %u0 = "kf.matmul"(%x, %wi0) : (tensor<1x5x8xf32>, tensor<8x12xf32>) -> tensor<1x5x12xf32> loc("moe.py":41:9)
  %h0 = "kf.relu"(%u0) : (tensor<1x5x12xf32>) -> tensor<1x5x12xf32> loc("moe.py":41:9)
  %ce0 = "kf.slice"(%cs1) {dim = 2 : i64, end = 1 : i64, start = 0 : i64, step = 1 : i64} : (tensor<1x5x3xf32>) -> tensor<1x5x1xf32> loc("moe.py":42:9)
  %wo0s = "kf.slice"(%w_out) {dim = 0 : i64, end = 1 : i64, start = 0 : i64, step = 1 : i64} : (tensor<3x12x8xf32>) -> tensor<1x12x8xf32> loc("moe.py":42:9)
  %wo0 = "kf.reshape"(%wo0s) : (tensor<1x12x8xf32>) -> tensor<12x8xf32> loc("moe.py":42:9)
  %y0 = "kf.matmul"(%h0, %wo0) : (tensor<1x5x12xf32>, tensor<12x8xf32>) -> tensor<1x5x8xf32> loc("moe.py":42:9)
  %t0 = "kf.mul"(%ce0, %y0) : (tensor<1x5x1xf32>, tensor<1x5x8xf32>) -> tensor<1x5x8xf32> loc("moe.py":42:9)
  %wi1s = "kf.slice"(%w_in) {dim = 0 : i64, end = 2 : i64, start = 1 : i64, step = 1 : i64} : (tensor<3x8x12xf32>) -> tensor<1x8x12xf32> loc("moe.py":41:9)
  %wi1 = "kf.reshape"(%wi1s) : (tensor<1x8x12xf32>) -> tensor<8x12xf32> loc("moe.py":41:9)
  %u1 = "kf.matmul"(%x, %wi1) : (tensor<1x5x8xf32>, tensor<8x12xf32>) -> tensor<1x5x12xf32> loc("moe.py":41:9)
  %h1 = "kf.relu"(%u1) : (tensor<1x5x12xf32>) -> tensor<1x5x12xf32> loc("moe.py":41:9)
  %ce1 = "kf.slice"(%cs1) {dim = 2 : i64, end = 2 : i64, start = 1 : i64, step = 1 : i64} : (tensor<1x5x3xf32>) -> tensor<1x5x1xf32> loc("moe.py":42:9)
  %wo1s = "kf.slice"(%w_out) {dim = 0 : i64, end = 2 : i64, start = 1 : i64, step = 1 : i64} : (tensor<3x12x8xf32>) -> tensor<1x12x8xf32> loc("moe.py":42:9)
  %wo1 = "kf.reshape"(%wo1s) : (tensor<1x12x8xf32>) -> tensor<12x8xf32> loc("moe.py":42:9)
  %y1 = "kf.matmul"(%h1, %wo1) : (tensor<1x5x12xf32>, tensor<12x8xf32>) -> tensor<1x5x8xf32> loc("moe.py":42:9)
  %t1 = "kf.mul"(%ce1, %y1) : (tensor<1x5x1xf32>, tensor<1x5x8xf32>) -> tensor<1x5x8xf32> loc("moe.py":42:9)
  %o1 = "kf.add"(%t0, %t1) : (tensor<1x5x8xf32>, tensor<1x5x8xf32>) -> tensor<1x5x8xf32> loc("moe.py":42:9)
  %wi2s = "kf.slice"(%w_in) {dim = 0 : i64, end = 3 : i64, start = 2 : i64, step = 1 : i64} : (tensor<3x8x12xf32>) -> tensor<1x8x12xf32> loc("moe.py":41:9)
  %wi2 = "kf.reshape"(%wi2s) : (tensor<1x8x12xf32>) -> tensor<8x12xf32> loc("moe.py":41:9)
  %u2 = "kf.matmul"(%x, %wi2) : (tensor<1x5x8xf32>, tensor<8x12xf32>) -> tensor<1x5x12xf32> loc("moe.py":41:9)
  %h2 = "kf.relu"(%u2) : (tensor<1x5x12xf32>) -> tensor<1x5x12xf32> loc("moe.py":41:9)
  %ce2 = "kf.slice"(%cs1) {dim = 2 : i64, end = 3 : i64, start = 2 : i64, step = 1 : i64} : (tensor<1x5x3xf32>) -> tensor<1x5x1xf32> loc("moe.py":42:9)
  %wo2s = "kf.slice"(%w_out) {dim = 0 : i64, end = 3 : i64, start = 2 : i64, step = 1 : i64} : (tensor<3x12x8xf32>) -> tensor<1x12x8xf32> loc("moe.py":42:9)
  %wo2 = "kf.reshape"(%wo2s) : (tensor<1x12x8xf32>) -> tensor<12x8xf32> loc("moe.py":42:9)
  %y2 = "kf.matmul"(%h2, %wo2) : (tensor<1x5x12xf32>, tensor<12x8xf32>) -> tensor<1x5x8xf32> loc("moe.py":42:9)
  %t2 = "kf.mul"(%ce2, %y2) : (tensor<1x5x1xf32>, tensor<1x5x8xf32>) -> tensor<1x5x8xf32> loc("moe.py":42:9)
  %o2 = "kf.add"(%o1, %t2) : (tensor<1x5x8xf32>, tensor<1x5x8xf32>) -> tensor<1x5x8xf32> loc("moe.py":42:9)
  return %o2 : tensor<1x5x8xf32>
}
// -----

// The sum over experts (plus a zero fill) feeds a residual add: the sum is replaced,
// once, and the residual add stays.
// CHECK-LABEL: func.func @moe_residual
// CHECK-NOT: kf.matmul
// CHECK: call @moe_residual_moe0_route
// CHECK-NEXT: call @moe_residual_moe0_up
// CHECK-NEXT: call @moe_residual_moe0_down
// CHECK-NEXT: %[[O:.*]] = call @moe_residual_moe0_combine
// CHECK-NEXT: %[[R:.*]] = "kf.add"(%arg0, %[[O]])
// CHECK-NEXT: return %[[R]]
func.func @moe_residual(%x: tensor<1x5x8xf32>, %idx: tensor<1x5x2xi64>, %wt: tensor<1x5x2xf32>, %w_in: tensor<3x8x12xf32>, %w_out: tensor<3x12x8xf32>) -> tensor<1x5x8xf32> {
  %experts = "kf.constant"() {value = dense<[0, 1, 2]> : tensor<3xi64>} : () -> tensor<3xi64> loc("moe.py":29:5)
  %i0 = "kf.slice"(%idx) {dim = 2 : i64, end = 1 : i64, start = 0 : i64, step = 1 : i64} : (tensor<1x5x2xi64>) -> tensor<1x5x1xi64> loc("moe.py":32:9)
  %w0 = "kf.slice"(%wt) {dim = 2 : i64, end = 1 : i64, start = 0 : i64, step = 1 : i64} : (tensor<1x5x2xf32>) -> tensor<1x5x1xf32> loc("moe.py":33:9)
  %eq0 = "kf.cmp"(%i0, %experts) {predicate = "eq"} : (tensor<1x5x1xi64>, tensor<3xi64>) -> tensor<1x5x3xi1> loc("moe.py":34:9)
  %routed0 = "kf.cast"(%eq0) : (tensor<1x5x3xi1>) -> tensor<1x5x3xf32> loc("moe.py":34:9)
  %c0 = "kf.mul"(%routed0, %w0) : (tensor<1x5x3xf32>, tensor<1x5x1xf32>) -> tensor<1x5x3xf32> loc("moe.py":35:9)
  %i1 = "kf.slice"(%idx) {dim = 2 : i64, end = 2 : i64, start = 1 : i64, step = 1 : i64} : (tensor<1x5x2xi64>) -> tensor<1x5x1xi64> loc("moe.py":32:9)
  %w1 = "kf.slice"(%wt) {dim = 2 : i64, end = 2 : i64, start = 1 : i64, step = 1 : i64} : (tensor<1x5x2xf32>) -> tensor<1x5x1xf32> loc("moe.py":33:9)
  %eq1 = "kf.cmp"(%i1, %experts) {predicate = "eq"} : (tensor<1x5x1xi64>, tensor<3xi64>) -> tensor<1x5x3xi1> loc("moe.py":34:9)
  %routed1 = "kf.cast"(%eq1) : (tensor<1x5x3xi1>) -> tensor<1x5x3xf32> loc("moe.py":34:9)
  %c1 = "kf.mul"(%routed1, %w1) : (tensor<1x5x3xf32>, tensor<1x5x1xf32>) -> tensor<1x5x3xf32> loc("moe.py":35:9)
  %cs1 = "kf.add"(%c0, %c1) : (tensor<1x5x3xf32>, tensor<1x5x3xf32>) -> tensor<1x5x3xf32> loc("moe.py":35:9)
  %wi0s = "kf.slice"(%w_in) {dim = 0 : i64, end = 1 : i64, start = 0 : i64, step = 1 : i64} : (tensor<3x8x12xf32>) -> tensor<1x8x12xf32> loc("moe.py":41:9)
  %wi0 = "kf.reshape"(%wi0s) : (tensor<1x8x12xf32>) -> tensor<8x12xf32> loc("moe.py":41:9)
  %u0 = "kf.matmul"(%x, %wi0) : (tensor<1x5x8xf32>, tensor<8x12xf32>) -> tensor<1x5x12xf32> loc("moe.py":41:9)
  %h0 = "kf.gelu"(%u0) {approximate = "tanh"} : (tensor<1x5x12xf32>) -> tensor<1x5x12xf32> loc("moe.py":41:9)
  %ce0 = "kf.slice"(%cs1) {dim = 2 : i64, end = 1 : i64, start = 0 : i64, step = 1 : i64} : (tensor<1x5x3xf32>) -> tensor<1x5x1xf32> loc("moe.py":42:9)
  %wo0s = "kf.slice"(%w_out) {dim = 0 : i64, end = 1 : i64, start = 0 : i64, step = 1 : i64} : (tensor<3x12x8xf32>) -> tensor<1x12x8xf32> loc("moe.py":42:9)
  %wo0 = "kf.reshape"(%wo0s) : (tensor<1x12x8xf32>) -> tensor<12x8xf32> loc("moe.py":42:9)
  %y0 = "kf.matmul"(%h0, %wo0) : (tensor<1x5x12xf32>, tensor<12x8xf32>) -> tensor<1x5x8xf32> loc("moe.py":42:9)
  %t0 = "kf.mul"(%ce0, %y0) : (tensor<1x5x1xf32>, tensor<1x5x8xf32>) -> tensor<1x5x8xf32> loc("moe.py":42:9)
  %wi1s = "kf.slice"(%w_in) {dim = 0 : i64, end = 2 : i64, start = 1 : i64, step = 1 : i64} : (tensor<3x8x12xf32>) -> tensor<1x8x12xf32> loc("moe.py":41:9)
  %wi1 = "kf.reshape"(%wi1s) : (tensor<1x8x12xf32>) -> tensor<8x12xf32> loc("moe.py":41:9)
  %u1 = "kf.matmul"(%x, %wi1) : (tensor<1x5x8xf32>, tensor<8x12xf32>) -> tensor<1x5x12xf32> loc("moe.py":41:9)
  %h1 = "kf.gelu"(%u1) {approximate = "tanh"} : (tensor<1x5x12xf32>) -> tensor<1x5x12xf32> loc("moe.py":41:9)
  %ce1 = "kf.slice"(%cs1) {dim = 2 : i64, end = 2 : i64, start = 1 : i64, step = 1 : i64} : (tensor<1x5x3xf32>) -> tensor<1x5x1xf32> loc("moe.py":42:9)
  %wo1s = "kf.slice"(%w_out) {dim = 0 : i64, end = 2 : i64, start = 1 : i64, step = 1 : i64} : (tensor<3x12x8xf32>) -> tensor<1x12x8xf32> loc("moe.py":42:9)
  %wo1 = "kf.reshape"(%wo1s) : (tensor<1x12x8xf32>) -> tensor<12x8xf32> loc("moe.py":42:9)
  %y1 = "kf.matmul"(%h1, %wo1) : (tensor<1x5x12xf32>, tensor<12x8xf32>) -> tensor<1x5x8xf32> loc("moe.py":42:9)
  %t1 = "kf.mul"(%ce1, %y1) : (tensor<1x5x1xf32>, tensor<1x5x8xf32>) -> tensor<1x5x8xf32> loc("moe.py":42:9)
  %o1 = "kf.add"(%t0, %t1) : (tensor<1x5x8xf32>, tensor<1x5x8xf32>) -> tensor<1x5x8xf32> loc("moe.py":42:9)
  %wi2s = "kf.slice"(%w_in) {dim = 0 : i64, end = 3 : i64, start = 2 : i64, step = 1 : i64} : (tensor<3x8x12xf32>) -> tensor<1x8x12xf32> loc("moe.py":41:9)
  %wi2 = "kf.reshape"(%wi2s) : (tensor<1x8x12xf32>) -> tensor<8x12xf32> loc("moe.py":41:9)
  %u2 = "kf.matmul"(%x, %wi2) : (tensor<1x5x8xf32>, tensor<8x12xf32>) -> tensor<1x5x12xf32> loc("moe.py":41:9)
  %h2 = "kf.gelu"(%u2) {approximate = "tanh"} : (tensor<1x5x12xf32>) -> tensor<1x5x12xf32> loc("moe.py":41:9)
  %ce2 = "kf.slice"(%cs1) {dim = 2 : i64, end = 3 : i64, start = 2 : i64, step = 1 : i64} : (tensor<1x5x3xf32>) -> tensor<1x5x1xf32> loc("moe.py":42:9)
  %wo2s = "kf.slice"(%w_out) {dim = 0 : i64, end = 3 : i64, start = 2 : i64, step = 1 : i64} : (tensor<3x12x8xf32>) -> tensor<1x12x8xf32> loc("moe.py":42:9)
  %wo2 = "kf.reshape"(%wo2s) : (tensor<1x12x8xf32>) -> tensor<12x8xf32> loc("moe.py":42:9)
  %y2 = "kf.matmul"(%h2, %wo2) : (tensor<1x5x12xf32>, tensor<12x8xf32>) -> tensor<1x5x8xf32> loc("moe.py":42:9)
  %t2 = "kf.mul"(%ce2, %y2) : (tensor<1x5x1xf32>, tensor<1x5x8xf32>) -> tensor<1x5x8xf32> loc("moe.py":42:9)
  %o2 = "kf.add"(%o1, %t2) : (tensor<1x5x8xf32>, tensor<1x5x8xf32>) -> tensor<1x5x8xf32> loc("moe.py":42:9)
  %zero = "kf.fill"() {value = 0.0 : f64} : () -> tensor<1x5x8xf32>
  %sum = "kf.add"(%zero, %o2) : (tensor<1x5x8xf32>, tensor<1x5x8xf32>) -> tensor<1x5x8xf32>
  %res = "kf.add"(%x, %sum) : (tensor<1x5x8xf32>, tensor<1x5x8xf32>) -> tensor<1x5x8xf32>
  return %res : tensor<1x5x8xf32>
}