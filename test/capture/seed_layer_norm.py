# RUN: %PYTHON %s | FileCheck %s
# The seed's layer norm, exactly as the user wrote it, captures to kf ops located at
# the user's lines (seed_examples.py lines 41-44); eps, a float, is read at run time.
import torch

import kf
from seed_examples import metal_layer_norm

x, w, b = torch.randn(1, 256, 1024), torch.randn(1024), torch.randn(1024)
print(kf.inspect(metal_layer_norm, x, w, b).kf_ir)

# CHECK-LABEL: func.func @metal_layer_norm
# CHECK-SAME: %arg0: tensor<1x256x1024xf32> {kf.name = "x"}
# CHECK-SAME: %arg1: tensor<1024xf32> {kf.name = "weight"}
# CHECK-SAME: %arg3: tensor<f32> {kf.name = "eps"}
# CHECK: "kf.mean"(%arg0) {dims = array<i64: 2>, keepdim = true} : (tensor<1x256x1024xf32>) -> tensor<1x256x1xf32> loc("{{.*}}seed_examples.py":41:5)
# CHECK: "kf.var"(%arg0) {correction = 1.000000e+00 : f64, dims = array<i64: 2>, keepdim = true} {{.*}} loc("{{.*}}seed_examples.py":42:5)
# CHECK: "kf.sub"(%arg0, %0) {{.*}} loc("{{.*}}seed_examples.py":43:5)
# CHECK: "kf.add"({{.*}}, %arg3) {{.*}} loc("{{.*}}seed_examples.py":43:5)
# CHECK: "kf.sqrt"
# CHECK: "kf.div"
# CHECK: "kf.mul"(%arg1, {{.*}} loc("{{.*}}seed_examples.py":44:5)
# CHECK: "kf.add"({{.*}}, %arg2) {{.*}} loc("{{.*}}seed_examples.py":44:5)
# CHECK: return
