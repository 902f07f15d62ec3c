"""Same-process A/B of kf-split-reductions' stage lengths (``ROW``, ``LAST_ROW``) on the
seed's attention under precision="fp8" (4x32x2048x128 bf16): the whole call's median
time per setting, twice over, each setting compiled afresh (an empty cache directory).

    source .device/prelude.sh && python3 bench/amax_stages.py   # writes $OUT/amax-ab.json
"""
import json
import os
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
from bench import median_ms, rotated  # noqa: E402
from seed_examples import fused_attention  # noqa: E402

import kf  # noqa: E402
from kf.passes import split_reductions as sr  # noqa: E402

shape = (4, 32, 2048, 128)
ins = rotated(lambda: tuple(torch.randn(*shape, device="cuda", dtype=torch.bfloat16) for _ in range(3)))
rows = []
for rep in range(2):
    for row, last in [(4096, 4096), (4096, 16384), (8192, 8192), (16384, 16384), (2048, 16384)]:
        sr.ROW, sr.LAST_ROW = row, last
        os.environ["KF_CACHE_DIR"] = tempfile.mkdtemp()
        f = kf.jit(fused_attention.fn, precision="fp8")
        f(*ins[0]); torch.cuda.synchronize()
        ms = median_ms(f, ins, reps=60)
        rows.append({"ROW": row, "LAST_ROW": last, "rep": rep, "call ms": ms})
        print(rows[-1], flush=True)
json.dump(rows, open(os.environ.get("OUT", "/tmp") + "/amax-ab.json", "w"), indent=1)
