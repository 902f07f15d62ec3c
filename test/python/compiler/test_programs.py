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
