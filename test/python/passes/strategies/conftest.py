"""The strategies' tests share their kernel builders (``strategy_kernels.py``): importable from
every test module below this directory."""

import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
