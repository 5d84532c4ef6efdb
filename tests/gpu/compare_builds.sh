#!/usr/bin/env bash
# Two builds of qrig on one GPU, same inputs: do they compute the same bits, and how fast is each? For a change
# that must not change behaviour (a refactor), the logits of every position of the tiny fixture (prefill, and
# prefill 17 + decode; default and --precise plans) and greedy generations must be identical, and the speeds
# within run-to-run noise. Usage (on the GPU machine):
#   tests/gpu/compare_builds.sh OLD_DIR NEW_DIR [presets...]
# where each DIR holds a `qrig` binary and its `qrig-libs/` (a gpu-bundle). Presets (default: 9b) are
# synthesized once with the new build and benchmarked with both (pp512, pp4096, tg128; QRIG_BENCH_REPS, 3).
# Logs under $OUT (or ./gpu-out); the fixtures from $QRIG_SHARED_DIR (../shared). Prints a table last; exit
# status non-zero when any output differs or a step fails.
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
old=${1:?usage: compare_builds.sh OLD_DIR NEW_DIR [presets...]}
new=${2:?usage: compare_builds.sh OLD_DIR NEW_DIR [presets...]}
shift 2
presets=("$@")
[[ ${#presets[@]} -eq 0 ]] && presets=(9b)
shared=${QRIG_SHARED_DIR:-$root/../shared}
out=${OUT:-$PWD/gpu-out}
models=${QRIG_MODEL_DIR:-/tmp/qrig-models}
reps=${QRIG_BENCH_REPS:-3}
mkdir -p "$out/cmp" "$models"
status=0
declare -a lines

q() {  # q old|new ARGS...: that build's qrig, its own kernel cache
  local which=$1; shift
  local dir; dir=$([[ $which == old ]] && echo "$old" || echo "$new")
  LD_LIBRARY_PATH="$dir/qrig-libs:/usr/local/cuda/lib64:/usr/local/cuda/lib" XDG_CACHE_HOME="/tmp/qrig-cache-$which" \
    "$dir/qrig" "$@"
}
note() { lines+=("$1"); }

rig="$out/cmp/rig.toml"
q new probe -o "$rig" >"$out/cmp/probe.log" 2>&1 || { echo "probe failed" >&2; status=1; }

ref="$shared/fixtures/tiny-ref.gguf"
for mode in default precise; do
  for split in 0 17; do
    args=(verify "$shared/fixtures/tiny.gguf" "$ref" --rig "$rig" --split "$split")
    [[ $mode == precise ]] && args+=(--precise)
    tag="verify_${mode}_split$split"
    q old "${args[@]}" --dump "$out/cmp/$tag.old.f32" >"$out/cmp/$tag.old.log" 2>&1
    rc_old=$?
    q new "${args[@]}" --dump "$out/cmp/$tag.new.f32" >"$out/cmp/$tag.new.log" 2>&1
    rc_new=$?
    if cmp -s "$out/cmp/$tag.old.f32" "$out/cmp/$tag.new.f32"; then same="identical logits"; else same="LOGITS DIFFER"; status=1; fi
    summary=$(tail -1 "$out/cmp/$tag.new.log")
    note "| $tag | exit $rc_old / $rc_new | $same ($(stat -c %s "$out/cmp/$tag.new.f32" 2>/dev/null || echo 0) bytes) | $summary |"
    [[ $rc_old -ne 0 || $rc_new -ne 0 ]] && status=1
  done
done

for chat in "" "--chat"; do
  tag="greedy${chat:+_chat}"
  q old run "$shared/fixtures/tiny.gguf" --rig "$rig" -p "The sky over the harbour" $chat -n 64 --temp 0 --quiet \
    >"$out/cmp/$tag.old.txt" 2>"$out/cmp/$tag.old.err"
  q new run "$shared/fixtures/tiny.gguf" --rig "$rig" -p "The sky over the harbour" $chat -n 64 --temp 0 --quiet \
    >"$out/cmp/$tag.new.txt" 2>"$out/cmp/$tag.new.err"
  if cmp -s "$out/cmp/$tag.old.txt" "$out/cmp/$tag.new.txt" && [[ -s "$out/cmp/$tag.new.txt" ]]; then same="identical text";
  else same="TEXT DIFFERS"; status=1; fi
  note "| $tag (64 tokens, GPU, graphs) | | $same | $(wc -c <"$out/cmp/$tag.new.txt") bytes |"
done

for p in "${presets[@]}"; do
  gguf="$models/$p.gguf"
  [[ -f "$gguf" ]] || q new synth --preset "$p" -o "$gguf" >"$out/cmp/synth_$p.log" 2>&1 || { status=1; continue; }
  for which in old new; do
    q $which compile "$gguf" --rig "$rig" --ctx 5120 --parallel 1 -o "$models/plan-$p-$which" >"$out/cmp/compile_${p}_$which.log" 2>&1 ||
      { status=1; note "| compile $p $which | FAILED | | |"; continue; }
    q $which bench "$models/plan-$p-$which" -p 512,4096 -n 128 -r "$reps" --json "$out/cmp/bench_${p}_$which.json" \
      >"$out/cmp/bench_${p}_$which.log" 2>&1 || status=1
  done
  for which in old new; do
    note "| bench $p $which | $(grep -E '^\| .*(pp|tg)' "$out/cmp/bench_${p}_$which.log" | awk -F'|' '{printf "%s %s; ", $(NF-2), $(NF-1)}') | $(grep '^steps:' "$out/cmp/bench_${p}_$which.log") |"
  done
done

{
  echo
  echo "### Old vs new build (tests/gpu/compare_builds.sh)"
  echo "old: $old   new: $new"
  echo "| check | exit old / new | result | detail |"
  echo "|---|---|---|---|"
  printf '%s\n' "${lines[@]}"
} | tee "$out/cmp/summary.md"
exit $status
