"""Regenerate the profiler and explain samples in docs/ (what README's "Debugging and
profiling" shows), for the targets of this machine:

    python docs/make_samples.py --targets cpu,vulkan --tag cpu-vulkan          # here
    python docs/make_samples.py --targets cuda --tag h200 [--out DIR]          # on the H200

Each run writes ``profile-<tag>.txt`` (kf.explain of every function, then prof.table()),
``roofline-<tag>.png`` and ``trace-<tag>.json`` (open it in https://ui.perfetto.dev).
The workloads are the seed's functions plus a GELU MLP, sized for the target: small on
the CPU and lavapipe (which run GPU kernels on two CPU cores here), large on a GPU.
"""

from __future__ import annotations

import argparse
import io
import os
import sys
import traceback

import torch

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "examples"))

import kf  # noqa: E402
import seed_examples as se  # noqa: E402


def gelu_mlp(x, w1, w2):
    h = torch.nn.functional.gelu(torch.matmul(x, w1))
    return torch.matmul(h, w2)


def workloads(target: str):
    """(name, function, arguments) for a target, on its device."""
    if target == "cuda":
        dev, dt = "cuda", torch.bfloat16
        n, d = 4096, 4096
        q = [torch.randn(4, 16, 2048, 64, device=dev, dtype=dt) for _ in range(3)]
        x = torch.randn(2048, 4096, device=dev, dtype=dt)
        w1 = torch.randn(4096, 4096, device=dev, dtype=dt) / 64
        w2 = torch.randn(4096, 4096, device=dev, dtype=dt) / 64
    else:
        dev, dt = "cpu", torch.float32
        n, d = 256, 1024
        q = [torch.randn(1, 4, 256, 64) for _ in range(3)]
        x, w1, w2 = torch.randn(128, 256), torch.randn(256, 512) / 16, torch.randn(512, 256) / 22
    ln_args = (torch.randn(n, d, device=dev, dtype=dt), torch.randn(d, device=dev, dtype=dt),
               torch.randn(d, device=dev, dtype=dt))
    return [
        ("layer_norm", se.metal_layer_norm.fn, ln_args),
        ("attention", se.fused_attention.fn, tuple(q)),
        ("gelu_mlp", gelu_mlp, (x, w1, w2)),
    ]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--targets", default="cpu,vulkan")
    ap.add_argument("--tag", default="cpu-vulkan")
    ap.add_argument("--out", default=os.path.dirname(os.path.abspath(__file__)))
    ap.add_argument("--reps", type=int, default=10)
    args = ap.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    report = io.StringIO()
    functions = []
    for target in args.targets.split(","):
        for name, fn, fargs in workloads(target):
            f = kf.jit(fn, target=target)
            try:
                print(f"## kf.explain: {name} on {target}\n", file=report)
                kf.explain(f, *fargs, file=report)
                print(file=report)
                f(*fargs)  # compile and warm up outside the profile
                functions.append((f, fargs))
            except Exception:
                print(f"{name} on {target} failed:\n{traceback.format_exc()}", file=report)
                print(report.getvalue()[-3000:], file=sys.stderr)
    with kf.profile() as prof:
        for _ in range(args.reps):
            for f, fargs in functions:
                f(*fargs)
    if torch.cuda.is_available():
        torch.cuda.synchronize()
    print(f"## kf.profile: {args.reps} calls of each function\n", file=report)
    print("```", file=report)
    prof.table(file=report)
    print("```", file=report)
    if functions:
        # kf launches in torch.profiler's view, under the function's name.
        f, fargs = functions[0]
        with torch.profiler.profile() as tp:
            f(*fargs)
        keys = sorted({e.key for e in tp.key_averages()})
        print(f"\ntorch.profiler sees {f.fn.__name__}: {f.fn.__name__ in keys} ({len(keys)} event names)",
              file=report)
    text = report.getvalue()
    with open(os.path.join(args.out, f"profile-{args.tag}.txt"), "w") as out:
        out.write(text)
    prof.export_chrome_trace(os.path.join(args.out, f"trace-{args.tag}.json"))
    prof.roofline(os.path.join(args.out, f"roofline-{args.tag}.png"),
                  title=f"kf kernels against the roofline ({args.targets})")
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
