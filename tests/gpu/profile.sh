#!/usr/bin/env bash
# Per-op GPU time of a decode and a prefill pass (qrig bench --profile) on a GPU machine, with the gpu-bundle built
# here (ninja -C build qrig_tests_gpu). Usage: tests/gpu/profile.sh [PRESET:TYPE ...]   (default 9b:q8_0)
# Each spec: qrig synth --preset PRESET --type TYPE, a plan for the probed rig (--ctx 8192 --parallel 1), then
# `qrig bench -p 512 -n 64 -r 1 --profile` (bench_profile_PRESET-TYPE.md under $OUT). A short table is printed last.
set -uo pipefail
source "$(dirname "$0")/bundle_env.sh" profile.sh
models=${QRIG_MODEL_DIR:-/tmp/qrig-models}
mkdir -p "$out" "$models"
[[ -f "$out/rig.toml" ]] || "$qrig" probe -o "$out/rig.toml" >"$out/probe.log" 2>&1 || { echo "probe failed"; exit 1; }
specs=("$@")
[[ ${#specs[@]} -eq 0 ]] && specs=(9b:q8_0)
summary=()
for spec in "${specs[@]}"; do
  p=${spec%%:*} t=${spec##*:}
  m="$models/$p-$t.gguf"
  [[ -f "$m" ]] || "$qrig" synth --preset "$p" --type "$t" -o "$m" >"$out/synth-$p-$t.log" 2>&1 || { summary+=("| $spec | synth FAIL |"); continue; }
  "$qrig" compile "$m" --rig "$out/rig.toml" --ctx 8192 --parallel 1 -o "$out/plan-$p-$t" >"$out/compile-$p-$t.log" 2>&1 \
    || { summary+=("| $spec | compile FAIL: $(tail -1 "$out/compile-$p-$t.log") |"); continue; }
  "$qrig" bench "$out/plan-$p-$t" -p 512 -n 64 -r 1 --profile >"$out/bench_profile_$p-$t.md" 2>&1
  summary+=("| $spec | $(grep -E '^profile of tg' "$out/bench_profile_$p-$t.md" | sed -E 's/.*: ([0-9]+ ops, .*)/\1/') |")
done
{
  echo "| model | decode profile |"
  echo "|---|---|"
  printf '%s\n' "${summary[@]}"
} | tee "$out/profile_summary.md"
