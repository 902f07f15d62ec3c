"""What a call runs: a compiled program loaded from the cache, or the captured kf IR
interpreted with torch.

``CompiledProgram`` wraps the target's launcher (``kf.runtime.programs.load``) with what
the launcher does not know: the result structure, the random state a program draws,
the arguments it writes to, and the timed path while ``kf.profile`` or
``torch.profiler`` records. ``InterpretedProgram`` is the same call over
``Interpreter`` (``kf.jit(interpret=True)``). Neither imports MLIR on its own: a cache
hit in a new process reaches its launch without it.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Callable

from . import mutation
from .results import unflatten


class InterpretedProgram:
    """Runs the captured kf IR with torch, op by op (see interpreter.py)."""

    def __init__(self, cap, target: str = "cpu"):
        from .interpreter import Interpreter

        self.captured = cap
        self.reached = cap.reached
        self.baked: list = []  # (tensor, version) of constants the walk did not find (api.py)
        self.moves: list = []  # (input, device) of reached 0-d CPU tensors copied at each call (api.py)
        self._interp = Interpreter(cap.module, cap.name, cap.fallbacks)
        self._target = target

    def __call__(self, tensors: list, drawn: list | None = None):
        mutations = self.captured.mutations
        if mutations:
            mutation.check(mutations, self.captured.name, tensors)
        if self.captured.random_input is not None:
            from .random_state import with_state

            tensors = with_state(tensors, self._target, drawn)
        if _PROFILE is not None:
            outs = _timed_interpret(self, tensors)
        else:
            outs = self._interp.run(*tensors)
        if mutations:
            outs = mutation.copy_back(mutations, tensors, outs)
        return unflatten(self.captured.output_tree, outs)


#: input shapes whose size check a program remembers
SIZE_CHECKS_KEPT = 64


class CompiledProgram:
    """A program loaded from the cache: the target's launcher plus the result structure."""

    def __init__(self, launcher: Callable, tree: Any, meta: dict, directory: Path, target: str = "cpu"):
        self._launch = launcher
        self.from_cache = False  # loaded from the disk cache rather than compiled (driver.py)
        self._tree = tree
        self.meta = meta
        self.directory = directory
        #: the reached tensors (guards.Reads.tensors) the program takes after the call's own
        self.reached = list(meta.get("reached", []))
        self.baked: list = []  # (tensor, version) of constants the walk did not find (api.py)
        self.moves: list = []  # (input, device) of reached 0-d CPU tensors copied at each call (api.py)
        self._unchecked = getattr(launcher, "unchecked", None)
        # a program that draws random numbers takes a fresh state after the user's tensors
        self._random = meta.get("random_state") is not None
        self._target = target
        #: arguments the function writes to: checked before and copied back after each launch
        self._mutations = tuple(mutation.Mutation.from_json(m) for m in meta.get("mutations", []))
        self._returns_inputs = [tuple(p) for p in meta.get("returns_inputs", [])]
        #: failed_size_guard's answers for the last SIZE_CHECKS_KEPT input shapes (a loop
        #: meets its lengths again)
        self._size_checks: dict = {}
        self._same_results = [tuple(p) for p in meta.get("same_results", [])]
        self._result_devices = [tuple(p) for p in meta.get("result_devices", [])]

    def failed_size_guard(self, tensors: list) -> str | None:
        """The first guard on the sizes (Captured.size_guards) that a call's tensors fail,
        or None: a program with run-time sizes holds for the sizes its trace held for. Dims
        its trace found equal (one symbol: an attention's query and key heads where they
        were equal) that differ in this call fail too: that call is not this program's
        (grouped-query heads; the function holds those dims static from then on,
        ``split_symbols``)."""
        guards = self.meta.get("size_guards") or ()
        abi = getattr(self._launch, "abi", None)
        if abi is None:
            return guards[0] if guards else None  # no signature to bind the sizes with: not served here
        if abi.is_static or not (guards or self._shared_symbols(abi)):
            return None
        from kf.runtime.abi import bind_sizes, eval_guard

        shapes = tuple(tuple(getattr(t, "shape", ())) for t in tensors[:len(abi.inputs)])
        memo = self._size_checks
        if shapes in memo:
            return memo[shapes]
        sizes = bind_sizes(abi.inputs, shapes, 1)
        if isinstance(sizes, str):
            failed = sizes  # the shapes do not bind to the program's symbols
        else:
            failed = next((g for g in guards if not eval_guard(g, sizes)), None)
        if len(memo) >= SIZE_CHECKS_KEPT:
            memo.pop(next(iter(memo)))
        memo[shapes] = failed
        return failed

    def split_symbols(self, tensors: list) -> list[tuple[int, int]]:
        """(input, dim) of each run-time dim whose symbol another input dim shares but
        whose size in this call differs from it: the relation the trace assumed from equal
        sizes (an attention's query and key heads), which this call does not keep."""
        abi = getattr(self._launch, "abi", None)
        if abi is None or abi.is_static:
            return []
        from kf.runtime.abi import DYN

        by_symbol: dict[str, list[tuple[int, int, int]]] = {}
        for i, (a, t) in enumerate(zip(abi.inputs, tensors)):
            shape = tuple(getattr(t, "shape", ()))
            if len(shape) != len(a.shape):
                return []
            for d, want in enumerate(a.shape):
                if want == DYN and a.dims[d].isidentifier():
                    by_symbol.setdefault(a.dims[d], []).append((i, d, shape[d]))
        return [(i, d) for dims in by_symbol.values() if len({n for _, _, n in dims}) > 1 for i, d, _ in dims]

    def checks_sizes(self) -> bool:
        """Whether a call of this program with run-time sizes must check its sizes first
        (failed_size_guard): guards from its trace, or one symbol naming several input dims."""
        if self.meta.get("size_guards"):
            return True
        abi = getattr(self._launch, "abi", None)
        return abi is not None and not abi.is_static and self._shared_symbols(abi)

    def _shared_symbols(self, abi) -> bool:
        """Whether one symbol names more than one input dim."""
        shared = getattr(self, "_shared", None)
        if shared is None:
            names = [n for a in abi.inputs for n in a.dims if n.isidentifier()]
            shared = self._shared = len(names) != len(set(names))
        return shared

    def largest_run_time_size(self) -> int | None:
        """The largest size the symbols of a GPU program with run-time sizes may take
        (ProgramABI.largest_run_time_size); None for the cpu target, whose loops take any."""
        abi = getattr(self._launch, "abi", None)
        if abi is None or self._target == "cpu" or abi.is_static:
            return None
        return abi.largest_run_time_size

    def __call__(self, tensors: list, drawn: list | None = None):
        """Run the program; ``drawn`` (a list) receives the random state the call drew,
        if it drew one."""
        if self._mutations:
            mutation.check(self._mutations, self.meta["name"], tensors)
        if self._random:
            from .random_state import with_state

            tensors = with_state(tensors, self._target, drawn)
        if _PROFILE is not None or _torch_profiling():
            # kf.profile is recording, or torch.profiler is: time the launch and name it.
            outs = _timed_launch(self, tensors)
        else:
            outs = list(self._launch(*tensors))
        if self._mutations:
            outs = mutation.copy_back(self._mutations, tensors, outs)
        return unflatten(self._tree, self._with_inputs(outs, tensors))

    def _with_inputs(self, outs: list, tensors: list) -> list:
        """The outputs, with those that eager returns as an input tensor itself (``return x``,
        ``x.contiguous()`` of a contiguous x) replaced by that tensor, one that eager
        returns twice (``return y, y``) the same tensor twice, and each on the device eager
        makes it on (``result_devices``), as eager gives them."""
        outs = list(outs)
        for j, i in self._returns_inputs:
            outs[j] = tensors[i]
        for j, k in self._same_results:
            outs[j] = outs[k]
        for j, device in self._result_devices:  # where eager makes it (a function of no tensors)
            outs[j] = outs[j].to(device)
        return outs

    def call_matched(self, tensors: list):
        """As a call, for tensors that kf's dispatch key has matched to the program's
        signature (shapes, dtypes, device, contiguity): the launcher skips re-checking."""
        if (self._random or self._mutations or _PROFILE is not None or _torch_profiling()
                or self._unchecked is None):
            return self(tensors)
        return unflatten(self._tree, self._with_inputs(list(self._unchecked(*tensors)), tensors))

    def matched_call(self, contiguous: bool, shapes: tuple | None = None, device=None) -> Callable:
        """What kf's dispatch table keeps for a matched call signature: the launcher's
        fast lane (``CudaProgram.fast_lane``) where the program and the tensors allow it
        -- contiguous tensors, no index error flag to read, no random state to draw --
        else ``call_matched``. Profiling (kf's or torch's) still takes the general path,
        checked on every call. ``shapes`` (of the signature's tensors) and ``device``
        (theirs) give a program with run-time sizes a lane for that signature."""
        make = getattr(self._launch, "fast_lane", None)
        lane = make(shapes, device) if make is not None and contiguous and not self._random and not self._mutations \
            and not self._returns_inputs and not self._same_results and not self._result_devices else None
        if lane is None:
            return self.call_matched
        tree = self._tree
        first = tree[1] if tree[0] == "tensor" else None

        def call(tensors: list):
            if _PROFILE is not None or _torch_profiling():
                return self(tensors)
            outs = lane(tensors)
            return outs[first] if first is not None else unflatten(tree, outs)

        call.program = self
        # the same in C (kf.runtime._launcher.Lane) where the launcher is compiled: it
        # reads the same profiling switches and hands what it does not do itself to call
        make_c = getattr(self._launch, "c_lane", None)
        if make_c is not None:
            import torch

            c_lane = make_c(call, -1 if first is None else first, tree, unflatten, globals(), "_PROFILE",
                            torch._C._autograd._profiler_enabled, self, shapes, device)
            if c_lane is not None:
                return c_lane
        return call


#: The recording kf.profile (profiler.py opens and closes it), or None. Read on every
#: launch, so it is a module global (one dict lookup) rather than anything that imports
#: the profiler.
_PROFILE = None


def _torch_profiling() -> bool:
    global _torch_profiling
    import torch

    _torch_profiling = torch._C._autograd._profiler_enabled  # C++: a flag read, no Python frames
    return _torch_profiling()


def load(entry, n_reached: int) -> CompiledProgram:
    """The program of a cache entry (``cache.Entry``) whose metadata names ``n_reached``
    or fewer reached tensors; raises for an entry the runtime cannot load."""
    from kf.runtime.abi import ProgramABI

    from kf.runtime import programs

    meta = entry.meta
    if any(not isinstance(j, int) or not 0 <= j < n_reached for j in meta.get("reached", [])):
        raise ValueError(f"the entry reads reached tensors {meta.get('reached')} of {n_reached}")
    abi = ProgramABI.from_json(meta["abi"])
    tree = json.loads(meta["output_tree"])
    launcher = programs.load(abi, str(entry.directory), meta)
    return CompiledProgram(launcher, _tuple_tree(tree), meta, entry.directory, abi.target)


def _tuple_tree(tree):
    kind, payload = tree
    if kind == "tensor":
        return (kind, payload)
    return (kind, [_tuple_tree(t) for t in payload])


# ----------------------------------------------------------------------------- timed calls


def _abi(program: CompiledProgram):
    abi = getattr(program, "_kf_abi", None)
    if abi is None:
        from kf.runtime.abi import ProgramABI

        abi = program._kf_abi = ProgramABI.from_json(program.meta["abi"])
    return abi


def _timed_launch(program: CompiledProgram, tensors: list) -> list:
    """Run a CompiledProgram under the open kf.profile and/or torch.profiler: named in
    torch's trace (and as an NVTX range where the target has them), timed by the
    target's own clock (``Target.timing``: CUDA events, Vulkan timestamps, else wall
    time) and recorded in the profile."""
    import torch

    from . import targets

    prof = _PROFILE
    abi = _abi(program)
    target = targets.get(abi.target)
    name = program.meta["name"]
    times = None
    with torch.profiler.record_function(name):
        nvtx = prof is not None and prof.nvtx and target.nvtx
        if nvtx:
            torch.cuda.nvtx.range_push(name)
        try:
            if prof is not None and target.timing == "events":
                prof._cuda_reference()
            t0 = time.perf_counter()
            if prof is None or not target.timing:
                outs = program._launch(*tensors)
            else:
                times = []
                outs = program._launch(*tensors, **{target.timing: times})
            t1 = time.perf_counter()
        finally:
            if nvtx:
                torch.cuda.nvtx.range_pop()
    if prof is not None:
        prof._record(program, abi, t0, t1, times if target.timing == "timings" else None,
                     times if target.timing == "events" else None)
    return list(outs)


def _timed_interpret(program: InterpretedProgram, tensors: list) -> list:
    """Run an InterpretedProgram under the open kf.profile: one "kernel", wall time."""
    import torch

    name = program.captured.name
    with torch.profiler.record_function(name):
        t0 = time.perf_counter()
        outs = program._interp.run(*tensors)
        t1 = time.perf_counter()
    _PROFILE._record_interpreted(program, tensors, outs, t0, t1)
    return outs
