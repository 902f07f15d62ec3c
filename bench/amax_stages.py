"""Same-process A/B of kf-split-reductions' stage lengths (``ROW``, ``LAST_ROW``) on the
seed's attention under precision="fp8" (4x32x2048x128 bf16): the whole call's median
time per setting, twice over, each setting compiled afresh (an empty cache directory).
The amax's partial maxima are reduced in row stages; how long a row is trades launches
against parallelism, and only the whole call's time says which wins (kf.profile's times
of microsecond kernels vary too much from run to run to compare stages one by one).

    python3 bench/amax_stages.py [--out-dir DIR]   # bench/results/amax-stages-<date>-<commit>.json
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
import run_name  # noqa: E402
from bench import median_ms, rotated  # noqa: E402
from seed_examples import fused_attention  # noqa: E402

import kf  # noqa: E402
from kf.passes import split_reductions as sr  # noqa: E402

#: (ROW, LAST_ROW) settings timed, in order
SETTINGS = [(4096, 4096), (4096, 16384), (8192, 8192), (16384, 16384), (2048, 16384)]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    run_name.add_arguments(ap)
    out = run_name.output_path(ap.parse_args(), "amax-stages")
    shape = (4, 32, 2048, 128)
    ins = rotated(lambda: tuple(torch.randn(*shape, device="cuda", dtype=torch.bfloat16) for _ in range(3)))
    rows = []
    for rep in range(2):
        for row, last in SETTINGS:
            sr.ROW, sr.LAST_ROW = row, last
            os.environ["KF_CACHE_DIR"] = tempfile.mkdtemp()  # the stage lengths are not in the cache key
            f = kf.jit(fused_attention.fn, precision="fp8")
            f(*ins[0])
            torch.cuda.synchronize()
            rows.append({"ROW": row, "LAST_ROW": last, "rep": rep, "call ms": median_ms(f, ins, reps=60)})
            print(rows[-1], flush=True)
            run_name.write_json(out, rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
