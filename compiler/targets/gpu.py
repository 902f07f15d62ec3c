"""The stages every GPU target shares: the kernel passes, the launch schedule, a back
end, and the constants the schedule uploads.

    kernels   kf-recognize-moe -> kf-split-reductions -> kf-split-scans -> kf-fuse -> kf-share-kernels ->
              kf-tile ->
              kf-map-to-gpu -> kf-promote-shared -> kf-vectorize -> kf-linalg-to-gpu
              (GPU_PASSES; the last writes torch-mlir's functions as kernels)
    schedule  the ProgramABI of the launch schedule (gpu_codegen.schedule_abi), each
              kernel with its kf.plan and FLOPs
    <back end> the target's: ``ptx`` (CUDA), ``spirv`` (Vulkan), ``msl`` (Metal)
    constants the host data the schedule uploads, as one blob

The strategies see a target through kf-tile's and kf-map-to-gpu's ``target`` option
(``strategy_target``: ``cuda`` or ``spirv``) and the device facts after it
(``pass_options``): these stay strings, in the IR's pass pipeline.
"""

from __future__ import annotations

import time

from .base import Build, Stage, Target

#: The GPU pipeline after kf-canonicalize; {t} is the strategies' target (cuda, spirv),
#: {chip} the device's facts (``GpuTarget.pass_options``).
GPU_PASSES = ["kf-recognize-moe", "kf-split-reductions", "kf-split-scans", "kf-fuse", "kf-share-kernels",
              "kf-tile{{target={t}{chip}}}",
              "kf-map-to-gpu{{target={t}{chip}}}", "kf-promote-shared", "kf-vectorize",
              "kf-linalg-to-gpu{{target={t}}}"]


class GpuTarget(Target):
    """A target whose kernels the strategies write as gpu.funcs and a back end lowers."""

    is_gpu = True
    #: one program for every size of an outer dim (strategies/run_time_sizes.py)
    dynamic_shapes = True
    divisibility = 16
    static_innermost = True
    #: kf-tile's and kf-map-to-gpu's ``target`` option: the strategies' view of the target
    strategy_target: str = ""
    #: the back end's stage: its name in the stage table and ``kf.inspect`` (ptx, spirv, msl)
    binary_stage: str = ""
    #: the back end as it is named in timings and errors, and its kf-opt pipeline
    backend_name: str = ""
    backend_pipeline: str = ""

    def pass_options(self, arch: str) -> str:
        """kf-tile's and kf-map-to-gpu's options after ``target``: what the strategies
        may assume of the device."""
        raise NotImplementedError

    def passes(self, arch: str, variants: str = "") -> list[str]:
        """The kf passes from fused kernels to the gpu.module, for registered passes only
        (kf-promote-shared and kf-vectorize are optimizations: a build without them is
        correct). ``variants``: kernel variants (``Options.variants``), kf-tile's options."""
        from kf.passes import registry

        chip = self.pass_options(arch)
        out = []
        for p in GPU_PASSES:
            name = p.split("{")[0]
            if registry.is_kf_pass(name):
                p = p.format(t=self.strategy_target, chip=chip)
                if name == "kf-tile" and variants.strip():
                    p = p[:-1] + " " + " ".join(variants.split()) + "}"
                out.append(p)
        return out

    def lower(self, b: Build):
        """The back end: (abi, artifacts) from the gpu.module (gpu_codegen.lower_*)."""
        raise NotImplementedError

    def add_stages(self, stages: dict[str, Stage]) -> None:
        stages["kernels"] = kernels
        stages["schedule"] = schedule
        stages[self.binary_stage] = backend
        stages["constants"] = constants


# ----------------------------------------------------------------------------- stages


def kernels(b: Build) -> None:
    """The kernel passes, recording the ``fused`` and ``gpu`` stages, with each kernel's
    plan and FLOPs read after kf-tile (kf-map-to-gpu leaves declarations)."""
    from ..errors import PassFailedError, TargetError
    from ..stages import run_passes

    cap, log, target = b.cap, b.log, b.target
    if log.inspecting:
        _record_linalg(cap, log)
    _check_variants(cap.name, b.options.variants, log.default_loc)
    passes = target.passes(b.arch, b.options.variants)
    record = {next(p for p in passes if p.startswith("kf-fuse")): "fused", passes[-1]: "gpu"}
    # Kernel bodies (for FLOPs) and plans are both there after kf-tile, and only then:
    # kf-map-to-gpu leaves declarations.
    planned = next((i + 1 for i, p in enumerate(passes) if p.startswith("kf-tile")), 1)
    run_passes(cap.module, passes[:planned], log, record_after=record)
    b.notes["kernel_info"] = _kernel_info(cap.module)
    try:
        run_passes(cap.module, passes[planned:], log, record_after=record)
    except PassFailedError as e:
        if not str(e.stage).startswith("kf-linalg-to-gpu"):
            raise
        # torch-mlir's lowering of an op kf has no op for, which kf-linalg-to-gpu cannot
        # write as kernels: the target cannot run the function (the cpu target can).
        raise TargetError(f"{cap.name}: an ATen op with no kf op has a torch-mlir lowering that cannot run on "
                          f"the {target.name} target (the cpu target runs it)", e.loc, cause=e.cause,
                          reproducer=e.reproducer, command=e.command) from None


def schedule(b: Build) -> None:
    """The ProgramABI of the launch schedule, each kernel with its plan and FLOPs."""
    from .. import gpu_codegen

    cap = b.cap
    abi, b.notes["constants"], b.extra_meta["repeats"] = gpu_codegen.schedule_abi(
        cap.module, cap.name, cap.input_names, b.target.name, cap.eager_aliases, cap.eager_repeats,
        cap.input_dims, cap.output_dims)
    b.abi = _with_kernel_info(abi, b.notes["kernel_info"])


def backend(b: Build) -> None:
    """The target's back end, timed as a stage, its failures raised at the user's line. A
    function that needs no kernel (it returns its inputs, views of them or empty
    tensors) has no back-end stage and no binary."""
    from ..errors import debug
    from ..stages import target_failure

    if not b.abi.kernels:
        return
    target, log = b.target, b.log
    before = b.cap.module.operation.get_asm(enable_debug_info=True)
    start = time.perf_counter()
    try:
        b.abi, artifacts = target.lower(b)
    except Exception as e:
        if debug():
            raise
        lines = {k.entry: k.fused_lines for k in b.abi.kernels}
        raise target_failure(log, target.backend_name, target.backend_pipeline.format(arch=b.arch), before, e,
                             lines) from None
    finally:
        log.seconds[target.backend_name] = time.perf_counter() - start
    b.artifacts.update(artifacts)


def constants(b: Build) -> None:
    """The host data the schedule uploads, as one blob (``constants.bin``) and its table."""
    blob, table = b"", []
    for arg, data in b.notes["constants"]:
        table.append({"offset": len(blob), "nbytes": len(data), "shape": list(arg.shape), "elem": arg.elem})
        blob += data + b"\0" * (-len(data) % 16)
    if table:
        b.artifacts["constants.bin"] = blob
    b.extra_meta = {"constants": table, **b.extra_meta}


# ----------------------------------------------------------------------------- helpers


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


def _check_variants(name: str, variants: str, loc) -> None:
    """A CompileError at the user's function for kernel variants kf-tile would refuse."""
    if not variants.strip():
        return
    from kf.passes.strategies.base import variants_by_kind

    from ..errors import CompileError

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

    from ..costs import kernel_flops

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
