"""kf's one error type and its subclasses, each pointing at the user's source line.

Following Triton's CompilationError, the message shows the user's file, line and source
with a caret, the stage that failed and one line of cause; a reproducer (the failing
stage's input as a .mlir file and the kf-opt command that fails on it) is named, never
printed: the full IR goes to that file, not onto the screen.
"""

from __future__ import annotations

import linecache
from dataclasses import dataclass

from kf.runtime.abi import IndexOutOfRange  # raised by the launchers, which share only abi.py


@dataclass(frozen=True)
class SourceLoc:
    """A place in the user's code."""

    file: str
    line: int
    col: int = 1
    function: str = ""

    def __str__(self) -> str:
        return f"{self.file}:{self.line}"

    def snippet(self) -> str:
        text = linecache.getline(self.file, self.line).rstrip("\n")
        if not text:
            return ""
        return f"    {text.strip()}"


class CompileError(Exception):
    """Compilation of a kf function failed; ``loc`` is the user's line it concerns."""

    stage = "compile"

    def __init__(self, message: str, loc: SourceLoc | None = None, *, stage: str | None = None,
                 cause: str | None = None, reproducer: str | None = None, command: str | None = None):
        self.message = message
        self.loc = loc
        if stage:
            self.stage = stage
        self.cause = cause
        self.reproducer = reproducer
        self.command = command
        super().__init__(self._render())

    def _render(self) -> str:
        lines = [self.message]
        if self.loc is not None:
            where = f'  File "{self.loc.file}", line {self.loc.line}'
            if self.loc.function:
                where += f", in {self.loc.function}"
            lines.append(where)
            snippet = self.loc.snippet()
            if snippet:
                lines.append(snippet)
        lines.append(f"  stage: {self.stage}")
        if self.cause:
            lines.append(f"  cause: {self.cause}")
        if self.reproducer:
            lines.append(f"  reproducer: {self.reproducer}")
        if self.command:
            lines.append(f"  reproduce with: {self.command}")
        return "\n".join(lines)


class CaptureError(CompileError):
    """The function could not be traced to an ATen graph."""

    stage = "capture"


class UnsupportedOpError(CaptureError):
    """An ATen op has no kf op and torch-mlir could not lower it either."""


class KfVerifyError(CompileError):
    """An op's shapes or element types break the kf dialect's rules."""

    stage = "verify"


class PassFailedError(CompileError):
    """A compiler pass failed."""

    stage = "pass"


class TargetError(CompileError):
    """The target cannot run this function, or its toolchain rejected the output."""

    stage = "target"


class MutationError(CompileError):
    """The function writes to an argument where kf cannot write the new value back
    (calls through torch.compile, torch.export or autograd; arguments that share memory)."""

    stage = "call"


class DynamicFallback(Exception):
    """A signature with run-time sizes that cannot be one program (compiler/dynamic.py):
    the reason, for the ``kf.recompiles`` log. ``dims`` names the (tensor name, dim) pairs
    whose sizes the trace needed, where it is known: those become static and the others
    stay dynamic (as dynamo specializes only the sizes a guard reads); where it is empty
    the function is compiled for the call's static sizes instead."""

    def __init__(self, message: str, dims: frozenset = frozenset()):
        super().__init__(message)
        self.dims = frozenset(dims)


class SignatureError(TypeError):
    """A call's arguments do not fit the function (wrong device, dtype or structure)."""



class Unsupported(Exception):
    """No kf lowering for an ATen op (and no fallback could lower it): what the ATen
    conversion (aten_to_kf.py) and its torch-mlir fallback (torch_mlir_import.py) raise,
    and capture turns into an UnsupportedOpError at the user's line."""

    def __init__(self, message: str, cause: str | None = None):
        super().__init__(message)
        self.cause = cause

__all__ = ["CaptureError", "CompileError", "IndexOutOfRange", "KfVerifyError", "PassFailedError", "SignatureError",
           "SourceLoc", "TargetError", "UnsupportedOpError"]


def user_facing(e: "CompileError") -> "CompileError":
    """The error without the compiler's frames below this one (Triton hides its own the
    same way): the traceback ends in a few frames of kf's API above the user's call,
    and the message, not a stack of passes, says what failed where."""
    return e.with_traceback(None)


def debug() -> bool:
    """KF_DEBUG=1 keeps kf's own frames in the traceback of a CompileError, and lets an
    internal error escape as itself instead of a CompileError at the user's line."""
    import os

    return os.environ.get("KF_DEBUG", "") not in ("", "0")
