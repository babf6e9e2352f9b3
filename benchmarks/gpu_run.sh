#!/usr/bin/env bash
# One call on the GPU machine: tests on the gpu backend, then the benchmark suite; results under $OUT.
# Usage (device tool): bash benchmarks/gpu_run.sh [pytest paths...]
set -uo pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 FLYARRAY_CACHE_DIR=/tmp/flyarray-cache OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.mem --format=csv > "$OUT/gpu.txt" 2>&1
python3 -m flyarray info > "$OUT/info.txt" 2>&1
TESTS=${TESTS:-tests}
timeout ${TEST_TIMEOUT:-300} python3 -m pytest -q -x -p no:cacheprovider ${TESTS} 2>&1 | tail -40 > "$OUT/tests.log"
timeout ${BENCH_TIMEOUT:-300} python3 -m flyarray bench --json "$OUT/bench.json" ${BENCH_ARGS:-} > "$OUT/bench.log" 2>&1
cat "$OUT/gpu.txt" "$OUT/info.txt"; tail -40 "$OUT/tests.log"; tail -45 "$OUT/bench.log"
