"""The runtime's tests share hand-written gpu-dialect kernels (``vulkan_kernels.py``):
importable from every test module in this directory."""

import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
