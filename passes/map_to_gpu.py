"""kf-map-to-gpu: write every kernel function as a ``gpu.func`` in ``gpu.module
@kf_kernels`` and leave the kernel function as a declaration.

For each ``func.func`` with a ``kf.kernel`` attribute the pass takes the plan kf-tile
recorded (``kf.plan``; made now when absent or made for another target), calls the strategy's ``emit`` and, when
the strategy raises ``NotApplicable``, the generic strategy's (with a generic plan).
The gpu.func gets the launch facts the back ends and the launcher need:
``kf.grid``, ``kf.block`` (array<i64: x, y, z>), ``kf.shared_bytes`` (dynamic shared
memory), ``kf.fused_lines`` (the user's lines, from the kernel function) and
``kf.strategy``; a kernel with run-time sizes (strategies/run_time_sizes.py) also
``kf.size_slots`` (its slots: [argument, dim] pairs) and ``kf.grid_sizes`` (the grid as
expressions over the slots).

A kernel whose results all have no elements is not written: its declaration gets
``kf.empty`` instead of ``kf.gpu_func``, and the driver launches nothing for it (the
launcher allocates its empty results).

The kernel function keeps its name, type and attributes but loses its body:
``func.func private @k(...) -> ... attributes {kf.kernel = ..., kf.gpu_func =
@kf_kernels::@k}``, so the host function's ``func.call @k`` ops stay as they are and
remain the launch schedule (the order in which the driver launches the kernels, and
which buffers each one gets). The module gets ``gpu.container_module``.
"""

from __future__ import annotations

import dataclasses

from mlir import ir

from .base import KfPass, PassError
from .strategies import emit as E
from .strategies import run_time_sizes
from .strategies.base import (DEFAULT_MULTIPROCESSORS, STRATEGIES, EmittedKernel, NotApplicable, TargetInfo,
                              strategy_for)
from .tile import check_target, choose, recorded_plan

GPU_MODULE = "kf_kernels"


def _i64_array(values) -> ir.Attribute:
    return ir.DenseI64ArrayAttr.get([int(v) for v in values])


def _emit_one(kernel: ir.Operation, gmod: ir.Operation, info: TargetInfo) -> tuple[EmittedKernel, str]:
    plan = recorded_plan(kernel)
    recorded = plan is not None and plan.get("target", info.name) == info.name
    if not recorded:
        # No plan, or one made for another target (its vector widths and grid limits
        # would be wrong here): plan now.
        strategy, plan = choose(kernel, info)
    else:
        kind = plan.get("strategy", E.kernel_kind(kernel))
        strategy = strategy_for(kind)
        if strategy.KIND != kind:  # strategy_for's fallback is for kernel kinds, not plans
            raise ValueError(f"kf.plan names the strategy '{kind}', which kf does not have (strategies: "
                             f"{', '.join(sorted(STRATEGIES))})")
    body = gmod.regions[0].blocks[0]
    before = {id(op.operation) for op in body.operations}
    try:
        with run_time_sizes.bounded(kernel) as (bounded, slots):
            if slots and strategy.KIND not in run_time_sizes.RUN_TIME_KINDS:
                raise ValueError(f"the {strategy.KIND} strategy writes kernels for static sizes only")
            if slots:
                run_time_sizes.check_strides(kernel, strategy.KIND)
            if [list(s) for s in slots] != [list(s) for s in plan.get("sizes", [])]:
                raise ValueError(f"kf.plan's run-time sizes {plan.get('sizes', [])} are not the kernel's "
                                 f"{[list(s) for s in slots]}")
            return strategy.emit(bounded, plan, gmod, info), strategy.KIND
    except KeyError as e:
        if not recorded or not e.args or e.args[0] in plan:
            raise
        # a plan written by hand or cut short: name what it lacks rather than a KeyError
        raise ValueError(f"kf.plan has no '{e.args[0]}', which the {strategy.KIND} strategy's plans hold "
                         "(kf-tile records whole plans)") from None
    except NotApplicable:
        # Whatever the refusing strategy had written goes before generic writes its own.
        for op in list(body.operations):
            if id(op.operation) not in before:
                op.operation.erase()
        generic = strategy_for("generic")
        with run_time_sizes.bounded(kernel) as (bounded, slots):
            fallback = generic.plan(bounded, info)
            if slots:
                fallback["sizes"] = [list(s) for s in slots]
            return generic.emit(bounded, fallback, gmod, info), generic.KIND


@dataclasses.dataclass(frozen=True)
class MapToGpuPass(KfPass):
    NAME = "kf-map-to-gpu"
    DESCRIPTION = "write each kernel function as a gpu.func in gpu.module @kf_kernels (by its strategy)"

    target: str = "cuda"
    chip: str = "sm_90"
    #: the device's multiprocessors (CUDA; persistent kernels start one workgroup on each)
    multiprocessors: int = DEFAULT_MULTIPROCESSORS
    #: the device's limits (SPIR-V: ``kf.runtime.abi.DeviceLimits.spec()``; "": its defaults)
    limits: str = ""

    def run(self, module: ir.Operation) -> None:
        check_target(self.target, module.location, self.chip, self.multiprocessors)
        try:
            info = TargetInfo.for_target(self.target, self.chip, self.multiprocessors, self.limits)
        except ValueError as e:
            raise PassError(str(e), module.location) from None
        kernels = E.kernel_functions(module)
        if not kernels:
            return
        with module.context, module.location:
            gmod = E.gpu_module(module, GPU_MODULE)
        for kernel in kernels:
            with kernel.context, kernel.location:
                try:
                    _, outs = E.kernel_signature(kernel)
                except ValueError as e:  # a KfTypeError: an element type kf has no kernels for
                    raise PassError(f"cannot write kernel @{E.kernel_name(kernel)}: {e}", kernel.location) from None
                if outs and all(E.numel(s.shape) == 0 for s in outs):
                    decl = E.declare_kernel(kernel, GPU_MODULE)
                    del decl.attributes["kf.gpu_func"]
                    decl.attributes["kf.empty"] = ir.UnitAttr.get()
                    continue
                result_sizes = _result_sizes(kernel)
                try:
                    emitted, kind = _emit_one(kernel, gmod, info)
                except (NotImplementedError, ValueError) as e:
                    raise PassError(f"cannot write kernel @{E.kernel_name(kernel)}: {e}", kernel.location) from None
                for part in filter(None, (emitted, emitted.prelude, emitted.postlude)):
                    gfunc = _find(gmod, part.name)
                    gfunc.attributes["kf.grid"] = _i64_array(part.grid)
                    gfunc.attributes["kf.block"] = _i64_array(part.block)
                    gfunc.attributes["kf.shared_bytes"] = ir.IntegerAttr.get(ir.IntegerType.get_signless(64),
                                                                             int(part.shared_bytes))
                    gfunc.attributes["kf.fused_lines"] = E.fused_lines(kernel)
                    gfunc.attributes["kf.strategy"] = ir.StringAttr.get(kind)
                    if part.sizes:
                        gfunc.attributes["kf.size_slots"] = ir.ArrayAttr.get(
                            [_i64_array(s) for s in part.sizes])
                        largest = run_time_sizes.largest_slot(kernel)
                        if largest < run_time_sizes.BOUND:
                            gfunc.attributes["kf.largest_slot"] = ir.IntegerAttr.get(
                                ir.IntegerType.get_signless(64), largest)
                        gfunc.attributes["kf.grid_sizes"] = ir.ArrayAttr.get(
                            [ir.StringAttr.get(g) for g in part.grid_sizes])
                decl = E.declare_kernel(kernel, GPU_MODULE)
                for key, texts in zip(("kf.result_sizes", "kf.input_sizes"), result_sizes):
                    decl.attributes[key] = ir.ArrayAttr.get([ir.StringAttr.get(t) for t in texts])
                if emitted.prelude is not None:
                    _schedule_prelude(module, decl, emitted.prelude.name, emitted.prelude_output)
                if emitted.postlude is not None:
                    _schedule_postlude(module, decl, emitted.postlude.name, emitted.postlude_results)


def _result_sizes(kernel: ir.Operation) -> tuple[list[str], list[str]]:
    """(per result of a kernel function with run-time sizes, its run-time size as text
    over its inputs' (``a<pos>d<dim>``), per input its run-time size over the other
    inputs'; "" where one has none or none is found): the driver names the buffers
    between kernels by them (compiler/gpu_codegen.py). Empty for static sizes."""
    if not run_time_sizes.has_run_time_sizes(kernel):
        return ()
    try:
        texts = run_time_sizes.SizeTexts(kernel)
        return texts.result_texts(), texts.input_texts()
    except (ValueError, KeyError, IndexError):
        return ()


def _schedule_prelude(module: ir.Operation, decl: ir.Operation, prelude: str, output: ir.Type) -> None:
    """Launch gpu.func ``prelude`` before every call of the kernel ``decl``: a declaration
    of it (the kernel's inputs -> ``output``), a call of it with the same operands just
    before each call of the kernel, and its result as the kernel's last input."""
    from mlir.dialects import func

    name = ir.StringAttr(decl.attributes["sym_name"]).value
    ftype = ir.FunctionType(ir.TypeAttr(decl.attributes["function_type"]).value)
    with ir.InsertionPoint(decl), decl.location:
        pre = func.FuncOp(prelude, ir.FunctionType.get(list(ftype.inputs), [output]), visibility="private")
    pre.attributes["kf.gpu_func"] = ir.SymbolRefAttr.get([GPU_MODULE, prelude])
    decl.attributes["function_type"] = ir.TypeAttr.get(
        ir.FunctionType.get(list(ftype.inputs) + [output], list(ftype.results)))
    calls = []

    def visit(op):
        if op.name == "func.call" and ir.FlatSymbolRefAttr(op.attributes["callee"]).value == name:
            calls.append(op)
        return ir.WalkResult.ADVANCE

    module.walk(visit)
    for call in calls:
        with ir.InsertionPoint(call), call.location:
            table = func.CallOp([output], ir.FlatSymbolRefAttr.get(prelude), list(call.operands)).result
            new = func.CallOp([r.type for r in call.results], ir.FlatSymbolRefAttr.get(name),
                              list(call.operands) + [table])
        for key in call.attributes:
            if key != "callee" and key not in new.attributes:
                new.attributes[key] = call.attributes[key]
        for old_r, new_r in zip(call.results, new.results):
            old_r.replace_all_uses_with(new_r)
        call.erase()


def _schedule_postlude(module: ir.Operation, decl: ir.Operation, postlude: str, taken: tuple) -> None:
    """Launch gpu.func ``postlude`` after every call of the kernel ``decl``, with the same
    operands, writing the kernel's results at ``taken`` (which the kernel no longer
    returns): a declaration of it, and the calls."""
    from mlir.dialects import func

    name = ir.StringAttr(decl.attributes["sym_name"]).value
    ftype = ir.FunctionType(ir.TypeAttr(decl.attributes["function_type"]).value)
    results = list(ftype.results)
    kept = [i for i in range(len(results)) if i not in taken]
    with ir.InsertionPoint(decl), decl.location:
        post = func.FuncOp(postlude, ir.FunctionType.get(list(ftype.inputs), [results[i] for i in taken]),
                           visibility="private")
    post.attributes["kf.gpu_func"] = ir.SymbolRefAttr.get([GPU_MODULE, postlude])
    decl.attributes["function_type"] = ir.TypeAttr.get(
        ir.FunctionType.get(list(ftype.inputs), [results[i] for i in kept]))
    calls = []

    def visit(op):
        if op.name == "func.call" and ir.FlatSymbolRefAttr(op.attributes["callee"]).value == name:
            calls.append(op)
        return ir.WalkResult.ADVANCE

    module.walk(visit)
    for call in calls:
        with ir.InsertionPoint(call), call.location:
            new = func.CallOp([results[i] for i in kept], ir.FlatSymbolRefAttr.get(name), list(call.operands))
            after = func.CallOp([results[i] for i in taken], ir.FlatSymbolRefAttr.get(postlude), list(call.operands))
        for key in call.attributes:
            if key != "callee" and key not in new.attributes:
                new.attributes[key] = call.attributes[key]
        for i, r in zip(kept, new.results):
            call.results[i].replace_all_uses_with(r)
        for i, r in zip(taken, after.results):
            call.results[i].replace_all_uses_with(r)
        call.erase()


def _find(gmod: ir.Operation, name: str) -> ir.Operation:
    for op in gmod.regions[0].blocks[0].operations:
        op = op.operation
        if op.name == "gpu.func" and ir.StringAttr(op.attributes["sym_name"]).value == name:
            return op
    raise PassError(f"the strategy reported gpu.func @{name}, which is not in @{GPU_MODULE}")
