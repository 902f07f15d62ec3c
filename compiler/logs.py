"""kf's log records, on the standard ``logging`` tree under ``kf``.

- ``kf.compile``: each compile (function, signature, target, seconds), and the stages of a
  compile that runs longer than ``PROGRESS_AFTER`` seconds as they finish;
- ``kf.cache``: disk cache hits, and loads skipped (``KF_ALWAYS_COMPILE``, ``KF_DUMP_IR``,
  a function whose reads cannot be named in another process);
- ``kf.recompiles``: why a function compiles again (which argument, which property, or
  which value it reads besides its arguments changed).

Records are at INFO (the details at DEBUG); the loggers are silent until something asks
for them: a handler of the application's, pytest's caplog, or ``KF_LOGS``, which works
as ``TORCH_LOGS`` does: ``KF_LOGS=compile,cache,recompiles`` (or ``all``) prints those
records on stderr, ``+compile`` at DEBUG.
"""

from __future__ import annotations

import logging
import os
import warnings

from .signature import Signature

compile_log = logging.getLogger("kf.compile")
cache_log = logging.getLogger("kf.cache")
recompile_log = logging.getLogger("kf.recompiles")
#: torch.compile(backend="kf"): each graph's kf regions and fallbacks (backend/report.py)
backend_log = logging.getLogger("kf.backend")

#: the KF_LOGS names and their loggers
CHANNELS = {"compile": compile_log, "cache": cache_log, "recompiles": recompile_log, "backend": backend_log}

#: a compile that runs longer than this many seconds logs its stages as they finish
PROGRESS_AFTER = 2.0

_handler: logging.Handler | None = None


def configure(spec: str | None = None) -> None:
    """Set the ``kf`` loggers from ``KF_LOGS`` (or ``spec``): each named channel at INFO
    (``+name``: DEBUG), printed on stderr by one handler on the ``kf`` logger. An unknown
    name is a warning that lists the known ones (a typo must not stop ``import kf``)."""
    global _handler
    spec = os.environ.get("KF_LOGS", "") if spec is None else spec
    names = [n.strip() for n in spec.split(",") if n.strip()]
    if not names:
        return
    for name in names:
        debug = name.startswith("+")
        name = name.lstrip("+")
        chosen = list(CHANNELS.values()) if name == "all" else [CHANNELS.get(name)]
        if chosen == [None]:
            warnings.warn(f"KF_LOGS: unknown log '{name}'; known: {', '.join(CHANNELS)}, all", stacklevel=2)
            continue
        for logger in chosen:
            logger.setLevel(logging.DEBUG if debug else logging.INFO)
    if _handler is None:
        _handler = logging.StreamHandler()
        _handler.setFormatter(logging.Formatter("[%(name)s] %(message)s"))
        logging.getLogger("kf").addHandler(_handler)


def recompile_reason(name: str, sig: Signature, parts: dict[str, str], earlier: list[tuple[Signature, dict]]) -> str:
    """Why ``name`` compiles again for ``sig`` and what it reads now (``parts``: a digest per
    value it reads, guards.Reads.parts), given the signatures and reads it was compiled
    for before: the arguments that differ from the closest earlier signature, property by
    property, or the values read besides the arguments that changed."""
    same = [p for s, p in earlier if s == sig]
    if same:
        before = same[-1]
        changed = sorted(k for k in parts.keys() | before.keys() if parts.get(k) != before.get(k))
        shown = ", ".join(_label(k) for k in changed[:4]) + (f" and {len(changed) - 4} more" if len(changed) > 4 else "")
        return f"{name}: what it reads besides its arguments changed: {shown or 'a value it reads'}"
    closest = min((s for s, _ in earlier), key=lambda s: len(_differences(s, sig)))
    return f"{name}: " + "; ".join(_differences(closest, sig))


def _label(key: str) -> str:
    """A read's label as the user writes it: ``G`` for ``f:G``, ``act`` for ``f:<act>``."""
    tail = key.split(":", 1)[-1]
    return tail.replace("<", "").replace(">", "")


def _differences(old: Signature, new: Signature) -> list[str]:
    """What differs between two signatures of one function, argument by argument."""
    olds = {p.name: p for p in old.params}
    out = []
    for p in new.params:
        q = olds.get(p.name)
        if q is None or q == p:
            continue
        if q.kind != p.kind:
            out.append(f"argument '{p.name}' was {_kind(q)}, now {_kind(p)}")
        elif p.kind == "tensor":
            out.extend(f"argument '{p.name}': {what}" for what in _tensor_changes(q.value, p.value))
        elif p.kind == "tensors":
            if len(q.value) != len(p.value):
                out.append(f"argument '{p.name}': {len(q.value)} tensors, now {len(p.value)}")
            for i, (a, b) in enumerate(zip(q.value, p.value)):
                out.extend(f"argument '{p.name}[{i}]': {what}" for what in _tensor_changes(a, b))
        else:
            out.append(f"argument '{p.name}' was {q.value!r} ({type(q.value).__name__}), now {p.value!r} "
                       f"({type(p.value).__name__})")
    return out or ["a new signature"]


def _kind(p) -> str:
    return {"tensor": "a tensor", "tensors": "a list of tensors", "none": "None",
            "scalar": "a float read at run time"}.get(p.kind, f"the constant {p.value!r}")


def _tensor_changes(a, b) -> list[str]:
    out = []
    if a.shape != b.shape:
        from .signature import _dims

        out.append(f"shape {_dims(a.shape)} -> {_dims(b.shape)}")
    if a.elem != b.elem:
        out.append(f"dtype {a.elem} -> {b.elem}")
    if a.device != b.device:
        out.append(f"device {a.device} -> {b.device}")
    if a.contiguous != b.contiguous:
        out.append("contiguous -> strided" if a.contiguous else "strided -> contiguous")
    return out
