#!/bin/bash
# The thirty-fifth session's GPU calls. MODE=first: the test files of the complex-math fixes and the review commit
# that the last session could not run on the GPU, then (on an H200 only, or PROBE=1) the decode GEMM probe.
# MODE=user (default): the decode GEMM's user path (benchmarks/probe_decode_user.py), then the test files of this
# session's commits (TESTS= to change them). MODE=ab OLD=<dir>: the same probe on OLD (a `git archive <rev> flyarray
# interop` of the code before, inside the checkout so it travels) and on this tree, twice each, then TESTS.
export PYTHONUNBUFFERED=1 FLYARRAY_CACHE_DIR=/tmp/flyarray-cache OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
gpu=$(nvidia-smi --query-gpu=name,driver_version --format=csv,noheader); echo "$gpu"
if [ "${MODE:-user}" = ab ]; then   # the decode GEMM's user path, OLD=<dir> (a git archive of the code before) and this tree, twice each
  for round in 1 2; do for tree in "$OLD" "$PWD"; do
    echo "== round $round: $tree"
    PYTHONPATH=$tree timeout 120 python3 benchmarks/probe_decode_user.py > "$OUT/ab_${round}_$(basename $tree).log" 2>&1
    head -5 "$OUT/ab_${round}_$(basename $tree).log"
  done; done
fi
if [ "${MODE:-user}" = user ]; then
  PYTHONPATH=$PWD timeout ${PT:-150} python3 benchmarks/probe_decode_user.py "$OUT/decode_user.txt" > "$OUT/probe_user.log" 2>&1
  echo "probe rc=$?"; head -8 "$OUT/probe_user.log"; grep -A 22 "Ordered by" "$OUT/probe_user.log" | cut -c1-150
  TESTS=${TESTS:-"tests/test_interop.py tests/test_array_object.py tests/test_indexing.py tests/test_array_api.py tests/test_creation.py"}
fi
TESTS=${TESTS:-"tests/test_complex.py tests/test_torch_backend.py tests/test_compose.py tests/test_fusion.py tests/test_explain.py"}
PYTHONPATH=$PWD timeout -s INT -k 20 ${T:-240} python3 -m pytest -rfE -n 16 -p no:cacheprovider $TESTS > "$OUT/tests.log" 2>&1
echo "tests rc=$?"; grep -E "^FAILED|^ERROR|[0-9]+ passed|[0-9]+ failed" "$OUT/tests.log" | tail -20
if [ "${MODE:-user}" = first ] && { [ -n "${PROBE:-}" ] || echo "$gpu" | grep -q H200; }; then
  PYTHONPATH=$PWD timeout 200 python3 benchmarks/probe_decode_gemm.py "$OUT/decode_gemm.json" > "$OUT/probe.log" 2>&1
  echo "probe rc=$?"; tail -25 "$OUT/probe.log"
fi
