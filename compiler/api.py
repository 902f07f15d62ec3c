"""The decorators: ``@kf.jit``, ``@kf.cuda_kernel``, ``@kf.metal_shader``.

A decorated function keeps its Python signature. The first call with a new signature
captures and compiles it; the ready program goes into a dispatch table keyed by the
signature, so later calls go straight from Python to the launcher. A program is also
specialized to what the function reads besides its arguments (guards.py): each table
entry stands behind guards that check, at every call, that those values are unchanged,
and that read the tensors the function reaches (globals, closure cells, module
parameters), which are the program's last inputs. A failed guard sends the call back
here, to walk the function again and compile anew where what it reads has changed.
"""

from __future__ import annotations

import functools
import os
import struct
import time
import warnings
from typing import Any, Callable

import torch

from . import guards, logs, targets, torch_ops
from .errors import CompileError, DynamicFallback, IndexOutOfRange, SignatureError, TargetError
from .compile_records import CompileRecord, Compiles
from .options import Options
from .signature import (MAX_DYNAMIC_SIZE, Signature, bind, check_callable, invoke, lift_scalars, rebuild_args,
                        scalar_dtype, unlift_scalars)

_DEVICE_TARGET = {device: t.name for device, t in targets.BY_DEVICE.items()}
_TARGET_DEVICES = {t.name: (t.torch_device,) for t in targets.TARGETS.values()}
#: The torch.autocast device type whose region a target follows.
_AUTOCAST_DEVICE = {t.name: t.torch_device for t in targets.TARGETS.values()}
_AUTOCAST_PRECISION = {torch.bfloat16: "bf16", torch.float16: "fp16"}
#: One C call: whether any autocast region is active (the common case pays only this).
_any_autocast = torch._C._is_any_autocast_enabled
_is_compiling = torch_ops._is_compiling


def _choose_dispatch():
    """(kf.runtime._launcher.dispatch or None, its MISS, which dispatch in words).

    The compiled extension (runtime/_launcher_*.c) does a call's common case in one C call:
    the checks of ``torch_ops.needs_op`` and of autocast, the dispatch key that
    ``_fast_key`` builds, the table lookup and the call of its entry (a CUDA program's
    prebuilt lane runs there too, see ``CudaProgram.c_lane``). ``KF_DISPATCH=python``
    keeps all of it in Python (to compare; the launch still goes through the launcher
    runtime/cuda.py chose), ``KF_DISPATCH=c`` requires
    the extension; ``auto`` (the default) uses it where it is built."""
    choice = os.environ.get("KF_DISPATCH", "auto").strip().lower() or "auto"
    if choice not in ("auto", "c", "python"):
        raise ValueError(f"KF_DISPATCH={choice!r}: expected 'auto' (the default), 'c' or 'python'")
    if choice == "python":
        return None, None, "Python (KF_DISPATCH=python)"
    try:
        from kf.runtime import _launcher
        dispatch = _launcher.dispatch
    except (ImportError, AttributeError) as e:
        if choice == "c":
            raise ImportError(f"KF_DISPATCH=c, but kf's compiled extension kf.runtime._launcher does not import or "
                              f"has no dispatch ({e}); reinstall kf with a C compiler (pip install -e .)") from e
        return None, None, f"Python (kf.runtime._launcher is not built: {e})"
    _launcher.configure(torch.Tensor, torch_ops._dispatch_modes, torch_ops._grad_enabled, _any_autocast)
    return dispatch, _launcher.MISS, f"C (kf.runtime._launcher, {os.path.basename(_launcher.__file__)})"


logs.configure()  # KF_LOGS

#: the errors a call raises for the user's code or data (errors.py), shown from the call
_USER_ERRORS = (CompileError, SignatureError, IndexOutOfRange)

#: kf.runtime._launcher.dispatch and the value it answers "not the common case" with,
#: or None where calls dispatch in Python.
_c_dispatch, _MISS, DISPATCH = _choose_dispatch()
guards.c_dispatch = _c_dispatch is not None


class KfFunction:
    """A torch function that kf compiles on first call for each new signature."""

    def __init__(self, fn: Callable, options: Options, torch_op: bool = True):
        if isinstance(fn, KfFunction):
            fn = fn.fn
        check_callable(fn)
        functools.update_wrapper(self, fn)
        self.fn = fn
        self.options = options
        self.__kf_function__ = self
        # (signature, fingerprint of what the function reads) -> program
        self._table: dict[tuple[Signature, str], Any] = {}
        # signature -> its program behind the guards of what it reads (guards.Reads.guarded):
        # the calls that bind their signature (keywords, defaults with tensors)
        self._entries: dict[Signature, Any] = {}
        # The fast path: positional calls keyed by what each argument is (a tensor's
        # shape, dtype, device and contiguity; a constant's value), without binding the
        # signature. Only for functions whose defaults hold no tensors, so that the
        # positional tensors are exactly the program's inputs, in order. The key leaves
        # the precision out: a call under torch.autocast goes to the variant of its
        # precision (``variant``), whose tables are its own; the common case pays one C
        # call (``_any_autocast``) for that.
        self._fast: dict[tuple, Any] = {}
        self._fast_ok = not any(isinstance(d, (torch.Tensor, list, tuple))
                                for d in (fn.__defaults__ or ()))
        # What __call__ asks of the C dispatch (kf.runtime._launcher.dispatch): needs_op's
        # checks where calls may go through the torch op, autocast's always; -1: no C
        # dispatch (not built, KF_DISPATCH=python, or no fast path: defaults hold tensors)
        self._c_checks = -1 if _c_dispatch is None or not self._fast_ok else (3 if torch_op else 2)
        # torch.ops.kf.<name>: what torch.compile, torch.export and autograd see (torch_ops.py)
        # (kf's own generated backward functions are called from their forward's op: none)
        self._params = torch_ops.parameters(fn)
        self._torch_op = torch_ops.register(self) if torch_op else None
        # precision -> this function with that precision: what runs under torch.autocast
        self._variants: dict[str, KfFunction] = {}
        # Float arguments are runtime scalars (signature.lift_scalars): one program serves
        # every value. These parameters stay constants instead: the function branches on
        # them, or hands them where torch takes only a Python number (_bound_call).
        self._constant_floats: set[str] = set()
        self._scalar_entries: dict[Signature, int] = {}  # dispatch-table entries made per signature
        self._compiles: list[CompileRecord] = []
        # Run-time sizes (compiler/dynamic.py). (tensor name, dim) of the dims made dynamic
        # by automatic dynamic, the size first seen in each dim, the dims that must stay
        # static (their program could not be one for every size), why each dim became
        # dynamic (for the compile's reason), and whether the recompile limit was reported.
        self._auto: set[tuple[str, int]] = set()
        self._first: dict[tuple[str, int], int] = {}
        self._static: set[tuple[str, int]] = set()
        # dynamic=True or given dims that could not be one program as a whole: from then on
        # the dims whose sizes change are tried, as under automatic dynamic
        self._watching = False
        # the largest run-time size this function's GPU programs take (a flattened [n, 4]
        # is 4n, which their kernels are planned for up to MAX_DYNAMIC_SIZE): larger sizes
        # are compiled static
        self._largest = MAX_DYNAMIC_SIZE
        #: signature -> its program with run-time sizes that holds under guards on them
        #: (CompiledProgram.failed_size_guard): a bound call checks them before its entry
        self._size_guarded: dict = {}
        self._ones: dict = {}  # (signature, its dims at size 1) -> whether its program serves them
        self._grown: set[tuple[str, int]] = set()  # dims met at a size of 2 or more
        self._why_dynamic: list[str] = []
        # the static dims a trace specialized (DynamicFallback.dims): often tied by the
        # trace to a dim of another argument that was static then (a mask passed for the
        # first time); tried as run-time sizes again once another dim becomes dynamic, at
        # most MAX_STATIC_RETRIES times
        self._trace_static: set[tuple[str, int]] = set()
        self._static_retries = 0
        self._profile_read = False
        # innermost dims kept run-time because they changed with another tensor's outer
        # dim, size for size (a mask's keys): in this process or, from the disk profile,
        # an earlier one, whose dynamic program a fresh process's first call then finds
        self._lengths: set[tuple[str, int]] = set()
        # signatures of run-time sizes that could not be one program (kf-tile refused a
        # kernel): a later call that generalizes to one of them compiles its own sizes
        # without trying it again
        self._failed_dynamic: set = set()
        self._limit_warned = False
        self._static_logged = False

    @property
    def compiles(self) -> Compiles:
        """Each program this function compiled (or loaded from the disk cache: ``cached``)
        in this process, in order, with its signature, target, seconds and why it was
        needed; as a number, how many (``f.compiles == 1``). Under autograd the function's
        calls run the forward and backward functions kf derives for it
        (compiler/autograd.py), whose programs are theirs: ``kf.autograd.backward_of``."""
        return Compiles(self._compiles)

    def __repr__(self) -> str:
        return f"<kf function {self.fn.__name__} target={self.options.target}>"

    def __get__(self, obj, objtype=None):
        return self if obj is None else functools.partial(self, obj)

    def with_options(self, **changes) -> "KfFunction":
        """The same function compiled with other options, e.g. ``f.with_options(target="vulkan")``."""
        return KfFunction(self.fn, self.options.with_(**changes))

    def resolve_target(self, sig: Signature) -> str:
        devices = sig.devices()
        target = self.options.target
        if len(devices) > 1:
            raise TargetError(f"{self.fn.__name__}: tensors are on several devices ({', '.join(sorted(devices))}); "
                              f"move them to one device")
        if not devices and target != "auto":
            return target  # nothing to follow: a function of no tensors (torch.zeros(n)) runs on its target
        device = next(iter(devices), "cpu")
        if target == "auto":
            if device not in _DEVICE_TARGET:
                raise TargetError(f"{self.fn.__name__}: kf has no target for tensors on '{device}'")
            return _DEVICE_TARGET[device]
        if device not in _TARGET_DEVICES[target]:
            hint = {"metal": "Metal runs on Apple GPUs: pass tensors on 'mps', or use "
                             f"{self.fn.__name__}.with_options(target='vulkan') or target='cpu' elsewhere",
                    "cuda": "pass tensors on 'cuda' (tensor.cuda()), or use "
                            f"{self.fn.__name__}.with_options(target='auto') to follow the tensors",
                    "vulkan": "the Vulkan target takes CPU tensors and runs them on the Vulkan device",
                    "cpu": "move the tensors to the CPU, or use target='auto'"}[target]
            raise TargetError(f"{self.fn.__name__} is compiled for {target}, but its tensors are on '{device}'",
                              cause=hint)
        return target

    def _interpret(self) -> bool:
        return self.options.interpret or os.environ.get("KF_INTERPRET", "") not in ("", "0")

    def specialize(self, sig: Signature, tensors: list) -> tuple[Any, guards.Reads]:
        """(the ready program for a signature and for what the function reads now, those
        reads): compiled on first use. The program takes the call's tensors followed by
        the reached tensors it uses (``reads.tensors[j] for j in program.reached``)."""
        return self._compiled(sig, tensors)[1:]

    def _compiled(self, sig: Signature, tensors: list) -> tuple[Signature, Any, guards.Reads]:
        """(the signature whose program the call runs, that program, the reads):
        ``specialize``'s, with the signature it compiled, which is narrower than sig where
        dims of sig must take static sizes. A dispatch entry is kept under that signature
        only: under sig it would serve the program to calls of other sizes."""
        reads = guards.walk(self.fn)
        dims = sig.dynamic_dims()
        if dims & self._static or (self._watching and not dims <= self._auto):
            # made before some of its dims were found to need static sizes, or before
            # dynamic=True fell back to the dims that change (the same call bound again,
            # by autograd's custom op): the signature they compile now
            sig = self._generalized(sig.sized(tensors), observe=False)
        if sig in self._failed_dynamic:
            sig = self._since_last(sig, tensors)
        program = self._table.get((sig, reads.fingerprint))
        if program is None:
            sig, program = self._serving(sig, tensors, reads)
        changed = program is not None and any(t._version != v for t, v in program.baked)
        if changed:
            program = None  # a tensor it holds as a constant changed in place
        if program is None:
            from . import driver

            reason = "first call"
            if self._table:
                reason = (f"{self.fn.__name__}: a tensor it holds as a constant changed in place" if changed else
                          logs.recompile_reason(self.fn.__name__, sig, reads.parts,
                                                [(s, getattr(p, "read_parts", {})) for (s, _), p in self._table.items()]))
                logs.recompile_log.info("%s", reason)
            if self._why_dynamic:
                reason = f"{reason}; {'; '.join(self._why_dynamic)}"
                self._why_dynamic = []
            target = self.resolve_target(sig)
            options = self.options.with_(target=target, interpret=self._interpret())
            self._check_limit(sig)
            start = time.perf_counter()
            try:
                program = driver.compile_function(self.fn, sig, tensors, options, reads)
            except (DynamicFallback, CompileError) as e:
                # a reached tensor on another device fails the capture where two devices
                # meet in an op; the error that names the tensor is the one to give
                if "device" in str(e):
                    self._moves(reads, range(len(reads.tensors)), target, tensors)
                if not sig.is_dynamic:
                    raise
                tried = sig
                program, sig = self._static_fallback(sig, tensors, options, reads, e)
                if not sig.is_dynamic:
                    self._failed_dynamic.add(tried)
                reason = f"{reason}; " + (f"compiled with {sig.describe()}" if sig.is_dynamic else
                                          "compiled for static sizes")
            self._compiles.append(CompileRecord(sig.describe(), target, time.perf_counter() - start, reason,
                                                getattr(program, "from_cache", False)))
            program.moves = self._moves(reads, program.reached, target, tensors)
            program.baked = [(t, t._version) for t in reads.baked]
            program.read_parts = reads.parts
            if reads.baked:
                warnings.warn(f"kf: {self.fn.__name__} reads {len(reads.baked)} tensor(s) ("
                              f"{', '.join(f'{t.dtype} {list(t.shape)}' for t in reads.baked)}) through a way kf "
                              f"cannot follow (a name computed at run time, state inside a library object): they "
                              f"are constants of its program, which is compiled again when one changes in place, "
                              f"but not when another tensor takes its place; pass them as arguments",
                              RuntimeWarning, stacklevel=4)
            self._table[(sig, reads.fingerprint)] = program
        self._check_largest(sig, tensors, program)
        self._check_size_guards(sig, tensors, program)
        return sig, program, reads

    def _serving(self, sig: Signature, tensors: list, reads) -> tuple[Signature, Any]:
        """(signature, program) of a program already compiled with run-time sizes that
        serves the call (Signature.admits, its size guards held), else (sig, None): a call
        at sizes an earlier program takes (a length met before the heads changed, when
        both have changed since) runs it instead of compiling its own."""
        for (known, fingerprint), program in self._table.items():
            if (fingerprint == reads.fingerprint and known.is_dynamic and known != sig
                    and known.admits(sig, tensors, self._largest)
                    and not (hasattr(program, "failed_size_guard") and program.failed_size_guard(tensors))):
                return known, program
        return sig, None

    def _since_last(self, sig: Signature, tensors: list) -> Signature:
        """For a call whose signature of run-time sizes failed to be one program: the
        signature with run-time sizes only where the call differs from the program compiled
        last (a grouped-query call after calls of other heads: its length alone), where that
        is fewer dims and not failed too; else the call's own sizes."""
        static = sig.sized(tensors)
        last = next(reversed(self._table), None)
        if last is None or [t.shape for t in static.tensor_sigs()] == [t.shape for t in last[0].tensor_sigs()]:
            return static
        before = dict(zip(last[0].tensor_names(), [t.shape for t in last[0].tensor_sigs()]))
        now = dict(zip(static.tensor_names(), [t.shape for t in static.tensor_sigs()]))
        changed = {(n, d) for n, d in sig.dynamic_dims() if n in before and len(before[n]) == len(now[n])
                   and before[n][d] != now[n][d]}
        if not changed or changed == set(sig.dynamic_dims()):
            return static
        target = targets.get(self.resolve_target(sig))
        narrower = static.generalize(changed, target.divisibility, largest=self._largest)
        return narrower if narrower.is_dynamic and narrower not in self._failed_dynamic else static

    def _static_fallback(self, sig: Signature, tensors: list, options: Options, reads, e: Exception):
        """(the program for the call, its signature) where a signature with run-time sizes
        cannot be one program. Where the failure names the dims whose sizes the trace
        needed (DynamicFallback.dims), those stay static for good and the others are tried
        again as run-time sizes. Otherwise, for several dims asked for together
        (dynamic=True, or given dims), those whose sizes change are tried from now on
        (_watch_changes), as under automatic dynamic, where the dims of the disk profile
        may not all change in this process; else every dynamic dim stays static for
        good. Each step is a
        kf.recompiles line saying why."""
        static = sig.sized(tensors)
        for _ in range(MAX_SPECIALIZE_STEPS):
            named = e.dims & sig.dynamic_dims() if isinstance(e, DynamicFallback) else frozenset()
            if not named:
                break
            self._static |= named
            self._trace_static |= named
            shown = ", ".join(f"{n} dim {d}" for n, d in sorted(named))
            logs.recompile_log.info("%s: %s compiled for static sizes: %s", self.fn.__name__, shown,
                                    str(e).splitlines()[0])
            narrower = self._generalized(static, observe=False)
            if not narrower.is_dynamic:
                sig = narrower
                break
            try:
                return self._program_for(narrower, tensors, options, reads), narrower
            except (DynamicFallback, CompileError) as again:
                sig, e = narrower, again
        why = str(e).splitlines()[0] if isinstance(e, DynamicFallback) else \
            f"{type(e).__name__}: {e.message}" + (f" ({e.cause.splitlines()[0]})" if e.cause else "")
        dims = sig.dynamic_dims()
        shown = ", ".join(f"{n} dim {d}" for n, d in sorted(dims))
        if len(dims) > 1 and self.options.dynamic is not False:
            logs.recompile_log.info("%s: %s not one program together: %s; from now on those whose sizes change "
                                    "are run-time sizes", self.fn.__name__, shown, why)
            found = self._watch_changes(static, dims, tensors, options, reads)
            if found is not None:
                return found
        elif dims:
            self._static |= dims
            logs.recompile_log.info("%s: %s compiled for static sizes: %s", self.fn.__name__, shown, why)
        return self._program_for(static, tensors, options, reads), static

    def _specialized(self, sig: Signature, tensors: list):
        """(the signature the call compiles, its program, the reads): ``specialize``, bound
        again where the call's sizes pass what the program of sig takes (_Rebind)."""
        while True:
            try:
                return self._compiled(sig, tensors)
            except _Rebind as again:
                sig = sig.sized(tensors) if again.static else self._generalized(sig.sized(tensors), observe=False)

    def _check_largest(self, sig: Signature, tensors: list, program) -> None:
        """_Rebind where the call's run-time sizes pass what the program's kernels are
        planned for (its largest_run_time_size): the function keeps that bound, and the
        call binds again, those dims static."""
        largest = program.largest_run_time_size() if sig.is_dynamic and hasattr(
            program, "largest_run_time_size") else None
        if largest is None:
            return
        self._largest = min(self._largest, largest)
        sizes = [t.shape[d] for t, s in zip(tensors, sig.tensor_sigs()) for d, n in enumerate(s.shape) if n < 0]
        if any(n > largest for n in sizes):
            logs.recompile_log.info("%s: run-time sizes up to %d (its kernels' bound on a size derived from them); "
                                    "larger ones compile static", self.fn.__name__, largest)
            raise _Rebind()

    def _check_size_guards(self, sig: Signature, tensors: list, program) -> None:
        """_Rebind to the call's own sizes where they fail a guard of the program's trace
        (``x[:, :-1]`` holds where the length is not 2: ``Ne(s0 - 1, 1)``); the run-time
        sizes stay for every other call."""
        failed = program.failed_size_guard(tensors) if sig.is_dynamic and hasattr(
            program, "failed_size_guard") else None
        if failed is None:
            if sig.is_dynamic and hasattr(program, "checks_sizes") and program.checks_sizes():
                self._size_guarded[sig] = program
            return
        split = program.split_symbols(tensors) if hasattr(program, "split_symbols") else []
        names = sig.tensor_names()
        held = {(names[i], d) for i, d in split if i < len(names)} - self._static
        if held:
            # dims the trace took as one size because they were equal where it was traced
            # (an attention's query and key heads): they stay static from now on, the
            # other run-time sizes stay run-time (grouped-query heads, then any length)
            self._static |= held
            logs.recompile_log.info("%s: sizes %s fail the guard %s of the program with run-time sizes: %s "
                                    "static from now on", self.fn.__name__, [list(t.shape) for t in tensors], failed,
                                    ", ".join(f"'{n}' dim {d}" for n, d in sorted(held)))
            raise _Rebind()
        logs.recompile_log.info("%s: sizes %s fail the guard %s of the program with run-time sizes: compiled for "
                                "them", self.fn.__name__, [list(t.shape) for t in tensors], failed)
        raise _Rebind(static=True)

    def _program_for(self, sig: Signature, tensors: list, options: Options, reads):
        """The program of sig already in the table, else compiled (its errors raised)."""
        from . import driver

        program = self._table.get((sig, reads.fingerprint))
        return program if program is not None else driver.compile_function(self.fn, sig, tensors, options, reads)

    def _watch_changes(self, static: Signature, dims: frozenset, tensors: list, options: Options, reads):
        """dynamic=True (or the dims given) is not one program as a whole: from now on the
        dims whose sizes change are the run-time ones, counted from the first program's
        sizes (from this call's where every one of them has changed since), as under
        automatic dynamic (without the disk profile, whose dims failed together here).
        (program, signature) for this call where the dims that have changed already make
        one, else None (the caller compiles static sizes)."""
        self._watching = True
        self._profile_read = True
        for known in [k[0] for k in self._table] + [static]:
            for n, shape in zip(known.tensor_names(), [t.shape for t in known.tensor_sigs()]):
                for d, size in enumerate(shape):
                    if size >= 0:
                        self._first.setdefault((n, d), size)
        now = {(n, d): size for n, shape in zip(static.tensor_names(), [t.shape for t in static.tensor_sigs()])
               for d, size in enumerate(shape)}
        self._auto = {key for key in dims if self._first[key] != now[key]}
        changed = self._generalized(static, observe=False)
        if not changed.is_dynamic:
            return None
        if changed.dynamic_dims() == dims:
            # every one of them has changed since the first sizes (a long-lived function
            # called at many shapes: heads and lengths): counted from this call's sizes,
            # those that change from now on are tried
            for key in dims:
                self._first[key] = now[key]
            self._auto -= dims
            return None
        try:
            return self._program_for(changed, tensors, options, reads), changed
        except (DynamicFallback, CompileError) as e:
            self._static |= changed.dynamic_dims()
            shown = ", ".join(f"{n} dim {d}" for n, d in sorted(changed.dynamic_dims()))
            logs.recompile_log.info("%s: %s compiled for static sizes: %s", self.fn.__name__, shown,
                                    str(e).splitlines()[0])
            return None

    def _check_limit(self, sig: Signature) -> None:
        """Past RECOMPILE_LIMIT programs, a warning (once; on the kf.recompiles logger and in
        ``warnings``) naming the argument and dim, or the value, that keeps changing."""
        if len(self._compiles) < RECOMPILE_LIMIT or self._limit_warned:
            return
        self._limit_warned = True
        what = _changing([s for s, _ in self._table] + [sig])
        msg = (f"kf: {self.fn.__name__} has compiled {len(self._compiles)} programs (the limit is "
               f"{RECOMPILE_LIMIT}); {what} keeps changing"
               + ("" if self.options.dynamic is not False and "dim" in what else
                  "; pass it as a tensor, or mark it dynamic (kf.jit(dynamic=...))" if "dim" in what else
                  "; a value the function branches on or sizes with is compiled for each value"))
        logs.recompile_log.warning("%s", msg)
        warnings.warn(msg, RuntimeWarning, stacklevel=5)

    def _generalized(self, sig: Signature, observe: bool = True, tensors: list | None = None) -> Signature:
        """sig with the dims that take run-time sizes marked (Signature.generalize): those
        of ``options.dynamic``, or under automatic dynamic those whose size has changed
        since the first call, less those that must stay static (and on targets whose
        kernels' code depends on it, each tensor's innermost dim, unless ``dynamic={...}``
        names it or it has changed with another tensor's outer dim, size for size: a mask's
        keys); sig itself on targets
        whose programs take no run-time sizes, and under automatic dynamic on those that
        take them only where asked (Target.automatic_dynamic). ``observe=False``
        (kf.inspect) records no size and reads no profile."""
        mode = self.options.dynamic
        if mode is False:
            return sig
        try:
            target = targets.get(self.resolve_target(sig))
        except CompileError:
            if observe or self.options.target == "auto":
                return sig  # the call's error comes from specialize
            # kf.inspect compiles for the decorator's target whatever device the example
            # tensors are on (a metal_shader's MSL read on Linux)
            target = targets.get(self.options.target)
        if not target.dynamic_shapes or self._interpret() or (mode is None and not target.automatic_dynamic):
            if observe:
                self._log_static_target(sig, target)
            return sig
        names = sig.tensor_names()
        shapes = [s.shape for s in sig.tensor_sigs()]
        scalars = {p.name for p in sig.params if p.kind == "scalar"}
        if mode is True and not self._watching:
            wanted = {(n, d) for n, shape in zip(names, shapes) if n not in scalars for d in range(len(shape))}
        elif isinstance(mode, tuple) and not self._watching:
            given = dict(mode)
            wanted = {(n, d) for n, shape in zip(names, shapes)
                      for d in given.get(n, given.get(n.split(".")[0], ())) if d < len(shape)}
        elif not observe:
            wanted = self._auto
        else:
            if not self._profile_read:
                self._profile_read = True
                from . import cache

                self._auto |= cache.dynamic_profile(self.fn)
                self._lengths |= cache.profile_lengths(self.fn)
            grew = False
            for n, shape in zip(names, shapes):
                for d, size in enumerate(shape):
                    first = self._first.setdefault((n, d), size)
                    if first != size and (n, d) not in self._auto and (n, d) not in self._static:
                        self._auto.add((n, d))
                        grew = True
                        self._why_dynamic.append(f"'{n}' dim {d} changed size ({first} -> {size}): "
                                                 f"compiled with it dynamic")
                        logs.recompile_log.info("%s: '%s' dim %d changed size (%d -> %d): it is dynamic from now on",
                                                self.fn.__name__, n, d, first, size)
                        from . import cache

                        cache.add_dynamic_profile(self.fn, self._auto)
            if grew:
                self._retry_trace_static()
            wanted = self._auto
        if isinstance(mode, tuple) and self._watching:  # of the dims given, those that change
            given = dict(mode)
            wanted = {(n, d) for n, d in wanted if d in given.get(n, given.get(n.split(".")[0], ()))}
        # only the dims this call's tensors have: an argument may be a number in one call
        # and a tensor in another, or of another rank
        rank = dict(zip(names, map(len, shapes)))
        wanted = {(n, d) for n, d in wanted if d < rank.get(n, 0)}
        if target.static_innermost and not isinstance(mode, tuple):  # (dims named are taken as
            # asked; else all but the one dim of a 1-d tensor, and of integers: targets,
            # positions, token ids, which no kernel reduces or vectorizes along)
            integers = {n for n, t in zip(names, sig.tensor_sigs()) if t.elem[0] in "iu"}
            size = {(n, d): shape[d] for n, shape in zip(names, shapes) for d in range(len(shape))}

            def change(key):
                """(first size, this call's) of a dim that has changed; None for one that has not."""
                first = self._first.get(key)
                return (first, size[key]) if first is not None and first != size[key] else None

            # an innermost dim that has changed with an outer dim of another tensor, size for
            # size, is that length (a mask's or a bias's keys beside k's): it stays run-time
            lengths = {change(k) for k in wanted if k[1] != rank[k[0]] - 1} - {None}
            kept = {(n, d) for n, d in wanted if d == rank[n] - 1 and change((n, d)) in lengths}
            if observe and not kept <= self._lengths:
                from . import cache

                self._lengths |= kept
                cache.add_dynamic_profile(self.fn, self._auto, self._lengths)
            wanted = {(n, d) for n, d in wanted if d != rank[n] - 1 or rank[n] == 1 or n in integers
                      or (n, d) in kept or (n, d) in self._lengths}
        wanted = wanted - self._static
        general = sig.generalize(wanted, target.divisibility, largest=self._largest)
        if observe:
            self._grown |= {(n, d) for n, shape in zip(names, shapes) for d, size in enumerate(shape) if size >= 2}
        # a size 1 of a dim met at other sizes (a sequence of one token), never of a dim
        # that was always 1 (a batch of one): that one stays static
        ones = frozenset((n, d) for n, d in wanted & self._grown if shapes[names.index(n)][d] == 1)
        if ones and observe and tensors is not None:
            one = sig.generalize(wanted, target.divisibility, ones, largest=self._largest)
            if one != general and self._serves_one(one, sig, tensors, ones, names):
                return one
        return general

    def _retry_trace_static(self) -> None:
        """A dim has become dynamic: the dims a trace specialized before are tried as
        run-time sizes again (they may have been tied to it: ``q``'s length to a mask's
        while the mask's was static), at most MAX_STATIC_RETRIES times a function."""
        if not self._trace_static or self._static_retries >= MAX_STATIC_RETRIES:
            return
        self._static_retries += 1
        self._static -= self._trace_static
        shown = ", ".join(f"'{n}' dim {d}" for n, d in sorted(self._trace_static))
        logs.recompile_log.info("%s: %s tried as run-time sizes again (a trace specialized them while other dims "
                                "were static)", self.fn.__name__, shown)
        self._trace_static = set()

    def _serves_one(self, one: Signature, sig: Signature, tensors: list, ones: frozenset, names: list) -> bool:
        """Whether the program of ``one`` (a signature whose run-time dims take a call's
        size 1) serves the call (dynamic.serves_size_one), decided once a signature and
        set of dims; where it does not, a kf.recompiles line says why, and the size 1
        compiles for itself."""
        key = (one, ones)
        if key not in self._ones:
            from .dynamic import serves_size_one

            at = [(names.index(n), d) for n, d in sorted(ones)]
            why = serves_size_one(self.fn, one, tensors, at, sig)
            self._ones[key] = why is None
            if why is not None:
                shown = ", ".join(f"'{n}' dim {d}" for n, d in sorted(ones))
                logs.recompile_log.info("%s: %s of size 1 compiled apart: the trace at size 1 differs (%s)",
                                        self.fn.__name__, shown, why)
        return self._ones[key]

    def _log_static_target(self, sig: Signature, target) -> None:
        """Once per function, where a dim would take run-time sizes (asked for, or a
        second size met) on a target whose programs take none: a kf.recompiles line saying
        that each size compiles, and why."""
        if self._static_logged:
            return
        changed = [(n, d) for n, s in zip(sig.tensor_names(), sig.tensor_sigs()) for d, size in enumerate(s.shape)
                   if self._first.setdefault((n, d), size) != size]
        if self.options.dynamic is None and not changed:
            return
        self._static_logged = True
        what = f"'{changed[0][0]}' dim {changed[0][1]} changed size; " if changed else ""
        why = "kf.jit(interpret=True) runs the captured IR" if self._interpret() else \
            f"the {target.name} target's kernels take no run-time sizes yet" if not target.dynamic_shapes else \
            (f"the {target.name} target takes run-time sizes only where asked for (dynamic=True, or the dims in "
             f"dynamic={{...}}): its kernels with run-time sizes run slower than its static ones")
        logs.recompile_log.info("%s: %seach size is compiled: %s", self.fn.__name__, what, why)

    def _moves(self, reads: guards.Reads, used: list, target: str, tensors: list) -> list[tuple[int, Any]]:
        """(input position, device) of the reached tensors a call copies to the target's
        device: 0-d CPU tensors, which eager torch lets meet tensors of any device
        (``scale = torch.tensor(2.0)`` read by a CUDA function). Any other tensor on
        another device than the target's is an error, as it is in eager."""
        moves = []
        device = tensors[0].device if tensors else torch.device(_TARGET_DEVICES[target][0])
        for slot, j in enumerate(used):
            t = reads.tensors[j]
            if t.device.type in _TARGET_DEVICES[target]:
                continue
            if t.device.type == "cpu" and t.dim() == 0:
                moves.append((len(tensors) + slot, device))
                continue
            raise TargetError(f"{self.fn.__name__} reads the tensor '{reads.labels[j]}' on {t.device}, but runs "
                              f"on {target}", cause=f"move it to the device of the function's arguments "
                              f"({_TARGET_DEVICES[target][0]}), or pass it as an argument")
        return moves

    def autocast_precision(self, device_type: str) -> str | None:
        """The precision an active ``torch.autocast`` region asks of a call on device_type
        ("bf16", "fp16"), or None: none is active there, or the precision option is not
        ``auto`` (an explicit precision wins). Dynamo folds the autocast queries to
        constants, so this traces without a graph break."""
        if self.options.precision != "auto" or not _any_autocast():
            return None
        target = self.options.target
        device = _AUTOCAST_DEVICE[target] if target != "auto" else device_type
        if not torch.is_autocast_enabled(device):
            return None
        return _AUTOCAST_PRECISION.get(torch.get_autocast_dtype(device))

    def variant(self, precision: str) -> "KfFunction":
        """This function with ``precision`` (made once): its own dispatch tables and cache
        entries, and no torch op of its own (calls through this function's op reach it
        by the precision written in the op's structure argument, see torch_ops.py)."""
        v = self._variants.get(precision)
        if v is None:
            v = KfFunction(self.fn, self.options.with_(precision=precision), torch_op=False)
            v._trees, v._backwards, v._random, v._trainings, v._training_kinds = {}, {}, {}, {}, {}
            self._variants[precision] = v
        return v

    def __call__(self, *args, **kwargs):
        # The common case in one C call (_choose_dispatch); MISS for anything else, which
        # the Python below decides from the start. _is_compiling() comes first in Python:
        # Dynamo folds it to True and so never traces into the C call.
        if self._c_checks >= 0 and not kwargs and not _is_compiling():
            result = _c_dispatch(self._fast, args, self._c_checks)
            if result is not _MISS:
                return result
        try:
            if self._torch_op is not None and torch_ops.needs_op(args, kwargs):  # tracing, torch.compile, autograd
                return torch_ops.call(self, args, kwargs)
            if _any_autocast():
                # the effective precision is part of the specialization: an autocast call runs
                # the variant of that precision, whose tables are apart from these
                precision = self.autocast_precision(_device_type(args, kwargs))
                if precision is not None:
                    return self.variant(precision)._kernel_call(args, kwargs)
            return self._kernel_call(args, kwargs)
        except _USER_ERRORS as e:
            # kf's errors name the user's line in their message; the traceback ends here,
            # above kf's own frames (KF_DEBUG=1 keeps them)
            if os.environ.get("KF_DEBUG", "") not in ("", "0"):
                raise
            raise e.with_traceback(None) from None

    def _kernel_call(self, args: tuple, kwargs: dict, drawn: list | None = None):
        """Run the compiled program for this call (the op's real implementation);
        ``drawn`` (a list) receives the random state the program draws, if it draws one."""
        if drawn is not None:
            program, tensors = self._bound_call(args, kwargs)
            return program(tensors, drawn)
        if not kwargs and self._fast_ok:
            if _c_dispatch is not None:  # key, lookup and entry in C, no checks (MISS: as below)
                result = _c_dispatch(self._fast, args, 0)
                if result is not _MISS:
                    return result
            key, tensors = _fast_key(args)
            if key is not None:
                entry = self._fast.get(key)
                if entry is not None:
                    result = entry(tensors)
                    if result is not guards.MISS:
                        return result
                sig, tensors = self._bind(args, kwargs)
                if _has_scalars(sig):
                    return self._scalar_call(key, sig, tensors, args, kwargs)
                sig, program, reads = self._specialized(sig, tensors)
                used = program.reached
                tensors += [reads.tensors[j] for j in used]
                self._keep_fast(key, reads.guarded(_matched(program, tensors), used, program.baked))
                self._entries[sig] = reads.guarded(_moving(program, program.moves), used, program.baked)
                return _moving(program, program.moves)(tensors)
        program, tensors = self._bound_call(args, kwargs)
        return program(tensors)

    def _keep_fast(self, key: tuple, entry) -> None:
        """A dispatch-table entry; past FAST_ENTRIES (a program with run-time sizes has one
        for each shape it meets, holding its lane and size slots) the oldest goes, and
        its shape takes the bound path again when it comes back."""
        if len(self._fast) >= FAST_ENTRIES:
            self._fast.pop(next(iter(self._fast)))
        self._fast[key] = entry

    def _scalar_call(self, key: tuple, sig: Signature, tensors: list, args: tuple, kwargs: dict):
        """A positional call whose floats are runtime scalars: run through the bound path
        (one program for every value); the first ``SCALAR_ENTRIES`` values also get a
        dispatch-table entry that holds their 0-dim tensors, so a float that repeats (a
        fixed scale, a default eps) takes the fast path and one that changes every call
        (a learning rate) adds no entries."""
        call, full = self._bound_call(args, kwargs)
        if sig in self._entries and self._scalar_entries.get(sig, 0) < SCALAR_ENTRIES:
            compiled, program, reads = self._specialized(sig, tensors)
            if compiled != sig:  # sizes its program does not take: no entry for them
                return call(full)
            self._scalar_entries[sig] = self._scalar_entries.get(sig, 0) + 1
            slots = [(i, t) for i, (t, p) in enumerate(zip(tensors, _tensor_params(sig))) if p.kind == "scalar"]
            base = _matched(program, tensors + [reads.tensors[j] for j in program.reached])

            def with_scalars(ts: list, base=base, slots=slots):
                ts = list(ts)
                for i, t in slots:
                    ts.insert(i, t)
                return base(ts)

            self._keep_fast(key, reads.guarded(with_scalars, program.reached, program.baked))
        return call(full)

    def _bind(self, args: tuple, kwargs: dict, observe: bool = True) -> tuple[Signature, list]:
        """The call's signature and tensors, its float arguments runtime scalars (those
        not kept constants, where the tensors' dtypes let them be: scalar_dtype)."""
        sig, tensors = bind(self.fn, args, kwargs)
        names = {p.name for p in sig.params if p.kind == "const" and type(p.value) is float}
        names -= self._constant_floats
        if names:
            dtype = scalar_dtype(tensors)
            if dtype is not None:
                sig, tensors = lift_scalars(sig, tensors, names, dtype)
        return self._generalized(sig, observe, tensors), tensors

    def _bound_call(self, args: tuple, kwargs: dict) -> tuple[Any, list]:
        """As ``_bound`` for a call. Where its floats are runtime scalars but the function
        does not compute with them as with numbers -- it branches on one (a capture
        error), or a result's dtype or shape would differ (checked on fake tensors
        before the first compile) -- those parameters become constants for good."""
        sig, tensors = self._bind(args, kwargs)
        if not _has_scalars(sig):
            return self._bound(sig, tensors)
        try:
            if sig not in self._entries:
                why = _scalars_change_results(self.fn, sig, tensors)
                if why:
                    raise _KeepConstant(why)
            return self._bound(sig, tensors)
        except (CompileError, _KeepConstant) as e:
            names = sorted(p.name for p in sig.params if p.kind == "scalar")
            # the floats torch needs as numbers, where the fake runs can tell them apart
            # (``alpha=1 - b1`` keeps b1 a constant, not the learning rate beside it)
            kept = _floats_needed_as_numbers(self.fn, args, kwargs, names) if isinstance(e, _KeepConstant) \
                else names
            self._constant_floats.update(kept)
            why = e.args[0] if isinstance(e, _KeepConstant) else f"{type(e).__name__}: {e.message}"
            logs.recompile_log.info("%s: float argument(s) %s compiled as constants: %s", self.fn.__name__,
                                    ", ".join(kept), why.splitlines()[0])
            if len(kept) < len(names):
                return self._bound_call(args, kwargs)  # the others stay runtime scalars
            sig, tensors = bind(self.fn, args, kwargs)
            return self._bound(self._generalized(sig, tensors=tensors), tensors)

    def _bound(self, sig: Signature, tensors: list) -> tuple[Any, list]:
        """(the program of a bound call, its tensors followed by the reached ones it reads):
        its signature's entry where the entry's guards hold, else specialized anew."""
        entry = self._entries.get(sig)
        guarded = self._size_guarded.get(sig)
        if guarded is not None and guarded.failed_size_guard(tensors) is not None:
            entry = None  # the entry's program does not hold for these sizes: _specialized
        if entry is not None:
            if not guards.is_guarded(entry):
                return entry, tensors
            extra = entry.check()
            if extra is not None:
                return entry.call, tensors + extra
        sig, program, reads = self._specialized(sig, tensors)
        call = _moving(program, program.moves)
        self._entries[sig] = reads.guarded(call, program.reached, program.baked)
        return call, tensors + [reads.tensors[j] for j in program.reached]

    def inspect(self, *args, **kwargs):
        """Every stage's text for this call signature (see kf.inspect)."""
        from . import inspection

        # the signature a call compiles: floats read at run time where they can be, the
        # dims this function has made dynamic so far (nothing recorded by looking)
        sig, tensors = self._bind(args, kwargs, observe=False)
        if _has_scalars(sig) and _scalars_change_results(self.fn, sig, tensors):
            sig, tensors = bind(self.fn, args, kwargs)
            sig = self._generalized(sig, observe=False)
        # Inspection compiles for the decorator's target whatever device the example
        # tensors are on: a metal_shader's MSL can be read on Linux.
        target = self.options.target
        device = next(iter(sig.devices()), "cpu")
        if target == "auto":
            target = _DEVICE_TARGET.get(device, "cpu")
        options = self.options.with_(target=target)
        precision = self.autocast_precision(device)
        if precision is not None:
            options = options.with_(precision=precision)
        if sig.is_dynamic:
            try:
                return inspection.inspect_function(self.fn, sig, tensors, options)
            except (DynamicFallback, CompileError):
                sig = sig.sized(tensors)  # a call compiles these sizes too (_static_fallback)
        return inspection.inspect_function(self.fn, sig, tensors, options)


class _Rebind(Exception):
    """A call's run-time sizes pass what its program takes: bind it again (api), with
    ``static`` for the call's own sizes."""

    def __init__(self, static: bool = False):
        super().__init__()
        self.static = static


#: programs of one function past which a warning names what keeps changing
RECOMPILE_LIMIT = 8
#: How many times a failed run-time-size compile that names the dims its trace needed is
#: tried again with those dims static, before every dim is.
MAX_SPECIALIZE_STEPS = 3
#: how often a function's trace-specialized dims are tried as run-time sizes again
#: (KfFunction._retry_trace_static)
MAX_STATIC_RETRIES = 2


def _changing(sigs: list[Signature]) -> str:
    """What takes the most distinct values over the signatures of one function's compiles:
    "argument 'x' dim 1 (sizes 7, 9, 11, ...)" or "argument 'k' (values 1, 2, 3, ...)"."""
    seen: dict[str, list] = {}
    for sig in sigs:
        for name, spec in zip(sig.tensor_names(), sig.tensor_sigs()):
            for d, size in enumerate(spec.shape):
                seen.setdefault(f"argument '{name}' dim {d}", []).append("?" if size < 0 else size)
            seen.setdefault(f"argument '{name}' (dtype, layout or rank)", []).append(
                (spec.elem, spec.contiguous, len(spec.shape)))
        for p in sig.params:
            if p.kind == "const":
                seen.setdefault(f"argument '{p.name}'", []).append(p.value)
    best, values = max(seen.items(), key=lambda kv: len({repr(v) for v in kv[1]}), default=("an argument", []))
    distinct = list(dict.fromkeys(repr(v) for v in values))
    kind = "sizes" if " dim " in best else "values"
    return f"{best} ({kind} {', '.join(distinct[:6])}{', ...' if len(distinct) > 6 else ''})"


class _KeepConstant(Exception):
    """A float argument that must stay a constant of the program."""


#: values of a signature's runtime floats that get a dispatch-table entry (_scalar_call)
SCALAR_ENTRIES = 8
#: dispatch-table entries a function keeps (KfFunction._keep_fast)
FAST_ENTRIES = 1024


def _tensor_params(sig: Signature) -> list:
    """The parameter of each of a call's flat tensors, in order."""
    out = []
    for p in sig.params:
        if p.kind in ("tensor", "scalar"):
            out.append(p)
        elif p.kind == "tensors":
            out.extend([p] * len(p.value))
    return out


def _has_scalars(sig: Signature) -> bool:
    return any(p.kind == "scalar" for p in sig.params)


def _floats_needed_as_numbers(fn: Callable, args: tuple, kwargs: dict, names: list[str]) -> list[str]:
    """Of the float parameters ``names``, those whose value the function needs as a number
    (_scalars_change_results with that float alone a 0-dim tensor); all of them where no
    one alone is found (the reason lies in their combination)."""
    sig, tensors = bind(fn, args, kwargs)
    dtype = scalar_dtype(tensors)
    if dtype is None or len(names) < 2:
        return list(names)
    needed = [n for n in names if _scalars_change_results(fn, *lift_scalars(sig, tensors, {n}, dtype))]
    return needed or list(names)


def _scalars_change_results(fn: Callable, sig: Signature, tensors: list) -> str:
    """Why fn's results would differ with its floats as 0-dim tensors ("" where they do
    not): run both ways on fake tensors (shapes and dtypes only, no data), compared
    result by result."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.utils._pytree import tree_flatten

    mode = FakeTensorMode(allow_non_fake_inputs=True)
    fakes = [mode.from_tensor(t) for t in tensors]
    try:
        with mode, warnings.catch_warnings():
            warnings.simplefilter("ignore")
            with_scalars = tree_flatten(invoke(fn, rebuild_args(sig, fakes)))[0]
            with_floats = tree_flatten(invoke(fn, rebuild_args(*unlift_scalars(sig, fakes))))[0]
    except Exception as e:  # it branches on a value, or torch wants a number there
        return f"{type(e).__name__}: {str(e).strip().splitlines()[0] if str(e).strip() else ''}"
    if len(with_scalars) != len(with_floats):
        return "the results differ in number"
    for a, b in zip(with_scalars, with_floats):
        if isinstance(a, torch.Tensor) != isinstance(b, torch.Tensor):
            return "a result is a tensor one way and not the other"
        if isinstance(a, torch.Tensor) and (a.dtype != b.dtype or a.shape != b.shape):
            return f"a result is {a.dtype} {list(a.shape)} instead of {b.dtype} {list(b.shape)}"
    return ""


def _matched(program, tensors: list) -> Callable:
    """What a dispatch-table entry calls for a program and a call's tensors (reached ones
    included): the key matched shapes, dtypes and devices, and the guards check the
    reached tensors', so the launcher need not again (``matched_call``)."""
    matched = getattr(program, "matched_call", None)
    call = matched(all(t.is_contiguous() for t in tensors), tuple(tuple(t.shape) for t in tensors),
                   tensors[0].device if tensors else None) if matched else program
    return _moving(call, program.moves)


def _moving(call: Callable, moves: list) -> Callable:
    """call, with the reached tensors at ``moves`` (position, device) copied to the
    device first (KfFunction._moves); call itself where there are none."""
    if not moves:
        return call

    def run(tensors: list, *rest):
        for i, device in moves:
            tensors[i] = tensors[i].to(device)
        return call(tensors, *rest)

    return run


def _device_type(args: tuple, kwargs: dict) -> str:
    """The device type of a call's first tensor ("cpu" when it has none)."""
    for a in (*args, *kwargs.values()):
        if isinstance(a, torch.Tensor):
            return a.device.type
        if isinstance(a, (list, tuple)) and a and isinstance(a[0], torch.Tensor):
            return a[0].device.type
    return "cpu"


def _fast_key(args: tuple) -> tuple[tuple | None, list]:
    """(key, flat tensors) of positional arguments, or (None, []) when an argument is
    neither a tensor, a list of tensors nor a hashable constant. A constant's key is its
    type and value, type-exact (2, 2.0 and True differ) and bit-exact (0.0 and -0.0)."""
    key, tensors = [], []
    Tensor = torch.Tensor
    for a in args:
        if isinstance(a, Tensor):
            if a.layout != torch.strided:  # a sparse tensor has no is_contiguous(): bind() refuses it
                return None, []
            key.append((a.shape, a.dtype, a.device, a.is_contiguous()))
            tensors.append(a)
        elif isinstance(a, (list, tuple)) and a and isinstance(a[0], Tensor):
            if not all(isinstance(t, Tensor) and t.layout == torch.strided for t in a):
                return None, []
            key.append((type(a), tuple((t.shape, t.dtype, t.device, t.is_contiguous()) for t in a)))
            tensors.extend(a)
        elif isinstance(a, float):
            # by its bits where == is not bit equality (0.0 and -0.0; NaN, which equals no NaN)
            key.append((type(a), struct.pack("=d", a) if a == 0.0 or a != a else a))
        elif a is None or isinstance(a, (bool, int, str)):
            key.append((type(a), a))
        else:
            return None, []
    return tuple(key), tensors


def _decorator(default: Options):
    def decorate(fn: Callable | None = None, /, **options: Any):
        opts = default.with_(**options) if options else default
        if fn is None:
            return lambda f: KfFunction(f, opts)
        return KfFunction(fn, opts)

    return decorate


jit = _decorator(Options())
jit.__doc__ = """Compile a torch function with kf: ``@kf.jit`` or ``@kf.jit(target="vulkan", interpret=False)``."""
cuda_kernel = _decorator(Options(target="cuda"))
cuda_kernel.__doc__ = """``@kf.jit(target="cuda")``: compile to PTX and run on NVIDIA GPUs."""
metal_shader = _decorator(Options(target="metal"))
metal_shader.__doc__ = """``@kf.jit(target="metal")``: compile to MSL and run on Apple GPUs."""


def inspect(fn: Callable, *args, **kwargs):
    """Capture fn for these arguments; the result (an ``inspection.Inspection``) gives the
    text of every stage."""
    kfn = getattr(fn, "__kf_function__", None) or KfFunction(fn, Options())
    return kfn.inspect(*args, **kwargs)
