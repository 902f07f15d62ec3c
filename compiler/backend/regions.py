"""One region of a Dynamo/AOTAutograd graph as a kf program.

The region is an FX GraphModule of ATen nodes (a partition of the graph, its boundary
tensors its placeholders and outputs). kf converts it directly -- capture's post-trace
path, ``capture._convert`` on the FX graph, no Python re-traced -- and walks the target's
stages after capture (kf-fuse makes its kernels), caching the program on disk by the
region's graph text, the signature, the options and the target.

Shapes. kf's programs have static shapes today, so a region is compiled per concrete
signature of its inputs (shapes, dtypes, strides, the values of int inputs). Where the
graph carries Dynamo's symbolic sizes, the first call with new sizes specializes the
region: it is traced again with ``make_fx`` on those sizes (stack traces kept) and that
concrete graph is converted. A new sequence length so compiles a new kf program, never
runs an old one; Dynamo itself does not recompile.

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

from ..errors import CompileError, SourceLoc, debug
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


def _symbolic(gm: torch.fx.GraphModule) -> bool:
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


def graph_text(gm: torch.fx.GraphModule) -> str:
    """What the region computes, for the cache key: each node with its op, arguments,
    result types and strides, and the user line it is located at."""
    lines = []
    for n in gm.graph.nodes:
        v = n.meta.get("val")
        vals = v if isinstance(v, (list, tuple)) else [v]
        types_ = [(str(t.dtype), tuple(t.shape), tuple(t.stride())) if isinstance(t, torch.Tensor) else repr(t)
                  for t in vals]
        loc = user_loc(n)
        lines.append(f"{n.op} {n.name} {n.target} {n.args!r} {n.kwargs!r} {types_} {loc}")
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


@dataclass
class Region:
    """A region's record: what it holds, for the report, and its compiled programs."""

    name: str
    graph: str  # "forward", "backward", "inference"
    ops: list[str]
    lines: list[str]
    kernels: list[str] = field(default_factory=list)
    compiles: int = 0
    calls: int = 0
    seconds: float = 0.0
    failed: str = ""  # why kf could not compile it at run time (it then runs the fallback)


def _signature(tensors: list):
    from ..signature import Param, Signature, TensorSig

    return Signature(tuple(Param(f"in{i}", "tensor", TensorSig(tuple(t.shape), _elem(t.dtype), t.device.type, True))
                           for i, t in enumerate(tensors)))


def _elem(dtype) -> str:
    from ..dtypes import kf_elem

    return kf_elem(dtype)


def compile_concrete(gm: torch.fx.GraphModule, tensors: list, options: Options, name: str) -> Compiled:
    """The kf program of a region whose nodes have concrete sizes, for these input
    tensors (real or fake: only their shapes, dtypes and devices are read). It runs
    outside the fake tensor mode AOTAutograd compiles in: kf's handlers compute constants
    (an arange's values) with real tensors."""
    from torch._subclasses.fake_tensor import unset_fake_temporarily

    with unset_fake_temporarily():
        return _compile_concrete(gm, tensors, options, name)


def _compile_concrete(gm: torch.fx.GraphModule, tensors: list, options: Options, name: str) -> Compiled:
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
    sig = _signature(tensors)
    arch = target.arch(options)
    h = hashlib.sha256()
    for part in (cache.compiler_fingerprint(), "fx-region", name, graph_text(gm), repr(sig), options.stable_hash(),
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
            b.cap = _convert(fn, sig, tensors, gm, {}, None, "fx", {}, (), (), locate=locate)
        except CompileError as e:
            # the node whose conversion failed: the partitioner leaves it out next time
            e.kf_node = last[0].name if last[0] is not None else None
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
            except CompileError:
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


def _kernel_names(meta: dict) -> list[str]:
    from kf.runtime.abi import ProgramABI

    try:
        abi = ProgramABI.from_json(meta["abi"])
        return [k.entry for k in abi.kernels] or [meta.get("name", "")]
    except Exception:
        return [meta.get("name", "")]


class RegionRunner:
    """Calls a region: its kf program for the inputs' concrete signature (compiled on
    first use; specialized from the symbolic graph where sizes are symbolic), or the
    fallback where kf cannot compile it."""

    def __init__(self, gm: torch.fx.GraphModule, options: Options, record: Region, fallback: Callable,
                 on_failure: Callable[[Region, str], None]):
        self.gm = gm
        self.options = options
        self.record = record
        self.fallback = fallback
        self.on_failure = on_failure
        self.symbolic = _symbolic(gm)
        self._programs: dict[tuple, Compiled | None] = {}

    def precompile(self, example_inputs: list) -> None:
        """Compile now for the example inputs (the static case: their sizes are the only
        ones the graph runs with). Raises kf's CompileError where kf cannot."""
        tensors = [t for t in example_inputs if isinstance(t, torch.Tensor)]
        key = self._key(example_inputs)
        self._programs[key] = self._compile(self.gm, tensors)

    def _compile(self, gm, tensors) -> Compiled:
        compiled = compile_concrete(gm, tensors, self.options, self.record.name)
        self.record.kernels = compiled.kernels
        self.record.compiles += 1
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
            compiled = self._specialize(key, list(args))
        if compiled is None:
            return self.fallback(*args)
        self.record.calls += 1
        tensors = [a.contiguous() for a in args if isinstance(a, torch.Tensor)]
        result = compiled.program(tensors)
        if isinstance(result, (list, tuple)):
            return tuple(_restride(r, s) for r, s in zip(result, compiled.strides))
        return _restride(result, compiled.strides[0])

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

