"""compiler/logs.py: records of compiles, recompiles and the disk cache on the ``kf``
loggers; KF_LOGS; KF_ALWAYS_COMPILE and KF_DUMP_IR bypassing the cache in a new process."""

from __future__ import annotations

import logging
import os
import subprocess
import sys

import pytest
import torch

import kf
from kf import logs

SCALE = 2.0


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("KF_CACHE_DIR", str(tmp_path / "cache"))


def _messages(caplog, name: str) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == name]


def test_a_compile_and_each_recompile_say_what_and_why(caplog):
    global SCALE

    def scaled(x, k=2):
        return x * SCALE + k

    f = kf.jit(scaled, target="cpu", dynamic=False)  # each size its program (test_dynamic.py: one for all)
    caplog.set_level(logging.INFO, logger="kf")
    f(torch.randn(4, 8))
    compiled = _messages(caplog, "kf.compile")
    assert len(compiled) == 1 and "scaled(x: f32[4, 8]@cpu, k=2) for cpu" in compiled[0]
    assert not _messages(caplog, "kf.recompiles")
    f(torch.randn(4, 8))  # the dispatch table: no record
    assert len(_messages(caplog, "kf.compile")) == 1
    f(torch.randn(4, 9))
    f(torch.randn(4, 9, dtype=torch.float64))
    f(torch.randn(4, 9), 2.0)
    f(torch.randn(9, 4).t())
    SCALE = 3.0
    try:
        f(torch.randn(4, 9))
    finally:
        SCALE = 2.0
    assert _messages(caplog, "kf.recompiles") == [
        "scaled: argument 'x': shape [4, 8] -> [4, 9]",
        "scaled: argument 'x': dtype f32 -> f64",
        "scaled: argument 'k' was the constant 2, now a float read at run time",
        "scaled: argument 'x': contiguous -> strided",
        "scaled: what it reads besides its arguments changed: SCALE",
    ]
    assert len(_messages(caplog, "kf.compile")) == 6


def test_slow_compiles_log_their_stages(caplog, monkeypatch):
    monkeypatch.setattr(logs, "PROGRESS_AFTER", 0.0)
    caplog.set_level(logging.INFO, logger="kf.compile")
    kf.jit(lambda x: x.relu() + 1, target="cpu")(torch.randn(5))
    stages = [m for m in _messages(caplog, "kf.compile") if " took " in m]
    assert any("capture took" in m for m in stages) and any("kf-fuse" in m or "kf-canonicalize" in m for m in stages)


def test_kf_logs_names_the_channels(monkeypatch):
    for logger in logs.CHANNELS.values():
        monkeypatch.setattr(logger, "level", logging.NOTSET)
    logs.configure("compile,+cache")
    assert logs.compile_log.level == logging.INFO and logs.cache_log.level == logging.DEBUG
    assert logs.recompile_log.level == logging.NOTSET
    with pytest.warns(UserWarning, match="unknown log 'compiles'; known: compile, cache, recompiles"):
        logs.configure("compiles")


_PROGRAM = """
import torch, kf
kf.jit(lambda x: torch.tanh(x) * 3, target="cpu")(torch.randn(7))
"""


def _run(env: dict) -> str:
    done = subprocess.run([sys.executable, "-c", _PROGRAM], capture_output=True, text=True, timeout=600,
                          env={**os.environ, "KF_LOGS": "compile,cache", **env})
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stderr


def test_a_new_process_loads_from_the_cache_unless_told_not_to(tmp_path):
    env = {"KF_CACHE_DIR": str(tmp_path / "c")}
    assert "[kf.compile] compiled <lambda>(x: f32[7]@cpu) for cpu" in _run(env)
    hit = _run(env)
    assert "[kf.cache] <lambda>(x: f32[7]@cpu): loaded from the disk cache" in hit and "compiled" not in hit
    again = _run({**env, "KF_ALWAYS_COMPILE": "1"})
    assert "KF_ALWAYS_COMPILE is set" in again and "[kf.compile] compiled <lambda>" in again
    dumped = _run({**env, "KF_DUMP_IR": str(tmp_path / "ir")})
    assert "the IR is dumped" in dumped and "[kf.compile] compiled <lambda>" in dumped
    assert any(name.endswith(".kf.mlir") for name in os.listdir(tmp_path / "ir"))
