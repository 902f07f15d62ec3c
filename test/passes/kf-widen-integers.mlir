// RUN: kf-opt %s --split-input-file --pass-pipeline='builtin.module(kf-widen-integers)' | FileCheck %s

// Arithmetic on int8 computes in i32; the result wraps (a cast back to i8).
// CHECK-LABEL: func.func @add_i8
// CHECK-DAG: %[[B:.*]] = "kf.cast"(%arg1) : (tensor<4xi8>) -> tensor<4xi32>
// CHECK-DAG: %[[A:.*]] = "kf.cast"(%arg0) : (tensor<4xi8>) -> tensor<4xi32>
// CHECK: %[[S:.*]] = "kf.add"(%[[A]], %[[B]]) : (tensor<4xi32>, tensor<4xi32>) -> tensor<4xi32>
// CHECK: %[[R:.*]] = "kf.cast"(%[[S]]) : (tensor<4xi32>) -> tensor<4xi8>
// CHECK: return %[[R]]
func.func @add_i8(%a: tensor<4xi8>, %b: tensor<4xi8>) -> tensor<4xi8> {
  %0 = "kf.add"(%a, %b) : (tensor<4xi8>, tensor<4xi8>) -> tensor<4xi8>
  return %0 : tensor<4xi8>
}

// -----

// uint8 operands are extended (zero-extension: the cast from ui8) before a comparison.
// CHECK-LABEL: func.func @cmp_ui8
// CHECK-DAG: "kf.cast"(%arg1) : (tensor<4xui8>) -> tensor<4xi32>
// CHECK-DAG: "kf.cast"(%arg0) : (tensor<4xui8>) -> tensor<4xi32>
// CHECK: "kf.cmp"({{.*}}) {predicate = "lt"} : (tensor<4xi32>, tensor<4xi32>) -> tensor<4xi1>
func.func @cmp_ui8(%a: tensor<4xui8>, %b: tensor<4xui8>) -> tensor<4xi1> {
  %0 = "kf.cmp"(%a, %b) {predicate = "lt"} : (tensor<4xui8>, tensor<4xui8>) -> tensor<4xi1>
  return %0 : tensor<4xi1>
}

// -----

// A float becomes uint8 through i32 (truncation toward zero, then the low bits).
// CHECK-LABEL: func.func @cast_f32_ui8
// CHECK: %[[I:.*]] = "kf.cast"(%arg0) : (tensor<4xf32>) -> tensor<4xi32>
// CHECK: "kf.cast"(%[[I]]) : (tensor<4xi32>) -> tensor<4xui8>
func.func @cast_f32_ui8(%a: tensor<4xf32>) -> tensor<4xui8> {
  %0 = "kf.cast"(%a) : (tensor<4xf32>) -> tensor<4xui8>
  return %0 : tensor<4xui8>
}

// -----

// And int16 becomes a float through i32.
// CHECK-LABEL: func.func @cast_i16_f32
// CHECK: %[[I:.*]] = "kf.cast"(%arg0) : (tensor<4xi16>) -> tensor<4xi32>
// CHECK: "kf.cast"(%[[I]]) : (tensor<4xi32>) -> tensor<4xf32>
func.func @cast_i16_f32(%a: tensor<4xi16>) -> tensor<4xf32> {
  %0 = "kf.cast"(%a) : (tensor<4xi16>) -> tensor<4xf32>
  return %0 : tensor<4xf32>
}

// -----

// Element-moving ops move i32 values too; the casts between them are left to
// kf-canonicalize and fusion.
// CHECK-LABEL: func.func @transpose_sum
// CHECK: %[[W:.*]] = "kf.cast"(%arg0) : (tensor<2x3xi8>) -> tensor<2x3xi32>
// CHECK: "kf.transpose"(%[[W]]) {{.*}} : (tensor<2x3xi32>) -> tensor<3x2xi32>
// CHECK: "kf.sum"({{.*}}) {{.*}} : (tensor<3x2xi64>) -> tensor<3xi64>
func.func @transpose_sum(%a: tensor<2x3xi8>) -> tensor<3xi64> {
  %0 = "kf.transpose"(%a) {perm = array<i64: 1, 0>} : (tensor<2x3xi8>) -> tensor<3x2xi8>
  %1 = "kf.cast"(%0) : (tensor<3x2xi8>) -> tensor<3x2xi64>
  %2 = "kf.sum"(%1) {dims = array<i64: 1>, keepdim = false} : (tensor<3x2xi64>) -> tensor<3xi64>
  return %2 : tensor<3xi64>
}

// -----

// A uint8 constant holds i32 values and is cast.
// CHECK-LABEL: func.func @constant_ui8
// CHECK: %[[C:.*]] = "kf.constant"() {value = dense<[200, 7]> : tensor<2xi32>} : () -> tensor<2xi32>
// CHECK: "kf.cast"(%[[C]]) : (tensor<2xi32>) -> tensor<2xui8>
func.func @constant_ui8() -> tensor<2xui8> {
  %0 = "kf.constant"() {value = dense<[200, 7]> : tensor<2xui8>} : () -> tensor<2xui8>
  return %0 : tensor<2xui8>
}
