"""``kf.bisect(fn, *args)``: which pass made the numbers wrong?

A wrong result from a compiled kernel says nothing about where it went wrong. Bisection
runs the program after every pass, on the CPU, against torch eager, and names the first
pass after which the result differs beyond tolerance:

- the captured kf IR and every later snapshot that is still kf ops (kf-canonicalize,
  kf-fuse, kf-tile: kernel functions and calls of them) run in the interpreter, the
  dialect's reference semantics, so a wrong rewrite at the kf level shows at once;
- a snapshot at the tensor level (after kf-lower-to-linalg: linalg, tensor, arith on
  tensors) is compiled on a copy by the rest of the CPU path (kf-to-cpu, LLVM, link) and
  run;
- a snapshot in the LLVM dialect (after kf-to-cpu) is linked and run as it is.

Snapshots no CPU path can run (after kf-map-to-gpu, a gpu.module) are reported as
skipped, never blamed. The first step ("capture") checks the captured IR itself, so a
wrong ATen conversion is told apart from a wrong pass.

The failing pass's input goes into a reproducer folder (``before.mlir``, ``after.mlir``,
``inputs.pt``) with the ``kf-opt`` command that runs the pass on it: what a bug report
needs.
"""

from __future__ import annotations

import os
import sys
import tempfile
from dataclasses import dataclass
from typing import Callable

#: The CPU target's pipeline after capture (driver.build with target="cpu").
CPU_PASSES = ["kf-widen-integers", "kf-canonicalize", "kf-lower-to-linalg", "kf-to-cpu"]


@dataclass
class Step:
    """One snapshot: the pass it follows, how it ran, and how far it is from eager."""

    name: str
    how: str  # "interpreted", "compiled for cpu", "linked for cpu", "skipped"
    max_abs_error: float | None
    ok: bool | None  # None: the snapshot could not run on the CPU
    note: str = ""


@dataclass
class BisectResult:
    """The steps in order; ``first_bad`` names the first pass whose result differs."""

    function: str
    steps: list[Step]
    first_bad: str | None
    reproducer: str | None = None  # folder: before.mlir, after.mlir, inputs.pt
    command: str | None = None
    tolerance: tuple[float, float] = (0.0, 0.0)

    def __str__(self) -> str:
        rtol, atol = self.tolerance
        out = [f"kf.bisect {self.function}: each snapshot against torch eager (rtol={rtol:g}, atol={atol:g})"]
        for s in self.steps:
            status = {True: "ok", False: "DIFFERS", None: "skipped"}[s.ok]
            err = f"max |err| {s.max_abs_error:.3g}" if s.max_abs_error is not None else ""
            out.append(f"  {s.name:<40} {s.how:<18} {status:<8} {err}" + (f"  ({s.note})" if s.note else ""))
        if self.first_bad is None:
            out.append("no pass changes the result beyond tolerance")
        else:
            out.append(f"first pass whose result differs: {self.first_bad}")
            if self.reproducer:
                out.append(f"  reproducer: {self.reproducer}")
                out.append(f"  reproduce with: {self.command}")
        return "\n".join(out)


def _flatten(x) -> list:
    if isinstance(x, (tuple, list)):
        return [t for y in x for t in _flatten(y)]
    return [x]


def _expected(cap, results: list, inputs: list) -> list:
    """Eager's values in the order of the program's flat outputs: each result where the
    output tree puts it, and each written argument's value after the call where the
    program returns its new value (mutation.py)."""
    from .capture import _leaves

    want = [None] * len(cap.output_specs)
    for k, j in enumerate(_leaves(cap.output_tree)):
        want[j] = results[k]
    for m in cap.mutations:
        want[m.output] = inputs[m.input]
    return want


def _tolerance(outputs: list, rtol: float | None, atol: float | None) -> tuple[float, float]:
    import torch

    low = any(isinstance(t, torch.Tensor) and t.dtype in (torch.float16, torch.bfloat16) for t in outputs)
    return (rtol if rtol is not None else (2e-2 if low else 1e-3),
            atol if atol is not None else (2e-2 if low else 1e-4))


def compare(got: list, want: list, rtol: float, atol: float) -> tuple[bool, float]:
    """(within tolerance, max absolute error) of flat results; NaNs match NaNs."""
    import torch

    if len(got) != len(want):
        return False, float("inf")
    ok, worst = True, 0.0
    for g, w in zip(got, want):
        g = torch.as_tensor(g).detach().cpu()
        w = torch.as_tensor(w).detach().cpu()
        if tuple(g.shape) != tuple(w.shape):
            return False, float("inf")
        if not w.is_floating_point():
            same = bool(torch.equal(g.to(w.dtype), w))
            ok &= same
            worst = max(worst, 0.0 if same else float("inf"))
            continue
        g, w = g.double(), w.double()
        both_nan = torch.isnan(g) & torch.isnan(w)
        diff = torch.where(both_nan, torch.zeros_like(g), (g - w).abs())
        diff = torch.where(torch.isnan(diff), torch.full_like(diff, float("inf")), diff)
        if diff.numel():
            worst = max(worst, float(diff.max()))
            ok &= bool((diff <= atol + rtol * w.abs().nan_to_num(0.0)).all())
    return ok, worst


# ----------------------------------------------------------------------------- running snapshots


def _level(module) -> str:
    """"kf" (interpretable), "tensor" (CPU-compilable), "llvm" or "other"."""
    from mlir import ir

    names = set()
    for op in module.body.operations:
        op = op.operation
        names.add(op.name)
    if "gpu.module" in names or "gpu.binary" in names:
        return "other"
    if "llvm.func" in names:
        return "llvm"
    for op in module.body.operations:
        op = op.operation
        if op.name != "func.func" or not len(op.regions[0].blocks) or "kf.aten" in op.attributes:
            continue
        for inner in op.regions[0].blocks[0].operations:
            name = inner.operation.name
            if not (name.startswith("kf.") or name in ("func.call", "func.return")):
                return "tensor"
    del ir
    return "kf"


def _interpret(module, cap, tensors: list) -> list:
    """Run a kf-level snapshot; calls of kernel functions (after kf-fuse) run their bodies."""
    from mlir import ir

    from .interpreter import Interpreter

    calls: dict[str, Callable] = dict(cap.fallbacks)
    for op in module.body.operations:
        op = op.operation
        if op.name == "func.func" and len(op.regions[0].blocks) and "kf.kernel" in op.attributes:
            name = ir.StringAttr(op.attributes["sym_name"]).value
            calls[name] = (lambda n: lambda *a: Interpreter(module, n, calls).run(*a))(name)
    return Interpreter(module, cap.name, calls).run(*tensors)


def _run_cpu(module, cap, tensors: list, level: str, tmp: str) -> list:
    """Compile a copy of a tensor-level snapshot (or link an LLVM one) and run it."""
    from mlir import ir

    from kf.runtime.abi import KernelABI, ProgramABI, TensorArg
    from kf.runtime.cpu import CpuProgram

    from .cpu_codegen import _func, link_shared_object, lower_for_cpu
    from .dtypes import kf_elem

    with module.context:
        copy = ir.Module.parse(module.operation.get_asm(enable_debug_info=True))
    if level == "tensor":
        entry = _func(copy, cap.name)
        if "arg_attrs" in entry.attributes:  # as the driver does before kf-to-cpu
            del entry.attributes["arg_attrs"]
        lower_for_cpu(copy, kf_level=False)
    so = link_shared_object(copy, os.path.join(tmp, f"{cap.name}-{len(os.listdir(tmp))}.so"))
    ins = tuple(TensorArg(f"arg{i}", tuple(t.shape), kf_elem(t.dtype)) for i, t in enumerate(tensors))
    outs = tuple(TensorArg(f"result{i}", s.shape, s.elem) for i, s in enumerate(cap.output_specs))
    kernel = KernelABI(entry=f"_mlir_ciface_{cap.name}", args=tuple(range(len(ins) + len(outs))),
                       artifact=os.path.basename(so))
    program = CpuProgram(ProgramABI("cpu", ins, outs, kernels=(kernel,)), tmp)
    return list(program(*[t.contiguous() for t in tensors]))


def _run(module, cap, tensors: list, tmp: str) -> tuple[str, list | None, str]:
    level = _level(module)
    if level == "kf":
        return "interpreted", _interpret(module, cap, tensors), ""
    if level in ("tensor", "llvm"):
        return ("compiled for cpu" if level == "tensor" else "linked for cpu"), \
            _run_cpu(module, cap, tensors, level, tmp), ""
    return "skipped", None, "no CPU path runs this IR (gpu dialect)"


# ----------------------------------------------------------------------------- bisect


def bisect(fn: Callable, *args, passes: list[str] | None = None, rtol: float | None = None,
           atol: float | None = None, file=sys.stdout, **kwargs) -> BisectResult:
    """Run ``fn``'s IR after each pass of ``passes`` (default: the CPU pipeline,
    ``CPU_PASSES``) on the CPU against ``fn(*args)`` in eager torch; print the steps to
    ``file`` (None: only return them) and return them with the first differing pass and
    its reproducer. Tolerances default to 1e-3/1e-4 (rtol/atol), 2e-2 for 16-bit floats.
    ``passes`` may be any pipeline elements kf-opt accepts, kf's and upstream's."""
    import torch

    from .capture import capture_signature
    from .errors import CompileError
    from .signature import bind, invoke, rebuild_args
    from .stages import StageLog, run_passes

    user = getattr(fn, "__kf_function__", None)
    fn = user.fn if user is not None else fn
    sig, tensors = bind(fn, args, kwargs)
    # eager runs on copies: a function that writes to its arguments leaves the caller's
    # tensors (which every snapshot runs on) as they were
    copies = [t.clone() for t in tensors]
    with torch.no_grad():
        results = _flatten(invoke(fn, rebuild_args(sig, copies)))
    rtol, atol = _tolerance(results, rtol, atol)
    cap = capture_signature(fn, sig, tensors)
    if cap.random_input is not None:
        raise CompileError(f"kf.bisect cannot check {cap.name}: it draws random numbers, and torch eager, which "
                           f"bisection compares with, draws others", stage="bisect",
                           cause="bisect the function without its random ops (dropout with training=False)")
    want = _expected(cap, results, copies)
    module = cap.module
    log = StageLog(cap.name)
    steps: list[Step] = []
    first_bad = reproducer = command = None
    before = module.operation.get_asm(enable_debug_info=True)
    with tempfile.TemporaryDirectory(prefix="kf-bisect-run-") as tmp:
        for name in ["capture"] + list(passes if passes is not None else CPU_PASSES):
            if name != "capture":
                before = module.operation.get_asm(enable_debug_info=True)
                try:
                    run_passes(module, [name], log)
                except CompileError as e:  # the pass itself failed: that is the answer too
                    steps.append(Step(name, "pass failed", None, False, e.cause or e.message))
                    first_bad, reproducer, command = name, e.reproducer, e.command
                    break
            try:
                with torch.no_grad():
                    how, got, note = _run(module, cap, tensors, tmp)
            except Exception as e:  # a snapshot that cannot even run is as wrong as one that differs
                how, got, note = "failed to run", None, f"{type(e).__name__}: {str(e).strip().splitlines()[0][:160]}"
                steps.append(Step(name, how, None, False, note))
            else:
                if got is None:
                    steps.append(Step(name, how, None, None, note))
                    continue
                ok, err = compare(got, want, rtol, atol)
                steps.append(Step(name, how, err, ok, note))
            if steps[-1].ok is False and first_bad is None:
                first_bad = name
                if name != "capture":
                    reproducer, command = _write_reproducer(cap.name, name, before, module, tensors)
                break
    result = BisectResult(cap.name, steps, first_bad, reproducer, command, (rtol, atol))
    if file is not None:
        print(result, file=file)
    return result


def _write_reproducer(name: str, pass_: str, before: str, module, tensors: list) -> tuple[str, str]:
    import torch

    folder = tempfile.mkdtemp(prefix=f"kf-bisect-{name}-")
    with open(os.path.join(folder, "before.mlir"), "w") as f:
        f.write(before)
    with open(os.path.join(folder, "after.mlir"), "w") as f:
        f.write(module.operation.get_asm(enable_debug_info=True))
    torch.save([t.detach().cpu() for t in tensors], os.path.join(folder, "inputs.pt"))
    command = f"kf-opt {os.path.join(folder, 'before.mlir')} --pass-pipeline='builtin.module({pass_})'"
    with open(os.path.join(folder, "README.txt"), "w") as f:
        f.write(f"kf.bisect: {name} differs from torch eager after pass {pass_}.\n"
                f"before.mlir is the pass's input, after.mlir its output, inputs.pt the call's tensors "
                f"(torch.load).\n{command}\n")
    return folder, command
