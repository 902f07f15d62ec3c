"""Program objects (compiler/programs.py): a cache entry loads as a CompiledProgram
without the compiler, an entry that names reached tensors the call does not have is
refused, and both kinds of program run a function as torch does."""

import json
import subprocess
import sys
import textwrap

import pytest
import torch

import kf
from kf import cache, programs


def f(x, y):
    return torch.relu(x) * y + 1


def _entry(tmp_path, monkeypatch):
    monkeypatch.setenv("KF_CACHE_DIR", str(tmp_path))
    x, y = torch.randn(257), torch.randn(257)
    torch.testing.assert_close(kf.jit(f, target="cpu")(x, y), f(x, y))
    [meta] = list(tmp_path.rglob("program.json"))
    return cache.Entry(meta.parent, json.loads(meta.read_text())), x, y


def test_an_entry_loads_and_runs(tmp_path, monkeypatch):
    entry, x, y = _entry(tmp_path, monkeypatch)
    program = programs.load(entry, 0)
    assert isinstance(program, programs.CompiledProgram) and program.reached == []
    torch.testing.assert_close(program([x, y]), f(x, y))


def test_an_entry_naming_reached_tensors_the_call_lacks_is_refused(tmp_path, monkeypatch):
    entry, _, _ = _entry(tmp_path, monkeypatch)
    entry.meta["reached"] = [0]
    with pytest.raises(ValueError, match=r"reads reached tensors \[0\] of 0"):
        programs.load(entry, 0)


@pytest.mark.parametrize("n", [1, 13, 0])
def test_interpreted_program(n):
    x, y = torch.randn(n), torch.randn(n)
    fn = kf.jit(f, target="cpu", interpret=True)
    torch.testing.assert_close(fn(x, y), f(x, y))
    [program] = [p for p in fn._table.values()]
    assert isinstance(program, programs.InterpretedProgram)


def test_loading_imports_neither_the_compiler_nor_the_profiler(tmp_path):
    """A cache hit in a new process runs through programs.py alone."""
    script = textwrap.dedent(f"""
        import os, sys, torch, kf
        os.environ["KF_CACHE_DIR"] = {str(tmp_path)!r}
        def f(x):
            return torch.relu(x) * 2
        y = kf.jit(f, target="cpu")(torch.randn(7))
        print(sorted(m for m in ("mlir", "kf.profiler", "kf.capture", "kf.stages", "kf.passes") if m in sys.modules))
    """)
    run = lambda: subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, check=True).stdout
    run()  # compiles and stores
    assert run().strip() == "[]"


def _unique_of_empty(x):
    return (torch.unique(x, sorted=True, return_inverse=True, return_counts=True, dim=1),
            torch.unique_consecutive(x, return_inverse=True, return_counts=True, dim=1))


def _dtypes(result):
    return [(t.dtype, tuple(t.shape)) for part in result for t in part]


TARGETS = ["cpu", pytest.param("vulkan", marks=pytest.mark.skipif(
               not __import__("kf.runtime.vulkan", fromlist=["x"]).is_available(), reason="no Vulkan device")),
           pytest.param("cuda", marks=pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device"))]


@pytest.mark.parametrize("target", TARGETS)
def test_empty_results_keep_their_dtypes(target, tmp_path, monkeypatch):
    """torch.unique / unique_consecutive of a (5, 0, 5) tensor over its empty dim: a
    program of no kernels whose results are f32 (5, 0, 5) and two i64 (0,) (OpInfo
    unique#527 and unique_consecutive#263, which gave a float32 result 1 on an H100)."""
    monkeypatch.setenv("KF_CACHE_DIR", str(tmp_path))
    x = torch.zeros(5, 0, 5, device="cuda" if target == "cuda" else "cpu")
    f = kf.jit(_unique_of_empty, target=target)
    want = _dtypes(_unique_of_empty(x))
    for _ in range(3):  # the first call, then the dispatch table's entry
        assert _dtypes(f(x)) == want


def test_cuda_launcher_of_empty_results_without_a_device(tmp_path, monkeypatch):
    """The CUDA program of the same function, built here for sm_90a and run by the CUDA
    launcher's Python parts on CPU tensors (it has no kernels, so no device is needed):
    the general call, the matched call and its lane give the results' own dtypes."""
    from kf import driver
    from kf.runtime import programs as runtime_programs
    from kf.runtime.abi import ProgramABI
    from kf.signature import bind

    monkeypatch.setenv("KF_CACHE_DIR", str(tmp_path))
    x = torch.zeros(5, 0, 5)
    fn = kf.jit(_unique_of_empty, target="cuda")
    sig, tensors = bind(fn.fn, (x,), {})
    meta, _ = driver.build(fn.fn, sig, tensors, fn.options.with_(target="cuda"), "sm_90a")
    abi = ProgramABI.from_json(meta["abi"])
    assert not abi.kernels and [o.elem for o in abi.outputs] == ["f32", "i64", "i64", "f32", "i64", "i64"]

    class OnCpu(runtime_programs.CudaProgram):
        def __call__(self, *inputs, events=None):  # the general call, for CPU tensors
            return self._run(self._check(inputs, "cpu"), events)

    launcher = OnCpu(abi, str(tmp_path), meta)
    program = programs.CompiledProgram(launcher, programs._tuple_tree(json.loads(meta["output_tree"])), meta,
                                       tmp_path, "cuda")
    want = _dtypes(_unique_of_empty(x))
    assert _dtypes(program([x])) == want
    assert _dtypes(program.matched_call(True)([x])) == want
