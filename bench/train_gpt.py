"""examples/train_gpt.py on CUDA: the GPT trained with kf's kernels, timed against eager
torch and torch.compile.

    python3 bench/train_gpt.py [--steps 50] [--out-dir DIR]   # bench/results/train-gpt-<date>-<commit>.json
    python3 bench/train_gpt.py --device cpu                   # the same comparison on the CPU target

Three runs from the same initial weights on the same batches: the kf model (layer norm,
causal attention and GELU as kf programs in forward and backward, target cuda), the same
model eagerly (the very same Python functions, run by torch) and the eager model under
``torch.compile``. It prints each run's loss curve against eager's (the largest relative
difference over the steps) and the median step time after warm-up (CUDA synchronized at
each step's end). The losses check the derived backward functions end to end (a wrong
gradient shows as a drifting loss; bench/grad_check.py then names the kernel); the step
times show what a small model's many small kernels cost against torch's own.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples"))

import run_name  # noqa: E402  (bench/, the script's folder)
import train_gpt as tg  # noqa: E402  (examples/train_gpt.py: examples/ is searched first)


def run(model, steps: int, batch: int, device: str) -> dict:
    times: list[float] = []
    losses = tg.train(model, steps=steps, batch=batch, device=device, step_times=times)
    warm = times[min(10, steps // 2):]
    return {"losses": losses, "median_step_ms": 1e3 * statistics.median(warm), "first_step_s": times[0]}


def _device_name(device: str) -> str:
    return torch.cuda.get_device_name() if device == "cuda" else "CPU"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--device", default="cuda", help="cpu runs the same comparison on the CPU target (a smoke test)")
    run_name.add_arguments(p)
    args = p.parse_args()
    device = args.device
    if device == "cuda" and not torch.cuda.is_available():
        sys.exit("bench/train_gpt.py needs a CUDA device (or --device cpu)")
    out = run_name.output_path(args, "train-gpt" if device == "cuda" else f"train-gpt-{device}")

    torch.manual_seed(0)
    kf_model = tg.GPT(use_kf=True).to(device)
    eager = copy.deepcopy(kf_model).set_kf(False)
    compiled = torch.compile(copy.deepcopy(kf_model).set_kf(False))

    results = {
        "kf": run(kf_model, args.steps, args.batch, device),
        "eager": run(eager, args.steps, args.batch, device),
        "torch.compile": run(compiled, args.steps, args.batch, device),
    }
    ref = results["eager"]["losses"]
    print(f"GPT 2 layers, width 256, seq 128, batch {args.batch}, {args.steps} steps on "
          f"{_device_name(device)}")
    print(f"{'run':<14} {'median step':>12} {'vs eager':>9} {'first step':>11} {'max rel loss diff':>18}")
    for name, r in results.items():
        worst = max(abs(a - b) / abs(b) for a, b in zip(r["losses"], ref))
        r["max_rel_loss_diff_vs_eager"] = worst
        speedup = results["eager"]["median_step_ms"] / r["median_step_ms"]
        print(f"{name:<14} {r['median_step_ms']:>9.2f} ms {speedup:>8.2f}x {r['first_step_s']:>9.1f} s "
              f"{worst:>18.2e}")
    run_name.write_json(out, {"batch": args.batch, "steps": args.steps, "device": _device_name(device),
                              "runs": results})


if __name__ == "__main__":
    main()
