"""The seed's functions compiled for the GPU path and run by Vulkan (Mesa's lavapipe in
CI), against torch eager on fresh random inputs, at sizes that are not multiples of the
tile sizes and with batch 1."""

import pytest
import torch

import moe
import seed_examples as se
from kf.runtime import vulkan

pytestmark = pytest.mark.skipif(not vulkan.is_available(), reason="no Vulkan device (install mesa-vulkan-drivers)")


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("KF_CACHE_DIR", str(tmp_path))


def _rel(out, ref):
    return ((out.double() - ref.double()).norm() / ref.double().norm()).item()


@pytest.mark.parametrize("shape", [(1, 3, 1000), (2, 257), (1, 64, 1024)])
@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.float16, 2e-3), (torch.bfloat16, 1e-2)])
def test_seed_layer_norm(shape, dtype, tol):
    x = torch.randn(*shape, dtype=dtype)
    w, b = torch.randn(shape[-1], dtype=dtype), torch.randn(shape[-1], dtype=dtype)
    out = se.metal_layer_norm.with_options(target="vulkan")(x, w, b)
    assert out.dtype == dtype and out.shape == x.shape
    assert _rel(out, se.metal_layer_norm.fn(x.double(), w.double(), b.double())) < tol


@pytest.mark.parametrize("seq,masked", [(257, False), (257, True), (64, True)])
def test_seed_attention(seq, masked):
    q, k, v = (torch.randn(1, 2, seq, 64) for _ in range(3))
    mask = (torch.rand(seq, seq) > 0.25).float() if masked else None
    out = se.fused_attention.with_options(target="vulkan")(q, k, v, mask)
    ref = se.fused_attention.fn(q.double(), k.double(), v.double(), None if mask is None else mask.double())
    assert _rel(out, ref) < 1e-5


def test_seed_attention_head_dim_128_bf16():
    q, k, v = (torch.randn(1, 1, 100, 128, dtype=torch.bfloat16) for _ in range(3))
    out = se.fused_attention.with_options(target="vulkan")(q, k, v)
    assert _rel(out, se.fused_attention.fn(q.double(), k.double(), v.double())) < 2e-2


@pytest.mark.parametrize("d,sq,sk,dtype,masked", [
    (128, 1, 255, torch.float32, False), (128, 2, 257, torch.bfloat16, True), (65, 3, 31, torch.float32, True),
    (1, 17, 256, torch.bfloat16, False), (40, 1, 1, torch.float32, False)])
def test_seed_attention_small_query_blocks_and_odd_head_dims(d, sq, sk, dtype, masked):
    """Shapes the attention kernel once had no tiling for (1-3 queries at head dim 128, head
    dims that no lane count divides): they fell back to the generic strategy, whose
    per-thread loops (keys^2 x head dim) lavapipe cut short. bf16 at scale 10: scores in
    the hundreds."""
    scale = 10.0 if dtype == torch.bfloat16 else 1.0
    q, k, v = ((torch.randn(1, 2, n, d) * scale).to(dtype) for n in (sq, sk, sk))
    mask = (torch.rand(sq, sk) > 0.3).float() if masked else None
    out = se.fused_attention.with_options(target="vulkan")(q, k, v, mask)
    ref = se.fused_attention.fn(q.double(), k.double(), v.double(), None if mask is None else mask.double())
    assert out.dtype == dtype and _rel(out, ref) < (1e-5 if dtype == torch.float32 else 1e-2)


def test_long_loops_are_right_or_refused():
    """A matmul over 2^21 terms: its threads loop more than lavapipe's 65535 iterations
    (after which lavapipe drops the rest: 1048560 came out): the right result, or the
    launcher's error naming the limit, never a wrong number."""
    import kf

    a, b = torch.ones(2, 2 ** 21), torch.ones(2 ** 21, 3)
    try:
        out = kf.jit(lambda a, b: a @ b, target="vulkan")(a, b)
    except vulkan.VulkanError as e:
        assert "loop iterations per invocation" in str(e) and "lambda" in str(e)
    else:
        assert torch.equal(out, torch.full((2, 3), 2.0 ** 21))


def test_complete_moe():
    x, gate = torch.randn(1, 5, 64), torch.randn(4, 64)
    w_in, w_out = torch.randn(4, 64, 96) / 8, torch.randn(4, 96, 64) / 10
    out = moe.moe_layer_fused.with_options(target="vulkan")(x, gate, [w_in, w_out])
    assert _rel(out, moe.moe_layer_fused.fn(x, gate, [w_in, w_out])) < 1e-5


def test_strided_inputs_and_returned_inputs():
    import kf

    @kf.jit(target="vulkan")
    def f(a, b):
        return torch.exp(a) + b, a

    a = torch.randn(40, 30).t()
    b = torch.randn(30, 80)[:, ::2]
    y, same = f(a, b)
    torch.testing.assert_close(y, torch.exp(a) + b, atol=1e-5, rtol=1e-5)
    torch.testing.assert_close(same, a)


def test_inspect_gives_every_gpu_stage():
    import kf

    x, w, b = torch.randn(2, 40), torch.randn(40), torch.randn(40)
    info = kf.inspect(se.metal_layer_norm, x, w, b)  # a metal_shader: inspectable on Linux
    assert list(info.stages) == ["kf", "linalg", "fused", "gpu", "spirv", "msl"]
    assert "linalg.generic" in info.linalg and "gpu.func" in info.gpu and "kernel void" in info.msl
    ptx = kf.inspect(se.metal_layer_norm.with_options(target="cuda"), x, w, b)
    assert list(ptx.stages) == ["kf", "linalg", "fused", "gpu", "ptx"]


def test_misaligned_views_are_copied_before_launch():
    import kf

    f = kf.jit(lambda x: x * 2, target="vulkan")
    base = torch.randn(1001)
    x = base[1:]  # contiguous, but 4 bytes past an aligned address
    assert x.data_ptr() % 16 != 0
    torch.testing.assert_close(f(x), x * 2)


@pytest.mark.parametrize("shape", [(5, 31), (3, 200), (2, 7, 64)])
def test_seed_layer_norm_with_subgroup_reductions(shape):
    """Rows short enough for at most 64 threads: on a device with subgroup shuffles
    (lavapipe: 8 lanes) the reductions are subgroup butterflies, then one across the
    subgroups' partials."""
    from kf.runtime.abi import ProgramABI

    x = torch.randn(*shape)
    w, b = torch.randn(shape[-1]), torch.randn(shape[-1])
    f = se.metal_layer_norm.with_options(target="vulkan")
    out = f(x, w, b)
    assert _rel(out, se.metal_layer_norm.fn(x.double(), w.double(), b.double())) < 1e-5
    program, _ = f.specialize(*f._bind((x, w, b), {}))
    [k] = ProgramABI.from_json(program.meta["abi"]).kernels
    shuffles = "shuffle" in vulkan.device().target_limits().subgroup_ops
    assert (k.extra["plan"]["reduction"] == "shuffle") == shuffles


def _norm_weight_grads(*ts):
    """The weight gradients of a model's RMSNorms, as its backward computes them all in
    one place: sum over rows of dy * x * rstd, one per norm."""
    return tuple((dy * (x * r)).sum((0, 1)) for dy, x, r in zip(ts[0::3], ts[1::3], ts[2::3]))


def test_many_norm_weight_gradients_bind_what_the_device_binds():
    """17 column sums of one shape (an 8-layer Llama's norms): each norm's sum is a kernel
    of its own, within the 32 storage buffers lavapipe binds to a kernel (merged into one
    kernel of 66 they crashed the process)."""
    import kf

    ts = []
    for _ in range(17):
        ts += [torch.randn(2, 9, 16), torch.randn(2, 9, 16), torch.rand(2, 9, 1) + 0.5]
    f = kf.jit(_norm_weight_grads, target="vulkan")
    for got, want in zip(f(*ts), _norm_weight_grads(*ts)):
        torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


def test_a_kernel_wider_than_the_device_is_refused(monkeypatch):
    """A kernel that binds more storage buffers than the device allows is a VulkanError
    naming it (the fuse pass never makes one: MAX_BUFFERS is lifted here to make it)."""
    import kf
    from kf.passes import fuse

    most = vulkan.device().limits.get("max_storage_buffers", 0)
    if not most or most > 64:
        pytest.skip(f"the device binds {most} storage buffers to a kernel")
    monkeypatch.setattr(fuse, "MAX_BUFFERS", 10 ** 6)

    def total(*xs):
        out = xs[0]
        for x in xs[1:]:
            out = out + x
        return out

    xs = [torch.randn(5) for _ in range(most + 1)]
    with pytest.raises(Exception, match=f"binds {most + 2} storage buffers; .* at most {most}"):
        kf.jit(total, target="vulkan")(*xs)
