"""The contract between kf's kernel passes and the strategies that write kernels.

Kernel function (made by kf-fuse): ``func.func private @name(inputs...) -> results``
holding kf ops, with attributes ``kf.kernel = "<kind>"`` (elementwise, rowwise,
attention, matmul, generic) and ``kf.fused_lines`` (the user's file:line of each op).

A strategy turns one kernel function into one ``gpu.func ... kernel`` inside the
``gpu.module @kf_kernels`` of the module: its arguments are statically shaped, dense
row-major memrefs, the kernel's inputs then its outputs, in the kernel function's
order. It writes every element of every output (no zero-initialized outputs are
assumed) and handles any size, whatever its tile sizes (tails are guarded). A kernel
that loads or stores through a tensor of indices checks each index where it uses it
(``emit.IndexChecks``): its gpu.func takes the program's index error flag as one more
argument, last, and lists the ops it checks as ``kf.index_sites``.
"""

from __future__ import annotations

import dataclasses
import threading
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, ClassVar

from mlir import ir

from kf.runtime.abi import DEFAULT_MULTIPROCESSORS


@dataclass(frozen=True)
class TargetInfo:
    """What a strategy may assume about the device it writes for."""

    name: str  # "cuda" or "spirv" (Vulkan and Metal)
    max_threads: int = 1024
    max_shared_bytes: int = 48 * 1024  # without an opt-in attribute
    subgroup_size: int = 32
    vector_bytes: int = 16  # widest global access
    has_shuffle: bool = True
    chip: str = "sm_90"
    #: streaming multiprocessors of the device (CUDA; 0: unknown), for persistent kernels
    #: that start one workgroup on each
    multiprocessors: int = DEFAULT_MULTIPROCESSORS
    #: SPIR-V: the shapes the device multiplies with cooperative matrices at subgroup
    #: scope, as (m, n, k, a, b, c, result) with kf element types (empty: none)
    cooperative_matrix: tuple[tuple[int, int, int, str, str, str, str], ...] = ()

    @property
    def max_dynamic_shared_bytes(self) -> int:
        """Workgroup memory a kernel may use when it opts in (CUDA: dynamic shared memory
        with cuFuncSetAttribute, which runtime/cuda.py does at load), per the CUDA
        programming guide's table for the chip; the static limit elsewhere."""
        if self.name != "cuda":
            return self.max_shared_bytes
        digits = "".join(ch for ch in self.chip if ch.isdigit())  # sm_90a -> 90
        sm = int(digits) if digits else 0
        if sm >= 90:
            return 227 * 1024
        if sm in (80, 87):
            return 163 * 1024
        if sm >= 86:
            return 99 * 1024
        return self.max_shared_bytes

    @staticmethod
    def for_target(name: str, chip: str = "sm_90", multiprocessors: int = DEFAULT_MULTIPROCESSORS,
                   limits: str = "") -> "TargetInfo":
        """The target's facts. For SPIR-V (Vulkan and Metal) they are the device's limits
        (``limits``: the text of ``kf.runtime.abi.DeviceLimits.spec()``, what the driver
        reads of the Vulkan device): workgroup memory, the widest workgroup, the subgroup
        size, subgroup shuffles where compute shaders have them, and the device's
        cooperative-matrix shapes (VK_KHR_cooperative_matrix). Without limits, the
        defaults of DeviceLimits: 16 KiB, 256 invocations, no subgroup operations --
        kernels written for them run on nearly every Vulkan and Metal device."""
        if name == "cuda":
            return TargetInfo("cuda", chip=chip, multiprocessors=multiprocessors)
        from kf.runtime.abi import DeviceLimits

        dev = DeviceLimits.parse(limits) if limits else DeviceLimits()
        sub = dev.subgroup_size
        # the butterfly reductions exchange lanes at power-of-two distances: a subgroup
        # size that is not a power of two (or not known) keeps them in workgroup memory
        shuffle = "shuffle" in dev.subgroup_ops and sub >= 2 and sub & (sub - 1) == 0
        return TargetInfo("spirv", max_threads=min(dev.invocations, dev.workgroup_size[0]),
                          max_shared_bytes=dev.shared_bytes, subgroup_size=sub if sub > 0 else 32,
                          vector_bytes=16, has_shuffle=shuffle, chip="", multiprocessors=0,
                          cooperative_matrix=tuple((c.m, c.n, c.k, c.a, c.b, c.c, c.result)
                                                   for c in dev.cooperative_shapes()))


@dataclass
class EmittedKernel:
    """What a strategy reports about the gpu.func it wrote."""

    name: str
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    shared_bytes: int = 0
    notes: dict = field(default_factory=dict)
    #: A kernel the strategy also wrote, launched just before this one with the same
    #: inputs and writing one buffer of type ``prelude_output`` (a ranked tensor type)
    #: that this kernel's gpu.func takes as one more input, after its own (the attention
    #: kernel's table of a mask's key blocks). kf-map-to-gpu adds it to the schedule.
    prelude: "EmittedKernel | None" = None
    prelude_output: object = None
    #: A kernel the strategy also wrote, launched just after this one with the same
    #: inputs (the prelude's buffer included) and writing the kernel function's results
    #: at ``postlude_results``, which this kernel's gpu.func then does not take (the
    #: attention backward's dQ, converted from the f32 sums the kernel adds into the
    #: prelude's buffer). kf-map-to-gpu adds it to the schedule.
    postlude: "EmittedKernel | None" = None
    postlude_results: tuple = ()
    #: run-time sizes (run_time_sizes.py): the kernel's slots, (argument, dim) pairs, and
    #: its grid as expressions over them (``grid`` is then the grid at the largest sizes)
    sizes: tuple = ()
    grid_sizes: tuple[str, ...] = ()


class NotApplicable(Exception):
    """The strategy cannot write this kernel; kf-map-to-gpu falls back to generic."""


class Strategy:
    """Subclasses set KIND and implement plan and emit.

    ``VARIANT``, where a strategy has kernel variants, is a frozen dataclass of them: each
    field a choice the planner makes by default (a tuning number, or which of two kernels),
    settable as ``kf-tile{<KIND>.<field>=<value>}``. kf-tile passes the strategy's variant
    to ``plan`` and records it in ``kf.plan`` as ``variant``; the kernel is written from
    the plan alone, so the IR (and with it the cache key) says which variant it is."""

    KIND: ClassVar[str] = ""
    VARIANT: ClassVar[type | None] = None

    def plan(self, kernel: ir.Operation, target: TargetInfo, variant: Any = None) -> dict:
        """Tile sizes and launch geometry for this kernel on this target (JSON-able values);
        ``variant``: a ``VARIANT`` (its defaults where None), for strategies that have one."""
        raise NotImplementedError

    def emit(self, kernel: ir.Operation, plan: dict, gpu_module: ir.Operation, target: TargetInfo) -> EmittedKernel:
        """Write the gpu.func for kernel into gpu_module's body; return its launch geometry."""
        raise NotImplementedError


def variant_from_text(cls: type, fields: Mapping[str, str]) -> Any:
    """``cls`` (a frozen dataclass of variants) with ``fields`` set from their text, as
    kf-tile's options give them: ``true``/``false`` for bools, ``4,8`` for a tuple of ints.
    Raises ValueError naming an unknown field (and the known ones) or a bad value."""
    known = {f.name: f for f in dataclasses.fields(cls)}
    kwargs = {}
    for name, text in fields.items():
        if name not in known:
            raise ValueError(f"no variant '{name}' (variants: {', '.join(sorted(known)) or 'none'})")
        default = known[name].default
        try:
            if isinstance(default, bool):
                if text.lower() not in ("1", "true", "yes", "on", "0", "false", "no", "off"):
                    raise ValueError(text)
                kwargs[name] = text.lower() in ("1", "true", "yes", "on")
            elif isinstance(default, tuple):
                kwargs[name] = tuple(int(x) for x in text.split(","))
            else:
                kwargs[name] = type(default)(text)
        except ValueError:
            kind = {bool: "true or false", int: "an int", float: "a number", tuple: "ints like 4,8"}.get(
                type(default), "a string")
            raise ValueError(f"variant '{name}' takes {kind}, not '{text}'") from None
    return cls(**kwargs)


def variants_by_kind(options: Mapping[str, str]) -> dict[str, Any]:
    """{kind: its VARIANT} from ``{"<kind>.<field>": value text}`` (kf-tile's options).
    Raises ValueError for a kind without variants or an unknown field."""
    grouped: dict[str, dict[str, str]] = {}
    for key, text in options.items():
        kind, _, name = key.partition(".")
        grouped.setdefault(kind, {})[name] = text
    out = {}
    for kind, fields in grouped.items():
        cls = _strategy(kind).VARIANT if _strategy(kind) is not None else None
        if cls is None:
            with_variants = sorted(k for k, st in STRATEGIES.items() if st.VARIANT is not None)
            raise ValueError(f"kernels of kind '{kind}' have no variants (kinds with variants: "
                             f"{', '.join(with_variants)})")
        try:
            out[kind] = variant_from_text(cls, fields)
        except ValueError as e:
            raise ValueError(f"{kind}: {e}") from None
    return out


def _strategy(kind: str) -> "Strategy | None":
    strategy_for(kind)  # imports the strategy modules
    return STRATEGIES.get(kind)


STRATEGIES: dict[str, Strategy] = {}
_loaded = False
#: Held while the strategy modules are imported: kf compiles from several threads, and
#: a thread must not see the table before every module has registered.
_LOAD_LOCK = threading.RLock()  # reentrant: a module that asks for a strategy while loading does not hang


def register(strategy: Strategy) -> Strategy:
    STRATEGIES[strategy.KIND] = strategy
    return strategy


def strategy_for(kind: str) -> Strategy:
    """The strategy of a kind, importing the strategy modules on first use."""
    global _loaded
    if not _loaded:
        with _LOAD_LOCK:
            if not _loaded:
                # Import every strategy module once, even if one was imported directly
                # before (its registration alone would leave the others, generic
                # included, missing); the table is complete before _loaded says so.
                import importlib
                import pkgutil

                import kf.passes.strategies as pkg

                for info in pkgutil.iter_modules(pkg.__path__):
                    if info.name not in ("base",):
                        importlib.import_module(f"kf.passes.strategies.{info.name}")
                _loaded = True
    return STRATEGIES.get(kind) or STRATEGIES["generic"]
