"""kf-tile: choose tile sizes and launch geometry for every kernel function.

For each ``func.func`` with a ``kf.kernel = "<kind>"`` attribute the pass asks the
kind's strategy for a plan on the target (``strategy_for(kind).plan(kernel,
TargetInfo.for_target(target))``) and records it on the function as the dictionary
attribute ``kf.plan``. A strategy that cannot take the kernel (``NotApplicable``) is
replaced by the generic one, and the plan says so (``strategy = "generic"``). For
SPIR-V the ``limits`` option names the device the plans are for (its workgroup memory,
workgroup size and subgroups: ``kf.runtime.abi.DeviceLimits``); the driver gives the
Vulkan device's own.

Planning is its own pass, not a step of kf-map-to-gpu, so that the choices can be read
(and FileChecked, and changed by hand or by a later tuning pass) before any gpu code is
written; kf-map-to-gpu takes the recorded plan when there is one.

Plans are JSON-like: ints, floats, bools, strings, lists and dicts. In the attribute,
lists of ints are ``array<i64: ...>``, other lists ``[...]``, dicts ``{...}``.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from mlir import ir

from .base import KfPass, PassError
from .strategies import emit as E
from .strategies import run_time_sizes
from .strategies.base import (DEFAULT_MULTIPROCESSORS, NotApplicable, Strategy, TargetInfo, strategy_for,
                              variants_by_kind)


def plan_to_attr(value: Any) -> ir.Attribute:
    """The MLIR attribute of a JSON-like plan value."""
    if isinstance(value, bool):
        return ir.BoolAttr.get(value)
    if isinstance(value, int):
        return ir.IntegerAttr.get(ir.IntegerType.get_signless(64), value)
    if isinstance(value, float):
        return ir.FloatAttr.get_f64(value)
    if isinstance(value, str):
        return ir.StringAttr.get(value)
    if isinstance(value, dict):
        return ir.DictAttr.get({str(k): plan_to_attr(v) for k, v in value.items()})
    if isinstance(value, (list, tuple)):
        if all(isinstance(v, int) and not isinstance(v, bool) for v in value):
            return ir.DenseI64ArrayAttr.get([int(v) for v in value])
        return ir.ArrayAttr.get([plan_to_attr(v) for v in value])
    raise TypeError(f"a plan holds JSON-like values, not {type(value).__name__} ({value!r})")


def attr_to_plan(attr: ir.Attribute) -> Any:
    """The inverse of plan_to_attr."""
    if isinstance(attr, ir.BoolAttr):
        return bool(attr.value)
    if isinstance(attr, ir.IntegerAttr):
        return int(attr.value)
    if isinstance(attr, ir.FloatAttr):
        return float(attr.value)
    if isinstance(attr, ir.StringAttr):
        return attr.value
    if isinstance(attr, ir.DenseI64ArrayAttr):
        return list(attr)
    if isinstance(attr, ir.DictAttr):
        return {attr[i].name: attr_to_plan(attr[i].attr) for i in range(len(attr))}
    if isinstance(attr, ir.ArrayAttr):
        return [attr_to_plan(a) for a in attr]
    raise TypeError(f"not a plan attribute: {attr}")


def choose(kernel: ir.Operation, target: TargetInfo, variants: dict | None = None) -> tuple[Strategy, dict]:
    """The strategy that takes kernel and its plan (generic when the kind's refuses, and
    for a kernel that reads, writes or computes a tensor with no elements, such as a sum
    over an empty dim fused into an add: the specialized strategies' tiles assume rows
    and tiles that exist, generic's loops just run zero times). ``variants``: {kind: a
    strategy's VARIANT} (``variants_by_kind``); a strategy with variants plans with its
    own (or its defaults), and the plan records it. A kernel with run-time sizes is planned
at its largest (strategies/run_time_sizes.py), its plan's ``sizes`` naming its slots;
ValueError where its strategy writes kernels for static sizes only."""
    with run_time_sizes.bounded(kernel) as (bounded, slots):
        # the cooperative-matrix kernels are written for static sizes
        target = dataclasses.replace(target, cooperative_matrix=()) if slots else target
        strategy, plan = _choose(bounded, target, variants)
        if slots:
            try:
                if strategy.KIND not in run_time_sizes.RUN_TIME_KINDS:
                    raise ValueError(f"the {strategy.KIND} strategy writes kernels for static sizes only")
                run_time_sizes.check_strides(kernel, strategy.KIND)
                run_time_sizes.check_several(kernel, strategy.KIND)
            except ValueError:
                # the generic strategy takes run-time sizes and strides where the kind's does
                # not, at the cost of its reductions recomputed per element: taken where
                # that cost stays small (else the kernel compiles static sizes)
                if strategy.KIND == "generic" or generic_work(bounded) > GENERIC_RUN_TIME_WORK:
                    raise
                run_time_sizes.check_several(kernel, "generic")
                strategy = strategy_for("generic")
                plan = {"strategy": strategy.KIND, "target": target.name,
                        **_plan(strategy, bounded, target, variants)}
    if slots:
        plan["sizes"] = [list(s) for s in slots]
    return strategy, plan


#: the most elements a generic kernel's reductions and matmuls may read per output element
#: (``generic_work``) for kf-tile to give it a kernel whose own strategy cannot take its
#: run-time sizes: a norm over rows of 32 reads about 100 (its statistics recomputed per
#: element, where the rowwise strategy reads each row once); rows of thousands compile
#: static sizes with the rowwise strategy instead
GENERIC_RUN_TIME_WORK = 1024

_REDUCING = ("kf.sum", "kf.mean", "kf.reduce_max", "kf.reduce_min", "kf.argmax", "kf.logsumexp")


def generic_work(kernel: ir.Operation) -> int:
    """Elements the generic strategy's reductions, softmaxes, scans, top-ks and matmuls
    read per output element of a (bounded) kernel: the sum over those ops of what each
    reads (a variance twice, a softmax three times), the run-time dims at their bound."""
    from kf.dialects.attrs import op_attrs
    from kf.dialects.types import spec_of

    work = 0
    for op in E.kernel_ops(kernel):
        if op.name not in (*_REDUCING, "kf.var", "kf.softmax", "kf.log_softmax", "kf.scan", "kf.topk",
                           "kf.matmul"):
            continue
        shape = spec_of(op.operands[0].type).shape
        rank = max(len(shape), 1)
        attrs = op_attrs(op)
        if op.name == "kf.matmul":
            work += shape[-1]
            continue
        if op.name in ("kf.softmax", "kf.log_softmax", "kf.scan", "kf.topk", "kf.argmax"):
            dims = [int(attrs["dim"]) % rank]
        else:
            dims = sorted({int(d) % rank for d in attrs.get("dims") or range(len(shape))})
        n = 1
        for d in dims:
            n *= shape[d] if shape else 1
        work += n * {"kf.var": 2, "kf.softmax": 3, "kf.log_softmax": 3}.get(op.name, 1) * \
            (int(attrs.get("k", 1)) if op.name == "kf.topk" else 1)
    return work


def _choose(kernel: ir.Operation, target: TargetInfo, variants: dict | None) -> tuple[Strategy, dict]:
    ins, outs = E.kernel_signature(kernel)
    empty = any(E.numel(s.shape) == 0 for s in [*ins, *outs]) or any(
        isinstance(r.type, ir.RankedTensorType) and E.numel(E.shape_of(r)) == 0
        for op in kernel.regions[0].blocks[0].operations for r in op.operation.results)
    strategy = strategy_for("generic" if empty else E.kernel_kind(kernel))
    try:
        plan = _plan(strategy, kernel, target, variants)
    except NotApplicable:
        strategy = strategy_for("generic")
        plan = _plan(strategy, kernel, target, variants)
    # kf-map-to-gpu reads which strategy and target a recorded plan is for.
    return strategy, {"strategy": strategy.KIND, "target": target.name, **plan}


def _plan(strategy: Strategy, kernel: ir.Operation, target: TargetInfo, variants: dict | None) -> dict:
    if strategy.VARIANT is None:
        return strategy.plan(kernel, target)
    variant = (variants or {}).get(strategy.KIND) or strategy.VARIANT()
    return {**strategy.plan(kernel, target, variant), "variant": dataclasses.asdict(variant)}


def recorded_plan(kernel: ir.Operation) -> dict | None:
    """The kernel's kf.plan, or None where it has none; a PassError at the kernel where
    kf.plan is not a plan (a dictionary naming its strategy and target)."""
    if "kf.plan" not in kernel.attributes:
        return None
    attr = kernel.attributes["kf.plan"]
    try:
        plan = attr_to_plan(attr)
    except TypeError as e:
        plan = e
    if not isinstance(plan, dict) or not isinstance(plan.get("strategy", ""), str) or \
            not isinstance(plan.get("target", ""), str):
        raise PassError(f"kernel @{E.kernel_name(kernel)}: kf.plan is {attr}, not a plan (a dictionary such as "
                        "kf-tile records)", kernel.location)
    return plan


#: Targets a plan can be made for; Vulkan and Metal both run kf's SPIR-V.
TARGETS = ("cuda", "spirv", "vulkan", "metal")


def check_target(target: str, location: ir.Location, chip: str = "sm_90",
                 multiprocessors: int = DEFAULT_MULTIPROCESSORS) -> None:
    """A PassError for a target kf has no kernels for, and on CUDA for a chip that is not
    one (the strategies read its number: sm_90a's wgmma) or a negative multiprocessor
    count."""
    if target not in TARGETS:
        raise PassError(f"target must be one of {', '.join(TARGETS)}, got '{target}'", location)
    if target == "cuda":
        from .to_cuda import chip_error

        if chip_error(chip):
            raise PassError(chip_error(chip), location)
        if multiprocessors < 0:
            raise PassError(f"multiprocessors must be 0 (not known) or more, got {multiprocessors}", location)


@dataclasses.dataclass(frozen=True)
class TilePass(KfPass):
    """Besides its own options, kf-tile takes kernel variants as ``<kind>.<field>=<value>``
    (``kf-tile{target=cuda attention.reverse_q_blocks=false matmul.stages=3}``): fields of
    the VARIANT of the strategy of that kind (passes/strategies/base.py), for every kernel
    of the kind it plans."""

    NAME = "kf-tile"
    DESCRIPTION = "record each kernel function's strategy plan (tile sizes, launch geometry) as kf.plan"

    target: str = "cuda"
    chip: str = "sm_90"
    #: the device's multiprocessors (CUDA; persistent kernels start one workgroup on each)
    multiprocessors: int = DEFAULT_MULTIPROCESSORS
    #: the device's limits (SPIR-V: ``kf.runtime.abi.DeviceLimits.spec()``; "": its defaults)
    limits: str = ""
    #: kernel variants: (``<kind>.<field>``, value text) pairs, sorted
    variants: tuple[tuple[str, str], ...] = ()

    @classmethod
    def from_options(cls, options: dict[str, str]) -> "TilePass":
        own = {k: v for k, v in options.items() if "." not in k}
        variants = {k: v for k, v in options.items() if "." in k}
        variants_by_kind(variants)  # a ValueError for an unknown kind, field or value
        return dataclasses.replace(super().from_options(own), variants=tuple(sorted(variants.items())))

    def textual(self) -> str:
        text = dataclasses.replace(self, variants=()).textual() if self.variants else super().textual()
        if not self.variants:
            return text
        extra = " ".join(f"{k}={v}" for k, v in self.variants)
        return text[:-1] + f" {extra}}}" if text.endswith("}") else f"{text}{{{extra}}}"

    def run(self, module: ir.Operation) -> None:
        check_target(self.target, module.location, self.chip, self.multiprocessors)
        try:
            info = TargetInfo.for_target(self.target, self.chip, self.multiprocessors, self.limits)
        except ValueError as e:
            raise PassError(str(e), module.location) from None
        variants = variants_by_kind(dict(self.variants))
        for kernel in E.kernel_functions(module):
            with kernel.context, kernel.location:
                try:
                    _, plan = choose(kernel, info, variants)
                except ValueError as e:  # a KfTypeError: an element type or shape kf has no kernels for
                    raise PassError(f"cannot plan kernel @{E.kernel_name(kernel)}: {e}", kernel.location) from None
                kernel.attributes["kf.plan"] = plan_to_attr(plan)
