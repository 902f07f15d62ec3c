"""The seed's three functions on CUDA: compiled by kf, checked against torch, timed.

    python3 bench/device_seed_check.py [--out-dir DIR]   # bench/results/seed-check-<date>-<commit>.json

For each case it draws fresh random inputs, runs the seed's code unchanged (the
decorated functions from examples/seed_examples.py and examples/moe.py), compares with
torch eager in float64 as ‖kf − ref‖ / ‖ref‖ (NaN fails), and times kf and eager with
CUDA events (median of many runs after warm-up). It also measures a cold compile and
the first call of a fresh process with a warm disk cache. bench/RESULTS.md records the
table printed at the end.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples"))

import kf  # noqa: E402
import run_name  # noqa: E402  (bench/, the script's folder)
from bench import median_ms, rel_err  # noqa: E402  (bench/bench.py: one timing method for both)
from moe import moe_layer_fused  # noqa: E402
from seed_examples import fused_attention, metal_layer_norm  # noqa: E402


def cuda_time(fn, *args, reps: int = 50) -> float:
    """Median milliseconds of fn(*args) measured with CUDA events."""
    return median_ms(fn, [args], reps=reps, warmup=5)


def cases():
    def randn(*s, dtype=torch.float32):
        return torch.randn(*s, device="cuda", dtype=dtype)

    ln = metal_layer_norm.with_options(target="cuda")
    for shape in [(1, 256, 1024), (1, 3, 1000), (4, 257, 1000), (8, 4096, 4096)]:
        x, w, b = randn(*shape), randn(shape[-1]), randn(shape[-1])
        yield f"layer norm {'x'.join(map(str, shape))} f32", ln, metal_layer_norm.fn, (x, w, b), 1e-5
    x, w, b = randn(8192, 4096, dtype=torch.bfloat16), randn(4096, dtype=torch.bfloat16), randn(4096, dtype=torch.bfloat16)
    yield "layer norm 8192x4096 bf16", ln, metal_layer_norm.fn, (x, w, b), 2e-2
    for (bs, h, s, d) in [(2, 8, 256, 64), (1, 2, 257, 64), (1, 4, 1000, 128)]:
        q, k, v = randn(bs, h, s, d), randn(bs, h, s, d), randn(bs, h, s, d)
        mask = (torch.rand(s, s, device="cuda") > 0.2).float()
        yield f"attention {bs}x{h}x{s}x{d}", fused_attention, fused_attention.fn, (q, k, v), 1e-4
        yield f"attention+mask {bs}x{h}x{s}x{d}", fused_attention, fused_attention.fn, (q, k, v, mask), 1e-4
    q, k, v = (randn(4, 32, 2048, 128, dtype=torch.bfloat16) for _ in range(3))
    yield "attention 4x32x2048x128 bf16", fused_attention, fused_attention.fn, (q, k, v), 2e-2
    x, gate = randn(2, 16, 64), randn(8, 64)
    w_in, w_out = randn(8, 64, 128) / 8, randn(8, 128, 64) / 11
    moe = lambda x, g, a, b: moe_layer_fused(x, g, [a, b])  # noqa: E731
    moe_ref = lambda x, g, a, b: moe_layer_fused.fn(x, g, [a, b])  # noqa: E731
    yield "moe 2x16x64, 8 experts, top-2", moe, moe_ref, (x, gate, w_in, w_out), 1e-4


FRESH = """
import sys, time
t0 = time.perf_counter()
sys.path.insert(0, {examples!r})
import torch
from seed_examples import metal_layer_norm
ln = metal_layer_norm.with_options(target="cuda")
x = torch.randn(1, 256, 1024, device="cuda"); w = torch.randn(1024, device="cuda"); b = torch.randn(1024, device="cuda")
torch.cuda.synchronize()
t1 = time.perf_counter()
y = ln(x, w, b); torch.cuda.synchronize()
t2 = time.perf_counter()
print(f"{{t2 - t0:.4f}} {{t2 - t1:.4f}} {{'mlir' in sys.modules}}")
"""


def fresh_process(cache: str) -> tuple[float, float, bool]:
    env = dict(os.environ, KF_CACHE_DIR=cache)
    r = subprocess.run([sys.executable, "-c", FRESH.format(examples=str(ROOT / "examples"))], env=env,
                       capture_output=True, text=True, timeout=300)
    if r.returncode:
        raise RuntimeError(r.stderr[-2000:])
    total, call, mlir = r.stdout.split()
    return float(total), float(call), mlir == "True"


def main() -> int:
    ap = argparse.ArgumentParser()
    run_name.add_arguments(ap)
    out = run_name.output_path(ap.parse_args(), "seed-check")
    torch.manual_seed(int(time.time()))
    print("device:", torch.cuda.get_device_name(0), "torch", torch.__version__)
    rows, failures = [], 0
    for name, fn, ref_fn, inputs, tol in cases():
        try:
            start = time.perf_counter()
            out = fn(*inputs)
            torch.cuda.synchronize()
            first = time.perf_counter() - start
            ref = ref_fn(*[t.double() if t.is_floating_point() else t for t in inputs])
            err = rel_err(out, ref)
            ok = err == err and err <= tol
            kf_ms, eager_ms = cuda_time(fn, *inputs), cuda_time(ref_fn, *inputs)
        except Exception as e:  # report and go on: one run checks every case
            rows.append({"case": name, "error": f"{type(e).__name__}: {str(e)[:300]}"})
            failures += 1
            print(f"{name:<34} ERROR {type(e).__name__}: {str(e)[:300]}")
            continue
        failures += not ok
        row = {"case": name, "rel_err": err, "ok": ok, "first_call_s": first, "kf_ms": kf_ms, "eager_ms": eager_ms}
        rows.append(row)
        print(f"{name:<34} err {err:9.2e} {'ok ' if ok else 'BAD'}  first {first:7.2f}s  kf {kf_ms:9.4f} ms"
              f"  eager {eager_ms:9.4f} ms  eager/kf {eager_ms / kf_ms:6.2f}")
    with tempfile.TemporaryDirectory() as cache:
        cold = fresh_process(cache)
        warm = fresh_process(cache)
    print(f"fresh process, cold cache: {cold[0]:.2f} s total, first call {cold[1]:.2f} s")
    print(f"fresh process, warm cache: {warm[0]:.3f} s total incl. imports, first call {warm[1] * 1e3:.1f} ms, "
          f"mlir imported: {warm[2]}")
    result = {"device": torch.cuda.get_device_name(0), "torch": torch.__version__, "rows": rows,
              "cold_process": cold, "warm_process": warm}
    run_name.write_json(out, result)
    print(f"{len(rows) - failures}/{len(rows)} cases ok")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
