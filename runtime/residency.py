"""Which torch CPU tensors already have their bytes in a device buffer, so that a chain
of calls on the same tensors uploads each of them once.

A device buffer is *resident* for a tensor when it holds the bytes that the tensor
holds now. The table keys an entry by the tensor's storage -- its address and size,
and a weak reference to the storage object, so that a storage freed and another
allocated at the same address is not taken for the first -- and by the part of the
storage the tensor reads: a dense range (``("dense", byte offset, bytes)``: a
contiguous tensor and every contiguous view of the same bytes, ``x`` and
``x.view(-1)``, share it) or a strided view (its offset, shape, strides and element
size: the buffer holds the view made contiguous). An entry is used only while the
tensor's version counter (``t._version``, which torch bumps on every in-place change
of the tensor or of any view of it) is the one recorded when the buffer last matched
the host, and while a sample of the host bytes is the one recorded then.

Why the sample: some writes bypass the version counter -- through ``t.data``
(``p.data.add_(...)`` in hand-written optimizers), a numpy array sharing the memory,
``data_ptr()`` -- and a stale buffer would give silently wrong results. Sixteen 16-byte
windows spread over the bytes (all of them below 256 bytes) are compared on each use, a
few microseconds; a write that bypasses the counter and leaves every sampled byte as it
was is not seen. ``KF_VULKAN_RESIDENT_BYTES=0`` turns residency off (every call then
uploads its inputs). Inference tensors (made under ``torch.inference_mode``) have no
version counter and are never resident.

The table is bounded (least recently used entries go first, counted in bytes). An
entry in use by a call in flight is *pinned* and neither evicted nor released until
the call unpins it. When a storage dies its entries go at the next call (a weakref
finalizer only queues it: it can fire inside any code, this table's included).
Nothing here calls Vulkan: buffers are opaque, released through the callback.
"""

from __future__ import annotations

import collections
import ctypes
import threading
import weakref
from dataclasses import dataclass, field
from typing import Callable

#: Sample windows and their width (bytes) of a tensor's host bytes.
SAMPLES, WINDOW = 16, 16


@dataclass
class Entry:
    """A device buffer that holds the bytes of (a view of) one storage."""

    key: tuple
    buffer: object
    nbytes: int
    version: int = -1
    sample: bytes = b""
    token: int = 0  # the storage registration it belongs to
    pins: int = 0
    live: bool = True  # in the table (a dead, pinned entry is released when unpinned)
    #: its bytes are on the device for every later submit: set once the call that
    #: uploads them has submitted (until then another call uploads its own)
    ready: bool = False


@dataclass
class _Storage:
    ref: weakref.ref
    token: int
    keys: set = field(default_factory=set)
    finalizer: object = None


def storage_key(t) -> tuple | None:
    """(storage key, view key) of a CPU tensor, or None when it cannot be resident: an
    inference tensor (no version counter), or no bytes."""
    if t.is_inference() or t.numel() == 0:
        return None
    s = t.untyped_storage()
    size = t.element_size()
    offset = t.storage_offset() * size
    if t.is_contiguous():
        view = ("dense", offset, t.numel() * size)
    else:
        view = ("strided", offset, tuple(t.shape), tuple(t.stride()), size)
    return (s.data_ptr(), s.nbytes()), view


def _span(t) -> tuple[int, int]:
    """(address, bytes) of the host memory the tensor's elements lie in."""
    size = t.element_size()
    last = sum((n - 1) * st for n, st in zip(t.shape, t.stride()) if n > 0)
    return t.data_ptr(), (last + 1) * size


def sample(t) -> bytes:
    """Bytes of the tensor's memory at SAMPLES spread positions (all of it when small)."""
    ptr, n = _span(t)
    if n <= SAMPLES * WINDOW:
        return ctypes.string_at(ptr, n)
    step = (n - WINDOW) // (SAMPLES - 1)
    return b"".join(ctypes.string_at(ptr + i * step, WINDOW) for i in range(SAMPLES))


class Residency:
    """The table of resident buffers of one device. ``release(buffer)`` gives a buffer
    back to the device; it is called with no lock of this table held."""

    def __init__(self, limit: int, release: Callable[[object], None]):
        self.limit = limit
        self._release = release
        self._lock = threading.Lock()
        self._entries: collections.OrderedDict[tuple, Entry] = collections.OrderedDict()
        self._storages: dict[tuple, _Storage] = {}
        self._by_token: dict[int, tuple] = {}  # registration -> storage key
        self._dead: collections.deque = collections.deque()  # tokens of storages that died
        self._tokens = 0
        self.resident_bytes = 0

    # ---- lookups -------------------------------------------------------------------
    def acquire(self, t, key: tuple) -> Entry | None:
        """The entry that holds t's current bytes, pinned; None when there is none (a
        stale one is dropped)."""
        skey, _ = key
        garbage = []
        with self._lock:
            self._drain(garbage)
            e = self._entries.get(key)
            if e is not None and not e.ready:
                e = None
            elif e is not None:
                rec = self._storages.get(skey)
                storage = t.untyped_storage()
                if rec is None or rec.token != e.token or rec.ref() is not storage or \
                        e.version != t._version or e.sample != sample(t):
                    self._drop(e, garbage)
                    e = None
                else:
                    e.pins += 1
                    self._entries.move_to_end(key)
        self._free(garbage)
        return e

    def insert(self, t, key: tuple, buffer, nbytes: int) -> Entry:
        """A pinned entry for t holding ``buffer``, whose bytes the caller makes t's (an
        upload, or the download into t) before the entry is used: ``record(entry, t)``
        then stamps the version and sample."""
        skey, _ = key
        garbage = []
        with self._lock:
            self._drain(garbage)
            storage = t.untyped_storage()
            rec = self._storages.get(skey)
            if rec is not None and rec.ref() is not storage:
                # another storage at this address: the first one died
                self._forget(rec.token, garbage)
                rec = None
            if rec is None:
                self._tokens += 1
                rec = _Storage(weakref.ref(storage), self._tokens)
                rec.finalizer = weakref.finalize(storage, self._dead.append, rec.token)
                rec.finalizer.atexit = False  # no Vulkan calls while the interpreter exits
                self._storages[skey] = rec
                self._by_token[rec.token] = skey
            old = self._entries.get(key)
            if old is not None:
                self._drop(old, garbage)
            e = Entry(key, buffer, nbytes, token=rec.token, pins=1)
            self._entries[key] = e
            rec.keys.add(key)
            self.resident_bytes += nbytes
        self._free(garbage)
        return e

    @staticmethod
    def record(e: Entry, t) -> None:
        """Stamp e with t's version and bytes: the buffer and the host agree now."""
        e.version = t._version
        e.sample = sample(t)

    def unpin(self, entries) -> None:
        """Unpin entries (a call is done with them), then evict to the limit."""
        garbage = []
        with self._lock:
            for e in entries:
                e.pins -= 1
                if not e.live and e.pins == 0:
                    garbage.append(e.buffer)
            self._drain(garbage)
            self._evict(garbage)
        self._free(garbage)

    def discard(self, e: Entry) -> None:
        """Take e out of the table (its bytes never reached it); released when unpinned."""
        garbage = []
        with self._lock:
            if e.live:
                self._drop(e, garbage)
        self._free(garbage)

    def clear(self) -> None:
        """Drop every entry (pinned ones are released when their calls unpin them)."""
        garbage = []
        with self._lock:
            for e in list(self._entries.values()):
                self._drop(e, garbage)
            self._drain(garbage)
        self._free(garbage)

    def trim(self) -> None:
        """Release what storages that died left, and evict to the limit."""
        garbage = []
        with self._lock:
            self._drain(garbage)
            self._evict(garbage)
        self._free(garbage)

    def __len__(self) -> int:
        return len(self._entries)

    # ---- with the lock held ----------------------------------------------------------
    def _drop(self, e: Entry, garbage: list) -> None:
        if not e.live:
            return
        e.live = False
        del self._entries[e.key]
        self.resident_bytes -= e.nbytes
        rec = self._storages.get(e.key[0])
        if rec is not None and rec.token == e.token:
            rec.keys.discard(e.key)
            if not rec.keys:
                self._unregister(rec)
        if e.pins == 0:
            garbage.append(e.buffer)

    def _unregister(self, rec: _Storage) -> None:
        rec.finalizer.detach()
        skey = self._by_token.pop(rec.token)
        del self._storages[skey]

    def _forget(self, token: int, garbage: list) -> None:
        """Drop the entries of a storage registration (its storage died)."""
        skey = self._by_token.get(token)
        if skey is None:
            return
        rec = self._storages[skey]
        for key in list(rec.keys):
            e = self._entries.get(key)
            if e is not None and e.token == token:
                self._drop(e, garbage)
        if self._by_token.get(token) is not None:
            self._unregister(rec)

    def _drain(self, garbage: list) -> None:
        while self._dead:
            self._forget(self._dead.popleft(), garbage)

    def _evict(self, garbage: list) -> None:
        if self.resident_bytes <= self.limit:
            return
        for e in list(self._entries.values()):  # least recently used first
            if self.resident_bytes <= self.limit:
                break
            if e.pins == 0:
                self._drop(e, garbage)

    def _free(self, garbage: list) -> None:
        for b in garbage:
            self._release(b)
