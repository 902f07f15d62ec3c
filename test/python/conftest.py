"""Shared pytest setup: the examples directory is importable (seed_examples, moe);
Inductor caches in a folder of the run's own; the recorded Vulkan devices (test/python/devices/) are a fixture; ``--gpu-only`` selects the
tests that need a CUDA GPU and ``--record-failures`` writes failures as they happen
(scripts/gpu-tests.sh uses both)."""

import json
import os
import re
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "..", "examples"))

# Inductor's compiled graphs (the backend's default fallback) go to a cache of this run:
# its key does not hold the fake results of kf's ops, so a cache an earlier kf left on the
# machine could hold graphs that expect other shapes of them
if "TORCHINDUCTOR_CACHE_DIR" not in os.environ:
    import tempfile

    os.environ["TORCHINDUCTOR_CACHE_DIR"] = tempfile.mkdtemp(prefix="kf-tests-inductor-")


def _recorded_device(name: str) -> dict:
    with open(os.path.join(os.path.dirname(__file__), "devices", f"{name}.json")) as f:
        return json.load(f)


@pytest.fixture
def recorded_device():
    """``recorded_device(name)``: a Vulkan device's properties as recorded in
    test/python/devices/<name>.json (lavapipe, nvidia-h200), under Vulkan's names: what
    ``kf.runtime.abi.DeviceLimits.from_vulkan`` reads."""
    return _recorded_device



# ----------------------------------------------------------------------------- GPU runs

#: skip reasons that say a test needs a CUDA GPU (or the CUDA toolchain of one)
_GPU_REASON = re.compile(r"cuda|gpu|sm_90", re.IGNORECASE)


def pytest_addoption(parser):
    parser.addoption("--gpu-only", action="store_true",
                     help="run only the tests that need a CUDA GPU (they skip without one): a skipif mark "
                          "whose reason names CUDA or a GPU, a 'cuda' parameter, or 'cuda' in the test's name")
    parser.addoption("--record-failures", metavar="PATH",
                     help="append to PATH each test as it starts and ends ('START id', 'DONE id') and "
                          "each failure as it happens ('FAILED id: first line of the error'): a run cut short "
                          "still says what failed and what was running")


def _needs_gpu(item) -> bool:
    if any(_GPU_REASON.search(str(m.kwargs.get("reason", ""))) for m in item.iter_markers("skipif")):
        return True
    callspec = getattr(item, "callspec", None)
    if callspec is not None and "cuda" in callspec.params.values():
        return True
    return "cuda" in item.name.lower()


def pytest_collection_modifyitems(config, items):
    if not config.getoption("--gpu-only"):
        return
    config.hook.pytest_deselected(items=[i for i in items if not _needs_gpu(i)])
    items[:] = [i for i in items if _needs_gpu(i)]


class _FailureRecord:
    """--record-failures: written by the process that reports (pytest-xdist's controller,
    not its workers), a line at a time, so that it survives the run being killed."""

    def __init__(self, path: str):
        self.path = path

    def _write(self, line: str) -> None:
        with open(self.path, "a") as f:
            f.write(line + "\n")

    def pytest_runtest_logstart(self, nodeid, location):
        self._write(f"START {nodeid}")

    def pytest_runtest_logfinish(self, nodeid, location):
        self._write(f"DONE {nodeid}")

    def pytest_runtest_logreport(self, report):
        if not report.failed:
            return
        text = str(report.longrepr or "")
        errors = [ln[1:].strip() for ln in text.splitlines() if ln.startswith("E ")]
        first = errors[0] if errors else (text.strip().splitlines() or [""])[-1]
        self._write(f"{'FAILED' if report.when == 'call' else 'ERROR'} {report.nodeid}: {first[:300]}")


def pytest_configure(config):
    path = config.getoption("--record-failures", None)
    if path and not hasattr(config, "workerinput"):
        config.pluginmanager.register(_FailureRecord(path), "kf-failure-record")
