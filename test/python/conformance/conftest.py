"""The fuzz tests share their targets and hypothesis settings (``fuzzing.py``): importable
from this folder's tests."""

import os
import sys

sys.path.insert(0, os.path.dirname(__file__))
