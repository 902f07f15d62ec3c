#!/usr/bin/env bash
# Sets kf up (see setup.sh) and runs the demo: the seed's layer norm and attention on
# the best target this machine has, checked against torch and timed.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
exec .venv/bin/python examples/demo.py "$@"
