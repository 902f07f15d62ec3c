"""Run-time sizes: dynamic against static kernels, and the 19-length loop.

    python3 bench/dynamic_shapes.py [--target cpu|cuda|vulkan] [--only NAME,...] [--dry-run] [--out-dir DIR]
                                    [--variants attention.run_time_producer=false]

Two tables, for the seed's layer norm and attention (examples/seed_examples.py), at small
sizes (host-bound on a GPU) and at the seed's own (``_seed``: rows of 4096, 32 heads of
dim 128), and a language model's next-token loss (shifted logits and labels):

- ``speed``: at each size, the median time of the program compiled for that size
  (``dynamic=False``) and of the one program compiled with the sequence dim dynamic
  (``dynamic={...}``), and their ratio (the issue asks for >= 0.95x). Each result is
  checked against torch before it is timed.
- ``loop``: the 19 sequence lengths 320, 416, ..., 2048 with automatic dynamic (the
  default), each result checked against torch: programs compiled, compile seconds in all
  and for the first length, and the same loop under ``torch.compile(dynamic=True)`` where
  ``--torch-compile`` asks (``--loop-only``: this table alone).

A target whose programs take no run-time sizes yet compiles each size (its rows say
how many programs it compiled). ``--dry-run`` runs small sizes and 3 lengths, to check
the script; the rows go to bench/results/dynamic-<date>-<commit>.json.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT / "examples"))

import seed_examples as se  # noqa: E402

import kf  # noqa: E402

DEVICE = {"cpu": "cpu", "vulkan": "cpu", "cuda": "cuda", "metal": "mps"}


def _timed(fn, args, device: str, reps: int) -> float:
    """Median seconds of fn(*args) after a warm-up call."""
    fn(*args)
    times = []
    for _ in range(reps):
        if device == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn(*args)
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end) / 1e3)
        else:
            t0 = time.perf_counter()
            fn(*args)
            times.append(time.perf_counter() - t0)
    return statistics.median(times)


def _workloads(device: str, dtype: torch.dtype):
    """name -> (function, dynamic dims, inputs for a sequence length)."""
    def ln_inputs(n):
        return (torch.randn(1, n, 1024, device=device, dtype=dtype), torch.randn(1024, device=device, dtype=dtype),
                torch.randn(1024, device=device, dtype=dtype))

    def attn_inputs(n):
        return tuple(torch.randn(2, 8, n, 64, device=device, dtype=dtype) for _ in range(3))

    def seed_ln_inputs(n):  # the seed's rows of 4096, n of them in each of 4 sequences
        return (torch.randn(4, n, 4096, device=device, dtype=dtype), torch.randn(4096, device=device, dtype=dtype),
                torch.randn(4096, device=device, dtype=dtype))

    def seed_attn_inputs(n):  # the seed's 4 x 32 heads of dim 128
        return tuple(torch.randn(4, 32, n, 128, device=device, dtype=dtype) for _ in range(3))

    def loss_inputs(n):
        return (torch.randn(2, n, 512, device=device, dtype=dtype), torch.randint(0, 512, (2, n), device=device))

    return {
        "layer_norm": (se.metal_layer_norm.fn, {"x": [1]}, ln_inputs),
        "attention": (se.fused_attention.fn, {"q": [2], "k": [2], "v": [2]}, attn_inputs),
        "layer_norm_seed": (se.metal_layer_norm.fn, {"x": [1]}, seed_ln_inputs),
        "attention_seed": (se.fused_attention.fn, {"q": [2], "k": [2], "v": [2]}, seed_attn_inputs),
        "lm_loss": (_next_token_loss, {"logits": [1], "labels": [1]}, loss_inputs),
        "neighbours": (_neighbour_difference, {"x": [1]}, lambda n: (torch.randn(4, n, 16, device=device,
                                                                                   dtype=dtype),)),
    }


def _neighbour_difference(x):
    """Each position against the one before it along the length (slices at both ends)."""
    return (x[:, 1:] - x[:, :-1]).pow(2).mean(-1)


def _next_token_loss(logits, labels):
    """A language model's loss as training loops write it: each position predicts the next
    token (the logits but the last, the labels but the first)."""
    return torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]).float(),
                                             labels[:, 1:].reshape(-1))


def _check(got, want) -> float:
    err = (got.double() - want.double()).norm() / max(want.double().norm(), 1e-30)
    return float(err)


def _selected(device: str, dtype: torch.dtype, only: list[str]) -> dict:
    return {name: w for name, w in _workloads(device, dtype).items() if not only or any(o in name for o in only)}


def speed_rows(target: str, sizes: list[int], reps: int, dtype: torch.dtype, only: list[str],
               variants: str = "") -> list[dict]:
    device = DEVICE[target]
    rows = []
    for name, (fn, dims, inputs) in _selected(device, dtype, only).items():
        dynamic = kf.jit(fn, target=target, dynamic=dims, variants=variants)
        for n in sizes:
            args = inputs(n)
            static = kf.jit(fn, target=target, dynamic=False, variants=variants)
            want = fn(*args)
            err_s, err_d = _check(static(*args), want), _check(dynamic(*args), want)
            t_s, t_d = _timed(static, args, device, reps), _timed(dynamic, args, device, reps)
            rows.append({"table": "speed", "workload": name, "target": target, "size": n,
                         "static_us": t_s * 1e6, "dynamic_us": t_d * 1e6, "dynamic_vs_static": t_s / t_d,
                         "rel_err_static": err_s, "rel_err_dynamic": err_d})
            print(f"speed {name:10s} n={n:5d} static {t_s * 1e6:9.1f} us  dynamic {t_d * 1e6:9.1f} us  "
                  f"{t_s / t_d:5.2f}x  (err {err_s:.1e} / {err_d:.1e})", flush=True)
        rows[-1]["dynamic_programs"] = len(dynamic.compiles)
    return rows


def loop_rows(target: str, lengths: list[int], dtype: torch.dtype, torch_compile: bool,
              only: list[str], variants: str = "") -> list[dict]:
    device = DEVICE[target]
    rows = []
    for name, (fn, _, inputs) in _selected(device, dtype, only).items():
        f = kf.jit(fn, target=target, variants=variants)
        start = time.perf_counter()
        worst = 0.0
        for n in lengths:
            args = inputs(n)
            worst = max(worst, _check(f(*args), fn(*args)))
        wall = time.perf_counter() - start
        records = f.compiles
        row = {"table": "loop", "workload": name, "target": target, "lengths": len(lengths),
               "programs": len(records), "compile_s": sum(r.seconds for r in records),
               "first_compile_s": records[0].seconds if records else 0.0, "loop_wall_s": wall,
               "signatures": [r.signature for r in records], "worst_rel_err": worst}
        if torch_compile:
            g = torch.compile(fn, dynamic=True)
            start = time.perf_counter()
            for n in lengths:
                g(*inputs(n))
            row["torch_compile_loop_wall_s"] = time.perf_counter() - start
        rows.append(row)
        print(f"loop  {name:10s} {len(lengths)} lengths: {row['programs']} programs, {row['compile_s']:.2f} s "
              f"compiling ({row['first_compile_s']:.2f} s the first), loop {wall:.2f} s (worst error {worst:.1e})"
              + (f", torch.compile {row['torch_compile_loop_wall_s']:.2f} s" if torch_compile else ""), flush=True)
    return rows


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--target", default="cuda" if torch.cuda.is_available() else "cpu", choices=sorted(DEVICE))
    ap.add_argument("--dry-run", action="store_true", help="small sizes and 3 lengths: checks the script")
    ap.add_argument("--torch-compile", action="store_true", help="the loop under torch.compile(dynamic=True) too")
    ap.add_argument("--loop-only", action="store_true", help="the 19-length loop, not the speed table")
    ap.add_argument("--only", default="", help="comma-separated texts: the workloads whose name contains one")
    ap.add_argument("--out-dir", default=str(ROOT / "bench" / "results"))
    ap.add_argument("--variants", default="", help="kernel variants for every kf function "
                                                   "(attention.run_time_producer=false: the consumers' own copies)")
    args = ap.parse_args()
    only = [o for o in args.only.split(",") if o]
    dtype = torch.bfloat16 if args.target == "cuda" else torch.float32
    if args.dry_run:
        sizes, lengths, reps = [7, 257], [320, 416, 512], 3
        os.environ.setdefault("KF_CACHE_DIR", tempfile.mkdtemp(prefix="kf-bench-dyn-"))
    else:
        sizes, lengths, reps = [320, 1024, 2048, 4096], list(range(320, 2049, 96)), 20
    rows = [] if args.loop_only else speed_rows(args.target, sizes, reps, dtype, only, args.variants)
    rows += loop_rows(args.target, lengths, dtype, args.torch_compile, only, args.variants)
    commit = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True,
                            text=True).stdout.strip()
    out = Path(args.out_dir) / f"dynamic-{time.strftime('%Y%m%d')}-{commit or 'nocommit'}" \
        f"{'-dry' if args.dry_run else ''}{'-' + args.variants.replace('=', '-') if args.variants else ''}.json"
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps({"command": " ".join(sys.argv), "date": time.strftime("%Y-%m-%d %H:%M"),
                               "commit": commit, "rows": rows}, indent=1))
    print(f"rows in {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
