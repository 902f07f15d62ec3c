"""CUDA back-end smoke run: kf-to-cuda's PTX launched through runtime/cuda.py, checked and
timed in one process, so one run on a GPU machine says whether the back end works there:

    python3 bench/device_cuda_smoke.py [--out-dir DIR]   # bench/results/cuda-smoke-<date>-<commit>.json

1. compiles the hand-written kernels of test/python/passes/test_to_cuda.py for the
   device's chip and, where ptxas is found, prints its resource report;
2. checks each against torch on fresh random inputs with NaN-poisoned outputs
   (‖out − ref‖ / ‖ref‖ against a float64 reference);
3. times host launch overhead (a bare cuLaunchKernel loop over the same prebuilt
   parameters, kf's launcher with and without argument checks, and a tiny torch op),
   and bandwidth-bound kernels with CUDA events against torch: a 16M-element axpy and
   the row mean/variance kernel at 8192×4096 (f32 and bf16), beside a device copy as the
   bandwidth ceiling. bench/RESULTS.md records the tables printed at the end.
"""

from __future__ import annotations

import argparse
import importlib.util
import statistics
import sys
import time
from pathlib import Path

import torch

import run_name  # (bench/, the script's folder)
from bench import host_us
from kf.passes import to_cuda
from kf.runtime import cuda as kcuda
from kf.runtime.abi import TensorArg

ROOT = Path(__file__).resolve().parents[1]


def _kernels():
    spec = importlib.util.spec_from_file_location("kf_cuda_kernels", ROOT / "test/python/passes/test_to_cuda.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


K = _kernels()
CHIP = "sm_%d%d" % torch.cuda.get_device_capability()
DT = {"f32": torch.float32, "bf16": torch.bfloat16, "f16": torch.float16}
TOL = {"f32": 1e-5, "bf16": 1e-2, "f16": 2e-3}
results: dict = {"chip": CHIP, "checks": [], "ptxas": {}, "overhead_us": {}, "bandwidth": []}


def build(built, args, validate=True, cubin=False):
    """Compile one builder's kernel; returns (CudaKernel, ptxas report or None)."""
    text, entry, grid, block, shared = built
    ptx = to_cuda.compile_to_ptx(text, chip=CHIP)["kf_kernels"]
    report, image = None, ptx
    if to_cuda.ptxas_path():
        a = to_cuda.assemble(ptx, CHIP)
        report = a.kernels[entry]
        if cubin:
            image = a.cubin
    return kcuda.CudaKernel(kcuda.CudaModule(image), entry, grid, block, shared, args, validate), report


def rel(out, ref) -> float:
    out, ref = out.double(), ref.double()
    if torch.isnan(out).any():
        return float("nan")
    return float((out - ref).norm() / ref.norm())


def record_check(name, err, tol):
    ok = err == err and err < tol
    results["checks"].append(dict(name=name, rel_err=err, tol=tol, ok=ok))
    print(f"  {'ok  ' if ok else 'FAIL'} {name:<34} rel err {err:.2e} (tol {tol:.0e})")


def check_elementwise(elem, n=1000):
    k, rep = build(K.elementwise_kernel(n=n, elem=elem), [TensorArg(a, (n,), elem) for a in "xyz"])
    results["ptxas"][f"ew_{elem}"] = rep
    x = (torch.randn(n, device="cuda") * 2).to(DT[elem])
    y = torch.randn(n, device="cuda").to(DT[elem])
    z = torch.full((n,), float("nan"), device="cuda", dtype=DT[elem])
    k(x, y, z)
    torch.cuda.synchronize()
    record_check(f"elementwise {elem} n={n}", rel(z, K.elementwise_reference(x, y)), TOL[elem])


def check_row(elem, rows, cols):
    args = [TensorArg("x", (rows, cols), elem), TensorArg("mean", (rows,), elem), TensorArg("var", (rows,), elem)]
    k, rep = build(K.row_stats_kernel(rows=rows, cols=cols, elem=elem), args)
    results["ptxas"][f"row_{elem}_{cols}"] = rep
    x = (torch.randn(rows, cols, device="cuda") * 3 + 1.5).to(DT[elem])
    mean = torch.full((rows,), float("nan"), device="cuda", dtype=DT[elem])
    var = torch.full((rows,), float("nan"), device="cuda", dtype=DT[elem])
    k(x, mean, var)
    torch.cuda.synchronize()
    rv, rm = torch.var_mean(x.double(), dim=1, correction=0)
    err = max(rel(mean, rm), rel(var, rv))
    record_check(f"row mean/var {elem} {rows}x{cols}", err, TOL[elem])
    return k


def check_tile_reverse():
    built = K.tile_reverse_kernel(tiles=132, tile=16384)
    n = 132 * 16384
    k, rep = build(built, [TensorArg("x", (n,), "f32"), TensorArg("y", (n,), "f32")])
    results["ptxas"]["tile_reverse"] = rep
    x = torch.randn(n, device="cuda")
    y = torch.full_like(x, float("nan"))
    k(x, y)
    torch.cuda.synchronize()
    ref = x.view(132, 16384).flip(1).reshape(-1)
    record_check("tile reverse, 64 KiB dynamic smem", 0.0 if torch.equal(y, ref) else rel(y, ref), 1e-30)


def check_graph_capture():
    n = 1 << 20
    k, _ = build(K.axpy_kernel(n=n), [TensorArg(a, (n,), "f32") for a in "xyz"])
    x, y = torch.randn(n, device="cuda"), torch.randn(n, device="cuda")
    z = torch.full_like(x, float("nan"))
    k(x, y, z)  # bind (load the module) before capture: loading is not a capturable call
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        k(x, y, z)
    x.copy_(torch.randn(n, device="cuda"))  # fresh inputs for the replay
    g.replay()
    torch.cuda.synchronize()
    record_check("axpy captured in a CUDA graph", 0.0 if torch.equal(z, 2 * x + y) else rel(z, 2 * x + y), 1e-30)


def event_ms(fn, reps=50, warmup=5) -> float:
    """Median of per-launch CUDA-event times in milliseconds."""
    for _ in range(warmup):
        fn()
    starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
    for s, e in zip(starts, ends):
        s.record()
        fn()
        e.record()
    torch.cuda.synchronize()
    return statistics.median(s.elapsed_time(e) for s, e in zip(starts, ends))


def overhead():
    from cuda.bindings import driver as drv

    text, entry, grid, block, shared = K.empty_kernel()
    ptx = to_cuda.compile_to_ptx(text, chip=CHIP)["kf_kernels"]
    mod = kcuda.CudaModule(ptx)
    checked = kcuda.CudaKernel(mod, entry, grid, block, shared, [TensorArg("x", (1,), "f32")], validate=True)
    unchecked = kcuda.CudaKernel(mod, entry, grid, block, shared, args=1)
    x = torch.zeros(1, device="cuda")
    t0 = time.perf_counter()
    unchecked(x)
    torch.cuda.synchronize()
    first_ms = (time.perf_counter() - t0) * 1e3
    checked(x)
    fn = unchecked._bound[0].function
    stream = unchecked._stream(torch.cuda.current_stream().cuda_stream)
    params = unchecked._params_addr
    unchecked._slots[0] = x.data_ptr()

    def bare():
        drv.cuLaunchKernel(fn, 1, 1, 1, 32, 1, 1, 0, stream, params, 0)

    o = results["overhead_us"]
    o["bare cuLaunchKernel (prebuilt params)"] = host_us(bare)
    o["kf CudaKernel, no arg checks"] = host_us(lambda: unchecked(x))
    o["kf CudaKernel, arg checks"] = host_us(lambda: checked(x))
    o["torch x.add_(1) (1 elem)"] = host_us(lambda: x.add_(1))
    n = 4096  # three tensor arguments, as a real kernel has: checks cost per tensor
    a3 = [TensorArg(a, (n,), "f32") for a in "xyz"]
    k3c, _ = build(K.axpy_kernel(n=n), a3, validate=True)
    k3u, _ = build(K.axpy_kernel(n=n), a3, validate=False)
    t3 = [torch.randn(n, device="cuda") for _ in range(3)]
    k3c(*t3)
    k3u(*t3)
    o["kf axpy 4096 (3 tensors), no arg checks"] = host_us(lambda: k3u(*t3))
    o["kf axpy 4096 (3 tensors), arg checks"] = host_us(lambda: k3c(*t3))
    o["torch.add(y, x, alpha=2, out=z) 4096"] = host_us(lambda: torch.add(t3[1], t3[0], alpha=2, out=t3[2]))
    o["first launch: PTX JIT + load (ms)"] = first_ms
    o["first launch: PTX JIT + load (ms)"] = o.pop("first launch: PTX JIT + load (ms)")  # printed last
    print("  host time per launch, µs (median of 5 × 20000 launches):")
    for name, v in o.items():
        print(f"    {name:<44} {v:8.2f}")


def bandwidth():
    rows = results["bandwidth"]

    def add(name, bytes_moved, kf_ms, torch_ms, torch_name):
        rows.append(dict(name=name, bytes=bytes_moved, kf_ms=kf_ms, torch_ms=torch_ms, torch_op=torch_name,
                         kf_tbs=bytes_moved / kf_ms / 1e9 if kf_ms else None,
                         torch_tbs=bytes_moved / torch_ms / 1e9))

    n = 1 << 24
    x, y = torch.randn(n, device="cuda"), torch.randn(n, device="cuda")
    z = torch.full_like(x, float("nan"))
    c = torch.empty_like(x)
    copy_ms = event_ms(lambda: c.copy_(x))
    add("device copy 16M f32 (ceiling)", 8 * n, None, copy_ms, "copy_")
    for fmt in ("ptx", "cubin"):
        k, rep = build(K.axpy_kernel(n=n), [TensorArg(a, (n,), "f32") for a in "xyz"], cubin=(fmt == "cubin"))
        results["ptxas"]["axpy"] = rep
        z.fill_(float("nan"))
        k(x, y, z)
        torch.cuda.synchronize()
        record_check(f"axpy 16M f32 ({fmt})", 0.0 if torch.equal(z, 2 * x + y) else rel(z, 2 * x + y), 1e-30)
        kf_ms = event_ms(lambda: k(x, y, z))
        torch_ms = event_ms(lambda: torch.add(y, x, alpha=2, out=z))
        add(f"axpy 16M f32, kf from {fmt}", 12 * n, kf_ms, torch_ms, "torch.add(y, x, alpha=2, out=)")

    k, rep = build(K.vector_axpy_kernel(n=n), [TensorArg(a, (n,), "f32") for a in "xyz"])
    results["ptxas"]["vaxpy"] = rep
    z.fill_(float("nan"))
    k(x, y, z)
    torch.cuda.synchronize()
    record_check("vector<4> axpy 16M f32", 0.0 if torch.equal(z, 2 * x + y) else rel(z, 2 * x + y), 1e-30)
    add("axpy 16M f32, kf vector<4xf32> (ld.global.v4)", 12 * n, event_ms(lambda: k(x, y, z)),
        event_ms(lambda: torch.add(y, x, alpha=2, out=z)), "torch.add(y, x, alpha=2, out=)")

    R, C = 8192, 4096
    for elem in ("f32", "bf16"):
        k = check_row(elem, R, C)
        xr = torch.randn(R, C, device="cuda").to(DT[elem])
        m = torch.empty(R, device="cuda", dtype=DT[elem])
        v = torch.empty(R, device="cuda", dtype=DT[elem])
        kf_ms = event_ms(lambda: k(xr, m, v))
        torch_ms = event_ms(lambda: torch.var_mean(xr, dim=1, correction=0))
        es = xr.element_size()
        add(f"row mean/var {R}x{C} {elem}", R * C * es + 2 * R * es, kf_ms, torch_ms, "torch.var_mean(dim=1)")


def main() -> int:
    ap = argparse.ArgumentParser()
    run_name.add_arguments(ap)
    out = run_name.output_path(ap.parse_args(), "cuda-smoke")
    print(f"device: {torch.cuda.get_device_name()} ({CHIP}), torch {torch.__version__}, "
          f"ptxas {'found' if to_cuda.ptxas_path() else 'not found'}")
    print("correctness (fresh random inputs, NaN-poisoned outputs):")
    for elem in ("f32", "bf16", "f16"):
        check_elementwise(elem)
    for elem in ("f32", "bf16"):
        for cols in (257, 1024):
            check_row(elem, 64, cols)
    check_tile_reverse()
    check_graph_capture()
    overhead()
    bandwidth()
    print("ptxas report (registers / shared bytes / stack / spills):")
    for name, r in results["ptxas"].items():
        if r:
            print(f"  {name:<16} {r['registers']:3d} regs  {r['shared_bytes']:6d} B smem  {r['stack_bytes']} B stack"
                  f"  {r['spill_store_bytes']}/{r['spill_load_bytes']} B spills")
    print()
    print("| kernel | MB moved | kf ms | kf TB/s | torch ms | torch TB/s | torch op |")
    print("| --- | ---: | ---: | ---: | ---: | ---: | --- |")
    for r in results["bandwidth"]:
        kf = f"{r['kf_ms']:.4f} | {r['kf_tbs']:.2f}" if r["kf_ms"] else "— | —"
        print(f"| {r['name']} | {r['bytes'] / 1e6:.0f} | {kf} | {r['torch_ms']:.4f} | {r['torch_tbs']:.2f} | "
              f"{r['torch_op']} |")
    print()
    print("| launch path | host µs per launch |")
    print("| --- | ---: |")
    for name, v in results["overhead_us"].items():
        print(f"| {name} | {v:.2f} |")
    failed = [c["name"] for c in results["checks"] if not c["ok"]]
    print(f"\n{len(results['checks']) - len(failed)}/{len(results['checks'])} checks passed"
          + (f"; FAILED: {', '.join(failed)}" if failed else ""))
    run_name.write_json(out, results)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
