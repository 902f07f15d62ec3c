"""The pipeline driver: from a call signature to a ready program.

    capture -> kf (kf-canonicalize) -> per target:
      cpu:           kf-lower-to-linalg -> kf-to-cpu -> shared object
      cuda / vulkan: kf-fuse -> kf-tile -> kf-map-to-gpu -> kf-promote-shared -> kf-vectorize
                     -> kf-to-cuda (PTX) | kf-to-spirv (SPIR-V) [-> kf-to-metal (MSL)]

A compiled program is stored in the disk cache (cache.py) and loaded from there by the
runtime alone, so a later process with the same key never imports MLIR.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any, Callable

from . import cache
from .errors import TargetError
from .options import Options
from .results import unflatten
from .signature import Signature


# ----------------------------------------------------------------------------- programs


class InterpretedProgram:
    """Runs the captured kf IR with torch, op by op (see interpreter.py)."""

    def __init__(self, cap):
        from .interpreter import Interpreter

        self.captured = cap
        self._interp = Interpreter(cap.module, cap.name, cap.fallbacks)

    def __call__(self, tensors: list):
        return unflatten(self.captured.output_tree, self._interp.run(*tensors))


class CompiledProgram:
    """A program loaded from the cache: the target's launcher plus the result structure."""

    def __init__(self, launcher: Callable, tree: Any, meta: dict, directory: Path):
        self._launch = launcher
        self._tree = tree
        self.meta = meta
        self.directory = directory

    def __call__(self, tensors: list):
        return unflatten(self._tree, list(self._launch(*tensors)))


def _load(entry: cache.Entry) -> CompiledProgram:
    from kf.runtime.abi import ProgramABI

    from kf.runtime import programs

    meta = entry.meta
    abi = ProgramABI.from_json(meta["abi"])
    tree = json.loads(meta["output_tree"])
    launcher = programs.load(abi, str(entry.directory), meta)
    return CompiledProgram(launcher, _tuple_tree(tree), meta, entry.directory)


def _tuple_tree(tree):
    kind, payload = tree
    if kind == "tensor":
        return (kind, payload)
    return (kind, [_tuple_tree(t) for t in payload])


# ----------------------------------------------------------------------------- compile


def target_arch(options: Options) -> str:
    """The architecture a target compiles for: sm_XX of the current CUDA device."""
    if options.target != "cuda":
        return ""
    if options.arch:
        return options.arch
    import torch

    if torch.cuda.is_available():
        major, minor = torch.cuda.get_device_capability()
        return f"sm_{major}{minor}"
    return "sm_90"


def compile_function(fn: Callable, sig: Signature, tensors: list, options: Options):
    """A callable that takes the flat tensor arguments and returns the function's results."""
    if options.interpret:
        from .capture import capture_signature

        return InterpretedProgram(capture_signature(fn, sig, tensors))
    arch = target_arch(options)
    key = cache.key(fn, sig, options, arch)
    entry = cache.load(key)
    if entry is None:
        meta, artifacts = build(fn, sig, tensors, options, arch)
        entry = cache.store(key, meta, artifacts)
    return _load(entry)


def build(fn: Callable, sig: Signature, tensors: list, options: Options, arch: str,
          log=None) -> tuple[dict, dict[str, bytes]]:
    """Compile one specialization: (metadata, artifacts) for the cache."""
    from .capture import capture_signature
    from .stages import StageLog, dump_dir_for, run_passes

    cap = capture_signature(fn, sig, tensors)
    log = log or StageLog(cap.name, dump_dir_for(options.dump_ir))
    log.record("kf", cap.module)
    run_passes(cap.module, ["kf-canonicalize"], log)
    extra_meta: dict = {}
    if options.target == "cpu":
        abi, artifacts = _build_cpu(cap, log)
    elif options.target in ("cuda", "vulkan", "metal"):
        abi, artifacts, extra_meta = _build_gpu(cap, log, options.target, arch)
    else:
        raise TargetError(f"unknown target {options.target}")
    meta = {
        "name": cap.name,
        "signature": sig.describe(),
        "abi": abi.to_json(),
        "output_tree": json.dumps(cap.output_tree),
        "compile_seconds": log.seconds,
        **extra_meta,
    }
    return meta, artifacts


#: The GPU pipeline after kf-canonicalize; {t} is the strategies' target (cuda, spirv).
GPU_PASSES = ["kf-fuse", "kf-tile{{target={t}{chip}}}", "kf-map-to-gpu{{target={t}{chip}}}",
              "kf-promote-shared", "kf-vectorize"]


def gpu_passes(target: str, arch: str) -> list[str]:
    """The kf passes from fused kernels to the gpu.module, for registered passes only
    (kf-promote-shared and kf-vectorize are optimizations: a build without them is correct)."""
    from kf.passes import registry

    t = "cuda" if target == "cuda" else "spirv"
    chip = f" chip={arch}" if target == "cuda" and arch else ""
    out = []
    for p in GPU_PASSES:
        name = p.split("{")[0]
        if registry.is_kf_pass(name):
            out.append(p.format(t=t, chip=chip))
    return out


def _build_gpu(cap, log, target: str, arch: str):
    from . import gpu_codegen
    from .stages import run_passes

    gpu_codegen.reject_fallbacks(cap.module, cap.name, target)
    passes = gpu_passes(target, arch)
    run_passes(cap.module, passes, log, record_after={passes[0]: "fused", passes[-1]: "gpu"})
    abi, constants, repeats = gpu_codegen.schedule_abi(cap.module, cap.name, cap.input_names, target)
    if target == "cuda":
        abi, artifacts = gpu_codegen.lower_cuda(cap.module, abi, arch, log)
    else:
        abi, artifacts = gpu_codegen.lower_spirv(cap.module, abi, log, metal=target == "metal")
    blob, table = b"", []
    for arg, data in constants:
        table.append({"offset": len(blob), "nbytes": len(data), "shape": list(arg.shape), "elem": arg.elem})
        blob += data + b"\0" * (-len(data) % 16)
    if table:
        artifacts["constants.bin"] = blob
    return abi, artifacts, {"constants": table, "repeats": repeats}


def _build_cpu(cap, log):
    from kf.runtime.abi import ProgramABI, TensorArg

    from .cpu_codegen import _func, _signature, link_shared_object
    from .stages import run_passes

    entry = _func(cap.module, cap.name)
    ins, outs = _signature(entry)
    ins = tuple(TensorArg(n, a.shape, a.elem) for n, a in zip(cap.input_names, ins))
    if "arg_attrs" in entry.attributes:  # parameter names are for people; the ABI has them
        del entry.attributes["arg_attrs"]
    run_passes(cap.module, ["kf-lower-to-linalg", "kf-to-cpu"], log,
               record_after={"kf-lower-to-linalg": "linalg", "kf-to-cpu": "llvm"})
    with tempfile.TemporaryDirectory(prefix="kf-cpu-") as tmp:
        so = link_shared_object(cap.module, os.path.join(tmp, f"{cap.name}.so"))
        data = Path(so).read_bytes()
    from kf.runtime.abi import KernelABI

    kernel = KernelABI(entry=f"_mlir_ciface_{cap.name}", args=tuple(range(len(ins) + len(outs))),
                       artifact=f"{cap.name}.so", fused_lines=tuple(sorted({str(l) for l in cap.source_locs.values()})))
    return ProgramABI(target="cpu", inputs=ins, outputs=outs, kernels=(kernel,)), {f"{cap.name}.so": data}


# ----------------------------------------------------------------------------- inspect


def inspect_function(fn: Callable, sig: Signature, tensors: list, options: Options):
    """Every stage's text for one specialization; stages after kf compile lazily."""
    from .capture import capture_signature
    from .inspection import Inspection
    from .stages import StageLog, dump_dir_for

    cap = capture_signature(fn, sig, tensors)

    def compile_rest() -> dict:
        log = StageLog(cap.name, dump_dir_for(options.dump_ir))
        build(fn, sig, tensors, options.with_(interpret=False), target_arch(options), log)
        return log.texts

    return Inspection(cap.name, sig.describe(), cap.kf_ir, cap, compile_rest)
