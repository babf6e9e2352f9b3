#!/usr/bin/env bash
# One call on the GPU machine. MODE=tests: the test suite on the gpu backend (+ overheads, launch-shape
# exploration); MODE=bench: python -m flyarray bench; MODE=host: benchmarks/host_path.sh (the tests, then
# the user-path benchmark: overhead, elementwise, norms, topk, gemm). Results under $OUT; a short table last.
set -uo pipefail
if [ "${MODE:-tests}" = host ]; then exec bash "$(dirname "$0")/host_path.sh"; fi
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 FLYARRAY_CACHE_DIR=/tmp/flyarray-cache OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > "$OUT/gpu.txt" 2>&1
python3 -m flyarray info > "$OUT/info.txt" 2>&1
if [ "${MODE:-tests}" = tests ]; then
  timeout ${TEST_TIMEOUT:-300} python3 -m pytest -q -n ${WORKERS:-8} -p no:cacheprovider ${TESTS:-tests} \
    > "$OUT/tests.log" 2>&1
  timeout 60 python3 benchmarks/overhead.py --json "$OUT/overhead.json" > "$OUT/overhead.log" 2>&1
  timeout ${TUNE_TIMEOUT:-120} python3 benchmarks/tune_fused.py > "$OUT/tune.log" 2>&1
  cat "$OUT/gpu.txt"; grep -E "FAILED|ERROR|passed|failed" "$OUT/tests.log" | tail -40
  cat "$OUT/overhead.log" "$OUT/tune.log"
else
  timeout ${BENCH_TIMEOUT:-540} python3 -m flyarray bench --json "$OUT/bench.json" ${BENCH_ARGS:-} \
    > "$OUT/bench.log" 2>&1
  cat "$OUT/gpu.txt" "$OUT/info.txt"; tail -60 "$OUT/bench.log"
  [ -f "$OUT/bench.json" ] && python3 -m flyarray.bench.harness "$OUT/bench.json"
fi
