"""Running compiler passes as named stages: timing, IR dumps and reproducers.

Each pass runs on its own so that kf can time it, write the IR after it (``dump_ir`` /
``KF_DUMP_IR``, numbered files per kernel function), and, when it fails, save the
pass's input as a .mlir file and raise ``PassFailedError`` with the ``kf-opt`` command
that fails on it and the user's line the diagnostic points at. The full IR goes into
that file, never onto the screen.
"""

from __future__ import annotations

import hashlib
import os
import re
import tempfile
import time
from dataclasses import dataclass, field

from mlir import ir

from kf.passes import pipeline

from . import logs
from .errors import PassFailedError, SourceLoc


@dataclass
class StageLog:
    """What running the stages produced: text at named points and time per pass."""

    name: str
    dump_dir: str = ""
    texts: dict[str, str] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)
    #: Where to point an error whose diagnostics name no user line: the function's def.
    default_loc: SourceLoc | None = None
    #: The lines of the function's own code, so a diagnostic's line can be named "in <function>".
    function_lines: frozenset = frozenset()
    #: kf.inspect asks for the stages a build does not need too (linalg on GPU targets).
    inspecting: bool = False
    _count: int = 0
    _series: str = ""

    def _free_series(self) -> str:
        """The files' prefix: the function's name, or ``name@2``, ``name@3``... where an
        earlier compile of it (another signature, or the static compile after a
        run-time-size attempt) dumped there already, so that no series overwrites
        another."""
        names = os.listdir(self.dump_dir)
        series, k = self.name, 1
        while any(n.startswith(f"{series}.01.") for n in names):
            k += 1
            series = f"{self.name}@{k}"
        return series

    def __post_init__(self):
        self.seconds = _StageSeconds(self.name, self.seconds)

    def record(self, stage: str, module: ir.Module) -> None:
        text = module.operation.get_asm(enable_debug_info=True, use_local_scope=True)
        self.texts[stage] = text
        self.dump(stage, text)

    def dump(self, stage: str, text: str, ext: str = "mlir") -> None:
        if not self.dump_dir:
            return
        os.makedirs(self.dump_dir, exist_ok=True)
        if not self._count:
            self._series = self._free_series()
        self._count += 1
        # a stage is a pass with its options; the options of kf-tile and kf-map-to-gpu on
        # SPIR-V (the device's limits) pass the 255 bytes a file name may take: the
        # pass's name is kept, the options become a short hash of them
        safe = re.sub(r"[^A-Za-z0-9_.-]", "_", stage)
        if len(safe) > _LONGEST_STAGE:
            name = stage.split("{")[0]
            safe = re.sub(r"[^A-Za-z0-9_.-]", "_", name)[:_LONGEST_STAGE - 9] + "_" + \
                hashlib.sha1(stage.encode()).hexdigest()[:8]
        path = os.path.join(self.dump_dir, f"{self._series}.{self._count:02d}.{safe}.{ext}")
        with open(path, "w") as f:
            f.write(text)


#: the longest stage name a dump's file name takes (with the function's name, the
#: series and the count it stays within 255 bytes for names kf gives functions)
_LONGEST_STAGE = 96


class _StageSeconds(dict):
    """Seconds per stage of one compile; once the compile has run ``logs.PROGRESS_AFTER``
    seconds, each stage that finishes is logged on ``kf.compile`` with the time so far."""

    def __init__(self, name: str, items: dict):
        super().__init__(items)
        self.name = name
        self.started = time.perf_counter()

    def __setitem__(self, stage: str, seconds: float) -> None:
        super().__setitem__(stage, seconds)
        elapsed = time.perf_counter() - self.started
        if elapsed > logs.PROGRESS_AFTER:
            logs.compile_log.info("%s: %s took %.2f s (%.1f s so far)", self.name, stage, seconds, elapsed)


def dump_dir_for(option: str) -> str:
    return option or os.environ.get("KF_DUMP_IR", "")


def _user_loc(diags: list) -> SourceLoc | None:
    for d in diags:
        m = re.search(r'loc\("([^"]+\.py)":(\d+):(\d+)', str(d.location))
        if m:
            return SourceLoc(m.group(1), int(m.group(2)), int(m.group(3)))
    return None


def run_passes(module: ir.Module, passes: list[str], log: StageLog, *, record_after: dict[str, str] | None = None
               ) -> None:
    """Run each pass of ``passes`` (pipeline elements, e.g. ``kf-tile{target=cuda}``) in order.

    ``record_after`` maps a pass to the stage name whose text is recorded after it.
    """
    record_after = record_after or {}
    ctx = module.context
    # A failing pass's input is rebuilt from this copy only when a pass fails, instead of
    # printing the module before every pass.
    start = module.operation.clone()
    for i, element in enumerate(passes):
        pm, _ = pipeline.build(f"builtin.module({element})", ctx)
        diags: list = []

        def handler(d):
            diags.append(d)
            return True

        h = ctx.attach_diagnostic_handler(handler)
        started = time.perf_counter()
        try:
            pm.run(module.operation)
        except ir.MLIRError as e:
            # Diagnostic objects are valid only inside the handler; keep their text.
            # The handler saw the root cause first; the exception's own list ends with
            # the pass's summary ("upstream pipeline failed").
            all_diags = diags + list(getattr(e, "error_diagnostics", []))
            messages = [str(d.message) for d in all_diags]
            loc = _in_function(_user_loc(all_diags), log) or log.default_loc
            path = save_reproducer(log, _input_of(start, passes[:i]))
            cause = next((m for m in messages if m), str(e).splitlines()[0])
            raise PassFailedError(f"{log.name}: pass {element} failed", loc, stage=element,
                                  cause=cause.strip().splitlines()[0][:300], reproducer=path,
                                  command=f"kf-opt {path} --pass-pipeline='builtin.module({element})'") from None
        finally:
            h.detach()
        log.seconds[element] = log.seconds.get(element, 0.0) + time.perf_counter() - started
        if log.dump_dir:
            log.dump(element, module.operation.get_asm(enable_debug_info=True, use_local_scope=True))
        if element in record_after:
            log.texts[record_after[element]] = module.operation.get_asm(enable_debug_info=True,
                                                                         use_local_scope=True)


def _input_of(start: ir.Operation, done: list[str]) -> str:
    """The text a failing pass was given: ``start`` with the passes before it run again."""
    ctx = start.context
    h = ctx.attach_diagnostic_handler(lambda d: True)
    try:
        for element in done:
            pipeline.build(f"builtin.module({element})", ctx)[0].run(start)
    except ir.MLIRError:
        pass  # the earlier passes succeeded on the same input; keep what was reached
    finally:
        h.detach()
    return start.get_asm(enable_debug_info=True)


def _in_function(loc: SourceLoc | None, log: StageLog) -> SourceLoc | None:
    """loc with the user's function named, when the line is in that function's code."""
    d = log.default_loc
    if loc is None or d is None or loc.function or loc.file != d.file or loc.line not in log.function_lines:
        return loc
    return SourceLoc(loc.file, loc.line, loc.col, d.function)


def save_reproducer(log: StageLog, text: str, suffix: str = ".mlir") -> str:
    """Write a failing stage's input where the user can attach it to a bug report."""
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", log.name)  # the path goes into a shell command
    fd, path = tempfile.mkstemp(prefix=f"kf-{safe}-", suffix=suffix)
    with os.fdopen(fd, "w") as f:
        f.write(text)
    return path


def _one_line(text: str) -> str:
    """The first line of a tool's output that says what went wrong (not a banner)."""
    lines = [ln.strip() for ln in str(text).splitlines() if ln.strip()]
    for i, ln in enumerate(lines):
        if re.search(r"error|fatal|invalid|failed|rejected|unsupported", ln, re.I):
            if ln.endswith(":") and i + 1 < len(lines):  # "tool failed on @k:" + the tool's own words
                ln = f"{ln} {lines[i + 1]}"
            return ln[:300]
    return (lines[0] if lines else type(text).__name__)[:300]


def _ptx_entry_at(path: str, message: str) -> str | None:
    """The kernel whose body holds the PTX line ptxas complains about ("..., line 40; error")."""
    m = re.search(r"line (\d+);", message)
    if not m or not os.path.exists(path):
        return None
    entry = None
    with open(path) as f:
        for number, text in enumerate(f, 1):
            e = re.search(r"\.entry\s+(\w+)", text)
            if e:
                entry = e.group(1)
            if number == int(m.group(1)):
                return entry
    return None


def target_failure(log: StageLog, stage: str, pipeline_text: str, before: str, exc: BaseException,
                   kernel_lines: dict[str, tuple[str, ...]]):
    """The CompileError for a back end (kf-to-cuda and ptxas, kf-to-spirv and spirv-val,
    kf-to-metal and SPIRV-Cross) that rejected a module.

    Back ends raise their own errors (CudaCompileError, or a PassError from SPIR-V
    validation or cross-compilation) with the tool's whole output; the user gets one
    line of it, the line of their code that the failing kernel fuses (or the function's
    definition), the gpu-stage IR saved as the reproducer and the ``kf-opt`` command
    that runs the failing back end on it. What the tool kept (a .ptx, a .spv) stays
    named in the cause.
    """
    from .errors import CompileError, TargetError

    text = str(getattr(exc, "cause", None) or exc) if isinstance(exc, CompileError) else str(exc)
    cause = _one_line(text)
    # What the tool rejected, where the back end kept it: its own reproducer, or a path
    # in its message (spirv-val, spirv-cross).
    kept = getattr(exc, "reproducer", None) or ""
    if not kept.endswith((".ptx", ".spv")):
        found = [p for p in re.findall(r"(/\S+\.(?:ptx|spv))\b", str(exc)) if os.path.exists(p)]
        kept = found[-1] if found else ""
    if kept:
        cause += f" (kept: {kept})"
    entry = next((k for k in kernel_lines if re.search(rf"\b{re.escape(k)}\b", str(exc))), None)
    if entry is None and kept.endswith(".ptx"):
        entry = _ptx_entry_at(kept, text)
    if entry is None and len(kernel_lines) == 1:
        entry = next(iter(kernel_lines))
    loc = None
    if entry is not None and kernel_lines.get(entry):
        file, _, line = kernel_lines[entry][0].rpartition(":")
        loc = _in_function(SourceLoc(file, int(line)), log)
    path = save_reproducer(log, before)
    command = f"kf-opt {path} --pass-pipeline='builtin.module({pipeline_text})'"
    if isinstance(exc, CompileError):
        # Keep the back end's own class (CudaCompileError stays catchable as such).
        err = exc
        err.loc, err.cause, err.reproducer, err.command = loc or log.default_loc, cause, path, command
        err.stage = stage
        err.args = (err._render(),)
        return err
    return TargetError(f"{log.name}: {stage} rejected the kernels", loc or log.default_loc, stage=stage,
                       cause=cause, reproducer=path, command=command)
