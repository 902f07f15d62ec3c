"""The driver (compiler/driver.py) walks the target's stage table, in its order, and
turns what escapes a stage into one CompileError at the user's function."""

import os

import pytest
import torch

import kf
from kf import targets
from kf.errors import CompileError


def f(x):
    return torch.relu(x) * 2


def _wrapped(monkeypatch, target, change):
    """The target's stage table with ``change(name, stage)`` applied to each stage."""
    real = target.stages
    monkeypatch.setattr(target, "stages", lambda: {n: change(n, s) for n, s in real().items()})
    return list(real())


@pytest.mark.parametrize("target", [targets.CPU, targets.VULKAN])
def test_build_walks_the_stage_table(target, monkeypatch, tmp_path):
    monkeypatch.setenv("KF_CACHE_DIR", str(tmp_path))
    ran = []

    def record(name, stage):
        def run(b):
            ran.append(name)
            stage(b)
        return run

    order = _wrapped(monkeypatch, target, record)
    x = torch.randn(257)
    if target.is_gpu:
        from kf.driver import build
        from kf.guards import walk
        from kf.options import Options
        from kf.signature import bind

        sig, tensors = bind(f, (x,), {})
        options = Options(target=target.name, arch="")
        meta, artifacts = build(f, sig, tensors, options, "", reads=walk(f))
        assert meta["name"] == "f" and artifacts
    else:
        torch.testing.assert_close(kf.jit(f, target=target.name)(x), f(x))
    assert ran == order


@pytest.mark.parametrize("failing, message", [("capture", "internal compiler error during capture"),
                                              ("llvm", "internal compiler error")])
def test_a_bug_in_a_stage_is_a_compile_error(failing, message, monkeypatch, tmp_path):
    """An exception a stage raises (a bug in kf) reaches the user as a CompileError at
    their function, with the IR saved once there is IR."""
    monkeypatch.setenv("KF_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("KF_DEBUG", raising=False)

    def broken(name, stage):
        if name != failing:
            return stage

        def run(b):
            raise RuntimeError("a bug")
        return run

    _wrapped(monkeypatch, targets.CPU, broken)
    with pytest.raises(CompileError, match=message) as e:
        kf.jit(f, target="cpu")(torch.randn(3))
    assert "RuntimeError: a bug" in str(e.value)
    assert e.value.loc is not None and e.value.loc.file == __file__
    if failing != "capture":
        assert e.value.reproducer and os.path.exists(e.value.reproducer)
