#!/usr/bin/env bash
# The batched decode kernels on a GPU machine (issue 25, "single-GPU speed": a decode step of B sequences runs
# conv1d_silu, gdn, kv_write and attention in one launch each over all B instead of once per sequence), with the
# gpu-bundle built here (ninja -C build qrig_tests_gpu: the test binary and qrig). Usage:
#   tests/gpu/batched.sh [STEPS]   STEPS: a comma list of the steps below (default 1,3; "all" is 1,2,3). A device call
#                                  runs at most 10 minutes: run "1" and "3" as separate calls on one warm machine if
#                                  one call does not hold both (the kernel cache, the 9B file and $OUT are kept).
# Steps, logs under $OUT (default ./gpu-out):
#   1. qrig_tests_gpu "[batched]": a decode step of 1, 3 and 16 sequences at their own positions (0..4094) through
#      the batched kernels and through one launch per sequence, 9B (k16v16, k8v8, k8v3, k3v3) and 27B (k16v16,
#      k8v3) dims: outputs, states and caches bit-identical; the tiny fixture with 16 slots decoding together
#      (batched, CUDA graphs captured and patched) vs the same plan without its decode_kernel attributes (one launch
#      per sequence, eager): bit-identical logits; vs each sequence alone within 5e-4 (gpu_batched_tests.log,
#      batched_report.md).
#   2. compute-sanitizer memcheck of step 1's end-to-end case (the executor's tables and arrays).
#   3. 9B Q8_0 synth: qrig probe, qrig compile --parallel 32 (inspect: the "per sequences" kernel rows), then
#      qrig bench -p 0 -n 128 --sequences 1,16,32 of that plan, and of the same plan with its decode_kernel
#      attributes removed from graph.ir (every sequence on its own: the baseline, same binary, same kernels
#      otherwise): bench9b_batched.md, bench9b_per_seq.md. Target (issue 25): 16 / 32 sequences >= 2500 / 4000 t/s.
# A short table is printed last; exit non-zero when a test or a sanitizer check failed.
set -uo pipefail
source "$(dirname "$0")/bundle_env.sh" batched.sh
models=${QRIG_MODEL_DIR:-/tmp/qrig-models}
reps=${QRIG_BENCH_REPS:-2}
mkdir -p "$out" "$models"
export QRIG_GPU_REPORT=$out/batched_report.md
[[ -s "$QRIG_GPU_REPORT" ]] || printf '| op | shape | measure | value | threshold | |\n|---|---|---|---|---|---|\n' >"$QRIG_GPU_REPORT"
steps=${1:-1,3}
[[ "$steps" == all ]] && steps=1,2,3
want() { [[ ",$steps," == *",$1,"* ]]; }
status=0
summary=()
add() { summary+=("| $1 | $2 |"); }

if want 1; then
  "$tests" "[batched]" >"$out/gpu_batched_tests.log" 2>&1
  rc=$?
  [[ $rc -ne 0 ]] && status=1
  add "gpu tests [batched] (kernels and executor vs one launch per sequence)" "$( [[ $rc == 0 ]] && echo ok || echo FAIL): $(catch2_line "$out/gpu_batched_tests.log")"
fi

if want 2; then
  if [[ -n "$sanitizer" ]]; then
    "$sanitizer" --tool memcheck --error-exitcode 3 "$tests" "16 slots decoding together*" >"$out/memcheck_batched.log" 2>&1
    rc=$?
    [[ $rc -ne 0 ]] && status=1
    add "memcheck, 16 slots batched" "$( [[ $rc == 0 ]] && echo ok || echo FAIL) ($(grep -E 'ERROR SUMMARY' "$out/memcheck_batched.log" | tail -1))"
  else
    add "compute-sanitizer" "not installed"
  fi
fi

bench_rows() { grep -E '^\| [^|]+ \| [0-9.]+ GiB' "$1" | awk -F'|' '{printf "%s %s;", $6, $7}'; }

if want 3; then
  [[ -f "$out/rig.toml" ]] || "$qrig" probe -o "$out/rig.toml" >"$out/probe.log" 2>&1 || { add probe FAIL; status=1; }
  [[ -f "$models/9b.gguf" ]] || "$qrig" synth --preset 9b -o "$models/9b.gguf" >"$out/synth9b.log" 2>&1
  rm -rf "$out/plan9b_32" "$out/plan9b_32_per_seq"
  "$qrig" compile "$models/9b.gguf" --rig "$out/rig.toml" --parallel 32 --ctx 1024 -o "$out/plan9b_32" \
    >"$out/compile9b_32.log" 2>&1 || { add "compile 9B --parallel 32" FAIL; status=1; }
  "$qrig" inspect "$out/plan9b_32" >"$out/inspect9b_32.log" 2>&1
  add "9B plan: batched decode kernel rows" "$(grep -c 'per sequences' "$out/inspect9b_32.log")"
  # The baseline: the same plan, every sequence on its own (the runtime reads graph.ir; plan.toml's kernel table
  # still lists the batched rows).
  cp -r "$out/plan9b_32" "$out/plan9b_32_per_seq"
  sed -i 's/, decode_kernel="[^"]*"//g' "$out/plan9b_32_per_seq/graph.ir"
  for v in batched per_seq; do
    plan="$out/plan9b_32"
    [[ $v == per_seq ]] && plan="$out/plan9b_32_per_seq"
    "$qrig" bench "$plan" -p 0 -n 128 --sequences 1,16,32 -r "$reps" --json "$out/bench9b_$v.json" \
      >"$out/bench9b_$v.md" 2>&1
    add "bench 9B tg128 x1,16,32 ($v)" "$(bench_rows "$out/bench9b_$v.md")"
  done
fi

{
  echo "| step | result |"
  echo "|---|---|"
  printf '%s\n' "${summary[@]}"
} | tee "$out/batched_summary.md"
exit $status
