"""IR at every step for every target (KF_DUMP_IR / dump_ir: numbered files, one series
per function, ending in the target's own text: .ptx, .spvasm, .metal), and the
interpreter agreeing with the compiled kernels on the CPU and Vulkan."""

import re
import shutil

import pytest
import torch

import kf
import moe
import seed_examples as se
from kf.runtime import vulkan

needs_vulkan = pytest.mark.skipif(not vulkan.is_available(), reason="no Vulkan device")


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("KF_CACHE_DIR", str(tmp_path / "cache"))


def _series(folder, name):
    files = sorted(p.name for p in folder.iterdir() if p.name.startswith(name + "."))
    numbers = [int(re.match(rf"{re.escape(name)}\.(\d+)\.", f).group(1)) for f in files]
    assert numbers == list(range(1, len(files) + 1)), files  # numbered in order, none missing
    return files


def _stage_of(file):
    return file.split(".", 2)[2].rsplit(".", 1)[0]


@needs_vulkan
def test_vulkan_dump_has_every_pass_then_spirv(tmp_path, monkeypatch):
    monkeypatch.setenv("KF_DUMP_IR", str(tmp_path / "ir"))
    x, w, b = torch.randn(4, 64), torch.randn(64), torch.randn(64)
    se.metal_layer_norm.with_options(target="vulkan")(x, w, b)
    files = _series(tmp_path / "ir", "metal_layer_norm")
    stages = [_stage_of(f) for f in files]
    assert stages[:3] == ["kf", "kf-widen-integers", "kf-canonicalize"]
    order = [next(i for i, s in enumerate(stages) if s.startswith(p))
             for p in ("kf-fuse", "kf-tile", "kf-map-to-gpu", "kf-vectorize")]
    assert order == sorted(order)  # the GPU pipeline's passes, in pipeline order
    assert files[-1].endswith(".spirv.spvasm")
    fused = (tmp_path / "ir" / files[order[0]]).read_text()
    assert 'kf.kernel = "rowwise"' in fused and "seed_examples.py" in fused  # locations kept
    gpu = next(f for f in files if "kf-map-to-gpu" in f)
    assert "gpu.func @metal_layer_norm_k0_rowwise" in (tmp_path / "ir" / gpu).read_text()


@needs_vulkan
def test_dump_ir_option_writes_one_series_per_function(tmp_path):
    d = tmp_path / "ir"
    f = kf.jit(lambda x: torch.softmax(x, -1), target="vulkan", dump_ir=str(d))
    g = kf.jit(se.metal_layer_norm.fn, target="vulkan", dump_ir=str(d))
    f(torch.randn(4, 32))
    g(torch.randn(4, 32), torch.randn(32), torch.randn(32))
    assert _series(d, "metal_layer_norm") and _series(d, "<lambda>")


def a_function_named_at_length_as_the_backwards_kf_derives(x):
    return torch.softmax(x, -1) * 2


@needs_vulkan
def test_dump_file_names_stay_within_the_file_system_limit(tmp_path):
    """kf-tile's and kf-map-to-gpu's options on Vulkan (the device's limits) are longer
    than a file name may be: the file keeps the pass's name and a hash of its options."""
    d = tmp_path / "ir"
    fn = a_function_named_at_length_as_the_backwards_kf_derives
    kf.jit(fn, target="vulkan", dump_ir=str(d))(torch.randn(4, 32))
    files = _series(d, fn.__name__)
    passes = [_stage_of(f) for f in files if _stage_of(f).startswith(("kf-tile", "kf-map-to-gpu"))]
    assert len(passes) == 2 and all(re.fullmatch(r"kf-(tile|map-to-gpu)_[0-9a-f]{8}", p) for p in passes), passes
    assert all(len(f.encode()) <= 255 for f in files)


def test_metal_and_cuda_dumps_end_in_their_target_text(tmp_path):
    x = torch.randn(256)
    fn = lambda x: torch.tanh(x) * 2  # noqa: E731
    if shutil.which("spirv-cross"):
        kf.inspect(kf.metal_shader(fn, dump_ir=str(tmp_path / "metal")), x).stages
        files = _series(tmp_path / "metal", "<lambda>")
        assert files[-2].endswith(".spirv.spvasm") and files[-1].endswith(".msl.metal")
        assert "kernel void" in (tmp_path / "metal" / files[-1]).read_text()
    kf.inspect(kf.cuda_kernel(fn, dump_ir=str(tmp_path / "cuda")), x).stages
    files = _series(tmp_path / "cuda", "<lambda>")
    assert files[-1].endswith(".ptx.ptx") and ".entry lambda_k0_elementwise" in (tmp_path / "cuda" / files[-1]).read_text()


def attention_like(q, k, v):
    s = torch.matmul(q, k.transpose(-2, -1)) * 0.125
    return torch.matmul(torch.softmax(s, dim=-1), v)


def gelu_mlp(x, w1, w2):
    return torch.matmul(torch.nn.functional.gelu(torch.matmul(x, w1)), w2)


def norm_and_stats(x):
    m = x.mean(-1, keepdim=True)
    v = ((x - m) ** 2).mean(-1, keepdim=True)
    return (x - m) * torch.rsqrt(v + 1e-5), x.amax(0)


CASES = [
    (attention_like, lambda: [torch.randn(1, 2, 33, 16) for _ in range(3)]),
    (gelu_mlp, lambda: [torch.randn(9, 40), torch.randn(40, 24) / 6, torch.randn(24, 8) / 5]),
    (norm_and_stats, lambda: [torch.randn(6, 130)]),
    (se.metal_layer_norm.fn, lambda: [torch.randn(3, 1000), torch.randn(1000), torch.randn(1000)]),
]


@pytest.mark.parametrize("target", ["cpu", pytest.param("vulkan", marks=needs_vulkan)])
@pytest.mark.parametrize("fn,make", CASES, ids=[c[0].__name__ for c in CASES])
def test_interpreter_agrees_with_compiled_kernels(fn, make, target):
    torch.manual_seed(0)
    args = make()
    compiled = kf.jit(fn, target=target)(*args)
    interpreted = kf.jit(fn, target=target, interpret=True)(*args)
    torch.testing.assert_close(interpreted, compiled, atol=2e-4, rtol=2e-4)


@pytest.mark.parametrize("target", ["cpu", pytest.param("vulkan", marks=needs_vulkan)])
def test_kf_interpret_env_runs_the_interpreter_for_moe(target, monkeypatch):
    x, gate = torch.randn(1, 9, 64), torch.randn(4, 64)
    w = [torch.randn(4, 64, 96) / 8, torch.randn(4, 96, 64) / 10]
    f = moe.moe_layer_fused.with_options(target=target)
    compiled = f(x, gate, w)
    monkeypatch.setenv("KF_INTERPRET", "1")
    g = moe.moe_layer_fused.with_options(target=target)
    interpreted = g(x, gate, w)
    (program,) = g._table.values()
    assert type(program).__name__ == "InterpretedProgram"
    torch.testing.assert_close(interpreted, compiled, atol=2e-4, rtol=2e-4)
