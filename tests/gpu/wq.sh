#!/usr/bin/env bash
# The GGUF weight formats on a GPU machine (issue "GPU run: the GGUF weight formats"), with the gpu-bundle built
# here (ninja -C build qrig_tests_gpu) and the kquant fixtures under $QRIG_SHARED_DIR/fixtures/kquant.
# Usage: tests/gpu/wq.sh [check|speed]   (check: steps 1-4; speed: step 5; default both)
# Steps, logs under $OUT:
#   1. qrig_tests_gpu "[wq]": every block type's matmul (GEMV, skinny widths, 16-row tiles, one and two planes) vs
#      cpu::matmul on the same quantized activation at small, 9B and 27B shapes; embed_wq bit for bit.
#   2. qrig verify of every kquant fixture on the GPU (a plan for the probed rig).
#   3. compute-sanitizer memcheck of the Q4_K_M verify (when installed).
#   4. the GEMV micro-benchmark per type at 9B shapes (GB/s against a copy measured in the same run).
#   5. speed: 9B synth at q8_0, q4_k_m, q5_k_m, q6_k, q4_0 (and 27B q4_k_m): qrig bench -p 512,4096 -n 128.
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
  "$tests" "[wq]" >"$out/gpu_wq_tests.log" 2>&1
  add "gpu tests [wq]" "$( [[ $? == 0 ]] && echo ok || echo FAIL) ($(grep -E 'test cases' "$out/gpu_wq_tests.log" | tail -1))"
  worst=$(awk -F'|' '/vs same quantized/ {gsub(/ /,"",$5); if ($5+0 > m) m = $5+0} END {print m+0}' "$QRIG_GPU_REPORT")
  add "worst matmul error vs same activation" "$worst"
  for f in "$shared"/fixtures/kquant/kq-*-ref.gguf; do
    name=$(basename "$f" -ref.gguf)
    [[ -f "$shared/fixtures/kquant/$name.gguf" ]] || continue
    "$qrig" compile "$shared/fixtures/kquant/$name.gguf" --rig "$out/rig.toml" -o "$out/plan-$name" >"$out/compile-$name.log" 2>&1
    if [[ $? != 0 ]]; then add "verify $name" "compile: $(tail -1 "$out/compile-$name.log")"; continue; fi
    "$qrig" verify "$out/plan-$name" "$f" >"$out/verify-$name.log" 2>&1
    rc=$?
    add "verify $name" "$( [[ $rc == 0 ]] && echo ok || echo FAIL): $(grep -E 'max_rel_err' "$out/verify-$name.log" | tail -1)"
  done
  if command -v compute-sanitizer >/dev/null && [[ -d "$out/plan-kq-q4_k_m" ]]; then
    compute-sanitizer --tool memcheck --error-exitcode 3 "$qrig" verify "$out/plan-kq-q4_k_m" \
      "$shared/fixtures/kquant/kq-q4_k_m-ref.gguf" >"$out/memcheck_wq.log" 2>&1
    add "memcheck, q4_k_m verify" "$( [[ $? == 0 ]] && echo '0 errors' || echo FAIL) ($(grep -E 'ERROR SUMMARY' "$out/memcheck_wq.log" | tail -1))"
  else
    add "memcheck" "compute-sanitizer not installed or no q4_k_m plan"
  fi
  QRIG_BENCH_OUT=$out/gemv_wq.md "$tests" "block-type GEMV bandwidth at 9B shapes" >"$out/gemv_wq.log" 2>&1
  add "GEMV bandwidth per type" "$(grep -E '^worst' "$out/gemv_wq.md" 2>/dev/null || echo FAIL)"
fi

if [[ $what == all || $what == speed ]]; then
  models=${QRIG_MODEL_DIR:-/tmp/qrig-models}
  mkdir -p "$models"
  budget=${QRIG_WQ_BUDGET_S:-540}
  for spec in 9b:q8_0 9b:q4_k_m 9b:q6_k 9b:q4_0 9b:q5_k_m 27b:q4_k_m; do
    (( $(date +%s) - start > budget )) && { add "bench $spec" "skipped (time)"; continue; }
    p=${spec%%:*} t=${spec##*:}
    m="$models/$p-$t.gguf"
    s0=$(date +%s)
    [[ -f "$m" ]] || "$qrig" synth --preset "$p" --type "$t" -o "$m" >"$out/synth-$p-$t.log" 2>&1 || { add "synth $spec" FAIL; continue; }
    "$qrig" compile "$m" --rig "$out/rig.toml" --ctx 8192 --parallel 1 -o "$out/plan-$p-$t" >"$out/compile-$p-$t.log" 2>&1 \
      || { add "compile $spec" "FAIL: $(tail -1 "$out/compile-$p-$t.log")"; continue; }
    "$qrig" bench "$out/plan-$p-$t" -p 512,4096 -n 128 -r 2 >"$out/bench-$p-$t.md" 2>&1
    add "bench $spec" "$(grep -E '^\| [^|]+ \| [0-9.]+ GiB' "$out/bench-$p-$t.md" | awk -F'|' '{printf "%s %s;", $6, $7}') ($(( $(date +%s) - s0 )) s)"
    rm -f "$m"  # disk: the next file
  done
fi

{
  echo "| step | result |"
  echo "|---|---|"
  printf '%s\n' "${summary[@]}"
} | tee "$out/summary.md"
