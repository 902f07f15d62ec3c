"""kf's benchmark on the GPU machine: every workload timed with kf, torch eager (the user's
own code), torch's best built-in kernel and torch.compile, in one process, against the
measured copy bandwidth and bf16 GEMM rate of the same run.

    python3 bench/bench.py [--quick] [--only TEXT,...] [--jit] [--out-dir DIR] [--tag TEXT]

Each kf result is checked against torch (‖kf − ref‖ / ‖ref‖ in float64) before it is
timed; a failed check is reported and the row is not timed. Times are medians of CUDA
event measurements after warm-up, with inputs rotated among enough copies that L2
(60 MB on the H200) does not serve them. The rows go to
bench/results/bench-<date>-<commit>.json (bench-<only texts>-... with --only; named by
bench/run_name.py), rewritten after every row so that a run cut short keeps its rows.
bench/RESULTS.md records the tables.

The ``vulkan:`` rows (``--only vulkan``) run kf's Vulkan target on the machine's Vulkan
device against that device's own copy rate (``vulkan_rows``); on the GPU machine NVIDIA's
Vulkan driver needs its loader first (carry .gl and .whl, see
shared/device/vulkan-gpu.sh):

    source shared/device/prelude.sh && source shared/device/vulkan-prelude.sh
    python3 bench/bench.py --only vulkan

Without CUDA (lavapipe here) only the Vulkan rows run.
"""

from __future__ import annotations

import argparse
import math
import os
import statistics
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples"))

import kf  # noqa: E402
import run_name  # noqa: E402  (bench/, the script's folder)
from moe import moe_layer_fused  # noqa: E402
from seed_examples import fused_attention, metal_layer_norm  # noqa: E402

L2_BYTES = 60 * 2**20


def median_ms(fn: Callable, inputs: list[tuple], reps: int = 30, warmup: int = 3) -> float:
    """Median ms per call of fn(*inputs[i % n]) with CUDA events, rotating input sets."""
    for i in range(warmup):
        fn(*inputs[i % len(inputs)])
    torch.cuda.synchronize()
    times = []
    for i in range(reps):
        args = inputs[i % len(inputs)]
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        a.record()
        fn(*args)
        b.record()
        b.synchronize()
        times.append(a.elapsed_time(b))
    times.sort()
    return times[len(times) // 2]


def host_us(fn: Callable[[], object], n: int = 20000, repeats: int = 5) -> float:
    """Median over repeats of host time per call (us) of n calls back to back,
    synchronizing outside the clock (what kf's per-call overhead is measured with)."""
    per = []
    for _ in range(repeats):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        for _ in range(n):
            fn()
        t1 = time.perf_counter()
        torch.cuda.synchronize()
        per.append((t1 - t0) / n * 1e6)
    return statistics.median(per)


def rotated(make: Callable[[], tuple]) -> list[tuple]:
    """Enough independent input sets that together they exceed twice the L2."""
    first = make()
    nbytes = sum(t.numel() * t.element_size() for t in first if isinstance(t, torch.Tensor))
    n = max(1, min(8, math.ceil(2 * L2_BYTES / max(nbytes, 1))))
    return [first] + [make() for _ in range(n - 1)]


def rel_err(out, ref) -> float:
    out, ref = out.double(), ref.double()
    if not torch.isfinite(out).all():
        return float("nan")
    return ((out - ref).norm() / ref.norm().clamp_min(1e-30)).item()


@dataclass
class Row:
    workload: str
    bytes: float = 0.0
    flops: float = 0.0
    times_ms: dict = field(default_factory=dict)  # impl -> ms
    rel_err: float | None = None
    note: str = ""
    ceiling_gbs: float | None = None  # the copy rate %ceil is of, where not the CUDA one (Vulkan rows)


def ceilings(quick: bool) -> tuple[float, float, list[Row]]:
    n = (256 if quick else 1024) * 2**20 // 4
    src = torch.randn(n, device="cuda")
    dst = torch.empty_like(src)
    copy_ms = median_ms(lambda: dst.copy_(src), [()], reps=20)
    copy_gbs = 2 * src.numel() * 4 / copy_ms / 1e6
    m = 4096 if quick else 8192
    a = torch.randn(m, m, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(m, m, device="cuda", dtype=torch.bfloat16)
    gemm_ms = median_ms(lambda: a @ b, [()], reps=20)
    tflops = 2 * m**3 / gemm_ms / 1e9
    rows = [Row(f"copy {src.numel() * 4 / 2**30:.2f} GiB (ceiling)", bytes=2 * src.numel() * 4, times_ms={"torch": copy_ms}),
            Row(f"bf16 GEMM {m}^3 (ceiling)", flops=2 * m**3, times_ms={"cuBLAS": gemm_ms})]
    return copy_gbs, tflops, rows


def compiled(fn):
    try:
        return torch.compile(fn)
    except Exception:  # torch.compile unavailable: the row says so
        return None


def run_workload(name, kf_fn, eager, best, make, bytes_, flops, tol, compile_fn=None) -> Row:
    row = Row(name, bytes=bytes_, flops=flops)
    inputs = rotated(make)
    try:
        out = kf_fn(*inputs[0])
        ref = eager(*[t.double() if isinstance(t, torch.Tensor) and t.is_floating_point() else t for t in inputs[0]])
        row.rel_err = rel_err(out, ref)
        if not row.rel_err <= tol:
            row.note = f"kf result wrong (rel err {row.rel_err:.2e} > {tol}); not timed"
            kf_fn = None
    except Exception as e:
        row.note = f"kf failed: {type(e).__name__}: {str(e).splitlines()[0][:200]}"
        kf_fn = None
    impls = {"kf": kf_fn, "eager": eager, "best": best, "compile": compile_fn or compiled(eager)}
    for impl, fn in impls.items():
        if fn is None:
            continue
        try:
            row.times_ms[impl] = median_ms(fn, inputs)
        except Exception as e:
            row.note += f" {impl} failed: {type(e).__name__}: {str(e).splitlines()[0][:120]}"
    return row


def workloads(quick: bool):
    bf16 = torch.bfloat16

    def randn(*s, dtype=bf16):
        return torch.randn(*s, device="cuda", dtype=dtype)

    ln = metal_layer_norm.with_options(target="cuda")
    for (r, c) in ([(8192, 4096)] if quick else [(8192, 4096), (32768, 8192)]):
        for dtype in (bf16, torch.float32):
            esz = 2 if dtype == bf16 else 4
            yield (f"seed layer norm {r}x{c} {str(dtype)[6:]}", ln, metal_layer_norm.fn,
                   lambda x, w, b: F.layer_norm(x, (x.shape[-1],), w, b),
                   lambda: (randn(r, c, dtype=dtype), randn(c, dtype=dtype), randn(c, dtype=dtype)),
                   (2 * r * c + 2 * c) * esz, 0, 2e-2 if dtype == bf16 else 1e-5)

    def softmax(x):
        return torch.softmax(x, dim=-1)

    def rmsnorm(x, w):
        return x * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-6).to(x.dtype) * w

    def bias_gelu(x, b):
        return F.gelu(x + b)

    # 8192 x 8192 bf16 (128 MiB: twice the L2), and the large shapes the targets name
    for (r, c, dtype) in [(8192, 8192, bf16)] + ([] if quick else [(32768, 8192, bf16), (32768, 8192, torch.float32)]):
        esz, tol, name = (2, 2e-2, "bf16") if dtype == bf16 else (4, 1e-5, "fp32")

        def rand(*s, dtype=dtype):
            return randn(*s, dtype=dtype)

        yield (f"softmax {r}x{c} {name}", kf.jit(softmax), softmax, softmax, lambda: (rand(r, c),),
               2 * r * c * esz, 0, tol)
        yield (f"RMSNorm {r}x{c} {name}", kf.jit(rmsnorm), rmsnorm, getattr(F, "rms_norm", None) and
               (lambda x, w: F.rms_norm(x, (x.shape[-1],), w, 1e-6)), lambda: (rand(r, c), rand(c)),
               2 * r * c * esz, 0, tol)
        yield (f"bias+GELU {r}x{c} {name}", kf.jit(bias_gelu), bias_gelu, None, lambda: (rand(r, c), rand(c)),
               2 * r * c * esz, 0, tol)

    def rotary(q, cos, sin):
        """Llama's rotary embedding as Hugging Face writes it: slices, a negation and a
        concat (kf reads them inside one elementwise kernel)."""
        half = q.shape[-1] // 2
        return q * cos + torch.cat((-q[..., half:], q[..., :half]), dim=-1) * sin

    b, h, s, d = 8, 32, 2048, 128
    yield (f"rotary embedding {b}x{h}x{s}x{d} bf16", kf.jit(rotary), rotary, None,
           lambda: (randn(b, h, s, d), randn(s, d), randn(s, d)), (2 * b * h * s * d + 2 * s * d) * 2, 0, 2e-2)

    def embedding_grad(vocab):
        """An embedding's gradient as autograd makes it (embedding_dense_backward): the
        gradient rows of the tokens added into a [vocab, width] zero tensor."""
        def grad(tokens, g):
            return torch.zeros(vocab, g.shape[-1], device=g.device, dtype=g.dtype).index_put(
                (tokens,), g, accumulate=True)
        return grad

    for vocab, width, n in [(32000, 2048, 2048)] + ([] if quick else [(128256, 4096, 4096)]):
        grad = embedding_grad(vocab)
        yield (f"embedding gradient {vocab}x{width}, {n} tokens bf16", kf.jit(grad), grad,
               lambda t, g, vocab=vocab: torch.ops.aten.embedding_dense_backward(g, t, vocab, -1, False),
               lambda vocab=vocab, width=width, n=n: (torch.randint(0, vocab, (n,), device="cuda"), randn(n, width)),
               (vocab * width + n * width) * 2, 0, 2e-2)

    def transpose_last_two(x):
        return x.transpose(-1, -2).contiguous()

    # the transpose strategy (a matrix, and attention's [b, h, s, d] as V^T for fp8)
    for shape in [(8192, 8192)] + ([] if quick else [(4, 32, 2048, 128)]):
        n = math.prod(shape)
        yield (f"transpose {'x'.join(map(str, shape))} bf16", kf.jit(transpose_last_two), transpose_last_two, None,
               lambda shape=shape: (randn(*shape),), 2 * n * 2, 0, 1e-6)

    def sdpa(q, k, v, mask=None):
        return F.scaled_dot_product_attention(q, k, v)

    shapes = [(4, 32, 2048, 128)] if quick else [(4, 32, 2048, 128), (4, 32, 2048, 64), (2, 32, 4096, 128)]
    for (b, h, s, d) in shapes:
        flops = 4 * b * h * s * s * d
        yield (f"seed attention {b}x{h}x{s}x{d} bf16", fused_attention, fused_attention.fn, sdpa,
               lambda: (randn(b, h, s, d), randn(b, h, s, d), randn(b, h, s, d)), 4 * b * h * s * d * 2, flops, 2e-2)
    b, h, s, d = 4, 32, 2048, 128
    causal = lambda: (randn(b, h, s, d), randn(b, h, s, d), randn(b, h, s, d),  # noqa: E731
                      torch.tril(torch.ones(s, s, device="cuda", dtype=bf16)))
    yield (f"seed attention + causal mask {b}x{h}x{s}x{d} bf16", fused_attention, fused_attention.fn,
           lambda q, k, v, m: F.scaled_dot_product_attention(q, k, v, is_causal=True), causal,
           4 * b * h * s * d * 2, 2 * b * h * s * s * d, 2e-2)
    # the same causal mask built inside the function: kf computes it in the attention
    # kernel (its block table from the index comparison), never as a tensor; its time
    # against the row above (the mask given as a tensor) is what building it in costs
    def masked_inside(build):
        def attention(q, k, v):
            return fused_attention.fn(q, k, v, build(q.shape[-2], q.device))
        return attention

    for how, build in [("tril", lambda n, dev: torch.ones(n, n, device=dev).tril()),
                       ("1 - triu", lambda n, dev: 1 - torch.triu(torch.ones(n, n, device=dev), diagonal=1))]:
        inside = masked_inside(build)
        yield (f"seed attention + {how} mask in the function {b}x{h}x{s}x{d} bf16", kf.cuda_kernel(inside),
               inside, lambda q, k, v: F.scaled_dot_product_attention(q, k, v, is_causal=True),
               lambda: (randn(b, h, s, d), randn(b, h, s, d), randn(b, h, s, d)),
               4 * b * h * s * d * 2, 2 * b * h * s * s * d, 2e-2)

    m = 4096 if quick else 8192
    mm = kf.jit(lambda a, b: torch.matmul(a, b))
    yield (f"kf GEMM {m}^3 bf16", mm, lambda a, b: torch.matmul(a, b), lambda a, b: torch.matmul(a, b),
           lambda: (randn(m, m), randn(m, m)), 3 * m * m * 2, 2 * m**3, 2e-2)

    yield from transformer_block_workloads(quick)

    t, hid, ffn, e = (2048 if quick else 8192), 1024, 4096, 8
    moe = lambda x, g, a, b_: moe_layer_fused(x, g, [a, b_])  # noqa: E731
    moe_eager = lambda x, g, a, b_: moe_layer_fused.fn(x, g, [a, b_])  # noqa: E731
    yield (f"MoE top-2, {t} tokens, {hid}->{ffn}, {e} experts bf16", moe, moe_eager, None,
           lambda: (randn(1, t, hid), randn(e, hid), randn(e, hid, ffn) / 32, randn(e, ffn, hid) / 64),
           (t * hid * 2 + 2 * e * hid * ffn) * 2, 2 * 2 * t * 2 * hid * ffn, 3e-2)


def transformer_block(x, ln1w, ln1b, wqkv, bqkv, wo, bo, ln2w, ln2b, w1, b1, w2, b2, *, heads, ln, attn, bias_gelu):
    """A pre-LN GPT block; ln, attn and bias_gelu are the swappable kernels, the GEMMs stay torch's."""
    bsz, s, d = x.shape
    h = ln(x, ln1w, ln1b)
    qkv = (h @ wqkv + bqkv).view(bsz, s, 3, heads, d // heads).permute(2, 0, 3, 1, 4)
    o = attn(qkv[0], qkv[1], qkv[2]).transpose(1, 2).reshape(bsz, s, d)
    x = x + (o @ wo + bo)
    h = bias_gelu(ln(x, ln2w, ln2b) @ w1, b1)
    return x + (h @ w2 + b2)


def transformer_block_workloads(quick: bool):
    """The 7B-shape block (width 4096, 32 heads, FFN 11008, batch 4, seq 2048): eager is the
    user's own layer norm formula, attention and GELU; best is F.layer_norm, SDPA and
    F.gelu; kf swaps in the seed's layer norm and attention and a kf bias+GELU."""
    import functools

    bf16 = torch.bfloat16
    bsz, s, d, heads, ffn = (1, 1024, 2048, 16, 5504) if quick else (4, 2048, 4096, 32, 11008)

    def randn(*shape, scale=1.0):
        return torch.randn(*shape, device="cuda", dtype=bf16) * scale

    def make():
        return (randn(bsz, s, d), randn(d), randn(d), randn(d, 3 * d, scale=d ** -0.5), randn(3 * d),
                randn(d, d, scale=d ** -0.5), randn(d), randn(d), randn(d), randn(d, ffn, scale=d ** -0.5),
                randn(ffn), randn(ffn, d, scale=ffn ** -0.5), randn(d))

    def bias_gelu(x, b):
        return F.gelu(x + b)

    kf_bias_gelu = kf.jit(bias_gelu)
    eager = functools.partial(transformer_block, heads=heads, ln=metal_layer_norm.fn, attn=fused_attention.fn,
                              bias_gelu=bias_gelu)
    best = functools.partial(transformer_block, heads=heads, ln=lambda x, w, b: F.layer_norm(x, (d,), w, b),
                             attn=F.scaled_dot_product_attention, bias_gelu=bias_gelu)
    kf_block = functools.partial(transformer_block, heads=heads, ln=metal_layer_norm.with_options(target="cuda"),
                                 attn=fused_attention, bias_gelu=kf_bias_gelu)
    gemm_flops = 2 * bsz * s * (4 * d * d + 2 * d * ffn)
    attn_flops = 4 * bsz * s * s * d
    yield (f"transformer block {bsz}x{s}, width {d}, FFN {ffn} bf16", kf_block, eager, best, make,
           0, gemm_flops + attn_flops, 3e-2)


def vulkan_rows(quick: bool, only: list[str]) -> list[Row]:
    """kf's Vulkan target on this machine's Vulkan device (on the GPU machine NVIDIA's
    driver: source shared/device/vulkan-prelude.sh first), beside the CUDA rows: the
    seed's layer norm and attention in fp32 with their inputs resident on the device (a
    warm-up call uploads them; the timed calls upload nothing, which the note's
    "uploads a call" shows), against the device's own copy rate (vkCmdCopyBuffer,
    device to device) as the ceiling. kf ms is the kernels' GPU time (timestamp
    queries); the note gives the wall time of a call, which also copies the result
    into the CPU tensor it returns. eager is the seed's function on the CPU in torch.
    Correctness: the seed's attention at the odd shapes of test_e2e_vulkan.py. The f16
    attention row is the matrix units' (VK_KHR_cooperative_matrix where the device has
    it; its note says whether it does), checked against float64 and not timed in eager."""
    from kf.runtime import vulkan
    from kf.signature import bind

    def wanted(name):
        return not only or any(o in name for o in only)

    r, c = (8192, 4096) if quick else (32768, 8192)
    b, h, sq, d = (1, 8, 1024, 128) if quick else (4, 32, 2048, 128)
    names = [f"vulkan: seed layer norm {r}x{c} fp32, data resident",
             f"vulkan: seed attention {b}x{h}x{sq}x{d} fp32, data resident",
             "vulkan: seed attention at the tests' odd shapes (correctness)",
             f"vulkan: seed attention {b}x{h}x{sq}x{d} f16, data resident"]
    if not any(map(wanted, names)):
        return []
    if not vulkan.is_available():
        try:
            vulkan.device()
        except vulkan.VulkanError as e:
            return [Row("vulkan: no device", note=str(e)[:200])]
    dev = vulkan.device()
    rows = []
    n = (256 if quick else 1024) << 20
    copy_s = dev.copy_seconds(n)
    copy_gbs = 2 * n / copy_s / 1e9
    rows.append(Row(f"vulkan: copy {n / 2**30:.2f} GiB (ceiling)", bytes=2 * n, times_ms={"torch": copy_s * 1e3},
                    ceiling_gbs=copy_gbs, note=f"vkCmdCopyBuffer on {dev.name}"))
    print(f"  {rows[-1].workload}: {copy_gbs:.0f} GB/s on {dev.name}", flush=True)
    ref_device = "cuda" if torch.cuda.is_available() else "cpu"

    def run(name, f, eager, args, bytes_, flops, tol, time_eager=True):
        row = Row(name, bytes=bytes_, flops=flops, ceiling_gbs=copy_gbs)
        try:
            out = f(*args)
            ref = eager(*[a.to(ref_device, torch.float64) for a in args]).cpu()
            row.rel_err = rel_err(out, ref)
            if not row.rel_err <= tol:
                row.note = f"kf result wrong (rel err {row.rel_err:.2e} > {tol}); not timed"
                return row
            program = f.specialize(*bind(f.fn, args, {}))[0]._launch  # the VulkanProgram
            program(*args)  # resident from here on
            u = dev.uploads
            gpu = []
            for _ in range(10):
                timings = []
                program(*args, timings=timings)
                gpu.append(sum(t for _, t in timings))
            walls = []
            for _ in range(5):
                t0 = time.perf_counter()
                f(*args)
                walls.append(time.perf_counter() - t0)
            uploads = (dev.uploads - u) / 15
            row.times_ms["kf"] = statistics.median(gpu) * 1e3
            if time_eager:
                t0 = time.perf_counter()
                eager(*args)
                row.times_ms["eager"] = (time.perf_counter() - t0) * 1e3
            kinds = sorted({k.extra.get("strategy", "") for k in program.abi.kernels} - {""})
            row.note = (f"wall {statistics.median(walls) * 1e3:.1f} ms a call (with the result's download), "
                        f"uploads a call {uploads:g}; kernels: {', '.join(kinds)}; "
                        f"cooperative matrix on the device: {bool(dev.features.get('cooperativeMatrix'))}; {dev.name}")
        except Exception as e:
            row.note = f"kf failed: {type(e).__name__}: {str(e).splitlines()[0][:200]}"
        return row

    f32 = torch.float32
    ln = metal_layer_norm.with_options(target="vulkan")
    attn = fused_attention.with_options(target="vulkan")
    name = names[0]
    if wanted(name):
        args = (torch.randn(r, c, dtype=f32), torch.randn(c, dtype=f32), torch.randn(c, dtype=f32))
        rows.append(run(name, ln, metal_layer_norm.fn, args, (2 * r * c + 2 * c) * 4, 0, 1e-5))
        print(f"  {rows[-1].workload}: {rows[-1].times_ms} {rows[-1].note}", flush=True)
    name = names[1]
    if wanted(name):
        args = tuple(torch.randn(b, h, sq, d, dtype=f32) for _ in range(3))
        rows.append(run(name, attn, fused_attention.fn, args, 4 * b * h * sq * d * 4, 4 * b * h * sq * sq * d, 1e-5))
        print(f"  {rows[-1].workload}: {rows[-1].times_ms} {rows[-1].note}", flush=True)
    name = names[2]
    if wanted(name):
        worst, notes = 0.0, []
        for (bb, hh, ss, dd, masked) in [(1, 2, 257, 64, False), (1, 2, 257, 64, True), (1, 2, 64, 64, True),
                                          (2, 3, 67, 128, False), (1, 2, 130, 128, True)]:
            q, k, v = (torch.randn(bb, hh, ss, dd) for _ in range(3))
            mask = (torch.rand(ss, ss) > 0.25).float() if masked else None
            try:
                out = attn(q, k, v, mask)
                ref = fused_attention.fn(q.double(), k.double(), v.double(), None if mask is None else mask.double())
                err = rel_err(out, ref)
            except Exception as e:
                err = float("nan")
                notes.append(f"{type(e).__name__}: {str(e).splitlines()[0][:80]}")
            worst = max(worst, err) if err == err else float("nan")
            notes.append(f"{bb}x{hh}x{ss}x{dd}{' masked' if masked else ''} {err:.1e}")
        rows.append(Row(name, rel_err=worst, note=("ok" if worst <= 1e-5 else "WRONG") + ": " + ", ".join(notes)))
        print(f"  {rows[-1].workload}: {rows[-1].note}", flush=True)
    name = names[3]
    if wanted(name):  # the matrix units' row (VK_KHR_cooperative_matrix where the device has it)
        args = tuple(torch.randn(b, h, sq, d, dtype=torch.float16) for _ in range(3))
        rows.append(run(name, attn, fused_attention.fn, args, 4 * b * h * sq * d * 2, 4 * b * h * sq * sq * d, 5e-3,
                        time_eager=False))  # torch's f16 attention on the CPU takes minutes here
        print(f"  {rows[-1].workload}: {rows[-1].times_ms} {rows[-1].note}", flush=True)
    return rows


FRESH = """
import sys, time
t0 = time.perf_counter()
sys.path.insert(0, {examples!r})
import torch
torch.cuda.init()
t1 = time.perf_counter()
from seed_examples import metal_layer_norm
t2 = time.perf_counter()
ln = metal_layer_norm.with_options(target="cuda")
x = torch.randn(8192, 4096, device="cuda", dtype=torch.bfloat16)
w = torch.randn(4096, device="cuda", dtype=torch.bfloat16); b = torch.randn(4096, device="cuda", dtype=torch.bfloat16)
torch.cuda.synchronize()
t3 = time.perf_counter()
ln(x, w, b); torch.cuda.synchronize()
t4 = time.perf_counter()
print(f"{{t4 - t3:.4f}} {{t2 - t1:.4f}} {{t1 - t0:.4f}}")
"""


def jit_rows() -> list[Row]:
    rows = []
    with tempfile.TemporaryDirectory() as cache:
        env = dict(os.environ, KF_CACHE_DIR=cache)
        outs = []
        for _ in range(2):
            r = subprocess.run([sys.executable, "-c", FRESH.format(examples=str(ROOT / "examples"))], env=env,
                               capture_output=True, text=True, timeout=300)
            outs.append([float(v) for v in r.stdout.split()] if r.returncode == 0 else None)
        # each: (first call, importing the seed module and kf, importing torch + CUDA init) in s
        if outs[0]:
            rows.append(Row("JIT: cold compile of the layer norm (first call, empty cache)",
                            times_ms={"kf": outs[0][0] * 1e3}))
        if outs[1]:
            rows.append(Row("JIT: fresh process, warm cache: first call", times_ms={"kf": outs[1][0] * 1e3}))
            rows.append(Row("JIT: fresh process, warm cache: kf import + first call",
                            times_ms={"kf": (outs[1][0] + outs[1][1]) * 1e3},
                            note=f"torch import + CUDA init before it {outs[1][2] * 1e3:.0f} ms"))
    # Host overhead per call: a kf function of a tiny tensor vs torch's own tiny op.
    f = kf.jit(lambda x: x + 1)
    x = torch.randn(16, device="cuda")
    f(x)
    torch.cuda.synchronize()
    n = 2000
    t = time.perf_counter()
    for _ in range(n):
        f(x)
    torch.cuda.synchronize()
    per_call = (time.perf_counter() - t) / n * 1e6
    t = time.perf_counter()
    for _ in range(n):
        x.add(1)
    torch.cuda.synchronize()
    torch_call = (time.perf_counter() - t) / n * 1e6
    # The same kernel launched by bare cuLaunchKernel loops with prebuilt arguments: through
    # cuda.bindings' wrapper (parameters in the kernel's ctypes slots), and through kf's
    # compiled launcher (kf.runtime._launcher, pointers as ints), when it is built. kf's
    # own calls go through whichever runtime/cuda.py chose (launcher in the note);
    # (libcuda's cuLaunchKernel through ctypes is not among them: 7.9 us against
    # cuda.bindings' 5.9, bench/RESULTS.md.)
    from kf import api as kf_api
    from kf.runtime import cuda as kf_cuda

    lane = next(iter(f._fast.values()))  # the fast lane (or call_matched) of the CompiledProgram
    program = (getattr(lane, "program", None) or lane.__self__)._launch  # the CudaProgram behind it
    kernel, args = program.kernels[0]
    bound = kernel._bound[x.get_device()]
    buffers = [x, torch.empty_like(x)]  # the program's input and output
    pointers = [buffers[i].data_ptr() for i in args]
    for i, p in enumerate(pointers):
        kernel._slots[i] = p  # what the bindings loop's params point at
    raw = torch.cuda.current_stream().cuda_stream
    (g0, g1, g2), (b0, b1, b2) = kernel.grid, kernel.block
    shared = kernel.shared_bytes
    bare = {}
    if kf_cuda._launch is not None:
        launch, fn, stream, params = kf_cuda._launch, bound.function, kernel._stream(raw), kernel._params_addr
        t = time.perf_counter()
        for _ in range(n):
            launch(fn, g0, g1, g2, b0, b1, b2, shared, stream, params, 0)
        torch.cuda.synchronize()
        bare["cuda.bindings"] = (time.perf_counter() - t) / n * 1e6
    try:
        from kf.runtime import _launcher
    except ImportError:
        _launcher = None
    if _launcher is not None:
        launch, fn = _launcher.launch, bound.handle
        t = time.perf_counter()
        for _ in range(n):
            launch(fn, g0, g1, g2, b0, b1, b2, shared, raw, *pointers)
        torch.cuda.synchronize()
        bare["C"] = (time.perf_counter() - t) / n * 1e6
    fastest = min(bare.values())
    rows.append(Row("host overhead per call (us): kf x+1 vs torch x.add(1)", times_ms={"kf": per_call, "eager": torch_call},
                    note="values in microseconds, wall clock; kf launches through " + kf_cuda.launcher() +
                         "; dispatch " + kf_api.DISPATCH.split(" (")[0] +
                         "; bare cuLaunchKernel " + ", ".join(f"{k} {v:.2f} us" for k, v in bare.items()) +
                         f"; kf/fastest bare {per_call / fastest:.2f}"))
    return rows


def table(rows: list[Row], copy_gbs: float, tflops: float) -> str:
    head = f"{'workload':<52}{'kf ms':>9}{'eager':>9}{'best':>9}{'compile':>9}{'kf GB/s':>9}{'kf TF/s':>9}{'%ceil':>7}" \
           f"{'eager/kf':>9}{'best/kf':>9}{'comp/kf':>9}{'err':>9}"
    lines = [head, "-" * len(head)]
    for r in rows:
        t = r.times_ms
        k = t.get("kf")

        def ratio(name):
            return f"{t[name] / k:9.2f}" if k and name in t else f"{'':>9}"

        gbs = r.bytes / k / 1e6 if k and r.bytes else None
        tfs = r.flops / k / 1e9 if k and r.flops else None
        if r.ceiling_gbs:  # a Vulkan row: % of that device's copy rate (memory-bound rows only)
            frac = gbs / r.ceiling_gbs if gbs and not tfs else None
        else:
            frac = tfs / tflops if tfs and tflops else (gbs / copy_gbs if gbs and copy_gbs else None)
        cells = "".join(f"{t[n]:9.3f}" if n in t else f"{'':>9}" for n in ("kf", "eager", "best", "compile"))
        if not t.get("kf") and ("torch" in t or "cuBLAS" in t):
            cells = f"{'':>9}{t.get('torch', t.get('cuBLAS')):9.3f}{'':>27}"
            gbs = r.bytes / t.get("torch", 1e9) / 1e6 if r.bytes else None
            tfs = r.flops / t.get("cuBLAS", 1e9) / 1e9 if r.flops else None
        lines.append(f"{r.workload[:51]:<52}{cells}{(f'{gbs:9.0f}' if gbs else ' ' * 9)}"
                     f"{(f'{tfs:9.1f}' if tfs else ' ' * 9)}{(f'{frac * 100:6.0f}%' if frac else ' ' * 7)}"
                     f"{ratio('eager')}{ratio('best')}{ratio('compile')}"
                     f"{(f'{r.rel_err:9.1e}' if r.rel_err is not None else ' ' * 9)}"
                     + (f"  {r.note}" if r.note else ""))
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="smaller sizes, fewer workloads")
    ap.add_argument("--only", default="", help="comma-separated texts: run the workloads whose name contains one")
    ap.add_argument("--jit", action="store_true", help="with --only: also the JIT and host-overhead rows")
    run_name.add_arguments(ap)
    args = ap.parse_args()
    only = [o for o in args.only.split(",") if o]
    out = run_name.output_path(args, "-".join(["bench", *only]))
    torch.manual_seed(int(time.time()))
    cuda = torch.cuda.is_available()  # without it, only the Vulkan rows (--only vulkan)
    dev = torch.cuda.get_device_name(0) if cuda else "no CUDA device"
    print(f"device {dev}, torch {torch.__version__}, {time.strftime('%Y-%m-%d %H:%M')}", flush=True)
    copy_gbs, tflops, rows = ceilings(args.quick) if cuda else (0.0, 0.0, [])
    print(f"ceilings: copy {copy_gbs:.0f} GB/s, bf16 GEMM {tflops:.0f} TFLOP/s", flush=True)
    vulkan_device = {}

    def save() -> str:
        text = table(rows, copy_gbs, tflops)
        run_name.write_json(out, {"device": dev, "torch": torch.__version__, "copy_gbs": copy_gbs,
                                  "gemm_tflops": tflops, "rows": [asdict(r) for r in rows], "table": text,
                                  "vulkan_device": vulkan_device})
        return text

    vk_rows = vulkan_rows(args.quick, only)
    if vk_rows:
        rows += vk_rows
        from kf.runtime import vulkan

        if vulkan.is_available():  # its properties as Vulkan names them (test/python/devices/ records them)
            vulkan_device.update(vulkan.device().properties)
        save()
    for w in workloads(args.quick) if cuda else ():
        if only and not any(o in w[0] for o in only):
            continue
        t0 = time.perf_counter()
        row = run_workload(*w)
        rows.append(row)
        print(f"  {row.workload}: {row.times_ms} err {row.rel_err} {row.note} ({time.perf_counter() - t0:.0f} s)",
              flush=True)
        save()
    if cuda and (not only or args.jit):
        rows += jit_rows()
    print(save())
    return 0


if __name__ == "__main__":
    sys.exit(main())
