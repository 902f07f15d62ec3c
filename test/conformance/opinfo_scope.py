"""Which OpInfo cases count toward kf's coverage: a case is in scope unless the sample or
the op is of a kind kf, as a compiler of real-valued dense tensor kernels, does not
claim. The reason is decided from the op and its sample alone (eager's result, a fake
tensor run), before and whatever kf does with it, so that a refusal can never move a
case out of scope.

Out of scope, with the reason recorded on the case:

``complex``        an input or eager's result is a complex tensor, or the op makes one
                   (kf's element types are real);
``sparse``         an input or eager's result is not a strided (dense) tensor;
``random``         the op draws random numbers (eager gives other values with another
                   seed): its values are not comparable, and kf runs only dropout's
                   family with its own generator;
``data-dependent`` the result's shape depends on the inputs' values (``nonzero``,
                   ``unique``, ``masked_select``): torch's fake tensors cannot give it
                   either; kf refuses these with an error naming the op and the line;
``library``        a dense factorization, solver or FFT (LAPACK, cuSOLVER, cuFFT in
                   torch): ``LIBRARY_OPS``. torch.compile calls the vendor library for
                   these too rather than generating a kernel.

Coverage is PASS over the in-scope cases that are not SKIP."""

from __future__ import annotations

#: OpInfo names (``op[.variant]`` without the variant) of factorizations, solvers and
#: transforms that torch computes with a vendor library; norms, products and other
#: ``linalg.`` ops made of ordinary reductions stay in scope.
LIBRARY_OPS = frozenset({
    "cholesky", "cholesky_inverse", "cholesky_solve", "geqrf", "inverse", "logdet", "lu", "lu_solve", "lu_unpack",
    "matrix_exp", "ormqr", "pinverse", "qr", "svd", "svd_lowrank", "pca_lowrank", "symeig", "triangular_solve",
    "det", "slogdet", "linalg.cholesky", "linalg.cholesky_ex", "linalg.cond", "linalg.det", "linalg.eig",
    "linalg.eigh", "linalg.eigvals", "linalg.eigvalsh", "linalg.householder_product", "linalg.inv", "linalg.inv_ex",
    "linalg.ldl_factor", "linalg.ldl_factor_ex", "linalg.ldl_solve", "linalg.lstsq", "linalg.lu", "linalg.lu_factor",
    "linalg.lu_factor_ex", "linalg.lu_solve", "linalg.matrix_rank", "linalg.pinv",
    "linalg.slogdet", "linalg.solve", "linalg.solve_ex", "linalg.solve_triangular", "linalg.svd", "linalg.svdvals",
    "linalg.tensorinv", "linalg.tensorsolve",
})
#: OpInfo name prefixes of the same kind (every FFT)
LIBRARY_PREFIXES = ("fft.",)
#: the reasons, in the order they are tested
REASONS = ("complex", "sparse", "random", "data-dependent", "library")


def _is_library(op: str) -> bool:
    """Whether the OpInfo is a vendor-library op."""
    return op in LIBRARY_OPS or op.startswith(LIBRARY_PREFIXES)


def _tensors(value):
    import torch
    from torch.utils._pytree import tree_flatten

    return [t for t in tree_flatten(value)[0] if isinstance(t, torch.Tensor)]


def _data_dependent(call_op, sample) -> bool:
    """Whether torch's fake tensors cannot give the op's result shape without its
    inputs' values."""
    import torch
    from torch._subclasses.fake_tensor import DataDependentOutputException, DynamicOutputShapeException, FakeTensorMode
    from torch.utils._pytree import tree_map

    from kf import native_kernels

    try:
        # (refusing: a torch.cuda.jiterator op would launch its CUDA C++ on the fake
        # tensors, address 0, and poison the worker's CUDA context for every later case)
        with native_kernels.refusing(), FakeTensorMode(allow_non_fake_inputs=False) as mode:
            fake = tree_map(lambda t: mode.from_tensor(t) if isinstance(t, torch.Tensor) else t,
                            (sample.input, sample.args, sample.kwargs))
            x, args, kwargs = fake
            call_op(x, *args, **kwargs)
    except (DynamicOutputShapeException, DataDependentOutputException):
        return True
    except Exception as e:  # noqa: BLE001 -- any other failure in fake mode says nothing about shapes
        return "data-dependent" in str(e) or "data dependent" in str(e)
    return False


def scope_of(op: str, call_op, sample, want, random: bool) -> str:
    """The reason the case is out of scope, or "" when it counts toward coverage.
    ``want`` is eager's result on the sample, ``random`` whether eager is random."""
    import torch

    tensors = _tensors((sample.input, sample.args, sample.kwargs)) + _tensors(want)
    if any(t.is_complex() for t in tensors):
        return "complex"
    if any(t.layout != torch.strided for t in tensors):
        return "sparse"
    if random:
        return "random"
    if _is_library(op):
        return "library"
    if _data_dependent(call_op, sample):
        return "data-dependent"
    return ""


def coverage(results: list[dict]) -> dict:
    """PASS over the in-scope cases that are not SKIP, and the cases out of scope by
    reason (results as in the report's JSON, each with its ``scope``)."""
    counted = [r for r in results if not r.get("scope") and r["cls"] != "SKIP"]
    passed = sum(1 for r in counted if r["cls"] == "PASS")
    out = {reason: sum(1 for r in results if r.get("scope") == reason) for reason in REASONS}
    return {"in_scope": len(counted), "passed": passed,
            "coverage": round(passed / len(counted), 4) if counted else 0.0, "out_of_scope": out}
