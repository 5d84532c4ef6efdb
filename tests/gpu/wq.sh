#!/usr/bin/env bash
# The GGUF weight formats on a GPU machine (issue "GPU run: the GGUF weight formats"), with the gpu-bundle built
# here (ninja -C build qrig_tests_gpu) and the kquant fixtures under $QRIG_SHARED_DIR/fixtures/kquant.
# Usage: tests/gpu/wq.sh [check|micro|models|speed|all]   (check and speed each fit one device call of < 8 minutes)
#   check: steps 1-3; micro: step 4; models: step 5; speed: steps 4-5 (the GEMV/GEMM micro-benchmarks, then 9B
#   Q8_0 vs Q4_K_M; a model not started within $QRIG_WQ_BUDGET_S = 420 s is skipped: run `models` then);
#   all: everything (and the other synth types when $QRIG_WQ_ALL_TYPES=1).
# Steps, logs under $OUT:
#   1. qrig_tests_gpu "[wq]": every block type's matmul (the GEMV with every variant of the tuning sweep, the
#      skinny widths, the tiled GEMM with every tiling, 16-row skinny tiles for rows not a multiple of 128
#      values; one and two planes) vs cpu::matmul on the same quantized activation at small, 9B and 27B shapes,
#      threshold 2e-5 (measured worst so far 8.6e-7); embed_wq bit for bit; stacked weights (matmul_stack) of every
#      type: the single-row split launch and the members' views for 2, 5, 17 rows, each member vs cpu::matmul.
#   2. qrig verify of every kquant fixture on the GPU (a plan for the probed rig; its matmuls on one input stacked
#      per format, the plan's matmul_stack count in the table), once as prefill and once with --split 4 (every token
#      after the 4th a decode step: the stacks' single-row launches).
#   3. compute-sanitizer memcheck of the Q4_K_M verify (when installed).
#   4. the micro-benchmarks: the GEMV per type and variant at 9B shapes (GB/s against a copy measured in the same
#      run; gemv_wq.md ends with the best variant per type as tuning entries), the tiled GEMM per type and tiling
#      at T = 512 and 4096 against Q8_0's tiled GEMM (gemm_wq.md).
#   5. 9B synth at q8_0 and q4_k_m: qrig bench -p 4096 -n 128 -r 2 (targets: Q4_K_M tg128 >= 1.5x Q8_0's,
#      pp4096 >= 0.85x Q8_0's); with "all" and QRIG_WQ_ALL_TYPES=1 also q6_k, q4_0, q5_k_m and 27B q4_k_m.
# A short table is printed last.
set -uo pipefail
source "$(dirname "$0")/bundle_env.sh" wq.sh
mkdir -p "$out"
export QRIG_GPU_REPORT=$out/wq_report.md
what=${1:-all}
summary=()
add() { summary+=("| $1 | $2 |"); }
start=$(date +%s)
"$qrig" probe -o "$out/rig.toml" >"$out/probe.log" 2>&1 || add probe FAIL

if [[ $what == all || $what == check ]]; then
  : >"$QRIG_GPU_REPORT"
  # (The test cases compile their variants on 8 threads first: hundreds of variants, once, into the cache.)
  "$tests" "[wq]~[bench]" >"$out/gpu_wq_tests.log" 2>&1  # not the hidden benchmarks: step 4 runs those
  add "gpu tests [wq]" "$( [[ $? == 0 ]] && echo ok || echo FAIL) ($(grep -E 'test cases' "$out/gpu_wq_tests.log" | tail -1))"
  worst=$(awk -F'|' '/vs same quantized/ {v = $(NF-3); gsub(/ /,"",v); if (v+0 > m) m = v+0} END {print m+0}' "$QRIG_GPU_REPORT")
  add "worst matmul error vs same activation" "$worst"
  for f in "$shared"/fixtures/kquant/kq-*-ref.gguf; do
    name=$(basename "$f" -ref.gguf)
    [[ -f "$shared/fixtures/kquant/$name.gguf" ]] || continue
    "$qrig" compile "$shared/fixtures/kquant/$name.gguf" --rig "$out/rig.toml" -o "$out/plan-$name" >"$out/compile-$name.log" 2>&1
    if [[ $? != 0 ]]; then add "verify $name" "compile: $(tail -1 "$out/compile-$name.log")"; continue; fi
    stacks=$(grep -c '= matmul_stack(' "$out/plan-$name/graph.ir" 2>/dev/null)
    "$qrig" verify "$out/plan-$name" "$f" >"$out/verify-$name.log" 2>&1
    rc=$?
    add "verify $name ($stacks stacks)" "$( [[ $rc == 0 ]] && echo ok || echo FAIL): $(grep -E 'max_rel_err' "$out/verify-$name.log" | tail -1)"
    "$qrig" verify "$out/plan-$name" "$f" --split 4 >"$out/verify-decode-$name.log" 2>&1
    rc=$?
    add "verify $name, decode (--split 4)" "$( [[ $rc == 0 ]] && echo ok || echo FAIL): $(grep -E 'max_rel_err' "$out/verify-decode-$name.log" | tail -1)"
  done
  if command -v compute-sanitizer >/dev/null && [[ -d "$out/plan-kq-q4_k_m" ]]; then
    compute-sanitizer --tool memcheck --error-exitcode 3 "$qrig" verify "$out/plan-kq-q4_k_m" \
      "$shared/fixtures/kquant/kq-q4_k_m-ref.gguf" >"$out/memcheck_wq.log" 2>&1
    add "memcheck, q4_k_m verify" "$( [[ $? == 0 ]] && echo '0 errors' || echo FAIL) ($(grep -E 'ERROR SUMMARY' "$out/memcheck_wq.log" | tail -1))"
  else
    add "memcheck" "compute-sanitizer not installed or no q4_k_m plan"
  fi
fi

if [[ $what == all || $what == micro || $what == speed ]]; then
  : >"$out/gemv_wq.md"
  QRIG_BENCH_OUT=$out/gemv_wq.md "$tests" "block-type GEMV bandwidth at 9B shapes" >"$out/gemv_wq.log" 2>&1
  add "GEMV bandwidth per type" "$(grep -E '^worst' "$out/gemv_wq.md" 2>/dev/null || echo FAIL)"
  : >"$out/gemm_wq.md"
  QRIG_BENCH_OUT=$out/gemm_wq.md "$tests" "block-type tiled GEMM throughput at prefill shapes against Q8_0" \
    >"$out/gemm_wq.log" 2>&1
  add "tiled GEMM vs Q8_0 (T 4096)" "$(grep -E '^- ' "$out/gemm_wq.md" 2>/dev/null | tr '\n' ' ' || echo FAIL)"
fi

if [[ $what == all || $what == speed || $what == models ]]; then
  models=${QRIG_MODEL_DIR:-/tmp/qrig-models}
  mkdir -p "$models"
  budget=${QRIG_WQ_BUDGET_S:-420}  # no new model after 7 minutes: a device call runs at most 10
  specs="9b:q8_0 9b:q4_k_m"
  [[ $what == all && ${QRIG_WQ_ALL_TYPES:-0} == 1 ]] && specs="$specs 9b:q6_k 9b:q4_0 9b:q5_k_m 27b:q4_k_m"
  for spec in $specs; do
    (( $(date +%s) - start > budget )) && { add "bench $spec" "skipped (time)"; continue; }
    p=${spec%%:*} t=${spec##*:}
    m="$models/$p-$t.gguf"
    s0=$(date +%s)
    [[ -f "$m" ]] || "$qrig" synth --preset "$p" --type "$t" -o "$m" >"$out/synth-$p-$t.log" 2>&1 || { add "synth $spec" FAIL; continue; }
    "$qrig" compile "$m" --rig "$out/rig.toml" --ctx 8192 --parallel 1 -o "$out/plan-$p-$t" >"$out/compile-$p-$t.log" 2>&1 \
      || { add "compile $spec" "FAIL: $(tail -1 "$out/compile-$p-$t.log")"; continue; }
    "$qrig" bench "$out/plan-$p-$t" -p 4096 -n 128 -r 2 >"$out/bench-$p-$t.md" 2>&1
    add "bench $spec" "$(grep -E '^\| [^|]+ \| [0-9.]+ GiB' "$out/bench-$p-$t.md" | awk -F'|' '{printf "%s %s;", $6, $7}') ($(( $(date +%s) - s0 )) s)"
    rm -f "$m"  # disk: the next file
  done
fi

{
  echo "| step | result |"
  echo "|---|---|"
  printf '%s\n' "${summary[@]}"
} | tee "$out/summary.md"
