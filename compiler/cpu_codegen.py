"""The compile half of the CPU target: a kf (or linalg-on-tensors) module in, a shared
object and its ``ProgramABI`` out, for ``kf.runtime.cpu`` to load without MLIR.

LLVM 22's Python bindings cannot translate a module to LLVM IR text, so the object code
comes from the ExecutionEngine (``dump_to_object_file``), and the system ``cc`` links it
into a shared object. The engine emits code for the large code model with absolute
relocations; the linker accepts them in a shared object as text relocations
(``-z notext`` says that this is intended), which the dynamic loader resolves.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass

from mlir import ir
from mlir.execution_engine import ExecutionEngine

from kf.dialects.types import spec_of
from kf.passes import pipeline
from kf.runtime.abi import KernelABI, ProgramABI, TensorArg

from .errors import CompileError


class CpuCodegenError(CompileError):
    stage = "cpu codegen"


@dataclass(frozen=True)
class CpuArtifact:
    """A linked shared object and how to call each of its entries."""

    path: str
    abi: ProgramABI


def _signature(f: ir.Operation) -> tuple[tuple[TensorArg, ...], tuple[TensorArg, ...]]:
    ft = ir.FunctionType(ir.TypeAttr(f.attributes["function_type"]).value)
    ins = tuple(TensorArg(f"arg{i}", spec_of(t).shape, spec_of(t).elem) for i, t in enumerate(ft.inputs))
    outs = tuple(TensorArg(f"result{i}", spec_of(t).shape, spec_of(t).elem) for i, t in enumerate(ft.results))
    return ins, outs


def _func(module: ir.Module, entry: str) -> ir.Operation:
    for op in module.body.operations:
        op = op.operation
        if op.name == "func.func" and ir.StringAttr(op.attributes["sym_name"]).value == entry:
            return op
    raise CpuCodegenError(f"no function @{entry} in the module")


#: the prefix of a program's symbol in its shared object: a user function named like a
#: libc or libm function (step, exp, round, free) must not define that symbol, which the
#: dynamic linker would resolve to the library's (the program calling glibc's step) or
#: the library's calls to the program's (malloc)
SYMBOL_PREFIX = "kf_program_"


def rename_entry(module: ir.Module, entry: str) -> str:
    """Give the function ``@entry`` its symbol in the shared object (SYMBOL_PREFIX + entry)
    and return that name."""
    symbol = SYMBOL_PREFIX + entry
    _func(module, entry).attributes["sym_name"] = ir.StringAttr.get(symbol, module.context)
    return symbol


def index_sites(f: ir.Operation) -> tuple:
    """The IndexSites kf-lower-to-linalg recorded on a function (``kf.index_sites``):
    it then returns the index error flag as its last result."""
    from kf.runtime.abi import IndexSite

    if "kf.index_sites" not in f.attributes:
        return ()
    out = []
    for a in ir.ArrayAttr(f.attributes["kf.index_sites"]):
        d = ir.DictAttr(a)
        out.append(IndexSite(ir.StringAttr(d["op"]).value, ir.StringAttr(d["where"]).value,
                             ir.IntegerAttr(d["dim"]).value, ir.IntegerAttr(d["bound"]).value))
    return tuple(out)


def program_abi(name: str, ins: tuple, outs: tuple, sites: tuple, artifact: str, **kernel) -> ProgramABI:
    """The ABI of a CPU program: one entry taking the inputs, the outputs and, with index
    sites, the error flag (the function's last result)."""
    args = tuple(range(len(ins) + len(outs)))
    abi = ProgramABI(target="cpu", inputs=ins, outputs=outs, index_sites=sites)
    if sites:
        args += (abi.flag_buffer,)
    k = KernelABI(entry=f"_mlir_ciface_{name}", args=args, artifact=artifact, **kernel)
    return ProgramABI(target="cpu", inputs=ins, outputs=outs, kernels=(k,), index_sites=sites)


def lower_for_cpu(module: ir.Module, *, kf_level: bool = True, stop_at_linalg: bool = False) -> None:
    """Run kf's CPU pipeline in place: kf → linalg (when kf_level) → LLVM dialect
    (unless stop_at_linalg).

    On failure the input is saved as a .mlir file and the error names it with the
    ``kf-opt`` command that fails on it.
    """
    steps = (["kf-lower-to-linalg"] if kf_level else []) + ([] if stop_at_linalg else ["kf-to-cpu"])
    text = "builtin.module(" + ", ".join(steps) + ")"
    before = module.operation.get_asm(enable_debug_info=True)
    pm, _ = pipeline.build(text, module.context)
    try:
        pm.run(module.operation)
    except ir.MLIRError as e:
        fd, path = tempfile.mkstemp(prefix="kf-cpu-", suffix=".mlir")
        with os.fdopen(fd, "w") as f:
            f.write(before)
        raise CpuCodegenError("lowering for the CPU failed", cause=str(e), reproducer=path,
                              command=f"kf-opt {path} --pass-pipeline='{text}'") from None


def undefined_symbols(module: ir.Module) -> list[str]:
    """External functions the module declares that neither libc nor libm defines."""
    libs = [ctypes.CDLL(None), ctypes.CDLL(ctypes.util.find_library("m") or "libm.so.6")]
    missing = []
    for op in module.body.operations:
        op = op.operation
        if op.name == "llvm.func" and not len(op.regions[0].blocks):
            name = ir.StringAttr(op.attributes["sym_name"]).value
            if not any(hasattr(lib, name) for lib in libs):
                missing.append(name)
    return missing


def link_shared_object(module: ir.Module, path: str, *, opt_level: int = 3) -> str:
    """Compile an LLVM-dialect module to object code and link it into ``path``."""
    cc = os.environ.get("CC") or shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
    if cc is None:
        raise CpuCodegenError("no C compiler (cc) to link the CPU kernel into a shared object")
    missing = undefined_symbols(module)
    if missing:
        # The engine would abort the whole process on a symbol it cannot resolve.
        raise CpuCodegenError(f"the CPU kernel calls functions that this process cannot resolve: "
                              f"{', '.join(missing)}")
    with tempfile.TemporaryDirectory(prefix="kf-cpu-") as tmp:
        obj = os.path.join(tmp, "kernel.o")
        try:
            engine = ExecutionEngine(module, opt_level=opt_level)
            engine.dump_to_object_file(obj)
        except RuntimeError as e:
            raise CpuCodegenError("LLVM code generation for the CPU kernel failed", cause=str(e)) from None
        partial = path + f".tmp{os.getpid()}"
        cmd = [cc, "-shared", "-Wl,-z,notext", "-o", partial, obj, "-lm"]
        done = subprocess.run(cmd, capture_output=True, text=True)
        if done.returncode != 0:
            raise CpuCodegenError("linking the CPU kernel failed", cause=done.stderr.strip(), command=" ".join(cmd))
    os.replace(partial, path)  # readers never see a half-written library
    return path


def compile_module(module: ir.Module, entry: str, out_dir: str, *, kf_level: bool = True,
                   opt_level: int = 3) -> CpuArtifact:
    """Lower ``module`` (consumed: it is rewritten in place), link it into
    ``out_dir/<entry>.so`` and describe ``@entry`` for the launcher."""
    ins, outs = _signature(_func(module, entry))
    symbol = rename_entry(module, entry)
    if kf_level:
        lower_for_cpu(module, kf_level=True, stop_at_linalg=True)
    sites = index_sites(_func(module, symbol))
    lower_for_cpu(module, kf_level=False)
    os.makedirs(out_dir, exist_ok=True)
    so = link_shared_object(module, os.path.join(out_dir, f"{entry}.so"), opt_level=opt_level)
    return CpuArtifact(so, program_abi(symbol, ins, outs, sites, os.path.basename(so)))


__all__ = ["CpuArtifact", "CpuCodegenError", "compile_module", "link_shared_object", "lower_for_cpu"]
