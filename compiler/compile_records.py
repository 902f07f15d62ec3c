"""What a kf function compiled: ``KfFunction.compiles``.

The issue a user most often asks of a function is "how many programs did it compile?"
(``assert f.compiles == 1`` after a loop over lengths); the next is "which, and why?".
``Compiles`` answers both: it is the sequence of ``CompileRecord`` s, each program the
function took in this process, and compared with or converted to a number it is how many
there are. A program loaded from the disk cache counts (the function needed a program
for a signature it had none for) and its record says ``cached``: the count is the same
whether the cache was warm or cold.
"""

from __future__ import annotations

import operator
from dataclasses import dataclass


@dataclass(frozen=True)
class CompileRecord:
    """One program a kf function took: compiled, or loaded from the disk cache."""

    signature: str
    target: str
    seconds: float
    reason: str  # "first call", or why it compiled again (logs.recompile_reason)
    cached: bool = False  # loaded from the disk cache: nothing was compiled


class Compiles(tuple):
    """The records of a function's programs (a tuple of ``CompileRecord``), and, as a
    number (``==``, ``<``, ``int()``, formatting with ``d``), how many there are."""

    @property
    def count(self) -> int:
        return len(self)

    @property
    def from_disk(self) -> int:
        """How many were loaded from the disk cache, not compiled."""
        return sum(1 for r in self if r.cached)

    def __int__(self) -> int:
        return self.count

    __index__ = __int__

    def _number_op(op):
        def compare(self, other):
            if isinstance(other, (int, float)) and not isinstance(other, bool):
                return op(self.count, other)
            return getattr(tuple, f"__{op.__name__}__")(self, other)
        compare.__name__ = f"__{op.__name__}__"
        return compare

    __eq__ = _number_op(operator.eq)
    __ne__ = _number_op(operator.ne)
    __lt__ = _number_op(operator.lt)
    __le__ = _number_op(operator.le)
    __gt__ = _number_op(operator.gt)
    __ge__ = _number_op(operator.ge)
    del _number_op

    def __hash__(self) -> int:
        return hash(self.count)  # equal to the number it equals, and to equal tuples

    def __format__(self, spec: str) -> str:
        return format(self.count, spec) if spec else repr(self)

    def __repr__(self) -> str:
        return f"Compiles({self.count}, {self.from_disk} from the disk cache: {tuple.__repr__(self)})"
