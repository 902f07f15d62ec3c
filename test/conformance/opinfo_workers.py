"""The OpInfo conformance suite's worker processes (opinfo.py): cases run a batch per
process, each announced before it runs, so that a case the process dies in is a CRASH
and the rest of its batch goes to a new worker."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from opinfo_cases import REPO, Case, Result, first_line
from opinfo_classify import run_case


#: the command line that a worker process runs (``opinfo.py --worker``)
CLI = Path(__file__).resolve().with_name("opinfo.py")




def worker(cases_file: str, out_file: str, threads: int) -> None:
    """Run the cases listed in cases_file (JSON), appending to out_file one line before
    each case ({"start": name}) and one after ({"result": ...}), flushed as written: a
    runner that finds a start without its result knows which case the process died in."""
    import torch

    if threads:
        torch.set_num_threads(threads)
    cases = [Case(**c) for c in json.loads(Path(cases_file).read_text())]
    cache_root = os.environ.get("KF_CACHE_DIR", "")
    with open(out_file, "a", buffering=1) as out:
        for case in cases:
            out.write(json.dumps({"start": case.name}) + "\n")
            out.flush()
            if cache_root:
                # a fresh compile cache per case: every case compiles, and no two cases
                # (whose kf functions have the same code) can share an entry
                os.environ["KF_CACHE_DIR"] = tempfile.mkdtemp(dir=cache_root)
            try:
                result = run_case(case)
            except Exception as e:  # the harness itself failed: report, do not stop
                result = Result(case, "INTERNAL", f"conformance harness: {type(e).__name__}: {first_line(e)}",
                                f"harness.{type(e).__name__}")
            finally:
                if cache_root:
                    shutil.rmtree(os.environ["KF_CACHE_DIR"], ignore_errors=True)
            out.write(json.dumps({"result": result.to_json()}) + "\n")
            out.flush()


# ----------------------------------------------------------------------------- runner


@dataclass
class RunOptions:
    jobs: int = 1
    batch: int = 16
    case_timeout: float = 300.0
    python: str = sys.executable
    progress: Any = None  # a callable taking (done, total, result), or None


def _run_batch(cases: list[Case], opts: RunOptions, workdir: Path) -> list[Result]:
    """Run cases in worker processes until each has a result: a case a worker dies in
    (or that runs past the timeout) is a CRASH, and the rest go to a new worker."""
    results: list[Result] = []
    pending = list(cases)
    by_name = {c.name: c for c in cases}
    attempt = 0
    while pending:
        attempt += 1
        tag = f"{os.getpid()}-{threading.get_ident()}-{attempt}-{time.monotonic_ns()}"
        cases_file, out_file = workdir / f"cases-{tag}.json", workdir / f"out-{tag}.jsonl"
        err_file = workdir / f"err-{tag}.txt"
        cache = workdir / f"cache-{tag}"
        cache.mkdir()
        cases_file.write_text(json.dumps([dataclasses.asdict(c) for c in pending]))
        out_file.touch()
        env = dict(os.environ, KF_CACHE_DIR=str(cache), PYTHONWARNINGS="ignore")
        threads = 1 if opts.jobs > 1 else 0
        with open(err_file, "w") as err:
            proc = subprocess.Popen([opts.python, str(CLI), "--worker", str(cases_file), str(out_file),
                                     "--threads", str(threads)], stdout=subprocess.DEVNULL, stderr=err,
                                    cwd=str(REPO), env=env, start_new_session=True)
            timed_out = _watch(proc, out_file, opts.case_timeout)
        lines = [json.loads(x) for x in out_file.read_text().splitlines() if x.strip().endswith("}")]
        finished = set()
        for line in lines:
            if "result" in line:
                r = line["result"]
                results.append(Result.from_json(r, by_name[r["case"]]))
                finished.add(r["case"])
                if opts.progress:
                    opts.progress(results[-1])
        unfinished = [c for c in pending if c.name not in finished]
        if unfinished:
            begun = [line["start"] for line in lines if "start" in line and line["start"] not in finished]
            if begun:  # the worker died in this case
                victim = by_name[begun[-1]]
                if timed_out:
                    detail = f"timed out after {opts.case_timeout:g} s"
                else:
                    code = proc.returncode
                    detail = (f"killed by signal {-code}" if code < 0 else f"exit status {code}") + \
                        _stderr_tail(err_file)
                results.append(Result(victim, "CRASH", detail[:300], "", None, 0.0))
                if opts.progress:
                    opts.progress(results[-1])
                unfinished = [c for c in unfinished if c.name != victim.name]
            elif proc.returncode != 0:  # died before its first case: the harness is broken
                raise RuntimeError(f"conformance worker failed to start: {_stderr_tail(err_file)}")
        pending = unfinished
        shutil.rmtree(cache, ignore_errors=True)
        for f in (cases_file, out_file, err_file):
            f.unlink(missing_ok=True)
    return results


def _stderr_tail(path: Path) -> str:
    text = [line for line in path.read_text(errors="replace").splitlines() if line.strip()]
    return f": {text[-1].strip()[:200]}" if text else ""


def _watch(proc, out_file: Path, case_timeout: float) -> bool:
    """Wait for the worker; kill its process group when one case runs past the timeout
    (no line written for that long). Whether it was killed so."""
    seen, since = 0, time.monotonic()
    while proc.poll() is None:
        time.sleep(0.2)
        size = out_file.stat().st_size
        if size != seen:
            seen, since = size, time.monotonic()
        elif time.monotonic() - since > case_timeout:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, 9)
            proc.wait()
            return True
    return False


def run_cases(cases: list[Case], opts: RunOptions) -> list[Result]:
    """Every case's result, in batches of opts.batch over opts.jobs worker processes."""
    from concurrent.futures import ThreadPoolExecutor

    batches = [cases[i:i + opts.batch] for i in range(0, len(cases), opts.batch)]
    workdir = Path(tempfile.mkdtemp(prefix="kf-opinfo-"))
    try:
        with ThreadPoolExecutor(max_workers=max(1, opts.jobs)) as pool:
            results = [r for rs in pool.map(lambda b: _run_batch(b, opts, workdir), batches) for r in rs]
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
    order = {c.name: i for i, c in enumerate(cases)}
    return sorted(results, key=lambda r: order[r.case.name])
