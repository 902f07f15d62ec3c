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
           closer to the truth than eager, never much further).
KF_ERROR   kf refused the case with one of its own exception types (``kf.CompileError``
           and subclasses, ``kf.SignatureError``, the runtime's errors, kf's index check):
           a clear error. ``user_line`` records whether the message shows the line of
           the kf function that calls the op (``File ".../opinfo.py", line N``).
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
    python test/conformance/opinfo.py --target cpu --case 'nn.functional.softmax#3'   # one case, in process

A case's name is ``op[.variant]#index``: the OpInfo's name, its variant_test_name and the
sample's index in ``op.sample_inputs(device, dtype)``.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import dataclasses
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import traceback
import warnings
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterable

CLASSES = ("PASS", "KF_ERROR", "INTERNAL", "MISMATCH", "CRASH", "SKIP")
#: the classes that are defects in kf (CI fails on any of them)
FAILURES = ("INTERNAL", "MISMATCH", "CRASH")
TARGETS = ("cpu", "vulkan", "cuda")
DTYPES = ("float32", "bfloat16", "float16", "float64")
SCRIPT = Path(__file__).resolve()
REPO = SCRIPT.parents[2]

#: Ops whose values are undefined (uninitialized memory): only metadata is compared.
UNDEFINED_VALUES = frozenset({"empty", "empty_like", "empty_permuted", "empty_strided", "new_empty",
                              "new_empty_strided"})
#: Test classes whose toleranceOverride decorators apply to kf's comparison: those that
#: compare a compiled or decomposed op with eager, or eager with a reference.
_TOLERANCE_CLASSES = frozenset({None, "TestInductorOpInfo", "TestDecomp", "TestCommon", "TestUnaryUfuncs",
                                "TestBinaryUfuncs", "TestReductions"})


# ----------------------------------------------------------------------------- cases


@dataclass(frozen=True)
class Case:
    """One sample of one OpInfo, for one target and dtype."""

    op: str  # OpInfo.name
    variant: str  # OpInfo.variant_test_name ("" for most)
    index: int  # the sample's position in op.sample_inputs(device, dtype)
    target: str
    dtype: str

    @property
    def name(self) -> str:
        return f"{self.op}{'.' + self.variant if self.variant else ''}#{self.index}"

    @property
    def op_name(self) -> str:
        return f"{self.op}{'.' + self.variant if self.variant else ''}"

    def reproducer(self) -> str:
        return (f"python test/conformance/opinfo.py --target {self.target} --dtype {self.dtype} "
                f"--case '{self.name}'")


@dataclass
class Result:
    case: Case
    cls: str
    detail: str = ""  # one line: the error's first line, the mismatch, the skip's reason
    error_type: str = ""
    user_line: bool | None = None  # KF_ERROR: the message shows the kf function's line
    seconds: float = 0.0

    def to_json(self) -> dict:
        d = dataclasses.asdict(self)
        d["case"] = self.case.name
        d["op"] = self.case.op_name
        return d

    @staticmethod
    def from_json(d: dict, case: Case) -> "Result":
        return Result(case, d["cls"], d.get("detail", ""), d.get("error_type", ""), d.get("user_line"),
                      d.get("seconds", 0.0))


def parse_case_name(name: str) -> tuple[str, str, int]:
    """(op, variant, index) of ``op[.variant]#index``; the variant is whatever follows the
    longest OpInfo name that the text before ``#`` starts with."""
    head, _, index = name.rpartition("#")
    if not head or not index.isdigit():
        raise ValueError(f"a case is named op[.variant]#index, got {name!r}")
    for op in sorted(_op_table(), key=lambda key: -len(key[0] + key[1])):
        full = op[0] + ("." + op[1] if op[1] else "")
        if full == head:
            return op[0], op[1], int(index)
    raise ValueError(f"no OpInfo named {head!r}")


def _device(target: str) -> str:
    return "cuda" if target == "cuda" else "cpu"


def _torch_dtype(name: str):
    import torch

    return getattr(torch, name)


_OPS: dict | None = None


def _op_table() -> dict:
    """(name, variant) -> OpInfo for every entry of op_db."""
    global _OPS
    if _OPS is None:
        with _quiet():
            from torch.testing._internal.common_methods_invocations import op_db
        _OPS = {(op.name, op.variant_test_name): op for op in op_db}
    return _OPS


def _seed(op_name: str) -> int:
    return zlib.crc32(op_name.encode())


@contextlib.contextmanager
def _quiet():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


def samples_of(opinfo, target: str, dtype: str) -> list:
    """The OpInfo's sample inputs, made from the op's own fixed seed."""
    import torch

    full = opinfo.name + ("." + opinfo.variant_test_name if opinfo.variant_test_name else "")
    torch.manual_seed(_seed(full))
    with _quiet():
        return list(opinfo.sample_inputs(_device(target), _torch_dtype(dtype)))


def spread(n: int, limit: int) -> list[int]:
    """limit indices of range(n), spread evenly and including the first and the last
    (samples are often ordered small to large, or by option); all of them for limit 0."""
    if limit <= 0 or n <= limit:
        return list(range(n))
    if limit == 1:
        return [0]
    return sorted({round(i * (n - 1) / (limit - 1)) for i in range(limit)})


def enumerate_cases(target: str, dtype: str, ops: str = "", limit_per_op: int = 0,
                    log=None) -> list[Case]:
    """The cases of every OpInfo whose full name matches the regex ops (all when empty)
    and that supports dtype on the target's device, limit_per_op samples each."""
    pattern = re.compile(ops) if ops else None
    dt = _torch_dtype(dtype)
    cases = []
    for (name, variant), opinfo in sorted(_op_table().items()):
        full = name + ("." + variant if variant else "")
        if pattern is not None and not pattern.search(full):
            continue
        with _quiet():
            if dt not in opinfo.supported_dtypes(_device(target)):
                continue
        try:
            n = len(samples_of(opinfo, target, dtype))
        except Exception as e:  # torch's own sample generator failed: nothing to run
            if log:
                log(f"{full}: sample_inputs raised {type(e).__name__}: {_first_line(e)}")
            continue
        cases.extend(Case(name, variant, i, target, dtype) for i in spread(n, limit_per_op))
    return cases


def ci_ops(target: str, dtype: str, every: int) -> list[tuple[str, str]]:
    """The ops of CI's fixed sample: about one in ``every`` of the OpInfos that support
    dtype on the target's device, chosen by a hash of the op's name and the dtype (so the
    choice is the same in every process and differs between dtypes)."""
    dt = _torch_dtype(dtype)
    chosen = []
    for (name, variant), opinfo in sorted(_op_table().items()):
        full = name + ("." + variant if variant else "")
        if zlib.crc32(f"{full}:{dtype}".encode()) % every:
            continue
        with _quiet():
            if dt in opinfo.supported_dtypes(_device(target)):
                chosen.append((name, variant))
    return chosen


def ci_case(op: str, variant: str, target: str, dtype: str) -> Case | None:
    """The op's case in CI's sample: its first or its last sample input (both of which
    every run with --limit-per-op 2 or more covers), by a hash of its name; None when the
    op has no samples."""
    full = op + ("." + variant if variant else "")
    try:
        n = len(samples_of(_op_table()[(op, variant)], target, dtype))
    except Exception:
        return None
    if not n:
        return None
    return Case(op, variant, spread(n, 2)[zlib.crc32(full.encode()) % min(n, 2)], target, dtype)


# ----------------------------------------------------------------------------- one case


def _first_line(e: BaseException | str) -> str:
    text = str(e).strip()
    return (text.splitlines()[0] if text else (type(e).__name__ if isinstance(e, BaseException) else ""))[:300]


def kf_function(call_op, sample, target: str):
    """(kf function, its tensors): a kf function of one list of tensors that calls the op
    on the sample, its non-tensor arguments closed over as constants."""
    import kf
    import torch
    from torch.utils._pytree import tree_flatten, tree_unflatten

    leaves, spec = tree_flatten((sample.input, sample.args, sample.kwargs))
    where = [i for i, leaf in enumerate(leaves) if isinstance(leaf, torch.Tensor)]
    constants = [None if isinstance(leaf, torch.Tensor) else leaf for leaf in leaves]

    def opinfo_case(tensors):
        values = list(constants)
        for i, t in zip(where, tensors):
            values[i] = t
        x, args, kwargs = tree_unflatten(values, spec)
        return call_op(x, *args, **kwargs)  # CALL_LINE: the user's line of every case

    return kf.jit(target=target)(opinfo_case), [leaves[i] for i in where]


def _call_line() -> int:
    for n, line in enumerate(SCRIPT.read_text().splitlines(), 1):
        if "# CALL_LINE" in line and "return call_op" in line:
            return n
    return 0


CALL_LINE = _call_line()


def _clone(tensors):
    return [t.detach().clone() for t in tensors]


def _with(sample, tensors):
    """The sample's (input, args, kwargs) with its tensors replaced, in order."""
    import torch
    from torch.utils._pytree import tree_flatten, tree_unflatten

    leaves, spec = tree_flatten((sample.input, sample.args, sample.kwargs))
    it = iter(tensors)
    return tree_unflatten([next(it) if isinstance(x, torch.Tensor) else x for x in leaves], spec)


def _eager(call_op, sample, tensors, seed: int = 0):
    import torch

    torch.manual_seed(seed)
    x, args, kwargs = _with(sample, _clone(tensors))
    return call_op(x, *args, **kwargs)


def _is_kf_error(e: BaseException) -> bool:
    """Whether e is one of kf's own exception types (defined in kf's packages)."""
    return any(getattr(t, "__module__", "").split(".")[0] == "kf" for t in type(e).__mro__)


def classify_exception(e: BaseException) -> tuple[str, str, str, bool | None]:
    """(class, one-line detail, error type, user_line) of an exception from a kf call."""
    import kf

    text = str(e)
    first = _first_line(e)
    kind = f"{type(e).__module__}.{type(e).__qualname__}"
    if _is_kf_error(e):
        if isinstance(e, kf.CompileError) and "internal compiler error" in e.message:
            return "INTERNAL", f"{first} | {e.cause or ''}"[:300], kind, None
        names_line = f'{SCRIPT.name}", line {CALL_LINE}' in text
        return "KF_ERROR", first, kind, names_line
    where = _innermost_frame(e)
    return "INTERNAL", f"{type(e).__name__}: {first}{' at ' + where if where else ''}"[:300], kind, None


def _innermost_frame(e: BaseException) -> str:
    tb = traceback.extract_tb(e.__traceback__)
    if not tb:
        return ""
    frame = tb[-1]
    try:
        path = str(Path(frame.filename).resolve().relative_to(REPO))
    except ValueError:
        path = Path(frame.filename).name
    return f"{path}:{frame.lineno}"


def _tolerance(opinfo, dtype) -> tuple[float, float]:
    """(rtol, atol): assert_close's defaults for dtype, raised to the op's own overrides
    (the toleranceOverride decorators of its OpInfo for the test classes that compare
    against eager or a reference on the CPU or without a device)."""
    from torch.testing._comparison import default_tolerances
    from torch.testing._internal.common_device_type import toleranceOverride

    import torch

    rtol, atol = default_tolerances(torch.empty(0, dtype=dtype))
    for info in opinfo.decorators:
        if getattr(info, "cls_name", None) not in _TOLERANCE_CLASSES:
            continue
        device = getattr(info, "device_type", None)
        if device not in (None, "cpu"):
            continue
        for deco in getattr(info, "decorators", [info]):
            if isinstance(deco, toleranceOverride) and dtype in deco.d:
                rtol, atol = max(rtol, deco.d[dtype].rtol), max(atol, deco.d[dtype].atol)
    return rtol, atol


def _leaves(x) -> tuple[list, str]:
    """The leaves of a result and its shape as text; sequences of any kind (tuple, list,
    torch.return_types) count as one kind."""
    from torch.utils._pytree import tree_flatten

    leaves, spec = tree_flatten(x)
    text = re.sub(r"TreeSpec\((tuple|list|[A-Za-z_.]*return_types\.\w+|namedtuple)", "TreeSpec(seq", str(spec))
    return leaves, re.sub(r"\s+", "", text)


def compare(got, want, reference, rtol: float, atol: float, values: bool = True) -> str:
    """'' when kf's result ``got`` matches eager's ``want``, else one line saying how it
    differs. ``reference`` is the float64 reference (or None) for values beyond the
    tolerance; ``values=False`` compares structure, dtypes, shapes and devices only."""
    import torch

    g_leaves, g_spec = _leaves(got)
    w_leaves, w_spec = _leaves(want)
    if len(g_leaves) != len(w_leaves) or g_spec != w_spec:
        return f"result structure {_describe(got)} != eager's {_describe(want)}"
    r_leaves = _leaves(reference)[0] if reference is not None else [None] * len(w_leaves)
    if len(r_leaves) != len(w_leaves):
        r_leaves = [None] * len(w_leaves)
    for i, (g, w, r) in enumerate(zip(g_leaves, w_leaves, r_leaves)):
        at = f"result {i}: " if len(w_leaves) > 1 else ""
        if isinstance(w, torch.Tensor):
            if not isinstance(g, torch.Tensor):
                return f"{at}a {type(g).__name__}, eager gives a tensor"
            if g.dtype != w.dtype:
                return f"{at}dtype {g.dtype} != eager's {w.dtype}"
            if tuple(g.shape) != tuple(w.shape):
                return f"{at}shape {list(g.shape)} != eager's {list(w.shape)}"
            if g.device.type != w.device.type:
                return f"{at}device {g.device} != eager's {w.device}"
            problem = _values(g, w, r, rtol, atol) if values else ""
            if problem:
                return at + problem
        elif isinstance(g, torch.Tensor) or values and g != w and not (_nan(g) and _nan(w)):
            return f"{at}{g!r} != eager's {w!r}"
    return ""


def _nan(x) -> bool:
    return isinstance(x, float) and x != x


def _describe(x) -> str:
    import torch

    if isinstance(x, torch.Tensor):
        return f"tensor{list(x.shape)}"
    if isinstance(x, (list, tuple)):
        return f"{type(x).__name__}({', '.join(_describe(v) for v in x)})"
    return type(x).__name__


def _values(g, w, r, rtol: float, atol: float) -> str:
    import torch

    if g.numel() == 0:
        return ""
    g, w = g.detach().cpu(), w.detach().cpu()
    if not (w.dtype.is_floating_point or w.dtype.is_complex):
        if torch.equal(g, w):
            return ""
        bad = (g != w).nonzero()[0].tolist()
        return f"{int((g != w).sum())} of {w.numel()} values differ (first at {bad}: {g[tuple(bad)].item()} != " \
               f"eager's {w[tuple(bad)].item()})"
    try:
        torch.testing.assert_close(g, w, rtol=rtol, atol=atol, equal_nan=True, check_device=False,
                                   check_stride=False)
        return ""
    except AssertionError:
        pass
    g64, w64 = g.to(torch.float64), w.to(torch.float64)
    nan_g, nan_w = g64.isnan(), w64.isnan()
    if not torch.equal(nan_g, nan_w):
        return f"NaN at {int((nan_g != nan_w).sum())} places where eager has none or the other way"
    inf_g, inf_w = g64.isinf(), w64.isinf()
    if not torch.equal(inf_g, inf_w) or not torch.equal(g64[inf_g], w64[inf_w]):
        return "infinities differ from eager's"
    ok = ~(nan_g | inf_g)
    err = (g64 - w64).abs()
    limit = atol + rtol * w64.abs()
    if isinstance(r, torch.Tensor) and r.shape == w.shape:
        r64 = r.detach().cpu().to(torch.float64)
        fine = (g64 - r64).abs() <= 2 * (w64 - r64).abs() + atol + rtol * r64.abs()
        if bool((fine | ~ok).all()):
            return ""
    bad = ((err > limit) & ok).nonzero()
    first = bad[0].tolist() if len(bad) else []
    where = f" (first at {first}: {g64[tuple(first)].item():.6g} != eager's {w64[tuple(first)].item():.6g})" \
        if first else ""
    return (f"{len(bad)} of {w.numel()} values beyond rtol={rtol:g} atol={atol:g}, max abs diff "
            f"{float(err[ok].max()) if ok.any() else float('nan'):.3g}{where}")


def _reference(call_op, sample, tensors, dtype):
    """The op on float64 copies of the float tensors of the tested dtype, or None."""
    import torch

    try:
        up = [t.detach().to(torch.float64) if t.dtype == dtype else t.detach().clone() for t in tensors]
        x, args, kwargs = _with(sample, up)
        with _quiet():
            return call_op(x, *args, **kwargs)
    except Exception:
        return None


def _is_random(call_op, sample, tensors, first) -> bool:
    """Whether eager gives other values with another seed (a random op)."""
    try:
        second = _eager(call_op, sample, tensors, seed=1)
    except Exception:
        return False
    return compare(second, first, None, 0.0, 0.0) != ""


def _seeds_itself(call_op) -> bool:
    """Whether the OpInfo wraps its op in torch's wrapper_set_seed (random ops do)."""
    code = getattr(call_op, "__code__", None)
    return code is not None and "wrapper_set_seed" in code.co_names


def run_case(case: Case) -> Result:
    """Run one case in this process and classify it."""
    start = time.perf_counter()
    opinfo = _op_table()[(case.op, case.variant)]
    dtype = _torch_dtype(case.dtype)
    sample = _samples(opinfo, case.target, case.dtype)[case.index]
    call_op = opinfo.op

    def done(cls, detail="", error_type="", user_line=None):
        return Result(case, cls, detail, error_type, user_line, round(time.perf_counter() - start, 3))

    fn, tensors = kf_function(call_op, sample, case.target)
    try:
        with _quiet():
            want = _eager(call_op, sample, tensors)
    except Exception as e:
        return done("SKIP", f"eager raises {type(e).__name__}: {_first_line(e)}")
    values_defined = case.op not in UNDEFINED_VALUES
    with _quiet():
        random = values_defined and _is_random(call_op, sample, tensors, want)
    try:
        with _quiet():
            got = fn(_clone(tensors))
    except Exception as e:
        return done(*classify_exception(e))
    rtol, atol = _tolerance(opinfo, dtype)
    shape_only = compare(got, want, None, rtol, atol, values=False)
    if shape_only:
        return done("MISMATCH", shape_only)
    if not values_defined or random:
        why = "undefined values (uninitialized memory)" if not values_defined else "random op"
        return done("SKIP", f"{why}: kf ran, structure, dtype and shape match; values not comparable")
    problem = compare(got, want, None, rtol, atol)
    if problem:
        reference = _reference(call_op, sample, tensors, dtype)
        problem = compare(got, want, reference, rtol, atol)
    if problem and _seeds_itself(call_op):
        # eager reseeds itself on every call (torch's wrapper_set_seed), so it is the
        # same each time; kf's random numbers are its own: random if another call differs
        # (up to four calls: a one-element randint repeats a value one time in ten)
        for _ in range(3):
            with _quiet():
                again = fn(_clone(tensors))
            if compare(again, got, None, 0.0, 0.0):
                return done("SKIP", "random op: kf ran, structure, dtype and shape match; values not comparable")
    return done("MISMATCH", problem) if problem else done("PASS")


_SAMPLES: dict = {}


def _samples(opinfo, target: str, dtype: str) -> list:
    key = (opinfo.name, opinfo.variant_test_name, target, dtype)
    if key not in _SAMPLES:
        _SAMPLES.clear()  # one op's samples at a time: a batch holds cases of few ops
        _SAMPLES[key] = samples_of(opinfo, target, dtype)
    return _SAMPLES[key]


# ----------------------------------------------------------------------------- worker


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
                result = Result(case, "INTERNAL", f"conformance harness: {type(e).__name__}: {_first_line(e)}",
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
            proc = subprocess.Popen([opts.python, str(SCRIPT), "--worker", str(cases_file), str(out_file),
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


# ----------------------------------------------------------------------------- summary


def summarize(results: list[Result], meta: dict) -> dict:
    """Counts by class and by op, and every case's result."""
    by_class = collections.Counter(r.cls for r in results)
    by_op: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    for r in results:
        by_op[r.case.op_name][r.cls] += 1
    kf_errors = [r for r in results if r.cls == "KF_ERROR"]
    return {
        "meta": meta,
        "counts": {c: by_class.get(c, 0) for c in CLASSES},
        "kf_errors_naming_user_line": sum(1 for r in kf_errors if r.user_line),
        "ops": {op: {c: n for c, n in sorted(cnt.items())} for op, cnt in sorted(by_op.items())},
        "results": [dict(r.to_json(), reproducer=r.case.reproducer()) for r in results],
    }


def _group_key(detail: str) -> str:
    """A failure's detail without its numbers and names of temporaries, to group alike ones."""
    text = re.sub(r"/tmp/\S+", "<tmp>", detail)
    text = re.sub(r"-?\d+(\.\d+)?(e-?\d+)?", "N", text)
    return re.sub(r"\[[^\]]*\]", "[..]", text)[:160]


def markdown(summary: dict) -> str:
    meta, counts = summary["meta"], summary["counts"]
    total = sum(counts.values())
    out = [f"# kf OpInfo conformance: target {meta['target']}, {meta['dtype']}", "",
           f"{total} cases of {len(summary['ops'])} ops; torch {meta.get('torch', '?')}, kf commit "
           f"{meta.get('commit', '?')}, {meta.get('date', '')}; {meta.get('seconds', 0):.0f} s.", "",
           f"Command: `{meta.get('command', '')}`", "",
           "| class | cases |", "| --- | --- |"]
    out += [f"| {c} | {counts[c]} |" for c in CLASSES]
    n_err = counts["KF_ERROR"]
    out += ["", f"KF_ERROR messages that show the kf function's line: {summary['kf_errors_naming_user_line']} "
                f"of {n_err}.", ""]
    results = summary["results"]
    for cls in ("CRASH", "INTERNAL", "MISMATCH"):
        rows = [r for r in results if r["cls"] == cls]
        out += [f"## {cls} ({len(rows)})", ""]
        if not rows:
            out += ["None.", ""]
            continue
        groups: dict[str, list] = collections.defaultdict(list)
        for r in rows:
            groups[_group_key(r["detail"])].append(r)
        out += ["Grouped by message (numbers elided):", ""]
        for key, rs in sorted(groups.items(), key=lambda kv: -len(kv[1])):
            ops = sorted({r["op"] for r in rs})
            out.append(f"- {len(rs)} cases, {len(ops)} ops: `{key}` — {', '.join(ops[:12])}"
                       f"{' ...' if len(ops) > 12 else ''}")
        out += ["", "| case | detail | reproducer |", "| --- | --- | --- |"]
        for r in rows:
            detail = r["detail"].replace("|", "\\|")
            out.append(f"| {r['case']} | {detail} | `{r['reproducer']}` |")
        out.append("")
    out += ["## By op", "", "| op | " + " | ".join(CLASSES) + " |", "|---" * (len(CLASSES) + 1) + "|"]
    for op, cnt in summary["ops"].items():
        out.append(f"| {op} | " + " | ".join(str(cnt.get(c, "")) for c in CLASSES) + " |")
    errors = collections.Counter(_group_key(r["detail"]) for r in results if r["cls"] == "KF_ERROR")
    out += ["", "## KF_ERROR messages (most common first)", "", "| cases | message (numbers elided) |",
            "| --- | --- |"]
    out += [f"| {n} | {k.replace('|', '/')} |" for k, n in errors.most_common()]
    return "\n".join(out) + "\n"


def write_summary(summary: dict, paths: Iterable[str]) -> None:
    for p in paths:
        path = Path(p)
        path.parent.mkdir(parents=True, exist_ok=True)
        text = markdown(summary) if path.suffix == ".md" else json.dumps(summary, indent=1) + "\n"
        path.write_text(text)


def _commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=REPO, capture_output=True, text=True,
                              timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return ""


# ----------------------------------------------------------------------------- CLI


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
    args = p.parse_args(argv)

    if args.case:
        for name in args.case:
            op, variant, index = parse_case_name(name)
            case = Case(op, variant, index, args.target, args.dtype)
            opinfo = _op_table()[(op, variant)]
            sample = _samples(opinfo, args.target, args.dtype)[index]
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

    def progress(r: Result) -> None:
        counts[r.cls] += 1
        done = sum(counts.values())
        if r.cls in FAILURES or done % 50 == 0 or done == len(cases):
            print(f"[{done}/{len(cases)}] {r.cls:8} {r.case.name}: {r.detail[:160]}  "
                  f"({', '.join(f'{c} {n}' for c, n in sorted(counts.items()))})", file=sys.stderr, flush=True)

    print(f"{len(cases)} cases, target {args.target}, {args.dtype}", file=sys.stderr, flush=True)
    results = run_cases(cases, RunOptions(jobs=args.jobs, batch=args.batch, case_timeout=args.case_timeout,
                                          progress=progress))
    import torch

    meta = {"target": args.target, "dtype": args.dtype, "ops": args.ops, "limit_per_op": args.limit_per_op,
            "torch": torch.__version__, "commit": _commit(), "date": time.strftime("%Y-%m-%d"),
            "seconds": time.time() - start,
            "command": "python test/conformance/opinfo.py " + " ".join(a for a in argv if a)}
    summary = summarize(results, meta)
    write_summary(summary, args.out)
    print(json.dumps(summary["counts"]), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
