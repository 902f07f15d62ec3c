"""Accuracy of kf's kernels per dtype: ‖kf − ref‖ / ‖ref‖ against a float64 reference, for
matmul, the seed's attention and the seed's layer norm, on the targets this machine has,
and for fp8: ``precision="fp8"`` (per-tensor scaled E4M3 operands of every matmul) and
``torch._scaled_mm`` with e4m3 operands (kf's fp8 GEMM, which is wgmma on the H200).

    python3 bench/accuracy.py [--targets cpu,vulkan] [--out-dir DIR]
    python3 bench/accuracy.py --targets cuda --gpu-shapes        # on the GPU machine

Inputs are fresh standard-normal draws rounded to the dtype; the reference computes in
float64 on those rounded inputs, so the error is kf's own (its accumulation and rounding
of the result), not the rounding of the inputs. Torch eager in the same dtype (on the
first target's device) is measured beside it; for ``_scaled_mm`` that is torch's own fp8
GEMM (cuBLAS). ``--gpu-shapes`` adds the sizes at which the CUDA target takes its
tensor-core kernels (wgmma on sm_90a): the small shapes run kf's general kernels there.
The rows go to bench/results/accuracy-<targets>-<date>-<commit>.json (bench/run_name.py);
bench/RESULTS.md records the tables.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples"))

import kf  # noqa: E402
import run_name  # noqa: E402  (bench/, the script's folder)
from seed_examples import fused_attention, metal_layer_norm  # noqa: E402

DTYPES = {"f32": torch.float32, "f16": torch.float16, "bf16": torch.bfloat16}
E4M3 = torch.float8_e4m3fn
DEVICE = {"cpu": "cpu", "vulkan": "cpu", "cuda": "cuda", "metal": "mps"}


def matmul(a, b):
    return torch.matmul(a, b)


def scaled_mm(a8, b8, sa, sb):
    """torch._scaled_mm of e4m3 operands with per-tensor scales, f32 result (B given as
    rows of K, as _scaled_mm wants it column-major)."""
    return torch._scaled_mm(a8, b8.t(), sa, sb, out_dtype=torch.float32)


def cases(gpu_shapes: bool):
    yield "matmul 257x300 @ 300x129", matmul, lambda: (torch.randn(257, 300), torch.randn(300, 129)), True
    yield "attention 1x2x257x64 (seed)", fused_attention.fn, \
        lambda: tuple(torch.randn(1, 2, 257, 64) for _ in range(3)), True
    yield "layer norm 4x1000 (seed)", metal_layer_norm.fn, \
        lambda: (torch.randn(4, 1000), torch.randn(1000), torch.randn(1000)), False
    if gpu_shapes:
        yield "matmul 2048x2048 @ 2048x2048", matmul, lambda: (torch.randn(2048, 2048), torch.randn(2048, 2048)), True
        yield "attention 2x8x1024x128 (seed)", fused_attention.fn, \
            lambda: tuple(torch.randn(2, 8, 1024, 128) for _ in range(3)), True
        yield "layer norm 1024x4096 (seed)", metal_layer_norm.fn, \
            lambda: (torch.randn(1024, 4096), torch.randn(4096), torch.randn(4096)), False


def rel(out, ref) -> float:
    out, ref = out.detach().cpu().double(), ref.detach().cpu().double()
    return ((out - ref).norm() / ref.norm()).item()


def _run(fn, inputs, target: str, precision: str = "auto"):
    dev = DEVICE[target]
    f = kf.jit(fn, target=target, precision=precision)
    return f(*[t.to(dev) for t in inputs])


def _cell(v) -> str:
    return f"{v:>14.2e}" if isinstance(v, float) else f"{'n/a':>14}"


def _measure(row: dict, targets: list[str], fn, inputs: list, ref, precision: str, eager_fn) -> None:
    for target in targets:
        try:
            row[target] = rel(_run(fn, inputs, target, precision), ref)
        except Exception as e:  # e.g. a dtype a target cannot store
            row[target] = f"{type(e).__name__}: {str(e).splitlines()[0][:60]}"
    if eager_fn is None:
        row["eager"] = "n/a"
        return
    try:
        dev = DEVICE[targets[0]]
        row["eager"] = rel(eager_fn(*[t.to(dev) for t in inputs]), ref)
    except (RuntimeError, NotImplementedError) as e:  # CPU torch lacks some half kernels
        row["eager"] = f"torch: {str(e).splitlines()[0][:40]}"


def _scaled_inputs(a: torch.Tensor, b: torch.Tensor) -> list[torch.Tensor]:
    """e4m3 operands scaled to their range per tensor, with the inverse scales."""
    out = []
    for x in (a, b):
        s = 448.0 / x.abs().max().clamp(min=1e-12)
        out.append((x * s).clamp(-448, 448).to(E4M3))
    return out + [torch.tensor(1.0) / (448.0 / a.abs().max()), torch.tensor(1.0) / (448.0 / b.abs().max())]


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--targets", default="cpu,vulkan")
    ap.add_argument("--gpu-shapes", action="store_true", help="also the sizes that take tensor-core kernels on CUDA")
    run_name.add_arguments(ap)
    args = ap.parse_args()
    targets = args.targets.split(",")
    out = run_name.output_path(args, "-".join(["accuracy", *targets]))
    torch.manual_seed(0)
    rows = []
    head = f"{'case':<32}{'dtype':>16}" + "".join(f"{'kf ' + t:>14}" for t in targets) + f"{'torch eager':>14}"
    print(head)

    def show(row):
        rows.append(row)
        print(f"{row['case']:<32}{row['dtype']:>16}" + "".join(_cell(row[t]) for t in targets) + _cell(row["eager"]),
              flush=True)

    for name, fn, make, has_matmul in cases(args.gpu_shapes):
        base = make()
        for dname, dtype in DTYPES.items():
            inputs = [t.to(dtype) for t in base]
            ref = fn(*[t.double() for t in inputs])
            row = {"case": name, "dtype": dname}
            _measure(row, targets, fn, inputs, ref, "auto", fn)
            show(row)
        if has_matmul:
            # precision="fp8": every matmul's operands scaled per tensor and rounded to E4M3
            # (the attention's probabilities too), products summed in f32; bf16 inputs
            inputs = [t.to(torch.bfloat16) for t in base]
            ref = fn(*[t.double() for t in inputs])
            row = {"case": name, "dtype": "fp8 (bf16 in)"}
            _measure(row, targets, fn, inputs, ref, "fp8", None)
            show(row)
        if fn is matmul:
            # kf's fp8 GEMM as torch._scaled_mm reaches it: e4m3 operands, per-tensor scales;
            # eager is torch's own fp8 GEMM where the device has one
            a, b = base
            a8, b8t, sa, sb = _scaled_inputs(a, b.t().contiguous())
            ref = (a8.double() * sa.double()) @ (b8t.double() * sb.double()).t()
            row = {"case": name, "dtype": "_scaled_mm e4m3"}
            eager = scaled_mm if "cuda" in targets[:1] else None
            _measure(row, targets, scaled_mm, [a8, b8t, sa, sb], ref, "auto", eager)
            show(row)
    run_name.write_json(out, rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
