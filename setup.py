"""The one thing pyproject.toml cannot say: kf's compiled CUDA launcher, the extension
``kf.runtime._launcher`` built from runtime/_launcher_*.c (runtime/_launcher.h says why
it exists and what each file holds).

``optional=True``: where there is no C compiler or no Python headers the install still
succeeds, with a warning, and runtime/cuda.py launches through cuda.bindings instead.
The module never links libcuda (it opens the driver with dlopen on first use), so it
builds on machines without a GPU; ``dl`` is named for C libraries older than glibc 2.34,
where dlopen lives outside libc. An editable install (``pip install -e .``) builds it in
place, beside its sources.
"""

from pathlib import Path

from setuptools import Extension, setup

# Relative and sorted: setuptools wants relative paths, and a fixed order builds the same .so.
_SOURCES = sorted(p.as_posix() for p in Path("runtime").glob("_launcher_*.c"))

setup(ext_modules=[Extension("kf.runtime._launcher", _SOURCES, depends=["runtime/_launcher.h"], optional=True,
                             libraries=["dl"])])
