"""kf (persistent where its plan makes it so) and SDPA at 2048 queries (4x32 heads, head
dim 128, bf16) over 512 to 8192 keys, in one process: a linear fit over the keys splits
each kernel's time into a cost per key block and one per tile (query block).

    python3 bench/key_sweep.py [--out-dir DIR]   # bench/results/key-sweep-<date>-<commit>.json

With the queries fixed, a kernel's time is (key blocks x per-block cost + per-tile cost) x
tiles an SM: the slope of a least-squares line through the sweep is the key loop's cost,
its intercept what a workgroup pays once a tile (start, the first blocks in flight, the
last P V and the stores). bench/RESULTS.md has the fits.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[1] / "examples")]
import run_name  # noqa: E402
from bench import median_ms, rel_err, rotated  # noqa: E402
from seed_examples import fused_attention  # noqa: E402


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    run_name.add_arguments(ap)
    out = run_name.output_path(ap.parse_args(), "key-sweep")
    rows = []
    for sk in (512, 1024, 2048, 4096, 8192):
        ins = rotated(lambda: tuple(torch.randn(4, 32, s, 128, device="cuda", dtype=torch.bfloat16)
                                    for s in (2048, sk, sk)))
        row = {"sk": sk, "sdpa": median_ms(F.scaled_dot_product_attention, ins)}
        ref = F.scaled_dot_product_attention(*ins[0])
        f = fused_attention.with_options(target="cuda")
        err = rel_err(f(*ins[0]), ref)
        row["kf"] = median_ms(f, ins) if err < 2e-2 else f"wrong result ({err:.2e}): not timed"
        print(row, flush=True)
        rows.append(row)
        run_name.write_json(out, rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
