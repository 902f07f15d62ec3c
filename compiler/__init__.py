"""kf: torch functions in, fused kernels out.

    import kf

    @kf.jit
    def layer_norm(x, weight, bias, eps=1e-5): ...

    kf.inspect(layer_norm, x, w, b).kf_ir   # the kf IR, with your source lines
"""

from .api import KfFunction, cuda_kernel, jit, metal_shader
from .capture import Captured, capture
from .errors import (
    CaptureError,
    CompileError,
    KfVerifyError,
    PassFailedError,
    SignatureError,
    SourceLoc,
    TargetError,
    UnsupportedOpError,
)
from .inspect import Inspection, inspect
from .options import Options

__version__ = "0.1.0"

__all__ = [
    "KfFunction", "Options", "cuda_kernel", "jit", "metal_shader",
    "Captured", "CaptureError", "CompileError", "Inspection", "KfVerifyError", "PassFailedError",
    "SignatureError", "SourceLoc", "TargetError", "UnsupportedOpError", "capture", "inspect",
]
