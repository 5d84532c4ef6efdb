#!/usr/bin/env bash
# One device call's batch of the GPU scripts, with the gpu-bundle built here (ninja -C build qrig_tests_gpu).
# The device tool brings back only a few files from $OUT, so every step logs under /tmp/o/STEP (kept while the
# machine stays warm) and only each step's summary table comes back, as $OUT/STEP.md; the tables are printed last.
# Usage: tests/gpu/batch.sh STEP...   (steps run in order; a step not started within $QRIG_BATCH_BUDGET_S = 480 s
# of the call's start is skipped and says so)
#   fused          qrig_tests_gpu on the fused ops (add_rmsnorm_q8*, swiglu_q8*: bit-equal to the unfused kernels)
#   tests:FILES    qrig_tests_gpu on the test cases of tests/gpu/FILE.cpp for each FILE ('+' between them:
#                  tests:test_gpu_gemm+test_gpu_kv)
#   gpu            tests/gpu/run.sh without the micro-benchmarks and sanitizers (every "[gpu]" test)
#   wq:MODE        tests/gpu/wq.sh MODE (check, micro, models, speed)
#   kv:STEPS       tests/gpu/kv.sh STEPS with the commas written as '+' (kv:1+1l+3)
#   profile:SPEC   tests/gpu/profile.sh SPEC (9b:q8_0, 9b:q8_0:32, ...)
#   batched:STEPS  tests/gpu/batched.sh STEPS (commas as '+')
#   draft:STEPS    tests/gpu/draft.sh STEPS (commas as '+')
#   pdl[:SPECS]    tests/gpu/pdl.sh SPECS (commas as '+'): programmatic dependent launch on vs off, 9B benches
#   sweep[:BIN]    the Q8_0 GEMM tiling sweep ("[.gemm_sweep]": GEMV, skinny and tiled kernels at the 9B shapes), one
#                  plane, T <= 32, with the bundle's qrig_tests_gpu or BIN (another build's, for an A/B); back come the
#                  fastest kernel per shape and T and every row at T = 16 and 32
set -uo pipefail
here=$(cd "$(dirname "$0")" && pwd)
final=${OUT:-$PWD/gpu-out}
mkdir -p "$final" /tmp/o
budget=${QRIG_BATCH_BUDGET_S:-480}
start=$(date +%s)
tables=()
for step in "$@"; do
  name=${step//[:+]/_}; name=${name//\//_}; name=${name//./_}
  log=/tmp/o/$name
  mkdir -p "$log"
  if (( $(date +%s) - start > budget )); then
    printf '| %s | skipped: the call had run %d s |\n' "$step" "$(( $(date +%s) - start ))" >"$final/$name.md"
    tables+=("$final/$name.md"); continue
  fi
  kind=${step%%:*} arg=${step#*:}
  [[ "$arg" == "$step" ]] && arg=""
  arg=${arg//+/,}
  s0=$(date +%s)
  case $kind in
    fused)
      source "$here/bundle_env.sh" batch.sh
      "$tests" "add_rmsnorm_q8*,swiglu_q8*" >"$log/fused.log" 2>&1
      rc=$?
      printf '| step | result |\n|---|---|\n| fused ops vs unfused kernels | %s: %s |\n' \
        "$( [[ $rc == 0 ]] && echo ok || echo FAIL)" "$(catch2_line "$log/fused.log")" >"$log/summary.md" ;;
    tests)
      source "$here/bundle_env.sh" batch.sh
      spec=""
      for f in ${arg//,/ }; do spec="${spec:+$spec,}[#$f]"; done
      "$tests" -# "$spec" >"$log/tests.log" 2>&1
      rc=$?
      printf '| step | result |\n|---|---|\n| %s | %s: %s |\n' "$spec" "$( [[ $rc == 0 ]] && echo ok || echo FAIL)" \
        "$(catch2_line "$log/tests.log")" >"$log/summary.md"
      (exit $rc) ;;
    gpu) OUT=$log QRIG_GPU_BENCH=0 QRIG_GPU_SANITIZE=0 bash "$here/run.sh" >"$log/run.log" 2>&1 ;;
    wq) OUT=$log bash "$here/wq.sh" "${arg:-check}" >"$log/run.log" 2>&1 ;;
    kv) OUT=$log bash "$here/kv.sh" "${arg:-1}" >"$log/run.log" 2>&1 ;;
    profile) OUT=$log bash "$here/profile.sh" ${arg:+"$arg"} >"$log/run.log" 2>&1 ;;
    batched) OUT=$log bash "$here/batched.sh" "${arg:-1}" >"$log/run.log" 2>&1 ;;
    draft) OUT=$log bash "$here/draft.sh" "${arg:-1}" >"$log/run.log" 2>&1 ;;
    pdl) OUT=$log bash "$here/pdl.sh" ${arg:+${arg//,/ }} >"$log/run.log" 2>&1 ;;
    sweep)
      source "$here/bundle_env.sh" batch.sh
      : >"$log/sweep.md"
      QRIG_SWEEP_PLANES=1 QRIG_SWEEP_MAX_T=32 QRIG_BENCH_GEMM_OUT=$log/sweep.md "${arg:-$tests}" "Q8_0 GEMM tiling sweep at 9B shapes" \
        >"$log/run.log" 2>&1
      rc=$?
      { awk '/^### Fastest/ {f = 1} f' "$log/sweep.md"; echo; grep -E '^\| [0-9]+->[0-9]+ p1 \| (16|32) \|' "$log/sweep.md"; } \
        >"$log/summary.md"
      (exit $rc) ;;
    *) echo "batch.sh: unknown step $step" >"$log/run.log" ;;
  esac
  rc=$?
  {
    echo "### $step (exit $rc, $(( $(date +%s) - s0 )) s)"
    # the step's own table: summary.md, else the last table its output printed
    if [[ -s "$log/summary.md" ]]; then cat "$log/summary.md"
    elif ls "$log"/*summary*.md >/dev/null 2>&1; then cat "$log"/*summary*.md
    else tail -25 "$log/run.log"
    fi
    # the detail the tables summarise: profiles, benchmark tables, the KV attention micro-benchmark, test errors
    for f in "$log"/bench_profile_*.md "$log"/bench-*.md "$log"/bench_kv_attention.md "$log"/gemv_wq.md; do
      [[ -s "$f" ]] && { echo; echo "#### $(basename "$f")"; grep -vE '^\s*$' "$f" | head -150; }
    done
    grep -hE -B2 -A8 'FAILED|REQUIRE.*failed' "$log"/*.log 2>/dev/null | head -80
  } >"$final/$name.md"
  tables+=("$final/$name.md")
done
for t in "${tables[@]}"; do cat "$t"; echo; done
