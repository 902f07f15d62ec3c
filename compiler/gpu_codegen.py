"""The GPU half of the driver: from kernels written by the strategies to a ProgramABI
and the target's binaries.

After ``kf-map-to-gpu`` the entry function is a launch schedule: ``kf.constant`` ops
(host data), and ``func.call``s of kernel declarations whose ``kf.gpu_func`` names the
gpu.func to launch (``kf-linalg-to-gpu`` adds calls whose results are written in place:
``kf.tied`` names the operand whose buffer each result is). This module numbers the program's buffers (the user's inputs, then
the constants, then the outputs, then temporaries), writes one KernelABI per call, and
lowers the gpu.module with ``kf-to-cuda`` (PTX), ``kf-to-spirv`` (SPIR-V) or
``kf-to-metal`` (MSL).
"""

from __future__ import annotations

import shutil
import subprocess
import tempfile

import numpy as np
from math import prod
from mlir import ir

from kf.dialects.attrs import from_attr
from kf.dialects.types import spec_of
from kf.passes.map_to_gpu import GPU_MODULE
from kf.runtime.abi import DYN, ELEM_INFO, IndexSite, KernelABI, ProgramABI, TensorArg

from .errors import DynamicFallback, TargetError


def _func(module: ir.Module, name: str) -> ir.Operation:
    for op in module.body.operations:
        op = op.operation
        if op.name == "func.func" and ir.StringAttr(op.attributes["sym_name"]).value == name:
            return op
    raise KeyError(name)


def _gpu_funcs(module: ir.Module) -> dict[str, ir.Operation]:
    out = {}
    for op in module.body.operations:
        op = op.operation
        if op.name == "gpu.module":
            for f in op.regions[0].blocks[0].operations:
                f = f.operation
                if f.name == "gpu.func":
                    out[ir.StringAttr(f.attributes["sym_name"]).value] = f
    return out


def _targ(name: str, t: ir.Type, dims: tuple[str, ...] = ()) -> TensorArg:
    s = spec_of(t)
    if DYN not in s.shape:
        return TensorArg(name, s.shape, s.elem)
    if len(dims) != len(s.shape):
        raise DynamicFallback(f"the GPU kernels' buffer {name} ({t}) has run-time sizes kf cannot name")
    return TensorArg(name, s.shape, s.elem, tuple(dims))


def _view_dims(arg: TensorArg, t: ir.Type) -> tuple:
    """The dims (expressions over the symbols; None at a static dim) of a value of type
    t that lies in buffer arg: the buffer's own, or, for a view of another shape (a
    reshape the schedule kept), its one run-time dim as the buffer's elements over the
    view's static dims. () where the buffer's dims are not named."""
    shape = tuple(spec_of(t).shape)
    if not arg.dims:
        return ()
    if tuple(arg.shape) == shape:
        return tuple(e if d == DYN else None for d, e in zip(arg.shape, arg.dims))
    if shape.count(DYN) != 1:
        return ()
    numel = "*".join(f"({e})" if d == DYN else str(d) for d, e in zip(arg.shape, arg.dims))
    text = f"FloorDiv({numel}, {prod(d for d in shape if d != DYN)})"
    return tuple(text if d == DYN else None for d in shape)


def _named_over(text: str, call: ir.Operation, buffer_of: dict, buffers: list[TensorArg]) -> str | None:
    """A kernel's size text over its arguments' slots (``a<pos>d<dim>``) as an expression
    over the program's symbols, by the dims of the buffers the call passes; None where
    one of them has no named dims."""
    import re

    def named(m):
        pos, dim = int(m.group(1)), int(m.group(2))
        arg = buffers[buffer_of[call.operands[pos]]] if call.operands[pos] in buffer_of else None
        dims = _view_dims(arg, call.operands[pos].type) if arg is not None else ()
        if not dims or dims[dim] is None:
            raise KeyError
        return f"({dims[dim]})"

    try:
        return re.sub(r"a(\d+)d(\d+)", named, text)
    except KeyError:
        return None


def _texts(callee: ir.Operation, key: str) -> list[str]:
    return [ir.StringAttr(t).value for t in ir.ArrayAttr(callee.attributes[key])] if key in callee.attributes \
        else []


def _result_dims(callee: ir.Operation, call: ir.Operation, r: ir.Value, buffer_of: dict,
                 buffers: list[TensorArg], ops: list[ir.Operation], module: ir.Module) -> tuple[str, ...]:
    """The dims of a kernel's result as expressions over the program's symbols, where it
    has a run-time size that the kernel names in terms of its inputs' (``kf.result_sizes``,
    passes/map_to_gpu.py), or that a later kernel reading it names in terms of its other
    inputs' (``kf.input_sizes``: a size that comes from no input of the writing kernel, a
    slice of a static table); () elsewhere (a static result, or a size not named)."""
    s = spec_of(r.type)
    if DYN not in s.shape:
        return ()
    which = list(call.results).index(r)
    texts = _texts(callee, "kf.result_sizes")
    text = _named_over(texts[which], call, buffer_of, buffers) if which < len(texts) and texts[which] else None
    if text is None:
        for op in ops:  # a later kernel that reads r as it is
            if op.name != "func.call" or r not in list(op.operands):
                continue
            reader = _func(module, ir.FlatSymbolRefAttr(op.attributes["callee"]).value)
            pos = list(op.operands).index(r)
            inputs = _texts(reader, "kf.input_sizes")
            if pos < len(inputs) and inputs[pos]:
                text = _named_over(inputs[pos], op, buffer_of, buffers)
                if text is not None:
                    break
    if text is None:
        return ()
    return tuple(text if d == DYN else str(d) for d in s.shape)


def _slot_sizes(g: ir.Operation, args: tuple[int, ...], buffers: list[TensorArg],
                types: list[ir.Type]) -> tuple[tuple, tuple]:
    """(the slots' sizes as expressions over the program's symbols, the grid over the
    slots) of a gpu.func with run-time sizes (kf.size_slots), or two empty tuples.
    ``types``: the kernel's arguments' types (a view's may differ from its buffer's)."""
    if "kf.size_slots" not in g.attributes:
        return (), ()
    sizes = []
    for slot in ir.ArrayAttr(g.attributes["kf.size_slots"]):
        pos, dim = list(ir.DenseI64ArrayAttr(slot))
        arg = buffers[args[pos]]
        dims = _view_dims(arg, types[pos])
        if not dims or dims[dim] is None:
            raise DynamicFallback(f"a kernel's run-time dim {dim} of {arg.name} has no size")
        sizes.append(dims[dim])
    grid = tuple(ir.StringAttr(x).value for x in ir.ArrayAttr(g.attributes["kf.grid_sizes"]))
    return tuple(sizes), grid


def _constant_bytes(attr: ir.Attribute, elem: str) -> bytes:
    if elem == "i1":
        # numpy's view of a splat of booleans holds one byte of bits (8 trues, then
        # falses): read the elements one by one
        shape = ir.ShapedType(attr.type).shape
        arr = np.array([bool(v) for v in ir.DenseIntElementsAttr(attr)], dtype=np.bool_).reshape(shape)
    else:
        arr = np.array(attr)
    torch_name = ELEM_INFO[elem][0]
    import torch

    t = torch.from_numpy(np.ascontiguousarray(arr)).to(getattr(torch, torch_name))
    if t.numel() == 0:  # numpy gives it strides of 0, which a byte view refuses
        return b""
    return t.contiguous().view(torch.uint8).numpy().tobytes()


def schedule_abi(module: ir.Module, entry: str, input_names: list[str], target: str,
                 eager_aliases: list | None = None, eager_repeats: list | None = None,
                 input_dims: list | None = None, output_dims: list | None = None
                 ) -> tuple[ProgramABI, list[tuple[TensorArg, bytes]], list[int]]:
    """The program's ABI from the launch schedule, the constants' data, and for each output
    the index of an earlier output it repeats (-1 if none).

    An output whose value is an input's buffer is that input (a view, ``output_aliases``)
    only where eager returns that input or a view of it (``eager_aliases``, from
    aliasing.py); elsewhere (``x.clone()``, ``x * 1``, a constant) it is a new tensor with
    the input's values (``output_copies``). Likewise an output repeats an earlier one (the
    same tensor twice) only where eager returns the same tensor twice (``eager_repeats``);
    ``(y, y.clone())`` gives a copy.

    Run-time sizes: ``input_dims`` / ``output_dims`` (compiler/dynamic.py) give each
    dim of the inputs and outputs as text; a kernel's slots (kf.size_slots) become its
    ``KernelABI.sizes``. A temporary with a run-time size that no kernel writing or
    reading it names over the other buffers is a DynamicFallback."""
    f = _func(module, entry)
    block = f.regions[0].blocks[0]
    gfuncs = _gpu_funcs(module)
    buffer_of: dict = {}
    in_dims = list(input_dims or []) + [()] * len(block.arguments)
    inputs = [_targ(n, a.type, tuple(in_dims[i])) for i, (n, a) in enumerate(zip(input_names, block.arguments))]
    for i, a in enumerate(block.arguments):
        buffer_of[a] = i
    constants: list[tuple[TensorArg, bytes]] = []
    ops = [op.operation for op in block.operations]
    for op in ops:
        if op.name == "kf.constant":
            s = spec_of(op.result.type)
            arg = TensorArg(f"const{len(constants)}", s.shape, s.elem)
            constants.append((arg, _constant_bytes(from_attr(op.attributes["value"]), s.elem)))
            buffer_of[op.result] = len(inputs) + len(constants) - 1
    n_in = len(inputs) + len(constants)
    ret = next(op for op in ops if op.name == "func.return")
    n_out = len(list(ret.operands))
    eager_aliases = eager_aliases if eager_aliases is not None and len(eager_aliases) == n_out else [None] * n_out
    eager_repeats = eager_repeats if eager_repeats is not None and len(eager_repeats) == n_out else [-1] * n_out
    outputs, aliases, repeats, copies = [], [], [], []
    for j, v in enumerate(ret.operands):
        outputs.append(_targ(f"result{j}", v.type, tuple(output_dims[j]) if output_dims and j < len(output_dims)
                             else ()))
        first = next((i for i, w in enumerate(list(ret.operands)[:j]) if w == v), -1)
        alias = copy = -1
        if first >= 0 and eager_repeats[j] == first:
            pass  # the same tensor as output `first`, as in eager
        elif v in buffer_of and buffer_of[v] < n_in:
            b = buffer_of[v]
            eager = eager_aliases[j]
            if eager is not None and eager[1] == b and b < len(inputs):
                alias = b
            else:
                copy = b
            first = -1
        elif first >= 0:
            copy, first = n_in + first, -1  # eager returns two tensors with these values
        else:
            buffer_of[v] = n_in + j
        aliases.append(alias)
        copies.append(copy)
        repeats.append(first)
    _tie_outputs_back(ops, module, buffer_of)
    temporaries: list[TensorArg] = []
    kernels: list[KernelABI] = []
    n_fixed = n_in + len(outputs)
    sites: dict[int, IndexSite] = {}
    flagged: list[int] = []  # kernels that take the index error flag, last
    pending: dict = {}  # temporaries whose run-time size no kernel before names: (callee, call, value)
    slotted: list = []  # (kernel, gpu.func, args, types): the slots, once every buffer is named
    for op in ops:
        if op.name == "kf.reshape":  # a view kf-fuse left in the schedule: the same buffer
            if buffer_of.setdefault(op.result, buffer_of[op.operands[0]]) != buffer_of[op.operands[0]]:
                raise TargetError(f"{entry}: a returned view is not the buffer of the value it views")
            continue
        if op.name != "func.call":
            continue
        callee = _func(module, ir.FlatSymbolRefAttr(op.attributes["callee"]).value)
        if "kf.empty" in callee.attributes:  # results with no elements: nothing to launch
            for r in op.results:
                if r not in buffer_of:
                    buffer_of[r] = n_fixed + len(temporaries)
                    temporaries.append(_targ(f"tmp{len(temporaries)}", r.type))
            continue
        if "kf.gpu_func" not in callee.attributes:
            raise TargetError(f"{entry}: call of @{ir.StringAttr(callee.attributes['sym_name']).value} "
                              f"is not a kf kernel")
        gname = str(callee.attributes["kf.gpu_func"]).split("::@")[-1].lstrip("@")
        g = gfuncs[gname]
        tied = _tied(callee, len(op.results))
        for r, t in zip(op.results, tied):
            if t >= 0:  # the operand's buffer, written in place
                if buffer_of.setdefault(r, buffer_of[op.operands[t]]) != buffer_of[op.operands[t]]:
                    raise TargetError(f"{entry}: a result of @{gname} written in place is not its operand's buffer")
            elif r not in buffer_of:
                buffer_of[r] = n_fixed + len(temporaries)
                name = f"tmp{len(temporaries)}"
                dims = _result_dims(callee, op, r, buffer_of, [*inputs, *(c for c, _ in constants), *outputs,
                                                              *temporaries], ops, module)
                if dims or DYN not in spec_of(r.type).shape:
                    temporaries.append(_targ(name, r.type, dims))
                else:  # named by a later kernel's buffers, once those are named
                    pending[len(temporaries)] = (callee, op, r)
                    temporaries.append(TensorArg(name, spec_of(r.type).shape, spec_of(r.type).elem))
        args = tuple(buffer_of[v] for v in op.operands) + tuple(buffer_of[r] for r, t in zip(op.results, tied)
                                                                 if t < 0)
        lines = tuple(from_attr(a) for a in ir.ArrayAttr(g.attributes["kf.fused_lines"])) \
            if "kf.fused_lines" in g.attributes else ()
        shared = int(from_attr(g.attributes["kf.shared_bytes"])) if "kf.shared_bytes" in g.attributes else 0
        if "kf.index_sites" in g.attributes:
            for a in ir.ArrayAttr(g.attributes["kf.index_sites"]):
                d = {a[i].name: from_attr(a[i].attr) for i in range(len(ir.DictAttr(a)))}
                sites[d["id"]] = IndexSite(d["op"], d["where"], d["dim"], d["bound"])
            flagged.append(len(kernels))
        types = [v.type for v in op.operands] + [r.type for r, t in zip(op.results, tied) if t < 0]
        slotted.append((len(kernels), g, args, types))
        kernels.append(KernelABI(entry=gname, args=args, grid=tuple(from_attr(g.attributes["kf.grid"])),
                                 block=tuple(from_attr(g.attributes["kf.block"])), shared_bytes=shared,
                                 artifact="", fused_lines=tuple(str(x) for x in lines),
                                 extra={"strategy": str(from_attr(g.attributes["kf.strategy"]))
                                        if "kf.strategy" in g.attributes else "",
                                        **({"largest_slot": int(from_attr(g.attributes["kf.largest_slot"]))}
                                           if "kf.largest_slot" in g.attributes else {})}))
    _name_pending(pending, temporaries, buffer_of, [*inputs, *(c for c, _ in constants), *outputs], ops, module)
    buffers = [*inputs, *(c for c, _ in constants), *outputs, *temporaries]
    for i, g, args, types in slotted:
        slot_sizes, grid_sizes = _slot_sizes(g, args, buffers, types)
        kernels[i] = _with(kernels[i], sizes=slot_sizes, grid_sizes=grid_sizes)
    all_inputs = tuple(inputs) + tuple(c for c, _ in constants)
    if sorted(sites) != list(range(len(sites))):
        raise TargetError(f"{entry}: the kernels' index sites are numbered {sorted(sites)}, not 0..{len(sites) - 1}")
    abi = ProgramABI(target=target, inputs=all_inputs, outputs=tuple(outputs), temporaries=tuple(temporaries),
                     kernels=tuple(kernels), output_aliases=tuple(aliases),
                     index_sites=tuple(sites[i] for i in range(len(sites))),
                     output_copies=tuple(copies) if any(c >= 0 for c in copies) else ())
    if flagged:  # the flag is the buffer after the temporaries, the last argument of these kernels
        import dataclasses

        ks = list(abi.kernels)
        for i in flagged:
            ks[i] = dataclasses.replace(ks[i], args=ks[i].args + (abi.flag_buffer,))
        abi = dataclasses.replace(abi, kernels=tuple(ks))
    return abi, constants, repeats


def _name_pending(pending: dict, temporaries: list, buffer_of: dict, fixed: list, ops: list,
                  module: ir.Module) -> None:
    """Name the run-time sizes of the temporaries that only kernels after their writer
    name, over buffers named later in the schedule (a table ``arange(n)[:, None] * inv``
    that its readers name by the slice of ``x`` they take with it), until none is left; a
    DynamicFallback for one no kernel names."""
    while pending:
        named = False
        for i, (callee, call, r) in list(pending.items()):
            dims = _result_dims(callee, call, r, buffer_of, [*fixed, *temporaries], ops, module)
            if dims:
                temporaries[i] = _targ(temporaries[i].name, r.type, dims)
                del pending[i]
                named = True
        if not named:
            i, (_, _, r) = next(iter(pending.items()))
            _targ(temporaries[i].name, r.type)  # raises: a run-time size kf cannot name


def _tied(callee: ir.Operation, n: int) -> list[int]:
    """For each result of a kernel declaration, the operand whose buffer it writes in
    place (``kf.tied``, kf-linalg-to-gpu), or -1 for a buffer of its own."""
    if "kf.tied" not in callee.attributes:
        return [-1] * n
    return list(ir.DenseI64ArrayAttr(callee.attributes["kf.tied"]))


def _tie_outputs_back(ops: list, module: ir.Module, buffer_of: dict) -> None:
    """Give the earlier values of a buffer written in place the buffer of its last value
    where that is an output (assigned before the kernels are walked): every value of the
    chain is one buffer. So too the value a returned view reshapes."""
    for op in reversed(ops):
        if op.name == "kf.reshape":  # a returned view (fuse.returned_view): its operand's
            r, x = op.result, op.operands[0]  # kernel writes the output's buffer
            if r in buffer_of and x not in buffer_of:
                buffer_of[x] = buffer_of[r]
            continue
        if op.name != "func.call":
            continue
        callee = _func(module, ir.FlatSymbolRefAttr(op.attributes["callee"]).value)
        for r, t in zip(op.results, _tied(callee, len(op.results))):
            if t >= 0 and r in buffer_of and op.operands[t] not in buffer_of:
                buffer_of[op.operands[t]] = buffer_of[r]


def _with(k: KernelABI, **changes) -> KernelABI:
    import dataclasses

    return dataclasses.replace(k, **changes)


def lower_cuda(module: ir.Module, abi: ProgramABI, arch: str, log) -> tuple[ProgramABI, dict[str, bytes]]:
    from kf.passes.to_cuda import assemble, compile_to_ptx, ptxas_path

    if not abi.kernels:  # the function launches nothing (it returns an input, or views of one)
        return abi, {}
    ptx = compile_to_ptx(module, chip=arch)[GPU_MODULE]
    log.texts["ptx"] = ptx
    log.dump("ptx", ptx, "ptx")
    report = {}
    if ptxas_path():
        # ptxas rejecting kf's PTX is a compiler bug: CudaCompileError names the kept
        # PTX file and the ptxas command.
        report = assemble(ptx, arch).kernels
    kernels = tuple(_with(k, artifact=f"{GPU_MODULE}.ptx", extra=dict(k.extra, ptxas=report.get(k.entry, {})))
                    for k in abi.kernels)
    return _with(abi, kernels=kernels), {f"{GPU_MODULE}.ptx": ptx.encode()}


def _spirv_text(binary: bytes) -> str:
    dis = shutil.which("spirv-dis")
    if not dis:
        return f"; {len(binary)} bytes of SPIR-V (install spirv-tools for the disassembly)"
    with tempfile.NamedTemporaryFile(suffix=".spv") as f:
        f.write(binary)
        f.flush()
        return subprocess.run([dis, f.name], capture_output=True, text=True).stdout


def lower_spirv(module: ir.Module, abi: ProgramABI, log, metal: bool,
                limits: str = "") -> tuple[ProgramABI, dict[str, bytes]]:
    """SPIR-V (and MSL when metal) for the device of ``limits`` (DeviceLimits.spec(); "":
    kf-to-spirv's defaults): its subgroup size is what the subgroup ops are lowered for."""
    from kf.passes.to_spirv import compile_spirv

    if not abi.kernels:  # the function launches nothing (it returns an input, or views of one)
        return abi, {}
    from kf.runtime.abi import DeviceLimits

    options = {}
    dev = DeviceLimits.parse(limits) if limits else None
    if dev is not None:
        options = {"shared_memory_bytes": dev.shared_bytes, "subgroup_size": dev.subgroup_size or 32,
                   "float_controls": "+".join(dev.float_controls) or "none"}
    binaries = compile_spirv(module, **options)
    binary = next(b for b in binaries if b.name == GPU_MODULE)
    text = _spirv_text(binary.binary)
    log.texts["spirv"] = text
    log.dump("spirv", text, "spvasm")
    artifacts = {f"{GPU_MODULE}.spv": binary.binary}
    kernels = []
    most = dev.loops if dev is not None else 0
    for k in abi.kernels:
        sk = binary.kernels[k.entry]
        if most and k.sizes and not 0 <= sk.loop_iterations <= most:
            # loops to run-time sizes that could pass what the device lets an invocation
            # run (lavapipe): the driver compiles these sizes instead (compiler/dynamic.py)
            raise TargetError(f"kernel {k.entry} runs up to {sk.loop_iterations} loop iterations at run-time "
                              f"sizes, past the device's {most}")
        kernels.append(_with(k, artifact=f"{GPU_MODULE}.spv", extra=dict(k.extra, **sk.abi_extra())))
    if metal:
        from kf.passes.to_metal import ToMetalPass

        p = ToMetalPass()
        msl_all = []
        for i, k in enumerate(kernels):
            mk = p.kernel(binary.binary, binary.kernels[k.entry])
            name = f"{k.entry}.metal"
            artifacts[name] = mk.source.encode()
            msl_all.append(mk.source)
            kernels[i] = _with(k, artifact=name, extra=dict(k.extra, **mk.abi_extra()))
        log.texts["msl"] = "\n".join(msl_all)
        log.dump("msl", log.texts["msl"], "metal")
    return _with(abi, kernels=tuple(kernels)), artifacts
