"""kf's plan variants on the GPU machine, GEMM, attention and row-wise: each variant
compiled fresh, checked against torch (fresh random inputs, sizes off the tile grid
too) and timed beside cuBLAS / torch._scaled_mm / SDPA / torch's row-wise kernels in one
process.

    source .device/prelude.sh && python3 bench/variants.py --out $OUT/variants.json [--only gemm|attention|rowwise|elementwise]

Row-wise variants are the rowwise strategy's kernel variants (ROWWISE_VARIANTS: registers
mode or the loop kernel, reciprocals, the register cap, when weights are loaded, threads a
row), given as the option ``variants`` like GEMM's;
``--rowwise-kinds 32768`` / ``8192x4096`` splits the run in two calls of a few minutes.

Elementwise variants (``--only elementwise``, ELEMENTWISE_VARIANTS) are the elementwise
strategy's kernel variants: vectors a thread (``items_per_thread``) and ``short_forms``
(the short GELU/sigmoid for bf16/f16 results, or libdevice's accurate math), on bias+GELU
(exact and tanh), bias+sigmoid and x*2+b.

GEMM and attention variants are the strategies' kernel variants, given as the option
``variants`` (GEMM_VARIANTS below: the cp.async pipeline depth, wgmma groups in flight,
tile widths, workgroup grouping; ATTENTION_VARIANTS: the order of query blocks). Each
variant compiles into a cache folder of its own, so that its compile time is measured.
"""

from __future__ import annotations

import argparse
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

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
from seed_examples import fused_attention  # noqa: E402


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


#: GEMM plan variants: the matmul strategy's kernel variants (the option ``variants``,
#: passes/strategies/matmul/plan.py's MatmulVariant) over its defaults.
GEMM_VARIANTS = {
    "wgmma x4 n256": "",
    "wgmma x3 n256": "matmul.stages=3",
    "wgmma x4 n256 none in flight": "matmul.inflight=0",
    "wgmma x6 n128": "matmul.max_block_n=128 matmul.stages=6",
    "wgmma x4 n128": "matmul.max_block_n=128",
    "wgmma x4 n256 ungrouped": "matmul.group_m=0",
}


def gemm_rows(size: int, save, kinds=("nn", "nt", "fp8"), variants=tuple(GEMM_VARIANTS)) -> list[dict]:
    rows = []
    s = size
    for kind in kinds:
        make = inputs(kind, s, s, s)
        ins = rotated(make)
        ref_fn = FNS[kind]
        base = {"cuBLAS": median_ms(ref_fn, ins)}
        if kind == "fp8":
            base["cuBLAS bf16 of the same"] = median_ms(nt, [(a.bfloat16(), b.bfloat16()) for a, b, *_ in ins])
        rows.append({"kind": kind, "variant": "torch", **base})
        print(kind, base, flush=True)
        for name in variants:
            os.environ["KF_CACHE_DIR"] = tempfile.mkdtemp()  # compile_and_check_s: a fresh compile
            row = {"kind": kind, "variant": name}
            f = kf.jit(FNS[kind], variants=GEMM_VARIANTS[name])
            try:
                t0 = time.perf_counter()
                errs = []
                # off the tile grid; torch._scaled_mm (whose meta kf's capture runs) takes
                # multiples of 16 only
                odd = ((1008, 784, 336), (144, 272, 4096)) if kind == "fp8" else \
                    ((1000, 776, 328), (130, 264, 4096), (1000, 777, 336))
                for (m, n, k) in ((s, s, s), *odd):
                    x = make() if (m, n, k) == (s, s, s) else inputs(kind, m, n, k)()
                    out = f(*x)
                    if kind == "fp8":
                        ref = (x[0].double() @ x[1].double().t()) * (x[2] * x[3]).double()
                    else:
                        ref = ref_fn(*[t.double() for t in x])
                    errs.append(rel_err(out, ref))
                row["compile_and_check_s"] = time.perf_counter() - t0
                row["rel_err"] = errs
                row["plan"] = {k: v for k, v in kf.explain(f, *make(), file=None).kernels[0].plan.items()
                               if k in ("block_m", "block_n", "block_k", "stages", "shared_bytes", "group_m", "wgmma",
                                         "inflight")}
                if max(errs) < 2e-2:
                    row["kf"] = median_ms(f, ins)
                    row["kf/cuBLAS"] = base["cuBLAS"] / row["kf"]
                    row["TFLOP/s"] = 2 * s ** 3 / row["kf"] / 1e9
                else:
                    row["note"] = "wrong result: not timed"
            except Exception as e:  # a variant that fails to build or launch is reported
                row["note"] = f"{type(e).__name__}: {str(e)[:1500]}"
            rows.append(row)
            print(row, flush=True)
            save(rows)
    return rows


#: Attention plan variants: the attention strategy's kernel variants (the option
#: ``variants``, attention/hopper/plan.py's AttentionVariant) over its defaults; the ones
#: of masked kernels run on masked shapes only.
ATTENTION_VARIANTS = {
    "wgmma 2 warpgroups": "",
    "wgmma skip, table, query blocks in order": "attention.reverse_q_blocks=false",
}


def attention_rows(save, rows: list[dict], variants: tuple = (), kinds: tuple = ()) -> list[dict]:
    """The seed's attention, unmasked and with a causal mask tensor (and one with a fully
    masked query row, the case that makes the skipping kernel rerun a block)."""
    import torch.nn.functional as F


    bf = torch.bfloat16

    def sdpa(q, k, v, mask=None):
        return F.scaled_dot_product_attention(q, k, v, is_causal=mask is not None)

    for (b, h, s, d, masked) in ((4, 32, 2048, 128, ""), (4, 32, 2048, 64, ""), (2, 32, 4096, 128, ""),
                                 (4, 32, 2048, 128, "causal"), (4, 32, 2048, 64, "causal"),
                                 (2, 32, 4096, 128, "causal"), (4, 32, 2048, 128, "diagonal")):
        def make():
            t = [torch.randn(b, h, s, d, device="cuda", dtype=bf) for _ in range(3)]
            if not masked:
                return tuple(t)
            ones = torch.ones(s, s, device="cuda", dtype=bf)
            # diagonal: only the key equal to the query (all but 1 in 32 key blocks skipped)
            return (*t, torch.tril(ones) if masked == "causal" else torch.diag(torch.diagonal(ones)))

        name = f"attention {b}x{h}x{s}x{d}" + (f" {masked} mask" if masked else "")
        if kinds and not any(name.endswith(k[:-1]) if k.endswith("$") else k in name for k in kinds):
            continue
        ins = rotated(make)
        base = {"sdpa": median_ms(sdpa, ins), "eager": median_ms(fused_attention.fn, ins)}
        flops = 4 * b * h * s * s * d / (2 if masked else 1)
        rows.append({"kind": name, "variant": "torch", **base, "sdpa TFLOP/s": flops / base["sdpa"] / 1e9})
        print(rows[-1], flush=True)
        def mask_only(v):  # the same kernel unmasked
            return "reverse_q_blocks" in v

        names = [n for n, v in ATTENTION_VARIANTS.items() if (masked or not mask_only(v))
                 and (not variants or n in variants)]
        for name_ in names:
            os.environ["KF_CACHE_DIR"] = tempfile.mkdtemp()  # a fresh compile
            row = {"kind": name, "variant": name_}
            f = fused_attention.with_options(target="cuda", variants=ATTENTION_VARIANTS[name_])
            try:
                x = make()
                if masked:  # a fully masked query row too: uniform weights in torch
                    x = (*x[:3], x[3].clone())
                    x[3][7] = 0
                ref = fused_attention.fn(*[t.double() for t in x])
                row["rel_err"] = rel_err(f(*x), ref)
                if row["rel_err"] < 2e-2:
                    row["kf"] = median_ms(f, ins)
                    row["kf/sdpa"] = base["sdpa"] / row["kf"]
                    row["kf/eager"] = base["eager"] / row["kf"]
                    row["TFLOP/s"] = flops / row["kf"] / 1e9
                else:
                    row["note"] = "wrong result: not timed"
            except Exception as e:
                row["note"] = f"{type(e).__name__}: {str(e).splitlines()[0][:300]}"
            rows.append(row)
            print(row, flush=True)
            save(rows)
    return rows


#: Row-wise plan variants: the rowwise strategy's kernel variants (the option ``variants``,
#: passes/strategies/rowwise/plan.py's RowwiseVariant) over its defaults (bf16/f16 rows in
#: registers mode, f32 rows in registers mode where one row fills a workgroup, else the
#: loop kernel; reciprocals where outputs are narrow). A variant whose plan for a
#: workload equals an earlier variant's is the same kernel: reported as such and not
#: timed again.
ROWWISE_VARIANTS = {
    "default": "",
    "loop, dividing": "rowwise.row_registers=0 rowwise.row_reciprocal=never",
    "loop + reciprocal": "rowwise.row_registers=0 rowwise.row_reciprocal=always",
    "loop, 128 threads + reciprocal": "rowwise.row_registers=0 rowwise.row_reciprocal=always "
                                      "rowwise.max_row_threads=128",
    # registers mode, each field spelled out
    "registers, bf16 rows only": "rowwise.row_registers_widest=2 rowwise.row_max_registers=0 rowwise.row_preload=rows",
    "registers": "rowwise.row_registers_widest=8 rowwise.row_max_registers=0 rowwise.row_preload=rows",
    "registers, max 64 registers": "rowwise.row_registers_widest=8 rowwise.row_max_registers=64 "
                                   "rowwise.row_preload=rows",
    "registers, weights pipelined": "rowwise.row_registers_widest=8 rowwise.row_max_registers=0 "
                                    "rowwise.row_preload=pipelined",
    "registers, max 64, weights pipelined": "rowwise.row_registers_widest=8 rowwise.row_max_registers=64 "
                                            "rowwise.row_preload=pipelined",
    "registers, every load up front": "rowwise.row_registers_widest=8 rowwise.row_max_registers=0 "
                                      "rowwise.row_preload=all",
    "registers, max 64 + reciprocal": "rowwise.row_registers_widest=8 rowwise.row_reciprocal=always",
    "registers, max 64, dividing": "rowwise.row_registers_widest=8 rowwise.row_reciprocal=never",
    "registers, 16 values, 512 threads": "rowwise.row_registers_widest=8 rowwise.row_registers=16 "
                                         "rowwise.max_row_threads=512",
    "registers, one row a workgroup": "rowwise.row_registers_widest=8 rowwise.row_block=1",
}


def _softmax(x):
    return torch.softmax(x, dim=-1)


def _rmsnorm(x, w):
    return x * torch.rsqrt(x.float().pow(2).mean(-1, keepdim=True) + 1e-6).to(x.dtype) * w


def _bias_gelu(x, b):
    return torch.nn.functional.gelu(x + b)


def rowwise_rows(save, rows: list[dict], variants: tuple = (), kinds: tuple = ()) -> list[dict]:
    """Issue 4's row-wise functions (the seed's layer norm, softmax, RMSNorm as bench.py
    writes it, bias+GELU) at 32768x8192 and 8192x4096 in bf16 and fp32, each rowwise plan
    variant checked against torch (float64) at that shape and at 7x1000 and 3x8193, then
    timed beside torch's own kernel (F.layer_norm, torch.softmax, F.rms_norm; eager
    gelu(x + b)) and this run's device-to-device copy bandwidth."""
    import torch.nn.functional as F

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))
    from seed_examples import metal_layer_norm

    src = torch.randn(256 * 2**20, device="cuda")  # 1 GiB
    dst = torch.empty_like(src)
    copy_ms = median_ms(lambda: dst.copy_(src), [()], reps=20)
    copy_gbs = 2 * src.numel() * 4 / copy_ms / 1e6
    del src, dst
    rows.append({"kind": "copy 1 GiB", "variant": "torch", "ms": copy_ms, "GB/s": copy_gbs})
    print(rows[-1], flush=True)

    workloads = {  # name: (kf fn, eager, torch's own kernel, extra inputs given the row length)
        "layer norm": (metal_layer_norm.fn, metal_layer_norm.fn,
                       lambda x, w, b: F.layer_norm(x, (x.shape[-1],), w, b), 2),
        "softmax": (_softmax, _softmax, _softmax, 0),
        "RMSNorm": (_rmsnorm, _rmsnorm, getattr(F, "rms_norm", None) and
                    (lambda x, w: F.rms_norm(x, (x.shape[-1],), w, 1e-6)), 1),
        "bias+GELU": (_bias_gelu, _bias_gelu, None, 1),
    }
    names = [n for n in ROWWISE_VARIANTS if not variants or n in variants]
    for (r, c) in ((32768, 8192), (8192, 4096)):
        for dt in (torch.bfloat16, torch.float32):
            for wname, (fn, eager, best, extra) in workloads.items():
                kind = f"{wname} {r}x{c} {str(dt)[6:]}"
                if kinds and not any(k in kind for k in kinds):
                    continue

                def make(r=r, c=c, dt=dt, extra=extra):
                    return (torch.randn(r, c, device="cuda", dtype=dt),
                            *[torch.randn(c, device="cuda", dtype=dt) for _ in range(extra)])

                ins = rotated(make)
                nbytes = 2 * r * c * ins[0][0].element_size()
                base = {"eager": median_ms(eager, ins)}
                if best is not None:
                    base["torch"] = median_ms(best, ins)
                rows.append({"kind": kind, "variant": "torch", **base,
                             "torch GB/s": nbytes / base.get("torch", base["eager"]) / 1e6})
                print(rows[-1], flush=True)
                seen: dict = {}  # plan (as JSON) -> the variant that had it
                tol = 2e-2 if dt == torch.bfloat16 else 1e-5
                for name in names:
                    os.environ["KF_CACHE_DIR"] = tempfile.mkdtemp()
                    row = {"kind": kind, "variant": name}
                    f = kf.jit(fn, target="cuda", variants=ROWWISE_VARIANTS[name])
                    try:
                        x = make()
                        k0 = kf.explain(f, *x, file=None).kernels[0]
                        plan = {k: v for k, v in k0.plan.items() if k in (
                            "strategy", "mode", "threads", "row_threads", "rows_per_block", "chunks", "vector_lanes",
                            "preload", "reciprocal", "max_registers", "cache_row", "vector_width")}
                        row["plan"] = plan
                        row["registers"] = k0.ptxas.get("registers")
                        row["spilled"] = k0.ptxas.get("spill_store_bytes", 0) + k0.ptxas.get("spill_load_bytes", 0)
                        key = json.dumps(k0.plan, sort_keys=True, default=str)
                        if key in seen:
                            row["note"] = f"same kernel as {seen[key]!r}"
                            rows.append(row)
                            print(row, flush=True)
                            continue
                        seen[key] = name
                        errs = [rel_err(f(*x), eager(*[t.double() for t in x]))]
                        for (rr, cc) in ((7, 1000), (3, 8193)):
                            y = (torch.randn(rr, cc, device="cuda", dtype=dt),
                                 *[torch.randn(cc, device="cuda", dtype=dt) for _ in range(extra)])
                            errs.append(rel_err(f(*y), eager(*[t.double() for t in y])))
                        row["rel_err"] = errs
                        if max(errs) < tol:
                            row["kf"] = median_ms(f, ins)
                            row["GB/s"] = nbytes / row["kf"] / 1e6
                            row["% of copy"] = 100 * row["GB/s"] / copy_gbs
                            row["kf/torch"] = base.get("torch", base["eager"]) / row["kf"]
                        else:
                            row["note"] = "wrong result: not timed"
                    except Exception as e:  # a variant that fails to build or launch is reported
                        row["note"] = f"{type(e).__name__}: {str(e)[:500]}"
                    rows.append(row)
                    print(row, flush=True)
                    save(rows)
                del ins
    return rows


#: Elementwise plan variants: the elementwise strategy's kernel variants (the option
#: ``variants``, passes/strategies/elementwise.py's ElementwiseVariant) over its defaults.
ELEMENTWISE_VARIANTS = {
    "one vector a thread, accurate math (libdevice erff)": "elementwise.items_per_thread=1 elementwise.short_forms=false",
    "one vector a thread, short forms": "elementwise.items_per_thread=1",
    "two vectors a thread, short forms (the default)": "",
    "four vectors a thread, short forms": "elementwise.items_per_thread=4",
}


def _bias_gelu_tanh(x, b):
    return torch.nn.functional.gelu(x + b, approximate="tanh")


def _bias_sigmoid(x, b):
    return torch.sigmoid(x + b)


def _axpb(x, b):
    return x * 2.0 + b


def elementwise_rows(save, rows: list[dict], variants: tuple = (), kinds: tuple = ()) -> list[dict]:
    """bias+GELU (exact and tanh), bias+sigmoid and x*2+b (memory only) at 32768x8192 and
    8192x4096 in bf16 and fp32, each ELEMENTWISE_VARIANTS setting checked against torch
    (float64) and timed against eager and this run's copy bandwidth."""
    src = torch.randn(256 * 2**20, device="cuda")  # 1 GiB
    dst = torch.empty_like(src)
    copy_ms = median_ms(lambda: dst.copy_(src), [()], reps=20)
    copy_gbs = 2 * src.numel() * 4 / copy_ms / 1e6
    del src, dst
    rows.append({"kind": "copy 1 GiB", "variant": "torch", "ms": copy_ms, "GB/s": copy_gbs})
    print(rows[-1], flush=True)
    workloads = {"bias+GELU": _bias_gelu, "bias+GELU tanh": _bias_gelu_tanh, "bias+sigmoid": _bias_sigmoid,
                 "x*2+b": _axpb}
    names = [n for n in ELEMENTWISE_VARIANTS if not variants or n in variants]
    for (r, c) in ((32768, 8192), (8192, 4096)):
        for dt in (torch.bfloat16, torch.float32):
            for wname, fn in workloads.items():
                kind = f"{wname} {r}x{c} {str(dt)[6:]}"
                if kinds and not any(k in kind for k in kinds):
                    continue

                def make(r=r, c=c, dt=dt):
                    return torch.randn(r, c, device="cuda", dtype=dt) * 3, torch.randn(c, device="cuda", dtype=dt)

                ins = rotated(make)
                nbytes = 2 * r * c * ins[0][0].element_size()
                base = {"eager": median_ms(fn, ins)}
                rows.append({"kind": kind, "variant": "torch", **base, "eager GB/s": nbytes / base["eager"] / 1e6})
                print(rows[-1], flush=True)
                for name in names:
                    os.environ["KF_CACHE_DIR"] = tempfile.mkdtemp()
                    row = {"kind": kind, "variant": name}
                    f = kf.jit(fn, target="cuda", variants=ELEMENTWISE_VARIANTS[name])
                    try:
                        x = make()
                        k0 = kf.explain(f, *x, file=None).kernels[0]
                        row["plan"] = {k: v for k, v in k0.plan.items()
                                       if k in ("strategy", "vector_width", "items_per_thread", "grid")}
                        row["registers"] = k0.ptxas.get("registers")
                        errs = [rel_err(f(*x), fn(*[t.double() for t in x]))]
                        for (rr, cc) in ((7, 1000), (3, 8200)):
                            y = (torch.randn(rr, cc, device="cuda", dtype=dt) * 3, torch.randn(cc, device="cuda", dtype=dt))
                            errs.append(rel_err(f(*y), fn(*[t.double() for t in y])))
                        row["rel_err"] = errs
                        if max(errs) < (2e-2 if dt == torch.bfloat16 else 1e-5):
                            row["kf"] = median_ms(f, ins)
                            row["GB/s"] = nbytes / row["kf"] / 1e6
                            row["% of copy"] = 100 * row["GB/s"] / copy_gbs
                            row["eager/kf"] = base["eager"] / row["kf"]
                        else:
                            row["note"] = "wrong result: not timed"
                    except Exception as e:  # a variant that fails to build or launch is reported
                        row["note"] = f"{type(e).__name__}: {str(e)[:500]}"
                    rows.append(row)
                    print(row, flush=True)
                    save(rows)
                del ins
    return rows


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default="")
    ap.add_argument("--size", type=int, default=8192)
    ap.add_argument("--only", default="", help="gemm, attention, rowwise or elementwise")
    ap.add_argument("--gemm-kinds", default="nn,nt,fp8", help="which GEMMs: nn, nt (B transposed), fp8 (_scaled_mm)")
    ap.add_argument("--gemm-variants", default=",".join(GEMM_VARIANTS), help="names from GEMM_VARIANTS")
    ap.add_argument("--attention-variants", default="", help="names from ATTENTION_VARIANTS, ';'-separated (all)")
    ap.add_argument("--attention-kinds", default="", help="texts of the shapes to run, ','-separated (all); "
                    "a text ending in $ matches the end of a name ('4x32x2048x128$': unmasked only)")
    ap.add_argument("--rowwise-variants", default="", help="names from ROWWISE_VARIANTS, ';'-separated (all)")
    ap.add_argument("--rowwise-kinds", default="", help="texts of the workloads to run, ','-separated (all), "
                    "e.g. 'bfloat16' or 'softmax 32768'")
    ap.add_argument("--elementwise-variants", default="", help="names from ELEMENTWISE_VARIANTS, ';'-separated (all)")
    ap.add_argument("--elementwise-kinds", default="", help="texts of the workloads to run, ','-separated (all), "
                    "e.g. 'bias+GELU 32768'")
    args = ap.parse_args()
    torch.manual_seed(int(time.time()))

    def save(rows):
        if args.out:
            Path(args.out).write_text(json.dumps({"device": torch.cuda.get_device_name(0), "rows": rows}, indent=1))

    rows: list[dict] = []
    if args.only in ("", "gemm"):
        rows = gemm_rows(args.size, save, tuple(args.gemm_kinds.split(",")), tuple(args.gemm_variants.split(",")))
    if args.only in ("", "attention"):
        rows = attention_rows(save, rows, tuple(v for v in args.attention_variants.split(";") if v),
                              tuple(k for k in args.attention_kinds.split(",") if k))
    if args.only in ("", "rowwise"):
        rows = rowwise_rows(save, rows, tuple(v for v in args.rowwise_variants.split(";") if v),
                            tuple(k for k in args.rowwise_kinds.split(",") if k))
    if args.only in ("", "elementwise"):
        rows = elementwise_rows(save, rows, tuple(v for v in args.elementwise_variants.split(";") if v),
                                tuple(k for k in args.elementwise_kinds.split(",") if k))
    return 0


if __name__ == "__main__":
    sys.exit(main())
