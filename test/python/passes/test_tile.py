"""kf-tile (passes/tile.py): on SPIR-V, plans follow the device's limits (``limits``,
DeviceLimits) -- the recorded lavapipe and NVIDIA H200 (test/python/devices/) against the
defaults -- and the SPIR-V of each validates (spirv-val); kernel variants are options
``<kind>.<field>=<value>``."""

from __future__ import annotations

import dataclasses
import shutil

import pytest
import torch

import kf
import seed_examples as se
from kf.dialects import make_context
from kf.passes import registry
from kf.passes.base import PassError
from kf.passes.strategies.base import variant_from_text, variants_by_kind
from kf.passes.strategies.matmul import MatmulVariant
from kf.passes.tile import TilePass, attr_to_plan
from kf.runtime.abi import DeviceLimits, ProgramABI
from kf.signature import bind
from mlir import ir

needs_spirv_val = pytest.mark.skipif(shutil.which("spirv-val") is None, reason="spirv-val not installed")


def layer_norm(rows: int, cols: int) -> str:
    """The seed's layer norm as kf-fuse leaves it: one rowwise kernel function."""
    x, r = f"tensor<{rows}x{cols}xf32>", f"tensor<{rows}x1xf32>"
    w = f"tensor<{cols}xf32>"
    return f"""
func.func private @ln(%x: {x}, %w: {w}, %b: {w}) -> {x} attributes {{kf.kernel = "rowwise"}} {{
  %eps = "kf.fill"() {{value = 1.0e-05 : f64}} : () -> tensor<f32>
  %mean = "kf.mean"(%x) {{dims = array<i64: 1>, keepdim = true}} : ({x}) -> {r}
  %var = "kf.var"(%x) {{correction = 1.0 : f64, dims = array<i64: 1>, keepdim = true}} : ({x}) -> {r}
  %d = "kf.sub"(%x, %mean) : ({x}, {r}) -> {x}
  %ve = "kf.add"(%var, %eps) : ({r}, tensor<f32>) -> {r}
  %s = "kf.sqrt"(%ve) : ({r}) -> {r}
  %n = "kf.div"(%d, %s) : ({x}, {r}) -> {x}
  %m = "kf.mul"(%w, %n) : ({w}, {x}) -> {x}
  %o = "kf.add"(%m, %b) : ({x}, {w}) -> {x}
  return %o : {x}
}}"""


def attention(seq: int, d: int) -> str:
    t, tt, s = f"tensor<1x2x{seq}x{d}xf32>", f"tensor<1x2x{d}x{seq}xf32>", f"tensor<1x2x{seq}x{seq}xf32>"
    return f"""
func.func private @attn(%q: {t}, %k: {t}, %v: {t}) -> {t} attributes {{kf.kernel = "attention"}} {{
  %c = "kf.fill"() {{value = 8.0 : f64}} : () -> tensor<f32>
  %kt = "kf.transpose"(%k) {{perm = array<i64: 0, 1, 3, 2>}} : ({t}) -> {tt}
  %s = "kf.matmul"(%q, %kt) : ({t}, {tt}) -> {s}
  %d = "kf.div"(%s, %c) : ({s}, tensor<f32>) -> {s}
  %p = "kf.softmax"(%d) {{dim = -1 : i64}} : ({s}) -> {s}
  %o = "kf.matmul"(%p, %v) : ({s}, {t}) -> {t}
  return %o : {t}
}}"""


def plan(text: str, limits: str = "") -> dict:
    ctx = make_context()
    with ctx:
        m = ir.Module.parse(text)
        TilePass(target="spirv", limits=limits).run(m.operation)
        f = next(op.operation for op in m.body.operations)
        return attr_to_plan(f.attributes["kf.plan"])


@pytest.fixture
def devices(recorded_device):
    return {"default": "", "lavapipe": DeviceLimits.from_vulkan(recorded_device("lavapipe")).spec(),
            "nvidia": DeviceLimits.from_vulkan(recorded_device("nvidia-h200")).spec()}


def test_default_limits_are_the_plans_without_limits():
    for text in (layer_norm(16, 8192), layer_norm(5, 31), attention(130, 128)):
        assert plan(text) == plan(text, DeviceLimits().spec())


def test_rowwise_follows_workgroup_memory_and_subgroups(devices):
    """A 32 KiB row (8192 f32) is cached in workgroup memory where it fits beside the
    reduction scratch (NVIDIA's 48 KiB, not lavapipe's 32 KiB nor the default 16 KiB);
    reductions are subgroup shuffles where the device has them and a subgroup's
    partials are enough (NVIDIA's 32 lanes: any workgroup; lavapipe's 8: up to 64
    threads), else a tree in workgroup memory."""
    long = {name: plan(layer_norm(16, 8192), spec) for name, spec in devices.items()}
    assert [long[n]["cache_row"] for n in devices] == [False, False, True]
    assert [long[n]["reduction"] for n in devices] == ["tree", "tree", "shuffle"]
    assert long["nvidia"]["scratch_bytes"] == 2 * 32 * 4 and long["nvidia"]["threads"] == 256
    short = {name: plan(layer_norm(5, 200), spec) for name, spec in devices.items()}  # 50 vectors: 64 threads
    assert [short[n]["threads"] for n in devices] == [64, 64, 64]
    assert [short[n]["reduction"] for n in devices] == ["tree", "shuffle", "shuffle"]


def test_attention_tiles_grow_with_workgroup_memory(devices):
    plans = {name: plan(attention(130, 128), spec) for name, spec in devices.items()}
    tiles = {n: (p["block_m"], p["block_n"]) for n, p in plans.items()}
    assert tiles == {"default": (16, 8), "lavapipe": (32, 16), "nvidia": (32, 32)}
    for name, p in plans.items():
        limit = DeviceLimits.parse(devices[name]).shared_bytes if devices[name] else 16384
        assert p["shared_bytes"] <= limit


def test_malformed_limits_are_a_pass_error():
    with make_context():
        m = ir.Module.parse(layer_norm(4, 64))
        with pytest.raises(PassError, match="device limits 'shared=1' must give exactly"):
            TilePass(target="spirv", limits="shared=1").run(m.operation)


def compiled(fn, spec: str, *args) -> ProgramABI:
    """The program ABI of fn compiled for vulkan with the device limits spec (not run)."""
    f = kf.jit(fn, target="vulkan", arch=spec)
    sig, tensors = bind(f.fn, args, {})
    program, _ = f.specialize(sig, tensors)
    return ProgramABI.from_json(program.meta["abi"])


@needs_spirv_val
@pytest.mark.parametrize("device", ["lavapipe", "nvidia-h200"])
def test_spirv_for_each_device_validates(device, recorded_device, tmp_path, monkeypatch):
    """Compiled for a recorded device (``arch`` of a vulkan function is a limits text),
    the seed's layer norm and attention and a softmax go through spirv-val (kf-to-spirv
    runs it), with workgroup memory within the device's and, on NVIDIA, the layer
    norm's reductions as subgroup shuffles for its 32 lanes."""
    monkeypatch.setenv("KF_CACHE_DIR", str(tmp_path))
    spec = DeviceLimits.from_vulkan(recorded_device(device)).spec()
    limits = DeviceLimits.parse(spec)
    x, w, q = torch.randn(16, 8192), torch.randn(8192), torch.randn(1, 2, 130, 128)
    programs = {"layer norm": compiled(se.metal_layer_norm.fn, spec, x, w, w),
                "attention": compiled(se.fused_attention.fn, spec, q, q, q),
                "softmax": compiled(lambda t: torch.softmax(t, -1), spec, torch.randn(7, 1000))}
    for name, abi in programs.items():
        for k in abi.kernels:
            assert 0 < k.extra["workgroup_bytes"] <= limits.shared_bytes, (name, k.entry)
            assert k.extra["subgroup_size"] in (0, limits.subgroup_size)
    [ln] = programs["layer norm"].kernels
    shuffles = "GroupNonUniformShuffle" in ln.extra["spirv_capabilities"]
    assert shuffles == (device == "nvidia-h200") and ln.extra["subgroup_size"] == (32 if shuffles else 0)
    if device == "nvidia-h200":
        assert ln.extra["workgroup_bytes"] > 8192 * 4  # the row, cached


def test_lit_test_names_the_recorded_devices(devices):
    """test/passes/kf-tile-limits.mlir runs kf-tile with the recorded devices' limits."""
    import pathlib

    text = (pathlib.Path(__file__).parents[2] / "passes" / "kf-tile-limits.mlir").read_text()
    assert f"limits={devices['lavapipe']}}}" in text and f"limits={devices['nvidia']}}}" in text


def test_variants_are_options_and_round_trip():
    p = registry.create("kf-tile", {"target": "cuda", "matmul.stages": "3", "attention.reverse_q_blocks": "false"})
    assert isinstance(p, TilePass) and p.target == "cuda"
    assert p.variants == (("attention.reverse_q_blocks", "false"), ("matmul.stages", "3"))
    assert p.textual() == "kf-tile{attention.reverse_q_blocks=false matmul.stages=3}"
    assert TilePass().textual() == "kf-tile" and TilePass(chip="sm_80").textual() == "kf-tile{chip=sm_80}"
    assert dataclasses.replace(p, chip="sm_80").textual() == \
        "kf-tile{chip=sm_80 attention.reverse_q_blocks=false matmul.stages=3}"
    by_kind = variants_by_kind(dict(p.variants))
    assert by_kind["matmul"] == MatmulVariant(stages=3) and by_kind["attention"].reverse_q_blocks is False


def test_variant_values_from_text():
    v = variant_from_text(MatmulVariant, {"warp_tiles": "4,4", "group_m": "0"})
    assert v == MatmulVariant(warp_tiles=(4, 4), group_m=0)
    for fields, message in (({"stage": "2"}, "no variant 'stage'"), ({"stages": "2.5"}, "takes an int"),
                            ({"warp_tiles": "4x4"}, "takes ints like 4,8")):
        with pytest.raises(ValueError, match=message):
            variant_from_text(MatmulVariant, fields)
    with pytest.raises(ValueError, match="'transpose' have no variants"):
        variants_by_kind({"transpose.items": "2"})
    with pytest.raises(ValueError, match="items_per_thread"):
        variants_by_kind({"elementwise.items_per_thread": "0"})
