"""kf-to-spirv: lower kf's ``gpu.module`` to a validated SPIR-V binary for Vulkan (and,
through SPIRV-Cross, for Metal: see ``to_metal.py``).

Input contract: a ``gpu.module`` (``@kf_kernels``) whose ``gpu.func ... kernel``
functions take statically shaped memrefs, inputs then outputs, and use gpu ids, scf,
arith, math, memref, vector, workgroup memory and ``gpu.barrier``. The workgroup size
comes from the kernel's ``known_block_size``, an existing ``spirv.entry_point_abi`` or
the pass option ``workgroup-size`` (the KernelABI block size).

What it does, in order (the upstream part is the pipeline checked in DESIGN.md):

1. attaches ``spirv.target_env`` (Vulkan, SPIR-V 1.3, the capabilities below) to the
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
     and zero bases: ``_powf``); ``arith-expand`` rewrites floordivsi/ceildivsi;
   - 1-D ``vector.load/store`` on scalar memrefs become scalar accesses (upstream's
     pointer bitcast is illegal under Vulkan's logical addressing);
   - bf16 (see below);
   - float arithmetic with a literal +0.0 operand becomes compares and selects of the same
     IEEE value (``_shield_zero_operands``: lavapipe's code generator folds ``x * 0`` to 0);
3. runs ``gpu.module(convert-math-to-spirv), convert-gpu-to-spirv,
   spirv.module(spirv-lower-abi-attrs, spirv-update-vce)``;
4. gives every entry point the execution mode ``SignedZeroInfNanPreserve`` (SPV_KHR_float_controls)
   for the float widths it computes in: without it a Vulkan driver may assume that no inf,
   NaN or -0.0 occurs (Mesa folds ``x - x`` to 0), and torch's results are IEEE's;
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

Element types of arguments: f32, f16, i32, i64 natively (lavapipe has shaderFloat16,
Int64, Int16, Int8 and 16/8-bit storage); i1 buffers are stored as one byte per element (what
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
import math
import os
import re
import shutil
import subprocess
import tempfile

from mlir import ir
from mlir.passmanager import PassManager

from .base import KfPass, PassError
from .strategies.emit import lower_fp8_conversions

#: What kf asks of a Vulkan device by default. spirv-update-vce trims the module's
#: requirements to what it really uses, so an f32 kernel needs only Shader.
DEFAULT_CAPABILITIES = ("Shader", "Int64", "Int16", "Int8", "Float16", "StorageBuffer16BitAccess",
                        "StorageBuffer8BitAccess", "GroupNonUniform", "GroupNonUniformArithmetic",
                        "GroupNonUniformBallot", "GroupNonUniformShuffle", "SignedZeroInfNanPreserve")
DEFAULT_EXTENSIONS = ("SPV_KHR_storage_buffer_storage_class", "SPV_KHR_16bit_storage", "SPV_KHR_8bit_storage",
                      "SPV_KHR_float_controls")
#: Limits that nearly every Vulkan compute device meets (lavapipe: 32 KiB, 1024).
DEFAULT_SHARED_BYTES = 32768
DEFAULT_MAX_INVOCATIONS = 1024

#: element type of a kernel argument -> element type of its SPIR-V storage buffer.
#: (f64 is left out: Metal has no double and many Vulkan devices lack shaderFloat64; the
#: fp8 types have no SPIR-V storage here either.)
STORAGE_ELEM = {"f32": "f32", "f16": "f16", "bf16": "i16", "i1": "i8", "i32": "i32", "i64": "i64"}
_ELEM_BYTES = {"f64": 8, "f32": 4, "f16": 2, "bf16": 2, "i64": 8, "i32": 4, "i16": 2, "i8": 1, "i1": 1}


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
        return math.prod(self.shape) * _ELEM_BYTES[self.elem]


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
    parts = [int(p) for p in re.split(r"[,x\s]+", text.strip()) if p]
    if not 1 <= len(parts) <= 3 or any(p <= 0 for p in parts):
        raise ValueError(f"workgroup-size must be 1 to 3 positive integers, got '{text}'")
    return tuple(parts + [1] * (3 - len(parts)))  # type: ignore[return-value]


def _ops(block: ir.Block):
    """Every op under block, parents before children (a snapshot, safe to mutate)."""
    out = []

    def visit(b):
        for op in b.operations:
            out.append(op.operation)
            for r in op.operation.regions:
                for inner in r.blocks:
                    visit(inner)

    visit(block)
    return out


def _blocks(op: ir.Operation):
    for r in op.regions:
        for b in r.blocks:
            yield b
            for inner in b.operations:
                yield from _blocks(inner.operation)


def _elem_name(t: ir.Type) -> str:
    return str(t)


def _memory_space(t: ir.MemRefType) -> str:
    ms = t.memory_space
    return "" if ms is None else str(ms)


_SPACE_MAP = {"#gpu.address_space<workgroup>": "#spirv.storage_class<Workgroup>",
              "#gpu.address_space<private>": "#spirv.storage_class<Function>",
              "#gpu.address_space<global>": "", "3": "#spirv.storage_class<Workgroup>"}


def _retype(t: ir.Type) -> ir.Type:
    """The memref type convert-gpu-to-spirv can take: storage class spaces, bf16 as i16."""
    if not isinstance(t, ir.MemRefType):
        return t
    space = _memory_space(t)
    new_space = _SPACE_MAP.get(space, space)
    elem = t.element_type
    new_elem = ir.IntegerType.get_signless(16) if isinstance(elem, ir.BF16Type) else elem
    if new_space == space and new_elem == elem:
        return t
    ms = ir.Attribute.parse(new_space) if new_space else None
    return ir.MemRefType.get(t.shape, new_elem, t.layout, ms)


def _is_workgroup(t: ir.Type) -> bool:
    return isinstance(t, ir.MemRefType) and _memory_space(t) in (
        "#gpu.address_space<workgroup>", "#spirv.storage_class<Workgroup>", "3")


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

    def run(self, module: ir.Operation) -> None:
        gmods = [op.operation for op in module.regions[0].blocks[0].operations if op.operation.name == "gpu.module"]
        if not gmods:
            raise PassError("no gpu.module to lower", module.location)
        default = _parse_size(self.workgroup_size)
        metadata = {}
        has_bf16 = False
        for gm in gmods:
            lower_fp8_conversions(gm, cvt=False)  # fp8 roundings inside chains, through the byte
            self._attach_target(gm)
            metadata[gm.attributes["sym_name"].value] = self._prepare_kernels(gm, default)
            has_bf16 |= _mentions_bf16(gm)
        if has_bf16:
            _run(module, "gpu.module(math-extend-to-supported-types{extra-types=f16 target-type=f32}, "
                         "arith-emulate-unsupported-floats{source-types=bf16 target-type=f32})")
        for gm in gmods:
            _expand_math(gm)
            _scalarize_vector_memory(gm)
            _rewrite_memory(gm)
        for gm in gmods:  # every loop of the kernel is an scf.for or scf.while by now
            name = gm.attributes["sym_name"].value
            metadata[name] = {k: dataclasses.replace(v, loop_iterations=loop_iterations(_kernel_func(gm, k)))
                              for k, v in metadata[name].items()}
        # floordivsi/ceildivsi and friends have no SPIR-V pattern: arith-expand rewrites them
        _run(module, "gpu.module(arith-expand)")
        if has_bf16:
            _run(module, "gpu.module(arith-expand{include-bf16=true}, canonicalize)")
            for gm in gmods:
                for op in _ops(gm.regions[0].blocks[0]):
                    if any(isinstance(r.type, ir.BF16Type) for r in op.results):
                        raise PassError("a bf16 value is left after bf16 emulation (memref.load/store, arith "
                                        "and math are handled): compute in f32", op.location)
        for gm in gmods:
            _shield_zero_operands(gm)
        _run(module, "gpu.module(convert-math-to-spirv), "
                     f"convert-gpu-to-spirv{{use-64bit-index={str(self.use_64bit_index).lower()}}}, "
                     "spirv.module(spirv-lower-abi-attrs)")
        top = module.regions[0].blocks[0]
        spv_by_name = {op.operation.attributes["sym_name"].value: op.operation
                       for op in top.operations if op.operation.name == "spirv.module"}
        for spv in spv_by_name.values():
            _preserve_inf_nan(spv)
        _run(module, "spirv.module(spirv-update-vce)")
        for spv in spv_by_name.values():
            with spv.location:
                _initialize_loop_results(spv)
                _unwrap_workgroup_arrays(spv)
        for gm in gmods:
            name = gm.attributes["sym_name"].value
            spv = spv_by_name.get(f"__spv__{name}")
            if spv is None:
                raise PassError(f"convert-gpu-to-spirv produced no spirv.module for @{name}", gm.location)
            caps, exts = _vce(spv)
            # gpu.shuffle widths were checked against subgroup-size: such a kernel is only
            # right on a device with that subgroup size (the launcher checks)
            sg = self.subgroup_size if any(c.startswith("GroupNonUniform") for c in caps) else 0
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
        text = (f"#spirv.target_env<#spirv.vce<v1.3, [{', '.join(caps)}], [{', '.join(DEFAULT_EXTENSIONS)}]>, "
                f"api=Vulkan, #spirv.resource_limits<max_compute_shared_memory_size = {self.shared_memory_bytes}, "
                f"max_compute_workgroup_invocations = {DEFAULT_MAX_INVOCATIONS}, "
                f"max_compute_workgroup_size = [1024, 1024, 64], subgroup_size = {self.subgroup_size}>>")
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
                if _memory_space(t) not in ("", "#gpu.address_space<global>"):
                    raise PassError(f"kernel @{entry}: argument {i} is in memory space {t.memory_space}; "
                                    f"arguments are global buffers", op.location)
                elem = _elem_name(t.element_type)
                if elem not in STORAGE_ELEM:
                    raise PassError(f"kernel @{entry}: argument {i} has element type {elem}, which kf's SPIR-V "
                                    f"back end does not store (supported: {', '.join(STORAGE_ELEM)})", op.location)
                bindings.append(Binding(0, i, elem, STORAGE_ELEM[elem], tuple(t.shape)))
            wg = _workgroup_bytes(op)
            if wg > self.shared_memory_bytes:
                raise PassError(f"kernel @{entry} uses {wg} bytes of workgroup memory; the target allows "
                                f"{self.shared_memory_bytes}", op.location)
            out[entry] = SpirvKernel(entry, size, tuple(bindings), wg, (), ())
        if not out:
            raise PassError(f"gpu.module @{gm.attributes['sym_name'].value} has no kernel", gm.location)
        return out


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


def _workgroup_bytes(func: ir.Operation) -> int:
    total = 0
    seen = set()
    entry = func.regions[0].blocks[0]
    for a in list(entry.arguments):
        if _is_workgroup(a.type):
            total += math.prod(a.type.shape) * _ELEM_BYTES.get(str(a.type.element_type), 4)
    for op in _ops(entry):
        if op.name in ("memref.alloc", "memref.alloca") and _is_workgroup(op.results[0].type):
            t = op.results[0].type
            if id(op) not in seen:
                seen.add(id(op))
                total += math.prod(t.shape) * _ELEM_BYTES.get(str(t.element_type), 4)
    return total


def _mentions_bf16(gm: ir.Operation) -> bool:
    for b in _blocks(gm):
        for a in b.arguments:
            if "bf16" in str(a.type):
                return True
        for op in b.operations:
            if any("bf16" in str(r.type) for r in op.operation.results):
                return True
    return False


def _rewrite_memory(gm: ir.Operation) -> None:
    """Step 2 of the module docstring: attributions, workgroup allocas, address spaces, bf16."""
    from mlir.dialects import arith, memref

    with gm.location:
        _rewrite_memory_at(gm, arith, memref)


def _rewrite_memory_at(gm: ir.Operation, arith, memref) -> None:
    i16, bf16 = ir.IntegerType.get_signless(16), ir.BF16Type.get()
    for func in [o.operation for o in gm.regions[0].blocks[0].operations if o.operation.name == "gpu.func"]:
        entry = func.regions[0].blocks[0]
        n_inputs = len(ir.FunctionType(ir.TypeAttr(func.attributes["function_type"]).value).inputs)
        n_wg = ir.IntegerAttr(func.attributes["workgroup_attributions"]).value \
            if "workgroup_attributions" in func.attributes else 0
        n_attr = len(entry.arguments) - n_inputs
        with func.location:
            for k in range(n_attr):
                arg = entry.arguments[n_inputs + k]
                t = _retype(arg.type)
                ip = ir.InsertionPoint.at_block_begin(entry)
                # private attributions live in Function storage: alloca; workgroup ones need alloc
                new = memref.AllocOp(t, [], [], ip=ip) if k < n_wg else memref.AllocaOp(t, [], [], ip=ip)
                arg.replace_all_uses_with(new.result)
            for k in reversed(range(n_attr)):
                entry.erase_argument(n_inputs + k)
            if n_attr:
                func.attributes["workgroup_attributions"] = ir.IntegerAttr.get(ir.IntegerType.get_signless(64), 0)
        for op in _ops(entry):
            if op.name == "memref.alloca" and _is_workgroup(op.results[0].type):
                with op.location:
                    new = memref.AllocOp(op.results[0].type, [], [], ip=ir.InsertionPoint(op))
                op.results[0].replace_all_uses_with(new.result)
                op.erase()
        # Retype every memref value; remember bf16 loads and stores to patch afterwards.
        for b in _blocks(func):
            for a in b.arguments:
                nt = _retype(a.type)
                if nt != a.type:
                    a.set_type(nt)
        patch = []
        for op in _ops(entry):
            for r in op.results:
                nt = _retype(r.type)
                if nt != r.type:
                    r.set_type(nt)
            if op.name in ("memref.load", "memref.store"):
                patch.append(op)
            elif op.name.startswith("vector.") and any("bf16" in str(v.type) for v in op.operands):
                raise PassError(f"{op.name} on bf16 is not supported by kf-to-spirv: load scalars", op.location)
        ftype = ir.FunctionType(ir.TypeAttr(func.attributes["function_type"]).value)
        func.attributes["function_type"] = ir.TypeAttr.get(
            ir.FunctionType.get([_retype(t) for t in ftype.inputs], list(ftype.results)))
        for op in patch:
            with op.location:
                if op.name == "memref.load" and isinstance(op.results[0].type, ir.BF16Type):
                    res = op.results[0]
                    res.set_type(i16)
                    bc = arith.BitcastOp(bf16, res, ip=ir.InsertionPoint(op))
                    bc.operation.move_after(op)
                    res.replace_all_uses_except(bc.result, bc.operation)
                elif op.name == "memref.store" and isinstance(op.operands[0].type, ir.BF16Type):
                    bc = arith.BitcastOp(i16, op.operands[0], ip=ir.InsertionPoint(op))
                    op.operands[0] = bc.result


def _scalarize_vector_memory(gm: ir.Operation) -> None:
    """``vector.load/store`` of ``vector<N x T>`` on a memref of T -> N scalar accesses.

    Upstream lowers them to a bitcast of a ``T`` pointer to a ``vector<N x T>`` pointer,
    which Vulkan's logical addressing forbids (spirv-val: "is not a logical pointer").
    The arithmetic stays vectorized; the driver's compiler may merge the adjacent scalar
    accesses. (128-bit accesses need memrefs of vectors: later work.)"""
    from mlir.dialects import arith, memref, vector

    for op in _ops(gm.regions[0].blocks[0]):
        if op.name not in ("vector.load", "vector.store"):
            continue
        is_load = op.name == "vector.load"
        vtype = ir.VectorType(op.results[0].type if is_load else op.operands[0].type)
        mem = op.operands[0] if is_load else op.operands[1]
        indices = list(op.operands)[1:] if is_load else list(op.operands)[2:]
        if vtype.rank != 1 or vtype.scalable or not indices:
            raise PassError(f"{op.name} of {vtype} is not supported by kf-to-spirv (1-D fixed vectors only)",
                            op.location)
        with op.location:
            ip = ir.InsertionPoint(op)
            index = ir.IndexType.get()
            idx = []
            for k in range(vtype.shape[0]):
                if k == 0:
                    idx.append(indices[-1])
                else:
                    c = arith.ConstantOp(index, ir.IntegerAttr.get(index, k), ip=ip)
                    idx.append(arith.AddIOp(indices[-1], c.result, ip=ip).result)
            if is_load:
                elems = [memref.LoadOp(mem, indices[:-1] + [i], ip=ip).result for i in idx]
                new = vector.FromElementsOp(vtype, elems, ip=ip)
                op.results[0].replace_all_uses_with(new.result)
            else:
                for k, i in enumerate(idx):
                    e = vector.ExtractOp(op.operands[0], [], [k], ip=ip)
                    memref.StoreOp(e.result, mem, indices[:-1] + [i], ip=ip)
        op.erase()


#: math ops that upstream's MathToSPIRV (LLVM 22) has no pattern for; kf expands them.
_EXPANDED_MATH = ("math.erf", "math.erfc", "math.exp2", "math.trunc", "math.cbrt", "math.atan2", "math.ipowi",
                  "math.powf")


def _powf(x: ir.Value, y: ir.Value, c) -> ir.Value:
    """x ** y with C's (and torch's) values, from GLSL's pow, which is defined only for
    x > 0: pow(|x|, y) gives the magnitude; a negative base takes the sign of an odd
    integer exponent and is NaN for a non-integer one (except -inf, which C defines for
    every y); a zero base gives 0 or inf (signed by an odd integer exponent); and
    pow(x, 0) = pow(1, y) = pow(-1, +-inf) = 1 even for NaN operands, as C's pow."""
    from mlir.dialects import arith
    from mlir.dialects import math as m

    t, P = x.type, arith.CmpFPredicate
    ax = m.absf(x)
    p = m.powf(ax, y)
    fy = m.floor(y)
    integer = arith.cmpf(P.OEQ, fy, y)  # false for NaN, true for +-inf
    half = arith.mulf(y, c(t, 0.5))
    odd = arith.andi(integer, arith.cmpf(P.ONE, m.floor(half), half))  # every f32 of magnitude >= 2^25 is even
    signed_p = arith.select(odd, arith.negf(p), p)
    negative = arith.cmpf(P.OLT, x, c(t, 0.0))
    minus_inf = arith.cmpf(P.OEQ, x, c(t, -math.inf))
    r = arith.select(negative, arith.select(arith.ori(integer, minus_inf), signed_p, c(t, math.nan)), p)
    zero = arith.select(arith.cmpf(P.OLT, y, c(t, 0.0)), c(t, math.inf), c(t, 0.0))
    zero = arith.select(odd, m.copysign(zero, x), zero)  # (-0) ** odd keeps the sign
    zero = arith.select(arith.cmpf(P.UNO, y, y), c(t, math.nan), zero)
    r = arith.select(arith.cmpf(P.OEQ, x, c(t, 0.0)), zero, r)
    r = arith.select(arith.cmpf(P.UNO, x, y), c(t, math.nan), r)
    unit = arith.ori(arith.cmpf(P.OEQ, y, c(t, 0.0)), arith.cmpf(P.OEQ, x, c(t, 1.0)))
    unit = arith.ori(unit, arith.andi(arith.cmpf(P.OEQ, x, c(t, -1.0)),
                                      arith.cmpf(P.OEQ, m.absf(y), c(t, math.inf))))
    return arith.select(unit, c(t, 1.0), r)


def _expand_math(gm: ir.Operation) -> None:
    """Rewrite the ops of ``_EXPANDED_MATH`` into ops SPIR-V has (GLSL.std.450).

    erf: Taylor series below |x| = 0.5 (relative error < 1e-7), Abramowitz-Stegun 7.1.26
    above (absolute error < 1.5e-7); erfc: 1 - erf below 0.5, A-S directly above (so large
    arguments do not cancel to 0 early); exp2(x) = pow(2, x); trunc(x) = copysign(floor(|x|),
    x); cbrt(x) = copysign(pow(|x|, 1/3), x); atan2 by quadrant from atan(y / x);
    ipowi by square-and-multiply over the exponent's bits (negative exponents: 0, except
    for bases 1 and -1, as upstream's ipowi expansion). powf keeps GLSL's pow for the
    magnitude and takes torch's values where GLSL's pow is undefined (``_powf``)."""
    from mlir.dialects import arith, scf
    from mlir.dialects import math as m

    def c(t, v):
        if isinstance(t, ir.IntegerType):
            return arith.constant(t, int(v))
        return arith.constant(t, float(v))

    def poly(x, coeffs):  # Horner: coeffs[0] + x * (coeffs[1] + ...)
        t = x.type
        acc = c(t, coeffs[-1])
        for k in reversed(coeffs[:-1]):
            acc = arith.addf(c(t, k), arith.mulf(x, acc))
        return acc

    def erf_parts(x):
        t = x.type
        ax = m.absf(x)
        x2 = arith.mulf(x, x)
        small = arith.mulf(arith.mulf(x, c(t, 2 / math.sqrt(math.pi))),
                           poly(x2, [1.0, -1 / 3, 1 / 10, -1 / 42, 1 / 216, -1 / 1320]))
        tt = arith.divf(c(t, 1.0), arith.addf(c(t, 1.0), arith.mulf(c(t, 0.3275911), ax)))
        tail = arith.mulf(arith.mulf(tt, poly(tt, [0.254829592, -0.284496736, 1.421413741, -1.453152027,
                                                     1.061405429])), m.exp(arith.negf(x2)))
        is_small = arith.cmpf(arith.CmpFPredicate.OLT, ax, c(t, 0.5))
        return ax, small, tail, is_small

    for op in _ops(gm.regions[0].blocks[0]):
        if op.name not in _EXPANDED_MATH:
            continue
        if isinstance(op.results[0].type, ir.ShapedType):
            raise PassError(f"{op.name} on vectors is not supported by kf-to-spirv: apply it per element", op.location)
        with op.location, ir.InsertionPoint(op):
            x = op.operands[0]
            t = x.type
            if op.name == "math.erf":
                ax, small, tail, is_small = erf_parts(x)
                r = arith.select(is_small, small, m.copysign(arith.subf(c(t, 1.0), tail), x))
            elif op.name == "math.erfc":
                ax, small, tail, is_small = erf_parts(x)
                positive = arith.cmpf(arith.CmpFPredicate.OGE, x, c(t, 0.5))
                near = arith.subf(c(t, 1.0), arith.select(is_small, small, m.copysign(arith.subf(c(t, 1.0), tail), x)))
                r = arith.select(positive, tail, near)
            elif op.name == "math.powf":
                r = _powf(x, op.operands[1], c)
            elif op.name == "math.exp2":
                r = m.powf(c(t, 2.0), x)
            elif op.name == "math.trunc":
                r = m.copysign(m.floor(m.absf(x)), x)
            elif op.name == "math.cbrt":
                r = m.copysign(m.powf(m.absf(x), c(t, 1 / 3)), x)
            elif op.name == "math.atan2":
                y, xx = op.operands[0], op.operands[1]
                a = m.atan(arith.divf(y, xx))
                neg_x = arith.cmpf(arith.CmpFPredicate.OLT, m.copysign(c(t, 1.0), xx), c(t, 0.0))
                a = arith.select(arith.cmpf(arith.CmpFPredicate.OLT, xx, c(t, 0.0)),
                                 arith.addf(a, m.copysign(c(t, math.pi), y)), a)
                both_zero = arith.andi(arith.cmpf(arith.CmpFPredicate.OEQ, xx, c(t, 0.0)),
                                       arith.cmpf(arith.CmpFPredicate.OEQ, y, c(t, 0.0)))
                r = arith.select(both_zero, arith.select(neg_x, m.copysign(c(t, math.pi), y),
                                                         m.copysign(c(t, 0.0), y)), a)
            else:  # math.ipowi
                base, e = op.operands[0], op.operands[1]
                width = ir.IntegerType(t).width
                index = ir.IndexType.get()
                loop = scf.ForOp(arith.constant(index, 0), arith.constant(index, width), arith.constant(index, 1),
                                 [c(t, 1), base, e])
                with ir.InsertionPoint(loop.body):
                    acc, b, k = loop.inner_iter_args
                    bit = arith.cmpi(arith.CmpIPredicate.ne, arith.andi(k, c(t, 1)), c(t, 0))
                    scf.YieldOp([arith.select(bit, arith.muli(acc, b), acc), arith.muli(b, b),
                                 arith.shrui(k, c(t, 1))])
                pos = loop.results[0]
                odd = arith.cmpi(arith.CmpIPredicate.ne, arith.andi(e, c(t, 1)), c(t, 0))
                neg = arith.select(arith.cmpi(arith.CmpIPredicate.eq, base, c(t, 1)), c(t, 1),
                                   arith.select(arith.cmpi(arith.CmpIPredicate.eq, base, c(t, -1)),
                                                arith.select(odd, c(t, -1), c(t, 1)), c(t, 0)))
                r = arith.select(arith.cmpi(arith.CmpIPredicate.slt, e, c(t, 0)), neg, pos)
        op.results[0].replace_all_uses_with(r)
        op.erase()


def _kernel_func(gm: ir.Operation, entry: str) -> ir.Operation:
    for op in gm.regions[0].blocks[0].operations:
        op = op.operation
        if op.name == "gpu.func" and op.attributes["sym_name"].value == entry:
            return op
    raise PassError(f"no kernel @{entry} in @{gm.attributes['sym_name'].value}", gm.location)


_INF = math.inf


def _mul(a: float, b: float) -> float:
    return 0 if a == 0 or b == 0 else a * b


class _Bounds:
    """Integer bounds (lo, hi) of a kernel's index values, from its constants, its
    workgroup size and grid (``known_block_size``, ``kf.grid``), arithmetic and loop
    induction variables; (-inf, inf) where the value comes from memory or from an op
    this does not follow."""

    def __init__(self, func: ir.Operation):
        block = tuple(ir.DenseI32ArrayAttr(func.attributes["known_block_size"])) \
            if "known_block_size" in func.attributes else ()
        grid = tuple(ir.DenseI64ArrayAttr(func.attributes["kf.grid"])) if "kf.grid" in func.attributes else ()
        self.block = {d: n for d, n in zip("xyz", block)}
        self.grid = {d: n for d, n in zip("xyz", grid)}
        self.known: dict = {}

    def of(self, v: ir.Value) -> tuple[float, float]:
        hit = self.known.get(v)
        if hit is None:
            hit = self.known[v] = self._compute(v)
        return hit

    def _compute(self, v: ir.Value) -> tuple[float, float]:
        if isinstance(v.owner, ir.Block):
            return -_INF, _INF
        op = v.owner.operation
        name, args = op.name, list(op.operands)
        if name == "arith.constant":
            attr = op.attributes["value"]
            return (ir.IntegerAttr(attr).value,) * 2 if isinstance(attr, ir.IntegerAttr) else (-_INF, _INF)
        if name in ("gpu.thread_id", "gpu.block_id", "gpu.block_dim", "gpu.grid_dim"):
            dim = str(op.attributes["dimension"]).rstrip(">").split()[-1]  # #gpu<dim x>
            size = (self.block if name in ("gpu.thread_id", "gpu.block_dim") else self.grid).get(dim)
            if name in ("gpu.block_dim", "gpu.grid_dim"):
                return (size, size) if size else (1, _INF)
            return 0, (size - 1 if size else _INF)
        if name in ("arith.index_cast", "arith.index_castui", "arith.extsi", "arith.extui", "arith.trunci"):
            return self.of(args[0])
        if name == "arith.select":
            (a, b), (c, d) = self.of(args[1]), self.of(args[2])
            return min(a, c), max(b, d)
        if len(args) != 2:
            return -_INF, _INF
        (a, b), (c, d) = self.of(args[0]), self.of(args[1])
        if name == "arith.addi":
            return a + c, b + d
        if name == "arith.subi":
            return a - d, b - c
        if name == "arith.muli":
            ends = [_mul(x, y) for x in (a, b) for y in (c, d)]
            return min(ends), max(ends)
        if name in ("arith.minsi", "arith.minui"):
            return min(a, c), min(b, d)
        if name in ("arith.maxsi", "arith.maxui"):
            return max(a, c), max(b, d)
        if c == d and c > 0:  # by a positive constant
            if name in ("arith.divui", "arith.divsi", "arith.floordivsi") and a >= 0:
                return a // c, (b // c if b < _INF else _INF)
            if name in ("arith.ceildivui", "arith.ceildivsi") and a >= 0:
                return -(-a // c), (-(-b // c) if b < _INF else _INF)
            if name in ("arith.remui", "arith.remsi") and a >= 0:
                return 0, min(b, c - 1)
        return -_INF, _INF

    def trips(self, loop: ir.Operation) -> float:
        """At most how many times an scf.for runs its body."""
        lb, ub, step = (self.of(x) for x in list(loop.operands)[:3])
        if step[0] <= 0:
            return _INF
        span = ub[1] - lb[0]
        return max(0, math.ceil(span / step[0])) if span < _INF else _INF


def loop_iterations(func: ir.Operation) -> int:
    """At most how many loop iterations one invocation of a kernel runs, all loops
    together (-1 where no bound is known): a loop that runs t times counts t + 1 (its
    exit test), a nested loop once per iteration of the loops around it, and both
    branches of an ``scf.if`` count (a SIMD group of invocations runs both).

    Why: Mesa's lavapipe (llvmpipe) stops every shader invocation after 65535 loop
    iterations in all, its guard against infinite loops, and the work after that is
    silently dropped; the Vulkan launcher refuses a kernel over a device's limit."""
    bounds = _Bounds(func)

    def cost(block: ir.Block) -> float:
        total = 0.0
        for op in block.operations:
            op = op.operation
            if op.name == "scf.while":
                return _INF
            if op.name == "scf.for":
                body = op.regions[0].blocks[0]
                lb, ub = bounds.of(op.operands[0]), bounds.of(op.operands[1])
                bounds.known[body.arguments[0]] = (lb[0], ub[1] - 1)
                t = bounds.trips(op)
                total += t + 1 + _mul(t, cost(body))
            else:
                total += sum(cost(b) for r in op.regions for b in r.blocks)
        return total

    n = sum(cost(b) for b in func.regions[0].blocks)
    return int(n) if n < _INF else -1


def _zero_constant(v: ir.Value) -> float | None:
    """+0.0 or -0.0 where v is that constant (a scalar, or a splat or broadcast vector of it)."""
    owner = v.owner
    if isinstance(owner, ir.Block):
        return None
    if owner.name == "vector.broadcast":
        return _zero_constant(owner.operands[0])
    if owner.name != "arith.constant":
        return None
    attr = owner.attributes["value"]
    if isinstance(attr, ir.DenseElementsAttr):
        if not attr.is_splat:
            return None
        attr = attr.get_splat_value()
    if not isinstance(attr, ir.FloatAttr) or attr.value != 0.0:
        return None
    return attr.value


def _shield_zero_operands(gm: ir.Operation) -> None:
    """Rewrite float arithmetic on a literal zero into compares and selects of the same IEEE value.

    Mesa's llvmpipe code generator (gallivm, under lavapipe) returns 0 for ``x * 0``, x for
    ``x + 0`` and ``x / 0`` and 0 for ``0 / x`` when the zero is the constant +0.0 (and
    the driver turns ``x - (-0.0)`` into ``x + 0.0``), whatever the execution modes say:
    inf * 0 became 0 instead of NaN, -0 + 0 stayed -0. The forms below give IEEE's results
    with no arithmetic on a zero, on every driver: ``x * 0`` = NaN where x is not finite,
    else 0 with x's sign; ``x + 0`` and ``x - (-0)`` = 0 where x == 0, else x; ``0 - x`` = 0
    where x == 0, else -x; ``x / 0`` = x * inf; ``0 / x`` = NaN where x is 0 or NaN, else 0
    with x's sign. Arithmetic on -0.0 otherwise is left alone (no driver folds it wrongly)."""
    from mlir.dialects import arith
    from mlir.dialects import math as m

    def const(t, value):
        if isinstance(t, ir.VectorType):
            return arith.constant(t, ir.DenseElementsAttr.get_splat(t, ir.FloatAttr.get(t.element_type, value)))
        return arith.constant(t, value)

    def signed_zero(x):
        return m.copysign(const(x.type, 0.0), x)

    def positive(z):
        return z is not None and math.copysign(1.0, z) > 0

    for op in _ops(gm.regions[0].blocks[0]):
        if op.name not in ("arith.mulf", "arith.addf", "arith.subf", "arith.divf"):
            continue
        lhs, rhs = op.operands
        zl, zr = _zero_constant(lhs), _zero_constant(rhs)
        if (zl is None) == (zr is None):
            continue
        x = rhs if zl is not None else lhs
        P = arith.CmpFPredicate
        with op.location, ir.InsertionPoint(op):
            if op.name == "arith.mulf" and positive(zl if zl is not None else zr):
                finite = arith.cmpf(P.ONE, m.absf(x), const(x.type, math.inf))
                r = arith.select(finite, signed_zero(x), const(x.type, math.nan))
            elif (op.name == "arith.addf" and positive(zl if zl is not None else zr)) or \
                    (op.name == "arith.subf" and zr is not None and not positive(zr)):
                r = arith.select(arith.cmpf(P.OEQ, x, const(x.type, 0.0)), const(x.type, 0.0), x)
            elif op.name == "arith.subf" and positive(zl):
                r = arith.select(arith.cmpf(P.OEQ, x, const(x.type, 0.0)), const(x.type, 0.0), arith.negf(x))
            elif op.name == "arith.divf" and positive(zr):
                r = arith.mulf(x, const(x.type, math.inf))
            elif op.name == "arith.divf" and positive(zl):
                r = arith.select(arith.cmpf(P.UEQ, x, const(x.type, 0.0)), const(x.type, math.nan), signed_zero(x))
            else:
                continue
        op.results[0].replace_all_uses_with(r)
        op.erase()


def _preserve_inf_nan(spv: ir.Operation) -> None:
    """Give every entry point ``SignedZeroInfNanPreserve`` for each float width it computes in
    (the results of the module's float arithmetic).

    Without it a Vulkan driver may assume no inf, NaN or -0.0 (Mesa folds ``x * 0.0`` to 0,
    ``x - x`` to 0, ``x + 0.0`` to x), and kf's results must be IEEE's, as torch's are. The
    mode needs SPV_KHR_float_controls (core in Vulkan 1.2); the launcher checks the device's
    ``shaderSignedZeroInfNanPreserveFloat{16,32}``."""
    from mlir.dialects import spirv as spirv_d

    body = spv.regions[0].blocks[0]
    widths = set()
    for op in _ops(body):
        if op.name.startswith(("spirv.F", "spirv.GL.", "spirv.CL.")) and op.name != "spirv.FConvert":
            for r in op.results:
                m = re.search(r"\bf(16|32|64)\b", str(r.type))
                if m:
                    widths.add(int(m.group(1)))
    i32 = ir.IntegerType.get_signless(32)
    for op in list(body.operations):
        op = op.operation
        if op.name != "spirv.EntryPoint":
            continue
        with op.location:
            mode = ir.Attribute.parse("#spirv.execution_mode<SignedZeroInfNanPreserve>")
            for w in sorted(widths):
                spirv_d.ExecutionModeOp(op.attributes["fn"], mode, ir.ArrayAttr.get([ir.IntegerAttr.get(i32, w)]),
                                        ip=ir.InsertionPoint(body))


def _initialize_loop_results(spv: ir.Operation) -> None:
    """Store each scf.for result variable's initial value before its spirv.mlir.loop.

    Upstream lowers ``%r = scf.for ... iter_args(%a = %init)`` to a Function variable
    declared before the loop, stored from the back edge (``spirv.Store %var, %next`` then
    ``spirv.Branch ^header(%iv_next, %next)``) and loaded after it: with zero trips
    nothing was stored. The value stored on the back edge is header operand j; the
    initial value is operand j of the loop's entry branch."""
    for op in _ops(spv.regions[0].blocks[0]):
        if op.name != "spirv.mlir.loop":
            continue
        blocks = list(op.regions[0].blocks)
        if len(blocks) < 2:
            continue
        entry_ops = list(blocks[0].operations)
        if not entry_ops or entry_ops[-1].operation.name != "spirv.Branch":
            continue
        inits = list(entry_ops[-1].operation.operands)
        header = blocks[1]
        done = set()
        for b in blocks[1:]:
            ops = [o.operation for o in b.operations]
            if not ops or ops[-1].name != "spirv.Branch" or ops[-1].successors[0] != header:
                continue
            back = list(ops[-1].operands)
            for st in ops[:-1]:
                if st.name != "spirv.Store":
                    continue
                var, val = st.operands[0], st.operands[1]
                owner = var.owner
                if isinstance(owner, ir.Block) or owner.name != "spirv.Variable" or \
                        owner.parent != op.parent or id(owner) in done:
                    continue
                j = next((k for k, v in enumerate(back) if v == val), None)
                if j is None or j >= len(inits):
                    continue
                init = st.clone(ip=ir.InsertionPoint(op))
                init.operands[1] = inits[j]
                done.add(id(owner))


def _unwrap_workgroup_arrays(spv: ir.Operation) -> None:
    """``!spirv.ptr<!spirv.struct<(!spirv.array<N x T>)>, Workgroup>`` -> ``!spirv.ptr<
    !spirv.array<N x T>, Workgroup>``, dropping the leading 0 of every access chain. A
    variable used any other way keeps its struct."""
    from mlir.dialects import spirv as spirv_d

    body = spv.regions[0].blocks[0]
    wrapped = re.compile(r"^!spirv\.ptr<!spirv\.struct<\((!spirv\.array<[^()]*>)\)>, Workgroup>$")
    globals_ = {}
    for op in body.operations:
        op = op.operation
        if op.name == "spirv.GlobalVariable":
            m = wrapped.match(str(ir.TypeAttr(op.attributes["type"]).value))
            if m:
                globals_[op.attributes["sym_name"].value] = (op, m.group(1))
    if not globals_:
        return
    uses: dict[str, list] = {name: [] for name in globals_}
    ok = dict.fromkeys(globals_, True)
    for op in _ops(body):
        if op.name != "spirv.mlir.addressof":
            continue
        name = ir.FlatSymbolRefAttr(op.attributes["variable"]).value
        if name not in globals_:
            continue
        uses[name].append(op)
        for use in op.results[0].uses:
            user = use.owner
            if user.name != "spirv.AccessChain" or use.operand_number != 0 or len(user.operands) < 3 or \
                    not _is_zero_constant(user.operands[1]):
                ok[name] = False
    for name, (var, array) in globals_.items():
        if not ok[name]:
            continue
        new_type = ir.Type.parse(f"!spirv.ptr<{array}, Workgroup>")
        var.attributes["type"] = ir.TypeAttr.get(new_type)
        for addr in uses[name]:
            addr.results[0].set_type(new_type)
            for chain in [u.owner for u in addr.results[0].uses]:
                with chain.location:
                    new = spirv_d.AccessChainOp(chain.results[0].type, chain.operands[0], list(chain.operands)[2:],
                                                ip=ir.InsertionPoint(chain))
                chain.results[0].replace_all_uses_with(new.result)
                chain.erase()


def _is_zero_constant(v: ir.Value) -> bool:
    owner = v.owner
    return not isinstance(owner, ir.Block) and owner.name == "spirv.Constant" and \
        str(owner.attributes["value"]).split(":")[0].strip() == "0"


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


def validate(binary: bytes, name: str = "module", location: ir.Location | None = None) -> None:
    """Run ``spirv-val --target-env vulkan1.1`` on binary; raise with its output and a
    reproducer (the binary is kept on disk) when it rejects the module. No tool: no check."""
    tool = shutil.which("spirv-val")
    if tool is None:
        return
    with tempfile.NamedTemporaryFile(suffix=".spv", delete=False, prefix=f"kf-{name}-") as f:
        f.write(binary)
        path = f.name
    r = subprocess.run([tool, "--target-env", "vulkan1.1", path], capture_output=True, text=True)
    if r.returncode != 0:
        raise SpirvValidationError(f"spirv-val rejected @{name}:\n{r.stdout}{r.stderr}\nreproduce: "
                                   f"{tool} --target-env vulkan1.1 {path}", location)
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
