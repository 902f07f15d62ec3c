"""kf's tensor-core GEMM plan variants on the GPU machine: each variant compiled fresh,
checked against torch (fresh random inputs, sizes off the tile grid too) and timed
beside cuBLAS and torch._scaled_mm in one process.

    source .device/prelude.sh && python3 bench/gemm_variants.py --out $OUT/gemm_variants.json

Variants are module switches of passes/strategies/matmul.py (MMA_LDMATRIX: fragments
by ldmatrix with B staged as it lies in memory; MMA_PREFETCH: the next K tile loaded
into registers before this one's products). Each variant gets its own cache folder, as
the switches are not part of the cache key.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from bench import median_ms, rel_err, rotated  # noqa: E402

import kf  # noqa: E402
from kf.passes.strategies import matmul as mm  # noqa: E402


def nn(a, b):
    return torch.matmul(a, b)


def nt(a, b):
    return torch.matmul(a, b.t())


def scaled(a, b, sa, sb):
    return torch._scaled_mm(a, b.t(), sa, sb, out_dtype=torch.bfloat16)


def inputs(kind: str, m: int, n: int, k: int):
    bf = torch.bfloat16
    if kind == "nn":
        return lambda: (torch.randn(m, k, device="cuda", dtype=bf), torch.randn(k, n, device="cuda", dtype=bf))
    if kind == "nt":
        return lambda: (torch.randn(m, k, device="cuda", dtype=bf), torch.randn(n, k, device="cuda", dtype=bf))
    f8 = torch.float8_e4m3fn
    return lambda: ((torch.randn(m, k, device="cuda") * 4).to(f8), (torch.randn(n, k, device="cuda") * 4).to(f8),
                    torch.tensor(0.5, device="cuda"), torch.tensor(0.25, device="cuda"))


FNS = {"nn": nn, "nt": nt, "fp8": scaled}


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="")
    ap.add_argument("--size", type=int, default=8192)
    args = ap.parse_args()
    torch.manual_seed(int(time.time()))
    rows = []
    s = args.size
    for kind in ("nn", "nt", "fp8"):
        make = inputs(kind, s, s, s)
        ins = rotated(make)
        ref_fn = FNS[kind]
        base = {"cuBLAS": median_ms(ref_fn, ins)}
        if kind == "fp8":
            base["cuBLAS bf16 of the same"] = median_ms(nt, [(a.bfloat16(), b.bfloat16()) for a, b, *_ in ins])
        rows.append({"kind": kind, "variant": "torch", **base})
        print(kind, base, flush=True)
        for ldm, pre in itertools.product((False, True), (False, True)):
            mm.MMA_LDMATRIX, mm.MMA_PREFETCH = ldm, pre
            os.environ["KF_CACHE_DIR"] = tempfile.mkdtemp()
            row = {"kind": kind, "variant": f"ldmatrix={ldm} prefetch={pre}"}
            f = kf.jit(FNS[kind])
            try:
                t0 = time.perf_counter()
                errs = []
                for (m, n, k) in ((s, s, s), (1000, 777, 336), (130, 264, 4096)):
                    x = make() if (m, n, k) == (s, s, s) else inputs(kind, m, n, k)()
                    out = f(*x)
                    if kind == "fp8":
                        ref = (x[0].double() @ x[1].double().t()) * (x[2] * x[3]).double()
                    else:
                        ref = ref_fn(*[t.double() for t in x])
                    errs.append(rel_err(out, ref))
                row["compile_and_check_s"] = time.perf_counter() - t0
                row["rel_err"] = errs
                if max(errs) < 2e-2:
                    row["kf"] = median_ms(f, ins)
                    row["kf/cuBLAS"] = base["cuBLAS"] / row["kf"]
                    row["TFLOP/s"] = 2 * s ** 3 / row["kf"] / 1e9
                else:
                    row["note"] = "wrong result: not timed"
            except Exception as e:  # a variant that fails to build or launch is reported
                row["note"] = f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"
            rows.append(row)
            print(row, flush=True)
            if args.out:
                Path(args.out).write_text(json.dumps({"device": torch.cuda.get_device_name(0), "rows": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
