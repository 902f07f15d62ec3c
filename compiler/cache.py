"""The on-disk JIT cache: compiled programs keyed by everything that changes the code.

Layout: ``$KF_CACHE_DIR`` (default ``~/.cache/kf``) / ``<key[:2]>/<key>/`` holding
``program.json`` (the ProgramABI, the result structure and a sha256 of every artifact)
and the artifacts themselves (``.so``, ``.ptx``, ``.spv``, ``.msl``, ``constants.bin``).
JSON and binary files only, no pickle. An entry is written into a temporary directory
and renamed into place, so a concurrent reader sees all of it or nothing; a corrupt
entry (bad JSON, a missing or changed artifact) is reported once, removed and
recompiled.

The key hashes kf's own source files and version, the MLIR bindings' version, the
function's source, closure and referenced global constants, the call signature, the
options and the target (with its architecture). Computing it imports neither MLIR nor
the compiler.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import os
import shutil
import tempfile
import warnings
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable

from .options import Options
from .signature import Signature

FORMAT = 1  # bump when the entry layout changes


def cache_dir() -> Path:
    return Path(os.environ.get("KF_CACHE_DIR") or Path.home() / ".cache" / "kf")


@lru_cache(maxsize=None)
def compiler_fingerprint() -> str:
    """A hash of kf's source files and the versions of the toolchain it drives."""
    h = hashlib.sha256(f"kf-cache-format-{FORMAT}".encode())
    root = Path(__file__).resolve().parent.parent
    for folder in ("compiler", "dialects", "passes", "runtime"):
        for path in sorted((root / folder).rglob("*.py")):
            h.update(str(path.relative_to(root)).encode())
            h.update(path.read_bytes())
    for dist in ("xtc-mlir-python-bindings", "torch", "torch-mlir"):
        try:
            h.update(f"{dist}={importlib.metadata.version(dist)}".encode())
        except importlib.metadata.PackageNotFoundError:
            h.update(f"{dist}=none".encode())
    return h.hexdigest()


def _code_hash(code, h) -> None:
    h.update(code.co_code)
    h.update(repr(code.co_names).encode())
    for c in code.co_consts:
        if hasattr(c, "co_code"):
            _code_hash(c, h)
        else:
            h.update(repr(c).encode())


def _value_hash(value: Any, h) -> None:
    import torch

    if isinstance(value, torch.Tensor):
        t = value.detach().cpu().contiguous()
        h.update(f"tensor{tuple(t.shape)}{t.dtype}".encode())
        h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    elif isinstance(value, (bool, int, float, str, type(None), torch.dtype)):
        h.update(repr(value).encode())
    elif isinstance(value, (tuple, list)):
        for v in value:
            _value_hash(v, h)
    elif callable(value) and hasattr(value, "__code__"):
        _code_hash(value.__code__, h)
    else:
        h.update(type(value).__qualname__.encode())


def function_fingerprint(fn: Callable) -> str:
    """A hash of what the function computes: its code, closure and the globals it uses."""
    h = hashlib.sha256()
    code = fn.__code__
    _code_hash(code, h)
    h.update(code.co_filename.encode())
    for cell in fn.__closure__ or ():
        try:
            _value_hash(cell.cell_contents, h)
        except ValueError:  # an empty cell
            h.update(b"<empty>")
    for name in code.co_names:
        if name in fn.__globals__:
            value = fn.__globals__[name]
            if not isinstance(value, type(os)):  # modules are identified by their names
                _value_hash(value, h)
    return h.hexdigest()


def key(fn: Callable, sig: Signature, options: Options, arch: str) -> str:
    h = hashlib.sha256()
    for part in (compiler_fingerprint(), function_fingerprint(fn), repr(sig), options.stable_hash(),
                 options.target, arch):
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()


@dataclass
class Entry:
    """A cache entry on disk: its metadata and the folder of its artifacts."""

    directory: Path
    meta: dict


_reported: set[str] = set()


def _sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def load(k: str) -> Entry | None:
    """The entry for key k, or None; a corrupt entry is reported once and removed."""
    directory = cache_dir() / k[:2] / k
    meta_path = directory / "program.json"
    if not meta_path.exists():
        return None
    try:
        meta = json.loads(meta_path.read_text())
        if meta.get("format") != FORMAT or meta.get("key") != k:
            raise ValueError("the entry belongs to another key or format")
        for name, digest in meta["artifacts"].items():
            if _sha(directory / name) != digest:
                raise ValueError(f"artifact {name} does not match its checksum")
    except (OSError, ValueError, KeyError, TypeError) as e:
        if k not in _reported:
            _reported.add(k)
            warnings.warn(f"kf: cache entry {directory} is corrupt ({e}); recompiling", RuntimeWarning,
                          stacklevel=3)
        shutil.rmtree(directory, ignore_errors=True)
        return None
    return Entry(directory, meta)


_fallback_dir: Path | None = None


def _writable(root: Path) -> Path:
    """root, created if needed; if it cannot be written, a private folder in the temp dir
    (reported once), so an unwritable cache costs recompiles, not a failed call."""
    global _fallback_dir
    try:
        root.mkdir(parents=True, exist_ok=True)
        probe = tempfile.mkdtemp(prefix=".probe-", dir=root)
        os.rmdir(probe)
        return root
    except OSError as e:
        if _fallback_dir is None:
            _fallback_dir = Path(tempfile.mkdtemp(prefix="kf-cache-"))
            warnings.warn(f"kf: cannot write the cache at {cache_dir()} ({e.strerror}); using {_fallback_dir} "
                          f"for this process (set KF_CACHE_DIR)", RuntimeWarning, stacklevel=3)
        return _fallback_dir / root.name


def store(k: str, meta: dict, artifacts: dict[str, bytes]) -> Entry:
    """Write an entry atomically: into a temporary folder, then rename it into place."""
    root = _writable(cache_dir() / k[:2])
    root.mkdir(parents=True, exist_ok=True)
    final = root / k
    tmp = Path(tempfile.mkdtemp(prefix=f".{k[:16]}-", dir=root))
    try:
        digests = {}
        for name, data in artifacts.items():
            (tmp / name).write_bytes(data)
            digests[name] = hashlib.sha256(data).hexdigest()
        meta = dict(meta, format=FORMAT, key=k, artifacts=digests)
        (tmp / "program.json").write_text(json.dumps(meta, indent=1, sort_keys=True))
        try:
            os.replace(tmp, final)
        except OSError:
            # Another process stored the same key first (the rename target exists and
            # is not empty): keep theirs.
            shutil.rmtree(tmp, ignore_errors=True)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return Entry(final, meta)
