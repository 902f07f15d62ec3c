"""The attention rows of bench/training.py: the seed attention forward + backward under
autograd (bf16), against SDPA, eager and torch.compile, at head dims 64 and 128 and
sequences 2048 and 4096 (batch 4, 32 heads), without a mask and with a causal mask
tensor (SDPA then runs with ``is_causal=True``, which reads no mask).

Every row is checked before it is timed: the gradients of q, k and v (and the output)
of kf and of eager bf16 against float64 eager, as relative Frobenius errors; kf's must be
within ``TOLERANCE`` and no worse than twice eager's, else the row says so and kf is not
timed. Beside each time the row records the peak memory of one step
(``torch.cuda.max_memory_allocated`` above what was allocated before it), in MiB.

    python3 bench/training_attention.py            # on the GPU machine; prints the rows
    python3 bench/training_attention.py --quick    # seq 2048 only

bench/training.py imports ``attention_rows()``, which returns the rows as dicts.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Callable

import torch
import torch.nn.functional as F

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "examples"))

from seed_examples import fused_attention  # noqa: E402

#: Relative error of a bf16 gradient against float64 that a row accepts.
TOLERANCE = 2e-2

#: (batch, heads, seq, head dim, causal)
CASES = [(4, 32, s, d, causal) for d in (128, 64) for s in (2048, 4096) for causal in (False, True)]


def _step(forward: Callable, q, k, v, mask, do):
    """One forward + backward: the output and the gradients of q, k and v."""
    qq, kk, vv = (t.detach().requires_grad_() for t in (q, k, v))
    out = forward(qq, kk, vv, mask)
    grads = torch.autograd.grad(out, (qq, kk, vv), do)
    return (out.detach(), *grads)


def _rel(a: torch.Tensor, b: torch.Tensor) -> float:
    a, b = a.double(), b.double()
    if not torch.isfinite(a).all():
        return float("nan")
    return ((a - b).norm() / b.norm().clamp_min(1e-30)).item()


def _time_ms(fn: Callable[[], object], device: str, reps: int, warmup: int = 3) -> float:
    """Median ms of fn() (CUDA events on the GPU)."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        if device == "cuda":
            a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            a.record()
            fn()
            b.record()
            b.synchronize()
            times.append(a.elapsed_time(b))
        else:
            t0 = time.perf_counter()
            fn()
            times.append((time.perf_counter() - t0) * 1e3)
    times.sort()
    return times[len(times) // 2]


def _peak_mib(fn: Callable[[], object], device: str) -> float | None:
    if device != "cuda":
        return None
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    fn()
    torch.cuda.synchronize()
    return (torch.cuda.max_memory_allocated() - before) / 2**20


def _reference(q, k, v, mask, do):
    """The float64 eager step, a batch element at a time (at 4 x 32 x 4096 x 4096 its
    scores and probabilities would take some 80 GiB at once)."""
    md = None if mask is None else mask.double()
    parts = [_step(fused_attention.fn, *(t[i:i + 1].double() for t in (q, k, v)), md, do[i:i + 1].double())
             for i in range(q.shape[0])]
    return tuple(torch.cat(xs) for xs in zip(*parts))


def _sdpa(causal: bool):
    def forward(q, k, v, mask):
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    return forward


def attention_rows(quick: bool = False, device: str = "cuda", cases=None, reps: int = 20) -> list[dict]:
    """The rows (``CASES``, seq 2048 only where ``quick``): per row ``workload``,
    ``times_ms`` and ``peak_mib`` by implementation (kf, sdpa, eager, compile),
    ``rel_err`` (kf's and eager bf16's worst gradient error against float64) and a
    ``note`` where something failed or was refused."""
    cases = cases if cases is not None else [c for c in CASES if not quick or c[2] == 2048]
    eager = fused_attention.fn
    kf_fn = fused_attention if device == "cuda" else fused_attention.with_options(target=device)
    try:
        compiled = torch.compile(eager)
    except Exception:  # torch.compile unavailable: the rows say so
        compiled = None
    rows = []
    for b, h, s, d, causal in cases:
        torch.manual_seed(s + d)
        q, k, v, do = (torch.randn(b, h, s, d, device=device, dtype=torch.bfloat16) for _ in range(4))
        mask = torch.ones(s, s, device=device).tril() if causal else None
        row = {"workload": f"attention fwd+bwd {b}x{h}x{s}x{d}" + (" causal mask tensor" if causal else ""),
               "times_ms": {}, "peak_mib": {}, "rel_err": {}, "note": ""}
        ref = _reference(q, k, v, mask, do)
        impls = {"kf": kf_fn, "sdpa": _sdpa(causal), "eager": eager, "compile": compiled}
        for impl in ("eager", "kf"):  # eager's error bounds kf's
            try:
                got = _step(impls[impl], q, k, v, mask, do)
                row["rel_err"][impl] = max(_rel(x, r) for x, r in zip(got, ref))
            except Exception as e:
                row["note"] += f" {impl} failed: {type(e).__name__}: {str(e).splitlines()[0][:160]}"
                impls[impl] = None
        del ref
        err = row["rel_err"].get("kf")
        if err is not None and not (err <= TOLERANCE and err <= 2 * max(row["rel_err"].get("eager", 0.0), 1e-3)):
            row["note"] += f" kf gradients wrong (rel err {err:.2e}); not timed"
            impls["kf"] = None
        for impl, forward in impls.items():
            if forward is None:
                continue
            step = (lambda forward=forward: _step(forward, q, k, v, mask, do))
            try:
                row["times_ms"][impl] = _time_ms(step, device, reps)
                row["peak_mib"][impl] = _peak_mib(step, device)
            except Exception as e:
                row["note"] += f" {impl} failed: {type(e).__name__}: {str(e).splitlines()[0][:160]}"
        row["note"] = row["note"].strip()
        rows.append(row)
    return rows


def table(rows: list[dict]) -> str:
    impls = ("kf", "sdpa", "eager", "compile")
    out = ["| row | " + " | ".join(f"{i} ms (MiB)" for i in impls) + " | kf / sdpa | rel err kf / eager | note |",
           "| --- |" + " --- |" * (len(impls) + 3)]
    for r in rows:
        cells = []
        for i in impls:
            t, m = r["times_ms"].get(i), r["peak_mib"].get(i)
            cells.append("-" if t is None else f"{t:.2f}" + ("" if m is None else f" ({m:.0f})"))
        kf_t, sdpa_t = r["times_ms"].get("kf"), r["times_ms"].get("sdpa")
        speed = f"{sdpa_t / kf_t:.2f}x" if kf_t and sdpa_t else "-"
        errs = " / ".join(f"{r['rel_err'][i]:.1e}" if i in r["rel_err"] else "-" for i in ("kf", "eager"))
        out.append(f"| {r['workload']} | " + " | ".join(cells) + f" | {speed} | {errs} | {r['note']} |")
    return "\n".join(out)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="seq 2048 only")
    ap.add_argument("--reps", type=int, default=20)
    args = ap.parse_args()
    if not torch.cuda.is_available():
        print("bench/training_attention.py times on a CUDA GPU; none here", file=sys.stderr)
        return 1
    print(table(attention_rows(args.quick, reps=args.reps)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
