#!/usr/bin/env bash
# Sets kf up (see setup.sh) and runs every test: the lit suites, then pytest.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
export PATH="$PWD/.venv/bin:$PATH"
status=0
echo "== lit: test/" >&2
lit -sv test || status=1
echo "== pytest: test/python" >&2
# one worker a core (pytest-xdist), each test file whole in one worker
pytest -q -n "$(nproc)" --dist loadfile test/python || status=1
exit $status
