#!/usr/bin/env bash
# What the CUDA backend has for speculative decoding with the MTP head (issue 22, docs/speculative.md), on a GPU
# machine with the gpu-bundle built here (ninja -C build qrig_tests_gpu). Usage: tests/gpu/draft.sh   (~1 minute on
# an H200; logs under $OUT, default ./gpu-out). Steps:
#   1. qrig_tests_gpu "[draft]": concat_f32 vs cpu::concat_rows (exact); conv1d_silu_f32 and gdn_recurrent keeping
#      the state after each token of a verify step (k = 1, 2, 4) vs the CPU backend's token-by-token copies, each
#      kept state bit-equal to what a step ending there leaves; the executor's verify step of k + 1 tokens on
#      tiny-mtp.gguf rolled back to every position, bit-equal to another tail rolled back there and within 1e-2 of
#      a plain run (gpu_draft_tests.log; draft_report.md: every comparison with its threshold).
#   2. compute-sanitizer memcheck of "[draft]" when installed.
#   3. `qrig verify tiny-mtp.gguf tiny-mtp-draft-ref.gguf --draft 2` on the GPU with --precise (5e-3, top-1 0.99)
#      and on the CPU backend (1e-4).
# The sm_70 family of the same kernels runs with every other "[gpu]" test in cmp_family.sh. Expected: every line
# "ok"; exit non-zero when a test, the sanitizer or an expected outcome fails. A short table is printed last.
set -uo pipefail
source "$(dirname "$0")/bundle_env.sh" draft.sh
mkdir -p "$out"
export QRIG_GPU_REPORT=$out/draft_report.md
printf '| op | shape | measure | value | threshold | |\n|---|---|---|---|---|---|\n' >"$QRIG_GPU_REPORT"
status=0
summary=()
add() { summary+=("| $1 | $2 |"); }

# 1
"$tests" "[draft]" >"$out/gpu_draft_tests.log" 2>&1
rc=$?
[[ $rc -ne 0 ]] && status=1
add "gpu tests [draft] (concat, conv/GDN state per position, verify + rollback)" "$( [[ $rc == 0 ]] && echo ok || echo FAIL): $(catch2_line "$out/gpu_draft_tests.log")"

# 2
if [[ -n "$sanitizer" ]]; then
  "$sanitizer" --tool memcheck --error-exitcode 3 "$tests" "[draft]" >"$out/memcheck_draft.log" 2>&1
  rc=$?
  [[ $rc -ne 0 ]] && status=1
  add "memcheck [draft]" "$( [[ $rc == 0 ]] && echo ok || echo FAIL) ($(grep -E 'ERROR SUMMARY' "$out/memcheck_draft.log" | tail -1))"
else
  add "compute-sanitizer" "not installed"
fi

# 3
[[ -f "$out/rig.toml" ]] || "$qrig" probe -o "$out/rig.toml" >"$out/probe.log" 2>&1 || { add probe FAIL; status=1; }
for b in "--rig $out/rig.toml --precise" "--backend cpu"; do
  "$qrig" verify "$shared/fixtures/tiny-mtp.gguf" "$shared/fixtures/tiny-mtp-draft-ref.gguf" --draft 2 $b \
    >"$out/verify_draft_ref.log" 2>&1
  rc=$?
  [[ $rc -ne 0 ]] && status=1
  add "verify tiny-mtp draft ref $b" "$( [[ $rc == 0 ]] && echo ok || echo FAIL): $(grep -m1 'draft mtp' "$out/verify_draft_ref.log" | cut -c1-140)"
done

echo
echo "draft.sh: logs in $out"
printf '| step | result |\n|---|---|\n'
printf '%s\n' "${summary[@]}"
exit $status
