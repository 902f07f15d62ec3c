# RUN: %PYTHON %s | FileCheck %s
# The complete MoE layer (examples/moe.py): gate matmul, top-k, softmax over the chosen
# experts, routing weights, and each expert's GELU(x @ w_in[e]) @ w_out[e]. top_k=2 is
# a Python constant: the loop over k is unrolled at capture time.
import torch

import kf
from moe import moe_layer_fused

x, gate = torch.randn(2, 16, 64), torch.randn(4, 64)
w_in, w_out = torch.randn(4, 64, 128), torch.randn(4, 128, 64)
print(kf.inspect(moe_layer_fused, x, gate, [w_in, w_out], top_k=2).kf_ir)

# CHECK-LABEL: func.func @moe_layer_fused
# CHECK-SAME: {kf.name = "expert_weights.0"}
# CHECK-SAME: {kf.name = "expert_weights.1"}
# CHECK: "kf.matmul"(%arg0, {{.*}}) : (tensor<2x16x64xf32>, tensor<64x4xf32>) -> tensor<2x16x4xf32> loc("{{.*}}moe.py":20:5)
# CHECK: "kf.topk"({{.*}}) {dim = 2 : i64, k = 2 : i64, largest = true} : (tensor<2x16x4xf32>) -> (tensor<2x16x2xf32>, tensor<2x16x2xi64>) loc("{{.*}}moe.py":23:5)
# CHECK: "kf.softmax"({{.*}}#0) {dim = -1 : i64} {{.*}} loc("{{.*}}moe.py":26:5)
# CHECK: "kf.cmp"{{.*}}predicate = "eq"{{.*}} loc("{{.*}}moe.py":34:9)
# CHECK: "kf.gelu"({{.*}}) {approximate = "none"} : (tensor<2x16x128xf32>) -> tensor<2x16x128xf32> loc("{{.*}}moe.py":41:9)
# CHECK: "kf.matmul"({{.*}}) : (tensor<2x16x128xf32>, tensor<128x64xf32>) -> tensor<2x16x64xf32> loc("{{.*}}moe.py":42:9)
# CHECK-COUNT-3: "kf.gelu"
# CHECK: return {{.*}} : tensor<2x16x64xf32>
