"""What ``kf.inspect`` gives: every stage's text for one specialization of a function.

The kf IR is there at once; the later stages (linalg, gpu, ptx, spirv, msl, ...) are
compiled on first access, for the decorator's target (or the tensors' device), without
running anything: a metal_shader's MSL can be read on Linux.
"""

from __future__ import annotations

from typing import Callable

from . import targets
from .errors import CompileError, debug, user_facing
from .options import Options
from .signature import Signature


class Inspection:
    """What kf made of one call signature."""

    def __init__(self, name: str, signature: str, kf_ir: str, captured, compile_rest: Callable[[], dict] | None):
        self.name = name
        self.signature = signature
        self.captured = captured
        self._stages = {"kf": kf_ir}
        self._compile_rest = compile_rest

    @property
    def kf_ir(self) -> str:
        """The captured kf IR, with the user's file:line beside every op."""
        return self._stages["kf"]

    @property
    def stages(self) -> dict[str, str]:
        """Stage name -> text, in pipeline order (compiles on first access)."""
        if self._compile_rest is not None:
            compile_rest, self._compile_rest = self._compile_rest, None
            self._stages.update({k: v for k, v in compile_rest().items() if k != "kf"})
        return self._stages

    def __getattr__(self, stage: str) -> str:
        if stage.startswith("_"):
            raise AttributeError(stage)
        stages = self.stages
        if stage in stages:
            return stages[stage]
        raise AttributeError(f"no stage '{stage}' (stages: {', '.join(stages)})")

    def __repr__(self) -> str:
        """The kf IR under a header naming the stages, so a REPL shows what was captured."""
        later = "" if self._compile_rest is not None else ", ".join(k for k in self._stages if k != "kf")
        stages = "kf" + (f", {later}" if later else " (later stages compile when read: .stages, .ptx, .spirv, ...)")
        return f"kf.inspect {self.name}{self.signature}; stages: {stages}\n{self.kf_ir}"


def inspect_function(fn: Callable, sig: Signature, tensors: list, options: Options):
    """Every stage's text for one specialization; stages after kf compile lazily."""
    from .capture import capture_signature
    from .driver import build
    from .guards import walk
    from .stages import StageLog, dump_dir_for

    reads = walk(fn)
    target = targets.get(options.target)
    try:
        cap = capture_signature(fn, sig, tensors, reads.tensors, reads.labels)
        # the kf stage is the IR the precision policy leaves (the casts it makes show)
        target.apply_precision(cap, options, StageLog(cap.name, dump_dir_for(options.dump_ir)))
    except CompileError as e:
        if debug():
            raise
        raise user_facing(e) from None

    def compile_rest() -> dict:
        log = StageLog(cap.name, dump_dir_for(options.dump_ir), inspecting=True)
        try:
            build(fn, sig, tensors, options.with_(interpret=False), target.arch(options), log, reads)
        except CompileError as e:
            if debug():
                raise
            raise user_facing(e) from None
        return log.texts

    return Inspection(cap.name, sig.describe(), cap.kf_ir, cap, compile_rest)
