"""kf-to-cuda: gpu-dialect kernels to PTX, and PTX to a cubin with ptxas.

Input contract: a ``builtin.module`` holding ``gpu.module``s (kf's GPU mapping makes one,
``@kf_kernels``) whose ``gpu.func ... kernel`` functions take statically shaped memrefs,
inputs then outputs, and use gpu ids, scf, arith, math, memref, vector, workgroup memory
and ``gpu.barrier``.

The pass runs the upstream NVVM path that DESIGN.md records as checked:

    nvvm-attach-target{chip=...}
    gpu.module(expand-strided-metadata, lower-affine, math-extend-to-supported-types,
               convert-vector-to-scf, convert-scf-to-cf, convert-nvgpu-to-nvvm,
               convert-gpu-to-nvvm{use-bare-ptr-memref-call-conv=1}, convert-nvvm-to-llvm,
               canonicalize, cse)
    reconcile-unrealized-casts
    (kf fix-ups: dynamic shared memory made extern, the ftz flag; before the pipeline,
     approximate f32 exp2 and division to ex2.approx.ftz / rcp.approx.ftz, and fp8
     conversions to cvt or integer arithmetic)
    gpu-module-to-binary{format=isa}

and leaves one ``gpu.binary`` per ``gpu.module`` whose object holds the PTX text.

Why these choices:

- Bare-pointer calling convention: each memref argument becomes one ``.param .u64``
  pointer, so the launcher (runtime/cuda.py) passes one device pointer per buffer and
  never builds memref descriptors. It needs static shapes and identity layouts, which the
  input contract promises.
- Math: ``convert-gpu-to-nvvm`` turns math ops (exp, erf, tanh, rsqrt, log, ...) into
  calls of libdevice's ``__nv_*`` functions. The xtc wheel is built with libdevice
  *embedded* (``_mlir_embedded_libdevice`` in libMLIRPythonCAPI.so), and
  ``gpu-module-to-binary`` links it in: checked under strace, no ``libdevice.10.bc`` is
  opened, and the PTX has no ``.extern .func``. So no CUDA toolkit is needed to compile.
  ``ftz`` sets libdevice's ``__nvvm_reflect("__CUDA_FTZ")`` through the
  ``nvvm-reflect-ftz`` module flag (flush-to-zero math, as nvcc's -ftz=true).
- Approximate math: scalar f32 ``math.exp2`` and ``arith.divf`` that carry
  ``fastmath<afn>`` (scalar_math's short GELU and sigmoid for bf16/f16 results, and the
  wgmma attention's softmax, ``softmax_exp2``; nothing else in kf sets afn) become
  ``ex2.approx.ftz.f32`` and ``rcp.approx.ftz.f32`` (times the numerator): one MUFU
  instruction each in SASS. Left to the pipeline they would be
  libdevice's ``ex2.approx.f32`` and LLVM's ``div.approx.f32``, whose denormal handling
  adds a compare and two multiplies each (SASS of bf16 bias+GELU: 181 instructions
  for 8 elements against 133). Flushing results below 2^-126 (and reciprocals of
  subnormals) is within what afn allows.
- fp8: the strategies convert with ``arith.truncf`` / ``arith.extf``, which LLVM 22's
  NVVM path does not lower. ``lower_fp8_conversions`` (strategies/emit.py) makes them
  ``cvt.rn.satfinite.e4m3x2.f32`` / ``cvt.rn.f16x2.e4m3x2`` for e4m3 from sm_89 and
  integer arithmetic otherwise (e5m2, older chips).
- ``math-extend-to-supported-types`` computes f16/bf16 math in f32: libdevice has only
  f32/f64 entry points. f16/bf16 *loads and stores* need nothing: they are ``ld.global.b16``.
- ``convert-nvgpu-to-nvvm`` lowers the ``nvgpu.device_async_copy`` of the strategies'
  cp.async pipelines (GEMM, MoE, attention) to ``cp.async.cg.shared.global`` with the
  address arithmetic of their memref operands (the commit and wait are NVVM ops already).
  It runs before convert-gpu-to-nvvm, while those operands are still memrefs.
- scf must be lowered inside the gpu.module, before convert-gpu-to-nvvm, or a leftover
  cast stops the LLVM translation (DESIGN.md).

Beside the pass: ``compile_to_ptx`` (module or text in, ``{gpu.module name: PTX}`` out)
and ``assemble`` (``ptxas -arch=<chip> -v``: cubin bytes and, per kernel, the registers,
shared memory, stack frame, spills and barriers it reported). ``python -m kf.passes.to_cuda
file.mlir [--ptxas]`` prints both; the lit test uses it.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass, replace
from typing import ClassVar

from mlir import ir
from mlir.dialects import arith, gpu
from mlir.passmanager import PassManager

from .base import KfPass, PassError
from .cuda_fmod import lower_fmod
from .linalg_to_gpu import _expand_math
from .philox import lower_mulhi
from .strategies.emit import FP8_CVT_SM, lower_fp8_conversions

try:
    from kf.errors import TargetError as _TargetBase
except ImportError:  # compiler/errors.py is being written beside this; until then a plain error
    _TargetBase = RuntimeError  # type: ignore[misc,assignment]


class CudaCompileError(_TargetBase):
    """The NVVM pipeline or ptxas rejected a module; the message carries the diagnostics
    and a command that reproduces the failure on a saved copy of the input."""

    def __init__(self, message: str, *, cause: str = "", command: str = "", reproducer: str = ""):
        if _TargetBase is RuntimeError:
            parts = [message] + [f"  {k}: {v}" for k, v in
                                 (("cause", cause), ("reproducer", reproducer), ("reproduce with", command)) if v]
            super().__init__("\n".join(parts))
        else:
            super().__init__(message, stage="cuda", cause=cause or None, reproducer=reproducer or None,
                             command=command or None)


#: How a CUDA chip is spelled: sm_<number>, with "a" or "f" for the architecture-specific
#: features (sm_90a: wgmma).
CUDA_CHIP = re.compile(r"sm_[1-9][0-9]+[af]?")


def chip_error(chip: str) -> str | None:
    """Why ``chip`` is not a CUDA chip, or None where it is one."""
    if CUDA_CHIP.fullmatch(chip):
        return None
    return f"chip must be a CUDA chip such as sm_80, sm_90 or sm_90a, got '{chip}'"


@dataclass(frozen=True)
class ToCudaPass(KfPass):
    """``kf-to-cuda{chip=sm_90 features=+ptx80 opt-level=3 ftz=false index-bitwidth=64}``."""

    NAME: ClassVar[str] = "kf-to-cuda"
    DESCRIPTION: ClassVar[str] = "lower gpu.module kernels through NVVM to PTX (one gpu.binary per gpu.module)"

    chip: str = "sm_90"
    features: str = ""  # PTX ISA, e.g. "+ptx80"; empty lets LLVM pick the lowest the chip allows
    opt_level: int = 3
    ftz: bool = False  # libdevice's flush-to-zero variants (__nvvm_reflect("__CUDA_FTZ") = 1)
    index_bitwidth: int = 64  # 32 saves registers when every index fits in i32

    def __post_init__(self):
        # Checked when the pass is made, before any pipeline is: nvvm-attach-target takes
        # any chip name (writing PTX for ".target banana") and asserts on an opt level
        # past 3, which ends the process.
        problems = [chip_error(self.chip),
                    None if 0 <= self.opt_level <= 3 else f"opt-level must be 0, 1, 2 or 3, got {self.opt_level}",
                    None if self.index_bitwidth in (32, 64) else
                    f"index-bitwidth must be 32 or 64, got {self.index_bitwidth}"]
        for problem in filter(None, problems):
            raise ValueError(f"pass '{self.NAME}': {problem}")

    def lowering_pipeline(self) -> str:
        """gpu dialect to the LLVM/NVVM dialects inside each gpu.module."""
        attach = f"chip={self.chip} O={self.opt_level}"
        if self.features:
            attach += f" features={self.features}"
        return ("builtin.module("
                f"nvvm-attach-target{{{attach}}}, "
                "gpu.module(expand-strided-metadata, lower-affine, "
                "math-extend-to-supported-types{target-type=f32}, convert-vector-to-scf, convert-scf-to-cf, convert-nvgpu-to-nvvm, "
                f"convert-gpu-to-nvvm{{use-bare-ptr-memref-call-conv=1 index-bitwidth={self.index_bitwidth}}}, convert-vector-to-llvm, "
                "convert-nvvm-to-llvm, canonicalize, cse), "
                "reconcile-unrealized-casts)")

    @staticmethod
    def serialize_pipeline() -> str:
        return "builtin.module(gpu-module-to-binary{format=isa})"

    def upstream_pipeline(self) -> str:
        """The upstream passes this pass runs, in order, as one mlir-opt pipeline (the
        fix-ups below run between the two parts)."""
        return self.lowering_pipeline()[:-1] + ", gpu-module-to-binary{format=isa})"

    def as_callable(self):
        """As KfPass.as_callable, and first load what the nested pipelines need into the
        current context (the one the outer PassManager is being built in).

        A PassManager appends its passes' dependent dialects and interfaces to the context
        when it runs, and MLIR forbids (asserts) that while another PassManager is running
        on the context, which is where ``run`` starts the nested ones. Running them once
        on an empty module here, before the outer run, appends them early; the nested runs
        then find them present and append nothing.
        """
        try:
            ctx = ir.Context.current
        except ValueError:
            ctx = None
        if ctx is not None:
            with ctx, ir.Location.unknown():
                for text in (self.lowering_pipeline(), self.serialize_pipeline()):
                    PassManager.parse(text, context=ctx).run(ir.Module.create().operation)
        return super().as_callable()

    def run(self, module: ir.Operation) -> None:
        if not _gpu_modules(module):
            raise PassError("no gpu.module to compile: kf-to-cuda expects the output of kf's GPU mapping",
                            module.location)
        _check_kernel_signatures(module)
        p = self
        if not self.features and _uses_fp8_mma(module):
            p = replace(self, features="+ptx84")  # mma.sync on e4m3/e5m2 is PTX ISA 8.4
        elif not self.features and _uses_vector_red(module):
            p = replace(self, features="+ptx81")  # red.global.add.v2.f32 is PTX ISA 8.1
        # The nested runs report through the context's diagnostics; an MLIRError here means
        # they were already emitted, which the outer pass turns into a pass failure.
        for gm in _gpu_modules(module):
            # math.absi (and powi) as arith also in kernels that kf's strategies wrote
            # after the GPU mapping expanded its own (a generic kernel's checked indices)
            _expand_math(gm)
            _approximate_math(gm)
            lower_fp8_conversions(gm, cvt=_sm_number(self.chip) >= FP8_CVT_SM)
            lower_mulhi(gm)  # kf.rand's Philox products as mul.lo/mul.hi.u32
            lower_fmod(gm)  # arith.remf as libdevice's exact fmod
        PassManager.parse(p.lowering_pipeline(), context=module.context).run(module)
        for gm in _gpu_modules(module):
            _extern_dynamic_shared(gm)
            if self.ftz:
                _set_reflect_ftz(gm)
        PassManager.parse(self.serialize_pipeline(), context=module.context).run(module)


def _uses_fp8_mma(module: ir.Operation) -> bool:
    """Whether a kernel issues fp8 tensor-core instructions (inline PTX, see MmaSync)."""
    found = []

    def visit(op):
        if op.name == "llvm.inline_asm" and any(
                t in ir.StringAttr(op.attributes["asm_string"]).value for t in (".e4m3.", ".e5m2.")):
            found.append(op)
            return ir.WalkResult.INTERRUPT
        return ir.WalkResult.ADVANCE

    module.walk(visit)
    return bool(found)


def _uses_vector_red(module: ir.Operation) -> bool:
    """Whether a kernel issues vector reductions to global memory (inline PTX
    ``red.global.add.v2.f32``: the attention backward's dQ sums)."""
    found = []

    def visit(op):
        if op.name == "llvm.inline_asm" and "red.global.add.v" in ir.StringAttr(op.attributes["asm_string"]).value:
            found.append(op)
            return ir.WalkResult.INTERRUPT
        return ir.WalkResult.ADVANCE

    module.walk(visit)
    return bool(found)


def _sm_number(chip: str) -> int:
    """90 for "sm_90a", 0 where the chip is not spelled sm_<n>."""
    m = re.match(r"sm_(\d+)", chip)
    return int(m.group(1)) if m else 0


def _has_afn(op: ir.Operation) -> bool:
    return "fastmath" in op.attributes and "afn" in str(op.attributes["fastmath"])


def _is_one(v: ir.Value) -> bool:
    if not isinstance(v, ir.OpResult):
        return False
    op = v.owner.operation
    return (op.name == "arith.constant" and isinstance(op.attributes["value"], ir.FloatAttr)
            and ir.FloatAttr(op.attributes["value"]).value == 1.0)


def _approximate_math(gpu_module: ir.Operation) -> None:
    """Scalar f32 ``math.exp2`` / ``arith.divf`` with ``fastmath<afn>`` to
    ``ex2.approx.ftz.f32`` / ``rcp.approx.ftz.f32`` (times the numerator, unless it is 1)."""
    from mlir.dialects import llvm, nvvm

    found: list[ir.Operation] = []

    def visit(op):
        if op.name in ("math.exp2", "arith.divf") and _has_afn(op) and isinstance(op.results[0].type, ir.F32Type):
            found.append(op)
        return ir.WalkResult.ADVANCE

    gpu_module.walk(visit)
    for op in found:
        f32 = op.results[0].type
        with op.location, ir.InsertionPoint(op):
            if op.name == "math.exp2":
                r = llvm.call_intrinsic(f32, "llvm.nvvm.ex2.approx.ftz.f", [op.operands[0]], [], [])
            else:
                num, den = op.operands[0], op.operands[1]
                r = nvvm.rcp_approx_ftz_f(f32, den)
                if not _is_one(num):
                    r = arith.mulf(num, r)
        op.results[0].replace_all_uses_with(r)
        op.erase()


def _extern_dynamic_shared(gpu_module: ir.Operation) -> None:
    """Give ``gpu.dynamic_shared_memory``'s global external linkage.

    convert-gpu-to-nvvm makes it ``llvm.mlir.global internal @__dynamic_shmem__N :
    !llvm.array<0 x i8>`` in address space 3, and LLVM 22's NVPTX back end prints that as
    a 1-byte *static* ``.shared .b8 __dynamic_shmem__0;`` (ptxas: "1 bytes smem"), which
    other static shared variables can be placed after and the kernel's dynamic accesses
    would then overwrite. External linkage prints the CUDA form, ``.extern .shared .align
    16 .b8 __dynamic_shmem__0[];``, which is the dynamic shared window and nothing else.
    """
    for op in gpu_module.regions[0].blocks[0].operations:
        op = op.operation
        if (op.name == "llvm.mlir.global" and ir.StringAttr(op.attributes["sym_name"]).value.startswith(
                "__dynamic_shmem__") and "addr_space" in op.attributes
                and ir.IntegerAttr(op.attributes["addr_space"]).value == 3):
            op.attributes["linkage"] = ir.Attribute.parse("#llvm.linkage<external>")


def _set_reflect_ftz(gpu_module: ir.Operation) -> None:
    """Set the ``nvvm-reflect-ftz`` module flag that libdevice's __nvvm_reflect reads, so
    its math takes the flush-to-zero paths (what nvcc's -ftz=true does to libdevice).
    nvvm-attach-target's own ``ftz``/``fast`` flags were tried first: with LLVM 22 they
    land on the target attribute but the PTX came out byte for byte the same."""
    block = gpu_module.regions[0].blocks[0]
    with ir.Location.unknown():
        flag = ir.Operation.parse('llvm.module_flags [#llvm.mlir.module_flag<override, "nvvm-reflect-ftz", 1 : i32>]')
    if len(block.operations):
        ir.InsertionPoint(block.operations[0]).insert(flag)
    else:
        ir.InsertionPoint(block).insert(flag)


def _gpu_modules(module: ir.Operation) -> list[ir.Operation]:
    return [op.operation for op in module.regions[0].blocks[0].operations if op.operation.name == "gpu.module"]


def _check_kernel_signatures(module: ir.Operation) -> None:
    """Bare pointers lose shapes and strides: refuse what they cannot describe, early and
    at the argument's function, rather than as an LLVM-level cast error later."""
    for gm in _gpu_modules(module):
        for op in gm.regions[0].blocks[0].operations:
            if op.operation.name != "gpu.func" or "gpu.kernel" not in op.operation.attributes:
                continue
            ftype = ir.FunctionType(ir.TypeAttr(op.operation.attributes["function_type"]).value)
            for i, t in enumerate(ftype.inputs):
                if isinstance(t, ir.MemRefType):
                    identity = isinstance(t.layout, ir.AffineMapAttr) and t.layout.value == ir.AffineMap.get_identity(t.rank)
                    if not t.has_static_shape or not identity:
                        raise PassError(f"kernel argument {i} has type {t}: the bare-pointer convention needs a "
                                        "static shape and the identity layout", op.operation.location)
                    if isinstance(t.element_type, ir.IntegerType) and ir.IntegerType(t.element_type).width < 8:
                        # MemRefToLLVM asserts (the process aborts) on sub-byte loads
                        raise PassError(f"kernel argument {i} has type {t}: CUDA buffers of booleans hold bytes "
                                        "(i8), as torch stores them", op.operation.location)


# --------------------------------------------------------------------------- Python API


def compile_to_ptx(module: ir.Module | str, **options) -> dict[str, str]:
    """Run kf-to-cuda on a module (or its text) and return ``{gpu.module name: PTX}``.

    A Module is transformed in place (its gpu.modules become gpu.binary ops); text is
    parsed in a fresh context. ``options`` are ToCudaPass fields (``chip="sm_80"``, ...).
    Raises CudaCompileError with the diagnostics and a kf-opt reproducer on failure.
    """
    p = ToCudaPass(**options)
    if isinstance(module, str):
        ctx = ir.Context()
        ctx.load_all_available_dialects()
        with ctx:
            return _compile(ir.Module.parse(module), p, module)
    with module.context:
        return _compile(module, p, None)


def _compile(module: ir.Module, p: ToCudaPass, text: str | None) -> dict[str, str]:
    source = text if text is not None else str(module)
    try:
        p.run(module.operation)
    except (PassError, ir.MLIRError) as e:
        path = _save_reproducer(source)
        cause = "\n".join(str(d) for d in getattr(e, "error_diagnostics", ())) or str(e)
        raise CudaCompileError("kf-to-cuda failed", cause=cause, reproducer=path,
                               command=f"kf-opt --pass-pipeline='builtin.module({p.textual()})' {path}") from None
    return ptx_of(module)


def ptx_of(module: ir.Module) -> dict[str, str]:
    """The PTX of every gpu.binary in a module that kf-to-cuda has run on."""
    out: dict[str, str] = {}
    for op in module.body.operations:
        if op.operation.name != "gpu.binary":
            continue
        name = ir.StringAttr(op.operation.attributes["sym_name"]).value
        objects = ir.ArrayAttr(op.operation.attributes["objects"])
        if len(objects) != 1:
            raise CudaCompileError(f"gpu.binary @{name} has {len(objects)} objects; kf-to-cuda makes one")
        out[name] = gpu.ObjectAttr(objects[0]).object.decode()
    return out


def _save_reproducer(text: str) -> str:
    fd, path = tempfile.mkstemp(prefix="kf-cuda-", suffix=".mlir")
    with os.fdopen(fd, "w") as f:
        f.write(text)
    return path


# --------------------------------------------------------------------------- ptxas


def ptxas_path() -> str | None:
    """ptxas from PATH, else from CUDA_HOME / CUDA_PATH / /usr/local/cuda."""
    found = shutil.which("ptxas")
    if found:
        return found
    for root in (os.environ.get("CUDA_HOME"), os.environ.get("CUDA_PATH"), "/usr/local/cuda"):
        if root and os.access(os.path.join(root, "bin", "ptxas"), os.X_OK):
            return os.path.join(root, "bin", "ptxas")
    return None


@dataclass(frozen=True)
class Assembled:
    """ptxas output: the cubin and, per kernel, what ``ptxas -v`` reported."""

    chip: str
    cubin: bytes
    kernels: dict[str, dict[str, int]]  # registers, shared_bytes, stack_bytes, spill_*_bytes, barriers, cmem_bytes
    log: str


_FUNC = re.compile(r"Compiling entry function '([^']+)' for '(\w+)'")
_FRAME = re.compile(r"(\d+) bytes stack frame, (\d+) bytes spill stores, (\d+) bytes spill loads")
_USED = re.compile(r"Used (\d+) registers")


def parse_ptxas_report(log: str) -> dict[str, dict[str, int]]:
    """Parse ``ptxas -v`` into ``{kernel: {registers, shared_bytes, stack_bytes,
    spill_store_bytes, spill_load_bytes, barriers, cmem_bytes}}`` (absent items are 0)."""
    kernels: dict[str, dict[str, int]] = {}
    current: dict[str, int] | None = None
    for line in log.splitlines():
        m = _FUNC.search(line)
        if m:
            current = kernels.setdefault(m.group(1), dict(registers=0, shared_bytes=0, stack_bytes=0,
                                                           spill_store_bytes=0, spill_load_bytes=0,
                                                           barriers=0, cmem_bytes=0))
            continue
        if current is None:
            continue
        m = _FRAME.search(line)
        if m:
            current["stack_bytes"], current["spill_store_bytes"], current["spill_load_bytes"] = map(int, m.groups())
        m = _USED.search(line)
        if m:
            current["registers"] = int(m.group(1))
            for key, pat in (("shared_bytes", r"(\d+) bytes smem"), ("barriers", r"used (\d+) barriers"),
                             ("cmem_bytes", r"(\d+) bytes cmem\[0\]")):
                mm = re.search(pat, line)
                if mm:
                    current[key] = int(mm.group(1))
    return kernels


def assemble(ptx: str, chip: str = "sm_90", extra_args: tuple[str, ...] = ()) -> Assembled:
    """Assemble PTX with ``ptxas -arch=<chip> -v``; raise CudaCompileError, keeping the
    PTX file and naming the command, if ptxas is missing or rejects it."""
    exe = ptxas_path()
    if exe is None:
        raise CudaCompileError("ptxas not found", cause="put the CUDA toolkit's bin on PATH or set CUDA_HOME")
    with tempfile.TemporaryDirectory(prefix="kf-ptxas-") as tmp:
        src, dst = os.path.join(tmp, "kernel.ptx"), os.path.join(tmp, "kernel.cubin")
        with open(src, "w") as f:
            f.write(ptx)
        cmd = [exe, f"-arch={chip}", "-v", *extra_args, "-o", dst, src]
        proc = subprocess.run(cmd, capture_output=True, text=True)
        log = proc.stdout + proc.stderr
        if proc.returncode != 0:
            kept = _save_reproducer(ptx)[:-len(".mlir")] + ".ptx"
            shutil.copy(src, kept)
            raise CudaCompileError(f"ptxas rejected the PTX for {chip}", cause=log.strip(),
                                   reproducer=kept, command=" ".join(cmd[:-3] + ["-o", "/dev/null", kept]))
        with open(dst, "rb") as f:
            cubin = f.read()
    return Assembled(chip, cubin, parse_ptxas_report(log), log)


# --------------------------------------------------------------------------- command line


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m kf.passes.to_cuda",
                                 description="compile a gpu-dialect module to PTX; optionally assemble it with ptxas")
    ap.add_argument("input", help=".mlir file holding gpu.modules")
    ap.add_argument("--chip", default="sm_90")
    ap.add_argument("--ftz", action="store_true", help="libdevice flush-to-zero variants")
    ap.add_argument("--ptxas", action="store_true", help="assemble with ptxas -v and print its report as JSON")
    ap.add_argument("--split-input-file", action="store_true",
                    help="compile each '// -----' chunk on its own; a failing chunk is reported and the rest go on")
    args = ap.parse_args(argv)
    text = open(args.input).read()
    chunks = re.split(r"^// -----\s*$", text, flags=re.M) if args.split_input_file else [text]
    failed = False
    for chunk in chunks:
        try:
            ptx = compile_to_ptx(chunk, chip=args.chip, ftz=args.ftz)
            for name, body in ptx.items():
                print(f"// ----- gpu.module @{name}")
                print(body)
                if args.ptxas:
                    report = assemble(body, args.chip)
                    for kernel, info in report.kernels.items():
                        print(f"// ptxas {args.chip} {kernel}: {json.dumps(info, sort_keys=True)}")
        except CudaCompileError as e:
            sys.stdout.flush()  # keep chunks in order when stdout and stderr share a pipe
            print(e, file=sys.stderr)
            failed = True
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
