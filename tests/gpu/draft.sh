#!/usr/bin/env bash
# Speculative decoding with the MTP head on the CUDA backend (issue 22, docs/speculative.md), on a GPU machine with
# the gpu-bundle built here (ninja -C build qrig_tests_gpu). Usage: tests/gpu/draft.sh [STEPS]   (STEPS: a comma list
# of the steps below, default 1,2,3,4; a few minutes on an H200, most of it the first compile of the kernels and
# compute-sanitizer: run "1" and "2,3,4" as two calls if one would pass 10 minutes; logs under $OUT, default
# ./gpu-out, kept between calls). Steps:
#   1. qrig_tests_gpu "[draft]": concat_f32 vs cpu::concat_rows (exact); conv1d_silu_f32 and gdn_recurrent keeping
#      the state after each token of a verify step (k = 1, 2, 4) vs the CPU backend's token-by-token copies, each
#      kept state bit-equal to what a step ending there leaves; the executor's verify step of k + 1 tokens on
#      tiny-mtp.gguf rolled back to every position, bit-equal to another tail rolled back there and within 1e-2 of
#      a plain run; the CUDA draft head's logits against the CPU reference head's on the same tokens (5e-3), after a
#      prompt and after a verify step and its rollback; greedy generation with drafting on (k = 1, 2, 4) vs off
#      through the engine over four prompts, one at a time (a differing token only at a rounding tie of the
#      drafting-off logits: top-2 gap <= 2e-2 of the largest) and four at once (<= 2e-1), the identical tokens,
#      acceptance and tokens per step reported; a drafter proposing the target's own tokens (wrong at each draft
#      position in turn): the tokens-per-step accounting and a rollback at every rejection position
#      (gpu_draft_tests.log; draft_report.md: every comparison with its threshold).
#   2. compute-sanitizer memcheck of "[draft][short]" when installed (the kernels, the verify + rollback, the head).
#   3. qrig probe -> rig.toml; `qrig verify tiny-mtp.gguf tiny-mtp-draft-ref.gguf --draft 2` on the GPU: with two
#      activation planes everywhere (--precise: 5e-3 and top-1 0.99 for every row's logits and the intermediates),
#      the same decoding the head row by row through its cache (--split 20), and with the plan's default numerics
#      (one plane above the two-plane rows: its line is reported, not gated: no threshold is set for it yet); the
#      CPU backend's (1e-4) for comparison.
#   4. qrig run and qrig bench with --draft 2 on the GPU (acceptance and tokens per step reported; the greedy text
#      beside a --draft 0 run's, reported: that plan's small prefill steps take one activation plane where the
#      drafting plan's take two, so the two may differ by more than rounding).
# The sm_70 family of the same kernels runs with every other "[gpu]" test in cmp_family.sh. Expected: every line
# "ok" (or "reported"); exit non-zero when a test, the sanitizer or a gated verify fails. A short table is printed last.
set -uo pipefail
source "$(dirname "$0")/bundle_env.sh" draft.sh
mkdir -p "$out"
export QRIG_GPU_REPORT=$out/draft_report.md
[[ -s "$QRIG_GPU_REPORT" ]] || printf '| op | shape | measure | value | threshold | |\n|---|---|---|---|---|---|\n' >"$QRIG_GPU_REPORT"
steps=${1:-1,2,3,4}
want() { [[ ",$steps," == *",$1,"* ]]; }
status=0
summary=()
add() { summary+=("| $1 | $2 |"); }
mtp=$shared/fixtures/tiny-mtp.gguf
ref=$shared/fixtures/tiny-mtp-draft-ref.gguf

# 1
if want 1; then
  "$tests" "[draft]" >"$out/gpu_draft_tests.log" 2>&1
  rc=$?
  [[ $rc -ne 0 ]] && status=1
  add "gpu tests [draft] (kernels, verify + rollback, head vs CPU head, drafting vs off, forced acceptance)" "$( [[ $rc == 0 ]] && echo ok || echo FAIL): $(catch2_line "$out/gpu_draft_tests.log")"
  grep -E "^\| drafting vs off .*identical tokens" "$out/gpu_draft_tests.log" | while read -r line; do echo "$line"; done >"$out/draft_identical.txt"
  while read -r line; do
    add "$(echo "$line" | cut -d'|' -f3 | sed 's/^ *//; s/ *$//'): identical greedy tokens, drafting vs off" "reported: $(echo "$line" | cut -d'|' -f5,7 | sed 's/ *| */; /; s/^ *//; s/ *$//')"
  done <"$out/draft_identical.txt"
fi

# 2
if ! want 2; then
  :
elif [[ -n "$sanitizer" ]]; then
  "$sanitizer" --tool memcheck --error-exitcode 3 "$tests" "[draft][short]" >"$out/memcheck_draft.log" 2>&1
  rc=$?
  [[ $rc -ne 0 ]] && status=1
  add "memcheck [draft][short]" "$( [[ $rc == 0 ]] && echo ok || echo FAIL) ($(grep -E 'ERROR SUMMARY' "$out/memcheck_draft.log" | tail -1))"
else
  add "compute-sanitizer" "not installed"
fi

# 3
[[ -f "$out/rig.toml" ]] || "$qrig" probe -o "$out/rig.toml" >"$out/probe.log" 2>&1 || { add probe FAIL; status=1; }
verify() {  # NAME GATED ARGS...: qrig verify of the draft reference; GATED=1: its exit status counts
  local name=$1 gated=$2; shift 2
  "$qrig" verify "$mtp" "$ref" --draft 2 "$@" >"$out/$name.log" 2>&1
  local rc=$? line
  line=$(grep -m1 'draft mtp' "$out/$name.log" | cut -c1-160)
  if [[ $gated == 1 ]]; then
    [[ $rc -ne 0 ]] && status=1
    add "$name" "$( [[ $rc == 0 ]] && echo ok || echo FAIL): ${line:-rc $rc, see $name.log}"
  else
    add "$name" "reported (rc $rc): ${line:-see $name.log}"
  fi
}
if want 3; then
  verify verify_draft_ref_gpu_precise 1 --rig "$out/rig.toml" --precise
  verify verify_draft_ref_gpu_precise_split20 1 --rig "$out/rig.toml" --precise --split 20
  verify verify_draft_ref_gpu_default 0 --rig "$out/rig.toml"
  verify verify_draft_ref_cpu 1 --backend cpu
fi

# 4
if want 4; then
  "$qrig" run "$mtp" --rig "$out/rig.toml" --draft 2 -p 'hello there' -n 32 --temp 0 >"$out/run_draft2.log" 2>&1
  rc=$?
  [[ $rc -ne 0 ]] && status=1
  add "qrig run --draft 2 (GPU)" "$( [[ $rc == 0 ]] && echo ok || echo FAIL): $(grep -m1 'acceptance' "$out/run_draft2.log" | cut -c1-140)"
  "$qrig" run "$mtp" --rig "$out/rig.toml" --draft 2 -p 'hello there' -n 32 --temp 0 --quiet >"$out/run_draft2.txt" 2>/dev/null
  "$qrig" run "$mtp" --rig "$out/rig.toml" --draft 0 -p 'hello there' -n 32 --temp 0 --quiet >"$out/run_draft0.txt" 2>/dev/null
  add "greedy text, --draft 2 vs --draft 0 plan (GPU)" "reported: $(cmp -s "$out/run_draft2.txt" "$out/run_draft0.txt" && echo identical || echo differs)"
  "$qrig" bench "$mtp" --rig "$out/rig.toml" --draft 2 -p 16 -n 32 -r 2 >"$out/bench_draft2.log" 2>&1
  rc=$?
  [[ $rc -ne 0 ]] && status=1
  add "qrig bench --draft 2 (GPU)" "$( [[ $rc == 0 ]] && echo ok || echo FAIL): $(grep -m1 'draft:' "$out/bench_draft2.log" | cut -c1-140)"
fi

echo
echo "draft.sh: logs in $out"
printf '| step | result |\n|---|---|\n'
printf '%s\n' "${summary[@]}"
exit $status
