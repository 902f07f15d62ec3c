"""Every kind of failure between capture and launch is a kf.CompileError at the user's
line: file, line, source snippet, stage, one line of cause and, for passes and back
ends, a reproducer .mlir with the kf-opt command that fails on it; kf's own frames are
hidden from the traceback unless KF_DEBUG=1.

Failures kf does not produce by itself are planted: a pass monkeypatched to fail or to
write invalid IR, PTX and SPIR-V corrupted on their way to ptxas, spirv-val and
SPIRV-Cross (through the same calls the driver makes)."""

import array
import dataclasses
import os
import shutil
import traceback

import pytest
import torch
from mlir import ir

import kf
from kf.passes import base as pass_base
from kf.passes import canonicalize, lower_to_linalg


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("KF_CACHE_DIR", str(tmp_path))
    monkeypatch.delenv("KF_DEBUG", raising=False)


def _kf_frames(e: BaseException) -> list[str]:
    """Frames of the traceback in kf's compiler internals (its API's entry points aside)."""
    root = os.path.dirname(os.path.dirname(kf.__file__))
    internal = [os.path.join(root, d) for d in ("passes", "dialects")] + [
        os.path.join(os.path.dirname(kf.__file__), m) for m in
        ("capture.py", "aten_to_kf.py", "aten", "stages.py", "gpu_codegen.py", "cpu_codegen.py", "interpreter.py")]
    return [f.filename for f in traceback.extract_tb(e.__traceback__)
            if any(f.filename.startswith(p) for p in internal)]


def _line_of(fn, text: str) -> int:
    import inspect

    lines, start = inspect.getsourcelines(fn)
    return start + next(i for i, ln in enumerate(lines) if text in ln)


def _first_kf_op(module: ir.Operation) -> ir.Operation:
    for f in module.regions[0].blocks[0].operations:
        for op in f.operation.regions[0].blocks[0].operations:
            if op.operation.name.startswith("kf."):
                return op.operation
    raise AssertionError("no kf op")


# ----------------------------------------------------------------------------- capture


def uses_airy_ai(x):
    y = x * 2
    return torch.special.airy_ai(y)


def test_unsupported_op_at_the_users_line_without_kf_frames():
    f = kf.jit(uses_airy_ai, target="vulkan")
    with pytest.raises(kf.UnsupportedOpError) as e:
        f(torch.randn(8))
    err = e.value
    assert err.loc.file == __file__ and err.loc.line == _line_of(uses_airy_ai, "torch.special.airy_ai")
    text = str(err)
    assert "aten.special_airy_ai" in text and f'File "{__file__}", line {err.loc.line}' in text
    assert "return torch.special.airy_ai(y)" in text and "stage: capture" in text and "cause:" in text
    assert _kf_frames(err) == []
    assert err.__cause__ is None and err.__suppress_context__
    # the traceback goes from the user's call to the decorated function's __call__ only
    frames = [(os.path.basename(f.filename), f.name) for f in traceback.extract_tb(err.__traceback__)
              if f.filename != __file__ and "_pytest" not in f.filename and "pluggy" not in f.filename]
    assert frames == [("api.py", "__call__")]


def test_kf_debug_keeps_the_compilers_frames(monkeypatch):
    monkeypatch.setenv("KF_DEBUG", "1")
    with pytest.raises(kf.UnsupportedOpError) as e:
        kf.jit(uses_airy_ai, target="vulkan")(torch.randn(8))
    assert any(p.endswith("capture.py") for p in _kf_frames(e.value))


def planted_ill_typed(x):
    return torch.tanh(x) + 1


def ill_typed_two(x, y):
    return torch.tanh(x) + 1, y * 2


def test_verifier_error_at_capture(monkeypatch):
    """A conversion that builds an ill-typed kf op (tanh of a [3] tensor declared to give
    [8], which is what torch expects of the node) is caught by kf's verifier at the
    user's line."""
    from kf import aten_to_kf

    convert = aten_to_kf.Converter.convert

    def wrong(self, node, env):
        value = convert(self, node, env)
        if "tanh" in str(node.target):
            y = next(v for n, v in env.items() if getattr(n, "op", "") == "placeholder" and n is not node.args[0])
            return ir.Operation.create("kf.tanh", results=[value.type], operands=[y]).result
        return value

    monkeypatch.setattr(aten_to_kf.Converter, "convert", wrong)
    with pytest.raises(kf.KfVerifyError) as e:
        kf.jit(ill_typed_two, target="cpu")(torch.randn(8), torch.randn(3))
    err = e.value
    assert err.loc is not None and err.loc.file == __file__ and err.loc.line == _line_of(ill_typed_two, "torch.tanh")
    assert "stage: verify" in str(err) and "kf.tanh" in str(err)
    assert _kf_frames(err) == []


def test_pass_writing_invalid_ir_is_a_verifier_failure_of_that_pass(monkeypatch):
    """MLIR verifies after every pass: a pass that leaves a wrongly typed result is named."""
    def corrupt(self, module):
        ret = next(op.operation for f in module.regions[0].blocks[0].operations
                   for op in f.operation.regions[0].blocks[0].operations if op.operation.name == "func.return")
        op = ret.operands[0].owner
        with ir.InsertionPoint(op), op.location:
            bad = ir.RankedTensorType.get([1], ir.F32Type.get())
            new = ir.Operation.create("kf.neg", results=[bad], operands=[op.operands[0]])
        op.results[0].replace_all_uses_with(new.results[0])
        op.erase()

    monkeypatch.setattr(canonicalize.CanonicalizePass, "run", corrupt)
    with pytest.raises(kf.PassFailedError) as e:
        kf.jit(planted_ill_typed, target="cpu")(torch.randn(8))
    err = e.value
    assert err.stage == "kf-canonicalize" and err.loc.file == __file__
    assert err.reproducer and os.path.exists(err.reproducer) and "kf-canonicalize" in err.command
    assert "\n" not in err.cause and "func.func" not in str(err)  # the IR is in the file, not the message


# ----------------------------------------------------------------------------- passes


def two_lines(x):
    y = torch.exp(x)
    return y * 3


def test_a_failing_pass_names_pass_line_and_reproducer(monkeypatch, tmp_path):
    def fail(self, module):
        raise pass_base.PassError("planted failure", _first_kf_op(module).location)

    monkeypatch.setattr(lower_to_linalg.LowerToLinalgPass, "run", fail)
    with pytest.raises(kf.PassFailedError) as e:
        kf.jit(two_lines, target="cpu")(torch.randn(8))
    err = e.value
    text = str(err)
    assert err.loc.line == _line_of(two_lines, "torch.exp") and "y = torch.exp(x)" in text
    assert f'line {err.loc.line}, in two_lines' in text
    assert "pass kf-lower-to-linalg failed" in text and "planted failure" in err.cause
    assert _kf_frames(err) == []
    source = open(err.reproducer).read()
    assert "kf.exp" in source and "kf.exp" not in text
    # The command fails on the reproducer while the pass is broken and passes once fixed.
    from kf.tools import kf_opt

    args = [err.reproducer, "--pass-pipeline=builtin.module(kf-lower-to-linalg)", "-o", str(tmp_path / "o.mlir")]
    assert err.command.startswith(f"kf-opt {err.reproducer} --pass-pipeline=")
    assert kf_opt.main(args) != 0
    monkeypatch.undo()
    assert kf_opt.main(args) == 0


def test_the_reproducer_of_a_later_pass_is_that_pass_s_input(monkeypatch, tmp_path):
    """A pass deep in the GPU pipeline fails: its reproducer holds what the passes before it
    wrote (the kernels kf-map-to-gpu made), and the command fails on it the same way."""
    from kf.passes import promote_shared

    def fail(self, module):
        raise pass_base.PassError("planted failure", module.location)

    monkeypatch.setattr(promote_shared.PromoteSharedPass, "run", fail)
    with pytest.raises(kf.PassFailedError) as e:
        kf.jit(two_lines, target="vulkan")(torch.randn(8))
    err = e.value
    assert err.stage == "kf-promote-shared" and "planted failure" in err.cause
    source = open(err.reproducer).read()
    assert "gpu.func" in source and "kf.exp" not in source
    from kf.tools import kf_opt

    args = [err.reproducer, "--pass-pipeline=builtin.module(kf-promote-shared)", "-o", str(tmp_path / "o.mlir")]
    assert kf_opt.main(args) != 0
    monkeypatch.undo()
    assert kf_opt.main(args) == 0


def test_a_crashing_pass_is_a_pass_failure_with_one_line_of_cause(monkeypatch):
    def crash(self, module):
        raise ZeroDivisionError("planted crash")

    monkeypatch.setattr(lower_to_linalg.LowerToLinalgPass, "run", crash)
    with pytest.raises(kf.PassFailedError) as e:
        kf.jit(two_lines, target="cpu")(torch.randn(8))
    assert "ZeroDivisionError: planted crash" in e.value.cause and "\n" not in e.value.cause
    assert "Traceback" not in str(e.value)


def test_internal_errors_outside_passes_are_compile_errors(monkeypatch):
    from kf import gpu_codegen

    def broken(*a, **k):
        raise KeyError("planted")

    monkeypatch.setattr(gpu_codegen, "schedule_abi", broken)
    with pytest.raises(kf.CompileError) as e:
        kf.jit(two_lines, target="vulkan")(torch.randn(8))
    assert "internal compiler error" in str(e.value) and "KeyError" in e.value.cause
    assert e.value.loc.line == two_lines.__code__.co_firstlineno and os.path.exists(e.value.reproducer)


def test_a_crash_in_capture_is_an_internal_compile_error(monkeypatch):
    from kf import aten_to_kf

    def crash(self, node, env):
        raise IndexError("planted")

    monkeypatch.setattr(aten_to_kf.Converter, "convert", crash)
    with pytest.raises(kf.CompileError) as e:
        kf.jit(two_lines, target="cpu")(torch.randn(8))
    assert "internal compiler error during capture" in str(e.value) and "IndexError: planted" in e.value.cause
    assert e.value.loc.function == "two_lines" and _kf_frames(e.value) == []
    monkeypatch.setenv("KF_DEBUG", "1")
    with pytest.raises(IndexError):
        kf.jit(two_lines, target="cpu")(torch.randn(8))


# ----------------------------------------------------------------------------- back ends


def fused_lines(x):
    return torch.tanh(x) * 2 + 1


@pytest.mark.skipif(shutil.which("ptxas") is None and not os.path.exists("/usr/local/cuda/bin/ptxas"),
                    reason="needs ptxas")
def test_ptxas_rejecting_the_ptx(monkeypatch):
    from kf.passes import to_cuda

    compile_to_ptx = to_cuda.compile_to_ptx

    def bad_ptx(module, **options):
        return {name: ptx.replace("ret;", "bogus.instruction %r1;\n\tret;", 1)
                for name, ptx in compile_to_ptx(module, **options).items()}

    monkeypatch.setattr(to_cuda, "compile_to_ptx", bad_ptx)
    with pytest.raises(to_cuda.CudaCompileError) as e:
        kf.inspect(kf.cuda_kernel(fused_lines), torch.randn(64)).stages
    err = e.value
    assert isinstance(err, kf.TargetError) and err.stage == "kf-to-cuda (ptxas)"
    assert err.loc.file == __file__ and err.loc.line == _line_of(fused_lines, "torch.tanh")
    assert "\n" not in err.cause and "kept:" in err.cause and ".ptx" in err.cause
    assert err.reproducer.endswith(".mlir") and "gpu.module" in open(err.reproducer).read()
    assert "kf-to-cuda{chip=" in err.command
    assert _kf_frames(err) == []
    # The command is runnable as printed: on the saved gpu-stage IR it compiles (the
    # corruption was planted after kf-to-cuda).
    monkeypatch.undo()
    assert _run_command(err.command) == 0


def _run_command(command: str) -> int:
    """Run a reproducer's ``kf-opt`` command in this process (kf-opt's own main)."""
    import shlex

    from kf.tools import kf_opt

    argv = shlex.split(command)
    assert argv[0] == "kf-opt"
    return kf_opt.main(argv[1:] + ["-o", os.devnull])


def _corrupt(binaries, keep=2 / 3):
    out = []
    for b in binaries:
        words = array.array("I", b.binary)
        out.append(dataclasses.replace(b, binary=words[: int(len(words) * keep)].tobytes()))
    return out


@pytest.mark.skipif(shutil.which("spirv-cross") is None, reason="needs spirv-cross")
def test_spirv_cross_rejecting_the_spirv(monkeypatch):
    from kf.passes import to_spirv

    compile_spirv = to_spirv.compile_spirv
    monkeypatch.setattr(to_spirv, "compile_spirv", lambda m, *a, **k: _corrupt(compile_spirv(m, *a, **k)))
    with pytest.raises(kf.TargetError) as e:
        kf.inspect(kf.metal_shader(fused_lines), torch.randn(64)).stages
    err = e.value
    assert "SPIRV-Cross" in err.stage and "spirv-cross failed" in err.cause and "\n" not in err.cause
    assert err.loc.line == _line_of(fused_lines, "torch.tanh")
    assert "builtin.module(kf-to-spirv, kf-to-metal)" in err.command and os.path.exists(err.reproducer)
    monkeypatch.undo()
    assert _run_command(err.command) == 0


@pytest.mark.skipif(shutil.which("spirv-val") is None, reason="needs spirv-val")
def test_spirv_val_rejecting_the_spirv(monkeypatch):
    from kf.passes import to_spirv

    compile_spirv = to_spirv.compile_spirv

    def validated_bad(m, *a, **k):
        out = _corrupt(compile_spirv(m, *a, **k), keep=0.9)
        for b in out:
            to_spirv.validate(b.binary, b.name)
        return out

    monkeypatch.setattr(to_spirv, "compile_spirv", validated_bad)
    with pytest.raises(kf.TargetError) as e:
        kf.jit(fused_lines, target="vulkan")(torch.randn(64))
    err = e.value
    assert err.stage == "kf-to-spirv (spirv-val)" and "spirv-val rejected" in err.cause
    assert "kept:" in err.cause and err.loc.file == __file__
    assert _kf_frames(err) == []
