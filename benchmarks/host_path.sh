#!/usr/bin/env bash
# One call on the GPU machine, from the checkout (PYTHONPATH=$PWD; nothing is installed there):
#   1. the test suite on the gpu backend            -> $OUT/tests.log
#   2. the host-path benchmark: user path (asarray in, ops, from_dlpack out, every call) next to its
#      device time, torch eager and torch.compile   -> $OUT/host_path.json, $OUT/bench.log
#      python -m flyarray bench --suite overhead --suite elementwise --suite norms --suite topk --suite gemm
#   3. a short table, printed last.
# Knobs: TESTS=none skips the tests; TESTS=path picks them; SUITES="overhead norms" picks suites;
# TEST_TIMEOUT / BENCH_TIMEOUT (seconds) keep the whole call under the machine's 10-minute limit.
set -uo pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 FLYARRAY_CACHE_DIR=${FLYARRAY_CACHE_DIR:-/tmp/flyarray-cache}
export OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > "$OUT/gpu.txt" 2>&1
python3 -m flyarray info > "$OUT/info.txt" 2>&1
if [ "${TESTS:-tests}" != none ]; then
  par=""; python3 -c "import xdist" 2>/dev/null && par="-n ${WORKERS:-8}"
  timeout ${TEST_TIMEOUT:-240} python3 -m pytest -q $par -p no:cacheprovider ${TESTS:-tests} > "$OUT/tests.log" 2>&1
  echo "tests exit $?" >> "$OUT/tests.log"
fi
suite_args=""
for s in ${SUITES:-overhead elementwise norms topk gemm}; do suite_args="$suite_args --suite $s"; done
timeout ${BENCH_TIMEOUT:-330} python3 -m flyarray bench $suite_args --json "$OUT/host_path.json" \
  > "$OUT/bench.log" 2>&1
echo "bench exit $?" >> "$OUT/bench.log"

cat "$OUT/gpu.txt"
if [ -f "$OUT/tests.log" ]; then grep -E "FAILED|ERROR|passed|failed|tests exit" "$OUT/tests.log" | tail -30; fi
grep -E "Traceback|Error|bench exit" "$OUT/bench.log" | tail -5
if [ -f "$OUT/host_path.json" ]; then
  python3 -m flyarray.bench.harness "$OUT/host_path.json"
else
  tail -40 "$OUT/bench.log"
fi
