"""The cases of the OpInfo conformance suite (opinfo.py): the classes a case gets, a case
and its result, the OpInfo table and its sample inputs (from a seed per op), and
which cases a run or CI's fixed sample takes."""

from __future__ import annotations

import contextlib
import dataclasses
import re
import warnings
import zlib
from dataclasses import dataclass
from pathlib import Path



CLASSES = ("PASS", "KF_ERROR", "INTERNAL", "MISMATCH", "CRASH", "SKIP")
#: the classes that are defects in kf (CI fails on any of them)
FAILURES = ("INTERNAL", "MISMATCH", "CRASH")
TARGETS = ("cpu", "vulkan", "cuda", "cuda-ptx")
#: Targets that only compile: each case's kf function is built for the named kf target
#: (``kf.inspect``: kernels, PTX, ptxas) from the samples on the CPU, and nothing runs.
#: A machine without a GPU measures with them which cases compile for it.
COMPILE_ONLY = {"cuda-ptx": "cuda"}
DTYPES = ("float32", "bfloat16", "float16", "float64", "int64", "int32", "uint8")
REPO = Path(__file__).resolve().parents[2]

#: Ops whose values are undefined (uninitialized memory): only metadata is compared.
UNDEFINED_VALUES = frozenset({"empty", "empty_like", "empty_permuted", "empty_strided", "new_empty",
                              "new_empty_strided"})
#: Ops each of whose results is a sum of products of one element of each input (and of
#: Python numbers): a sum's rounding error depends on the order of its terms and is
#: bounded by the sum of their magnitudes, however small the sum itself is after
#: cancellation. For these, a result may also differ from the float64 reference by a few
#: units of the dtype's precision times the op on the inputs' absolute values
#: (``opinfo_compare.SUM_ULPS``).
SUMS_OF_PRODUCTS = frozenset({
    "addbmm", "addmm", "addmv", "addr", "baddbmm", "bmm", "chain_matmul", "dot", "einsum", "inner", "linalg.multi_dot",
    "linalg.vecdot", "matmul", "mm", "mv", "nn.functional.bilinear", "nn.functional.conv1d", "nn.functional.conv2d",
    "nn.functional.conv3d", "nn.functional.conv_transpose1d", "nn.functional.conv_transpose2d",
    "nn.functional.conv_transpose3d", "nn.functional.linear", "outer", "tensordot", "vdot"})
#: Test classes whose toleranceOverride decorators apply to kf's comparison: those that
#: compare a compiled or decomposed op with eager, or eager with a reference.
TOLERANCE_CLASSES = frozenset({None, "TestInductorOpInfo", "TestDecomp", "TestCommon", "TestUnaryUfuncs",
                                "TestBinaryUfuncs", "TestReductions"})




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
    scope: str = ""  # why the case does not count toward coverage (opinfo_scope.py), "" if it does

    def to_json(self) -> dict:
        d = dataclasses.asdict(self)
        d["case"] = self.case.name
        d["op"] = self.case.op_name
        return d

    @staticmethod
    def from_json(d: dict, case: Case) -> "Result":
        return Result(case, d["cls"], d.get("detail", ""), d.get("error_type", ""), d.get("user_line"),
                      d.get("seconds", 0.0), d.get("scope", ""))


def parse_case_name(name: str) -> tuple[str, str, int]:
    """(op, variant, index) of ``op[.variant]#index``; the variant is whatever follows the
    longest OpInfo name that the text before ``#`` starts with."""
    head, _, index = name.rpartition("#")
    if not head or not index.isdigit():
        raise ValueError(f"a case is named op[.variant]#index, got {name!r}")
    for op in sorted(op_table(), key=lambda key: -len(key[0] + key[1])):
        full = op[0] + ("." + op[1] if op[1] else "")
        if full == head:
            return op[0], op[1], int(index)
    raise ValueError(f"no OpInfo named {head!r}")


def _device(target: str) -> str:
    """The device of a target's samples."""
    return "cuda" if target == "cuda" else "cpu"


def _dtype_device(target: str) -> str:
    """The device whose dtypes a target's op takes (a compile-only target's kf target's)."""
    return _device(COMPILE_ONLY.get(target, target))


def torch_dtype(name: str):
    import torch

    return getattr(torch, name)


_OPS: dict | None = None


def op_table() -> dict:
    """(name, variant) -> OpInfo for every entry of op_db."""
    global _OPS
    if _OPS is None:
        with quiet():
            from torch.testing._internal.common_methods_invocations import op_db
        _OPS = {(op.name, op.variant_test_name): op for op in op_db}
    return _OPS


def _seed(op_name: str) -> int:
    return zlib.crc32(op_name.encode())


@contextlib.contextmanager
def quiet():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


def samples_of(opinfo, target: str, dtype: str) -> list:
    """The OpInfo's sample inputs, made from the op's own fixed seed."""
    import torch

    full = opinfo.name + ("." + opinfo.variant_test_name if opinfo.variant_test_name else "")
    torch.manual_seed(_seed(full))
    with quiet():
        return list(opinfo.sample_inputs(_device(target), torch_dtype(dtype)))


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
    dt = torch_dtype(dtype)
    cases = []
    for (name, variant), opinfo in sorted(op_table().items()):
        full = name + ("." + variant if variant else "")
        if pattern is not None and not pattern.search(full):
            continue
        with quiet():
            if dt not in opinfo.supported_dtypes(_dtype_device(target)):
                continue
        try:
            n = len(samples_of(opinfo, target, dtype))
        except Exception as e:  # torch's own sample generator failed: nothing to run
            if log:
                log(f"{full}: sample_inputs raised {type(e).__name__}: {first_line(e)}")
            continue
        cases.extend(Case(name, variant, i, target, dtype) for i in spread(n, limit_per_op))
    return cases


def ci_ops(target: str, dtype: str, every: int) -> list[tuple[str, str]]:
    """The ops of CI's fixed sample: about one in ``every`` of the OpInfos that support
    dtype on the target's device, chosen by a hash of the op's name and the dtype (so the
    choice is the same in every process and differs between dtypes)."""
    dt = torch_dtype(dtype)
    chosen = []
    for (name, variant), opinfo in sorted(op_table().items()):
        full = name + ("." + variant if variant else "")
        if zlib.crc32(f"{full}:{dtype}".encode()) % every:
            continue
        with quiet():
            if dt in opinfo.supported_dtypes(_dtype_device(target)):
                chosen.append((name, variant))
    return chosen


def ci_case(op: str, variant: str, target: str, dtype: str) -> Case | None:
    """The op's case in CI's sample: its first or its last sample input (both of which
    every run with --limit-per-op 2 or more covers), by a hash of its name; None when the
    op has no samples."""
    full = op + ("." + variant if variant else "")
    try:
        n = len(samples_of(op_table()[(op, variant)], target, dtype))
    except Exception:
        return None
    if not n:
        return None
    return Case(op, variant, spread(n, 2)[zlib.crc32(full.encode()) % min(n, 2)], target, dtype)


def first_line(e: BaseException | str) -> str:
    text = str(e).strip()
    return (text.splitlines()[0] if text else (type(e).__name__ if isinstance(e, BaseException) else ""))[:300]


_SAMPLES: dict = {}


def cached_samples(opinfo, target: str, dtype: str) -> list:
    key = (opinfo.name, opinfo.variant_test_name, target, dtype)
    if key not in _SAMPLES:
        _SAMPLES.clear()  # one op's samples at a time: a batch holds cases of few ops
        _SAMPLES[key] = samples_of(opinfo, target, dtype)
    return _SAMPLES[key]
