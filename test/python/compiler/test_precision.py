"""The precision option and torch.autocast, end to end on the CPU and Vulkan targets.

For every precision, the seed's attention and layer norm, a matmul and a matmul + GELU
run on fresh random inputs (never zeros) at sizes that are not multiples of any tile
(77x131 @ 131x45): the output dtype is eager's, and the error against a float64
reference is within the precision's tolerance. The tolerances are relative Frobenius
errors measured on both targets (worst of three draws, f32 inputs): auto, fp32 and tf32
at most 3.0e-7, bf16 3.4e-3, fp16 4.4e-4, fp8 5.4e-2 (attention; the matmuls 3.9e-2); the
bounds below leave a margin of about 3x (1.5x for fp8). The narrow precisions must also
be measurably less accurate than fp32 on the matmul-class functions, which proves that
the casts happened.
"""


import math

import pytest
import torch

import kf
import seed_examples as se
from kf.options import Options
from kf.runtime import vulkan

VULKAN = pytest.mark.skipif(not vulkan.is_available(), reason="no Vulkan device (install mesa-vulkan-drivers)")
TARGETS = ["cpu", pytest.param("vulkan", marks=VULKAN)]
PRECISIONS = ["auto", "fp32", "tf32", "bf16", "fp16", "fp8"]
#: relative Frobenius error against float64, f32 inputs
TOL = {"auto": 1e-6, "fp32": 1e-6, "tf32": 1e-6, "bf16": 1e-2, "fp16": 2e-3, "fp8": 8e-2}
#: ... and for low-precision inputs (measured at most 5.7e-3 for bf16, 6.9e-4 for f16)
TOL_INPUT = {torch.bfloat16: 2e-2, torch.float16: 2e-3}


@pytest.fixture(scope="module", autouse=True)
def _cache(tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("KF_CACHE_DIR", str(tmp_path_factory.mktemp("kf-cache")))
        yield


@kf.jit
def matmul(a, b):
    return a @ b


@kf.jit
def matmul_gelu(a, b):
    return torch.nn.functional.gelu(a @ b)


FUNCTIONS = {"matmul": matmul, "matmul_gelu": matmul_gelu, "attention": se.fused_attention,
             "layer_norm": se.metal_layer_norm}
MATMUL_CLASS = ["matmul", "matmul_gelu", "attention"]
_INPUTS: dict = {}
_OUTPUTS: dict = {}


def inputs(name: str, dtype=torch.float32) -> list[torch.Tensor]:
    """One draw of inputs per function and dtype, shared by every precision and target."""
    if (name, dtype) not in _INPUTS:
        if name in ("matmul", "matmul_gelu"):
            xs = [torch.randn(77, 131), torch.randn(131, 45)]
        elif name == "attention":
            xs = [torch.randn(2, 3, 77, 40) for _ in range(3)]
        else:
            xs = [torch.randn(3, 77, 131), 1 + 0.1 * torch.randn(131), 0.1 * torch.randn(131)]
        _INPUTS[name, dtype] = [x.to(dtype) for x in xs]
    return _INPUTS[name, dtype]


def run(target: str, name: str, precision: str, dtype=torch.float32) -> torch.Tensor:
    key = (target, name, precision, dtype)
    if key not in _OUTPUTS:
        _OUTPUTS[key] = FUNCTIONS[name].with_options(target=target, precision=precision)(*inputs(name, dtype))
    return _OUTPUTS[key]


def error(target: str, name: str, precision: str, dtype=torch.float32) -> float:
    out = run(target, name, precision, dtype)
    ref = FUNCTIONS[name].fn(*[x.double() for x in inputs(name, dtype)])
    return ((out.double() - ref).norm() / ref.norm()).item()


# ----------------------------------------------------------------------------- accuracy


@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("name", list(FUNCTIONS))
@pytest.mark.parametrize("target", TARGETS)
def test_accuracy(target, name, precision):
    out = run(target, name, precision)
    eager = FUNCTIONS[name].fn(*inputs(name))
    assert out.dtype == eager.dtype and out.shape == eager.shape
    assert error(target, name, precision) < TOL[precision]


@pytest.mark.parametrize("name", MATMUL_CLASS)
@pytest.mark.parametrize("target", TARGETS)
def test_narrow_precisions_are_less_accurate(target, name):
    """The casts happened: bf16 operands lose about 8 bits, fp16 5, E4M3FN 12, against
    f32's; and tf32 (a permission no strategy takes yet) and fp32 compute as auto does."""
    err = {p: error(target, name, p) for p in PRECISIONS}
    assert err["fp32"] < err["fp16"] < err["bf16"] < err["fp8"]
    assert err["fp16"] > 30 * err["fp32"] and err["bf16"] > 300 * err["fp32"]
    assert torch.equal(run(target, name, "fp32"), run(target, name, "auto"))
    assert torch.equal(run(target, name, "tf32"), run(target, name, "fp32"))


@pytest.mark.parametrize("precision", ["bf16", "fp16", "fp8"])
@pytest.mark.parametrize("target", TARGETS)
def test_layer_norm_has_no_matmul_to_narrow(target, precision):
    assert torch.equal(run(target, "layer_norm", precision), run(target, "layer_norm", "auto"))


@pytest.mark.parametrize("precision", PRECISIONS)
@pytest.mark.parametrize("name", ["attention", "layer_norm", "matmul_gelu"])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16], ids=str)
@pytest.mark.parametrize("target", TARGETS)
def test_low_precision_inputs(target, dtype, name, precision):
    """The output dtype stays the inputs' whatever the precision, and fp32 (computing
    every intermediate in f32) is never less accurate than auto."""
    out = run(target, name, precision, dtype)
    assert out.dtype == dtype == FUNCTIONS[name].fn(*inputs(name, dtype)).dtype
    assert error(target, name, precision, dtype) < (TOL["fp8"] if precision == "fp8" else TOL_INPUT[dtype])
    if precision == "fp32":
        assert error(target, name, "fp32", dtype) <= 1.1 * error(target, name, "auto", dtype)


# ----------------------------------------------------------------------------- torch.autocast


def _entries() -> int:
    from kf.cache import cache_dir

    return len(list(cache_dir().glob("*/*/program.json")))


@pytest.mark.parametrize("dtype,precision", [(torch.bfloat16, "bf16"), (torch.float16, "fp16")], ids=str)
def test_autocast_selects_the_precision(dtype, precision, tmp_path, monkeypatch):
    monkeypatch.setenv("KF_CACHE_DIR", str(tmp_path))  # count this test's entries only
    f = matmul_gelu.with_options(target="cpu")
    a, b = inputs("matmul_gelu")
    full = f(a, b)
    before, fast = _entries(), dict(f._fast)
    assert before == 1
    with torch.autocast("cpu", dtype=dtype):
        cast = f(a, b)
    assert cast.dtype == torch.float32  # the output dtype never changes, unlike eager autocast's
    assert torch.equal(cast, run("cpu", "matmul_gelu", precision))
    assert not torch.equal(cast, full)
    assert _entries() == before + 1  # its own specialization and cache entry
    assert f._fast == fast  # ... and its own dispatch table
    again = f(a, b)
    assert torch.equal(again, full) and _entries() == before + 1


@pytest.mark.parametrize("target", TARGETS)
def test_autocast_region_of_the_target_device(target):
    """vulkan takes CPU tensors, so it follows a CPU autocast region, as cpu does."""
    a, b = inputs("matmul")
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = matmul.with_options(target=target)(a, b)
    assert torch.equal(out, run(target, "matmul", "bf16"))


def test_an_explicit_precision_wins_over_autocast():
    a, b = inputs("matmul")
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = matmul.with_options(target="cpu", precision="fp32")(a, b)
        off = matmul.with_options(target="cpu")
        with torch.autocast("cpu", enabled=False):
            plain = off(a, b)
    assert torch.equal(out, run("cpu", "matmul", "fp32"))
    assert torch.equal(plain, run("cpu", "matmul", "auto"))


def test_autocast_under_torch_compile(tmp_path, monkeypatch):
    """The op's implementation runs with autocast's keys excluded (and a compiled graph
    runs it after the region it was traced in): the precision travels in the call."""
    monkeypatch.setenv("KF_CACHE_DIR", str(tmp_path))  # compiled inside the region
    f = matmul_gelu.with_options(target="cpu")
    a, b = inputs("matmul_gelu")
    bf16, full = run("cpu", "matmul_gelu", "bf16"), run("cpu", "matmul_gelu", "auto")
    compiled = torch.compile(lambda x, y: f(x, y) * 2, fullgraph=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = compiled(a, b)
    assert out.dtype == torch.float32 and torch.equal(out, bf16 * 2)
    assert torch.equal(compiled(a, b), full * 2)  # outside the region: guarded, traced again

    def inside(x, y):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return f(x, y)

    assert torch.equal(torch.compile(inside, fullgraph=True)(a, b), bf16)


def test_autocast_reaches_forward_and_backward(tmp_path, monkeypatch):
    """Under autograd the call goes through the op; its backward is compiled with the
    forward's precision, as an explicit precision="bf16" does."""
    monkeypatch.setenv("KF_CACHE_DIR", str(tmp_path))
    a, b = inputs("matmul_gelu")
    f = matmul_gelu.with_options(target="cpu")
    x = a.clone().requires_grad_()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out = f(x, b)
    assert torch.equal(out.detach(), run("cpu", "matmul_gelu", "bf16"))
    out.sum().backward()
    y = a.clone().requires_grad_()
    matmul_gelu.with_options(target="cpu", precision="bf16")(y, b).sum().backward()
    assert torch.equal(x.grad, y.grad)
    z = a.clone().requires_grad_()
    torch.nn.functional.gelu(z @ b).sum().backward()
    rel = ((x.grad - z.grad).norm() / z.grad.norm()).item()
    assert 1e-5 < rel < TOL["bf16"]


# ----------------------------------------------------------------------------- the option


def test_invalid_precision_at_decoration():
    with pytest.raises(ValueError, match="precision must be one of auto, fp32, tf32, bf16, fp16, fp8, got 'int8'"):
        @kf.jit(precision="int8")
        def f(x):
            return x
    with pytest.raises(ValueError, match="precision must be one of"):
        matmul.with_options(precision="bf8")


def test_precision_is_part_of_the_key_and_op_name():
    hashes = {Options(precision=p).stable_hash() for p in PRECISIONS}
    assert len(hashes) == len(PRECISIONS)
    assert matmul.with_options(precision="bf16").op_name != matmul.op_name


def test_inspect_shows_the_casts():
    a, b = inputs("matmul")
    plain = kf.inspect(matmul.with_options(target="cpu"), a, b).kf_ir
    assert "kf.cast" not in plain
    narrow = kf.inspect(matmul.with_options(target="cpu", precision="bf16"), a, b).kf_ir
    assert narrow.count('"kf.cast"') == 2
    assert "(tensor<77x131xbf16>, tensor<131x45xbf16>) -> tensor<77x45xf32>" in narrow
    assert "-> tensor<77x45xf32> attributes" in narrow  # the function's type is unchanged
    with torch.autocast("cpu", dtype=torch.float16):
        assert "tensor<77x131xf16>" in kf.inspect(matmul.with_options(target="cpu"), a, b).kf_ir
    fp8 = kf.inspect(matmul.with_options(target="cpu", precision="fp8"), a, b)
    assert "f8E4M3FN" in fp8.kf_ir and "kf.reduce_max" in fp8.kf_ir
    assert "linalg" in fp8.stages  # the rest of the pipeline takes what the policy made


def test_interpreter_follows_the_precision():
    a, b = inputs("matmul_gelu")
    for precision in ("bf16", "fp8"):
        interp = matmul_gelu.with_options(target="cpu", precision=precision, interpret=True)(a, b)
        compiled = run("cpu", "matmul_gelu", precision)
        assert ((interp - compiled).norm() / compiled.norm()).item() < 1e-6
        assert not torch.allclose(interp, run("cpu", "matmul_gelu", "auto"), rtol=1e-4, atol=0)


def test_cuda_bf16_precision_takes_tensor_cores():
    """No GPU here: the PTX shows it. f32 inputs under bf16 are bf16 mma.sync operands."""
    a, b = inputs("matmul")
    f = matmul.with_options(target="cuda")
    assert "mma.sync" not in kf.inspect(f, a, b).ptx
    ptx = kf.inspect(f.with_options(precision="bf16"), a, b).ptx
    assert "mma.sync" in ptx and ".bf16" in ptx


def test_cuda_fp8_precision_takes_fp8_tensor_cores():
    """On CUDA the quantized operands are fp8 tensors, multiplied by e4m3 mma.sync."""
    a, b = torch.randn(64, 128), torch.randn(128, 32)
    info = kf.inspect(matmul.with_options(target="cuda", precision="fp8"), a, b)
    assert "tensor<64x128xf8E4M3FN>" in info.kf_ir
    assert "mma.sync" in info.ptx and "e4m3" in info.ptx


def _attention_kernels(info) -> list[str]:
    return [ln for ln in info.stages["fused"].splitlines() if 'kf.kernel = "attention"' in ln]


@pytest.mark.parametrize("precision", ["bf16", "fp16", "fp8"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("masked", [False, True], ids=["nomask", "mask"])
@pytest.mark.parametrize("target", [pytest.param("vulkan", marks=VULKAN)])
def test_attention_stays_one_kernel(target, masked, dtype, precision):
    """Under bf16, fp16 and fp8 the seed's attention is one attention kernel (kf-fuse
    takes the policy's casts and scales around the products), off the tile grid (seq
    100 and 257), and as accurate as the unfused policy on the CPU: the fused kernel
    rounds the unnormalized probabilities (measured here: fp8 4.3-5.2e-2, bf16
    1.6-3.4e-3, against 4.6-5.5e-2 and 2.9-4.0e-3 on the CPU)."""
    s, d = (257, 128) if masked else (100, 64)
    g = torch.Generator().manual_seed(s + d)
    q, k, v = (torch.randn(1, 2, s, d, generator=g).to(dtype) for _ in range(3))
    args = (q, k, v) + ((torch.tril(torch.ones(s, s)).to(dtype),) if masked else ())
    f = kf.jit(se.fused_attention.fn, target=target, precision=precision)
    assert len(_attention_kernels(kf.inspect(f, *args))) == 1
    sc = q.double() @ k.double().transpose(-1, -2) / math.sqrt(d)
    if masked:
        sc = sc.masked_fill(args[3] == 0, -1e9)
    ref = torch.softmax(sc, -1) @ v.double()
    out = f(*args)
    err = ((out.double() - ref).norm() / ref.norm()).item()
    tol = TOL[precision] if dtype == torch.float32 else max(TOL[precision], TOL_INPUT[dtype])
    assert out.dtype == dtype and err < tol, err


@pytest.mark.parametrize("precision", ["bf16", "fp8"])
def test_cuda_attention_under_precision_is_one_wgmma_kernel(precision):
    """No GPU here: the PTX shows it. On sm_90a the fp8 attention is one kernel of fp8
    wgmmas (m64n128k32 e4m3 for both products) after the quantization kernels; bf16 of
    f32 inputs is the bf16 wgmma kernel."""
    q, k, v = (torch.randn(2, 4, 256, 128) for _ in range(3))
    info = kf.inspect(kf.jit(se.fused_attention.fn, target="cuda", precision=precision), q, k, v)
    assert len(_attention_kernels(info)) == 1
    t = "e4m3" if precision == "fp8" else "bf16"
    assert f"wgmma.mma_async.sync.aligned.m64n128k{32 if precision == 'fp8' else 16}.f32.{t}.{t}" in info.ptx


@pytest.mark.parametrize("precision", ["bf16", "fp16", "fp8"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
@pytest.mark.parametrize("masked", [False, True], ids=["nomask", "mask"])
@VULKAN
def test_fused_attention_agrees_with_the_unfused_policy(masked, dtype, precision):
    """The one attention kernel (Vulkan) against the unfused IR of the same policy (the
    CPU target, which the interpreter agrees with): they differ by where P is rounded
    (before or after the row sums divide it), which is within the precision's tolerance
    (measured: fp8 2.9-3.3e-2, bf16 1.9-4.3e-3, fp16 2.2e-4 of f32 inputs), and the fused
    kernel is at least as accurate against float64 (fp8 4.4-4.9e-2 against 4.9-5.2e-2)."""
    s, d = (257, 128) if masked else (100, 64)
    g = torch.Generator().manual_seed(s + d)
    q, k, v = (torch.randn(1, 2, s, d, generator=g).to(dtype) for _ in range(3))
    args = (q, k, v) + ((torch.tril(torch.ones(s, s)).to(dtype),) if masked else ())
    fused = kf.jit(se.fused_attention.fn, target="vulkan", precision=precision)(*args)
    unfused = kf.jit(se.fused_attention.fn, target="cpu", precision=precision)(*args)
    interp = kf.jit(se.fused_attention.fn, target="cpu", precision=precision, interpret=True)(*args)
    ref = se.fused_attention.fn(*[a.double() for a in args])

    def rel(x, y):
        return ((x.double() - y.double()).norm() / y.double().norm()).item()

    tol = TOL[precision] if dtype == torch.float32 else max(TOL[precision], TOL_INPUT[dtype])
    assert rel(unfused, interp) < 1e-4
    assert rel(unfused, ref) < tol and rel(fused, unfused) < tol
    assert rel(fused, ref) < 1.25 * rel(unfused, ref)


def _ptxas():
    from kf.passes.to_cuda import ptxas_path

    if ptxas_path() is None:
        pytest.skip("ptxas not installed")


@pytest.mark.parametrize("arch", ["sm_90", "sm_90a"])
@pytest.mark.parametrize("precision,dtype,masked,seq,d", [
    ("bf16", torch.float32, True, 257, 64), ("bf16", torch.bfloat16, False, 257, 128),
    ("fp16", torch.float32, False, 100, 128), ("fp8", torch.bfloat16, False, 256, 128),
    ("fp8", torch.float32, False, 257, 128), ("fp8", torch.float32, True, 257, 64)], ids=str)
def test_cuda_attention_under_precision_assembles(arch, precision, dtype, masked, seq, d):
    """No GPU here: ptxas takes every kernel of the program. One attention kernel on
    tensor cores: mma.sync on sm_90, wgmma on sm_90a. Under fp8 its products are fp8
    (e4m3 wgmma) only where that kernel takes them -- sm_90a, no mask, head dim 128 or
    256, whole blocks of 128 keys; elsewhere the driver keeps attention 16-bit
    (kf-apply-precision's fp8-attention), where fp8 operands would have gone to the
    SIMT kernel, 30x slower than bf16 at head dim 64 on the H200. No spills."""
    _ptxas()
    from kf.passes.to_cuda import assemble

    q, k, v = (torch.randn(2, 4, seq, d).to(dtype) for _ in range(3))
    args = (q, k, v) + ((torch.tril(torch.ones(seq, seq)).to(dtype),) if masked else ())
    f = kf.jit(se.fused_attention.fn, target="cuda", arch=arch, precision=precision)
    info = kf.inspect(f, *args)
    assert len(_attention_kernels(info)) == 1
    ptx = info.stages["ptx"]
    kernels = assemble(ptx, arch).kernels
    [name] = [n for n in kernels if n.endswith("_attention")]
    body = ptx[ptx.index(f".entry {name}("):]
    body = body[:body.index("\n}")]
    want = "wgmma" if arch == "sm_90a" else "mma.sync"
    assert want in body, (arch, precision)
    if precision == "fp8":
        fp8_kernel = arch == "sm_90a" and not masked and seq % 128 == 0 and d in (128, 256)
        assert ("e4m3" in body) == fp8_kernel, (arch, masked, seq, d)
    for kname, r in kernels.items():
        assert r["spill_store_bytes"] == 0 and r["spill_load_bytes"] == 0, (kname, r)
