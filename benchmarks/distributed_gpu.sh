#!/usr/bin/env bash
# One call on a 2-GPU machine, from the repo root (nothing installed: PYTHONPATH=$PWD):
#   PYTHONPATH=$PWD OUT=/tmp/out bash benchmarks/distributed_gpu.sh
# 1. tests/test_distributed.py: every distributed check on 2 processes, on NCCL (2 GPUs) and on gloo (CPU);
# 2. python -m flyarray bench --suite distributed under torchrun on 2 GPUs (NCCL).
# Logs and JSON under $OUT; prints the test summary and the bench table. About 2-4 minutes.
set -uo pipefail
export PYTHONPATH=${PYTHONPATH:-$PWD} PYTHONUNBUFFERED=1 FLYARRAY_CACHE_DIR=${FLYARRAY_CACHE_DIR:-/tmp/flyarray-cache}
OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version --format=csv > "$OUT/gpu.txt" 2>&1
timeout 170 python3 -m pytest -q -p no:cacheprovider -o addopts="" tests/test_distributed.py \
  > "$OUT/distributed_tests.log" 2>&1
echo "tests exit $?" >> "$OUT/distributed_tests.log"
timeout 110 python3 -m torch.distributed.run --nproc-per-node 2 -m flyarray bench --suite distributed \
  --json "$OUT/distributed_bench.json" > "$OUT/distributed_bench.log" 2>&1
echo "bench exit $?" >> "$OUT/distributed_bench.log"
cat "$OUT/gpu.txt"
grep -E "FAILED|ERROR|passed|failed|skipped|exit" "$OUT/distributed_tests.log" | tail -30
grep -vE "Warning|warnings.warn|return func|^\*+$|OMP_NUM_THREADS" "$OUT/distributed_bench.log" | tail -30
