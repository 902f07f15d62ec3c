"""GPT-2 small trained on 2 GPUs over NCCL, under DDP and under FSDP2's ``fully_shard``,
against one GPU with the same global batch: tokens/s and the losses, for kf, eager torch
and torch.compile (examples/train_gpt_parallel.py).

    python3 bench/train_gpt_parallel.py                          # all, 50 steps
    python3 bench/train_gpt_parallel.py --impl kf --mode fsdp    # a part (each run is long)
    # bench/results/train-gpt-parallel-<date>-<commit>[-<tag>].json
    python3 bench/train_gpt_parallel.py --device cpu --steps 3   # a smoke test: gloo, the small GPT

Per implementation: one process on GPU 0 with the global batch (2 x ``--batch``), then
each ``--mode`` with 2 processes of ``--batch`` sequences. Tokens/s counts the global
batch's tokens over the median step after warm-up (CUDA synchronized at each step's end;
the first steps compile). The loss check compares the ranks' mean loss at every step
with the one GPU's, the largest relative difference and the last step's reported, and
fails above float32's tolerance for 50 steps (``LOSS_RTOL``). NVLink multicast stays off
in every process (NCCL_NVLS_ENABLE=0, TORCH_SYMM_MEM_DISABLE_MULTICAST=1,
NVSHMEM_DISABLE_NVLS=1). Needs 2 CUDA GPUs; says so and stops on fewer.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples"))

import train_gpt_parallel as tp  # noqa: E402  (examples/)

os.environ.update(tp.MULTICAST_OFF)  # before torch initializes CUDA or NCCL

import torch  # noqa: E402

import run_name  # noqa: E402  (bench/, the script's folder)

#: GPT-2 small: 12 layers of width 768 and 12 heads, 1024 positions, GPT-2's vocabulary
GPT2_SMALL = {"vocab": 50257, "width": 768, "layers": 12, "heads": 12, "seq": 1024}
WORLD = 2
#: the largest relative difference, at any step, of the 2-GPU mean loss from one GPU's:
#: float32 summation order (the batch split in two, NCCL's all-reduce) over 50 AdamW steps
LOSS_RTOL = 1e-4


def _tokens_per_s(step_s: list[float], tokens: int) -> float:
    warm = step_s[min(10, len(step_s) // 2):]
    return tokens / statistics.median(warm)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=50)
    p.add_argument("--batch", type=int, default=8, help="sequences per GPU (one GPU takes 2x)")
    p.add_argument("--impl", choices=tp.IMPLS, action="append", help="repeatable; default all")
    p.add_argument("--mode", choices=tp.MODES, action="append", help="repeatable; default both")
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                   help="cpu: 2 gloo processes on examples/train_gpt.py's small GPT (a smoke test)")
    run_name.add_arguments(p)
    args = p.parse_args()
    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    cpu = args.device == "cpu"
    if not cpu and gpus < WORLD:
        sys.exit(f"bench/train_gpt_parallel.py needs {WORLD} CUDA GPUs for DDP and FSDP2 over NCCL; "
                 f"this machine has {gpus}")
    impls, modes = args.impl or list(tp.IMPLS), args.mode or list(tp.MODES)
    out = run_name.output_path(args, "train-gpt-parallel-cpu" if cpu else "train-gpt-parallel")
    config = {} if cpu else GPT2_SMALL
    device, backend = ("cpu", "gloo") if cpu else ("cuda", "nccl")
    tokens = WORLD * args.batch * (tp.tg.GPT().mask.shape[0] if cpu else GPT2_SMALL["seq"])
    results = {"config": config, "steps": args.steps, "batch_per_gpu": args.batch, "world": WORLD,
               "gpu": "CPU" if cpu else torch.cuda.get_device_name(0), "loss_rtol": LOSS_RTOL, "runs": {}}
    failed = []
    for impl in impls:
        one = tp.single(args.steps, args.batch, WORLD, impl=impl, device=device, config=config)
        row = {"1gpu": {"tokens_per_s": _tokens_per_s(one["step_s"], tokens), "losses": one["losses"]}}
        results["runs"][impl] = row
        run_name.write_json(out, results)
        for mode in modes:
            ranks = tp.run(mode, args.steps, args.batch, WORLD, impl=impl, backend=backend, config=config)
            c = tp.compare(ranks, one)
            slowest = [max(r["step_s"][i] for r in ranks) for i in range(args.steps)]
            tps = _tokens_per_s(slowest, tokens)
            row[mode] = {"tokens_per_s": tps, "speedup_vs_1gpu": tps / row["1gpu"]["tokens_per_s"],
                         "mean_losses": c["mean_losses"], "max_rel_loss_diff": c["max_rel_loss_diff"],
                         "last_loss": c["mean_losses"][-1], "last_loss_1gpu": one["losses"][-1],
                         "max_abs_weight_diff": c["max_abs_weight_diff"],
                         "loss_ok": c["max_rel_loss_diff"] <= LOSS_RTOL}
            if not row[mode]["loss_ok"]:
                failed.append(f"{impl} {mode}")
            run_name.write_json(out, results)

    print(f"{'the small GPT' if cpu else 'GPT-2 small (12 x 768, seq 1024)'}, {args.steps} steps, {args.batch} sequences per GPU, "
          f"{results['gpu']}")
    print(f"{'impl':<14} {'mode':<5} {'tokens/s':>10} {'vs 1 GPU':>9} {'loss@last':>10} {'1 GPU':>10} "
          f"{'max rel diff':>13}")
    for impl, row in results["runs"].items():
        print(f"{impl:<14} {'1gpu':<5} {row['1gpu']['tokens_per_s']:>10.0f}")
        for mode in modes:
            r = row[mode]
            print(f"{impl:<14} {mode:<5} {r['tokens_per_s']:>10.0f} {r['speedup_vs_1gpu']:>8.2f}x "
                  f"{r['last_loss']:>10.5f} {r['last_loss_1gpu']:>10.5f} {r['max_rel_loss_diff']:>13.2e}")
    if failed:
        sys.exit(f"losses beyond rtol {LOSS_RTOL} of one GPU's: {', '.join(failed)}")


if __name__ == "__main__":
    main()
