"""kf.profile on the CPU and Vulkan targets: every launch recorded with its kernel, the
user lines it fuses, its time by the target's own clock, bytes and FLOPs from the
compiler, rates against the device's peaks; the table, the Chrome trace, the roofline
PNG and torch.profiler's view. The CUDA bookkeeping (events, ptxas numbers, occupancy)
is checked here with stand-in events; it runs for real on the H200."""

import json

import pytest
import torch

import kf
from kf import costs, programs
from kf.runtime import vulkan


@pytest.fixture(autouse=True)
def _env(tmp_path, monkeypatch):
    monkeypatch.setenv("KF_CACHE_DIR", str(tmp_path))
    # Fixed host ceilings: the numbers in the table below are then reproducible.
    monkeypatch.setenv("KF_HOST_PEAK", "10,100")
    monkeypatch.setattr(costs, "_HOST_PEAK", None)


needs_vulkan = pytest.mark.skipif(not vulkan.is_available(), reason="no Vulkan device")


def linear_gelu(x, w):
    y = torch.matmul(x, w)
    return torch.nn.functional.gelu(y)


def scaled(x):
    return torch.tanh(x) * 2


def test_cpu_launches_are_recorded_with_work_and_wall_time():
    f = kf.jit(linear_gelu, target="cpu")
    x, w = torch.randn(64, 32), torch.randn(32, 48)
    f(x, w)  # compile outside the profile
    with kf.profile() as prof:
        for _ in range(3):
            f(x, w)
    assert programs._PROFILE is None
    assert len(prof.launches) == 3
    launch = prof.launches[0]
    assert launch.function == "linear_gelu" and launch.target == "cpu" and launch.timer == "wall"
    assert launch.nbytes == (64 * 32 + 32 * 48 + 64 * 48) * 4
    assert launch.matmul_flops == 2 * 64 * 48 * 32
    assert launch.flops == launch.matmul_flops + 8 * 64 * 48  # gelu counts 8 per element
    assert {int(line.rsplit(":", 1)[1]) for line in launch.fused_lines} == {
        linear_gelu.__code__.co_firstlineno + 1, linear_gelu.__code__.co_firstlineno + 2}
    (stats,) = prof.kernels()
    assert stats.calls == 3 and stats.total_s > 0
    assert stats.gbps == pytest.approx(stats.nbytes / stats.mean_s / 1e9)
    peak = costs.peak_for("cpu")
    assert peak.bytes_per_s == 10e9 and peak.vector_flops == 100e9
    floor = max(stats.nbytes / 10e9, stats.flops / 100e9)
    assert stats.roofline_fraction == pytest.approx(floor / stats.mean_s)


def test_table_shows_kernels_lines_peaks_and_compile_time():
    f = kf.jit(linear_gelu, target="cpu")
    x, w = torch.randn(16, 8), torch.randn(8, 4)
    with kf.profile() as prof:
        f(x, w)
        f(x, w)
    text = prof.table(file=None)
    header = text.splitlines()[0].split()
    assert header[:4] == ["kernel", "target", "strategy", "calls"]
    for column in ("GB/s", "TFLOP/s", "roof", "regs", "spills", "occ"):
        assert column in header
    row = text.splitlines()[2].split()
    assert row[:4] == ["linear_gelu", "cpu", "cpu", "2"]
    assert f"test_profiler.py:{linear_gelu.__code__.co_firstlineno + 1}" in text
    assert "compile time by pass" in text and "kf-lower-to-linalg" in text and "capture" in text
    assert "10.0 GB/s" in text and "KF_HOST_PEAK" in text


def test_nothing_is_recorded_outside_a_profile_and_profiles_nest():
    f = kf.jit(scaled, target="cpu")
    x = torch.randn(100)
    f(x)
    with kf.profile() as outer:
        f(x)
        with kf.profile() as inner:
            f(x)
        assert programs._PROFILE is outer
    f(x)
    assert len(outer.launches) == 2 and len(inner.launches) == 1


def test_interpreted_programs_are_recorded():
    f = kf.jit(scaled, target="cpu", interpret=True)
    x = torch.randn(100)
    with kf.profile() as prof:
        torch.testing.assert_close(f(x), scaled(x))
    (launch,) = prof.launches
    assert launch.target == "interpreter" and launch.flops == 200 and launch.nbytes == 800


@needs_vulkan
def test_vulkan_kernels_are_timed_by_timestamp_queries():
    f = kf.jit(linear_gelu, target="vulkan")
    g = kf.jit(scaled, target="vulkan")
    x, w = torch.randn(64, 32), torch.randn(32, 48)
    f(x, w), g(x)
    with kf.profile() as prof:
        f(x, w)
        g(x)
        g(x)
    kernels = {s.function: s for s in prof.kernels()}
    assert set(kernels) == {"linear_gelu", "scaled"}
    mm, ew = kernels["linear_gelu"], kernels["scaled"]
    expected_timer = "vulkan timestamps" if vulkan.device().timestamps else "wall"
    assert mm.timer == ew.timer == expected_timer
    assert ew.calls == 2 and ew.strategy == "elementwise" and ew.kernel.startswith("scaled_k")
    assert mm.strategy in ("matmul", "generic") and mm.matmul_flops == 2 * 64 * 48 * 32
    assert ew.nbytes == 2 * 64 * 32 * 4 and ew.flops == 2 * 64 * 32
    for s in (mm, ew):
        assert 0 < s.min_s <= s.mean_s and s.roofline_fraction is not None
    text = prof.table(file=None)
    assert "vulkan: peaks of" in text and "timed with " + expected_timer in text


@needs_vulkan
def test_chrome_trace_has_host_calls_and_device_kernels(tmp_path):
    g = kf.jit(scaled, target="vulkan")
    x = torch.randn(1000)
    g(x)
    with kf.profile() as prof:
        for _ in range(3):
            g(x)
    path = prof.export_chrome_trace(str(tmp_path / "trace.json"))
    trace = json.load(open(path))
    events = trace["traceEvents"]
    kernels = [e for e in events if e.get("cat") == "kernel"]
    calls = [e for e in events if e.get("cat") == "call"]
    assert len(kernels) == 3 and len(calls) == 3
    assert all(e["ph"] == "X" and e["dur"] > 0 and e["name"].startswith("scaled_k") for e in kernels)
    assert all(e["name"] == "scaled" and e["tid"] == 0 for e in calls)
    assert kernels[0]["args"]["bytes"] == 8000 and kernels[0]["args"]["fused_lines"]
    assert sorted(e["ts"] for e in calls) == [e["ts"] for e in calls]
    names = {e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "thread_name"}
    assert any(n.startswith("vulkan: kernels") for n in names)


def test_roofline_png():
    pytest.importorskip("matplotlib")
    f = kf.jit(linear_gelu, target="cpu")
    g = kf.jit(scaled, target="cpu")
    x, w = torch.randn(64, 32), torch.randn(32, 48)
    with kf.profile() as prof:
        f(x, w)
        g(x)
    import tempfile

    with tempfile.TemporaryDirectory() as d:
        path = prof.roofline(f"{d}/roof.png")
        data = open(path, "rb").read()
    assert data[:8] == b"\x89PNG\r\n\x1a\n" and len(data) > 10000


def test_launches_appear_in_torch_profiler_under_the_function_name():
    f = kf.jit(scaled, target="cpu")
    x = torch.randn(100)
    f(x)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as tp:
        f(x)
    assert "scaled" in {e.key for e in tp.key_averages()}


class _Event:
    """Stands in for torch.cuda.Event: times in ms from a common origin."""

    def __init__(self, t_ms):
        self.t = t_ms

    def synchronize(self):
        pass

    def elapsed_time(self, other):
        return other.t - self.t


def test_cuda_bookkeeping_with_events_and_ptxas_numbers():
    """What kf.profile does with a CUDA program's events and ptxas report, without a GPU."""
    from kf.profiler import profile
    from kf.runtime.abi import KernelABI, ProgramABI, TensorArg

    k = KernelABI("f_k0_rowwise", (0, 1), grid=(1024, 1, 1), block=(256, 1, 1), shared_bytes=2048,
                  fused_lines=("model.py:3",),
                  extra={"strategy": "rowwise", "flops": 4 << 20, "matmul_flops": 0,
                         "ptxas": {"registers": 40, "shared_bytes": 0, "spill_store_bytes": 8,
                                   "spill_load_bytes": 8}})
    abi = ProgramABI("cuda", (TensorArg("x", (1024, 1024), "bf16"),), (TensorArg("result0", (1024, 1024), "bf16"),),
                     kernels=(k,))

    class Program:
        meta = {"name": "f", "signature": "(x: bf16[1024, 1024]@cuda)", "compile_seconds": {"kf-fuse": 0.01}}

    prof = profile(device="H200")
    prof._t0 = 0.0
    prof._cuda_ref = (_Event(0.0), 0.0)
    prof._record(Program(), abi, 0.001, 0.002, None, [("f_k0_rowwise", _Event(1.0), _Event(1.002))])
    (s,) = prof.kernels()
    assert s.timer == "cuda events" and s.mean_s == pytest.approx(2e-6)
    assert s.nbytes == 2 * 1024 * 1024 * 2
    assert s.gbps == pytest.approx(s.nbytes / 2e-6 / 1e9)
    assert prof.launches[0].device_start_s == pytest.approx(1e-3)
    assert s.peak.name == "NVIDIA H200"
    assert s.roofline_fraction == pytest.approx((s.nbytes / 4.25e12) / 2e-6)
    occ = s.occupancy
    assert occ["blocks_per_sm"] == 6 and occ["limited_by"] == "registers"
    row = prof.table(file=None).splitlines()[2].split()
    assert row[-4:] == ["40", "2048", "16", f"{occ['occupancy'] * 100:.0f}%"]


def test_occupancy_rules():
    # 256 threads, 32 registers: 8 blocks of 8 warps fill the 64 warps of an SM.
    assert costs.cuda_occupancy(256, 32, 0) == {"blocks_per_sm": 8, "warps_per_sm": 64, "occupancy": 1.0,
                                                "limited_by": "threads"}
    # 128 registers a thread: 65536 / (128 * 32) = 16 warps -> 2 blocks of 8 warps.
    assert costs.cuda_occupancy(256, 128, 0)["blocks_per_sm"] == 2
    # 100 KiB of shared memory a block: 2 blocks in 228 KiB.
    assert costs.cuda_occupancy(128, 32, 100 * 1024) == {"blocks_per_sm": 2, "warps_per_sm": 8,
                                                          "occupancy": 0.125, "limited_by": "shared"}


def test_h200_peaks_and_floor():
    h200 = costs.peak_for("cuda", "H200")
    assert h200.bytes_per_s == 4.25e12 and 680e12 <= h200.matmul["bf16"] <= 790e12
    # An 8192^3 bf16 matmul is compute-bound; a copy is memory-bound.
    mm = 2 * 8192 ** 3
    assert h200.floor_seconds(3 * 8192 * 8192 * 2, mm, mm, "bf16") == pytest.approx(mm / h200.matmul["bf16"])
    assert h200.floor_seconds(1e9, 0, 0, "f32") == pytest.approx(1e9 / 4.25e12)
    assert costs.peak_for("cuda", "some other GPU") is None


def test_launches_outside_a_profile_never_import_the_profiler(tmp_path):
    """The fast path only reads a flag: a process that never profiles never loads it."""
    import subprocess
    import sys

    script = ("import sys, torch, kf\n"
              "f = kf.jit(lambda x: x * 2, target='cpu')\n"
              "x = torch.randn(4)\n"
              "for _ in range(3): f(x)\n"
              "print('profiler imported:', 'kf.profiler' in sys.modules)\n")
    r = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=300,
                       env={**__import__("os").environ, "KF_CACHE_DIR": str(tmp_path)})
    assert r.returncode == 0, r.stderr
    assert "profiler imported: False" in r.stdout


def test_table_is_returned_not_printed_and_reads_as_text(capsys):
    # a REPL shows a returned value's repr: the table must show once, unquoted
    f = kf.jit(linear_gelu, target="cpu")
    x, w = torch.randn(16, 8), torch.randn(8, 4)
    with kf.profile() as prof:
        f(x, w)
    text = prof.table()
    assert capsys.readouterr().out == ""
    assert isinstance(text, str) and repr(text) == str(text) and "linear_gelu" in text


def test_roofline_without_matplotlib_names_the_extra(tmp_path, monkeypatch):
    import sys

    prof = kf.profile()
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # as if it were not installed
    with pytest.raises(ImportError, match=r"kf\[plot\]"):
        prof.roofline(str(tmp_path / "r.png"))
