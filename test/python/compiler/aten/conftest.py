"""The ATen family tests compile into a cache of their own per test, so that each test's
programs are compiled fresh (what it checks is the compile, not a cached hit)."""

import pytest


@pytest.fixture(autouse=True)
def _cache(tmp_path, monkeypatch):
    monkeypatch.setenv("KF_CACHE_DIR", str(tmp_path))
