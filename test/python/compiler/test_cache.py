"""The JIT cache: in memory, on disk across processes (without importing MLIR), and
recovery from a corrupt entry."""

import json
import os
import subprocess
import sys
import textwrap
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


def test_key_and_passes_name_the_devices_multiprocessors(monkeypatch):
    """Persistent kernels start one workgroup a multiprocessor: the count is a pass
    option of kf-tile and kf-map-to-gpu and part of the cache key, so a cubin built for
    an H200 (132) is not reused on a GPU of another count. Without a GPU, 132."""
    from kf import driver
    from kf.options import Options

    opts = Options(target="cuda")
    if not torch.cuda.is_available():
        assert driver.target_multiprocessors("cuda") == 132
    assert driver.target_multiprocessors("vulkan") == 0
    monkeypatch.setattr(driver, "target_multiprocessors", lambda target: 114)
    assert driver.device_key(opts).endswith(" 114")
    passes = driver.gpu_passes("cuda", "sm_90a")
    assert "kf-tile{target=cuda chip=sm_90a multiprocessors=114}" in passes, passes
    assert "kf-map-to-gpu{target=cuda chip=sm_90a multiprocessors=114}" in passes, passes
    key_114 = driver.device_key(opts)
    monkeypatch.setattr(driver, "target_multiprocessors", lambda target: 132)
    assert driver.device_key(opts) != key_114


def test_kernel_variants_reach_kf_tile_and_the_key(monkeypatch):
    """The option ``variants`` (kernel variants, kf-tile's ``<kind>.<field>=<value>``
    options) is part of the cache key and goes to kf-tile alone; a malformed item is a
    ValueError naming the form, and a variant kf does not have a CompileError at the
    user's function naming the variants there are."""
    import kf
    from kf import driver
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
    monkeypatch.setattr(driver, "target_multiprocessors", lambda target: 132)
    passes = driver.gpu_passes("cuda", "sm_80", " matmul.stages=3   attention.reverse_q_blocks=false ")
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
    assert "no variant 'stage' (variants: group_m, inflight" in str(e.value) and e.value.stage == "options"


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


def test_vulkan_key_and_passes_name_the_devices_limits(recorded_device):
    """A Vulkan program is tiled for its device's limits: they are the target's arch (the
    driver reads them from the device, or ``arch`` gives them), part of the cache key and
    the limits option of kf-tile and kf-map-to-gpu, so devices of other limits never
    share a program. Metal (no device to ask) and a machine without Vulkan take the
    defaults."""
    from kf import driver
    from kf.options import Options
    from kf.runtime import vulkan
    from kf.runtime.abi import DeviceLimits

    lvp = DeviceLimits.from_vulkan(recorded_device("lavapipe")).spec()
    nv = DeviceLimits.from_vulkan(recorded_device("nvidia-h200")).spec()
    keys = {driver.device_key(Options(target="vulkan", arch=spec)) for spec in (lvp, nv)}
    assert len(keys) == 2 and all(nv in k or lvp in k for k in keys)
    own = driver.target_arch(Options(target="vulkan"))
    assert own == (vulkan.device().target_limits().spec() if vulkan.is_available() else "")
    assert driver.target_arch(Options(target="metal")) == ""
    assert driver.target_arch(Options(target="metal", arch=nv)) == nv
    passes = driver.gpu_passes("vulkan", nv)
    assert f"kf-tile{{target=spirv limits={nv}}}" in passes
    assert f"kf-map-to-gpu{{target=spirv limits={nv}}}" in passes
    assert "kf-tile{target=spirv}" in driver.gpu_passes("metal", "")
    with pytest.raises(ValueError, match="device limits"):
        driver.target_arch(Options(target="vulkan", arch="sm_90"))
