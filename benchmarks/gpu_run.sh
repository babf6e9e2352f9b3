#!/usr/bin/env bash
# One call on the GPU machine. MODE=tests: the test suite on the gpu backend (+ overheads, launch-shape
# exploration); MODE=bench: python -m flyarray bench; MODE=host: benchmarks/host_path.sh (the tests, then
# the user-path benchmark: overhead, elementwise, norms, topk, gemm); MODE=pending: what the tenth session
# (no GPU) left untimed: the GPU tests of the Gluon attention kernels and the MX decode candidates, then
# benchmarks/tune_attention_gluon.py (checks every Gluon tile, forward and dk/dv, times them beside SDPA);
# MODE=pending_mx: benchmarks/tune_mx_decode.py for MXFP4 (the new decode candidates beside the old);
# MODE=ncu (STALLS=1: also stall reasons, pipe use, SASS by opcode): Nsight Compute's sections for benchmarks/ncu_kernels.py's workloads (attention forward and
# backward, the widest GEMM; ours beside cuDNN/cuBLAS), one CSV each (WORKLOADS= to choose);
# MODE=first_call: the GPU tests of background compiles (tests/test_precompile.py, with the GEMM and
# attention kernel tests), then benchmarks/first_call.py (flyarray with and without precompile beside
# Inductor, fresh processes and caches; ROUNDS=, default 2).
# MODE=ws_profile: benchmarks/profile_seed_block.py with FLYARRAY_GEMM_WS=1 and 0, twice, alternating.
# MODE=ws: the GPU tests of the warp-specialized GEMM and of background compiles, then
# benchmarks/tune_gemm_ws.py (every layout and epilogue checked; the 15 Llama GEMMs beside cuBLAS and the
# Triton GEMM), then `bench --suite torch` with FLYARRAY_GEMM_WS=1 and =0 (skipped if the tests hung, or
# with WS_BENCH=0).
# MODE=pingpong: the tuner's ping-pong attention configs beside SDPA, the pointer, WS and default kernels,
# then the attention GPU tests, then `bench --suite attention`.
# MODE=host_ab: the GPU tests of the host-path changes' code (attention, GEMM, torch backend, plans, core), then
# benchmarks/host_seed_block.py alternating OLD=<dir> (a `git archive <rev> flyarray interop` of the code
# before) and this tree, twice each, then `bench --suite torch`.
# MODE=mx_probe: the GPU tests named by TESTS (default: core, complex, torch backend), then
# benchmarks/mx_decode_probe.py (NOSCALE=1: again without the scale loads) and Nsight Compute on the MXFP4 decode.
# MODE=suite_then_torch: the whole test suite (TESTS= narrows it; BISECT=1: each worker's order kept and
# every failure bisected over the tests its worker ran before it, benchmarks/bisect_order.py); BENCH=1: then benchmarks/seed_block_state.py
# and `bench --suite torch` (BENCH_SUITES="attention mx ...": those suites instead). Since the core suite's CPU tests run on the GPU host too (twenty-seventh session), the
# whole suite no longer fits one 600 s call: run TESTS="tests --ignore=tests/kernels" (~310 s) and TESTS=tests/kernels;
# since the thirty-first session the core alone ran past 390 s: CORE_HALF=1 and CORE_HALF=2 run half its files each;
# CORE_PART=i/n runs the i-th of n slices (thirds since the thirty-third session: half 1 ran past 250 s on the H200).
# Results under $OUT; a short table last.
set -uo pipefail
if [ "${MODE:-tests}" = host ]; then exec bash "$(dirname "$0")/host_path.sh"; fi
if [ "${MODE:-tests}" = ncu ]; then
  export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 OUT=${OUT:-/tmp/out}
  mkdir -p "$OUT"
  for w in ${WORKLOADS:-attn_fwd attn_bwd gemm_qkv}; do
    timeout 240 ncu --clock-control none --profile-from-start off --csv --page details \
      --section SpeedOfLight --section Occupancy --section WarpStateStats --section SchedulerStats \
      --section ComputeWorkloadAnalysis --section MemoryWorkloadAnalysis --section LaunchStats \
      --log-file "$OUT/ncu_$w.csv" python3 benchmarks/ncu_kernels.py "$w" > "$OUT/ncu_$w.log" 2>&1
    echo "$w rc=$?"; tail -3 "$OUT/ncu_$w.log"
    if [ -n "${STALLS:-}" ]; then   # why warps wait, how busy each pipe is, the executed SASS by opcode
      timeout 240 ncu --clock-control none --profile-from-start off --csv --page raw \
        --metrics 'regex:^(smsp__average_warps_issue_stalled_.*_per_issue_active\.ratio|sm__(inst_executed_pipe|pipe)_.*\.avg\.pct_of_peak_sustained_active|sass__inst_executed_per_opcode|smsp__inst_executed\.sum|dram__bytes_read\.sum)$' \
        --log-file "$OUT/ncu_stalls_$w.csv" python3 benchmarks/ncu_kernels.py "$w" > "$OUT/ncu_stalls_$w.log" 2>&1
      echo "$w stalls rc=$?"; tail -3 "$OUT/ncu_stalls_$w.log"
    fi
  done
  exit 0
fi
if [ "${MODE:-tests}" = first_call ]; then
  export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 OUT=${OUT:-/tmp/out}
  mkdir -p "$OUT"
  timeout 200 python3 -m pytest -q -n 8 -p no:cacheprovider tests/test_precompile.py tests/kernels/test_gemm.py \
    tests/kernels/test_attention.py > "$OUT/tests.log" 2>&1; echo "tests rc=$?"
  grep -E "FAILED|ERROR|passed|failed" "$OUT/tests.log" | tail -20
  timeout 380 python3 benchmarks/first_call.py "${ROUNDS:-2}" "$OUT/first_call.json" 2>&1 | tail -20
  exit 0
fi
if [ "${MODE:-tests}" = pending ]; then
  export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 OUT=${OUT:-/tmp/out}
  mkdir -p "$OUT"
  timeout 180 python3 -m pytest -q -n 8 -p no:cacheprovider tests/kernels/test_attention.py \
    tests/kernels/test_scaled_matmul.py > "$OUT/tests.log" 2>&1; echo "tests rc=$?"
  grep -E "FAILED|ERROR|passed|failed" "$OUT/tests.log" | tail -20
  timeout 380 python3 benchmarks/tune_attention_gluon.py "$OUT/gluon.json" > "$OUT/gluon.log" 2>&1
  grep -v '"kind": "check' "$OUT/gluon.log" | tail -40; grep '"ok": false\|error' "$OUT/gluon.log" | head
  exit 0
fi
if [ "${MODE:-tests}" = ws ]; then
  export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 OUT=${OUT:-/tmp/out}
  mkdir -p "$OUT"
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
  timeout 120 python3 -m pytest -q -n 8 -p no:cacheprovider tests/kernels/test_gemm_hopper.py tests/test_precompile.py \
    > "$OUT/tests.log" 2>&1; rc=$?; echo "tests rc=$rc"
  grep -E "FAILED|ERROR|passed|failed" "$OUT/tests.log" | tail -12
  [ $rc = 124 ] && exit 1
  timeout 240 python3 benchmarks/tune_gemm_ws.py "$OUT/ws.json" > "$OUT/ws.log" 2>&1; echo "tune rc=$?"
  grep -E "^checks|^totals|^[a-z]" "$OUT/ws.log" | grep -v "^    " | tail -20; grep -c "CHECK FAILED" "$OUT/ws.log"
  [ "${WS_BENCH:-1}" = 1 ] || exit 0
  for ws in 1 0; do
    FLYARRAY_GEMM_WS=$ws timeout 140 python3 -m flyarray bench --json "$OUT/bench_ws$ws.json" --suite torch \
      > "$OUT/bench_ws$ws.log" 2>&1; echo "bench ws=$ws rc=$?"; grep -E "^(llama|block|mlp)" "$OUT/bench_ws$ws.log" | tail -4
  done
  exit 0
fi
if [ "${MODE:-tests}" = ws_profile ]; then  # the seed block forward, kernel by kernel, with and without WS
  export PYTHONPATH=$PWD PYTHONUNBUFFERED=1
  for ws in 1 0 1 0; do
    FLYARRAY_GEMM_WS=$ws timeout 90 python3 benchmarks/profile_seed_block.py ws$ws 2>&1 | grep -v Warning | head -20
  done
  exit 0
fi
if [ "${MODE:-tests}" = pingpong ]; then
  export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 OUT=${OUT:-/tmp/out}
  mkdir -p "$OUT"
  GLUON_ONLY=pingpong GLUON_BWD=0 timeout 260 python3 benchmarks/tune_attention_gluon.py "$OUT/pp.json" \
    > "$OUT/pp.log" 2>&1
  echo "tuner rc=$?; checks ok: $(grep -c '"ok": true' "$OUT/pp.log"), failed: $(grep -c '"ok": false' "$OUT/pp.log")"
  grep '"kind": "time"' "$OUT/pp.log" | python3 -c "
import json, sys
for line in sys.stdin:
    r = json.loads(line); c = r.get('config') or {}
    print(r['shape'][:28], r['label'], round(r.get('ms', 0) * 1e3, 1), c.get('PINGPONG'), c.get('BLOCK_N'),
          c.get('CONSUMER_REGS'), r.get('error', ''))"
  timeout 150 python3 -m pytest -q -n 8 -p no:cacheprovider tests/kernels/test_attention.py 2>&1 | tail -3
  timeout 150 python3 -m flyarray bench --suite attention 2>&1 | grep "attn fwd B\|attn fwd GQA"
  exit 0
fi
if [ "${MODE:-tests}" = host_ab ]; then
  export PYTHONUNBUFFERED=1 OUT=${OUT:-/tmp/out}
  mkdir -p "$OUT"
  PYTHONPATH=$PWD timeout ${TEST_TIMEOUT:-170} python3 -m pytest -q -n 8 -p no:cacheprovider tests/kernels/test_attention.py \
    tests/test_torch_backend.py tests/test_plan.py tests/test_gpu_core.py > "$OUT/tests.log" 2>&1
  echo "tests rc=$?"; grep -E "FAILED|ERROR|[0-9]+ passed|[0-9]+ failed" "$OUT/tests.log" | tail -12
  for tree in "$OLD" "$PWD" "$OLD" "$PWD"; do
    echo "== $tree"
    PYTHONPATH=$tree timeout 120 python3 benchmarks/host_seed_block.py 2>&1 \
      | grep -E "^(flyarray|eager|inductor) [{]|^  (step|plan|jit|Compiled|whole)"
  done
  PYTHONPATH=$PWD timeout ${BENCH_TIMEOUT:-200} python3 -m flyarray bench --json "$OUT/bench_torch.json" --suite torch \
    > "$OUT/bench_torch.log" 2>&1; echo "bench rc=$?"; grep -E "^(llama|block|mlp|seed)" "$OUT/bench_torch.log" | tail -8
  exit 0
fi
if [ "${MODE:-tests}" = suite_then_torch ]; then
  # the whole test suite on the GPU (TESTS= narrows it), then (BENCH=1) benchmarks/seed_block_state.py and
  # `bench --suite torch`: the seed block's forward beside eager and torch.compile, fresh and after the Llama case
  export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 OUT=${OUT:-/tmp/out} FLYARRAY_CACHE_DIR=/tmp/flyarray-cache
  mkdir -p "$OUT"
  if [ -n "${BISECT:-}" ]; then export FLYARRAY_TEST_ORDER_DIR="$OUT/order"; mkdir -p "$FLYARRAY_TEST_ORDER_DIR"; fi
  if [ -n "${CORE_HALF:-}" ]; then CORE_PART="$CORE_HALF/2"; fi
  if [ -n "${CORE_PART:-}" ]; then   # i/n: the i-th of n slices of the core suite's files (the first half ran past
    # 250 s on the H200 host in the thirty-third session: CORE_PART=1/3, 2/3, 3/3 fit one call each)
    files=(tests/test_*.py); count=${#files[@]}; i=${CORE_PART%/*}; parts=${CORE_PART#*/}
    size=$(( (count + parts - 1) / parts )); TESTS="${files[*]:$(( (i - 1) * size )):$size}"
  fi
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader; python3 -c "import torch, triton; print(torch.__version__, triton.__version__)"
  # -v names each failure as it happens, and SIGINT at the limit still prints pytest's summary (a killed run
  # left only dots: the thirty-first session saw two F's it could not name)
  timeout -s INT -k 30 ${TEST_TIMEOUT:-400} python3 -m pytest -v -rfE -n ${WORKERS:-12} -p no:cacheprovider ${TESTS:-tests} \
    > "$OUT/tests.log" 2>&1
  echo "tests rc=$?"; grep -E "FAILED|ERROR|[0-9]+ passed|[0-9]+ failed" "$OUT/tests.log" | sort -u | tail -30
  if [ -n "${BISECT:-}" ]; then   # which earlier test in its worker makes each failure fail (tests/conftest.py)
    timeout ${BISECT_TIMEOUT:-240} python3 benchmarks/bisect_order.py "$FLYARRAY_TEST_ORDER_DIR" \
      --budget $(( ${BISECT_TIMEOUT:-240} - 20 )) --jobs 14 2>&1 | tee "$OUT/bisect.log" | tail -40
    # one file: a call brings back only so many files
    tar -C "$OUT" -czf "$OUT/order.tgz" order && rm -rf "$FLYARRAY_TEST_ORDER_DIR"
  fi
  if [ -n "${BENCH:-}" ]; then
    if [ -n "${BENCH_SUITES:-}" ]; then   # e.g. BENCH_SUITES="attention mx topk gemm": issue 15's table
      timeout ${BENCH_TIMEOUT:-200} python3 -m flyarray bench --json "$OUT/bench.json" \
        $(for s in $BENCH_SUITES; do printf -- "--suite %s " "$s"; done) > "$OUT/bench.log" 2>&1
      echo "bench rc=$?"; tail -60 "$OUT/bench.log"
      exit 0
    fi
    timeout 120 python3 benchmarks/seed_block_state.py > "$OUT/seed_state.log" 2>&1; echo "state rc=$?"
    grep -vi warning "$OUT/seed_state.log" | tail -25
    timeout ${BENCH_TIMEOUT:-200} python3 -m flyarray bench --json "$OUT/bench_torch.json" --suite torch \
      > "$OUT/bench_torch.log" 2>&1; echo "bench rc=$?"; grep -E "^(llama|block|mlp|seed)" "$OUT/bench_torch.log" | tail -8
  fi
  exit 0
fi
if [ "${MODE:-tests}" = mx_probe ]; then
  export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 OUT=${OUT:-/tmp/out}
  mkdir -p "$OUT"
  timeout ${TEST_TIMEOUT:-200} python3 -m pytest -q -n 8 -p no:cacheprovider \
    ${TESTS:-tests/test_gpu_core.py tests/test_complex.py tests/test_torch_backend.py} > "$OUT/tests.log" 2>&1
  echo "tests rc=$?"; grep -E "FAILED|ERROR|[0-9]+ passed|[0-9]+ failed" "$OUT/tests.log" | tail -15
  timeout 200 python3 benchmarks/mx_decode_probe.py "$OUT/probe.json" 2>&1 | tail -30
  [ -n "${NOSCALE:-}" ] && timeout 100 python3 benchmarks/mx_decode_probe.py noscale "$OUT/probe_noscale.json" 2>&1 \
    | grep -E "decode|rror" | tail -20
  MODE=ncu WORKLOADS=mx_decode bash "$0"
  exit 0
fi
if [ "${MODE:-tests}" = pending_mx ]; then
  export PYTHONPATH=$PWD PYTHONUNBUFFERED=1 OUT=${OUT:-/tmp/out}
  mkdir -p "$OUT"
  FORMATS=e2m1 timeout 500 python3 benchmarks/tune_mx_decode.py "$OUT/mx_decode.json" > "$OUT/mx_decode.log" 2>&1
  tail -60 "$OUT/mx_decode.log"
  exit 0
fi
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
