"""ATen ops to kf ops: one handler per ATen overload, following torch's semantics
(broadcasting, type promotion, defaults) so that the kf function computes what eager does.

Type promotion is read off the graph rather than re-derived: every FX node carries its
result as a fake tensor (``node.meta["val"]``), so each handler casts operands to the
dtype torch computed in and checks that its result matches torch's shape and dtype.

The handlers live in compiler/aten/, one module an op family (elementwise, reductions and
norms, contraction, layout, indexing, creation and random numbers, functionalized writes,
pooling, scans, sorting; ops compiled as torch's decomposition of them in
decompositions.py); ``aten/core.py`` has the table, the ``Converter`` and the helpers they
share. Importing this module fills the table.
"""

from __future__ import annotations

from .aten import (attention, bessel, contraction, convolution, creation, decompositions, dropout,  # noqa: F401
                   elementwise, error_function, exponent, indexing, layout, math_functions, polynomials, pooling,
                   reductions, scans, sorting, special, writes)
from .aten.core import Converter, HANDLERS, Handler, Unconvertible, Unsupported, handles, _target_name  # noqa: F401
