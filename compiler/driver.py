"""The pipeline driver: capture, then the stages for the target, then a ready program.

Stages are named and ordered (capture -> kf -> linalg -> gpu -> ptx | spirv -> msl);
each stage's text can be dumped (``dump_ir``) and fed to kf-opt.
"""

from __future__ import annotations

from typing import Callable

from .capture import Captured, capture_signature
from .errors import TargetError
from .inspection import Inspection
from .options import Options
from .signature import Signature


class InterpretedProgram:
    """Runs the captured kf IR with torch, op by op (see interpreter.py)."""

    def __init__(self, cap: Captured):
        from .interpreter import Interpreter

        self.captured = cap
        self._interp = Interpreter(cap.module, cap.name, cap.fallbacks)

    def __call__(self, tensors: list):
        from .results import unflatten

        return unflatten(self.captured.output_tree, self._interp.run(*tensors))


def compile_function(fn: Callable, sig: Signature, tensors: list, options: Options):
    """A callable that takes the flat tensor arguments and returns the function's results."""
    cap = capture_signature(fn, sig, tensors)
    if options.interpret:
        return InterpretedProgram(cap)
    raise TargetError(f"{cap.name}: code generation for target '{options.target}' is not built yet",
                      cause="run with interpret=True (or KF_INTERPRET=1) to execute the kf IR with torch")


def inspect_function(fn: Callable, sig: Signature, tensors: list, options: Options) -> Inspection:
    cap = capture_signature(fn, sig, tensors)
    return Inspection(cap.name, sig.describe(), {"kf": cap.kf_ir}, cap)
