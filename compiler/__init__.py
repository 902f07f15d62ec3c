"""kf: torch functions in, fused kernels out.

    import kf

    @kf.jit                      # or @kf.cuda_kernel, @kf.metal_shader
    def layer_norm(x, weight, bias, eps=1e-5): ...

    kf.inspect(layer_norm, x, w, b).kf_ir   # the kf IR, with your source lines

Names load lazily: ``import kf`` imports neither torch nor MLIR, so ``kf-opt`` stays
torch-free and a cache hit in a new process reaches its launch without MLIR.
"""

from __future__ import annotations

import importlib

__version__ = "0.1.0"

_EXPORTS = {
    "jit": "api", "cuda_kernel": "api", "metal_shader": "api", "KfFunction": "api",
    "Options": "options",
    "Captured": "capture",
    "inspect": "api", "Inspection": "inspection",
    "CompileError": "errors", "CaptureError": "errors", "UnsupportedOpError": "errors",
    "KfVerifyError": "errors", "PassFailedError": "errors", "TargetError": "errors", "MutationError": "errors",
    "SignatureError": "errors", "SourceLoc": "errors", "IndexOutOfRange": "errors",
    # debugging and profiling (the modules' names differ from the functions', as
    # inspection.py's does from kf.inspect: importing kf.explain the module would
    # otherwise replace kf.explain the function)
    "profile": "profiler", "explain": "explanation", "bisect": "bisection",
    # PyTorch integration (every kf function is also torch.ops.kf.<name>: torch_ops.py)
    "patch": "patching", "unpatch": "patching", "PatchReport": "patching",
    # fp8 scaling (precision="fp8" quantizes by each tensor's own amax; these keep a history)
    "DelayedScaling": "fp8_scaling", "fp8_amax": "fp8_scaling", "fp8_quantize": "fp8_scaling",
}

__all__ = sorted(_EXPORTS)


#: subpackages reached as attributes (``kf.nn.fused_linear_cross_entropy`` after ``import kf``)
_SUBPACKAGES = ("nn",)


def __getattr__(name: str):
    if name in _SUBPACKAGES:
        return importlib.import_module(f"kf.{name}")
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'kf' has no attribute '{name}'")
    value = getattr(importlib.import_module(f"kf.{module}"), name)
    globals()[name] = value
    return value


def __dir__():
    return sorted(set(globals()) | set(_EXPORTS))
