#!/usr/bin/env bash
# Runs on a CUDA machine every test that skips without a CUDA GPU (pytest --gpu-only, see
# test/python/conftest.py), in chunks that each finish well inside 9 minutes:
#
#   scripts/gpu-tests.sh OUT_DIR [CHUNK ...]     # chunks: rowwise strategies passes rest machine
#                                                #   vulkan vulkan-passes spirv (default: all)
#
# Each chunk runs with pytest-xdist (-n 12), pytest-timeout (--timeout 240 a test) and a
# wall-clock limit of its own; it writes OUT_DIR/CHUNK.xml (JUnit), OUT_DIR/CHUNK.log (the
# output) and OUT_DIR/CHUNK.failures (each failure as it happens, and each test as it
# starts). The summary at the end -- test id and the first line of its error -- comes from
# the .failures files, so a chunk cut by its limit still reports what failed and what was
# still running. Exit status: 0 when no chunk failed or was cut. On a machine without a GPU
# the tests skip and the script checks only itself.
set -uo pipefail
cd "$(dirname "$0")/.."

if (($# < 1)); then
  sed -n '2,14p' "$0" | sed 's/^# \{0,1\}//' >&2
  exit 2
fi
OUT=$(realpath -m "$1")
shift
mkdir -p "$OUT"

PY=${PYTHON:-.venv/bin/python}
[[ -x $PY ]] || PY=python3
WORKERS=${KF_GPU_TEST_WORKERS:-12}
CHUNK_SECONDS=${KF_GPU_TEST_CHUNK_SECONDS:-450}

# The first four chunks select with --gpu-only; the folders split the GPU tests into parts
# of similar length (test_rowwise.py alone holds about a third of them). ``machine``: tests
# that need no GPU but depend on what the GPU machine has (its packages reached through
# PYTHONPATH, its cores, no torch-mlir, torch 2.11).
declare -A CHUNKS=(
  [rowwise]="--gpu-only test/python/passes/strategies/test_rowwise.py"
  [strategies]="--gpu-only test/python/passes/strategies --ignore=test/python/passes/strategies/test_rowwise.py"
  [passes]="--gpu-only test/python/passes --ignore=test/python/passes/strategies"
  [rest]="--gpu-only test/python/compiler test/python/runtime test/python/dialects test/python/examples test/python/tools"
  [machine]="test/python/test_install.py --deselect test/python/test_install.py::test_the_lit_suite_passes_against_the_installed_kf
             test/python/examples/test_train_gpt_parallel.py
             test/python/compiler/test_cache.py test/python/compiler/test_guards.py test/python/compiler/test_capture.py
             test/python/compiler/test_training.py test/python/compiler/backend/test_backend.py
             test/python/compiler/test_torch_mlir_import.py test/python/passes/test_to_cpu.py"
  # The Vulkan target on the machine's own driver (source shared/device/vulkan-prelude.sh
  # first): the tests that run on lavapipe elsewhere, where a real GPU's limits pick other
  # tiles and subgroup paths, and its compiler may fuse, flush or reorder what lavapipe does not.
  [vulkan]="-k vulkan test/python/compiler test/python/runtime test/python/conformance"
  [vulkan-passes]="-k vulkan test/python/passes"
  [spirv]="test/python/passes/spirv test/python/passes/test_to_spirv.py test/python/passes/test_scalar_math.py"
)
ORDER=(rowwise strategies passes rest machine vulkan vulkan-passes spirv)
(($#)) && ORDER=("$@")
for c in "${ORDER[@]}"; do
  [[ -n ${CHUNKS[$c]:-} ]] || { echo "gpu-tests: no chunk '$c' (one of: ${!CHUNKS[*]})" >&2; exit 2; }
done

if ! "$PY" -c "import xdist, pytest_timeout" 2>/dev/null; then
  echo "gpu-tests: $PY needs pytest-xdist and pytest-timeout (pip install pytest-xdist pytest-timeout)" >&2
  exit 2
fi

# One compile cache for the run (xdist's workers share it, as users' processes do); one
# torch thread a worker: 12 workers on 16 cores, not 12 x 16 threads.
export KF_CACHE_DIR=${KF_CACHE_DIR:-$OUT/kf-cache}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}

status=0
for c in "${ORDER[@]}"; do
  rm -f "$OUT/$c.failures" "$OUT/$c.xml"
  start=$(date +%s)
  # shellcheck disable=SC2086  # one line of the chunk's words
  echo "== $c:" ${CHUNKS[$c]}
  # SIGINT at the limit: pytest then stops, prints its summary and writes the JUnit file;
  # SIGKILL 30 s later if it does not
  # shellcheck disable=SC2086  # the chunk's words are pytest arguments
  timeout -s INT -k 30 "$CHUNK_SECONDS" "$PY" -m pytest -q -p no:cacheprovider -p xdist -n "$WORKERS" \
    --timeout 240 -rfE --record-failures "$OUT/$c.failures" --junitxml "$OUT/$c.xml" \
    ${CHUNKS[$c]} > "$OUT/$c.log" 2>&1
  rc=$?
  tail -n 1 "$OUT/$c.log"
  echo "   rc=$rc in $(($(date +%s) - start)) s"
  # 0 passed, 5 nothing collected (no GPU tests in the chunk); 124/137 cut by the limit
  if ((rc != 0 && rc != 5)); then status=1; fi
  if ((rc == 124 || rc == 137)); then echo "   cut at ${CHUNK_SECONDS} s"; fi
done

echo
echo "== failures"
for c in "${ORDER[@]}"; do
  f="$OUT/$c.failures"
  [[ -f $f ]] || continue
  grep -E '^(FAILED|ERROR) ' "$f" | sed "s/^/[$c] /"
  # started and never finished: running when the chunk was cut (or its worker died)
  awk '/^START / {s[substr($0, 7)] = 1} /^DONE / {delete s[substr($0, 6)]}
       END {for (t in s) print "[" c "] CUT " t ": still running when the chunk stopped"}' c="$c" "$f"
done
exit $status
