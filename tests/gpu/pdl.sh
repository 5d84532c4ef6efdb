#!/usr/bin/env bash
# Programmatic dependent launch on and off (the plan's programmatic_launch; `qrig compile --no-pdl`), on a GPU
# machine with the gpu-bundle built here (ninja -C build qrig_tests_gpu). Usage: tests/gpu/pdl.sh [PRESET:TYPE ...]
# (default 9b:q8_0). Per spec: qrig synth, then for each of a one-sequence plan (--ctx 8192 --parallel 1) and a
# 32-slot plan (--ctx 2048 --parallel 32) the plan with and without --no-pdl; then the benches alternate between
# them twice: `qrig bench -p 512,4096 -n 128 -r 2` on the one-sequence plans and `-p 0 -n 32 -r 1 --sequences
# 16,32` on the others. bench-*.md under $OUT; pdl_summary.md (one row per bench run) is printed last.
# QRIG_PDL_BIN: another build's qrig instead of the bundle's (an A/B of the kernels' trigger).
set -uo pipefail
source "$(dirname "$0")/bundle_env.sh" pdl.sh
qrig=${QRIG_PDL_BIN:-$qrig}
models=${QRIG_MODEL_DIR:-/tmp/qrig-models}
mkdir -p "$out" "$models"
[[ -f "$out/rig.toml" ]] || "$qrig" probe -o "$out/rig.toml" >"$out/probe.log" 2>&1 || { echo "probe failed"; exit 1; }
specs=("$@")
[[ ${#specs[@]} -eq 0 ]] && specs=(9b:q8_0)
rows=()
for spec in "${specs[@]}"; do
  IFS=: read -r p t <<<"$spec"
  m="$models/$p-$t.gguf"
  [[ -f "$m" ]] || "$qrig" synth --preset "$p" --type "$t" -o "$m" >"$out/synth-$p-$t.log" 2>&1 \
    || { rows+=("| $spec | | synth FAIL |"); continue; }
  for shape in x1 x32; do
    args=(--ctx 8192 --parallel 1)
    [[ $shape == x32 ]] && args=(--ctx 2048 --parallel 32)
    for mode in pdl plain; do
      plan="$out/plan-$p-$t-$shape-$mode"
      flags=()
      [[ $mode == plain ]] && flags=(--no-pdl)
      "$qrig" compile "$m" --rig "$out/rig.toml" "${args[@]}" "${flags[@]}" -o "$plan" >"$plan.log" 2>&1 \
        || rows+=("| $spec $shape | $mode | compile FAIL: $(tail -1 "$plan.log") |")
      grep -q "programmatic_launch = $([[ $mode == pdl ]] && echo true || echo false)" "$plan/plan.toml" \
        || rows+=("| $spec $shape | $mode | plan.toml does not say programmatic_launch as asked |")
    done
    for round in 1 2; do
      for mode in pdl plain; do
        plan="$out/plan-$p-$t-$shape-$mode" log="$out/bench-$p-$t-$shape-$mode-$round.md"
        if [[ $shape == x1 ]]; then
          "$qrig" bench "$plan" -p 512,4096 -n 128 -r 2 >"$log" 2>&1
        else
          "$qrig" bench "$plan" -p 0 -n 32 -r 1 --sequences 16,32 >"$log" 2>&1
        fi
        rows+=("| $spec $shape (round $round) | $mode | $(grep -E '^\| [^|]+ \| [0-9.]+ GiB' "$log" | awk -F'|' '{printf "%s %s;", $6, $7}') |")
      done
    done
  done
done
{
  echo "| model | launch | t/s per test |"
  echo "|---|---|---|"
  printf '%s\n' "${rows[@]}"
} | tee "$out/pdl_summary.md"
