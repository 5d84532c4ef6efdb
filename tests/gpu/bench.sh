#!/usr/bin/env bash
# Model-level checks and benchmarks on a GPU machine, with the qrig binary of the gpu-bundle (built here:
# ninja -C build-gpu qrig_tests_gpu, which also bundles qrig). Usage:
#   tests/gpu/bench.sh [presets...]        default: 9b        (27b writes a 27 GB file first)
# Steps: qrig probe -> rig.toml; qrig verify of fixtures/tiny.gguf against tiny-ref.gguf on the GPU (prefill, and
# prefill 17 + decode; both again with --precise: two activation planes in every matmul); `qrig run` and `qrig serve` on the GPU (tests/gpu/serve_smoke.sh); for each preset: qrig synth, qrig compile for the probed rig (context 33K),
# qrig bench -p 512,4096,32768 -n 128 and -n 128 -d 32768, JSON + markdown under $OUT. Env: QRIG_BENCH_REPS (3),
# QRIG_BENCH_P (512,4096,32768), QRIG_BENCH_DEPTH (32768; 0 skips the depth test), QRIG_BENCH_COMPARE=1 (also
# tg128 without CUDA graphs, and pp512/pp4096/tg128 of a --precise plan), QRIG_MODEL_DIR (/tmp/qrig-models), QRIG_SHARED_DIR (../shared: the fixtures).
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
bundle=""
for c in "$root/build-gpu/gpu-bundle" "$root/build/gpu-bundle"; do [[ -x "$c/qrig" ]] && { bundle=$c; break; }; done
[[ -z "$bundle" ]] && { echo "bench.sh: no gpu-bundle/qrig (build it: ninja -C build-gpu qrig_tests_gpu)" >&2; exit 2; }
for d in "$bundle/qrig-libs" /usr/local/cuda/lib64 /usr/local/cuda/lib; do
  [[ -d "$d" ]] && LD_LIBRARY_PATH="$d${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
done
export LD_LIBRARY_PATH
export XDG_CACHE_HOME=${QRIG_GPU_CACHE:-${TMPDIR:-/tmp}/qrig-gpu-cache}
qrig="$bundle/qrig"
shared=${QRIG_SHARED_DIR:-$root/../shared}
out=${OUT:-$PWD/gpu-out}
models=${QRIG_MODEL_DIR:-/tmp/qrig-models}
reps=${QRIG_BENCH_REPS:-3}
pp=${QRIG_BENCH_P:-512,4096,32768}
depth=${QRIG_BENCH_DEPTH:-32768}
mkdir -p "$out" "$models"
presets=("$@")
[[ ${#presets[@]} -eq 0 ]] && presets=(9b)
status=0
declare -a lines

run() {  # run NAME CMD...: log to $out/NAME.log, remember the outcome
  local name=$1; shift
  local t0=$SECONDS
  "$@" >"$out/$name.log" 2>&1
  local rc=$?
  lines+=("| $name | $([[ $rc -eq 0 ]] && echo ok || echo "FAILED ($rc)") | $((SECONDS - t0)) s | $name.log |")
  [[ $rc -ne 0 ]] && status=1
  return $rc
}

rig="$out/rig.toml"
if ! run probe "$qrig" probe -o "$rig"; then
  # without a probe, a rig from the device's own description
  sm=$(nvidia-smi --query-gpu=compute_cap --format=csv,noheader | head -1 | tr -d .)
  printf '[rig]\nname = "this-gpu"\n[[device]]\nkind = "cuda"\nname = "gpu"\narch = "sm_%s"\nsms = 132\nmemory_gib = 139\n' "$sm" >"$rig"
fi
run verify_tiny "$qrig" verify "$shared/fixtures/tiny.gguf" "$shared/fixtures/tiny-ref.gguf" --rig "$rig"
run verify_tiny_decode "$qrig" verify "$shared/fixtures/tiny.gguf" "$shared/fixtures/tiny-ref.gguf" --rig "$rig" --split 17
run verify_tiny_precise "$qrig" verify "$shared/fixtures/tiny.gguf" "$shared/fixtures/tiny-ref.gguf" --rig "$rig" --precise
run verify_tiny_precise_decode "$qrig" verify "$shared/fixtures/tiny.gguf" "$shared/fixtures/tiny-ref.gguf" --rig "$rig" --precise --split 17
run serve_smoke env QRIG_SHARED_DIR="$shared" OUT="$out" bash "$root/tests/gpu/serve_smoke.sh" "$rig"

for p in "${presets[@]}"; do
  gguf="$models/$p.gguf"
  [[ -f "$gguf" ]] || run "synth_$p" "$qrig" synth --preset "$p" -o "$gguf"
  longest=$depth
  for n in ${pp//,/ }; do (( n > longest )) && longest=$n; done
  run "compile_$p" "$qrig" compile "$gguf" --rig "$rig" --ctx $((longest + 1024)) --parallel 1 -o "$models/plan-$p" || continue
  run "bench_$p" "$qrig" bench "$models/plan-$p" -p "$pp" -n 128 -r "$reps" --json "$out/bench_$p.json"
  if (( depth > 0 )); then
    run "bench_${p}_depth" "$qrig" bench "$models/plan-$p" -p 0 -n 128 -d "$depth" -r "$reps" --json "$out/bench_${p}_depth.json"
  fi
  if [[ "${QRIG_BENCH_COMPARE:-0}" == 1 ]]; then  # decode without CUDA graphs; a --precise plan
    run "bench_${p}_nographs" "$qrig" bench "$models/plan-$p" -p 0 -n 128 -r "$reps" --no-cuda-graphs
    run "compile_${p}_precise" "$qrig" compile "$gguf" --rig "$rig" --ctx 5120 --parallel 1 --precise -o "$models/plan-$p-precise" &&
      run "bench_${p}_precise" "$qrig" bench "$models/plan-$p-precise" -p 512,4096 -n 128 -r "$reps"
  fi
done

{
  echo
  for f in "$out"/verify_tiny*.log; do echo "$(basename "$f"): $(tail -1 "$f")"; done
  grep '^|' "$out/serve_smoke.log"
  for p in "${presets[@]}"; do
    for f in "$out/bench_$p.log" "$out/bench_${p}_depth.log" "$out/bench_${p}_nographs.log" "$out/bench_${p}_precise.log"; do [[ -f "$f" ]] && grep -E '^\||^steps:' "$f"; done
  done
  echo
  echo "| step | result | time | log |"
  echo "|---|---|---|---|"
  printf '%s\n' "${lines[@]}"
} | tee "$out/bench_summary.md"
exit $status
