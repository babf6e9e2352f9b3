#!/bin/bash
# The calls the thirty-sixth session prepared and could not run (no GPU was lent). One call, in this order
# (each step under its own timeout: T, T_SWEEP, T_AB, T_CF seconds):
#  1. the GPU tests of every commit after 481649d (the last code that ran on a GPU): TESTS= to change them;
#  2. benchmarks/tune_attention_decode.py: the attention decode's K split against SDPA (issue 15);
#  3. with OLD=<dir> (a `git archive 481649d flyarray interop`, inside the checkout so it travels): the decode GEMM's
#     user path (benchmarks/probe_decode_user.py) on OLD and on this tree, ROUNDS (2) times each: the `.T` A/B;
#  4. benchmarks/control_flow.py: fa.lax loops beside torch eager and torch.compile.
#     bash benchmarks/gpu_session36.sh         (from the repository root; writes under $OUT)
export PYTHONUNBUFFERED=1 FLYARRAY_CACHE_DIR=/tmp/flyarray-cache OUT=${OUT:-/tmp/out}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
python3 -c "import torch, triton; print('torch', torch.__version__, 'triton', triton.__version__)"
TESTS=${TESTS:-"tests/test_settings.py tests/test_plan.py tests/test_autodiff.py tests/test_precompile.py tests/test_cuda_graphs.py
 tests/test_gpu_core.py tests/test_cache_trust.py tests/test_errors.py tests/test_creation.py tests/test_indexing.py
 tests/test_array_api.py tests/test_views.py tests/test_interop.py tests/test_array_object.py tests/test_torch_backend.py
 tests/kernels/test_mx.py tests/kernels/test_scaled_matmul.py tests/kernels/test_scan_sort.py tests/test_elementwise.py
 tests/test_reliability.py tests/test_fft.py tests/test_control_flow.py tests/test_scheduler_scale.py tests/test_doc_examples.py tests/test_activations.py"}
PYTHONPATH=$PWD timeout -s INT -k 20 ${T:-300} python3 -m pytest -rfE -n 16 -p no:cacheprovider $TESTS > "$OUT/tests.log" 2>&1
echo "tests rc=$?"; grep -E "^FAILED|^ERROR|[0-9]+ passed|[0-9]+ failed" "$OUT/tests.log" | tail -20
PYTHONPATH=$PWD timeout ${T_SWEEP:-120} python3 benchmarks/tune_attention_decode.py "$OUT/attn_decode.json" > "$OUT/attn_decode.log" 2>&1
echo "decode sweep rc=$?"; cut -c1-200 "$OUT/attn_decode.log" | tail -60
if [ -n "${OLD:-}" ]; then
  for round in $(seq 1 ${ROUNDS:-2}); do for tree in "$OLD" "$PWD"; do
    echo "== round $round: $tree"
    PYTHONPATH=$tree timeout ${T_AB:-100} python3 benchmarks/probe_decode_user.py > "$OUT/ab_${round}_$(basename $tree).log" 2>&1
    head -5 "$OUT/ab_${round}_$(basename $tree).log"
  done; done
fi
PYTHONPATH=$PWD timeout ${T_CF:-120} python3 benchmarks/control_flow.py "$OUT/control_flow.json" > "$OUT/control_flow.log" 2>&1
echo "control flow rc=$?"; tail -5 "$OUT/control_flow.log"
