"""kf (persistent where it applies, and forced off) and SDPA at 2048 queries (4x32 heads,
head dim 128, bf16) over 512 to 8192 keys, in one process: a linear fit over the keys
splits each kernel's time into a cost per key block and one per tile (query block).

    source .device/prelude.sh && python3 bench/key_sweep.py   (writes $OUT/sweep.json)

Session 11 found kf's per-tile cost twice SDPA's this way (bench/RESULTS.md).
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from pathlib import Path

import torch
import torch.nn.functional as F

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[1] / "examples")]
from bench import median_ms, rel_err, rotated  # noqa: E402
from seed_examples import fused_attention  # noqa: E402

from kf.passes.strategies import attention_wgmma as awg  # noqa: E402


def main() -> int:
    rows = []
    for sk in (512, 1024, 2048, 4096, 8192):
        ins = rotated(lambda: tuple(torch.randn(4, 32, s, 128, device="cuda", dtype=torch.bfloat16)
                                    for s in (2048, sk, sk)))
        row = {"sk": sk, "sdpa": median_ms(F.scaled_dot_product_attention, ins)}
        ref = F.scaled_dot_product_attention(*ins[0])
        for name, persistent in (("kf", True), ("kf not persistent", False)):
            awg.PERSISTENT = persistent
            os.environ["KF_CACHE_DIR"] = tempfile.mkdtemp()  # the switch is not in the cache key
            f = fused_attention.with_options(target="cuda")
            err = rel_err(f(*ins[0]), ref)
            row[name] = median_ms(f, ins) if err < 2e-2 else f"wrong result ({err:.2e}): not timed"
        print(row, flush=True)
        rows.append(row)
    Path(os.environ.get("OUT", "/tmp"), "sweep.json").write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
