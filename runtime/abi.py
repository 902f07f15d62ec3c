"""The one description of a compiled kernel that the compiler writes and the runtime
reads: entry point, tensor arguments, launch geometry, shared memory, artifact kind.

This is the only thing compiler and runtime share (as IREE's compiler and runtime share
only the artifact format). It is plain data, serialized as JSON; it imports neither
mlir nor torch (its element types are kf's element table, ``kf.dialects.elements``,
plain data too), so a cache hit in a new process needs neither the compiler nor MLIR.

Calling convention (destination passing), the same on every target: the kernel takes
its inputs, then its outputs, each a dense row-major buffer of the given shape and
element type; the launcher allocates outputs and makes inputs contiguous.

Index checks: a program whose kernels load or store through indices (gather,
index_select, index_add, scatter_add) lists each such op as an ``IndexSite``. Those
kernels check every index against its bound where they use it, clamp it so the access
stays inside the buffer, and report the first bad one in the program's error flag: one
more buffer, ``ProgramABI.flag_buffer``, of ``INDEX_FLAG_WORDS`` int32 words that the
launcher zeroes before the launch and reads after it (``ProgramABI.raise_index_error``)::

    word 0: nonzero once an index was out of range
    word 1: the IndexSite (its position in ``index_sites``) that saw it
    words 2, 3: the index's value, low and high 32 bits

The kernel that sees a bad index first sets word 0 with an atomic or and, only if it
was 0 before, writes words 1..3, so the three belong to one index even when many
threads fail at once.
"""

from __future__ import annotations

import ast
import json
import operator
import re
from dataclasses import asdict, dataclass, field
from functools import cached_property, lru_cache
from typing import Sequence

from kf.dialects.elements import ELEMENTS

#: kf element type name -> (torch dtype name, bytes per element), from kf's element table
ELEM_INFO: dict[str, tuple[str, int]] = {n: (e.torch_name, e.nbytes) for n, e in ELEMENTS.items()}

#: Multiprocessors assumed where no CUDA device is there to ask: the H200's. The compiler
#: builds persistent kernels' grids for it (kf.targets.cuda, the strategies) without a GPU.
DEFAULT_MULTIPROCESSORS = 132


#: a dim of TensorArg.shape whose size is known only at run time
DYN = -1
#: the largest size a run-time dim takes (larger sizes compile for their own value): GPU
#: kernels declare a run-time dim's buffer extent with it
MAX_DYNAMIC_SIZE = 4096


@dataclass(frozen=True)
class TensorArg:
    """One tensor argument: its name in the user's function (or result index), shape, element type.

    A program compiled for run-time sizes has ``DYN`` dims in its shapes, and ``dims``
    says each dim's size: a number, or an expression over symbols (``s0``, ``2*s0``). An
    input's run-time dims are bare symbols, which a call binds (``bind_sizes``), or
    expressions of symbols that other input dims bind (a region of a Dynamo graph takes
    ``x`` of ``(s0, s1)`` and its view of ``(s0*s1,)``), which the call checks; an
    output's or temporary's are evaluated from them (``sized``)."""

    name: str
    shape: tuple[int, ...]
    elem: str
    dims: tuple[str, ...] = ()

    @property
    def is_static(self) -> bool:
        return DYN not in self.shape

    def sized(self, sizes: dict[str, int]) -> tuple[int, ...]:
        """The shape in a call whose symbols have these sizes."""
        if not self.dims:
            return self.shape
        return tuple(d if d != DYN else eval_size(e, sizes) for d, e in zip(self.shape, self.dims))

    @property
    def numel(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n

    @property
    def nbytes(self) -> int:
        return self.numel * ELEM_INFO[self.elem][1]


_BINARY = {ast.Add: operator.add, ast.Sub: operator.sub, ast.Mult: operator.mul, ast.FloorDiv: operator.floordiv,
           ast.Mod: operator.mod}
#: the functions of sympy's printing of torch's size expressions
_CALLS = {"FloorDiv": operator.floordiv, "Mod": operator.mod, "Max": max, "Min": min}


@lru_cache(maxsize=4096)
def _parsed(expr: str) -> ast.Expression:
    """An expression's syntax tree, parsed once: launches evaluate the same few."""
    return ast.parse(expr, mode="eval")


def _integer(n: ast.AST, sizes: dict[str, int], expr: str) -> int:
    """The value of an integer arithmetic node over the symbols (see eval_size)."""
    if isinstance(n, ast.Expression):
        return _integer(n.body, sizes, expr)
    if isinstance(n, ast.Constant) and type(n.value) is int:
        return n.value
    if isinstance(n, ast.Name) and n.id in sizes:
        return sizes[n.id]
    if isinstance(n, ast.BinOp) and type(n.op) in _BINARY:
        return _BINARY[type(n.op)](_integer(n.left, sizes, expr), _integer(n.right, sizes, expr))
    if isinstance(n, ast.UnaryOp) and isinstance(n.op, ast.USub):
        return -_integer(n.operand, sizes, expr)
    if isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id in _CALLS and not n.keywords:
        return _CALLS[n.func.id](*[_integer(a, sizes, expr) for a in n.args])
    raise ValueError(f"size expression {expr!r}: {ast.dump(n)[:80]} is not integer arithmetic on its symbols")


def eval_size(expr: str, sizes: dict[str, int]) -> int:
    """An integer size expression (``2*s0 + 1``, ``FloorDiv(s0, 2)``) for these symbol
    sizes; ValueError for anything else (the runtime evaluates no other code)."""
    return int(_integer(_parsed(expr), sizes, expr))


_COMPARE = {ast.Eq: operator.eq, ast.NotEq: operator.ne, ast.Lt: operator.lt, ast.LtE: operator.le,
            ast.Gt: operator.gt, ast.GtE: operator.ge}
#: sympy's printing of relations and of their combinations, as functions
_RELATIONS = {"Eq": operator.eq, "Ne": operator.ne, "Lt": operator.lt, "Le": operator.le, "Gt": operator.gt,
              "Ge": operator.ge, "And": lambda *a: all(a), "Or": lambda *a: any(a), "Not": operator.not_}


def eval_guard(expr: str, sizes: dict[str, int]) -> bool:
    """A condition on sizes (a guard torch's trace needed: ``Ne(s0 - 1, 1)``, ``s0 - 1 >=
    2``, ``Eq(Mod(s0, 2), 0)``, and their ``&``, ``|``, ``~``) for these symbol sizes;
    ValueError for anything else (the runtime evaluates no other code)."""
    def ev(n):
        if isinstance(n, ast.Expression):
            return ev(n.body)
        if isinstance(n, ast.Compare):
            left = ev(n.left)
            for op, right in zip(n.ops, n.comparators):
                if type(op) not in _COMPARE:
                    break
                r = ev(right)
                if not _COMPARE[type(op)](left, r):
                    return False
                left = r
            else:
                return True
        elif isinstance(n, ast.Call) and isinstance(n.func, ast.Name) and n.func.id in _RELATIONS and \
                not n.keywords:
            return _RELATIONS[n.func.id](*[ev(a) for a in n.args])
        elif isinstance(n, ast.BinOp) and isinstance(n.op, (ast.BitAnd, ast.BitOr)):
            a, b = bool(ev(n.left)), bool(ev(n.right))
            return (a and b) if isinstance(n.op, ast.BitAnd) else (a or b)
        elif isinstance(n, ast.UnaryOp) and isinstance(n.op, (ast.Invert, ast.Not)):
            return not ev(n.operand)
        elif isinstance(n, ast.Constant) and type(n.value) is bool:
            return n.value
        else:
            return _integer(n, sizes, expr)
        raise ValueError(f"guard {expr!r}: {ast.dump(n)[:80]} is not a comparison of sizes")

    return bool(ev(_parsed(expr)))


#: a dim that is a number times one symbol (``2*s3``)
_TIMES = re.compile(r"(\d+)\*([A-Za-z_]\w*)")


def bind_sizes(args: Sequence["TensorArg"], shapes: Sequence[Sequence[int]], min_size: int = 2,
               max_size: int | None = None) -> dict[str, int] | str:
    """The symbols' sizes in a call whose inputs have these shapes, or why the shapes do
    not fit the program (text): a static dim that differs, a run-time dim below min_size
    (sizes 0 are compiled apart) or above max_size (GPU kernels: MAX_DYNAMIC_SIZE), or
    one symbol given two sizes, or a dim that is an expression (``s0*s1``) of another
    size than its symbols give."""
    sizes: dict[str, int] = {}
    derived = []  # (arg, dim, expression, size): checked once every symbol is bound
    for a, shape in zip(args, shapes):
        if len(shape) != len(a.shape):
            return f"'{a.name}' has rank {len(shape)}, the program takes rank {len(a.shape)}"
        for d, (want, got) in enumerate(zip(a.shape, shape)):
            if want != DYN:
                if want != got:
                    return f"'{a.name}' dim {d} is {got}, the program takes {want}"
                continue
            name = a.dims[d]
            if got < min_size:
                return f"'{a.name}' dim {d} is {got}; the program takes sizes from {min_size}"
            if max_size is not None and got > max_size:
                return f"'{a.name}' dim {d} is {got}; the program takes sizes up to {max_size}"
            if not name.isidentifier():
                derived.append((a, d, name, got))
            elif sizes.setdefault(name, got) != got:
                return f"'{a.name}' dim {d} is {got}, but {name} is {sizes[name]} in another input"
    for a, d, expr, got in derived:  # a symbol no input dim gives alone, but times a number
        m = _TIMES.fullmatch(expr.replace(" ", ""))  # (the rows of a flattened [2, s] batch: 2*s)
        if m and m.group(2) not in sizes:
            times = int(m.group(1))
            if got % times:
                return f"'{a.name}' dim {d} is {got}, but it is {expr}"
            sizes[m.group(2)] = got // times
    for a, d, expr, got in derived:
        try:
            want = eval_size(expr, sizes)
        except ValueError:
            return f"'{a.name}' dim {d} is {expr}, of symbols no input dim gives"
        if want != got:
            return f"'{a.name}' dim {d} is {got}, but {expr} is {want}"
    return sizes


#: int32 words of a program's index error flag (see the module docstring).
INDEX_FLAG_WORDS = 4


class IndexOutOfRange(IndexError):
    """An index that a kf kernel used is outside the dimension it indexes: the op, the
    user's line and the bound it broke are in the message. The kernel clamped it (no
    memory outside a buffer was touched); the call's results are not returned."""


@dataclass(frozen=True)
class IndexSite:
    """One op whose kernel checks its indices: the kf op, the user's file:line, the
    dimension it indexes and that dimension's size."""

    op: str
    where: str
    dim: int
    bound: int


@dataclass(frozen=True)
class KernelABI:
    """How to launch one kernel. ``args`` index into the program's buffers (see ProgramABI)."""

    entry: str
    args: tuple[int, ...]  # buffer ids, inputs first, then outputs
    grid: tuple[int, int, int] = (1, 1, 1)
    block: tuple[int, int, int] = (1, 1, 1)
    shared_bytes: int = 0  # dynamic shared (workgroup) memory
    artifact: str = ""  # file name of the binary (ptx / spv / msl / so) beside the metadata
    fused_lines: tuple[str, ...] = ()  # the user's file:line of every op fused here
    extra: dict = field(default_factory=dict)  # per-target details (registers, spills, ...)
    #: run-time sizes (GPU): the values of the kernel's size slots, expressions over the
    #: program's symbols; the launcher passes them as a buffer of int32, the kernel's
    #: last argument (after the index error flag)
    sizes: tuple[str, ...] = ()
    #: with ``sizes``: the grid as expressions over the slots ``k0``, ``k1``, ...
    grid_sizes: tuple[str, ...] = ()

    def sized_grid(self, sizes: dict[str, int]) -> tuple[tuple[int, int, int], list[int]]:
        """(the grid, the slots' values) in a call whose symbols have these sizes."""
        slots = [eval_size(e, sizes) for e in self.sizes]
        if not self.grid_sizes:
            return self.grid, slots
        named = {f"k{i}": v for i, v in enumerate(slots)}
        return tuple(max(1, eval_size(g, named)) for g in self.grid_sizes), slots


@dataclass(frozen=True)
class SizedCall:
    """What a call of a program with run-time sizes needs, for one set of input shapes:
    the symbols' sizes, each output's and temporary's shape, and for each kernel None
    (static) or its (grid, size slots)."""

    sizes: dict
    outputs: tuple[tuple[int, ...], ...]
    temporaries: tuple[tuple[int, ...], ...]
    launches: tuple


#: the input shapes a program keeps its SizedCall for (the newest)
SIZED_CALLS_KEPT = 64


@dataclass(frozen=True)
class ProgramABI:
    """A compiled function: its buffers and the kernels launched in order over them.

    Buffers 0..len(inputs)-1 are the user's tensor inputs, the next len(outputs) are the
    results, and the rest are temporaries the launcher allocates for the call.
    """

    target: str
    inputs: tuple[TensorArg, ...]
    outputs: tuple[TensorArg, ...]
    temporaries: tuple[TensorArg, ...] = ()
    kernels: tuple[KernelABI, ...] = ()
    output_aliases: tuple[int, ...] = ()  # for each output: -1, or the input it is a view of
    index_sites: tuple[IndexSite, ...] = ()  # the ops whose kernels write the error flag
    #: for each output (or empty: none): -1, or the buffer (an input, or an earlier output)
    #: whose values it takes as a new tensor, where kf computed nothing but eager returns new memory
    output_copies: tuple[int, ...] = ()

    @property
    def flag_buffer(self) -> int:
        """The buffer id of the index error flag (after the temporaries), -1 when no
        kernel checks indices."""
        if not self.index_sites:
            return -1
        return len(self.inputs) + len(self.outputs) + len(self.temporaries)

    @property
    def flag_arg(self) -> TensorArg:
        """The error flag as a buffer (``INDEX_FLAG_WORDS`` int32 words)."""
        return TensorArg("index_error_flag", (INDEX_FLAG_WORDS,), "i32")

    def raise_index_error(self, words) -> None:
        """Raise IndexOutOfRange for a read-back error flag (a sequence of its int32
        words) that is set; return when it is not."""
        if not words[0]:
            return
        site = int(words[1])
        value = (int(words[2]) & 0xFFFFFFFF) | (int(words[3]) << 32)
        if site < 0 or site >= len(self.index_sites):
            raise IndexOutOfRange(f"kf: a kernel used an index {value} that is out of range")
        s = self.index_sites[site]
        where = f" at {s.where}" if s.where else ""
        # (the dimension's number is kf's: advanced indexing moves dims, so it is not said)
        raise IndexOutOfRange(f"index {value} is out of range for a dimension of size {s.bound} ({s.op}{where})")

    @property
    def is_static(self) -> bool:
        """No buffer has a run-time size."""
        return all(a.is_static for a in (*self.inputs, *self.outputs, *self.temporaries))

    @cached_property
    def planned_sizes(self) -> tuple[tuple[str, str, int], ...]:
        """(what, expression, its bound) for each run-time size that can pass what GPU
        kernels with run-time sizes are planned for: a buffer's dim that is an expression
        of the symbols (``4*s0`` of a flattened [n, 4]) at most MAX_DYNAMIC_SIZE, a
        kernel's size slot (a view's dim: ``3*s0`` of a [3, n, 8] read as [3n, 8]) at
        most MAX_DYNAMIC_SIZE or its ``largest_slot`` (less where it merges a run-time dim
        with others). A bare symbol bind_sizes bounds already."""
        out = {(f"'{a.name}'", d, MAX_DYNAMIC_SIZE) for a in (*self.inputs, *self.outputs, *self.temporaries)
               for d in a.dims if d and not d.isidentifier() and not d.lstrip("-").isdigit()}
        for k in self.kernels:
            bound = int((k.extra or {}).get("largest_slot", MAX_DYNAMIC_SIZE))
            out |= {(f"kernel {k.entry}", e, bound) for e in k.sizes if bound < MAX_DYNAMIC_SIZE or not e.isidentifier()}
        return tuple(sorted(out))

    @cached_property
    def _sized_calls(self) -> dict:
        return {}

    def sized_call(self, shapes: tuple[tuple[int, ...], ...]) -> SizedCall | str:
        """The SizedCall of a call whose inputs have these shapes (sizes from 1 to
        MAX_DYNAMIC_SIZE: a size 1 reaches a program only where kf found that it serves
        it, compiler/api.py), or why they do not fit (bind_sizes, beyond_planned_sizes).
        Kept for the newest SIZED_CALLS_KEPT shapes: a loop that meets a length again
        evaluates no size expression."""
        memo = self._sized_calls
        hit = memo.get(shapes)
        if hit is None:
            sizes = bind_sizes(self.inputs, shapes, 1, MAX_DYNAMIC_SIZE)
            if isinstance(sizes, str):
                return sizes
            hit = self.beyond_planned_sizes(sizes) or SizedCall(
                sizes, tuple(a.sized(sizes) for a in self.outputs), tuple(a.sized(sizes) for a in self.temporaries),
                tuple(k.sized_grid(sizes) if k.sizes else None for k in self.kernels))
            if len(memo) >= SIZED_CALLS_KEPT:
                memo.pop(next(iter(memo)))
            memo[shapes] = hit
        return hit

    def beyond_planned_sizes(self, sizes: dict[str, int]) -> str | None:
        """Why a call's symbol sizes give a run-time size past its planned bound
        (planned_sizes), or None."""
        for what, e, bound in self.planned_sizes:
            n = eval_size(e, sizes)
            if n > bound:
                return f"{what} has a run-time size of {n} ({e}); the program's kernels take sizes up to {bound}"
        return None

    @cached_property
    def largest_run_time_size(self) -> int:
        """The largest size every symbol may take at once with each planned size
        (planned_sizes) within its bound: MAX_DYNAMIC_SIZE where each is a symbol, less
        where one is a product or sum of them (a flattened ``[n, 4]`` is ``4*s0``: s0 up
        to 1024). Symbols are set to one size together, which bounds several at once
        safely."""
        limits = [(e, bound) for _, e, bound in self.planned_sizes]
        symbols = {x for a in self.inputs for x in a.dims if x.isidentifier()}
        if not limits or not symbols:
            return MAX_DYNAMIC_SIZE

        def fits(v: int) -> bool:
            sizes = dict.fromkeys(symbols, v)
            try:
                return all(eval_size(e, sizes) <= bound for e, bound in limits)
            except ValueError:
                return False

        lo, hi = 1, MAX_DYNAMIC_SIZE  # sizes are nondecreasing in each symbol
        if fits(hi):
            return hi
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (mid, hi) if fits(mid) else (lo, mid)
        return lo

    def to_json(self) -> str:
        return json.dumps(asdict(self), indent=1, sort_keys=True)

    def take_inputs(self, inputs: Sequence, outs: list) -> list:
        """The outputs after the kernels ran: those that are views of an input
        (``output_aliases``) made so, those that copy a buffer (``output_copies``: an
        input, or an earlier output) made new tensors with its values."""
        for j, alias in enumerate(self.output_aliases):
            if alias >= 0:
                outs[j] = inputs[alias].reshape(self.outputs[j].shape)
        for j, c in enumerate(self.output_copies):
            if c >= 0:
                src = inputs[c] if c < len(self.inputs) else outs[c - len(self.inputs)]
                outs[j] = src.reshape(self.outputs[j].shape).clone()
        return outs

    def unwritten(self, j: int) -> bool:
        """Whether no kernel writes output j (it is a view or a copy of another buffer)."""
        return (j < len(self.output_aliases) and self.output_aliases[j] >= 0) or \
            (j < len(self.output_copies) and self.output_copies[j] >= 0)

    @staticmethod
    def from_json(text: str) -> "ProgramABI":
        d = json.loads(text)

        def targ(x):
            return TensorArg(x["name"], tuple(x["shape"]), x["elem"], tuple(x.get("dims", ())))

        kernels = tuple(
            KernelABI(k["entry"], tuple(k["args"]), tuple(k["grid"]), tuple(k["block"]), k["shared_bytes"],
                      k["artifact"], tuple(k["fused_lines"]), k["extra"], tuple(k.get("sizes", ())),
                      tuple(k.get("grid_sizes", ())))
            for k in d["kernels"])
        sites = tuple(IndexSite(x["op"], x["where"], int(x["dim"]), int(x["bound"]))
                      for x in d.get("index_sites", ()))
        return ProgramABI(d["target"], tuple(map(targ, d["inputs"])), tuple(map(targ, d["outputs"])),
                          tuple(map(targ, d["temporaries"])), kernels, tuple(d.get("output_aliases", ())), sites,
                          tuple(d.get("output_copies", ())))


#: Vulkan's subgroup operations (VkSubgroupFeatureFlagBits, bit i = name i) by the
#: names kf uses.
SUBGROUP_OPS = ("basic", "vote", "arithmetic", "ballot", "shuffle", "shuffle_relative", "clustered", "quad")

#: VK_SHADER_STAGE_COMPUTE_BIT: subgroup operations count only where compute shaders have them.
_COMPUTE_STAGE = 0x20

#: The float controls (VkPhysicalDeviceFloatControlsProperties) kf's SPIR-V may declare,
#: by the names kf uses: ``preserveN`` = shaderSignedZeroInfNanPreserveFloatN (inf, NaN and
#: -0.0 kept: the SignedZeroInfNanPreserve execution mode), ``denormN`` =
#: shaderDenormPreserveFloatN (subnormals kept: DenormPreserve), ``rteN`` =
#: shaderRoundingModeRTEFloatN (round to nearest even, conversions included: RoundingModeRTE).
FLOAT_CONTROLS = tuple(f"{kind}{w}" for kind in ("preserve", "denorm", "rte") for w in (16, 32, 64))
_FLOAT_CONTROL_PROPERTY = {"preserve": "shaderSignedZeroInfNanPreserveFloat", "denorm": "shaderDenormPreserveFloat",
                           "rte": "shaderRoundingModeRTEFloat"}
#: What kf assumes of a device it cannot ask: inf, NaN and -0.0 kept in f16 and f32 (kf's
#: kernels declare it whatever the device; the Vulkan launcher refuses a device without).
DEFAULT_FLOAT_CONTROLS = ("preserve16", "preserve32")
#: VK_SHADER_FLOAT_CONTROLS_INDEPENDENCE_ALL: each width's mode may be set on its own.
_INDEPENDENCE_ALL = 1


def float_controls_from_vulkan(props: dict) -> tuple[str, ...]:
    """The FLOAT_CONTROLS a device has, from VkPhysicalDeviceFloatControlsProperties under
    Vulkan's names. A device whose denormal (or rounding) modes are not independent per
    width (``denormBehaviorIndependence`` / ``roundingModeIndependence`` not ALL) must set
    them alike for every width: its denorm (rte) controls count only where it has all
    three widths."""
    have = {f"{kind}{w}" for kind, prop in _FLOAT_CONTROL_PROPERTY.items() for w in (16, 32, 64)
            if props.get(f"{prop}{w}")}
    for kind, independence in (("denorm", "denormBehaviorIndependence"), ("rte", "roundingModeIndependence")):
        widths = {f"{kind}{w}" for w in (16, 32, 64)}
        if int(props.get(independence, _INDEPENDENCE_ALL)) != _INDEPENDENCE_ALL and not widths <= have:
            have -= widths
    return tuple(f for f in FLOAT_CONTROLS if f in have)


#: VkComponentTypeKHR -> kf element type, for the float components kf's cooperative-matrix
#: kernels may use (1000141000: VK_COMPONENT_TYPE_BFLOAT16_KHR, of VK_KHR_shader_bfloat16)
COMPONENT_TYPES = {0: "f16", 1: "f32", 2: "f64", 1000141000: "bf16"}
#: VK_SCOPE_SUBGROUP_KHR: kf's kernels multiply cooperative matrices of one subgroup
_SCOPE_SUBGROUP = 3


@dataclass(frozen=True)
class CoopMatShape:
    """One shape a device multiplies with cooperative matrices at subgroup scope: an
    M x K ``a`` times a K x N ``b`` plus an M x N ``c`` gives an M x N ``result``
    (kf element types). Its text is ``MxNxK:a:b:c:result``."""

    m: int
    n: int
    k: int
    a: str
    b: str
    c: str
    result: str

    def spec(self) -> str:
        return f"{self.m}x{self.n}x{self.k}:{self.a}:{self.b}:{self.c}:{self.result}"

    @staticmethod
    def parse(text: str) -> "CoopMatShape":
        size, *types = text.split(":")
        try:
            m, n, k = (int(v) for v in size.split("x"))
        except ValueError:
            m = n = k = 0
        if len(types) != 4 or min(m, n, k) <= 0 or any(t not in COMPONENT_TYPES.values() for t in types):
            raise ValueError(f"cooperative matrix '{text}' is not MxNxK:a:b:c:result with element types among "
                             f"{', '.join(COMPONENT_TYPES.values())} (e.g. 16x16x16:f16:f16:f32:f32)")
        return CoopMatShape(m, n, k, *types)


def cooperative_matrices_from_vulkan(entries) -> tuple[str, ...]:
    """The CoopMatShape texts of a device's VkCooperativeMatrixPropertiesKHR entries (under
    Vulkan's names, enums as numbers): subgroup scope, no saturating accumulation, float
    components kf knows; in the device's order, each once."""
    out = []
    for e in entries or ():
        types = [COMPONENT_TYPES.get(int(e[f])) for f in ("AType", "BType", "CType", "ResultType")]
        if int(e["scope"]) != _SCOPE_SUBGROUP or e.get("saturatingAccumulation") or None in types:
            continue
        text = CoopMatShape(int(e["MSize"]), int(e["NSize"]), int(e["KSize"]), *types).spec()
        if text not in out:
            out.append(text)
    return tuple(out)


def loop_limit(device_name: str) -> int:
    """The loop iterations an invocation may run in all on a device (0: no limit):
    llvmpipe (lavapipe) ends every loop of an invocation once 65535 iterations have run
    (LP_MAX_TGSI_LOOP_ITERATIONS, gallivm's infinite-loop guard)."""
    return 65535 if "llvmpipe" in device_name.lower() else 0


@dataclass(frozen=True)
class DeviceLimits:
    """What kf's SPIR-V strategies may assume of the device a Vulkan (or Metal) program
    runs on: workgroup memory, workgroup size, subgroup size and operations.

    The runtime reads them from the Vulkan device (``from_vulkan``); the compiler hands
    them to kf-tile and kf-map-to-gpu as the text of ``spec()`` (the ``limits`` option,
    part of the cache key through the driver's device key), so two devices of other
    limits never share a program. The defaults are what kf assumes of a device it cannot
    ask (the Metal target, or no Vulkan here): 16 KiB of workgroup memory, 256
    invocations, and no subgroup operations -- what nearly every Vulkan and Metal device
    gives (Vulkan itself guarantees 16 KiB and 128).

    ``float_controls`` (of FLOAT_CONTROLS) are the execution modes kf-to-spirv may declare
    for the device: the same SPIR-V with and without DenormPreserve or RoundingModeRTE
    gives other results, so they are part of the key too.

    ``cooperative_matrix`` (CoopMatShape texts) are the shapes the device multiplies with
    VK_KHR_cooperative_matrix at subgroup scope, where the runtime enabled the extension
    (and the Vulkan memory model it needs): the matmul strategy uses them only for a
    shape listed here. Empty (lavapipe, Metal, a device without the extension), the
    spec's text has no ``coopmat`` item, as before there was one.
    """

    shared_bytes: int = 16 * 1024  # maxComputeSharedMemorySize
    invocations: int = 256  # maxComputeWorkGroupInvocations
    workgroup_size: tuple[int, int, int] = (256, 256, 64)  # maxComputeWorkGroupSize
    subgroup_size: int = 32  # subgroupSize (0: unknown)
    subgroup_ops: tuple[str, ...] = ()  # of SUBGROUP_OPS, those compute shaders have
    float_controls: tuple[str, ...] = DEFAULT_FLOAT_CONTROLS  # of FLOAT_CONTROLS, those the device has
    cooperative_matrix: tuple[str, ...] = ()  # CoopMatShape texts
    #: loop iterations an invocation may run in all before the driver ends its loops (0:
    #: no such limit; lavapipe's is 65535): kernels whose loops run to a run-time size
    #: compile for static sizes where their bound could pass it
    loops: int = 0

    def spec(self) -> str:
        """The limits as one word of text (a pass option's value, a cache key's part)."""
        size = "x".join(map(str, self.workgroup_size))
        ops = "+".join(self.subgroup_ops) or "none"
        floats = "+".join(self.float_controls) or "none"
        coopmat = f",coopmat={'+'.join(self.cooperative_matrix)}" if self.cooperative_matrix else ""
        loops = f",loops={self.loops}" if self.loops else ""
        return (f"shared={self.shared_bytes},invocations={self.invocations},size={size},"
                f"subgroup={self.subgroup_size},ops={ops},float={floats}{coopmat}{loops}")

    def cooperative_shapes(self) -> tuple[CoopMatShape, ...]:
        return tuple(CoopMatShape.parse(t) for t in self.cooperative_matrix)

    @staticmethod
    def parse(text: str) -> "DeviceLimits":
        """The inverse of spec(); a malformed text is a ValueError naming what is wrong."""
        fields = {}
        for item in text.split(","):
            key, sep, value = item.partition("=")
            if not sep:
                raise ValueError(f"device limits '{text}': '{item}' is not key=value "
                                 f"(expected {DeviceLimits().spec()})")
            fields[key.strip()] = value.strip()
        known = {"shared", "invocations", "size", "subgroup", "ops"}
        # float may be left out: the defaults (DEFAULT_FLOAT_CONTROLS); coopmat: none;
        # loops: no limit
        if not known <= set(fields) <= known | {"float", "coopmat", "loops"}:
            raise ValueError(f"device limits '{text}' must give exactly {', '.join(sorted(known))} "
                             f"(and optionally float, coopmat and loops)")
        coopmat = tuple(t for t in fields.get("coopmat", "").split("+") if t and t != "none")
        for t in coopmat:
            CoopMatShape.parse(t)  # a ValueError naming the bad entry
        floats = tuple(f for f in fields.get("float", "+".join(DEFAULT_FLOAT_CONTROLS)).split("+")
                       if f and f != "none")
        try:
            size = tuple(int(v) for v in fields["size"].split("x"))
            limits = DeviceLimits(int(fields["shared"]), int(fields["invocations"]), size,
                                  int(fields["subgroup"]),
                                  tuple(o for o in fields["ops"].split("+") if o and o != "none"), floats,
                                  coopmat, int(fields.get("loops", 0)))
        except ValueError:
            raise ValueError(f"device limits '{text}': shared, invocations, subgroup and loops are integers, "
                             f"size is AxBxC") from None
        unknown = [o for o in limits.subgroup_ops if o not in SUBGROUP_OPS]
        if len(size) != 3 or unknown:
            raise ValueError(f"device limits '{text}': size has three numbers and ops are among "
                             f"{', '.join(SUBGROUP_OPS)} (got {size}, unknown ops {unknown})")
        unknown = [f for f in floats if f not in FLOAT_CONTROLS]
        if unknown:
            raise ValueError(f"device limits '{text}': float controls are among {', '.join(FLOAT_CONTROLS)} "
                             f"(unknown: {', '.join(unknown)})")
        return limits

    @staticmethod
    def from_vulkan(properties: dict) -> "DeviceLimits":
        """The limits of a device from its Vulkan properties, given by Vulkan's own names:
        ``{"limits": {maxComputeSharedMemorySize, maxComputeWorkGroupInvocations,
        maxComputeWorkGroupSize}, "subgroup": {subgroupSize, supportedStages,
        supportedOperations}, "floatControls": {shaderSignedZeroInfNanPreserveFloat16, ...},
        "cooperativeMatrix": [VkCooperativeMatrixPropertiesKHR, ...]}`` (what
        ``runtime/vulkan.py`` reads of a device, and what the recorded devices of kf's tests
        hold; without floatControls, DEFAULT_FLOAT_CONTROLS; without cooperativeMatrix, none)."""
        lim, sub = properties["limits"], properties.get("subgroup", {})
        stages, bits = int(sub.get("supportedStages", 0)), int(sub.get("supportedOperations", 0))
        ops = tuple(n for i, n in enumerate(SUBGROUP_OPS) if bits >> i & 1) if stages & _COMPUTE_STAGE else ()
        controls = properties.get("floatControls")
        floats = float_controls_from_vulkan(controls) if controls is not None else DEFAULT_FLOAT_CONTROLS
        return DeviceLimits(int(lim["maxComputeSharedMemorySize"]), int(lim["maxComputeWorkGroupInvocations"]),
                            tuple(int(v) for v in lim["maxComputeWorkGroupSize"]),
                            int(sub.get("subgroupSize", 0)), ops, floats,
                            cooperative_matrices_from_vulkan(properties.get("cooperativeMatrix")),
                            loop_limit(str(properties.get("deviceName", ""))))
