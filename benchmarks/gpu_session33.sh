#!/bin/bash
# The thirty-third session's second GPU call: the core suite's second half and the kernel tests, then the host
# A/B of fat.function (old tree in _ab_old/, put first on PYTHONPATH), then bench --suite topk (issue 15's row).
export PYTHONUNBUFFERED=1 FLYARRAY_CACHE_DIR=/tmp/flyarray-cache OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
files=(tests/test_*.py); n=${#files[@]}; h=$(( (n + 1) / 2 ))
PYTHONPATH=$PWD timeout -s INT -k 20 ${T2:-190} python3 -m pytest -rfE -n 16 -p no:cacheprovider "${files[@]:$h}" > "$OUT/core2.log" 2>&1
echo "core2 rc=$?"; grep -E "^FAILED|^ERROR|[0-9]+ passed|[0-9]+ failed" "$OUT/core2.log" | tail -15
PYTHONPATH=$PWD timeout -s INT -k 20 ${TK:-110} python3 -m pytest -rfE -n 16 -p no:cacheprovider tests/kernels > "$OUT/kernels.log" 2>&1
echo "kernels rc=$?"; grep -E "^FAILED|^ERROR|[0-9]+ passed|[0-9]+ failed" "$OUT/kernels.log" | tail -15
for round in 1 2; do
  for tree in _ab_old .; do
    PYTHONPATH=$PWD/$tree timeout 60 python3 benchmarks/probe_function_host.py 3000 2>&1 | tail -3
  done
done
PYTHONPATH=$PWD timeout ${TB:-120} python3 -m flyarray bench --json "$OUT/bench_topk.json" --suite topk > "$OUT/bench_topk.log" 2>&1
echo "bench rc=$?"; tail -12 "$OUT/bench_topk.log"
