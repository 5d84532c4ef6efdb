#!/usr/bin/env bash
# Per-op GPU time of a decode and a prefill pass (qrig bench --profile) on a GPU machine, with the gpu-bundle built
# here (ninja -C build qrig_tests_gpu). Usage: tests/gpu/profile.sh [PRESET:TYPE[:SEQS] ...]   (default 9b:q8_0)
# Each spec: qrig synth --preset PRESET --type TYPE, a plan for the probed rig (--ctx 8192 --parallel 1), then
# `qrig bench -p 512 -n 64 -r 1 --profile` (bench_profile_PRESET-TYPE.md under $OUT). With SEQS (several sequences
# at once): a plan with --parallel SEQS --ctx 2048 and `qrig bench -p 0 -n 32 -r 1 --sequences SEQS/2,SEQS --profile`
# (a profile per step of each number of sequences; bench_profile_PRESET-TYPE-xSEQS.md). A short table is printed last.
set -uo pipefail
source "$(dirname "$0")/bundle_env.sh" profile.sh
models=${QRIG_MODEL_DIR:-/tmp/qrig-models}
mkdir -p "$out" "$models"
[[ -f "$out/rig.toml" ]] || "$qrig" probe -o "$out/rig.toml" >"$out/probe.log" 2>&1 || { echo "probe failed"; exit 1; }
specs=("$@")
[[ ${#specs[@]} -eq 0 ]] && specs=(9b:q8_0)
summary=()
for spec in "${specs[@]}"; do
  IFS=: read -r p t seqs <<<"$spec"
  m="$models/$p-$t.gguf"
  [[ -f "$m" ]] || "$qrig" synth --preset "$p" --type "$t" -o "$m" >"$out/synth-$p-$t.log" 2>&1 || { summary+=("| $spec | synth FAIL |"); continue; }
  if [[ -n "$seqs" ]]; then
    plan="$out/plan-$p-$t-x$seqs" log="$out/bench_profile_$p-$t-x$seqs.md"
    "$qrig" compile "$m" --rig "$out/rig.toml" --ctx 2048 --parallel "$seqs" -o "$plan" >"$plan.log" 2>&1 \
      || { summary+=("| $spec | compile FAIL: $(tail -1 "$plan.log") |"); continue; }
    "$qrig" bench "$plan" -p 0 -n 32 -r 1 --sequences "$((seqs / 2)),$seqs" --profile >"$log" 2>&1
  else
    plan="$out/plan-$p-$t" log="$out/bench_profile_$p-$t.md"
    "$qrig" compile "$m" --rig "$out/rig.toml" --ctx 8192 --parallel 1 -o "$plan" >"$plan.log" 2>&1 \
      || { summary+=("| $spec | compile FAIL: $(tail -1 "$plan.log") |"); continue; }
    "$qrig" bench "$plan" -p 512 -n 64 -r 1 --profile >"$log" 2>&1
  fi
  while read -r line; do
    summary+=("| $spec | $(echo "$line" | sed -E 's/^profile of ([^(]*) \(.*\): ([0-9]+ ops, .*)/\1: \2/') |")
  done < <(grep -E '^profile of tg' "$log")
done
{
  echo "| model | decode profile |"
  echo "|---|---|"
  printf '%s\n' "${summary[@]}"
} | tee "$out/profile_summary.md"
