#!/usr/bin/env bash
# The CMP 100-210's kernel family (the sm_70 feature set) on a newer GPU: kernels compiled for sm_70 by an
# NVRTC that targets it (Debian's 11.8, carried: the GPU machine has only CUDA 13) and loaded as PTX through
# the driver's JIT. Correctness is the family's; the speeds are this GPU's, not a CMP's. Usage:
#   tests/gpu/cmp_family.sh NVRTC11_DIR [presets...]     presets default: 9b
# NVRTC11_DIR holds libnvrtc.so.11.8.89 and libnvrtc-builtins.so.11.8.89 (links are made beside them).
# Steps: every "[gpu]" test with QRIG_GPU_TEST_FAMILY=sm_70 (kernels vs CPU reference ops, the tiny model vs
# float64 and vs its dp4a emulation, graphs, sampling); `qrig verify` of fixtures/tiny.gguf compiled for
# rigs/cmp-100-210-x4.toml --ptx (default and --precise; one prefill and prefill 17 + decode); serve_smoke.sh
# on that rig with --ptx; per preset: compile --gpus 1 --ptx and `qrig bench -p 512,4096 -n 128`. Logs under
# $OUT/cmp70 (or ./gpu-out/cmp70); a table is printed last; exit 1 when a step fails.
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
nv=${1:?usage: cmp_family.sh NVRTC11_DIR [presets...]}
shift
presets=("$@")
[[ ${#presets[@]} -eq 0 ]] && presets=(9b)
nv=$(cd "$nv" && pwd)
ln -sf libnvrtc.so.11.8.89 "$nv/libnvrtc.so.11.2"
ln -sf libnvrtc-builtins.so.11.8.89 "$nv/libnvrtc-builtins.so.11.8"
bundle=""
for c in "$root/build-gpu/gpu-bundle" "$root/build/gpu-bundle"; do [[ -x "$c/qrig" ]] && { bundle=$c; break; }; done
[[ -z "$bundle" ]] && { echo "cmp_family.sh: no gpu-bundle/qrig" >&2; exit 2; }
# NVRTC 11.8 finds its builtins library through the loader path; qrig finds both NVRTCs (QRIG_NVRTC
# replaces its search: 11.8 for the sm_70 family, the toolkit's for this GPU's own architecture).
toolkit_nvrtc=$(ls /usr/local/cuda/lib64/libnvrtc.so.1[0-9]* /usr/local/cuda/lib/libnvrtc.so.1[0-9]* 2>/dev/null | head -1)
export QRIG_NVRTC="$nv/libnvrtc.so.11.8.89${toolkit_nvrtc:+:$toolkit_nvrtc}"
export LD_LIBRARY_PATH="$nv:$bundle/qrig-libs:$bundle${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
export XDG_CACHE_HOME=${QRIG_GPU_CACHE:-${TMPDIR:-/tmp}/qrig-gpu-cache}
qrig="$bundle/qrig"
shared=${QRIG_SHARED_DIR:-$root/../shared}
out=${OUT:-$PWD/gpu-out}/cmp70
models=${QRIG_MODEL_DIR:-/tmp/qrig-models}
reps=${QRIG_BENCH_REPS:-2}
rig="$root/rigs/cmp-100-210-x4.toml"
mkdir -p "$out" "$models"
status=0
declare -a lines
run() {  # run NAME CMD...: log to $out/NAME.log, remember the outcome and the log's last line
  local name=$1; shift
  local t0=$SECONDS
  "$@" >"$out/$name.log" 2>&1
  local rc=$?
  lines+=("| $name | $([[ $rc -eq 0 ]] && echo ok || echo "FAILED ($rc)") | $((SECONDS - t0)) s | $(grep -v '^ *$' "$out/$name.log" | tail -1 | cut -c1-160) |")
  [[ $rc -ne 0 ]] && status=1
  return $rc
}

run toolchain "$qrig" probe -o "$out/rig-probed.toml"
run gpu_tests env QRIG_GPU_TEST_FAMILY=sm_70 QRIG_GPU_REPORT="$out/gpu_report.md" "$bundle/qrig_tests_gpu" "[gpu]"
for precise in "" "--precise"; do
  for split in 0 17; do
    run "verify${precise:+_precise}_split$split" "$qrig" verify "$shared/fixtures/tiny.gguf" "$shared/fixtures/tiny-ref.gguf" \
      --rig "$rig" --ptx --split $split $precise
  done
done
run serve_smoke env QRIG_SHARED_DIR="$shared" OUT="$out" bash "$root/tests/gpu/serve_smoke.sh" "$rig" --ptx
for p in "${presets[@]}"; do
  gguf="$models/$p.gguf"
  [[ -f "$gguf" ]] || run "synth_$p" "$qrig" synth --preset "$p" -o "$gguf"
  run "compile_$p" "$qrig" compile "$gguf" --rig "$rig" --gpus 1 --ptx --ctx 5120 --parallel 1 -o "$models/plan-$p-cmp70" &&
    run "bench_$p" "$qrig" bench "$models/plan-$p-cmp70" -p 512,4096 -n 128 -r "$reps" --json "$out/bench_$p.json"
done

{
  echo
  echo "### The sm_70 family as PTX on $(nvidia-smi --query-gpu=name --format=csv,noheader | head -1) (tests/gpu/cmp_family.sh)"
  grep -E "^(driver|nvrtc|kernels)" "$out/toolchain.log"
  grep -E "All tests passed|test cases:" "$out/gpu_tests.log" | tail -1
  for f in "$out"/verify*.log; do echo "$(basename "$f"): $(tail -1 "$f")"; done
  grep '^|' "$out/serve_smoke.log"
  for p in "${presets[@]}"; do [[ -f "$out/bench_$p.log" ]] && grep -E '^\||^steps:|^backend|kernels' "$out/bench_$p.log"; done
  echo
  echo "| step | result | time | last line |"
  echo "|---|---|---|---|"
  printf '%s\n' "${lines[@]}"
} | tee "$out/summary.md"
exit $status
