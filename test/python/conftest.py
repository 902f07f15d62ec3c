"""Shared pytest setup: the examples directory is importable (seed_examples, moe)."""

import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "examples"))
