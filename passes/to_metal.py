"""kf-to-metal: kf's Metal target is its Vulkan SPIR-V cross-compiled to MSL by SPIRV-Cross
(as IREE's Metal target does), so Metal and Vulkan run the same lowered kernel.

The pass runs ``kf-to-spirv`` first when the module has no SPIR-V ``gpu.binary`` yet
(its ``workgroup-size`` option is passed on), then compiles every entry point on its
own with ``spirv-cross --msl --msl-decoration-binding --entry <name>`` (or the same
through libspirv-cross-c-shared by ctypes where the CLI is missing): one MSL source
per kernel, because SPIRV-Cross emits one entry point per run and the helper types of two
runs would clash in one source. Each kernel is first cut out of the module
(``single_entry``) so that it does not inherit its siblings' threadgroup arrays.
``--msl-decoration-binding`` makes ``[[buffer(i)]]`` the
SPIR-V binding i, i.e. kernel argument i, so a Metal launcher binds tensor i at index i
(what ``torch.mps.compile_shader`` does with positional tensor arguments).

Results, on the ``gpu.binary`` beside its SPIR-V object:
- ``kf.msl = {entry = "<MSL source>"}``;
- ``kf.metal = {entry = {function = "<MSL kernel name>", threadgroup_size = array<i64: x, y, z>,
  buffers = array<i64: ...>, threadgroup_bytes = N}}``; ``buffers`` lists the indices
  present in the MSL signature (SPIRV-Cross drops a buffer the kernel never touches).
Workgroup memory comes out as ``threadgroup`` arrays and ``gpu.barrier`` as
``threadgroup_barrier(mem_flags::mem_threadgroup)``. bf16 buffers are ``ushort`` (see
kf-to-spirv), so a Metal launcher hands over bf16 tensors' bytes unchanged.

``compile_metal`` returns the same facts as plain data, and ``python -m kf.passes.to_metal
file.mlir`` prints the MSL (the lit test reads it that way).
"""

from __future__ import annotations

import argparse
import array
import dataclasses
import os
import re
import shutil
import subprocess
import sys
import tempfile

from mlir import ir

from .base import KfPass, PassError
from .to_spirv import SpirvKernel, ToSpirvPass, _object_bytes, kernels_from_attr, validate

#: MSL 2.3 (macOS 11): the oldest that torch's MPS back end runs on.
DEFAULT_MSL_VERSION = 20300
#: the buffer argument table of a Metal kernel: [[buffer(0)]] .. [[buffer(30)]]
MAX_BUFFER_INDEX = 31


@dataclasses.dataclass(frozen=True)
class MetalKernel:
    """One kernel's MSL and the facts a Metal launcher needs."""

    entry: str  # the SPIR-V entry point (the gpu.func name)
    function: str  # the MSL kernel function name (SPIRV-Cross renames e.g. 'main')
    source: str
    threadgroup_size: tuple[int, int, int]
    buffers: tuple[int, ...]
    threadgroup_bytes: int
    spirv: SpirvKernel

    def abi_extra(self) -> dict:
        """What goes into ``KernelABI.extra`` for runtime/metal.py."""
        extra = self.spirv.abi_extra()
        extra.update({"msl_function": self.function, "threadgroup_size": list(self.threadgroup_size),
                      "msl_buffers": list(self.buffers)})
        return extra


_OP_ENTRY_POINT, _OP_EXECUTION_MODE, _OP_EXECUTION_MODE_ID = 15, 16, 331


def single_entry(binary: bytes, entry: str) -> bytes:
    """The SPIR-V module with only one entry point, and what only the others used removed.

    SPIRV-Cross (2021.01 here) declares every module-scope Workgroup variable inside the
    kernel it emits, used or not: the threadgroup arrays of one kernel would be allocated
    by all. So each kernel is cut out first: its siblings' OpEntryPoint/OpExecutionMode go
    (plain word surgery: the instruction layout is fixed by the SPIR-V spec), then
    ``spirv-opt`` drops the dead functions, variables and types. Without spirv-opt the
    module is returned unchanged (correct, only wasteful)."""
    if len(binary) % 4:
        raise PassError(f"not a little-endian SPIR-V binary ({len(binary)} bytes: not whole 32-bit words)")
    words = array.array("I", binary)
    if len(words) < 5 or words[0] != 0x07230203:
        raise PassError("not a little-endian SPIR-V binary")
    out = array.array("I", words[:5])
    others: set[int] = set()
    found = False
    pos = 5
    insts = []
    while pos < len(words):
        count, opcode = words[pos] >> 16, words[pos] & 0xFFFF
        if count == 0:
            raise PassError("malformed SPIR-V: zero-length instruction")
        inst = words[pos:pos + count]
        if opcode == _OP_ENTRY_POINT:
            name = inst[3:].tobytes().split(b"\0", 1)[0].decode()
            if name == entry:
                found = True
            else:
                others.add(inst[2])
        insts.append((opcode, inst))
        pos += count
    if not found:
        raise PassError(f"the SPIR-V has no entry point '{entry}'")
    if not others:
        return binary
    for opcode, inst in insts:
        if opcode == _OP_ENTRY_POINT and inst[2] in others:
            continue
        if opcode in (_OP_EXECUTION_MODE, _OP_EXECUTION_MODE_ID) and inst[1] in others:
            continue
        out.extend(inst)
    tool = shutil.which("spirv-opt")
    if tool is None:
        return out.tobytes()
    with tempfile.TemporaryDirectory(prefix="kf-spv-") as d:
        src, dst = os.path.join(d, "in.spv"), os.path.join(d, "out.spv")
        with open(src, "wb") as f:
            f.write(out.tobytes())
        cmd = [tool, "--eliminate-dead-functions", "--eliminate-dead-variables", "--eliminate-dead-code-aggressive",
               src, "-o", dst]
        r = subprocess.run(cmd, capture_output=True, text=True)
        if r.returncode != 0:
            raise PassError(f"spirv-opt failed while cutting out @{entry}:\n{r.stderr}")
        with open(dst, "rb") as f:
            cut = f.read()
    validate(cut, entry)
    return cut


def spirv_to_msl(binary: bytes, entry: str, msl_version: int = DEFAULT_MSL_VERSION, via: str = "auto") -> str:
    """MSL for one entry point of a SPIR-V binary, through the spirv-cross CLI or, where
    that is missing (or via="library"), libspirv-cross-c-shared; both give the same text."""
    binary = single_entry(binary, entry)
    tool = shutil.which("spirv-cross")
    if via == "library" or (via == "auto" and tool is None):
        return _msl_with_library(binary, entry, msl_version)
    if tool is None:
        raise PassError("spirv-cross is not on PATH: install the Debian package spirv-cross")
    with tempfile.NamedTemporaryFile(suffix=".spv", delete=False, prefix=f"kf-{entry}-") as f:
        f.write(binary)
        path = f.name
    cmd = [tool, "--msl", "--msl-version", str(msl_version), "--msl-decoration-binding", "--entry", entry,
           "--stage", "comp", path]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0 or "kernel void" not in r.stdout:
        raise PassError(f"spirv-cross failed on @{entry}:\n{r.stderr or r.stdout}\nreproduce: {' '.join(cmd)}")
    os.unlink(path)
    return r.stdout


# From spirv_cross_c.h (C API 0.x): option = number | language bit.
_SPVC_BACKEND_MSL, _SPVC_TAKE_OWNERSHIP, _SPV_GLCOMPUTE = 3, 1, 5
_SPVC_MSL_BIT = 0x08000000
_SPVC_MSL_VERSION, _SPVC_MSL_DECORATION_BINDING = 17 | _SPVC_MSL_BIT, 49 | _SPVC_MSL_BIT


def _msl_with_library(binary: bytes, entry: str, msl_version: int) -> str:
    """The CLI's ``--msl --msl-version V --msl-decoration-binding --entry E`` through the
    SPIRV-Cross C API (Debian libspirv-cross-c-shared0), by ctypes."""
    import ctypes
    import ctypes.util

    name = ctypes.util.find_library("spirv-cross-c-shared") or "libspirv-cross-c-shared.so.0"
    try:
        lib = ctypes.CDLL(name)
    except OSError:
        raise PassError("neither the spirv-cross CLI nor libspirv-cross-c-shared is installed "
                        "(Debian packages spirv-cross, libspirv-cross-c-shared0)") from None
    vp, u32 = ctypes.c_void_p, ctypes.c_uint32
    lib.spvc_context_create.argtypes = [ctypes.POINTER(vp)]
    lib.spvc_context_destroy.argtypes = [vp]
    lib.spvc_context_get_last_error_string.argtypes = [vp]
    lib.spvc_context_get_last_error_string.restype = ctypes.c_char_p
    lib.spvc_context_parse_spirv.argtypes = [vp, ctypes.POINTER(u32), ctypes.c_size_t, ctypes.POINTER(vp)]
    lib.spvc_context_create_compiler.argtypes = [vp, ctypes.c_int, vp, ctypes.c_int, ctypes.POINTER(vp)]
    lib.spvc_compiler_create_compiler_options.argtypes = [vp, ctypes.POINTER(vp)]
    lib.spvc_compiler_options_set_uint.argtypes = [vp, ctypes.c_int, ctypes.c_uint]
    lib.spvc_compiler_options_set_bool.argtypes = [vp, ctypes.c_int, ctypes.c_ubyte]
    lib.spvc_compiler_install_compiler_options.argtypes = [vp, vp]
    lib.spvc_compiler_set_entry_point.argtypes = [vp, ctypes.c_char_p, ctypes.c_int]
    lib.spvc_compiler_compile.argtypes = [vp, ctypes.POINTER(ctypes.c_char_p)]
    ctx = vp()
    if lib.spvc_context_create(ctypes.byref(ctx)) != 0:
        raise PassError("spvc_context_create failed")
    try:
        words = (u32 * (len(binary) // 4)).from_buffer_copy(binary)
        parsed, compiler, options, source = vp(), vp(), vp(), ctypes.c_char_p()
        steps = [
            lambda: lib.spvc_context_parse_spirv(ctx, words, len(words), ctypes.byref(parsed)),
            lambda: lib.spvc_context_create_compiler(ctx, _SPVC_BACKEND_MSL, parsed, _SPVC_TAKE_OWNERSHIP,
                                                     ctypes.byref(compiler)),
            lambda: lib.spvc_compiler_create_compiler_options(compiler, ctypes.byref(options)),
            lambda: lib.spvc_compiler_options_set_uint(options, _SPVC_MSL_VERSION, msl_version),
            lambda: lib.spvc_compiler_options_set_bool(options, _SPVC_MSL_DECORATION_BINDING, 1),
            lambda: lib.spvc_compiler_install_compiler_options(compiler, options),
            lambda: lib.spvc_compiler_set_entry_point(compiler, entry.encode(), _SPV_GLCOMPUTE),
            lambda: lib.spvc_compiler_compile(compiler, ctypes.byref(source)),
        ]
        for step in steps:
            if step() != 0:
                raise PassError(f"SPIRV-Cross failed on @{entry}: "
                                f"{(lib.spvc_context_get_last_error_string(ctx) or b'').decode()}")
        return source.value.decode()
    finally:
        lib.spvc_context_destroy(ctx)


_KERNEL = re.compile(r"kernel\s+void\s+(\w+)\s*\(([^()]*(?:\([^()]*\)[^()]*)*)\)", re.S)


def _signature(msl: str, entry: str) -> tuple[str, tuple[int, ...]]:
    m = _KERNEL.search(msl)
    if not m:
        raise PassError(f"no kernel function in the MSL of @{entry}")
    buffers = tuple(int(b) for b in re.findall(r"\[\[buffer\((\d+)\)\]\]", m.group(2)))
    return m.group(1), buffers


@dataclasses.dataclass(frozen=True)
class ToMetalPass(KfPass):
    NAME = "kf-to-metal"
    DESCRIPTION = "SPIR-V through SPIRV-Cross to MSL, with threadgroup sizes and buffer indices"

    workgroup_size: str = ""  # passed to kf-to-spirv when it has not run yet
    msl_version: int = DEFAULT_MSL_VERSION

    def run(self, module: ir.Operation) -> None:
        if not 10000 <= self.msl_version < 40000:
            raise PassError(f"msl-version is major * 10000 + minor * 100 (20300: MSL 2.3), got {self.msl_version}",
                            module.location)
        top = module.regions[0].blocks[0]
        if any(op.operation.name == "spirv.module" for op in top.operations):
            raise PassError("kf-to-metal needs the serialized SPIR-V: run kf-to-spirv without serialize=false",
                            module.location)
        if not any(op.operation.name == "gpu.binary" and "kf.kernels" in op.operation.attributes
                   for op in top.operations):
            ToSpirvPass(workgroup_size=self.workgroup_size).run(module)
        found = False
        for op in top.operations:
            op = op.operation
            if op.name != "gpu.binary" or "kf.kernels" not in op.attributes:
                continue
            found = True
            binary = _object_bytes(op)
            sources, facts = {}, {}
            i64 = ir.IntegerType.get_signless(64)
            for entry, k in kernels_from_attr(op.attributes["kf.kernels"]).items():
                try:
                    mk = self.kernel(binary, k)
                except PassError as e:
                    raise PassError(str(e), op.location) from None
                sources[entry] = ir.StringAttr.get(mk.source)
                facts[entry] = ir.DictAttr.get({
                    "function": ir.StringAttr.get(mk.function),
                    "threadgroup_size": ir.DenseI64ArrayAttr.get(list(mk.threadgroup_size)),
                    "buffers": ir.DenseI64ArrayAttr.get(list(mk.buffers)),
                    "threadgroup_bytes": ir.IntegerAttr.get(i64, mk.threadgroup_bytes)})
            op.attributes["kf.msl"] = ir.DictAttr.get(sources)
            op.attributes["kf.metal"] = ir.DictAttr.get(facts)
        if not found:
            raise PassError("no SPIR-V gpu.binary to cross-compile", module.location)

    def kernel(self, binary: bytes, k: SpirvKernel) -> MetalKernel:
        if "Float64" in k.capabilities:
            raise PassError(f"@{k.entry} computes in float64, which Metal does not have: use float32")
        msl = spirv_to_msl(binary, k.entry, self.msl_version)
        function, buffers = _signature(msl, k.entry)
        unknown = [b for b in buffers if b >= len(k.bindings)]
        if unknown:
            raise PassError(f"@{k.entry}: MSL buffer indices {unknown} are not kernel arguments "
                            f"(0..{len(k.bindings) - 1})")
        if k.workgroup_bytes and "threadgroup " not in msl:
            raise PassError(f"@{k.entry} uses workgroup memory but its MSL has no threadgroup array")
        if max(buffers, default=-1) >= MAX_BUFFER_INDEX:
            raise PassError(f"@{k.entry} binds {len(k.bindings)} buffers; a Metal kernel's buffer argument table "
                            f"has {MAX_BUFFER_INDEX} entries")
        return MetalKernel(k.entry, function, msl, k.workgroup_size, buffers, k.workgroup_bytes, k)


def compile_metal(module: ir.Module | ir.Operation | str, workgroup_size: tuple[int, ...] | None = None,
                  msl_version: int = DEFAULT_MSL_VERSION) -> dict[str, MetalKernel]:
    """MSL for every kernel of module's gpu.module(s), keyed by entry point; the module
    itself is not changed. Raises PassError."""
    from .to_spirv import compile_spirv

    out = {}
    p = ToMetalPass(msl_version=msl_version)
    for b in compile_spirv(module, workgroup_size):
        for k in b.kernels.values():
            out[k.entry] = p.kernel(b.binary, k)
    return out


def main(argv: list[str] | None = None) -> int:
    """Print the MSL of every kernel in a .mlir file (gpu dialect), one after another."""
    ap = argparse.ArgumentParser(prog="python -m kf.passes.to_metal", description=main.__doc__)
    ap.add_argument("input")
    ap.add_argument("--workgroup-size", default="", help="e.g. 256 or 16,16,1, for kernels without known_block_size")
    ap.add_argument("--msl-version", type=int, default=DEFAULT_MSL_VERSION)
    args = ap.parse_args(argv)
    size = tuple(int(x) for x in re.split(r"[,x]", args.workgroup_size) if x) or None
    try:
        kernels = compile_metal(open(args.input).read(), size, args.msl_version)
    except (PassError, ir.MLIRError) as e:
        print(f"{args.input}: error: {e}", file=sys.stderr)
        return 1
    for k in kernels.values():
        print(f"// kernel {k.entry}: function {k.function}, threadgroup {list(k.threadgroup_size)}, "
              f"buffers {list(k.buffers)}, threadgroup bytes {k.threadgroup_bytes}")
        print(k.source)
    return 0


if __name__ == "__main__":
    sys.exit(main())
