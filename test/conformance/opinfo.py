"""PyTorch's OpInfo samples through kf, each classified against torch eager.

For every OpInfo of ``torch.testing._internal.common_methods_invocations.op_db`` and
each of its sample inputs (``op.sample_inputs(device, dtype)``), a kf function calls the
op on the sample: its tensors are the function's argument (one list), everything else
(Python numbers, shapes, dims, dtypes, keyword flags) is closed over and so a constant
of the compiled program, as in a user's ``@kf.jit`` function. The result is compared
with eager on clones of the same inputs and each case gets one class:

PASS       kf ran and its results match eager's: same structure, dtype, shape and
           device, values within the dtype's tolerance (``torch.testing.assert_close``'s
           defaults, raised to the op's own ``toleranceOverride`` from its OpInfo), or,
           where they differ by more, no further from a float64 reference than twice
           eager's own error plus that tolerance (a fused kernel that rounds once may be
           closer to the truth than eager, never much further). A sum of products (a
           convolution, a matmul: ``SUMS_OF_PRODUCTS``) may also be off by a few units
           of the dtype's precision times the sum of its terms' magnitudes: what summing
           in another order than eager's costs after cancellation.
KF_ERROR   kf refused the case with one of its own exception types (``kf.CompileError``
           and subclasses, ``kf.SignatureError``, the runtime's errors, kf's index check):
           a clear error. ``user_line`` records whether the message shows the line of
           the kf function that calls the op (``File ".../opinfo_classify.py", line N``).
INTERNAL   kf failed with an internal error: a ``CompileError`` that says "internal
           compiler error" (kf caught its own bug and wrapped it), or an exception of a
           type kf does not define (KeyError, AttributeError, RuntimeError, ...) escaping
           the call. Either is a defect in kf, not a refusal a user can act on.
MISMATCH   kf ran and returned something else: wrong values, dtype, shape, device or
           result structure.
CRASH      the process running the case died (a signal, ``os._exit``, a C abort) or the
           case ran past ``--case-timeout`` (a hang).
SKIP       the case says nothing about kf: eager itself raises on the sample, or the
           op's values are undefined or random (``empty``, ``bernoulli``, dropout), where
           only the result's structure, dtype and shape are compared (a difference there
           is still a MISMATCH).

Cases run in worker subprocesses, a batch each; a worker writes a line before and after
each case, so a crash costs only the case it happened in: the runner records it as a
CRASH and runs the rest of the batch in a new worker. Seeds are fixed (sample inputs
from a seed derived from the op's name, so a case is the same whichever batch runs it).

    python test/conformance/opinfo.py --target cpu --dtype float32 --out cpu-f32.md --out cpu-f32.json
    python test/conformance/opinfo.py --target vulkan --ops '^(add|softmax)$' --jobs 2
    python test/conformance/opinfo.py --target cpu --case 'softmax#3'   # one case, in process

A case's name is ``op[.variant]#index``: the OpInfo's name, its variant_test_name and the
sample's index in ``op.sample_inputs(device, dtype)``.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import signal
import sys
import tempfile
import time
from pathlib import Path

# The runner's modules sit beside this file: a script finds them, but
# test/python/conformance/test_opinfo.py loads this file by its path.
sys.path.insert(0, str(Path(__file__).resolve().parent))

from opinfo_cases import (CLASSES, DTYPES, FAILURES, TARGETS, Case, Result, cached_samples, ci_case,  # noqa: E402
                          ci_ops, enumerate_cases, op_table, parse_case_name, spread)
from opinfo_compare import compare  # noqa: E402
from opinfo_classify import classify_exception, run_case, scope_case  # noqa: E402
from opinfo_workers import RunOptions, run_cases, worker  # noqa: E402
from opinfo_report import git_commit, markdown, summarize, torch_mlir_importable, write_summary  # noqa: E402

#: what test/python/conformance/test_opinfo.py and other callers use
__all__ = ["CLASSES", "DTYPES", "FAILURES", "TARGETS", "Case", "Result", "RunOptions", "ci_case", "ci_ops",
           "classify_exception", "compare", "enumerate_cases", "markdown", "run_case", "run_cases", "spread",
           "summarize", "write_summary"]


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["--worker"]:
        threads = int(argv[argv.index("--threads") + 1]) if "--threads" in argv else 0
        worker(argv[1], argv[2], threads)
        return 0
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--target", choices=TARGETS, default="cpu")
    p.add_argument("--dtype", choices=DTYPES, default="float32")
    p.add_argument("--ops", default="", help="a regex the op's full name (op[.variant]) must match")
    p.add_argument("--limit-per-op", type=int, default=0, help="samples per op, spread evenly (0: all)")
    p.add_argument("--jobs", type=int, default=1, help="worker processes at once")
    p.add_argument("--batch", type=int, default=16, help="cases per worker process")
    p.add_argument("--case-timeout", type=float, default=300.0, help="seconds before a case counts as a hang")
    p.add_argument("--out", action="append", default=[], help="summary file: .md (report) or .json (every case)")
    p.add_argument("--case", action="append", default=[],
                   help="run these cases (op[.variant]#index) in this process and print each result")
    p.add_argument("--list", action="store_true", help="print the cases and stop")
    p.add_argument("--resume", metavar="JSON",
                   help="an earlier, cut run's JSON (same target, dtype and selection): keep its results, run the rest")
    p.add_argument("--rescope", metavar="JSON",
                   help="give each case of this earlier run's JSON its scope, and write the summary to --out")
    args = p.parse_args(argv)

    if args.rescope:
        return rescope(Path(args.rescope), args.out)

    if args.case:
        for name in args.case:
            op, variant, index = parse_case_name(name)
            case = Case(op, variant, index, args.target, args.dtype)
            opinfo = op_table()[(op, variant)]
            sample = cached_samples(opinfo, args.target, args.dtype)[index]
            print(f"{case.name}: {sample}")
            os.environ.setdefault("KF_CACHE_DIR", tempfile.mkdtemp(prefix="kf-opinfo-case-"))
            r = run_case(case)
            print(f"{r.cls}: {r.detail}")
        return 0

    start = time.time()
    cases = enumerate_cases(args.target, args.dtype, args.ops, args.limit_per_op,
                            log=lambda m: print(m, file=sys.stderr))
    if args.list:
        print("\n".join(c.name for c in cases))
        return 0
    counts: collections.Counter = collections.Counter()
    finished: list[Result] = resumed(Path(args.resume), cases, args) if args.resume else []
    counts.update(r.cls for r in finished)
    done_names = {r.case.name for r in finished}

    def progress(r: Result) -> None:
        finished.append(r)
        counts[r.cls] += 1
        done = sum(counts.values())
        if r.cls in FAILURES or done % 50 == 0 or done == len(cases):
            print(f"[{done}/{len(cases)}] {r.cls:8} {r.case.name}: {r.detail[:160]}  "
                  f"({', '.join(f'{c} {n}' for c, n in sorted(counts.items()))})", file=sys.stderr, flush=True)

    def meta() -> dict:
        import torch

        return {"target": args.target, "dtype": args.dtype, "ops": args.ops, "limit_per_op": args.limit_per_op,
                "torch": torch.__version__, "torch_mlir": torch_mlir_importable(), "commit": git_commit(),
                "date": time.strftime("%Y-%m-%d"),
                "seconds": time.time() - start,
                "command": "python test/conformance/opinfo.py " + " ".join(a for a in argv if a)}

    def cut_short(signum, frame) -> None:
        """SIGTERM (``timeout``'s signal): the summary of the cases finished so far, marked
        partial, then exit 3 at once (the workers' cases in flight are not waited for)."""
        partial = {**meta(), "partial": f"cut by signal {signum} after {len(finished)} of {len(cases)} cases"}
        write_summary(summarize(in_order(finished), partial), args.out)
        print(f"cut short: {partial['partial']}; summary written", file=sys.stderr, flush=True)
        os._exit(3)

    order = {c.name: i for i, c in enumerate(cases)}

    def in_order(results: list[Result]) -> list[Result]:
        return sorted(results, key=lambda r: order[r.case.name])

    signal.signal(signal.SIGTERM, cut_short)
    print(f"{len(cases)} cases, target {args.target}, {args.dtype}"
          + (f", {len(done_names)} of them from {args.resume}" if args.resume else ""), file=sys.stderr, flush=True)
    todo = [c for c in cases if c.name not in done_names]
    kept = list(finished)
    results = kept + run_cases(todo, RunOptions(jobs=args.jobs, batch=args.batch, case_timeout=args.case_timeout,
                                                progress=progress))
    summary = summarize(in_order(results), meta())
    write_summary(summary, args.out)
    print(json.dumps(summary["counts"]), file=sys.stderr)
    return 0


def resumed(path: Path, cases: list[Case], args: argparse.Namespace) -> list[Result]:
    """The results of an earlier run's JSON that belong to this run's cases. A run cut by
    its time limit goes on from there; the earlier run must be of the same target and dtype."""
    old = json.loads(path.read_text())
    meta = old["meta"]
    if (meta["target"], meta["dtype"]) != (args.target, args.dtype):
        raise SystemExit(f"--resume {path}: a run of {meta['target']}/{meta['dtype']}, "
                         f"not {args.target}/{args.dtype}")
    by_name = {c.name: c for c in cases}
    return [Result.from_json(d, by_name[d["case"]]) for d in old["results"] if d["case"] in by_name]


def rescope(path: Path, outs: list[str]) -> int:
    """Recompute every case's scope (``opinfo_scope.py``) of a run's JSON, without
    running kf again, and write its summary with the coverage to ``outs``."""
    old = json.loads(path.read_text())
    meta = old["meta"]
    os.environ.setdefault("KF_CACHE_DIR", tempfile.mkdtemp(prefix="kf-opinfo-scope-"))
    results = []
    for d in old["results"]:
        op, variant, index = parse_case_name(d["case"])
        r = Result.from_json(d, Case(op, variant, index, meta["target"], meta["dtype"]))
        r.scope = scope_case(r.case)
        results.append(r)
    summary = summarize(results, meta)
    write_summary(summary, outs or [str(path)])
    print(json.dumps(summary["coverage"]), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
