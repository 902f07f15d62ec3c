"""How the OpInfo conformance suite (opinfo.py) compares kf's result with eager's: the
op's tolerance, the result's structure, dtype, shape and device, and values, where a
float64 reference decides between two results that differ."""

from __future__ import annotations

import re

from opinfo_cases import TOLERANCE_CLASSES


def tolerance(opinfo, dtype) -> tuple[float, float]:
    """(rtol, atol): assert_close's defaults for dtype, raised to the op's own overrides
    (the toleranceOverride decorators of its OpInfo for the test classes that compare
    against eager or a reference on the CPU or without a device)."""
    from torch.testing._comparison import default_tolerances
    from torch.testing._internal.common_device_type import toleranceOverride

    import torch

    rtol, atol = default_tolerances(torch.empty(0, dtype=dtype))
    for info in opinfo.decorators:
        if getattr(info, "cls_name", None) not in TOLERANCE_CLASSES:
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


#: A sum of products may differ from the float64 reference by this many units of its
#: dtype's precision times the sum of its terms' magnitudes (opinfo_cases.SUMS_OF_PRODUCTS):
#: the rounding of a sum in another order than eager's, as test_fuzz.py allows it.
SUM_ULPS = 8


def compare(got, want, reference, rtol: float, atol: float, values: bool = True, magnitude=None) -> str:
    """'' when kf's result ``got`` matches eager's ``want``, else one line saying how it
    differs. ``reference`` is the float64 reference (or None) for values beyond the
    tolerance; ``magnitude`` (or None) the sum of the magnitudes of each result's terms,
    for a sum of products; ``values=False`` compares structure, dtypes, shapes and
    devices only."""
    import torch

    g_leaves, g_spec = _leaves(got)
    w_leaves, w_spec = _leaves(want)
    if len(g_leaves) != len(w_leaves) or g_spec != w_spec:
        return f"result structure {_describe(got)} != eager's {_describe(want)}"
    r_leaves = _leaves(reference)[0] if reference is not None else [None] * len(w_leaves)
    if len(r_leaves) != len(w_leaves):
        r_leaves = [None] * len(w_leaves)
    m_leaves = _leaves(magnitude)[0] if magnitude is not None else [None] * len(w_leaves)
    if len(m_leaves) != len(w_leaves):
        m_leaves = [None] * len(w_leaves)
    for i, (g, w, r, m) in enumerate(zip(g_leaves, w_leaves, r_leaves, m_leaves)):
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
            tol = (rtol, atol)
            if w.is_floating_point() and tol == (0.0, 0.0):
                # a float result of integer inputs (expm1 of int64): the result type's tolerance
                from torch.testing._comparison import default_tolerances

                tol = default_tolerances(w)
            problem = _values(g, w, r, *tol, m) if values else ""
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


def _values(g, w, r, rtol: float, atol: float, m=None) -> str:
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
    if isinstance(r, torch.Tensor) and r.shape == w.shape:
        # eager overflowed (a 16-bit intermediate) where float64 is finite: float64
        # decides there, and a finite kf value within the tolerance of it is right
        r64 = r.detach().cpu().to(torch.float64)
        overflowed = inf_w & ~inf_g & r64.isfinite() & ((g64 - r64).abs() <= atol + rtol * r64.abs())
        if overflowed.any():
            w64 = torch.where(overflowed, r64, w64)
            inf_w = w64.isinf()
    if not torch.equal(inf_g, inf_w) or not torch.equal(g64[inf_g], w64[inf_w]):
        return "infinities differ from eager's"
    ok = ~(nan_g | inf_g)
    err = (g64 - w64).abs()
    limit = atol + rtol * w64.abs()
    if isinstance(r, torch.Tensor) and r.shape == w.shape:
        r64 = r.detach().cpu().to(torch.float64)
        limit_r = 2 * (w64 - r64).abs() + atol + rtol * r64.abs()
        if isinstance(m, torch.Tensor) and m.shape == w.shape and w.dtype.is_floating_point:
            limit_r = limit_r + SUM_ULPS * torch.finfo(w.dtype).eps * m.detach().cpu().to(torch.float64)
        fine = (g64 - r64).abs() <= limit_r
        if bool((fine | ~ok).all()):
            return ""
    bad = ((err > limit) & ok).nonzero()
    first = bad[0].tolist() if len(bad) else []
    where = f" (first at {first}: {g64[tuple(first)].item():.6g} != eager's {w64[tuple(first)].item():.6g})" \
        if first else ""
    return (f"{len(bad)} of {w.numel()} values beyond rtol={rtol:g} atol={atol:g}, max abs diff "
            f"{float(err[ok].max()) if ok.any() else float('nan'):.3g}{where}")
