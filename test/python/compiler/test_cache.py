"""The JIT cache: in memory, on disk across processes (without importing MLIR), its key
(kf's own files wherever kf is installed, what the function reads), and its faults: every
kind of corruption is reported once and compiled again, concurrent writers all succeed,
folders vanishing mid-compile are made again, entries keep the user's umask."""

import hashlib
import json
import os
import shutil
import stat
import subprocess
import sys
import textwrap
import time
import warnings
import zipfile
from pathlib import Path

import pytest
import torch

import kf
from kf import cache

SCRIPT = textwrap.dedent("""
    import sys, torch, kf

    @kf.jit(target="cpu")
    def rms(x, w, eps=1e-6):
        return x * torch.rsqrt((x * x).mean(dim=-1, keepdim=True) + eps) * w

    torch.manual_seed(int(sys.argv[1]))
    x, w = torch.randn(5, 300), torch.randn(300)
    y = rms(x, w)
    ref = x * torch.rsqrt((x * x).mean(dim=-1, keepdim=True) + 1e-6) * w
    assert torch.allclose(y, ref, atol=1e-5), (y - ref).abs().max()
    print("mlir imported:", "mlir" in sys.modules)
""")


def _pythonpath(first) -> str:
    """PYTHONPATH for a child process: ``first``, then the caller's PYTHONPATH, which may be
    where kf's dependencies are (an install with ``pip --target``)."""
    return os.pathsep.join([str(first), *filter(None, [os.environ.get("PYTHONPATH")])])


def _run(tmp_path: Path, seed: int) -> str:
    script = tmp_path / "user_code.py"
    script.write_text(SCRIPT)
    env = dict(os.environ, KF_CACHE_DIR=str(tmp_path / "cache"))
    r = subprocess.run([sys.executable, str(script), str(seed)], capture_output=True, text=True, env=env,
                       timeout=300)
    assert r.returncode == 0, r.stderr
    return r.stdout + r.stderr


def test_disk_cache_hit_in_a_fresh_process_does_not_import_mlir(tmp_path):
    assert "mlir imported: True" in _run(tmp_path, 1)  # the first process compiles
    assert "mlir imported: False" in _run(tmp_path, 2)  # the second loads the .so and runs


def test_corrupt_entry_is_reported_once_and_recompiled(tmp_path):
    _run(tmp_path, 1)
    entries = list((tmp_path / "cache").glob("*/*/program.json"))
    assert len(entries) == 1
    so = next(p for p in entries[0].parent.iterdir() if p.suffix == ".so")
    so.write_bytes(b"not a shared object")  # a torn or damaged write
    out = _run(tmp_path, 3)
    assert "is corrupt" in out and "recompiling" in out
    assert "mlir imported: True" in out
    assert "is corrupt" not in _run(tmp_path, 4)  # the recompiled entry is good


def test_bad_json_is_corrupt_too(tmp_path, monkeypatch):
    monkeypatch.setenv("KF_CACHE_DIR", str(tmp_path))
    k = "ab" * 32
    entry = cache.store(k, {"x": 1}, {"a.bin": b"123"})
    assert cache.load(k).meta["x"] == 1
    (entry.directory / "program.json").write_text("{not json")
    with pytest.warns(RuntimeWarning, match="corrupt"):
        assert cache.load(k) is None
    assert not entry.directory.exists()


def test_key_changes_with_what_changes_the_code(monkeypatch, tmp_path):
    from kf.options import Options
    from kf.signature import bind

    def f(x, scale=2.0):
        return x * scale

    def g(x, scale=2.0):
        return x * scale + 1

    x = torch.randn(4)
    s1, _ = bind(f, (x,), {})
    s2, _ = bind(f, (x,), {"scale": 3.0})
    s3, _ = bind(f, (torch.randn(5),), {})
    base = cache.key(f, s1, Options(target="cpu"), "")
    assert base == cache.key(f, s1, Options(target="cpu"), "")
    assert len({base, cache.key(f, s2, Options(target="cpu"), ""), cache.key(f, s3, Options(target="cpu"), ""),
                cache.key(g, s1, Options(target="cpu"), ""), cache.key(f, s1, Options(target="vulkan"), ""),
                cache.key(f, s1, Options(target="cuda"), "sm_80"), cache.key(f, s1, Options(target="cuda"), "sm_90")}) == 7


def test_kernel_variants_reach_kf_tile_and_the_key(monkeypatch):
    """The option ``variants`` (kernel variants, kf-tile's ``<kind>.<field>=<value>``
    options) is part of the cache key and goes to kf-tile alone; a malformed item is a
    ValueError naming the form, and a variant kf does not have a CompileError at the
    user's function naming the variants there are."""
    import kf
    from kf import targets
    from kf.errors import CompileError
    from kf.options import Options
    from kf.signature import bind

    def f(a, b):
        return a @ b

    a = torch.randn(64, 64, dtype=torch.bfloat16)
    sig, _ = bind(f, (a, a), {})
    keys = {cache.key(f, sig, Options(target="cuda", variants=v), "sm_80")
            for v in ("", "matmul.stages=2", "matmul.stages=3", "matmul.stages=3 matmul.group_m=0")}
    assert len(keys) == 4
    monkeypatch.setattr(targets.CUDA, "multiprocessors", lambda: 132)
    passes = targets.CUDA.passes("sm_80", " matmul.stages=3   attention.reverse_q_blocks=false ")
    assert "kf-tile{target=cuda chip=sm_80 multiprocessors=132 matmul.stages=3 attention.reverse_q_blocks=false}" \
        in passes, passes
    assert sum("matmul.stages" in p for p in passes) == 1
    for bad in ("stages=3", "matmul.stages", "matmul.=3", ".stages=3"):
        with pytest.raises(ValueError, match="<kind>.<field>=<value>"):
            Options(variants=bad)
    fn = kf.jit(f, target="cuda", arch="sm_80", variants="matmul.stages=2")
    fused = kf.inspect(fn, a, a).stages["gpu"]
    assert "stages = 2 : i64, strategy = \"matmul\"" in fused and "variant = {" in fused
    with pytest.raises(CompileError, match="names no kernel variant") as e:
        kf.inspect(kf.jit(f, target="cuda", arch="sm_80", variants="matmul.stage=2"), a, a).stages
    assert "no variant 'stage' (variants: cooperative_matrix, coopmat_tiles, group_m, inflight" in str(e.value) and e.value.stage == "options"


def test_in_memory_table_compiles_once_per_signature(tmp_path, monkeypatch):
    monkeypatch.setenv("KF_CACHE_DIR", str(tmp_path))

    @kf.jit(target="cpu")
    def add(a, b):
        return a + b

    a, b = torch.randn(7), torch.randn(7)
    torch.testing.assert_close(add(a, b), a + b)
    torch.testing.assert_close(add(b, a), a + b)
    assert len(add._table) == 1
    add(a.double(), b.double())  # a new dtype is a new specialization
    assert len(add._table) == 2
    meta = json.loads(next(tmp_path.glob("*/*/program.json")).read_text())
    assert meta["name"] == "add" and "abi" in meta


def test_unwritable_cache_dir_falls_back_with_one_warning(tmp_path, monkeypatch):
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("a file where the cache folder should be")
    monkeypatch.setenv("KF_CACHE_DIR", str(blocker / "cache"))
    monkeypatch.setattr(cache, "_fallback_dir", None)

    @kf.jit(target="cpu")
    def twice(x):
        return x * 2

    x = torch.randn(5)
    with pytest.warns(RuntimeWarning, match="cannot write the cache"):
        torch.testing.assert_close(twice(x), x * 2)


def test_key_tells_callables_slices_and_partials_apart():
    """Closed-over callables, slices and partials are keyed by what they are, not by
    their type's name."""
    import functools

    from kf.options import Options
    from kf.signature import bind

    def closing_over(v):
        def f(x):
            return v
        return f

    x = torch.randn(4)
    sig, _ = bind(closing_over(0), (x,), {})
    values = [torch.relu, torch.sigmoid, torch.nn.functional.gelu, torch.nn.functional.silu, slice(0, 5),
              slice(5, 10), slice(0, 5, 2), functools.partial(torch.clamp, min=0.0),
              functools.partial(torch.clamp, min=1.0), functools.partial(torch.clamp, max=0.0), 2, 2.0, True,
              0.0, -0.0, (1, 2), [1, 2], {"a": 1}, {"a": 2}, torch.float32, torch.float64, lambda t: t,
              lambda t: t + 1]
    keys = {cache.key(closing_over(v), sig, Options(target="cpu"), "") for v in values}
    assert len(keys) == len(values)
    assert cache.key(closing_over(torch.relu), sig, Options(target="cpu"), "") == \
        cache.key(closing_over(torch.relu), sig, Options(target="cpu"), "")


# ----------------------------------------------------------------------------- corruption


def _square_plus(x):
    return x * x + 1


def _compile(x: torch.Tensor) -> torch.Tensor:
    """A fresh kf function (its own tables): the call goes to the disk cache."""
    return kf.jit(_square_plus, target="cpu")(x)


def _only_entry(root: Path) -> Path:
    entries = [p.parent for p in root.glob("*/*/program.json")]
    assert len(entries) == 1, entries
    return entries[0]


def _rewrite(path: Path, data: bytes) -> None:
    """Replace a file's contents by a new file: a process that has the old .so mapped
    keeps it (changing a mapped file in place would crash that process, not test kf)."""
    tmp = path.with_name(path.name + ".new")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def _edit_json(entry: Path) -> None:
    """program.json still JSON, with another output shape: loaded as it is, the launcher
    would write past the output's end."""
    meta = json.loads((entry / "program.json").read_text())
    abi = json.loads(meta["abi"])
    abi["outputs"][0]["shape"] = [s * 4 for s in abi["outputs"][0]["shape"]]
    meta["abi"] = json.dumps(abi)
    _rewrite(entry / "program.json", json.dumps(meta).encode())


def _so(entry: Path) -> Path:
    return next(p for p in entry.iterdir() if p.suffix == ".so")


def _truncate(entry: Path) -> None:
    so = _so(entry)
    _rewrite(so, so.read_bytes()[: so.stat().st_size // 2])


def _flip_byte(entry: Path) -> None:
    so = _so(entry)
    data = bytearray(so.read_bytes())
    data[len(data) // 2] ^= 0x5A
    _rewrite(so, bytes(data))


def _delete_artifact(entry: Path) -> None:
    _so(entry).unlink()


def _garbage_json(entry: Path) -> None:
    _rewrite(entry / "program.json", b"{\x00\xff not json")


def _unloadable_but_consistent(entry: Path) -> None:
    """A .so that does not open, under a digest that matches it: the runtime's load fails."""
    so = _so(entry)
    _rewrite(so, b"not a shared object")
    meta = json.loads((entry / "program.json").read_text())
    meta["artifacts"][so.name] = hashlib.sha256(so.read_bytes()).hexdigest()
    meta["digest"] = cache._digest(meta)
    _rewrite(entry / "program.json", json.dumps(meta).encode())


_DAMAGES = {d.__name__: d for d in (_edit_json, _truncate, _flip_byte, _delete_artifact, _garbage_json,
                                    _unloadable_but_consistent)}

_DAMAGED = textwrap.dedent("""
    import os, sys, torch, kf
    from pathlib import Path
    import test_cache as t  # this file: its damages

    @kf.jit(target="cpu")
    def rms(x, w, eps=1e-6):
        return x * torch.rsqrt((x * x).mean(dim=-1, keepdim=True) + eps) * w

    torch.manual_seed(int(sys.argv[2]))
    x, w = torch.randn(5, 300), torch.randn(300)
    ref = x * torch.rsqrt((x * x).mean(dim=-1, keepdim=True) + 1e-6) * w
    torch.testing.assert_close(rms(x, w), ref)
    # damage the entry again, and call a new function of the same key (not for a .so this
    # process has opened already: the dynamic loader answers its path with what it holds)
    if sys.argv[1] not in ("-", "_unloadable_but_consistent"):
        t._DAMAGES[sys.argv[1]](t._only_entry(Path(os.environ["KF_CACHE_DIR"])))
        again = kf.jit(rms.fn, target="cpu")
        torch.testing.assert_close(again(x, w), ref)
    print("mlir imported:", "mlir" in sys.modules)
""")


def _run_damaged(tmp_path: Path, again: str, seed: int) -> str:
    (tmp_path / "user_code.py").write_text(_DAMAGED)
    env = dict(os.environ, KF_CACHE_DIR=str(tmp_path / "cache"), PYTHONPATH=_pythonpath(Path(__file__).parent))
    r = subprocess.run([sys.executable, str(tmp_path / "user_code.py"), again, str(seed)], capture_output=True,
                       text=True, env=env, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    return r.stdout + r.stderr


@pytest.mark.parametrize("damage", list(_DAMAGES))
def test_each_corruption_is_reported_once_and_rebuilt(tmp_path, damage):
    """Each kind of damage to an entry, met by a fresh process: the right result, one
    report naming the entry, a rebuilt entry; the same key damaged again in that process
    is rebuilt without a second report."""
    assert "mlir imported: True" in _run_damaged(tmp_path, "-", 1)
    entry = _only_entry(tmp_path / "cache")
    _DAMAGES[damage](entry)
    out = _run_damaged(tmp_path, damage, 2)
    assert out.count("is corrupt") == 1 and str(entry) in out and "mlir imported: True" in out, out[-3000:]
    assert _only_entry(tmp_path / "cache") == entry
    assert "is corrupt" not in _run_damaged(tmp_path, "-", 3)  # whole again


def test_a_damaged_entry_that_cannot_be_removed(tmp_path, monkeypatch):
    """A shared cache's damaged entry that this user may not remove: the call compiles its
    own program, keeps it out of the shared folder, and runs it (never the damaged one)."""
    monkeypatch.setenv("KF_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(cache, "_reported", set())
    x = torch.randn(9)
    torch.testing.assert_close(_compile(x), x * x + 1)
    entry = _only_entry(tmp_path)
    _flip_byte(entry)
    damaged = _so(entry).read_bytes()
    discard = cache.discard
    monkeypatch.setattr(cache, "discard", lambda directory, k, reason, stacklevel=3: warnings.warn(
        f"kf: cache entry {directory} is corrupt ({reason}); recompiling", RuntimeWarning))
    f = kf.jit(_square_plus, target="cpu")
    with pytest.warns(RuntimeWarning, match="is corrupt"):
        torch.testing.assert_close(f(x), x * x + 1)
    (program,) = f._table.values()
    assert tmp_path not in program.directory.parents and _so(entry).read_bytes() == damaged
    monkeypatch.setattr(cache, "discard", discard)


def test_load_checks_the_whole_entry(tmp_path, monkeypatch):
    """cache.load on its own: each damage to metadata or artifacts is a corrupt entry
    (reported, removed), whatever the runtime would make of it."""
    monkeypatch.setenv("KF_CACHE_DIR", str(tmp_path))
    for name, damage in _DAMAGES.items():
        if name == "_unloadable_but_consistent":
            continue  # consistent: the runtime's load finds it (the test above)
        monkeypatch.setattr(cache, "_reported", set())
        k = hashlib.sha256(name.encode()).hexdigest()
        entry = cache.store(k, {"abi": json.dumps({"outputs": [{"shape": [3]}]}), "name": "f"}, {"f.so": b"\x7fELF" * 64})
        assert cache.load(k) is not None
        damage(entry.directory)
        with pytest.warns(RuntimeWarning, match="is corrupt"):
            assert cache.load(k) is None, name
        assert not entry.directory.exists()


def test_a_corrupt_entry_in_a_fresh_process(tmp_path):
    """The case of a new process: an edited program.json is not served (no wrong values,
    no heap corruption), it is reported and rebuilt."""
    _run(tmp_path, 1)
    entry = _only_entry(tmp_path / "cache")
    _edit_json(entry)
    out = _run(tmp_path, 2)
    assert "is corrupt" in out and "does not match its digest" in out and "mlir imported: True" in out
    assert "is corrupt" not in _run(tmp_path, 3)


def _remove(entry, part_way: bool):
    """What a cache cleared meanwhile leaves of an entry: nothing, or (a removal caught
    part way, as rmtree goes file by file) its metadata without its artifacts."""
    if part_way:
        for name in entry.meta["artifacts"]:
            (entry.directory / name).unlink()
    else:
        shutil.rmtree(entry.directory)


@pytest.mark.parametrize("part_way", [False, True])
def test_an_entry_removed_between_store_and_load_is_stored_again(tmp_path, monkeypatch, part_way):
    monkeypatch.setenv("KF_CACHE_DIR", str(tmp_path))
    store = cache.store
    removed = []

    def store_then_remove(k, meta, artifacts, private=False):
        entry = store(k, meta, artifacts, private)
        if not removed:
            removed.append(entry.directory)
            _remove(entry, part_way)
        return entry

    monkeypatch.setattr(cache, "store", store_then_remove)
    x = torch.randn(31)
    torch.testing.assert_close(_compile(x), x * x + 1)
    assert removed
    if not part_way:
        assert _only_entry(tmp_path) == removed[0]


def test_a_cache_cleared_after_every_store_falls_back_to_a_private_entry(tmp_path, monkeypatch):
    """Another process clears the shared cache after each store: the last store goes to
    this process's own folder, which nothing else removes, and the call still answers."""
    monkeypatch.setenv("KF_CACHE_DIR", str(tmp_path))
    store = cache.store
    shared = []

    def store_then_remove(k, meta, artifacts, private=False):
        entry = store(k, meta, artifacts, private)
        if not private:
            shared.append(entry.directory)
            _remove(entry, part_way=len(shared) == 1)
        return entry

    monkeypatch.setattr(cache, "store", store_then_remove)
    x = torch.randn(31)
    torch.testing.assert_close(_compile(x), x * x + 1)
    assert len(shared) == 2


def test_an_entry_removed_between_load_and_use_is_rebuilt(tmp_path, monkeypatch):
    """Another process removes the entry after this one checked it and before the runtime
    opened it: compiled again, without a report (it was not corrupt)."""
    x = torch.randn(31)
    monkeypatch.setenv("KF_CACHE_DIR", str(tmp_path / "first"))
    torch.testing.assert_close(_compile(x), x * x + 1)
    # the same entry under another folder, so that this process has not opened its .so yet
    shutil.copytree(tmp_path / "first", tmp_path / "second")
    monkeypatch.setenv("KF_CACHE_DIR", str(tmp_path / "second"))
    load = cache.load
    removed = []

    def load_then_remove(k):
        entry = load(k)
        if entry is not None and not removed:
            removed.append(entry.directory)
            shutil.rmtree(entry.directory)
        return entry

    monkeypatch.setattr(cache, "load", load_then_remove)
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        torch.testing.assert_close(_compile(x), x * x + 1)
    assert removed and _only_entry(tmp_path / "second") == removed[0]


def test_the_cache_removed_during_a_compile(tmp_path, monkeypatch):
    """Another process clears the cache while this one compiles: the folders are made
    again, and the call succeeds (no raw OSError)."""
    from kf import driver

    root = tmp_path / "cache"
    monkeypatch.setenv("KF_CACHE_DIR", str(root))
    build = driver.build

    def build_then_clear(*args, **kwargs):
        out = build(*args, **kwargs)
        shutil.rmtree(root, ignore_errors=True)
        return out

    monkeypatch.setattr(driver, "build", build_then_clear)
    x = torch.randn(7)
    torch.testing.assert_close(_compile(x), x * x + 1)
    assert _only_entry(root).is_dir()


def test_a_folder_vanishing_in_store_is_made_again(tmp_path, monkeypatch):
    monkeypatch.setenv("KF_CACHE_DIR", str(tmp_path))
    real_mkdir_new = cache._mkdir_new
    calls = []

    def vanishing(parent, prefix):
        path = real_mkdir_new(parent, prefix)
        if not calls:  # the first temporary folder is removed before anything is written
            calls.append(path)
            shutil.rmtree(parent)
        return path

    monkeypatch.setattr(cache, "_mkdir_new", vanishing)
    entry = cache.store("cd" * 32, {"x": 1}, {"a.bin": b"123"})
    assert calls and cache.load("cd" * 32).meta["x"] == 1 and entry.directory.is_dir()


def test_a_folder_removed_inside_mkdir_is_made_again(tmp_path, monkeypatch):
    """A concurrent clear that removes a cache folder between mkdir's "it exists" and its
    "is it a folder" checks: pathlib raises FileExistsError for a folder that is gone.
    store makes it again."""
    monkeypatch.setenv("KF_CACHE_DIR", str(tmp_path))
    real_mkdir = Path.mkdir
    raised = []

    def racing(self, *args, **kwargs):
        if not raised and self.name == "ab":
            raised.append(self)
            raise FileExistsError(17, "File exists", str(self))  # as if it was just removed
        return real_mkdir(self, *args, **kwargs)

    monkeypatch.setattr(Path, "mkdir", racing)
    entry = cache.store("ab" * 32, {"x": 1}, {"a.bin": b"123"})
    assert raised and cache.load("ab" * 32).meta["x"] == 1 and entry.directory.is_dir()


@pytest.mark.parametrize("umask", [0o022, 0o002, 0o077])
def test_entries_keep_the_users_umask(tmp_path, monkeypatch, umask):
    monkeypatch.setenv("KF_CACHE_DIR", str(tmp_path / "cache"))
    old = os.umask(umask)
    try:
        entry = cache.store("ef" * 32, {"x": 1}, {"a.bin": b"123"})
    finally:
        os.umask(old)
    for path, full in [(entry.directory, 0o777), (entry.directory.parent, 0o777), (entry.directory / "a.bin", 0o666),
                       (entry.directory / "program.json", 0o666)]:
        assert stat.S_IMODE(path.stat().st_mode) == full & ~umask, (path, oct(path.stat().st_mode))


_WRITER = textwrap.dedent("""
    import os, sys, time, torch, kf

    @kf.jit(target="cpu")
    def softplus_mix(x, w):
        return torch.log(1 + torch.exp(x)) * w + x.mean(dim=-1, keepdim=True)

    start = float(sys.argv[1])
    while time.time() < start:  # all writers begin together
        time.sleep(0.001)
    torch.manual_seed(int(sys.argv[2]))
    x, w = torch.randn(17, 33), torch.randn(33)
    ref = torch.log(1 + torch.exp(x)) * w + x.mean(dim=-1, keepdim=True)
    torch.testing.assert_close(softplus_mix(x, w), ref)
    print("ok", os.getpid())
""")

_CLEARER = textwrap.dedent("""
    import shutil, sys, time
    start, root = float(sys.argv[1]), sys.argv[2]
    while time.time() < start:
        time.sleep(0.001)
    end = time.time() + float(sys.argv[3])
    while time.time() < end:  # clears the cache again and again while the writers compile
        shutil.rmtree(root, ignore_errors=True)
        time.sleep(0.05)
""")


@pytest.mark.parametrize("clearing", [False, True])
def test_concurrent_writers_all_succeed(tmp_path, clearing):
    """Several processes compile the same key at once (and, with clearing, another one
    deletes the cache meanwhile): every one gets the right result, and what is left is
    one whole entry."""
    script = tmp_path / "writer.py"
    script.write_text(_WRITER)
    root = tmp_path / "cache"
    env = dict(os.environ, KF_CACHE_DIR=str(root))
    start = time.time() + 20  # the processes import torch and kf first
    procs = [subprocess.Popen([sys.executable, str(script), str(start), str(i)], env=env, stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True) for i in range(4)]
    if clearing:
        (tmp_path / "clearer.py").write_text(_CLEARER)
        procs.append(subprocess.Popen([sys.executable, str(tmp_path / "clearer.py"), str(start), str(root), "15"]))
    for p in procs:
        out, err = p.communicate(timeout=900)
        assert p.returncode == 0, err[-3000:] if err else ""
    writers = procs[:4]
    assert all(p.returncode == 0 for p in writers)
    if not clearing:
        assert len(list(root.glob("*/*/program.json"))) == 1
        assert not [p for p in root.glob("*/.*")], list(root.glob("*/.*"))  # no temporaries left behind
    r = subprocess.run([sys.executable, str(script), "0", "9"], env=env, capture_output=True, text=True, timeout=600)
    assert r.returncode == 0 and "is corrupt" not in r.stderr, r.stderr[-3000:]


# ----------------------------------------------------------------------------- an installed kf

_FINGERPRINT = textwrap.dedent("""
    import kf
    from kf import cache
    print(kf.__file__)
    print(cache.kf_package_dirs())
    print(cache.compiler_fingerprint())
""")


def _fingerprint_of(site: Path, tmp_path: Path) -> list[str]:
    script = tmp_path / "fingerprint.py"
    script.write_text(_FINGERPRINT)
    env = dict(os.environ, PYTHONPATH=_pythonpath(site))
    r = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=300,
                       cwd=str(tmp_path))
    assert r.returncode == 0, r.stderr[-3000:]
    return r.stdout.splitlines()


@pytest.fixture(scope="module")
def installed_kf(tmp_path_factory):
    """kf built as a wheel and unpacked as pip installs it (kf/, kf/passes/, ... in one
    site folder), the way a non-editable install lays it out."""
    repo = Path(__file__).resolve().parents[3]
    out = tmp_path_factory.mktemp("wheel")
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                        str(out), str(repo)], capture_output=True, text=True, timeout=900)
    if r.returncode != 0:
        pytest.skip(f"cannot build kf's wheel here: {r.stderr[-500:]}")
    wheel = next(out.glob("kf-*.whl"))
    site = out / "site"
    with zipfile.ZipFile(wheel) as z:
        z.extractall(site)
    return site


def test_an_installed_kf_keys_on_its_own_files_and_version(installed_kf, tmp_path):
    """Item 5: with kf installed from a wheel, the fingerprint hashes the installed
    package's files (not a source tree's folders, absent there) and kf.__version__: a
    changed file or version is a new key, so an upgrade never serves old kernels."""
    site = installed_kf
    kf_file, dirs, first = _fingerprint_of(site, tmp_path)
    assert kf_file == str(site / "kf" / "__init__.py"), kf_file
    assert str(site / "kf") in dirs and "compiler" not in dirs
    pass_file = site / "kf" / "passes" / "fuse.py"
    original = pass_file.read_text()
    pass_file.write_text(original + "\n# a change in an installed pass\n")
    try:
        changed = _fingerprint_of(site, tmp_path)[2]
    finally:
        pass_file.write_text(original)
    init = site / "kf" / "__init__.py"
    text = init.read_text()
    init.write_text(text.replace('__version__ = "', '__version__ = "9.'))
    try:
        upgraded = _fingerprint_of(site, tmp_path)[2]
    finally:
        init.write_text(text)
    assert len({first, changed, upgraded}) == 3
    assert _fingerprint_of(site, tmp_path)[2] == first


def test_the_same_code_on_another_line_is_another_program(tmp_path, monkeypatch):
    """A program names the user's line in its errors (an index out of range), so two
    functions of the same code on other lines never share an entry: each error names
    its own function's line, also when the second would find the first's program."""
    import inspect

    monkeypatch.setenv("KF_CACHE_DIR", str(tmp_path))
    first = lambda x, i: x[i]  # noqa: E731
    second = lambda x, i: x[i]  # noqa: E731
    x = torch.randn(10, 4)
    for fn in (first, second):
        f = kf.jit(fn, target="cpu")
        f(x, torch.randint(-10, 10, (6,)))
        with pytest.raises(kf.IndexOutOfRange) as e:
            f(x, torch.tensor([1, 12]))
        assert f"{__file__}:{inspect.getsourcelines(fn)[1]}" in str(e.value)
