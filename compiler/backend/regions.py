"""One region of a Dynamo/AOTAutograd graph as a kf program.

The region is an FX GraphModule of ATen nodes (a partition of the graph, its boundary
tensors its placeholders and outputs). kf converts it directly -- capture's post-trace
path, ``capture._convert`` on the FX graph, no Python re-traced -- and walks the target's
stages after capture (kf-fuse makes its kernels), caching the program on disk by the
region's graph text, the signature, the options and the target.

Shapes. A region whose graph has static sizes is compiled once, for them. Where the
graph carries Dynamo's symbolic sizes (``dynamic=True``, automatic dynamic) and the
target's programs take run-time sizes, the region is one kf program for every size
(sizes.py): its symbolic dims are run-time sizes, so a new sequence length runs the same
program. Where it cannot be (a size used as a float, a target or a kernel without
run-time sizes), the region is compiled per concrete signature of its inputs (shapes,
dtypes, the values of int inputs), and the report and the ``kf.recompiles`` logger say
why: the first call with new sizes traces the region again with ``make_fx`` on them
(stack traces kept) and converts that graph. Sizes 0 and 1, and sizes past
MAX_DYNAMIC_SIZE, always get programs of their own, as kf.jit's. Dynamo itself does not
recompile.

Boundaries. Inputs are given to the program contiguous (the graph's ops compute on
logical shapes); outputs come back with the strides the graph's metadata promises, so
the fallback's code that reads them (Inductor asserts strides) sees what it expects.
"""

from __future__ import annotations

import hashlib
import linecache
import re
import time
import types
from dataclasses import dataclass, field
from typing import Any, Callable

import torch

from ..errors import CompileError, DynamicFallback, SourceLoc, debug
from ..options import Options

_FRAME = re.compile(r'File "([^"]+)", line (\d+), in (\S+)')


def user_loc(node: torch.fx.Node) -> SourceLoc | None:
    """The innermost frame of a node's stack trace outside torch: the user's line."""
    from ..packages import kf_package_dirs

    trace = node.meta.get("stack_trace") or ""
    best = None
    ours = tuple(d + "/" for d in kf_package_dirs())
    for file, line, name in _FRAME.findall(trace):
        if "/torch/" in file or file.startswith(ours):
            continue
        best = (file, int(line), name)
    if best is None:
        return None
    file, line, name = best
    text = linecache.getline(file, line)
    col = len(text) - len(text.lstrip()) + 1 if text else 1
    return SourceLoc(file, line, col, name)


def _placeholder_fn(name: str, loc: SourceLoc | None) -> Callable:
    """A function standing for the region where kf's pipeline wants the user's function:
    its name, and its code placed at the region's first user line (errors with no better
    line point there)."""
    def region(*tensors):
        return tensors

    code = region.__code__.replace(co_name=name, co_qualname=name)
    if loc is not None:
        code = code.replace(co_filename=loc.file, co_firstlineno=loc.line)
    fn = types.FunctionType(code, {}, name)
    return fn


def symbolic(gm: torch.fx.GraphModule) -> bool:
    """Whether the graph's placeholders carry symbolic sizes (or are SymInts)."""
    for n in gm.graph.nodes:
        if n.op != "placeholder":
            continue
        v = n.meta.get("val")
        if isinstance(v, torch.SymInt):
            return True
        if isinstance(v, torch.Tensor) and any(not isinstance(s, int) for s in (*v.shape, *v.stride())):
            return True
        if not isinstance(v, torch.Tensor) and v is not None and not isinstance(v, (int, float, bool)):
            return True
    return False


def specialize(gm: torch.fx.GraphModule, args: list) -> torch.fx.GraphModule:
    """The region traced again on concrete inputs (their sizes): every size a number, the
    user's stack traces kept on the nodes, and int inputs folded in."""
    from torch.fx import traceback as fx_traceback
    from torch.fx.experimental.proxy_tensor import make_fx

    with fx_traceback.preserve_node_meta():
        out = make_fx(torch.fx.Interpreter(gm).run, tracing_mode="fake")(*args)
    for n in list(out.graph.nodes):
        if n.op == "placeholder" and not isinstance(n.meta.get("val"), torch.Tensor):
            if n.users:
                raise CompileError(f"a region reads a non-tensor input ({n.name}) after specialization")
            out.graph.erase_node(n)
    out.recompile()
    return out


class _Ref:
    """A node in graph_text: by its position, so that two regions computing the same thing
    under other node names (each layer of a model) have one text."""

    def __init__(self, index: int):
        self.index = index

    def __repr__(self) -> str:
        return f"%{self.index}"


def graph_text(gm: torch.fx.GraphModule) -> str:
    """What the region computes, for the cache key: each node with its op, arguments,
    result types and strides, and the user line it is located at; nodes named by their
    position (the regions of a model's repeated layers share their program)."""
    position = {n: i for i, n in enumerate(gm.graph.nodes)}
    lines = []
    for n in gm.graph.nodes:
        v = n.meta.get("val")
        vals = v if isinstance(v, (list, tuple)) else [v]
        types_ = [(str(t.dtype), tuple(t.shape), tuple(t.stride())) if isinstance(t, torch.Tensor) else repr(t)
                  for t in vals]
        loc = user_loc(n)
        args, kwargs = torch.fx.node.map_arg((n.args, n.kwargs), lambda a: _Ref(position[a]))
        target = "" if n.op in ("placeholder", "output") else n.target
        lines.append(f"{n.op} {target} {args!r} {kwargs!r} {types_} {loc}")
    return "\n".join(lines)


@dataclass
class Compiled:
    """One kf program of a region for one concrete signature."""

    program: Any  # programs.CompiledProgram
    strides: list  # per output: the strides the graph promises
    shapes: list
    kernels: list[str]
    seconds: float
    cached: bool
    #: with run-time sizes: a call's args -> the promised strides (sizes.output_strides)
    sized_strides: Callable | None = None


@dataclass
class Region:
    """A region's record: what it holds, for the report, and its compiled programs."""

    name: str
    graph: str  # "forward", "backward", "inference"
    ops: list[str]
    lines: list[str]
    kernels: list[str] = field(default_factory=list)
    compiles: int = 0
    #: of compiles, those whose program came from kf's cache (an earlier process, or a
    #: region of this one that computes the same: a model's repeated layers)
    cached: int = 0
    calls: int = 0
    seconds: float = 0.0
    failed: str = ""  # why kf could not compile it at run time (it then runs the fallback)
    sizes: str = ""  # the symbols its one program takes as run-time sizes ("s0, s1")
    static: str = ""  # why a region of symbolic sizes is compiled for each size


def _signature(tensors: list):
    from ..signature import Param, Signature, TensorSig

    return Signature(tuple(Param(f"in{i}", "tensor", TensorSig(tuple(t.shape), _elem(t.dtype), t.device.type, True))
                           for i, t in enumerate(tensors)))


def _elem(dtype) -> str:
    from ..dtypes import kf_elem

    return kf_elem(dtype)


def compile_concrete(gm: torch.fx.GraphModule, tensors: list, options: Options, name: str,
                     sizes=None) -> Compiled:
    """The kf program of a region whose nodes have concrete sizes, for these input
    tensors (real or fake: only their shapes, dtypes and devices are read); with
    ``sizes`` (a sizes.SizePlan), of a region with symbolic sizes, its program of
    run-time sizes (DynamicFallback where it cannot be one). It runs outside the fake
    tensor mode AOTAutograd compiles in: kf's handlers compute constants (an arange's
    values) with real tensors."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    with unset_fake_temporarily():
        return _compile_concrete(gm, tensors, options, name, sizes)


def _compile_concrete(gm: torch.fx.GraphModule, tensors: list, options: Options, name: str,
                      sizes=None) -> Compiled:
    from .. import cache, targets
    from ..capture import _convert
    from ..guards import walk
    from ..programs import load
    from ..stages import StageLog, dump_dir_for

    start = time.perf_counter()
    target = targets.get(options.target)
    locs = [user_loc(n) for n in gm.graph.nodes if n.op == "call_function"]
    first = next((l for l in locs if l is not None), None)
    fn = _placeholder_fn(name, first)
    sig = sizes.signature(tensors) if sizes is not None else _signature(tensors)
    arch = target.arch(options)
    h = hashlib.sha256()
    for part in (cache.compiler_fingerprint(), "fx-region", graph_text(gm), repr(sig), options.stable_hash(),
                 options.target, target.device_key(options)):
        h.update(part.encode())
        h.update(b"\0")
    key = h.hexdigest()
    entry = cache.load(key)
    cached = entry is not None
    if entry is None:
        reads = walk(fn)
        b = targets.Build(target, fn, sig, tensors, options, arch, reads, None)
        last: list = [None]

        def locate(node):
            last[0] = node
            return user_loc(node)

        try:
            if sizes is not None:
                from .sizes import capture

                b.cap = capture(gm, sizes, sig, tensors, lambda graph, metas: _convert(
                    fn, sig, metas, graph, {}, None, "fx", {}, (), (), locate=locate))
            else:
                b.cap = _convert(fn, sig, tensors, gm, {}, None, "fx", {}, (), (), locate=locate)
        except CompileError as e:
            # the node whose conversion failed: the partitioner leaves it out next time
            e.kf_node = last[0].name if last[0] is not None else None
            raise
        except DynamicFallback:
            raise
        except Exception as e:  # a handler's internal error: that node falls back
            if debug():
                raise
            err = CompileError(f"kf's conversion of {last[0].target if last[0] is not None else 'the region'} "
                               f"failed", user_loc(last[0]) if last[0] is not None else None,
                               stage="capture", cause=f"{type(e).__name__}: {str(e).strip()[:200]}")
            err.kf_node = last[0].name if last[0] is not None else None
            raise err from None
        b.log = StageLog(b.cap.name, dump_dir_for(options.dump_ir))
        b.log.default_loc = first
        b.log.function_lines = frozenset(l.line for l in locs if l is not None)
        b.log.record("kf", b.cap.module)
        from ..driver import _internal_error

        for stage_name, stage in target.stages().items():
            if stage_name == "capture":
                continue
            try:
                stage(b)
            except (CompileError, DynamicFallback):
                raise
            except Exception as e:
                if debug():
                    raise
                raise _internal_error(b, e) from None
        entry = cache.store(key, b.meta, b.artifacts)
    program = load(entry, 0)
    out = next(n for n in gm.graph.nodes if n.op == "output").args[0]
    outs = out if isinstance(out, (list, tuple)) else [out]
    vals = [o.meta.get("val") if isinstance(o, torch.fx.Node) else None for o in outs]
    kernels = _kernel_names(entry.meta)
    return Compiled(program, [tuple(v.stride()) if isinstance(v, torch.Tensor) else None for v in vals],
                    [tuple(v.shape) if isinstance(v, torch.Tensor) else None for v in vals], kernels,
                    time.perf_counter() - start, cached)


def check_conversion(gm: torch.fx.GraphModule, name: str) -> None:
    """Convert a region of symbolic sizes at the sizes of the graph's example inputs
    (conversion only, no compile): an op whose handler refuses its arguments whatever
    the sizes (``x[index] = v`` with a 2-d index) raises kf's CompileError naming the
    node now, so the partitioner leaves it out as it does for static regions, instead
    of the region running on the fallback at its first call."""
    import sympy
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    from ..capture import _convert
    from ..dynamic import _concrete, _hinted

    env = next((s.node.shape_env for n in gm.graph.nodes if n.op == "placeholder"
                for s in _symints(n.meta.get("val"))), None)
    if env is None:
        return
    values = getattr(env, "backed_var_to_val", None) or env.var_to_val
    hints = {sym: sympy.Integer(v) for sym, v in values.items()}
    try:
        graph = _hinted(gm, hints)
        metas = [torch.empty(_concrete(list(n.meta["val"].shape), hints), dtype=n.meta["val"].dtype, device="meta")
                 for n in gm.graph.nodes if n.op == "placeholder" and isinstance(n.meta.get("val"), torch.Tensor)]
    except DynamicFallback:
        return  # sizes of no input: the call's own sizes will tell
    locs = [user_loc(n) for n in gm.graph.nodes if n.op == "call_function"]
    fn = _placeholder_fn(name, next((l for l in locs if l is not None), None))
    sig = _signature(metas)
    last: list = [None]

    def locate(node):
        last[0] = node
        return user_loc(node)

    with unset_fake_temporarily():
        try:
            _convert(fn, sig, metas, graph, {}, None, "fx", {}, (), (), locate=locate)
        except CompileError as e:
            if last[0] is None:
                return
            e.kf_node = last[0].name
            raise
        except Exception:
            return  # a handler's internal error at these sizes: the call's compile reports it


def _symints(val) -> list:
    if isinstance(val, torch.Tensor):
        return [s for s in val.shape if isinstance(s, torch.SymInt)]
    return [val] if isinstance(val, torch.SymInt) else []


def _kernel_names(meta: dict) -> list[str]:
    from kf.runtime.abi import ProgramABI

    try:
        abi = ProgramABI.from_json(meta["abi"])
        return [k.entry for k in abi.kernels] or [meta.get("name", "")]
    except Exception:
        return [meta.get("name", "")]


#: the most regions of one graph compiled at once (``precompile_all``)
MAX_PARALLEL_COMPILES = 8


def precompile_all(jobs: list) -> dict:
    """Precompile each (RegionRunner, example inputs) of a graph: {id(runner): the
    CompileError that refused it} for those that fail. Several regions are compiled at
    once, in threads (at most MAX_PARALLEL_COMPILES, and the machine's cores): each
    compile has its own MLIR context, and its lowering (LLVM's, spirv-val's) and ptxas
    run outside Python, so a model's regions take about the longest one's time rather
    than their sum. ``KF_COMPILE_THREADS=1`` compiles them one after another. Errors
    other than CompileError are raised, the first region's first. A region whose graph
    and inputs repeat an earlier one's is compiled after the others: its program comes
    from the cache the first one filled."""
    import concurrent.futures
    import os

    def one(job):
        runner, examples = job
        try:
            runner.precompile(examples)
        except CompileError as e:
            return e
        return None

    # a region that repeats another (a model's layers) is compiled after it, from the cache
    firsts, repeats, seen = [], [], set()
    for job in jobs:
        runner, examples = job
        key = (graph_text(runner.gm), tuple((tuple(a.shape), a.dtype, a.device.type) if isinstance(a, torch.Tensor)
                                            else repr(a) for a in examples))
        (repeats if key in seen else firsts).append(job)
        seen.add(key)
    threads = min(len(firsts), MAX_PARALLEL_COMPILES, os.cpu_count() or 1)
    limit = os.environ.get("KF_COMPILE_THREADS", "")
    if limit.isdigit() and int(limit) > 0:
        threads = min(threads, int(limit))
    if threads <= 1:
        results = [one(job) for job in firsts]
    else:
        with concurrent.futures.ThreadPoolExecutor(max_workers=threads, thread_name_prefix="kf-compile") as pool:
            results = list(pool.map(one, firsts))
    results += [one(job) for job in repeats]
    return {id(runner): e for (runner, _), e in zip(firsts + repeats, results) if e is not None}


class RegionRunner:
    """Calls a region: its kf program of run-time sizes where the graph's sizes are
    symbolic and one program can serve them (sizes.py), else its program for the inputs'
    concrete signature (compiled on first use; specialized from the symbolic graph where
    sizes are symbolic), or the fallback where kf cannot compile it.

    Run-time sizes, as kf.jit's automatic dynamic: the first call tries every symbol of
    the region's inputs as a run-time size. Where that cannot be one program (a GPU
    kernel takes one run-time size), the call gets a program of its own sizes, and once
    some sizes change (the sequence length, not the batch) the symbols that changed are
    tried as run-time sizes with the others held at their size. Where that fails too,
    each new size gets its own program from then on."""

    def __init__(self, gm: torch.fx.GraphModule, options: Options, record: Region, fallback: Callable,
                 on_failure: Callable[[Region, str], None]):
        self.gm = gm
        self.options = options
        self.record = record
        self.fallback = fallback
        self.on_failure = on_failure
        self.symbolic = symbolic(gm)
        self._programs: dict[tuple, Compiled | None] = {}
        #: with symbolic sizes: the plan of every symbol a run-time size (sizes.SizePlan),
        #: None where the region is compiled for each size
        self.sizes = None
        self._sized: list[tuple[Any, Compiled]] = []  # (plan, its program) of run-time sizes
        self._first: dict[str, int] | None = None  # each symbol's size at the first call
        self._changed: set[str] = set()  # the symbols whose size has changed since
        self._tried: set[frozenset] = set()  # the sets of run-time symbols tried
        if self.symbolic:
            plan = _size_plan(gm, options)
            if isinstance(plan, str):
                self._static(plan)
            else:
                self.sizes = plan

    def _static(self, why: str) -> None:
        """No more programs of run-time sizes are tried, for this reason."""
        from ..logs import recompile_log

        self.sizes = None
        self.record.static = why
        recompile_log.info("%s: compiled for each size: %s", self.record.name, why)

    def precompile(self, example_inputs: list) -> None:
        """Compile now for the example inputs (the static case: their sizes are the only
        ones the graph runs with). Raises kf's CompileError where kf cannot."""
        tensors = [t for t in example_inputs if isinstance(t, torch.Tensor)]
        key = self._key(example_inputs)
        self._programs[key] = self._compile(self.gm, tensors)

    def _compile(self, gm, tensors, sizes=None) -> Compiled:
        compiled = compile_concrete(gm, tensors, self.options, self.record.name, sizes)
        self.record.kernels = compiled.kernels
        self.record.compiles += 1
        self.record.cached += compiled.cached
        self.record.seconds += compiled.seconds
        return compiled

    @staticmethod
    def _key(args) -> tuple:
        return tuple((tuple(a.shape), a.dtype, a.device.type) if isinstance(a, torch.Tensor) else (type(a), a)
                     for a in args)

    def __call__(self, *args):
        key = self._key(args)
        compiled = self._programs.get(key, False)
        if compiled is False:
            compiled = self._program(key, list(args))
        if compiled is None:
            return self.fallback(*args)
        self.record.calls += 1
        tensors = [a.contiguous() for a in args if isinstance(a, torch.Tensor)]
        result = compiled.program(tensors)
        strides = compiled.sized_strides(args) if compiled.sized_strides is not None else compiled.strides
        if isinstance(result, (list, tuple)):
            return tuple(_restride(r, s) for r, s in zip(result, strides))
        return _restride(result, strides[0])

    def _program(self, key: tuple, args: list) -> Compiled | None:
        """The program for a call not seen before: one of run-time sizes that serves it,
        else one for the call's sizes."""
        for plan, compiled in self._sized:
            if plan.serves(args):
                self._programs[key] = compiled
                return compiled
        if self.sizes is not None and self.sizes.serves(args):
            compiled = self._compile_sized(args)
            if compiled is not None:
                self._programs[key] = compiled
                return compiled
        return self._specialize(key, args)

    def _compile_sized(self, args: list) -> Compiled | None:
        """A program of run-time sizes for this call, or None (see the class docstring)."""
        from .sizes import output_strides, plan

        now = {name: self.sizes.size_of(name, args) for name in self.sizes.every}
        if self._first is None:
            self._first = now
        self._changed |= {n for n, size in now.items() if size != self._first[n]}
        wanted = frozenset(self.sizes.every) if not self._tried else frozenset(self._changed)
        if not wanted or wanted in self._tried:
            return None
        self._tried.add(wanted)
        sizes = plan(self.gm, {n: size for n, size in now.items() if n not in wanted}, _bound_all(self.options))
        tensors = [a for a in args if isinstance(a, torch.Tensor)]
        why = ""
        if isinstance(sizes, str):
            why = sizes
        else:
            try:
                strides = output_strides(self.gm, sizes)
                compiled = self._compile(self.gm, tensors, sizes)
            except DynamicFallback as e:
                why = str(e).splitlines()[0]
            except CompileError as e:
                why = f"{type(e).__name__}: {e.message}" + (f" ({e.cause.splitlines()[0]})" if e.cause else "")
        if why:
            from ..logs import recompile_log

            if wanted == frozenset(self.sizes.every) and len(wanted) > 1:
                # the sizes that change may still be one program: tried once they change
                self.record.static = why
                recompile_log.info("%s: %s as run-time sizes cannot be one program (%s); the sizes that change "
                                   "are tried alone", self.record.name, ", ".join(sorted(wanted)), why)
            else:
                self._static(why)
            return None
        compiled.sized_strides = strides
        self.record.sizes = sizes.describe()
        self._sized.append((sizes, compiled))
        return compiled

    def _specialize(self, key: tuple, args: list) -> Compiled | None:
        try:
            gm = specialize(self.gm, args) if self.symbolic else self.gm
            tensors = [a for a in args if isinstance(a, torch.Tensor)]
            compiled = self._compile(gm, tensors)
        except CompileError as e:
            self.record.failed = f"{type(e).__name__}: {e.message}"
            self.on_failure(self.record, self.record.failed)
            compiled = None
        self._programs[key] = compiled
        return compiled


def _size_plan(gm: torch.fx.GraphModule, options: Options):
    """The region's sizes.SizePlan, or why it is compiled for each size."""
    from .. import targets
    from .sizes import plan

    target = targets.get(options.target)
    if not (target.dynamic_shapes and target.automatic_dynamic):
        return f"the {options.target} target compiles a region for each size"
    return plan(gm, bound_all=_bound_all(options))


def _bound_all(options: Options) -> bool:
    """Whether every run-time dim of a region must be at most MAX_DYNAMIC_SIZE, not only
    its inputs': on GPU targets, whose kernels declare a run-time dim's buffer extent
    with it (passes/strategies/run_time_sizes.BOUND); the cpu target's buffers are sized
    at run time."""
    return options.target != "cpu"


def _restride(t, stride):
    """t with the strides the graph promises for it (kf returns contiguous tensors).

    A promised stride of 0 on a dim longer than 1 is a broadcast (eager returned an
    ``expand``): its values are equal along that dim, so one slice of t is stored and
    expanded, since no tensor with overlapping elements can be copied into."""
    if stride is None or not isinstance(t, torch.Tensor) or t.stride() == stride or t.numel() <= 1:
        return t
    shape = t.shape
    broadcast = [st == 0 and n > 1 for n, st in zip(shape, stride)]
    if any(broadcast):
        t = t[tuple(slice(0, 1) if b else slice(None) for b in broadcast)]
    out = torch.empty_strided(t.shape, tuple(stride), dtype=t.dtype, device=t.device)
    out.copy_(t)
    return out.expand(shape) if any(broadcast) else out

