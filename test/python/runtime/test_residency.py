"""runtime/residency.py on its own: which tensors count as resident, the LRU bound in
bytes, pins, and storages that die. Buffers are opaque to the table (the Vulkan launcher
hands it its own); here they are plain objects and ``released`` lists what the table
gave back. The launcher's use of it runs on lavapipe in test_vulkan.py."""

from __future__ import annotations

import gc

import numpy as np
import torch

from kf.runtime.residency import Residency, storage_key


class Buf:
    def __init__(self, name):
        self.name = name

    def __repr__(self):
        return f"Buf({self.name})"


def table(limit=1 << 30):
    released = []
    return Residency(limit, released.append), released


def admit(res, t, name="b"):
    """What the launcher does for an uploaded tensor: insert, stamp, mark ready, unpin."""
    key = storage_key(t)
    e = res.insert(t, key, Buf(name), t.numel() * t.element_size())
    res.record(e, t)
    e.ready = True
    res.unpin([e])
    return e


def hit(res, t) -> bool:
    e = res.acquire(t, storage_key(t))
    if e is not None:
        res.unpin([e])
    return e is not None


def test_keys_views_by_the_bytes_they_read():
    x = torch.randn(6, 10)
    s, view = storage_key(x)
    assert s == (x.untyped_storage().data_ptr(), 240) and view == ("dense", 0, 240)
    assert storage_key(x.view(-1)) == storage_key(x)  # the same bytes, dense
    assert storage_key(x[2:])[1] == ("dense", 80, 160)  # contiguous rows at an offset
    assert storage_key(x.t())[1] == ("strided", 0, (10, 6), (1, 10), 4)
    assert storage_key(x[:, ::2])[1] == ("strided", 0, (6, 5), (10, 2), 4)
    assert storage_key(torch.empty(0, 3)) is None
    with torch.inference_mode():
        assert storage_key(torch.ones(3)) is None  # no version counter


def test_in_place_changes_and_writes_past_the_counter_are_misses():
    res, _ = table()
    x = torch.randn(100, 100)
    admit(res, x)
    assert hit(res, x) and hit(res, x.view(-1))
    x.add_(1)  # the version counter moves
    assert not hit(res, x)
    admit(res, x)
    x[3, 4] = 5  # through indexing
    assert not hit(res, x)
    admit(res, x)
    x.view(-1)[17] = 2  # through a view (which shares the counter)
    assert not hit(res, x)
    admit(res, x)
    x.data.mul_(2)  # .data has a counter of its own: the sampled bytes tell
    assert x._version == res._entries[storage_key(x)].version and not hit(res, x)
    a = np.zeros((64, 64), dtype=np.float32)
    t = torch.from_numpy(a)
    admit(res, t)
    a[:] = 1  # numpy writes move no counter either
    assert not hit(res, t)


def test_lru_by_bytes_and_pins():
    res, released = table(limit=3 * 400)
    ts = [torch.randn(100) for _ in range(4)]  # 400 bytes each
    for i, t in enumerate(ts[:3]):
        admit(res, t, f"t{i}")
    assert res.resident_bytes == 1200 and not released
    assert hit(res, ts[0])  # t0 is now the most recently used: t1 goes first
    pinned = res.acquire(ts[2], storage_key(ts[2]))  # a call in flight holds t2
    admit(res, ts[3], "t3")
    assert [b.name for b in released] == ["t1"]
    res.limit = 0
    res.trim()  # everything unpinned goes; t2 stays while pinned
    assert sorted(b.name for b in released) == ["t0", "t1", "t3"] and len(res) == 1
    res.unpin([pinned])
    assert len(res) == 0 and sorted(b.name for b in released) == ["t0", "t1", "t2", "t3"]


def test_a_replaced_entry_in_use_is_released_when_unpinned():
    res, released = table()
    x = torch.randn(10)
    admit(res, x, "old")
    e = res.acquire(x, storage_key(x))
    x.add_(1)
    admit(res, x, "new")  # another call uploads the new bytes while e is in use
    assert not released
    res.unpin([e])
    assert [b.name for b in released] == ["old"]


def test_not_ready_entries_are_not_shared():
    """An entry whose upload has not been submitted yet is a miss for other calls."""
    res, _ = table()
    x = torch.randn(10)
    key = storage_key(x)
    e = res.insert(x, key, Buf("pending"), 40)
    res.record(e, x)
    assert res.acquire(x, key) is None
    e.ready = True
    assert res.acquire(x, key) is e


def test_dead_storages_go_and_never_alias():
    res, released = table()
    x = torch.zeros(1000)
    admit(res, x, "x")
    ptr = x.data_ptr()
    del x
    gc.collect()
    # a new storage at the same address, with the same version and bytes, is not the
    # first one (the allocator hands the freed block out again, nearly always at once)
    for _ in range(100):
        y = torch.zeros(1000)
        if y.data_ptr() == ptr:
            break
    assert y._version == 0
    assert not hit(res, y)
    assert [b.name for b in released] == ["x"] and len(res) == 0 and not res._storages
