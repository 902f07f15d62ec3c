"""fp8 attention on the H200: the seed's ``fused_attention`` with ``precision="fp8"``
beside kf's bf16 kernel, torch's SDPA and eager, in one process.

    python3 bench/fp8_attention.py [--shapes 4x32x2048x128,...] [--variants KIND.FIELD=VALUE] [--out-dir DIR]

writes bench/results/fp8-attention-<date>-<commit>[-<variants>].json (bench/run_name.py).

Per shape, bf16 q, k, v with fresh random values: the kf bf16 call, the kf fp8 call
(its kernels: amax and quantization of q, k and v, then one attention kernel on fp8
operands, see passes/apply_precision.py), and -- from ``kf.profile`` -- the fp8
attention kernel's own time, which is the comparison issue 7 asks for (fp8 attention
kernel against kf's bf16 one, ≥ 1.3x); the quantization's time is reported beside it.
Then the call on fp8 tensors the caller quantized (``caller_attention``: q8, k8, v8 and
their scales; under ``precision="fp8"`` they reach the fp8 kernel as they are, V through a
transpose kernel), and the same with V given K-major (``caller_attention_vt``: read as it
is). Errors are relative (Frobenius) against float64 attention of the bf16 inputs.
``--variants`` sets kernel variants (kf's option ``variants``), for an A/B of a kernel
variant across runs.
"""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path.insert(0, str(Path(__file__).resolve().parent))
import run_name  # noqa: E402
from bench import median_ms, rel_err, rotated  # noqa: E402

import kf  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
from fp8_caller import caller_attention, caller_attention_vt  # noqa: E402
from seed_examples import fused_attention  # noqa: E402


def quantized(x):
    """(x8, 1 / scale): per-tensor E4M3FN, as a caller's own quantization would give."""
    scale = 448 / x.abs().amax().float()
    return (x.float() * scale).to(torch.float8_e4m3fn), (1 / scale).reshape(())


def reference(q, k, v):
    d = q.shape[-1]
    return torch.softmax(q.double() @ k.double().transpose(-1, -2) / math.sqrt(d), -1) @ v.double()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--shapes", default="4x32x2048x128,2x32x4096x128,4x32x2048x64")
    ap.add_argument("--variants", default="",
                    help="kernel variants for every kf call (the option variants: attention.reverse_q_blocks=false)")
    run_name.add_arguments(ap)
    args = ap.parse_args()
    # a run with variants set is named after them unless --tag says otherwise
    args.tag = args.tag or "-".join(args.variants.split())
    out = run_name.output_path(args, "fp8-attention")
    kf_attention = fused_attention.with_options(variants=args.variants)
    fp8 = kf_attention.with_options(precision="fp8")
    rows = []
    for text in args.shapes.split(","):
        b, h, s, d = (int(x) for x in text.split("x"))
        flops = 4 * b * h * s * s * d

        def make():
            return tuple(torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16) for _ in range(3))

        ins = rotated(make)
        q, k, v = ins[0]
        ref = reference(q, k, v)
        row = {"shape": text, "errors": {"kf bf16": rel_err(kf_attention(q, k, v), ref),
                                         "kf fp8": rel_err(fp8(q, k, v), ref),
                                         "sdpa bf16": rel_err(F.scaled_dot_product_attention(q, k, v), ref)}}
        ms = {"kf bf16": median_ms(kf_attention, ins), "kf fp8 (call)": median_ms(fp8, ins),
              "sdpa bf16": median_ms(F.scaled_dot_product_attention, ins),
              "eager bf16": median_ms(fused_attention.fn, ins[:2], reps=10)}
        with kf.profile() as prof:
            for i in range(20):
                fp8(*ins[i % len(ins)])
            torch.cuda.synchronize()
        kernels = prof.kernels()
        att = [x for x in kernels if x.strategy == "attention"]
        ms["kf fp8 attention kernel"] = min(x.min_s for x in att) * 1e3 if att else float("nan")
        ms["kf fp8 quantization (sum of the other kernels, per call)"] = sum(
            x.total_s for x in kernels if x.strategy != "attention") / 20 * 1e3
        row["ms"] = ms
        row["kernels"] = [{"kernel": x.kernel, "strategy": x.strategy, "mean ms": x.mean_s * 1e3,
                           "min ms": x.min_s * 1e3, "GB/s": x.gbps, "registers": x.ptxas.get("registers")}
                          for x in kernels]
        row["TFLOP/s"] = {k_: flops / t / 1e9 for k_, t in ms.items() if "quantization" not in k_ and t == t}
        caller = kf.jit(caller_attention, precision="fp8", variants=args.variants)
        ins8 = [tuple(a for x in qkv for a in quantized(x)) for qkv in ins]
        ins8 = [(t[0], t[2], t[4], t[1], t[3], t[5]) for t in ins8]
        row["errors"]["kf fp8 (caller's fp8 tensors)"] = rel_err(caller(*ins8[0]), ref)
        ms["kf fp8 (caller's fp8 tensors)"] = median_ms(caller, ins8)
        row["fp8 call on the caller's fp8 tensors / bf16 call speedup"] = (
            ms["kf bf16"] / ms["kf fp8 (caller's fp8 tensors)"])
        caller_vt = kf.jit(caller_attention_vt, precision="fp8", variants=args.variants)
        ins8t = [(t[0], t[1], t[2].transpose(-1, -2).contiguous(), *t[3:]) for t in ins8]
        row["errors"]["kf fp8 (caller's fp8 tensors, V K-major)"] = rel_err(caller_vt(*ins8t[0]), ref)
        ms["kf fp8 (caller's fp8 tensors, V K-major)"] = median_ms(caller_vt, ins8t)
        row["fp8 call on the caller's fp8 tensors, V K-major / bf16 call speedup"] = (
            ms["kf bf16"] / ms["kf fp8 (caller's fp8 tensors, V K-major)"])
        row["fp8 kernel / bf16 kernel speedup"] = ms["kf bf16"] / ms["kf fp8 attention kernel"]
        row["fp8 call / bf16 call speedup"] = ms["kf bf16"] / ms["kf fp8 (call)"]
        print(json.dumps(row, indent=1), flush=True)
        rows.append(row)
        run_name.write_json(out, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
