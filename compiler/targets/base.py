"""What every target is: a name, the device it runs on, and an ordered table of named
stages that turn one call signature of a function into a program for the cache.

A target (``cpu``, ``cuda``, ``vulkan``, ``metal``) is an object, as a Triton backend
is: ``add_stages`` fills the table (capture, precision, then the target's own stages,
then package), and the driver walks it, stage by stage, over one ``Build``. What sets
targets apart is an attribute of the object (``is_gpu``, ``uses_spirv``,
``torch_device``, ...), never a comparison of names.

Nothing here imports MLIR: the driver asks a target for its device key before it looks
in the cache, and a cache hit in a new process must not load the compiler. Each stage
imports what it needs when it runs.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any, Callable

from ..errors import SourceLoc
from ..options import Options

Stage = Callable[["Build"], None]


@dataclass
class Build:
    """One specialization on its way through a target's stages: what the driver gives,
    and what each stage leaves for the ones after it."""

    target: "Target"
    fn: Callable
    sig: Any  # signature.Signature
    tensors: list
    options: Options
    arch: str  # the target's arch (Target.arch): a chip, the device's limits, or ""
    reads: Any  # guards.Reads
    log: Any = None  # stages.StageLog; made at capture when not given (kf.inspect gives one)
    cap: Any = None  # capture.Captured, once captured
    abi: Any = None  # runtime.abi.ProgramABI, once written
    artifacts: dict[str, bytes] = field(default_factory=dict)
    #: entries the program's metadata holds besides the common ones (GPU: constants, repeats)
    extra_meta: dict = field(default_factory=dict)
    #: what one stage of a target leaves for a later one (kernel plans, the CPU signature)
    notes: dict = field(default_factory=dict)
    meta: dict = field(default_factory=dict)

    @property
    def code(self):
        """The user's function's code object (decorators unwrapped)."""
        import inspect

        return inspect.unwrap(self.fn).__code__

    @property
    def where(self) -> SourceLoc:
        """The user's function's definition: where an error with no better line points."""
        code = self.code
        return SourceLoc(code.co_filename, code.co_firstlineno, 1, code.co_name)


class Target:
    """A compilation target. Subclasses set the attributes and add their stages."""

    #: the name in ``Options.target`` and ``ProgramABI.target``
    name: str = ""
    #: the torch device type its tensors live on (Vulkan runs on CPU tensors)
    torch_device: str = "cpu"
    #: kernels are written by the strategies and launched on a GPU (kf-fuse ... kf-vectorize)
    is_gpu: bool = False
    #: the kernels are SPIR-V (Vulkan, and Metal through SPIRV-Cross)
    uses_spirv: bool = False
    #: fp8 matmul operands stay fp8 tensors (tensor cores multiply them); elsewhere the
    #: E4M3FN values are carried in f32 (``kf-apply-precision{fp8-storage=false}``)
    fp8_storage: bool = False
    #: the launcher's keyword that returns per-kernel times (kf.profile); "" for wall time
    timing: str = ""
    #: kf.profile marks each launch as an NVTX range (Nsight Systems)
    nvtx: bool = False
    #: its programs take run-time sizes (dims of ``?`` in kf IR, compiler/dynamic.py);
    #: elsewhere every call signature's sizes are compiled for
    dynamic_shapes: bool = False
    #: a dim whose size changes takes run-time sizes without being asked for (automatic
    #: dynamic, and the symbolic sizes Dynamo gives compiler/backend); where False, only
    #: the dims ``dynamic=True`` or ``dynamic={...}`` name do, and other calls compile
    #: each size
    automatic_dynamic: bool = True
    #: a run-time size's divisibility by this (0: none) is part of the signature: where
    #: the code depends on it (vector width, whole-tile paths), Triton's rule
    divisibility: int = 0
    #: each tensor's innermost dim stays static (the dim the GPU kernels reduce over,
    #: vectorize along, or hold a head of), as Triton's kernels keep their block sizes
    static_innermost: bool = False

    def __repr__(self) -> str:
        return f"<kf target {self.name}>"

    # ------------------------------------------------------------------ the device

    def arch(self, options: Options) -> str:
        """What the code is built for on this target's device ("" where nothing varies)."""
        return ""

    def multiprocessors(self) -> int:
        """The device's multiprocessors that persistent kernels fill (0: not used)."""
        return 0

    def device_key(self, options: Options) -> str:
        """What the compiled code depends on of the device, for the cache key: the
        architecture (Vulkan and Metal: the device's limits) and the multiprocessors
        (persistent kernels' grids)."""
        return f"{self.arch(options)} {self.multiprocessors()}"

    # ------------------------------------------------------------------ the stages

    def precision_passes(self, options: Options) -> list[str]:
        """The kf-level passes of ``options.precision`` (none for ``auto``): the policy
        (passes/apply_precision.py), then kf-canonicalize for the identity casts it
        leaves. fp8 operands are fp8 tensors only where ``fp8_storage`` says so: kf-to-spirv
        stores no fp8 tensors, and the CPU would widen each fp8 operand into an f32 copy
        before its matmul anyway."""
        if options.precision == "auto":
            return []
        extra = ""
        if options.precision == "fp8":
            extra = self.fp8_options(options)
        return [f"kf-apply-precision{{precision={options.precision}{extra}}}", "kf-canonicalize"]

    def fp8_options(self, options: Options) -> str:
        """kf-apply-precision's options under ``precision=fp8`` on this target."""
        return "" if self.fp8_storage else " fp8-storage=false"

    def apply_precision(self, cap, options: Options, log) -> None:
        """Run the precision policy's passes on a captured function's kf IR, in place."""
        from ..stages import run_passes

        passes = self.precision_passes(options)
        if passes:
            run_passes(cap.module, passes, log)

    def add_stages(self, stages: dict[str, Stage]) -> None:
        """Add this target's stages, in order, after capture and precision."""
        raise NotImplementedError

    def stages(self) -> dict[str, Stage]:
        """The ordered table the driver walks: capture, precision, the target's own
        stages, package."""
        stages: dict[str, Stage] = {"capture": capture, "precision": precision}
        self.add_stages(stages)
        stages["package"] = package
        return stages


# ----------------------------------------------------------------------------- shared stages


def capture(b: Build) -> None:
    """The function as kf IR (compiler/capture.py), recorded as the ``kf`` stage."""
    from ..capture import capture_signature
    from ..stages import StageLog, dump_dir_for

    start = time.perf_counter()
    if b.sig.is_dynamic:  # run-time sizes
        from ..dynamic import capture_dynamic

        cap = capture_dynamic(b.fn, b.sig, b.tensors, b.reads.tensors, b.reads.labels)
    else:
        cap = capture_signature(b.fn, b.sig, b.tensors, b.reads.tensors, b.reads.labels)
    b.reads.baked = cap.unsourced
    b.cap = cap
    log = b.log = b.log or StageLog(cap.name, dump_dir_for(b.options.dump_ir))
    log.seconds["capture"] = time.perf_counter() - start
    log.default_loc = b.where
    log.function_lines = code_lines(b.code)
    log.record("kf", cap.module)


def precision(b: Build) -> None:
    """kf-widen-integers and kf-canonicalize, then the precision policy's passes."""
    from ..stages import run_passes

    run_passes(b.cap.module, ["kf-widen-integers", "kf-canonicalize"], b.log)
    b.target.apply_precision(b.cap, b.options, b.log)


def package(b: Build) -> None:
    """The program's metadata for the cache (program.json) beside its artifacts."""
    import json

    cap, log = b.cap, b.log
    b.meta = {
        "name": cap.name,
        "signature": b.sig.describe(),
        "abi": b.abi.to_json(),
        "output_tree": json.dumps(cap.output_tree),
        "compile_seconds": log.seconds,
        "random_state": cap.random_input,
        "mutations": [m.to_json() for m in cap.mutations],
        "reached": cap.reached,
        "size_guards": list(cap.size_guards),
        # [output, device] where eager makes the result on another device than the
        # target's (torch.arange(n) in a function of no tensors: the default device)
        "result_devices": [[j, d] for j, d in enumerate(cap.output_devices)
                           if d and d.split(":")[0] not in (b.target.torch_device, "meta")],
        # what cannot be named in another process, or holds tensors the walk did not find,
        # stays in this one (cache.store)
        "private": not b.reads.persistent or bool(cap.unsourced),
        # [output, input] where eager returns the input tensor itself, [output, earlier output]
        # where it returns one tensor twice: the call returns them so too
        "returns_inputs": [[j, a[1]] for j, a in enumerate(cap.eager_aliases) if a is not None and a[0] == "input"],
        "same_results": [[j, k] for j, k in enumerate(cap.eager_repeats) if k >= 0],
        **b.extra_meta,
    }


def code_lines(code) -> frozenset:
    """Source lines of a code object and the code nested in it (lambdas, comprehensions)."""
    lines = {line for _, _, line in code.co_lines() if line is not None}
    for c in code.co_consts:
        if hasattr(c, "co_lines"):
            lines |= code_lines(c)
    return frozenset(lines)
