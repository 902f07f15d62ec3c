"""The one thing pyproject.toml cannot say: kf's compiled CUDA launcher
(runtime/_launcher.c, see its header for why it exists).

``optional=True``: where there is no C compiler or no Python headers the install still
succeeds, with a warning, and runtime/cuda.py launches through cuda.bindings instead.
The module never links libcuda (it opens the driver with dlopen on first use), so it
builds on machines without a GPU; ``dl`` is named for C libraries older than glibc 2.34,
where dlopen lives outside libc. An editable install (``pip install -e .``) builds it in
place, beside runtime/_launcher.c.
"""

from setuptools import Extension, setup

setup(ext_modules=[Extension("kf.runtime._launcher", ["runtime/_launcher.c"], optional=True, libraries=["dl"])])
