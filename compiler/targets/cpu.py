"""The CPU target: the function as one LLVM shared object, called through ctypes.

    linalg  kf-lower-to-linalg (the program's signature and FLOPs read first, its
            index sites after)
    llvm    kf-to-cpu
    so      LLVM codegen and link: the shared object and its ProgramABI
"""

from __future__ import annotations

import time

from .base import Build, Stage, Target


class CpuTarget(Target):
    """Runs on the host, on CPU tensors."""

    name = "cpu"
    torch_device = "cpu"
    dynamic_shapes = True  # the linalg path sizes its tensors from tensor.dim

    def add_stages(self, stages: dict[str, Stage]) -> None:
        stages["linalg"] = linalg
        stages["llvm"] = llvm
        stages["so"] = shared_object


CPU = CpuTarget()


def linalg(b: Build) -> None:
    """kf-lower-to-linalg, with the entry's signature and FLOPs read from the kf IR first
    and the ops that check indices after."""
    from kf.runtime.abi import TensorArg

    from ..costs import kernel_flops
    from ..cpu_codegen import _func, _signature, index_sites, rename_entry
    from ..stages import run_passes

    cap = b.cap
    entry = _func(cap.module, cap.name)
    b.notes["flops"] = kernel_flops(entry)
    ins, outs = _signature(entry)
    # run-time sizes: each dim's size as text (dynamic.py), which the launcher evaluates
    in_dims, out_dims = cap.input_dims or [()] * len(ins), cap.output_dims or [()] * len(outs)
    b.notes["inputs"] = tuple(TensorArg(n, a.shape, a.elem, () if a.is_static else tuple(d))
                              for n, a, d in zip(cap.input_names, ins, in_dims))
    b.notes["outputs"] = tuple(TensorArg(a.name, a.shape, a.elem, () if a.is_static else tuple(d))
                               for a, d in zip(outs, out_dims))
    if "arg_attrs" in entry.attributes:  # parameter names are for people; the ABI has them
        del entry.attributes["arg_attrs"]
    symbol = b.notes["symbol"] = rename_entry(cap.module, cap.name)
    run_passes(cap.module, ["kf-lower-to-linalg"], b.log, record_after={"kf-lower-to-linalg": "linalg"})
    b.notes["index_sites"] = index_sites(_func(cap.module, symbol))


def llvm(b: Build) -> None:
    """kf-to-cpu: the LLVM dialect, recorded as the ``llvm`` stage."""
    from ..stages import run_passes

    run_passes(b.cap.module, ["kf-to-cpu"], b.log, record_after={"kf-to-cpu": "llvm"})


def shared_object(b: Build) -> None:
    """The shared object (timed as ``llvm codegen + link``) and the program's ABI."""
    import os
    import tempfile
    from pathlib import Path

    from ..cpu_codegen import link_shared_object, program_abi

    cap, notes = b.cap, b.notes
    start = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="kf-cpu-") as tmp:
        so = link_shared_object(cap.module, os.path.join(tmp, f"{cap.name}.so"))
        data = Path(so).read_bytes()
    b.log.seconds["llvm codegen + link"] = time.perf_counter() - start
    flops, mm = notes["flops"]
    b.abi = program_abi(notes["symbol"], notes["inputs"], notes["outputs"], notes["index_sites"], f"{cap.name}.so",
                        fused_lines=tuple(sorted({str(l) for l in cap.source_locs.values()})),
                        extra={"strategy": "cpu", "flops": flops, "matmul_flops": mm})
    b.artifacts[f"{cap.name}.so"] = data
