"""Accuracy of kf's kernels per dtype: ‖kf − ref‖ / ‖ref‖ against a float64 reference, for
matmul, the seed's attention and the seed's layer norm, on the targets this machine has.

    python bench/accuracy.py [--targets cpu,vulkan] [--out results.json]

Inputs are fresh standard-normal draws rounded to the dtype; the reference computes in
float64 on those rounded inputs, so the error is kf's own (its accumulation and rounding
of the result), not the rounding of the inputs. Torch eager in the same dtype is measured
beside it. bench/RESULTS-accuracy.md records a run.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples"))

import kf  # noqa: E402
from seed_examples import fused_attention, metal_layer_norm  # noqa: E402

DTYPES = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}


def matmul(a, b):
    return torch.matmul(a, b)


def cases():
    yield "matmul 257x300 @ 300x129", matmul, lambda: (torch.randn(257, 300), torch.randn(300, 129))
    yield "attention 1x2x257x64 (seed)", fused_attention.fn, lambda: tuple(torch.randn(1, 2, 257, 64) for _ in range(3))
    yield "layer norm 4x1000 (seed)", metal_layer_norm.fn, lambda: (torch.randn(4, 1000), torch.randn(1000),
                                                                    torch.randn(1000))


def rel(out, ref) -> float:
    out, ref = out.double(), ref.double()
    return ((out - ref).norm() / ref.norm()).item()


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--targets", default="cpu,vulkan")
    ap.add_argument("--out", default="")
    args = ap.parse_args()
    torch.manual_seed(0)
    rows = []
    targets = args.targets.split(",")
    head = f"{'case':<30}{'dtype':>6}" + "".join(f"{'kf ' + t:>14}" for t in targets) + f"{'torch eager':>14}"
    print(head)
    for name, fn, make in cases():
        base = make()
        for dname, dtype in DTYPES.items():
            inputs = [t.to(dtype) for t in base]
            ref = fn(*[t.double() for t in inputs])
            row = {"case": name, "dtype": dname}
            for target in targets:
                try:
                    out = kf.jit(fn, target=target)(*inputs)
                    row[target] = rel(out, ref)
                except Exception as e:  # e.g. a dtype a target cannot store
                    row[target] = f"{type(e).__name__}: {str(e).splitlines()[0][:60]}"
            try:
                row["eager"] = rel(fn(*inputs), ref)
            except RuntimeError as e:  # CPU torch lacks some half kernels
                row["eager"] = f"torch: {str(e).splitlines()[0][:40]}"
            rows.append(row)
            cells = "".join(f"{row[t]:>14.2e}" if isinstance(row[t], float) else f"{'n/a':>14}" for t in targets)
            eager = f"{row['eager']:>14.2e}" if isinstance(row["eager"], float) else f"{'n/a':>14}"
            print(f"{name:<30}{dname:>6}{cells}{eager}")
    if args.out:
        Path(args.out).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
