"""``kf.profile``: what every kf launch cost, and how far it is from the device's roofline.

    with kf.profile() as prof:
        for _ in range(10):
            y = layer_norm(x, w, b)
    prof.table()                          # per kernel: time, GB/s, TFLOP/s, % of roofline, ...
    prof.export_chrome_trace("kf.json")   # open in https://ui.perfetto.dev
    prof.roofline("roofline.png")

Why it is built this way:

- **Recorded at the launch, not sampled.** While a profile is open, ``programs._PROFILE``
  points at it, and ``CompiledProgram.__call__`` (the fast path's only callee) takes the
  timed path (programs.py) instead of calling the launcher directly, which records
  each launch here; closed, the fast path costs
  one global read. The same path runs when ``torch.profiler`` is recording, so kf
  launches appear in its traces under their function names (``record_function``; on
  CUDA also as NVTX ranges, for Nsight Systems).
- **Each target's own clock.** CUDA: events on the current stream around each kernel,
  read once at the end of the profile (no synchronization per launch). Vulkan: the
  launcher's timestamp queries (``run_program(timings=...)``), the GPU's own time per
  kernel. CPU: wall time around the call, which is the kernel (the launch is synchronous).
- **Work from the compiler, not from counters.** Bytes are the kernel's input and
  output buffers (what it must move at least); FLOPs were counted from its kf ops at
  build time (``KernelABI.extra["flops"]``, costs.py). Achieved GB/s and TFLOP/s divide
  them by the measured time; "% roofline" is the roofline floor (the longer of moving the
  bytes at peak bandwidth and doing the math at peak rate) over the measured time, so
  100% means the kernel runs at its speed of light on this device.
- **The compiler's numbers beside the clock.** Registers, shared memory and spills come
  from ``ptxas -v`` (``KernelABI.extra["ptxas"]``, CUDA), occupancy from those by the
  sm_90 occupancy rules, compile time by pass from the program's metadata.
"""

from __future__ import annotations

import json
import math
import os
import time
from dataclasses import dataclass, field
from typing import Any

from . import costs, programs, targets


@dataclass
class KernelLaunch:
    """One kernel run: what ran, for how long, and the work it did."""

    function: str
    kernel: str
    target: str
    strategy: str
    fused_lines: tuple[str, ...]
    start_s: float  # host time since the profile opened, when the program call began
    nbytes: int
    flops: int
    matmul_flops: int
    elem: str
    grid: tuple[int, ...] = (1, 1, 1)
    block: tuple[int, ...] = (1, 1, 1)
    shared_bytes: int = 0  # dynamic
    static_shared: int = 0  # declared in the kernel (ptxas's smem, SPIR-V workgroup memory)
    ptxas: dict = field(default_factory=dict)
    timer: str = "wall"  # "wall", "vulkan timestamps", "cuda events"
    _seconds: float | None = None
    _events: Any = None  # (start, end, reference event, its host time) until read
    device_start_s: float | None = None  # CUDA: when the kernel began on the device

    @property
    def seconds(self) -> float:
        if self._seconds is None and self._events is not None:
            start, end, ref, ref_host = self._events
            end.synchronize()
            self._seconds = start.elapsed_time(end) * 1e-3
            self.device_start_s = ref_host + ref.elapsed_time(start) * 1e-3
            self._events = None
        return self._seconds or 0.0


@dataclass
class KernelStats:
    """The launches of one kernel of one function, summed up."""

    function: str
    kernel: str
    target: str
    strategy: str
    fused_lines: tuple[str, ...]
    calls: int
    total_s: float
    min_s: float
    nbytes: int
    flops: int
    matmul_flops: int
    elem: str
    timer: str
    block: tuple[int, ...]
    shared_bytes: int  # dynamic + static
    ptxas: dict
    peak: costs.DevicePeak | None

    @property
    def mean_s(self) -> float:
        return self.total_s / self.calls if self.calls else 0.0

    @property
    def gbps(self) -> float:
        return self.nbytes / self.mean_s / 1e9 if self.mean_s else 0.0

    @property
    def tflops(self) -> float:
        return self.flops / self.mean_s / 1e12 if self.mean_s else 0.0

    @property
    def intensity(self) -> float:
        """FLOP per byte moved."""
        return self.flops / self.nbytes if self.nbytes else 0.0

    @property
    def floor_s(self) -> float | None:
        if self.peak is None:
            return None
        return self.peak.floor_seconds(self.nbytes, self.flops, self.matmul_flops, self.elem)

    @property
    def roofline_fraction(self) -> float | None:
        """The roofline floor over the mean time: 1.0 is the device's speed of light."""
        floor = self.floor_s
        return floor / self.mean_s if floor is not None and self.mean_s else None

    @property
    def bound(self) -> str:
        if self.peak is None:
            return "-"
        mem = self.nbytes / self.peak.bytes_per_s
        return "memory" if mem >= (self.floor_s or 0.0) * 0.999 else "compute"

    @property
    def occupancy(self) -> dict | None:
        if self.target != "cuda" or not self.ptxas:
            return None
        threads = math.prod(self.block)
        return costs.cuda_occupancy(threads, int(self.ptxas.get("registers", 0)), self.shared_bytes)


class profile:
    """Record every kf launch in the ``with`` block (see the module docstring).

    ``device`` names the device whose peaks the roofline uses (a key of
    ``kf.costs.PEAKS`` such as ``"H200"``); by default, the device each launch ran on.
    ``nvtx`` (CUDA) pushes an NVTX range per launch, named after the function.
    """

    def __init__(self, device: str | None = None, nvtx: bool = True):
        self.device = device
        self.nvtx = nvtx
        self.launches: list[KernelLaunch] = []
        self.compile_seconds: dict[str, dict[str, float]] = {}  # function + signature -> pass -> s
        self._t0 = 0.0
        self._parent = None
        self._cuda_ref = None  # (event, host time) that CUDA event times are measured from
        self._peaks: dict[str, costs.DevicePeak | None] = {}

    def __enter__(self) -> "profile":
        self._parent = programs._PROFILE
        self._t0 = time.perf_counter()
        programs._PROFILE = self
        return self

    def __exit__(self, *exc) -> None:
        programs._PROFILE = self._parent
        for launch in self.launches:  # read the CUDA events while the stream is known done
            if launch._events is not None:
                launch.seconds  # noqa: B018

    # ------------------------------------------------------------------ recording

    def _record(self, program, abi, t0: float, t1: float, timings: list | None, events: list | None) -> None:
        meta = program.meta
        name = meta["name"]
        key = f"{name}{meta.get('signature', '')} [{abi.target}]"
        if key not in self.compile_seconds:
            self.compile_seconds[key] = dict(meta.get("compile_seconds", {}))
        per_kernel: list[tuple[float | None, Any, str]] = []
        if events:
            ref, ref_host = self._cuda_reference()
            per_kernel = [(None, (s, e, ref, ref_host), "cuda events") for _, s, e in events]
        elif timings and len(timings) == len(abi.kernels):
            per_kernel = [(seconds, None, "vulkan timestamps") for _, seconds in timings]
        else:
            n = max(len(abi.kernels), 1)
            timer = "wall" if n == 1 else "wall (program / kernels)"
            per_kernel = [((t1 - t0) / n, None, timer)] * len(abi.kernels)
        buffers = list(abi.inputs) + list(abi.outputs) + list(abi.temporaries)
        for k, (seconds, ev, timer) in zip(abi.kernels, per_kernel):
            launch = KernelLaunch(
                function=name, kernel=k.entry if targets.get(abi.target).is_gpu else name, target=abi.target,
                strategy=str(k.extra.get("strategy", "")), fused_lines=tuple(k.fused_lines),
                start_s=t0 - self._t0, nbytes=sum(buffers[i].nbytes for i in sorted(set(k.args))),
                flops=int(k.extra.get("flops", 0)), matmul_flops=int(k.extra.get("matmul_flops", 0)),
                elem=costs.kernel_elem(abi, k), grid=tuple(k.grid), block=tuple(k.block),
                shared_bytes=int(k.shared_bytes),
                static_shared=int((k.extra.get("ptxas") or {}).get("shared_bytes", 0) or k.extra.get("workgroup_bytes", 0) or 0),
                ptxas=dict(k.extra.get("ptxas") or {}), timer=timer,
                _seconds=seconds, _events=ev)
            p = self
            while p is not None:
                p.launches.append(launch)
                p = p._parent

    def _record_interpreted(self, program, tensors: list, outs: list, t0: float, t1: float) -> None:
        """Record a call of an InterpretedProgram: one "kernel", its wall time."""
        from kf.runtime.abi import ELEM_INFO

        cap = program.captured
        flops = getattr(program, "_kf_flops", None)
        if flops is None:
            from .cpu_codegen import _func

            flops = program._kf_flops = costs.kernel_flops(_func(cap.module, cap.name))
        nbytes = sum(t.numel() * t.element_size() for t in list(tensors) + list(outs))
        elem = next((e for e, (n, _) in ELEM_INFO.items() if outs and str(outs[0].dtype) == f"torch.{n}"), "f32")
        launch = KernelLaunch(cap.name, f"{cap.name} (interpreted)", "interpreter", "interpreter",
                              tuple(sorted({str(x) for x in cap.source_locs.values()})), t0 - self._t0, nbytes,
                              flops[0], flops[1], elem, _seconds=t1 - t0)
        p = self
        while p is not None:
            p.launches.append(launch)
            p = p._parent

    def _cuda_reference(self):
        if self._cuda_ref is None:
            import torch

            ref = torch.cuda.Event(enable_timing=True)
            ref.record()
            self._cuda_ref = (ref, time.perf_counter() - self._t0)
        return self._cuda_ref

    # ------------------------------------------------------------------ reading

    def peak(self, target: str) -> costs.DevicePeak | None:
        """The ceilings used for launches on ``target``."""
        if target not in self._peaks:
            # The interpreter runs torch ops on the host.
            self._peaks[target] = costs.peak_for("cpu" if target == "interpreter" else target, self.device)
        return self._peaks[target]

    def kernels(self) -> list[KernelStats]:
        """Launches summed per (function, kernel), most total time first."""
        groups: dict[tuple[str, str], list[KernelLaunch]] = {}
        for launch in self.launches:
            groups.setdefault((launch.function, launch.kernel), []).append(launch)
        out = []
        for (fn, kernel), ls in groups.items():
            first = ls[0]
            times = [x.seconds for x in ls]
            out.append(KernelStats(fn, kernel, first.target, first.strategy, first.fused_lines, len(ls), sum(times),
                                   min(times), first.nbytes, first.flops, first.matmul_flops, first.elem,
                                   first.timer, first.block, first.shared_bytes + first.static_shared, first.ptxas,
                                   self.peak(first.target)))
        out.sort(key=lambda s: -s.total_s)
        return out

    def table(self, file=None, lines: bool = True) -> "Text":
        """The profile as text: one row per kernel, then the user lines each fuses and the
        compile time by pass. A ``str`` whose repr is the text itself, so a REPL shows it
        once; ``file`` also prints it there (``print(prof.table())`` in a script)."""
        stats = self.kernels()
        rows = [("kernel", "target", "strategy", "calls", "total ms", "mean us", "MB", "MFLOP", "GB/s",
                 "TFLOP/s", "% roof", "bound", "regs", "smem", "spills", "occ")]
        for s in stats:
            occ = s.occupancy
            frac = s.roofline_fraction
            rows.append((
                s.kernel, s.target, s.strategy or "-", str(s.calls), f"{s.total_s * 1e3:.3f}",
                f"{s.mean_s * 1e6:.1f}", f"{s.nbytes / 1e6:.3f}", f"{s.flops / 1e6:.2f}", f"{s.gbps:.2f}",
                f"{s.tflops:.4f}", f"{frac * 100:.1f}" if frac is not None else "-", s.bound,
                str(s.ptxas["registers"]) if s.ptxas else "-",
                str(s.shared_bytes) if s.shared_bytes or s.target == "cuda" else "-",
                str(s.ptxas.get("spill_store_bytes", 0) + s.ptxas.get("spill_load_bytes", 0)) if s.ptxas else "-",
                f"{occ['occupancy'] * 100:.0f}%" if occ else "-"))
        widths = [max(len(r[i]) for r in rows) for i in range(len(rows[0]))]
        out = []
        for j, r in enumerate(rows):
            out.append("  ".join(c.ljust(w) if i < 3 or i == 11 else c.rjust(w) for i, (c, w) in
                                 enumerate(zip(r, widths))).rstrip())
            if j == 0:
                out.append("-" * len(out[0]))
        total = sum(s.total_s for s in stats)
        out.append(f"{len(self.launches)} kernel launches, {total * 1e3:.3f} ms of kernel time")
        for target in sorted({s.target for s in stats}):
            p = self.peak(target)
            timers = sorted({s.timer for s in stats if s.target == target})
            if p is not None:
                out.append(f"{target}: peaks of {p.name}: {p.bytes_per_s / 1e9:.1f} GB/s, "
                           f"{p.vector_flops / 1e12:.3f} TFLOP/s"
                           + (f" ({', '.join(f'{e} matmul {v / 1e12:.0f}' for e, v in p.matmul.items() if v != p.vector_flops)})"
                              if any(v != p.vector_flops for v in p.matmul.values()) else "")
                           + f" [{p.source}]; timed with {', '.join(timers)}")
            else:
                out.append(f"{target}: no peaks known for this device (kf.costs.register_peak); "
                           f"timed with {', '.join(timers)}")
        if lines:
            out.append("")
            out.append("user lines fused into each kernel:")
            for s in stats:
                out.append(f"  {s.kernel}: " + (", ".join(_short(x) for x in s.fused_lines) or "-"))
            out.append("")
            out.append("compile time by pass (ms):")
            for fn, seconds in self.compile_seconds.items():
                items = sorted(seconds.items(), key=lambda kv: -kv[1])
                out.append(f"  {fn}: {sum(seconds.values()) * 1e3:.1f} total; "
                           + ", ".join(f"{k} {v * 1e3:.1f}" for k, v in items))
        text = Text("\n".join(out))
        if file is not None:
            print(text, file=file)
        return text

    def export_chrome_trace(self, path: str) -> str:
        """Write the launches as Chrome trace-event JSON (Perfetto and chrome://tracing
        open it): a host track with each program call and a track per target with its
        kernels, each event carrying bytes, FLOPs, GB/s and the user lines it fuses."""
        events: list[dict] = [
            {"ph": "M", "pid": 1, "name": "process_name", "args": {"name": "kf"}},
            {"ph": "M", "pid": 1, "tid": 0, "name": "thread_name", "args": {"name": "host: kf program calls"}},
        ]
        tids: dict[str, int] = {}
        calls: dict[tuple[str, float], float] = {}
        cursor: dict[tuple[str, float], float] = {}
        for launch in self.launches:
            tid = tids.get(launch.target)
            if tid is None:
                tid = tids[launch.target] = len(tids) + 1
                events.append({"ph": "M", "pid": 1, "tid": tid, "name": "thread_name",
                               "args": {"name": f"{launch.target}: kernels ({launch.timer})"}})
            call = (launch.function, launch.start_s)
            # Kernels of one call run one after another from the call's start (CUDA
            # events say when each began on the device).
            launch.seconds  # noqa: B018  (reads CUDA events, setting device_start_s)
            start = launch.device_start_s if launch.device_start_s is not None else cursor.get(call, launch.start_s)
            cursor[call] = start + launch.seconds
            calls[call] = max(calls.get(call, 0.0), cursor[call] - launch.start_s)
            events.append({
                "ph": "X", "pid": 1, "tid": tid, "name": launch.kernel, "cat": "kernel",
                "ts": start * 1e6, "dur": launch.seconds * 1e6,
                "args": {"function": launch.function, "strategy": launch.strategy, "bytes": launch.nbytes,
                         "flops": launch.flops, "GB/s": launch.nbytes / launch.seconds / 1e9 if launch.seconds else 0,
                         "grid": list(launch.grid), "block": list(launch.block),
                         "fused_lines": list(launch.fused_lines), "ptxas": launch.ptxas}})
        for (fn, start), dur in calls.items():
            events.append({"ph": "X", "pid": 1, "tid": 0, "name": fn, "cat": "call", "ts": start * 1e6,
                           "dur": dur * 1e6})
        with open(path, "w") as f:
            json.dump({"traceEvents": events, "displayTimeUnit": "ns"}, f, indent=1)
        return path

    def roofline(self, path: str, title: str | None = None) -> str:
        """Draw each kernel against its device's roofline into a PNG (matplotlib).

        x: arithmetic intensity (FLOP/byte), y: achieved FLOP/s; the roofs are peak
        bandwidth × intensity and the vector (and, where it differs, matrix) FLOP rate.
        Kernels with no FLOPs cannot sit on a log axis: they are listed under the plot."""
        try:
            import matplotlib
        except ModuleNotFoundError:
            raise ImportError("kf's roofline plot needs matplotlib, part of the 'plot' extra: "
                              "pip install 'kf[plot]' (or pip install matplotlib)") from None

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        stats = self.kernels()
        fig, ax = plt.subplots(figsize=(8, 5.5))
        ax.set_xscale("log")
        ax.set_yscale("log")
        plotted = [s for s in stats if s.flops and s.nbytes and s.mean_s]
        skipped = [s.kernel for s in stats if s not in plotted]
        xs = [s.intensity for s in plotted] or [1.0]
        lo, hi = min(xs + [0.05]) / 4, max(xs + [50.0]) * 4
        colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
        targets = sorted({s.target for s in stats})
        for i, target in enumerate(targets):
            p = self.peak(target)
            if p is None:
                continue
            grid = [lo * (hi / lo) ** (j / 200) for j in range(201)]
            roofs = {"vector": p.vector_flops}
            for e, v in p.matmul.items():
                if v > p.vector_flops and any(s.elem == e and s.matmul_flops for s in plotted):
                    roofs[f"{e} matmul"] = v
            for name, rate in roofs.items():
                ax.plot(grid, [min(p.bytes_per_s * x, rate) for x in grid], color=colors[i % len(colors)],
                        linestyle="-" if name == "vector" else "--", linewidth=1.5,
                        label=f"{p.name} ({target}): {p.bytes_per_s / 1e9:.0f} GB/s, {name} {rate / 1e12:.2f} TFLOP/s")
        for s in plotted:
            y = s.flops / s.mean_s
            ax.scatter([s.intensity], [y], s=40, zorder=3, color=colors[targets.index(s.target) % len(colors)])
            frac = s.roofline_fraction
            ax.annotate(f"{s.kernel}" + (f" ({frac * 100:.0f}%)" if frac is not None else ""),
                        (s.intensity, y), textcoords="offset points", xytext=(5, 4), fontsize=8)
        ax.set_xlabel("arithmetic intensity (FLOP / byte moved)")
        ax.set_ylabel("achieved FLOP/s")
        ax.set_xlim(lo, hi)
        ax.set_title(title or "kf kernels against the roofline")
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=7, loc="lower right")
        if skipped:
            fig.text(0.01, 0.01, "no FLOPs (not plotted): " + ", ".join(skipped), fontsize=7)
        fig.tight_layout()
        fig.savefig(path, dpi=120)
        plt.close(fig)
        return path

    def __repr__(self) -> str:
        return f"<kf.profile: {len(self.launches)} kernel launches>"


class Text(str):
    """Report text that a REPL shows as it reads (a str's repr would quote and escape it)."""

    def __repr__(self) -> str:
        return str(self)


def _short(line: str) -> str:
    file, _, no = line.rpartition(":")
    return f"{os.path.basename(file)}:{no}" if file else line
