set -uo pipefail
export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 FLYARRAY_CACHE_DIR=/tmp/flyarray-cache
nvidia-smi --query-gpu=name,driver_version --format=csv
timeout 150 python3 benchmarks/profile_training.py > $OUT/profile_training.txt 2>&1; echo "profile exit $?"
grep -E "fa_|fa::|Self CUDA time|triton|gemm|Name" $OUT/profile_training.txt | head -60
timeout 360 python3 -m pytest -q -x -n 8 -p no:cacheprovider tests > $OUT/tests.log 2>&1; echo "tests exit $?"
grep -E "FAILED|ERROR|passed|failed" $OUT/tests.log | tail -30
