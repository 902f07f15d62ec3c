# RUN: %PYTHON %s 2>&1 | FileCheck %s
# Failures in capture name the user's line; nothing else reaches the screen.
import torch

import kf


def run(f):
    print(f"TEST: {f.__name__}")
    f()
    return f


@run
def unsupported_op():
    def uses_airy_ai(x):
        y = x * 2
        return torch.special.airy_ai(y)  # torch-mlir has no lowering of airy_ai either

    try:
        kf.inspect(uses_airy_ai, torch.randn(16))
    except kf.UnsupportedOpError as e:
        print(e)
# CHECK-LABEL: TEST: unsupported_op
# CHECK: aten.special_airy_ai.default has no kf op and torch-mlir could not lower it
# CHECK-NEXT: File "{{.*}}errors.py", line 18, in uses_airy_ai
# CHECK-NEXT: return torch.special.airy_ai(y)
# CHECK-NEXT: stage: capture
# CHECK-NEXT: cause: torch-mlir: Lowering TorchFX IR -> Torch Backend IR failed


@run
def fallback_through_torch_mlir():
    def uses_bilinear(a, b, w):
        return torch.nn.functional.bilinear(a, b, w) + 1

    print(kf.inspect(uses_bilinear, torch.randn(4, 3), torch.randn(4, 5), torch.randn(2, 3, 5)).kf_ir)
# CHECK-LABEL: TEST: fallback_through_torch_mlir
# (bilinear's _trilinear has no kf op: torch-mlir's lowering is a function of its own)
# CHECK: func.func private @kf_aten__trilinear_default_0(%arg0: tensor<4x3xf32> loc("{{.*}}errors.py":35:{{[0-9]+}}), {{.*}} -> tensor<4x2xf32> attributes {kf.aten = "aten._trilinear.default"}
# CHECK: func.func @uses_bilinear
# CHECK: call @kf_aten__trilinear_default_0({{.*}}) : (tensor<4x3xf32>, tensor<2x3x5xf32>, tensor<4x5xf32>) -> tensor<4x2xf32> loc("{{.*}}errors.py":35:{{[0-9]+}})
# CHECK: "kf.add"


@run
def ill_typed():
    def bad_matmul(a, b):
        return torch.matmul(a, b)

    try:
        kf.inspect(bad_matmul, torch.randn(4, 8), torch.randn(7, 3))
    except kf.CompileError as e:
        print(type(e).__name__)
        print(e)
# CHECK-LABEL: TEST: ill_typed
# CHECK: CaptureError
# CHECK: torch.export could not trace bad_matmul
# CHECK-NEXT: File "{{.*}}errors.py", line 49, in bad_matmul
# CHECK: stage: capture
# CHECK: cause: RuntimeError: {{.*}}


@run
def wrong_argument():
    def f(x, scale):
        return x * scale

    try:
        kf.inspect(f, torch.randn(4), object())
    except kf.SignatureError as e:
        print(e)
# CHECK-LABEL: TEST: wrong_argument
# CHECK: f(): argument 'scale' is a object; kf functions take tensors


@run
def verifier_error_names_the_line():
    # Plant a wrong conversion (mul lowered to matmul): kf's verifier rejects the op it
    # makes, and the error names the user's line, not kf's code.
    from kf import aten_to_kf
    from kf.dialects import builders

    def wrong_mul(c, node, args, kwargs):
        return builders.build("matmul", [args[0], args[1]], result_types=None).result

    saved = aten_to_kf.HANDLERS["aten.mul.Tensor"]
    aten_to_kf.HANDLERS["aten.mul.Tensor"] = wrong_mul

    def scale(x, y):
        return x * y

    try:
        kf.inspect(scale, torch.randn(4, 8), torch.randn(4, 8))
    except kf.KfVerifyError as e:
        print(e)
    finally:
        aten_to_kf.HANDLERS["aten.mul.Tensor"] = saved
# CHECK-LABEL: TEST: verifier_error_names_the_line
# CHECK: aten.mul.Tensor produced an ill-typed kf op: contracting dimensions differ: lhs [4, 8] has 8, rhs [4, 8] has 4
# CHECK-NEXT: File "{{.*}}errors.py", line 91, in scale
# CHECK-NEXT: return x * y
# CHECK-NEXT: stage: verify
