// RUN: kf-opt %s --split-input-file --verify-diagnostics --pass-pipeline='builtin.module(kf-lower-to-linalg)' | FileCheck %s
// Bad options (it has none):
// RUN: not kf-opt %s --split-input-file --pass-pipeline='builtin.module(kf-lower-to-linalg{target=cpu})' 2>&1 | FileCheck %s --check-prefix=BAD-OPTION
// BAD-OPTION: error: pass 'kf-lower-to-linalg' has no option 'target' (options: none)

// Torch broadcasting is in the indexing maps: the 1-D operand maps to the trailing dim,
// the size-1 dim reads index 0, the rank-0 operand maps to (). f16 math runs in f32 and
// is rounded once, where a user that is not elementwise reads it (here the return): the
// sum stays an f32 tensor for the select, which then selects in f32 and rounds.
// CHECK-DAG: #[[ID:.*]] = affine_map<(d0, d1) -> (d0, d1)>
// CHECK-DAG: #[[ROW:.*]] = affine_map<(d0, d1) -> (d1)>
// CHECK-DAG: #[[COL:.*]] = affine_map<(d0, d1) -> (d0, 0)>
// CHECK-DAG: #[[SCALAR:.*]] = affine_map<(d0, d1) -> ()>
// CHECK-LABEL: func.func @broadcast
// CHECK: %[[E:.*]] = tensor.empty() : tensor<3x257xf32>
// CHECK: %[[SUM:.*]] = linalg.generic {indexing_maps = [#[[ID]], #[[ROW]], #[[ID]]], iterator_types = ["parallel", "parallel"]}
// CHECK-SAME: ins(%arg0, %arg1 : tensor<3x257xf16>, tensor<257xf16>) outs(%[[E]] : tensor<3x257xf32>)
// CHECK: %[[X:.*]] = arith.extf %{{.*}} : f16 to f32
// CHECK: %[[Y:.*]] = arith.extf %{{.*}} : f16 to f32
// CHECK: %[[S:.*]] = arith.addf %[[X]], %[[Y]] : f32
// CHECK-NEXT: linalg.yield %[[S]] : f32
// CHECK: linalg.generic {indexing_maps = [#[[COL]], #[[ID]], #[[SCALAR]], #[[ID]]]
// CHECK-SAME: ins(%arg2, %[[SUM]], %arg3 : tensor<3x1xi1>, tensor<3x257xf32>, tensor<f16>)
// CHECK: ^bb0(%[[C:.*]]: i1, %[[A:.*]]: f32, %[[B:.*]]: f16, %{{.*}}: f16):
// CHECK-NEXT: %[[BW:.*]] = arith.extf %[[B]] : f16 to f32
// CHECK-NEXT: %[[SEL:.*]] = arith.select %[[C]], %[[A]], %[[BW]] : f32
// CHECK-NEXT: arith.truncf %[[SEL]] : f32 to f16
// CHECK-NOT: kf.
func.func @broadcast(%a: tensor<3x257xf16>, %b: tensor<257xf16>, %m: tensor<3x1xi1>, %c: tensor<f16>) -> tensor<3x257xf16> {
  %0 = "kf.add"(%a, %b) : (tensor<3x257xf16>, tensor<257xf16>) -> tensor<3x257xf16>
  %1 = "kf.select"(%m, %0, %c) : (tensor<3x1xi1>, tensor<3x257xf16>, tensor<f16>) -> tensor<3x257xf16>
  return %1 : tensor<3x257xf16>
}

// -----

// select of f16 values only moves them: it stays in f16 (no rounding at all). A sum that
// a reduction reads is rounded to f16 (the reduction reads a tensor of its type).
// CHECK-LABEL: func.func @select_f16
// CHECK: ^bb0(%[[C:.*]]: i1, %[[A:.*]]: f16, %[[B:.*]]: f16, %{{.*}}: f16):
// CHECK-NEXT: arith.select %[[C]], %[[A]], %[[B]] : f16
// CHECK: arith.addf %{{.*}}, %{{.*}} : f32
// CHECK-NEXT: %[[R:.*]] = arith.truncf %{{.*}} : f32 to f16
// CHECK-NEXT: linalg.yield %[[R]] : f16
// CHECK: iterator_types = ["parallel", "reduction"]
func.func @select_f16(%a: tensor<3x257xf16>, %b: tensor<3x257xf16>, %m: tensor<3x257xi1>) -> (tensor<3x257xf16>, tensor<3xf16>) {
  %0 = "kf.select"(%m, %a, %b) : (tensor<3x257xi1>, tensor<3x257xf16>, tensor<3x257xf16>) -> tensor<3x257xf16>
  %1 = "kf.add"(%a, %b) : (tensor<3x257xf16>, tensor<3x257xf16>) -> tensor<3x257xf16>
  %2 = "kf.sum"(%1) {dims = array<i64: -1>, keepdim = false} : (tensor<3x257xf16>) -> tensor<3xf16>
  return %0, %2 : tensor<3x257xf16>, tensor<3xf16>
}

// -----

// A reduction accumulates bf16 in f32 into a filled init, rounds once, then restores
// the reduced dim for keepdim with expand_shape.
// CHECK-DAG: #[[ID:.*]] = affine_map<(d0, d1) -> (d0, d1)>
// CHECK-DAG: #[[KEPT:.*]] = affine_map<(d0, d1) -> (d0)>
// CHECK-LABEL: func.func @sum_keepdim
// CHECK: %[[ZERO:.*]] = arith.constant 0.000000e+00 : f32
// CHECK: %[[INIT:.*]] = linalg.fill ins(%[[ZERO]] : f32) outs(%{{.*}} : tensor<3xf32>)
// CHECK: %[[ACC:.*]] = linalg.generic {indexing_maps = [#[[ID]], #[[KEPT]]], iterator_types = ["parallel", "reduction"]}
// CHECK-SAME: ins(%arg0 : tensor<3x257xbf16>) outs(%[[INIT]] : tensor<3xf32>)
// CHECK: arith.extf %{{.*}} : bf16 to f32
// CHECK: arith.addf
// CHECK: %[[ROUNDED:.*]] = linalg.generic
// CHECK: arith.truncf %{{.*}} : f32 to bf16
// CHECK: tensor.expand_shape %[[ROUNDED]] {{\[\[}}0, 1]] output_shape [3, 1] : tensor<3xbf16> into tensor<3x1xbf16>
func.func @sum_keepdim(%a: tensor<3x257xbf16>) -> tensor<3x1xbf16> {
  %0 = "kf.sum"(%a) {dims = array<i64: -1>, keepdim = true} : (tensor<3x257xbf16>) -> tensor<3x1xbf16>
  return %0 : tensor<3x1xbf16>
}

// -----

// var is two passes: the mean, then the sum of squared deviations divided by
// n - correction (3 - 1 = 2), which keeps its precision when the mean is large.
// CHECK-LABEL: func.func @var
// CHECK: %[[SUM:.*]] = linalg.generic {{.*}} iterator_types = ["reduction", "parallel"]
// CHECK: %[[MEAN:.*]] = linalg.generic {{.*}} ins(%[[SUM]] : tensor<257xf32>)
// CHECK: arith.constant 3.000000e+00 : f32
// CHECK: arith.divf
// CHECK: %[[M2:.*]] = linalg.generic {{.*}} iterator_types = ["reduction", "parallel"]
// CHECK-SAME: ins(%arg0, %[[MEAN]] : tensor<3x257xf32>, tensor<257xf32>)
// CHECK: %[[D:.*]] = arith.subf
// CHECK: %[[SQ:.*]] = arith.mulf %[[D]], %[[D]] : f32
// CHECK: arith.addf %{{.*}}, %[[SQ]] : f32
// CHECK: linalg.generic {{.*}} ins(%[[M2]] : tensor<257xf32>)
// CHECK: arith.constant 2.000000e+00 : f32
// CHECK: arith.divf
func.func @var(%a: tensor<3x257xf32>) -> tensor<257xf32> {
  %0 = "kf.var"(%a) {dims = array<i64: 0>, correction = 1.0, keepdim = false} : (tensor<3x257xf32>) -> tensor<257xf32>
  return %0 : tensor<257xf32>
}

// -----

// softmax is numerically stable: max from -inf, then the sum of exp(x - max), then
// exp(x - max) / sum.
// CHECK-LABEL: func.func @softmax
// CHECK: %[[NINF:.*]] = arith.constant 0xFF800000 : f32
// CHECK: %[[INIT:.*]] = linalg.fill ins(%[[NINF]] : f32)
// CHECK: %[[MAX:.*]] = linalg.generic {{.*}} outs(%[[INIT]] : tensor<3xf32>)
// CHECK: arith.maximumf
// CHECK: %[[SUM:.*]] = linalg.generic {{.*}} ins(%arg0, %[[MAX]] : tensor<3x257xf32>, tensor<3xf32>)
// CHECK: arith.subf
// CHECK: math.exp
// CHECK: arith.addf
// CHECK: linalg.generic {{.*}} iterator_types = ["parallel", "parallel"]} ins(%arg0, %[[MAX]], %[[SUM]] :
// CHECK: %[[SH:.*]] = arith.subf
// CHECK: %[[EX:.*]] = math.exp %[[SH]]
// CHECK: arith.divf %[[EX]]
func.func @softmax(%a: tensor<3x257xf32>) -> tensor<3x257xf32> {
  %0 = "kf.softmax"(%a) {dim = 1} : (tensor<3x257xf32>) -> tensor<3x257xf32>
  return %0 : tensor<3x257xf32>
}

// -----

// logsumexp of bf16 rows is an f32 statistic: the max, 0 where it is infinite (an all
// -inf row gives -inf, not NaN), the sum of exp(x - max), then log(sum) + max.
// CHECK-LABEL: func.func @logsumexp
// CHECK: %[[MAX:.*]] = linalg.generic {{.*}} outs(%{{.*}} : tensor<3xf32>)
// CHECK: arith.maximumf
// CHECK: %[[SHIFT:.*]] = linalg.generic {{.*}} ins(%[[MAX]] : tensor<3xf32>)
// CHECK: math.absf
// CHECK: arith.select
// CHECK: %[[SUM:.*]] = linalg.generic {{.*}} ins(%arg0, %[[SHIFT]] : tensor<3x257xbf16>, tensor<3xf32>)
// CHECK: math.exp
// CHECK: linalg.generic {{.*}} ins(%[[SUM]], %[[SHIFT]] : tensor<3xf32>, tensor<3xf32>)
// CHECK: math.log
// CHECK: return {{.*}} : tensor<3xf32>
func.func @logsumexp(%a: tensor<3x257xbf16>) -> tensor<3xf32> {
  %0 = "kf.logsumexp"(%a) {dims = array<i64: 1>, keepdim = false} : (tensor<3x257xbf16>) -> tensor<3xf32>
  return %0 : tensor<3xf32>
}

// -----

// 2-D matmul is linalg.matmul accumulating f16 in f32; broadcast batch dims need a
// generic contraction whose lhs map reads batch index 0 for its size-1 dim.
// CHECK-DAG: #[[LHS:.*]] = affine_map<(d0, d1, d2, d3, d4) -> (d0, 0, d2, d4)>
// CHECK-DAG: #[[RHS:.*]] = affine_map<(d0, d1, d2, d3, d4) -> (d1, d4, d3)>
// CHECK-DAG: #[[OUT:.*]] = affine_map<(d0, d1, d2, d3, d4) -> (d0, d1, d2, d3)>
// CHECK-LABEL: func.func @matmul
// CHECK: %[[ACC:.*]] = linalg.fill {{.*}} -> tensor<3x5xf32>
// CHECK: %[[MM:.*]] = linalg.matmul ins(%arg0, %arg1 : tensor<3x7xf16>, tensor<7x5xf16>) outs(%[[ACC]] : tensor<3x5xf32>)
// CHECK: linalg.generic {{.*}} ins(%[[MM]] : tensor<3x5xf32>) outs(%{{.*}} : tensor<3x5xf16>)
// CHECK: arith.truncf
// CHECK: linalg.generic {indexing_maps = [#[[LHS]], #[[RHS]], #[[OUT]]], iterator_types = ["parallel", "parallel", "parallel", "parallel", "reduction"]}
// CHECK: arith.mulf
// CHECK: arith.addf
func.func @matmul(%a: tensor<3x7xf16>, %b: tensor<7x5xf16>, %c: tensor<4x1x3x7xf32>, %d: tensor<2x7x5xf32>) -> (tensor<3x5xf16>, tensor<4x2x3x5xf32>) {
  %0 = "kf.matmul"(%a, %b) : (tensor<3x7xf16>, tensor<7x5xf16>) -> tensor<3x5xf16>
  %1 = "kf.matmul"(%c, %d) : (tensor<4x1x3x7xf32>, tensor<2x7x5xf32>) -> tensor<4x2x3x5xf32>
  return %0, %1 : tensor<3x5xf16>, tensor<4x2x3x5xf32>
}

// -----

// CHECK-LABEL: func.func @slice
// CHECK-NEXT: %[[S:.*]] = tensor.extract_slice %arg0[0, 2] [3, 85] [1, 3] : tensor<3x257xf32> to tensor<3x85xf32>
// CHECK-NEXT: return %[[S]]
func.func @slice(%a: tensor<3x257xf32>) -> tensor<3x85xf32> {
  %0 = "kf.slice"(%a) {dim = 1, start = 2, end = 257, step = 3} : (tensor<3x257xf32>) -> tensor<3x85xf32>
  return %0 : tensor<3x85xf32>
}

// -----

// topk is a loop over k: an arg-max that skips taken elements (the index accumulator
// starts at -1, "nothing yet"; NaN counts as the largest), the values and indices
// inserted at column k, and the winner marked taken in place.
// CHECK-LABEL: func.func @topk
// CHECK: %[[FALSE:.*]] = arith.constant false
// CHECK: %[[TAKEN:.*]] = linalg.fill ins(%[[FALSE]] : i1) outs(%{{.*}} : tensor<5x9xi1>)
// CHECK: scf.for %[[K:.*]] = %{{.*}} to %{{.*}} step %{{.*}} iter_args(%[[V:.*]] = %{{.*}}, %[[I:.*]] = %{{.*}}, %[[T:.*]] = %[[TAKEN]])
// CHECK: %[[BEST:.*]]:2 = linalg.generic {{.*}} iterator_types = ["parallel", "reduction"]} ins(%arg0, %[[T]] : tensor<5x9xf32>, tensor<5x9xi1>)
// CHECK: linalg.index 1 : index
// CHECK: arith.cmpf ogt
// CHECK: arith.cmpf uno
// CHECK: linalg.yield
// CHECK: tensor.insert_slice %[[BEST]]#0 into %[[V]][0, %[[K]]] [5, 1] [1, 1] : tensor<5xf32> into tensor<5x2xf32>
// CHECK: tensor.insert_slice %[[BEST]]#1 into %[[I]][0, %[[K]]] [5, 1] [1, 1] : tensor<5xi64> into tensor<5x2xi64>
// CHECK: linalg.generic {{.*}} ins(%[[BEST]]#1 : tensor<5xi64>) outs(%[[T]] : tensor<5x9xi1>)
// CHECK: scf.yield
func.func @topk(%a: tensor<5x9xf32>) -> (tensor<5x2xf32>, tensor<5x2xi64>) {
  %v, %i = "kf.topk"(%a) {k = 2, dim = 1, largest = true} : (tensor<5x9xf32>) -> (tensor<5x2xf32>, tensor<5x2xi64>)
  return %v, %i : tensor<5x2xf32>, tensor<5x2xi64>
}

// -----

// concat inserts each operand into one tensor.empty at its running offset; reshape
// goes through 1-D (the canonicalizer merges the pair when a reassociation exists).
// CHECK-LABEL: func.func @layout
// CHECK: %[[E:.*]] = tensor.empty() : tensor<3x9xf32>
// CHECK: %[[A:.*]] = tensor.insert_slice %arg0 into %[[E]][0, 0] [3, 7] [1, 1] : tensor<3x7xf32> into tensor<3x9xf32>
// CHECK: %[[B:.*]] = tensor.insert_slice %arg1 into %[[A]][0, 7] [3, 2] [1, 1] : tensor<3x2xf32> into tensor<3x9xf32>
// CHECK: %[[F:.*]] = tensor.collapse_shape %[[B]] {{\[\[}}0, 1]] : tensor<3x9xf32> into tensor<27xf32>
// CHECK: tensor.expand_shape %[[F]] {{\[\[}}0, 1]] output_shape [9, 3] : tensor<27xf32> into tensor<9x3xf32>
func.func @layout(%a: tensor<3x7xf32>, %b: tensor<3x2xf32>) -> tensor<9x3xf32> {
  %0 = "kf.concat"(%a, %b) {dim = 1} : (tensor<3x7xf32>, tensor<3x2xf32>) -> tensor<3x9xf32>
  %1 = "kf.reshape"(%0) : (tensor<3x9xf32>) -> tensor<9x3xf32>
  return %1 : tensor<9x3xf32>
}

// -----

// gather: a generic over the index that extracts from the input, the gathered dim
// read from the index tensor and the others from linalg.index. The index is checked:
// its minimum and maximum in one reduction, a copy with every index outside [0, 257)
// as 0 (what the extract reads), and the function returns the index error flag
// (set, site, value low and high) last, the site listed in kf.index_sites.
// CHECK-LABEL: func.func @gather
// CHECK-SAME: -> (tensor<3x4xf32>, tensor<4xi32>) attributes {kf.index_sites = [{bound = 257 : i64, dim = 1 : i64, op = "kf.gather", where = "{{.*}}"}]}
// CHECK: %[[LOHI:.*]]:2 = linalg.generic {{.*}} iterator_types = ["reduction", "reduction"]} ins(%arg1 : tensor<3x4xi64>)
// CHECK: arith.minsi
// CHECK: arith.maxsi
// CHECK: %[[SAFE:.*]] = linalg.generic {{.*}} ins(%arg1 : tensor<3x4xi64>) outs(%{{.*}} : tensor<3x4xi64>)
// CHECK: %[[BAD:.*]] = arith.cmpi uge, %{{.*}}, %{{.*}} : i64
// CHECK: arith.select %[[BAD]]
// CHECK: linalg.generic {{.*}} ins(%[[SAFE]] : tensor<3x4xi64>) outs(%{{.*}} : tensor<3x4xf32>)
// CHECK: ^bb0(%[[IDX:.*]]: i64, %{{.*}}: f32):
// CHECK: %[[ROW:.*]] = linalg.index 0 : index
// CHECK: %[[COL:.*]] = arith.index_cast %[[IDX]] : i64 to index
// CHECK: %[[X:.*]] = tensor.extract %arg0[%[[ROW]], %[[COL]]] : tensor<3x257xf32>
// CHECK: linalg.yield %[[X]] : f32
// CHECK: %[[FLAG:.*]] = tensor.from_elements {{.*}} : tensor<4xi32>
// CHECK: return %{{.*}}, %[[FLAG]] : tensor<3x4xf32>, tensor<4xi32>
func.func @gather(%a: tensor<3x257xf32>, %i: tensor<3x4xi64>) -> tensor<3x4xf32> {
  %0 = "kf.gather"(%a, %i) {dim = 1} : (tensor<3x257xf32>, tensor<3x4xi64>) -> tensor<3x4xf32>
  return %0 : tensor<3x4xf32>
}

// -----

// torch counts booleans into integers; a sum of i1 into i1 has no torch meaning.
func.func @bool_sum(%a: tensor<3x7xi1>) -> tensor<3xi1> {
  // expected-error @+1 {{kf.sum of booleans needs an integer result type}}
  %0 = "kf.sum"(%a) {dims = array<i64: 1>, keepdim = false} : (tensor<3x7xi1>) -> tensor<3xi1>
  return %0 : tensor<3xi1>
}

// -----

// kf.rand: the state's two words are read once; element i takes word i % 4 of the
// Philox block at counter state offset + op offset + i / 4 (i the linear index, from
// linalg.index): a 10-round Philox4x32 (20 widening multiplies), the word picked by
// i % 4, its top 24 bits times 2^-24.
// CHECK-DAG: #[[ID:.*]] = affine_map<(d0, d1) -> (d0, d1)>
// CHECK-LABEL: func.func @rand
// CHECK: %[[SEED:.*]] = tensor.extract %arg0[%{{.*}}] : tensor<2xi64>
// CHECK: %[[OFFSET:.*]] = tensor.extract %arg0[%{{.*}}] : tensor<2xi64>
// CHECK: linalg.generic {indexing_maps = [#[[ID]]], iterator_types = ["parallel", "parallel"]} outs(%{{.*}} : tensor<3x5xf32>)
// CHECK: %[[I:.*]] = linalg.index 0 : index
// CHECK: %[[ROW:.*]] = arith.muli %[[I]], %{{.*}} : index
// CHECK: %[[J:.*]] = linalg.index 1 : index
// CHECK: %[[LIN:.*]] = arith.addi %[[ROW]], %[[J]] : index
// CHECK: %[[BLOCK:.*]] = arith.divui %[[LIN]], %{{.*}} : index
// CHECK: %[[WORD:.*]] = arith.remui %[[LIN]], %{{.*}} : index
// CHECK: %[[B64:.*]] = arith.index_cast %[[BLOCK]] : index to i64
// CHECK: %[[C:.*]] = arith.addi %[[B64]], %[[OFFSET]] : i64
// CHECK: %[[SEVEN:.*]] = arith.constant 7 : i64
// CHECK: arith.addi %[[C]], %[[SEVEN]] : i64
// CHECK: arith.trunci %[[SEED]] : i64 to i32
// CHECK-COUNT-20: arith.mului_extended
// CHECK: arith.cmpi eq, %[[WORD]]
// CHECK: arith.select
// CHECK: %[[BITS:.*]] = arith.shrui %{{.*}}, %{{.*}} : i32
// CHECK: %[[F:.*]] = arith.sitofp %[[BITS]] : i32 to f32
// CHECK: %[[U:.*]] = arith.mulf %[[F]], %{{.*}} : f32
// CHECK: linalg.yield %[[U]] : f32
// CHECK-NOT: kf.
func.func @rand(%state: tensor<2xi64>) -> tensor<3x5xf32> {
  %0 = "kf.rand"(%state) {distribution = "uniform", offset = 7 : i64} : (tensor<2xi64>) -> tensor<3x5xf32>
  return %0 : tensor<3x5xf32>
}

// -----

// A normal sample: Box-Muller on a pair of the block's words.
// CHECK-LABEL: func.func @randn
// CHECK: linalg.generic
// CHECK: math.log
// CHECK: math.sqrt
// CHECK: math.cos
// CHECK: linalg.yield
func.func @randn(%state: tensor<2xi64>) -> tensor<f32> {
  %0 = "kf.rand"(%state) {distribution = "normal", offset = 0 : i64} : (tensor<2xi64>) -> tensor<f32>
  return %0 : tensor<f32>
}

// -----

// A torch-mlir function of one ATen op (kf.aten) on bf16 computes in f32 and rounds once,
// where it returns: the argument is extended, the named pooling op becomes a generic that
// accumulates in f32 (its init and window tensors f32 too), the division runs in f32.
// CHECK-LABEL: func.func private @avg_pool
// CHECK: arith.extf %{{.*}} : bf16 to f32
// CHECK: arith.constant 9.000000e+00 : f32
// CHECK: iterator_types = ["parallel", "parallel", "parallel", "parallel", "reduction", "reduction"]
// CHECK-SAME: outs(%{{.*}} : tensor<1x2x2x2xf32>)
// CHECK: arith.addf %{{.*}}, %{{.*}} : f32
// CHECK: arith.divf %{{.*}}, %{{.*}} : f32
// CHECK: arith.truncf %{{.*}} : f32 to bf16
// CHECK: return %{{.*}} : tensor<1x2x2x2xbf16>
func.func private @avg_pool(%arg0: tensor<1x2x6x6xbf16>) -> tensor<1x2x2x2xbf16> attributes {kf.aten = "aten.avg_pool2d.default"} {
  %cst = arith.constant 0.000000e+00 : bf16
  %cst_0 = arith.constant 9.000000e+00 : bf16
  %0 = tensor.empty() : tensor<1x2x2x2xbf16>
  %1 = linalg.fill ins(%cst : bf16) outs(%0 : tensor<1x2x2x2xbf16>) -> tensor<1x2x2x2xbf16>
  %2 = tensor.empty() : tensor<3x3xbf16>
  %3 = linalg.pooling_nchw_sum {dilations = dense<1> : vector<2xi64>, strides = dense<3> : vector<2xi64>} ins(%arg0, %2 : tensor<1x2x6x6xbf16>, tensor<3x3xbf16>) outs(%1 : tensor<1x2x2x2xbf16>) -> tensor<1x2x2x2xbf16>
  %4 = linalg.generic {indexing_maps = [affine_map<(d0, d1, d2, d3) -> (d0, d1, d2, d3)>, affine_map<(d0, d1, d2, d3) -> (d0, d1, d2, d3)>], iterator_types = ["parallel", "parallel", "parallel", "parallel"]} ins(%3 : tensor<1x2x2x2xbf16>) outs(%0 : tensor<1x2x2x2xbf16>) {
  ^bb0(%in: bf16, %out: bf16):
    %5 = arith.divf %in, %cst_0 : bf16
    linalg.yield %5 : bf16
  } -> tensor<1x2x2x2xbf16>
  return %4 : tensor<1x2x2x2xbf16>
}

// -----

// Roundings torch-mlir asks for stay: a truncf to bf16 keeps its result bf16 (extended
// after it), a bitcast reads the bf16 value (rounded before it).
// CHECK-LABEL: func.func private @explicit_rounding
// CHECK: %[[T:.*]] = arith.truncf %{{.*}} : f32 to bf16
// CHECK: %[[W:.*]] = arith.extf %[[T]] : bf16 to f32
// CHECK: %[[M:.*]] = arith.mulf %[[W]], %{{.*}} : f32
// CHECK: %[[R:.*]] = arith.truncf %[[M]] : f32 to bf16
// CHECK: arith.bitcast %[[R]] : bf16 to i16
func.func private @explicit_rounding(%x: f32, %y: bf16) -> i16 attributes {kf.aten = "aten.example"} {
  %0 = arith.truncf %x : f32 to bf16
  %1 = arith.mulf %0, %y : bf16
  %2 = arith.bitcast %1 : bf16 to i16
  return %2 : i16
}

// -----

// kf.iota is a generic that yields its loop index along dim; tril's condition (col -
// row <= k) broadcasts two of them.
// CHECK-LABEL: func.func @iota
// CHECK: linalg.generic {{.*}} outs(%{{.*}} : tensor<1x5xi64>)
// CHECK: %[[I:.*]] = linalg.index 1 : index
// CHECK: arith.index_cast %[[I]] : index to i64
// CHECK: linalg.generic {{.*}} outs(%{{.*}} : tensor<3x1xi64>)
// CHECK: %[[J:.*]] = linalg.index 0 : index
// CHECK: arith.index_cast %[[J]] : index to i64
// CHECK: arith.subi
// CHECK-NOT: kf.
func.func @iota() -> tensor<3x5xi64> {
  %c = "kf.iota"() {dim = 1 : i64} : () -> tensor<1x5xi64>
  %r = "kf.iota"() {dim = -2 : i64} : () -> tensor<3x1xi64>
  %d = "kf.sub"(%c, %r) : (tensor<1x5xi64>, tensor<3x1xi64>) -> tensor<3x5xi64>
  return %d : tensor<3x5xi64>
}

// -----

// Run-time sizes: each new tensor takes its ? sizes from tensor.dim of the operand
// they come from; mean divides by the reduced dim's run-time size; keepdim expands
// with the kept dims' sizes.
// CHECK-LABEL: func.func @dynamic_mean
// CHECK: %[[D0:.*]] = tensor.dim %arg0, %{{.*}} : tensor<?x?xf32>
// CHECK: tensor.empty(%[[D0]]) : tensor<?xf32>
// CHECK: %[[D1:.*]] = tensor.dim %arg0, %{{.*}} : tensor<?x?xf32>
// CHECK: %[[N:.*]] = arith.index_cast %{{.*}} : index to i64
// CHECK: %[[NF:.*]] = arith.uitofp %[[N]] : i64 to f32
// CHECK: arith.divf %{{.*}}, %[[NF]] : f32
// CHECK: tensor.expand_shape %{{.*}} {{\[\[}}0, 1]] output_shape [%{{.*}}, 1] : tensor<?xf32> into tensor<?x1xf32>
// CHECK: tensor.empty(%{{.*}}, %{{.*}}) : tensor<?x?xf32>
// CHECK-NOT: kf.
func.func @dynamic_mean(%x: tensor<?x?xf32>) -> tensor<?x?xf32> {
  %0 = "kf.mean"(%x) {dims = array<i64: 1>, keepdim = true} : (tensor<?x?xf32>) -> tensor<?x1xf32>
  %1 = "kf.sub"(%x, %0) : (tensor<?x?xf32>, tensor<?x1xf32>) -> tensor<?x?xf32>
  return %1 : tensor<?x?xf32>
}

// -----

// round is roundeven (ties to even); trunc is floor or ceil by the sign (NVVM lowers no
// math.trunc); signbit tests the sign bit of the bits, so -0.0 and -NaN count.
// CHECK-LABEL: func.func @roundings
// CHECK: math.roundeven %{{.*}} : f32
// CHECK: arith.cmpf olt
// CHECK: math.ceil
// CHECK: math.floor
// CHECK: arith.select
// CHECK: %[[B:.*]] = arith.bitcast %{{.*}} : f32 to i32
// CHECK: arith.cmpi slt, %[[B]]
func.func @roundings(%x: tensor<7xf32>) -> (tensor<7xf32>, tensor<7xf32>, tensor<7xi1>) {
  %r = "kf.round"(%x) : (tensor<7xf32>) -> tensor<7xf32>
  %t = "kf.trunc"(%x) : (tensor<7xf32>) -> tensor<7xf32>
  %s = "kf.signbit"(%x) : (tensor<7xf32>) -> tensor<7xi1>
  return %r, %t, %s : tensor<7xf32>, tensor<7xf32>, tensor<7xi1>
}

// -----

// Integer division and shifts never trap nor leave a value undefined: a divisor of 0 or
// -1 divides by 1 (the quotient by -1 negated), a shift by a negative amount or by the
// width or more gives 0 to the left and the sign to the right (torch's rule).
// CHECK-LABEL: func.func @integer_division_and_shifts
// CHECK: arith.select
// CHECK: arith.divsi
// CHECK: arith.cmpi sge, %{{.*}}, %c32_i32
// CHECK: arith.shli
// CHECK: arith.shrsi %{{.*}}, %{{.*}} : i32
// An integer power takes a negative exponent apart: math.ipowi is given 0 there.
// CHECK: %[[NEG:.*]] = arith.cmpi slt
// CHECK: %[[E:.*]] = arith.select %[[NEG]], %c0_i32
// CHECK: math.ipowi %{{.*}}, %[[E]] : i32
func.func @integer_division_and_shifts(%x: tensor<7xi32>, %y: tensor<7xi32>) -> (tensor<7xi32>, tensor<7xi32>, tensor<7xi32>, tensor<7xi32>) {
  %0 = "kf.div"(%x, %y) : (tensor<7xi32>, tensor<7xi32>) -> tensor<7xi32>
  %1 = "kf.bitwise"(%x, %y) {kind = "shl"} : (tensor<7xi32>, tensor<7xi32>) -> tensor<7xi32>
  %2 = "kf.bitwise"(%x, %y) {kind = "shr"} : (tensor<7xi32>, tensor<7xi32>) -> tensor<7xi32>
  %3 = "kf.pow"(%x, %y) : (tensor<7xi32>, tensor<7xi32>) -> tensor<7xi32>
  return %0, %1, %2, %3 : tensor<7xi32>, tensor<7xi32>, tensor<7xi32>, tensor<7xi32>
}

// -----

// A matmul's result: rows from the lhs, columns from the rhs.
// CHECK-LABEL: func.func @dynamic_matmul
// CHECK-DAG: %[[M:.*]] = tensor.dim %arg0, %{{.*}} : tensor<?x16xf32>
// CHECK-DAG: %[[N:.*]] = tensor.dim %arg1, %{{.*}} : tensor<16x?xf32>
// CHECK: tensor.empty(%[[M]], %[[N]]) : tensor<?x?xf32>
// CHECK: linalg.matmul
func.func @dynamic_matmul(%a: tensor<?x16xf32>, %b: tensor<16x?xf32>) -> tensor<?x?xf32> {
  %0 = "kf.matmul"(%a, %b) : (tensor<?x16xf32>, tensor<16x?xf32>) -> tensor<?x?xf32>
  return %0 : tensor<?x?xf32>
}

// -----

// Along a run-time dim a slice's negative start and its end of 0 or less count from the
// end: x[1:] is rows 1 to n (n - 1 of them), x[-3:] the last 3 (a static length).
// CHECK-LABEL: func.func @dynamic_slice
// CHECK: %[[N:.*]] = tensor.dim %arg0, %{{.*}} : tensor<?x4xf32>
// CHECK: %[[LEN:.*]] = arith.addi %[[N]], %c-1 : index
// CHECK: tensor.extract_slice %arg0[1, 0] [%[[LEN]], 4] [1, 1] : tensor<?x4xf32> to tensor<?x4xf32>
// CHECK: %[[N2:.*]] = tensor.dim %arg0, %{{.*}} : tensor<?x4xf32>
// CHECK: %[[AT:.*]] = arith.addi %[[N2]], %c-3 : index
// CHECK: tensor.extract_slice %arg0[%[[AT]], 0] [3, 4] [1, 1] : tensor<?x4xf32> to tensor<3x4xf32>
func.func @dynamic_slice(%x: tensor<?x4xf32>) -> (tensor<?x4xf32>, tensor<3x4xf32>) {
  %0 = "kf.slice"(%x) {dim = 0 : i64, start = 1 : i64, end = 0 : i64, step = 1 : i64} : (tensor<?x4xf32>) -> tensor<?x4xf32>
  %1 = "kf.slice"(%x) {dim = 0 : i64, start = -3 : i64, end = 0 : i64, step = 1 : i64} : (tensor<?x4xf32>) -> tensor<3x4xf32>
  return %0, %1 : tensor<?x4xf32>, tensor<3x4xf32>
}

// -----

// A slice from a start counted from a run-time dim's end to an end counted from its
// start has a length that may be negative: refused (the driver compiles static sizes).
func.func @dynamic_slice_across(%x: tensor<?x4xf32>) -> tensor<?x4xf32> {
  // expected-error @+1 {{from a start counted from its end to an end counted from its start is not supported}}
  %0 = "kf.slice"(%x) {dim = 0 : i64, start = -3 : i64, end = 2 : i64, step = 1 : i64} : (tensor<?x4xf32>) -> tensor<?x4xf32>
  return %0 : tensor<?x4xf32>
}

// -----

// The top k along a static dim of rows of run-time number (a router's experts): the
// results and the taken mask are sized by the rows' run-time count.
// CHECK-LABEL: func.func @dynamic_topk
// CHECK: tensor.empty(%{{.*}}) : tensor<?x2xf32>
// CHECK: tensor.empty(%{{.*}}) : tensor<?x2xi64>
// CHECK: tensor.empty(%{{.*}}) : tensor<?x8xi1>
// CHECK: scf.for
// CHECK: tensor.insert_slice %{{.*}} into %{{.*}}[0, %{{.*}}] [%{{.*}}, 1] [1, 1] : tensor<?xf32> into tensor<?x2xf32>
func.func @dynamic_topk(%x: tensor<?x8xf32>) -> (tensor<?x2xf32>, tensor<?x2xi64>) {
  %v:2 = "kf.topk"(%x) {k = 2 : i64, dim = 1 : i64, largest = true} : (tensor<?x8xf32>) -> (tensor<?x2xf32>, tensor<?x2xi64>)
  return %v#0, %v#1 : tensor<?x2xf32>, tensor<?x2xi64>
}

// -----

// A reshape that merges a run-time dim with static ones, then splits it again: grouped
// by the static dims on either side (one group holds the run-time dims), collapsed and
// expanded; the split's run-time size is the merged size over the static rest.
// CHECK-LABEL: func.func @dynamic_reshape
// CHECK: tensor.collapse_shape %arg0 {{\[\[}}0, 1], [2, 3]] : tensor<2x?x4x8xf32> into tensor<?x32xf32>
// CHECK: %[[N:.*]] = tensor.dim %{{.*}}, %{{.*}} : tensor<?x32xf32>
// CHECK: %[[S:.*]] = arith.divui %[[N]], %{{.*}} : index
// CHECK: tensor.expand_shape %{{.*}} {{\[\[}}0, 1], [2]] output_shape [2, %[[S]], 32] : tensor<?x32xf32> into tensor<2x?x32xf32>
func.func @dynamic_reshape(%x: tensor<2x?x4x8xf32>) -> tensor<2x?x32xf32> {
  %0 = "kf.reshape"(%x) : (tensor<2x?x4x8xf32>) -> tensor<?x32xf32>
  %1 = "kf.reshape"(%0) : (tensor<?x32xf32>) -> tensor<2x?x32xf32>
  return %1 : tensor<2x?x32xf32>
}

// -----

// Two run-time dims split from one: which size is which is not in the types; refused.
func.func @dynamic_reshape_two(%x: tensor<?x32xf32>) -> tensor<?x?x32xf32> {
  // expected-error @+1 {{a reshape of [-1, 32] to [-1, -1, 32] with run-time sizes}}
  %0 = "kf.reshape"(%x) : (tensor<?x32xf32>) -> tensor<?x?x32xf32>
  return %0 : tensor<?x?x32xf32>
}

// -----

// Rotating half of a tensor of run-time length: the slices along the static dim keep
// the run-time dim's size (tensor.dim), and the concatenation's result takes it too.
// CHECK-LABEL: func.func @dynamic_rotate_half
// CHECK: %[[D:.*]] = tensor.dim %arg0, %{{.*}} : tensor<?x8xf32>
// CHECK: tensor.extract_slice %arg0[0, 4] [%[[D]], 4] [1, 1] : tensor<?x8xf32> to tensor<?x4xf32>
// CHECK: tensor.empty(%{{.*}}) : tensor<?x8xf32>
// CHECK: tensor.insert_slice %{{.*}} into %{{.*}}[0, 0] [%{{.*}}, 4] [1, 1] : tensor<?x4xf32> into tensor<?x8xf32>
// CHECK: tensor.insert_slice %{{.*}} into %{{.*}}[0, 4] [%{{.*}}, 4] [1, 1] : tensor<?x4xf32> into tensor<?x8xf32>
func.func @dynamic_rotate_half(%x: tensor<?x8xf32>) -> tensor<?x8xf32> {
  %hi = "kf.slice"(%x) {dim = 1 : i64, start = 4 : i64, end = 8 : i64, step = 1 : i64} : (tensor<?x8xf32>) -> tensor<?x4xf32>
  %lo = "kf.slice"(%x) {dim = 1 : i64, start = 0 : i64, end = 4 : i64, step = 1 : i64} : (tensor<?x8xf32>) -> tensor<?x4xf32>
  %0 = "kf.concat"(%hi, %lo) {dim = 1 : i64} : (tensor<?x4xf32>, tensor<?x4xf32>) -> tensor<?x8xf32>
  return %0 : tensor<?x8xf32>
}

// -----

// An embedding: a static table's rows gathered by an index of run-time length.
// CHECK-LABEL: func.func @dynamic_index_select
// CHECK: tensor.empty(%{{.*}}) : tensor<?x5xf32>
// CHECK: tensor.extract %arg0
func.func @dynamic_index_select(%x: tensor<7x5xf32>, %i: tensor<?xi64>) -> tensor<?x5xf32> {
  %0 = "kf.index_select"(%x, %i) {dim = 0} : (tensor<7x5xf32>, tensor<?xi64>) -> tensor<?x5xf32>
  return %0 : tensor<?x5xf32>
}

// -----

// kf.scan walks its dim with an scf.for carrying the running row (updated in place, in
// f32 for bf16) and the result, into which each step inserts its row rounded.
// CHECK-LABEL: func.func @scan
// CHECK: scf.for {{.*}} iter_args(%[[ACC:.*]] = %{{.*}}, %[[RES:.*]] = %{{.*}}) -> (tensor<3x1xf32>, tensor<3x5xbf16>)
// CHECK: tensor.extract_slice {{.*}} : tensor<3x5xbf16> to tensor<3x1xbf16>
// CHECK: linalg.generic {{.*}} outs(%[[ACC]] : tensor<3x1xf32>)
// CHECK: arith.addf
// CHECK: arith.truncf {{.*}} : f32 to bf16
// CHECK: tensor.insert_slice {{.*}} into %[[RES]]
// CHECK-NOT: kf.
func.func @scan(%x: tensor<3x5xbf16>) -> tensor<3x5xbf16> {
  %0 = "kf.scan"(%x) {dim = 1 : i64, kind = "sum"} : (tensor<3x5xbf16>) -> tensor<3x5xbf16>
  return %0 : tensor<3x5xbf16>
}
