# RUN: %PYTHON %s | FileCheck %s
# The seed's fused_attention, with and without the mask: `if mask is not None` runs at
# capture time, so the two signatures capture to two specializations.
import torch

import kf
from seed_examples import fused_attention

q, k, v = (torch.randn(2, 8, 256, 64) for _ in range(3))
print(kf.inspect(fused_attention, q, k, v).kf_ir)
# CHECK-LABEL: func.func @fused_attention
# CHECK-SAME: {kf.name = "q"}
# CHECK-NOT: kf.name = "mask"
# CHECK: "kf.transpose"(%arg1) {perm = array<i64: 0, 1, 3, 2>} {{.*}} loc("{{.*}}seed_examples.py":14:5)
# CHECK: "kf.matmul"(%arg0, %0) : (tensor<2x8x256x64xf32>, tensor<2x8x64x256xf32>) -> tensor<2x8x256x256xf32> loc("{{.*}}seed_examples.py":14:5)
# CHECK: "kf.fill"() {value = 8.000000e+00 : f64}
# CHECK: "kf.div"
# CHECK-NOT: kf.masked_fill
# CHECK: "kf.softmax"({{.*}}) {dim = -1 : i64} {{.*}} loc("{{.*}}seed_examples.py":17:5)
# CHECK: "kf.matmul"({{.*}}, %arg2) {{.*}} loc("{{.*}}seed_examples.py":18:5)

mask = (torch.rand(256, 256) > 0.5).float()
print(kf.inspect(fused_attention, q, k, v, mask).kf_ir)
# CHECK-LABEL: func.func @fused_attention
# CHECK-SAME: %arg3: tensor<256x256xf32> {kf.name = "mask"}
# CHECK: "kf.cmp"(%arg3, {{.*}}) {predicate = "eq"} : (tensor<256x256xf32>, tensor<f32>) -> tensor<256x256xi1> loc("{{.*}}seed_examples.py":16:9)
# CHECK: "kf.masked_fill"({{.*}}) {value = -1.000000e+09 : f64} : (tensor<2x8x256x256xf32>, tensor<256x256xi1>) -> tensor<2x8x256x256xf32> loc("{{.*}}seed_examples.py":16:9)
# CHECK: "kf.softmax"
