#!/bin/bash
# The thirty-third session's last GPU call: the test files its later commits touched (mean/var's division,
# at[]'s scatter, roll, cumulative_prod, the vjp check, interop refusals, the relu epilogue) and the kernel tests.
export PYTHONUNBUFFERED=1 FLYARRAY_CACHE_DIR=/tmp/flyarray-cache OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
TESTS=${TESTS:-"tests/kernels tests/test_reductions.py tests/test_gpu_core.py tests/test_indexing.py tests/test_interop.py
  tests/test_complex.py tests/test_array_api.py tests/test_autodiff.py tests/test_column_reductions.py tests/test_compose.py"}
PYTHONPATH=$PWD timeout -s INT -k 20 ${T:-300} python3 -m pytest -rfE -n 16 -p no:cacheprovider $TESTS > "$OUT/final.log" 2>&1
echo "tests rc=$?"; grep -E "^FAILED|^ERROR|[0-9]+ passed|[0-9]+ failed" "$OUT/final.log" | tail -20
