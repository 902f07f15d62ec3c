"""Every kf pass by name, loaded lazily so that listing passes imports none of them."""

from __future__ import annotations

import importlib
from dataclasses import dataclass

from .base import KfPass


@dataclass(frozen=True)
class PassEntry:
    name: str
    module: str  # module under kf.passes that defines the pass class
    cls: str
    description: str


_ENTRIES = [
    PassEntry("kf-verify", "verify", "VerifyPass", "check the shape and element-type rules of every kf op"),
    PassEntry("kf-canonicalize", "canonicalize", "CanonicalizePass",
              "fold constants, simplify broadcasts, reshapes and transposes, remove dead kf ops"),
    PassEntry("kf-widen-integers", "widen_integers", "WidenIntegersPass",
              "compute int8, uint8 and int16 values in i32, wrapping each result to its type"),
    PassEntry("kf-apply-precision", "apply_precision", "ApplyPrecisionPass",
              "apply a precision policy (fp32, tf32, bf16, fp16, fp8) inside functions; output types unchanged"),
    PassEntry("kf-recognize-moe", "recognize_moe", "RecognizeMoePass", "rewrite the dense MoE (every expert for every token) as route, two grouped GEMMs and combine"),
    PassEntry("kf-split-reductions", "split_reductions", "SplitReductionsPass",
              "full reductions of large tensors as parallel row reductions (reshape, reduce rows, reduce the partials)"),
    PassEntry("kf-split-scans", "split_scans", "SplitScansPass",
              "scans along many elements as a scan of blocks, a scan of their totals and a combine"),
    PassEntry("kf-fuse", "fuse", "FusePass",
              "partition functions into kernels (attention, rowwise, matmul, transpose, elementwise, generic)"),
    PassEntry("kf-share-kernels", "share_kernels", "ShareKernelsPass",
              "kernel functions that are the same function under another name become one, called from every site"),
    PassEntry("kf-to-spirv", "to_spirv", "ToSpirvPass", "lower gpu.module kernels to a validated SPIR-V binary (gpu.binary) for Vulkan"),
    PassEntry("kf-to-metal", "to_metal", "ToMetalPass", "SPIR-V through SPIRV-Cross to MSL, with threadgroup sizes and buffer indices"),
    PassEntry("kf-to-cuda", "to_cuda", "ToCudaPass", "lower gpu.module kernels through NVVM to PTX (gpu.binary)"),
    PassEntry("kf-lower-to-linalg", "lower_to_linalg", "LowerToLinalgPass", "rewrite kf ops into linalg/tensor/arith/math/scf on tensors"),
    PassEntry("kf-tile", "tile", "TilePass", "record each kernel function's strategy plan (tile sizes, launch geometry) as kf.plan"),
    PassEntry("kf-map-to-gpu", "map_to_gpu", "MapToGpuPass", "write each kernel function as a gpu.func in gpu.module @kf_kernels"),
    PassEntry("kf-linalg-to-gpu", "linalg_to_gpu", "LinalgToGpuPass",
              "GPU kernels for torch-mlir's linalg functions (kf.aten), launched in the schedule"),
    PassEntry("kf-promote-shared", "promote_shared", "PromoteSharedPass", "copy rows read in several phases into workgroup memory once (rowwise kernels)"),
    PassEntry("kf-vectorize", "vectorize", "VectorizePass", "128-bit vector loads/stores for row loops over the contiguous dimension, scalar tails"),
    PassEntry("kf-to-cpu", "to_cpu", "ToCpuPass", "destination-passing style, bufferize, lower linalg on tensors to LLVM"),
]

REGISTRY: dict[str, PassEntry] = {e.name: e for e in _ENTRIES}


def register(entry: PassEntry) -> None:
    """Add a pass to the registry (kf's own passes are listed above)."""
    REGISTRY[entry.name] = entry


def is_kf_pass(name: str) -> bool:
    return name in REGISTRY


def pass_class(name: str) -> type[KfPass]:
    """The class of the kf pass called name; imports its module on first use."""
    entry = REGISTRY[name]
    module = importlib.import_module(f"kf.passes.{entry.module}")
    return getattr(module, entry.cls)


def create(name: str, options: dict[str, str] | None = None) -> KfPass:
    """An instance of the kf pass called name with textual options."""
    return pass_class(name).from_options(options or {})
