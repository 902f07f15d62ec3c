"""The pipeline driver: from a call signature to a ready program.

    capture -> kf (kf-canonicalize [, kf-apply-precision, kf-canonicalize]) -> per target:
      cpu:           kf-lower-to-linalg -> kf-to-cpu -> shared object
      cuda / vulkan: kf-split-reductions -> kf-fuse -> kf-tile -> kf-map-to-gpu -> kf-promote-shared -> kf-vectorize
                     -> kf-to-cuda (PTX) | kf-to-spirv (SPIR-V) [-> kf-to-metal (MSL)]

A compiled program is stored in the disk cache (cache.py) and loaded from there by the
runtime alone (programs.py), so a later process with the same key never imports MLIR.
"""

from __future__ import annotations

import json
import os
import tempfile
import time
from pathlib import Path
from typing import Callable

from . import cache, logs
from .errors import CompileError, SourceLoc, TargetError
from .options import Options
from .programs import InterpretedProgram, load
from .signature import Signature


# ----------------------------------------------------------------------------- compile


def _code_lines(code) -> frozenset:
    """Source lines of a code object and the code nested in it (lambdas, comprehensions)."""
    lines = {line for _, _, line in code.co_lines() if line is not None}
    for c in code.co_consts:
        if hasattr(c, "co_lines"):
            lines |= _code_lines(c)
    return frozenset(lines)


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0][:300] if text else ""


def _user_code(fn: Callable):
    import inspect

    return inspect.unwrap(fn).__code__


def target_arch(options: Options) -> str:
    """The architecture a target compiles for: sm_XX of the current CUDA device, and
    sm_90a on Hopper (as Triton does: its arch-specific instructions, wgmma among them,
    run only on sm_90 itself; kf's cubins are built per device anyway). Without a GPU,
    sm_90a, the H200 kf is measured on. For Vulkan and Metal, the device's limits that
    the strategies tile for (``kf.runtime.abi.DeviceLimits.spec()``): ``arch`` when
    given, else the Vulkan device's own; "" (the limits' defaults) for Metal and where
    there is no Vulkan device."""
    if options.target in ("vulkan", "metal"):
        if options.arch:
            from kf.runtime.abi import DeviceLimits

            return DeviceLimits.parse(options.arch).spec()
        if options.target == "metal":
            return ""
        from kf.runtime import vulkan

        return vulkan.device().target_limits().spec() if vulkan.is_available() else ""
    if options.target != "cuda":
        return ""
    if options.arch:
        return options.arch
    import torch

    if torch.cuda.is_available():
        major, minor = torch.cuda.get_device_capability()
        return "sm_90a" if (major, minor) == (9, 0) else f"sm_{major}{minor}"
    return "sm_90a"


def target_multiprocessors(target: str) -> int:
    """The streaming multiprocessors of the current CUDA device, which persistent kernels
    start one workgroup on each (part of the cache key, as the arch is); without a GPU,
    the H200's 132, as ``target_arch`` takes its sm_90a. 0 for other targets."""
    if target != "cuda":
        return 0
    import torch

    if torch.cuda.is_available():
        return torch.cuda.get_device_properties(torch.cuda.current_device()).multi_processor_count
    return 132  # strategies.base.DEFAULT_MULTIPROCESSORS (not imported: a cache hit imports no MLIR)


def device_key(options: Options) -> str:
    """What the compiled code depends on of the device, for the cache key: the
    architecture (Vulkan and Metal: the device's limits) and the multiprocessors
    (persistent kernels' grids)."""
    return f"{target_arch(options)} {target_multiprocessors(options.target)}"


def debug() -> bool:
    """KF_DEBUG=1 keeps kf's own frames in the traceback of a CompileError."""
    return os.environ.get("KF_DEBUG", "") not in ("", "0")


def _user_facing(e: CompileError) -> CompileError:
    """The error without the compiler's frames below this one (Triton hides its own the
    same way): the traceback ends in a few frames of kf's API above the user's call,
    and the message, not a stack of passes, says what failed where."""
    return e.with_traceback(None)


def compile_function(fn: Callable, sig: Signature, tensors: list, options: Options, reads=None):
    """A callable that takes the flat tensor arguments, then the reached tensors it reads
    (``program.reached``: indices into ``reads.tensors``; reads: guards.walk(fn), walked
    here if not given), and returns the function's results.

    A cached entry that fails to load (the cache checked its digest; this is the runtime's
    turn: a .so that does not open, a module the driver refuses) is corrupt: reported,
    removed and compiled again. An entry removed by another process between its store
    and its load is stored again from the artifacts in hand."""
    if reads is None:
        from .guards import walk

        reads = walk(fn)
    try:
        if options.interpret:
            from .capture import capture_signature
            from .stages import StageLog, dump_dir_for

            cap = capture_signature(fn, sig, tensors, reads.tensors, reads.labels)
            reads.baked = cap.unsourced
            apply_precision(cap, options, StageLog(cap.name, dump_dir_for(options.dump_ir)))
            return InterpretedProgram(cap, options.target)
        arch = target_arch(options)
        key = cache.key(fn, sig, options, device_key(options), reads)
        name = getattr(fn, "__name__", type(fn).__name__)
        skip = _skip_cache(options, reads)
        if skip:
            logs.cache_log.info("%s%s: not loaded from the disk cache: %s", name, sig.describe(), skip)
        entry = cache.load(key) if not skip else None
        if entry is not None:
            try:
                program = load(entry, len(reads.tensors))
                logs.cache_log.info("%s%s: loaded from the disk cache (%s)", name, sig.describe(), entry.directory)
                return program
            except Exception as e:
                if _unavailable(e):
                    raise
                if (entry.directory / "program.json").exists():  # else removed meanwhile: compile it again
                    cache.discard(entry.directory, key, f"it does not load: {type(e).__name__}: {_first_line(e)}")
        start = time.perf_counter()
        meta, artifacts = build(fn, sig, tensors, options, arch, reads=reads)
        logs.compile_log.info("compiled %s%s for %s%s in %.2f s", name, sig.describe(), options.target,
                              f" ({arch})" if arch else "", time.perf_counter() - start)
    except CompileError as e:
        if debug():
            raise
        raise _user_facing(e) from None
    for attempt in range(3):
        entry = cache.store(key, meta, artifacts)
        try:
            return load(entry, len(reads.tensors))
        except Exception:
            if attempt == 2 or (entry.directory / "program.json").exists():
                raise
            # removed by another process between the store and the load: store it again


def _skip_cache(options: Options, reads) -> str:
    """Why a compile must not load its program from the disk cache, or "": KF_ALWAYS_COMPILE
    asks for a fresh compile (the result is still stored), KF_DUMP_IR needs the stages
    run to write them, and reads that cannot be named in another process have no
    entry."""
    if os.environ.get("KF_ALWAYS_COMPILE", "") not in ("", "0"):
        return "KF_ALWAYS_COMPILE is set"
    if options.dump_ir or os.environ.get("KF_DUMP_IR", ""):
        return "the IR is dumped (KF_DUMP_IR or dump_ir=)"
    if not reads.persistent:
        return "it reads values that cannot be named in another process (" + ", ".join(reads.unstable[:3]) + ")"
    return ""


def _unavailable(e: BaseException) -> bool:
    """An error that says the target cannot run here (no Vulkan, no Metal), not that the
    entry is damaged."""
    from kf.runtime.metal import MetalUnavailable
    from kf.runtime.vulkan import VulkanUnavailable

    return isinstance(e, (MetalUnavailable, VulkanUnavailable))


def build(fn: Callable, sig: Signature, tensors: list, options: Options, arch: str,
          log=None, reads=None) -> tuple[dict, dict[str, bytes]]:
    """Compile one specialization: (metadata, artifacts) for the cache. ``reads``:
    guards.walk(fn), walked here if not given; the reached tensors the function uses are
    the program's last inputs (``meta["reached"]``)."""
    from .capture import capture_signature
    from .stages import StageLog, dump_dir_for, run_passes

    if reads is None:
        from .guards import walk

        reads = walk(fn)
    code = _user_code(fn)
    where = SourceLoc(code.co_filename, code.co_firstlineno, 1, code.co_name)
    start = time.perf_counter()
    try:
        cap = capture_signature(fn, sig, tensors, reads.tensors, reads.labels)
        reads.baked = cap.unsourced
    except CompileError:
        raise
    except Exception as e:  # a bug in kf's ATen conversion (there is no IR to save yet)
        if debug():
            raise
        raise CompileError(f"{code.co_name}: internal compiler error during capture", where, stage="capture",
                           cause=f"{type(e).__name__}: {_first_line(e)} (KF_DEBUG=1 shows kf's traceback)") from None
    log = log or StageLog(cap.name, dump_dir_for(options.dump_ir))
    log.seconds["capture"] = time.perf_counter() - start
    log.default_loc = where
    log.function_lines = _code_lines(code)
    log.record("kf", cap.module)
    try:
        run_passes(cap.module, ["kf-canonicalize"], log)
        apply_precision(cap, options, log)
        extra_meta: dict = {}
        if options.target == "cpu":
            abi, artifacts = _build_cpu(cap, log)
        elif options.target in ("cuda", "vulkan", "metal"):
            abi, artifacts, extra_meta = _build_gpu(cap, log, options.target, arch, options.variants)
        else:
            raise TargetError(f"unknown target {options.target}")
    except CompileError:
        raise
    except Exception as e:
        # A bug in kf, not in the user's code: still a CompileError at their function,
        # with the IR it happened on saved for the report.
        if debug():
            raise
        from .stages import save_reproducer

        path = save_reproducer(log, cap.module.operation.get_asm(enable_debug_info=True))
        raise CompileError(f"{cap.name}: internal compiler error", log.default_loc, stage="compile",
                           cause=f"{type(e).__name__}: {_first_line(e)} (KF_DEBUG=1 shows kf's traceback)",
                           reproducer=path) from None
    meta = {
        "name": cap.name,
        "signature": sig.describe(),
        "abi": abi.to_json(),
        "output_tree": json.dumps(cap.output_tree),
        "compile_seconds": log.seconds,
        "random_state": cap.random_input,
        "mutations": [m.to_json() for m in cap.mutations],
        "reached": cap.reached,
        # what cannot be named in another process, or holds tensors the walk did not find,
        # stays in this one (cache.store)
        "private": not reads.persistent or bool(cap.unsourced),
        # [output, input] where eager returns the input tensor itself, [output, earlier output]
        # where it returns one tensor twice: the call returns them so too
        "returns_inputs": [[j, a[1]] for j, a in enumerate(cap.eager_aliases) if a is not None and a[0] == "input"],
        "same_results": [[j, k] for j, k in enumerate(cap.eager_repeats) if k >= 0],
        **extra_meta,
    }
    return meta, artifacts


def precision_passes(options: Options) -> list[str]:
    """The kf-level passes of ``options.precision`` (none for ``auto``): the policy
    (passes/apply_precision.py), then kf-canonicalize for the identity casts it leaves.

    fp8 matmul operands are fp8 tensors only on CUDA, whose tensor cores multiply them;
    elsewhere the E4M3FN values are carried in f32 (``fp8-storage=false``: the same
    products and f32 sums): kf-to-spirv stores no fp8 tensors, and the CPU would widen
    each fp8 operand into an f32 copy before its matmul anyway.

    On CUDA, attention is quantized only where the fp8 attention kernel takes it (sm_90a:
    head dims 128 or 256, whole 128-key blocks, no mask; ``fp8-attention=kernel``; on
    other chips there is none, ``fp8-attention=none``); elsewhere it stays 16-bit, as
    its fp8 products would run on CUDA cores, several times slower than the bf16
    tensor-core kernel (passes/apply_precision.py, ``_sixteen_bit_attention``)."""
    if options.precision == "auto":
        return []
    extra = ""
    if options.precision == "fp8":
        if options.target != "cuda":
            extra = " fp8-storage=false"
        else:
            extra = " fp8-attention=" + ("kernel" if target_arch(options) == "sm_90a" else "none")
    return [f"kf-apply-precision{{precision={options.precision}{extra}}}", "kf-canonicalize"]


def apply_precision(cap, options: Options, log) -> None:
    """Run the precision policy's passes on a captured function's kf IR, in place."""
    from .stages import run_passes

    passes = precision_passes(options)
    if passes:
        run_passes(cap.module, passes, log)


#: The GPU pipeline after kf-canonicalize; {t} is the strategies' target (cuda, spirv).
GPU_PASSES = ["kf-recognize-moe", "kf-split-reductions", "kf-fuse", "kf-tile{{target={t}{chip}}}", "kf-map-to-gpu{{target={t}{chip}}}",
              "kf-promote-shared", "kf-vectorize"]


def gpu_passes(target: str, arch: str, variants: str = "") -> list[str]:
    """The kf passes from fused kernels to the gpu.module, for registered passes only
    (kf-promote-shared and kf-vectorize are optimizations: a build without them is correct).
    ``variants``: kernel variants (``Options.variants``), kf-tile's options."""
    from kf.passes import registry

    t = "cuda" if target == "cuda" else "spirv"
    chip = f" chip={arch}" if target == "cuda" and arch else ""
    if target == "cuda":
        chip += f" multiprocessors={target_multiprocessors(target)}"
    elif arch:
        chip = f" limits={arch}"  # the Vulkan device's limits (target_arch)
    out = []
    for p in GPU_PASSES:
        name = p.split("{")[0]
        if registry.is_kf_pass(name):
            p = p.format(t=t, chip=chip)
            if name == "kf-tile" and variants.strip():
                p = p[:-1] + " " + " ".join(variants.split()) + "}"
            out.append(p)
    return out


def _record_linalg(cap, log) -> None:
    """The linalg form of the function (what the CPU target compiles), for kf.inspect: GPU
    kernels are written from the fused kf IR instead, so this runs on a copy."""
    from mlir import ir

    from kf.passes import pipeline

    with cap.context:
        copy = ir.Module.parse(cap.module.operation.get_asm(enable_debug_info=True))
        pm, _ = pipeline.build("builtin.module(kf-lower-to-linalg)", cap.context)
        try:
            pm.run(copy.operation)
        except ir.MLIRError:
            return  # the stage is informative only; the GPU build does not use it
        log.texts["linalg"] = copy.operation.get_asm(enable_debug_info=True, use_local_scope=True)


def _build_gpu(cap, log, target: str, arch: str, variants: str = ""):
    from . import gpu_codegen
    from .stages import run_passes

    gpu_codegen.reject_fallbacks(cap.module, cap.name, target)
    if log.inspecting:
        _record_linalg(cap, log)
    _check_variants(cap.name, variants, log.default_loc)
    passes = gpu_passes(target, arch, variants)
    record = {next(p for p in passes if p.startswith("kf-fuse")): "fused", passes[-1]: "gpu"}
    # Kernel bodies (for FLOPs) and plans are both there after kf-tile, and only then:
    # kf-map-to-gpu leaves declarations.
    planned = next((i + 1 for i, p in enumerate(passes) if p.startswith("kf-tile")), 1)
    run_passes(cap.module, passes[:planned], log, record_after=record)
    kernel_info = _kernel_info(cap.module)
    run_passes(cap.module, passes[planned:], log, record_after=record)
    abi, constants, repeats = gpu_codegen.schedule_abi(cap.module, cap.name, cap.input_names, target,
                                                       cap.eager_aliases, cap.eager_repeats)
    abi = _with_kernel_info(abi, kernel_info)
    abi, artifacts = _lower_target(cap, log, abi, target, arch)
    blob, table = b"", []
    for arg, data in constants:
        table.append({"offset": len(blob), "nbytes": len(data), "shape": list(arg.shape), "elem": arg.elem})
        blob += data + b"\0" * (-len(data) % 16)
    if table:
        artifacts["constants.bin"] = blob
    return abi, artifacts, {"constants": table, "repeats": repeats}


def _check_variants(name: str, variants: str, loc) -> None:
    """A CompileError at the user's function for kernel variants kf-tile would refuse."""
    if not variants.strip():
        return
    from kf.passes.strategies.base import variants_by_kind

    try:
        variants_by_kind(dict(item.split("=", 1) for item in variants.split()))
    except ValueError as e:
        raise CompileError(f"{name}: the variants option names no kernel variant kf has", loc, stage="options",
                           cause=str(e)) from None


def _kernel_info(module) -> dict[str, dict]:
    """Per kernel function: its kf.plan and its FLOPs (costs.py), keyed by the name of
    the gpu.func kf-map-to-gpu will give it (the kernel function's own name)."""
    from mlir import ir

    from kf.passes.tile import recorded_plan

    from .costs import kernel_flops

    out = {}
    for op in module.body.operations:
        op = op.operation
        if op.name == "func.func" and "kf.kernel" in op.attributes:
            flops, mm = kernel_flops(op)
            out[ir.StringAttr(op.attributes["sym_name"]).value] = {
                "plan": recorded_plan(op) or {}, "flops": flops, "matmul_flops": mm}
    return out


def _with_kernel_info(abi, info: dict[str, dict]):
    import dataclasses

    kernels = tuple(dataclasses.replace(k, extra={**k.extra, **info.get(k.entry, {})}) for k in abi.kernels)
    return dataclasses.replace(abi, kernels=kernels)


def _lower_target(cap, log, abi, target: str, arch: str):
    """The back end, timed as a stage, its failures raised at the user's line. A
    function that needs no kernel (it returns its inputs, views of them or empty
    tensors) has no back-end stage and no binary."""
    import time

    if not abi.kernels:
        return abi, {}

    from . import gpu_codegen
    from .stages import target_failure

    if target == "cuda":
        stage, text = "kf-to-cuda (ptxas)", f"kf-to-cuda{{chip={arch}}}"
        run = lambda: gpu_codegen.lower_cuda(cap.module, abi, arch, log)  # noqa: E731
    else:
        stage = "kf-to-spirv" + (" + kf-to-metal (SPIRV-Cross)" if target == "metal" else " (spirv-val)")
        text = "kf-to-spirv" + (", kf-to-metal" if target == "metal" else "")
        run = lambda: gpu_codegen.lower_spirv(cap.module, abi, log, metal=target == "metal", limits=arch)  # noqa: E731
    before = cap.module.operation.get_asm(enable_debug_info=True)
    start = time.perf_counter()
    try:
        return run()
    except Exception as e:
        if debug():
            raise
        lines = {k.entry: k.fused_lines for k in abi.kernels}
        raise target_failure(log, stage, text, before, e, lines) from None
    finally:
        log.seconds[stage] = time.perf_counter() - start


def _build_cpu(cap, log):
    from kf.runtime.abi import TensorArg

    from .cpu_codegen import _func, _signature, index_sites, link_shared_object, program_abi, rename_entry
    from .stages import run_passes

    from .costs import kernel_flops

    entry = _func(cap.module, cap.name)
    flops, mm = kernel_flops(entry)
    ins, outs = _signature(entry)
    ins = tuple(TensorArg(n, a.shape, a.elem) for n, a in zip(cap.input_names, ins))
    if "arg_attrs" in entry.attributes:  # parameter names are for people; the ABI has them
        del entry.attributes["arg_attrs"]
    symbol = rename_entry(cap.module, cap.name)
    run_passes(cap.module, ["kf-lower-to-linalg"], log, record_after={"kf-lower-to-linalg": "linalg"})
    sites = index_sites(_func(cap.module, symbol))
    run_passes(cap.module, ["kf-to-cpu"], log, record_after={"kf-to-cpu": "llvm"})
    import time

    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="kf-cpu-") as tmp:
        so = link_shared_object(cap.module, os.path.join(tmp, f"{cap.name}.so"))
        data = Path(so).read_bytes()
    log.seconds["llvm codegen + link"] = time.perf_counter() - start
    abi = program_abi(symbol, ins, outs, sites, f"{cap.name}.so",
                      fused_lines=tuple(sorted({str(l) for l in cap.source_locs.values()})),
                      extra={"strategy": "cpu", "flops": flops, "matmul_flops": mm})
    return abi, {f"{cap.name}.so": data}


# ----------------------------------------------------------------------------- inspect


def inspect_function(fn: Callable, sig: Signature, tensors: list, options: Options):
    """Every stage's text for one specialization; stages after kf compile lazily."""
    from .capture import capture_signature
    from .inspection import Inspection
    from .stages import StageLog, dump_dir_for

    from .guards import walk

    reads = walk(fn)
    try:
        cap = capture_signature(fn, sig, tensors, reads.tensors, reads.labels)
        # the kf stage is the IR the precision policy leaves (the casts it makes show)
        apply_precision(cap, options, StageLog(cap.name, dump_dir_for(options.dump_ir)))
    except CompileError as e:
        if debug():
            raise
        raise _user_facing(e) from None

    def compile_rest() -> dict:
        log = StageLog(cap.name, dump_dir_for(options.dump_ir), inspecting=True)
        try:
            build(fn, sig, tensors, options.with_(interpret=False), target_arch(options), log, reads)
        except CompileError as e:
            if debug():
                raise
            raise _user_facing(e) from None
        return log.texts

    return Inspection(cap.name, sig.describe(), cap.kf_ir, cap, compile_rest)
