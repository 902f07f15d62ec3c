"""The pipeline driver: from a call signature to a ready program.

The target of ``options.target`` (targets/) gives an ordered table of named stages;
the driver walks it over one ``targets.Build``::

    cpu:     capture -> precision -> linalg -> llvm -> so -> package
    cuda:    capture -> precision -> kernels -> schedule -> ptx -> constants -> package
    vulkan:  ...                                          -> spirv -> ...
    metal:   ...                                          -> msl -> ...

and turns what escapes a stage into one CompileError at the user's function (a
reproducer saved, kf's frames hidden unless KF_DEBUG=1). A compiled program is stored
in the disk cache (cache.py) and loaded from there by the runtime alone (programs.py),
so a later process with the same key never imports MLIR.
"""

from __future__ import annotations

import os
import time
from typing import Callable

from . import cache, logs, targets
from .errors import CompileError, DynamicFallback, debug, user_facing
from .options import Options
from .programs import InterpretedProgram, load
from .signature import Signature


def _first_line(e: BaseException) -> str:
    text = str(e).strip()
    return text.splitlines()[0][:300] if text else ""


def compile_function(fn: Callable, sig: Signature, tensors: list, options: Options, reads=None):
    """A callable that takes the flat tensor arguments, then the reached tensors it reads
    (``program.reached``: indices into ``reads.tensors``; reads: guards.walk(fn), walked
    here if not given), and returns the function's results.

    A cached entry that fails to load (the cache checked its digest; this is the runtime's
    turn: a .so that does not open, a module the driver refuses) is corrupt: reported,
    removed and compiled again. An entry removed by another process between its store
    and its load is stored again from the artifacts in hand."""
    if reads is None:
        from .guards import walk

        reads = walk(fn)
    try:
        target = targets.get(options.target)
        if options.interpret:
            from .capture import capture_signature
            from .stages import StageLog, dump_dir_for

            cap = capture_signature(fn, sig, tensors, reads.tensors, reads.labels)
            reads.baked = cap.unsourced
            target.apply_precision(cap, options, StageLog(cap.name, dump_dir_for(options.dump_ir)))
            return InterpretedProgram(cap, options.target)
        arch = target.arch(options)
        key = cache.key(fn, sig, options, target.device_key(options), reads)
        name = getattr(fn, "__name__", type(fn).__name__)
        skip = _skip_cache(options, reads)
        if skip:
            logs.cache_log.info("%s%s: not loaded from the disk cache: %s", name, sig.describe(), skip)
        entry = cache.load(key) if not skip else None
        if entry is not None:
            try:
                program = load(entry, len(reads.tensors))
                logs.cache_log.info("%s%s: loaded from the disk cache (%s)", name, sig.describe(), entry.directory)
                program.from_cache = True
                return program
            except Exception as e:
                if _unavailable(e):
                    raise
                if not _removed(entry):  # else removed meanwhile: compile it again
                    cache.discard(entry.directory, key, f"it does not load: {type(e).__name__}: {_first_line(e)}")
        start = time.perf_counter()
        meta, artifacts = build(fn, sig, tensors, options, arch, reads=reads)
        logs.compile_log.info("compiled %s%s for %s%s in %.2f s", name, sig.describe(), options.target,
                              f" ({arch})" if arch else "", time.perf_counter() - start)
    except CompileError as e:
        if debug():
            raise
        raise user_facing(e) from None
    for attempt in range(3):
        # removed by another process between the store and the load (a cache cleared
        # meanwhile, even file by file): stored again, the last time in this process's
        # own folder, which no other process removes
        entry = cache.store(key, meta, artifacts, private=attempt == 2)
        try:
            return load(entry, len(reads.tensors))
        except Exception:
            if attempt == 2 or not _removed(entry):
                raise


def _removed(entry) -> bool:
    """Whether any file of a cache entry (its metadata or an artifact) is gone: another
    process removed it, wholly or part way, after this one found or stored it."""
    names = ["program.json", *entry.meta.get("artifacts", {})]
    return any(not (entry.directory / name).exists() for name in names)


def _skip_cache(options: Options, reads) -> str:
    """Why a compile must not load its program from the disk cache, or "": KF_ALWAYS_COMPILE
    asks for a fresh compile (the result is still stored), KF_DUMP_IR needs the stages
    run to write them, and reads that cannot be named in another process have no
    entry."""
    if os.environ.get("KF_ALWAYS_COMPILE", "") not in ("", "0"):
        return "KF_ALWAYS_COMPILE is set"
    if options.dump_ir or os.environ.get("KF_DUMP_IR", ""):
        return "the IR is dumped (KF_DUMP_IR or dump_ir=)"
    if not reads.persistent:
        return "it reads values that cannot be named in another process (" + ", ".join(reads.unstable[:3]) + ")"
    return ""


def _unavailable(e: BaseException) -> bool:
    """An error that says the target cannot run here (no Vulkan, no Metal), not that the
    entry is damaged."""
    from kf.runtime.metal import MetalUnavailable
    from kf.runtime.vulkan import VulkanUnavailable

    return isinstance(e, (MetalUnavailable, VulkanUnavailable))


def build(fn: Callable, sig: Signature, tensors: list, options: Options, arch: str,
          log=None, reads=None) -> tuple[dict, dict[str, bytes]]:
    """Compile one specialization by walking its target's stages: (metadata, artifacts)
    for the cache. ``arch``: the target's (``Target.arch``); ``log``: a StageLog to
    record into (kf.inspect's), else one is made at capture; ``reads``: guards.walk(fn),
    walked here if not given; the reached tensors the function uses are the program's
    last inputs (``meta["reached"]``)."""
    if reads is None:
        from .guards import walk

        reads = walk(fn)
    target = targets.get(options.target)
    b = targets.Build(target, fn, sig, tensors, options, arch, reads, log)
    for stage in target.stages().values():
        try:
            stage(b)
        except (CompileError, DynamicFallback):
            raise
        except Exception as e:
            if debug():
                raise
            raise _internal_error(b, e) from None
    return b.meta, b.artifacts


def _internal_error(b: targets.Build, e: Exception) -> CompileError:
    """A bug in kf, not in the user's code: still a CompileError at their function, with
    the IR it happened on saved for the report (there is none before capture)."""
    why = f"{type(e).__name__}: {_first_line(e)} (KF_DEBUG=1 shows kf's traceback)"
    if b.cap is None:
        return CompileError(f"{b.code.co_name}: internal compiler error during capture", b.where, stage="capture",
                            cause=why)
    from .stages import save_reproducer

    path = save_reproducer(b.log, b.cap.module.operation.get_asm(enable_debug_info=True))
    return CompileError(f"{b.cap.name}: internal compiler error", b.log.default_loc, stage="compile", cause=why,
                        reproducer=path)
