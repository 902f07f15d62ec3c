"""The folders kf is imported from: what the cache key hashes whole (cache.py) and what
a walk of a function's reads treats as library code rather than the user's (guards.py)."""

from __future__ import annotations

import functools
import importlib.util
import os

#: kf's packages: in a source checkout each is its own folder (pyproject.toml's
#: package-dir), in an installed kf all of them are folders of kf/.
_PACKAGES = ("kf", "kf.dialects", "kf.passes", "kf.runtime", "kf.tools")


@functools.lru_cache(maxsize=None)
def kf_package_dirs() -> tuple[str, ...]:
    """The folders kf's packages are imported from (none of them nested in another)."""
    dirs = set()
    for name in _PACKAGES:
        spec = importlib.util.find_spec(name)
        for d in (spec.submodule_search_locations or []) if spec is not None else []:
            dirs.add(os.path.realpath(d))
    return tuple(sorted(d for d in dirs if not any(d.startswith(o + os.sep) for o in dirs)))
