"""kf installed from its wheel, as ``pip install .`` lays it out, used outside the
repository: every package of the source tree is in the wheel, ``import kf``, ``kf-opt``,
the lit suite and the demo work from the installed files, and installing kf into an
environment that already has torch keeps that torch."""

from __future__ import annotations

import importlib.metadata
import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _pythonpath(first) -> str:
    """PYTHONPATH for a child process: ``first``, then the caller's PYTHONPATH, which may be
    where kf's dependencies are (an install with ``pip --target``)."""
    return os.pathsep.join([str(first), *filter(None, [os.environ.get("PYTHONPATH")])])


def _missing_build_tools() -> str:
    """Why this interpreter cannot build kf's wheel offline, or "": the tests build with
    pip and ``--no-build-isolation --no-index`` (no network), so pip and the build
    backend pyproject.toml names (setuptools>=77) must be installed beside kf."""
    # distribution metadata only: importlib.util.find_spec("pip") would reach setuptools'
    # distutils hook, which then turns its distutils off for the process (Python < 3.12)
    # and Inductor's later import of setuptools fails
    def version_of(name: str) -> str | None:
        try:
            return importlib.metadata.version(name)
        except importlib.metadata.PackageNotFoundError:
            return None

    if version_of("pip") is None:
        return f"pip is not installed in {sys.prefix} (the tests build kf's wheel with it)"
    version = version_of("setuptools")
    if version is None or int(version.split(".")[0]) < 77:
        return (f"setuptools>=77 (kf's build backend) is not installed in {sys.prefix} (found {version}); "
                "the tests build kf's wheel offline, without build isolation")
    return ""


pytestmark = pytest.mark.skipif(bool(_missing_build_tools()), reason=_missing_build_tools() or "-")
#: the wheel's packages and the source folders they come from (pyproject.toml's package-dir)
PACKAGE_DIRS = {"kf": "compiler", "kf/dialects": "dialects", "kf/passes": "passes", "kf/runtime": "runtime",
                "kf/tools": "tools"}


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("wheel")
    r = subprocess.run([sys.executable, "-m", "pip", "wheel", "--no-deps", "--no-build-isolation", "-q", "-w",
                        str(out), str(REPO)], capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-2000:]
    return next(out.glob("kf-*.whl"))


@pytest.fixture(scope="module")
def installed(wheel, tmp_path_factory) -> Path:
    """kf installed from the wheel into a folder of its own (its scripts in bin/)."""
    target = tmp_path_factory.mktemp("site")
    r = subprocess.run([sys.executable, "-m", "pip", "install", "--no-deps", "--no-index", "-q", "--target",
                        str(target), str(wheel)], capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-2000:]
    return target


def _env(site: Path, tmp: Path) -> dict:
    return {**os.environ, "PYTHONPATH": _pythonpath(site), "KF_CACHE_DIR": str(tmp / "cache"),
            "PATH": f"{site / 'bin'}{os.pathsep}{os.environ['PATH']}"}


def test_the_wheel_holds_every_package_of_the_source_tree(wheel):
    names = set(zipfile.ZipFile(wheel).namelist())
    missing = []
    for package, folder in PACKAGE_DIRS.items():
        for init in (REPO / folder).rglob("__init__.py"):
            rel = init.parent.relative_to(REPO / folder)
            if any(part.startswith((".", "__")) for part in rel.parts):
                continue
            inside = f"{package}/{rel.as_posix()}/__init__.py".replace("/./", "/")
            if inside not in names:
                missing.append(inside)
    assert not missing, f"add these packages to pyproject.toml's [tool.setuptools] packages: {missing}"


def test_installed_kf_compiles_and_runs_outside_the_repository(installed, tmp_path):
    program = (
        "import torch, kf\n"
        "f = kf.jit(lambda x, w: torch.nn.functional.layer_norm(x, (x.shape[-1],), w) * 2, target='cpu')\n"
        "x, w = torch.randn(3, 257), torch.randn(257)\n"
        "torch.testing.assert_close(f(x, w), torch.nn.functional.layer_norm(x, (257,), w) * 2)\n"
        "print(kf.__file__)\n")
    r = subprocess.run([sys.executable, "-c", program], cwd=tmp_path, env=_env(installed, tmp_path),
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.strip() == str(installed / "kf" / "__init__.py")
    v = subprocess.run([str(installed / "bin" / "kf-opt"), "--version"], cwd=tmp_path, env=_env(installed, tmp_path),
                       capture_output=True, text=True, timeout=300)
    assert v.returncode == 0 and v.stdout.startswith("kf-opt"), v.stdout + v.stderr


def test_installed_kf_is_a_torch_compile_backend(installed, wheel, tmp_path):
    """The wheel registers backend="kf" (the torch_dynamo_backends entry point): torch.compile
    finds it in a process that never imported kf."""
    with zipfile.ZipFile(wheel) as z:
        entry = next(n for n in z.namelist() if n.endswith(".dist-info/entry_points.txt"))
        text = z.read(entry).decode()
    assert "[torch_dynamo_backends]" in text and "kf = kf.backend:kf_backend" in text, text
    program = (
        "import sys, torch\n"
        "assert 'kf' not in sys.modules\n"
        "f = torch.compile(lambda x: (x * 2).relu() + 1, backend='kf', options={'target': 'cpu', 'fallback': 'eager'})\n"
        "x = torch.randn(5, 7)\n"
        "torch.testing.assert_close(f(x), (x * 2).relu() + 1)\n"
        "print(sys.modules['kf'].__file__)\n")
    r = subprocess.run([sys.executable, "-c", program], cwd=tmp_path, env=_env(installed, tmp_path),
                       capture_output=True, text=True, timeout=600)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.strip() == str(installed / "kf" / "__init__.py")


def test_the_lit_suite_passes_against_the_installed_kf(installed, tmp_path):
    lit = shutil.which("lit", path=os.path.dirname(sys.executable)) or shutil.which("lit")
    if lit is None:
        pytest.skip("lit is not installed (the test extra has it)")
    suite = tmp_path / "test"
    for part in ("passes", "tools", "dialects", "capture", "e2e"):
        if (REPO / "test" / part).exists():
            shutil.copytree(REPO / "test" / part, suite / part, ignore=shutil.ignore_patterns("Output"))
    shutil.copy(REPO / "test" / "lit.cfg.py", suite / "lit.cfg.py")
    shutil.copytree(REPO / "examples", tmp_path / "examples", ignore=shutil.ignore_patterns("__pycache__"))
    env = _env(installed, tmp_path)
    r = subprocess.run([lit, "-q", str(suite)], cwd=tmp_path, env=env, capture_output=True, text=True, timeout=1800)
    assert r.returncode == 0, (r.stdout + r.stderr)[-4000:]
    where = subprocess.run([sys.executable, "-c", "import kf.passes; print(kf.passes.__file__)"], cwd=tmp_path,
                           env=env, capture_output=True, text=True, timeout=300)
    assert where.stdout.startswith(str(installed)), where.stdout + where.stderr


def test_the_demo_runs_from_the_installed_kf(installed, tmp_path):
    examples = tmp_path / "examples"
    shutil.copytree(REPO / "examples", examples, ignore=shutil.ignore_patterns("__pycache__"))
    r = subprocess.run([sys.executable, str(examples / "demo.py")], cwd=tmp_path, env=_env(installed, tmp_path),
                       capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-3000:]
    assert r.stdout.startswith("kf demo on target"), r.stdout[:500]


def test_installing_kf_keeps_the_torch_it_finds(tmp_path):
    """pip's plan for ``pip install .`` in an environment that has a torch kf accepts (a
    CPU or a CUDA build): kf alone is installed, torch is left as it is."""
    report = tmp_path / "report.json"
    r = subprocess.run([sys.executable, "-m", "pip", "install", "--dry-run", "--no-build-isolation", "--no-index",
                        "-q", "--report", str(report), str(REPO)], capture_output=True, text=True, timeout=900)
    assert r.returncode == 0, r.stderr[-2000:]
    planned = [item["metadata"]["name"] for item in json.loads(report.read_text())["install"]]
    assert planned == ["kf"], planned
