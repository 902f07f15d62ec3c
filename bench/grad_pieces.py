"""The pieces of the GPT attention's backward, each as its own kf function on one target
against torch: which kernel kind computes a wrong gradient where bench/grad_check.py
finds the attention backward off on a target.

    python3 bench/grad_pieces.py --target cuda     # or vulkan
"""

from __future__ import annotations

import argparse
import sys

import torch

import kf


def mm_tn(a, b):
    return a.transpose(-2, -1) @ b


def mm_nt(a, b):
    return a @ b.transpose(-2, -1)


def mm_nn(a, b):
    return a @ b


def softmax_backward(s, mask, g):
    p = torch.softmax(s.masked_fill(mask == 0, -1e9) / 8.0, dim=-1)
    return p * (g - (g * p).sum(-1, keepdim=True))


def softmax_backward_where(s, mask, g):
    p = torch.softmax(torch.where(mask == 0, torch.full_like(s, -1e9), s / 8.0), dim=-1)
    ds = p * (g - (g * p).sum(-1, keepdim=True))
    return torch.where(mask == 0, torch.zeros_like(ds), ds) / 8.0, p


def transpose_copy(x):
    return x.transpose(-2, -1).contiguous().reshape(64, 64, 128)


def reshape_copy(x):
    return x.reshape(64, 128, 64) * 1.0


def rel(a, b) -> float:
    a, b = a.double(), b.double()
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--target", default="cuda")
    ap.add_argument("--rowwise-lanes", type=int, default=0, help="cap the rowwise strategy's vector lanes")
    ap.add_argument("--only", default="")
    args = ap.parse_args()
    # the rowwise kernels' lanes capped: a kernel variant (RowwiseVariant.max_lanes)
    variants = f"rowwise.max_lanes={args.rowwise_lanes}" if args.rowwise_lanes else ""
    dev = "cuda" if args.target == "cuda" else "cpu"
    torch.manual_seed(0)
    r = lambda *s: torch.randn(*s, device=dev)  # noqa: E731
    mask = torch.tril(torch.ones(128, 128, dtype=torch.int64, device=dev))
    cases = [
        (mm_tn, (r(64, 128, 64), r(64, 128, 128))),
        (mm_nt, (r(64, 128, 64), r(64, 128, 64))),
        (mm_nn, (r(64, 128, 128), r(64, 128, 64))),
        (softmax_backward, (r(16, 4, 128, 128), mask, r(16, 4, 128, 128))),
        (softmax_backward_where, (r(16, 4, 128, 128), mask, r(16, 4, 128, 128))),
        (transpose_copy, (r(16, 4, 128, 64),)),
        (reshape_copy, (r(16, 4, 128, 64),)),
    ]
    worst = 0.0
    for fn, xs in cases:
        if args.only and args.only not in fn.__name__:
            continue
        f = kf.jit(fn, target=args.target, variants=variants)
        try:
            out = f(*xs)
            ref = fn(*[x.double() if x.is_floating_point() else x for x in xs])
            outs = out if isinstance(out, tuple) else (out,)
            refs = ref if isinstance(ref, tuple) else (ref,)
            errs = [rel(o, q) for o, q in zip(outs, refs)]
            kinds = [line.split('kf.kernel = "')[1].split('"')[0] for line in kf.inspect(f, *xs).fused.splitlines()
                     if 'kf.kernel = "' in line]
            worst = max(worst, *errs)
            print(f"{fn.__name__:<24} errors {' '.join(f'{e:.2e}' for e in errs)}  kernels {kinds}", flush=True)
        except Exception as e:
            print(f"{fn.__name__:<24} failed: {type(e).__name__}: {str(e)[:400]}", flush=True)
    return 0 if worst < 1e-4 else 1


if __name__ == "__main__":
    sys.exit(main())
