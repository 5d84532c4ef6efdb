#!/usr/bin/env bash
# Issue 21's GPU checks in one call, with the gpu-bundle built here (ninja -C build qrig_tests_gpu):
#   1. qrig_tests_gpu "[broken]": deliberately broken kernels (tests/gpu/broken_kernels.h: the GEMV, the GEMM
#      tiled and skinny, GDN recurrent and chunked, attention decode, prefill and the split-KV merge) must miss
#      the real tests' thresholds ("caught"), the unpatched templates through the same path must pass ("ok").
#   2. qrig_tests_gpu "[layers]": the precise CUDA plan of the tiny fixture against its CPU emulation, layer by
#      layer (hidden.0 .. hidden.N, logits), prefill and prefill + decode; the first tap over its threshold. And
#      the same comparison with the plan's attn_prefill broken (causal mask off by one, through a scratch cubin
#      cache) must first fail at the first attention layer's output ("caught").
# Usage: tests/gpu/thresholds.sh [NVRTC11_DIR]   with NVRTC11_DIR (as cmp_family.sh: libnvrtc.so.11.8.89 and its
# builtins), both run a second time with the CMP's sm_70 kernels as PTX (QRIG_GPU_TEST_FAMILY=sm_70).
# About a minute or two per family on an H200 (most of it NVRTC compiling the ~40 broken variants, which are never
# cached). Logs under $OUT (or ./gpu-out): thresholds_<family>.log, thresholds_report.md (every row). A short table
# is printed last (thresholds_summary.md); exit status non-zero when a check failed.
set -uo pipefail
source "$(dirname "$0")/bundle_env.sh" thresholds.sh
mkdir -p "$out"
export QRIG_GPU_REPORT=$out/thresholds_report.md
: >"$QRIG_GPU_REPORT"
status=0
summary=()
run_family() {  # run_family NAME: the two tag sets, under the environment set by the caller
  local start rc
  start=$(date +%s)
  echo "| family $1 | | | | | |" >>"$QRIG_GPU_REPORT"
  "$tests" "[broken],[layers]" >"$out/thresholds_$1.log" 2>&1
  rc=$?
  [[ $rc -ne 0 ]] && status=1
  summary+=("family $1: $(( $(date +%s) - start )) s, exit $rc, $(grep -E 'All tests passed|test cases:' "$out/thresholds_$1.log" | tail -1 | sed 's/^ *//')")
}
run_family native
if [[ -n "${1:-}" ]]; then
  nv=$(cd "$1" && pwd)
  ln -sf libnvrtc.so.11.8.89 "$nv/libnvrtc.so.11.2"
  ln -sf libnvrtc-builtins.so.11.8.89 "$nv/libnvrtc-builtins.so.11.8"
  toolkit_nvrtc=$(ls /usr/local/cuda/lib64/libnvrtc.so.1[0-9]* /usr/local/cuda/lib/libnvrtc.so.1[0-9]* 2>/dev/null | head -1)
  QRIG_NVRTC="$nv/libnvrtc.so.11.8.89${toolkit_nvrtc:+:$toolkit_nvrtc}" LD_LIBRARY_PATH="$nv:$LD_LIBRARY_PATH" \
    QRIG_GPU_TEST_FAMILY=sm_70 run_family sm_70
fi
{
  printf '%s\n' "${summary[@]}"
  echo "| op | shape | measure | value | threshold | |"
  echo "|---|---|---|---|---|---|"
  grep -E '^\| family |^\| (gemv|gemm|gdn|attn)[a-z0-9_]*, bug: |^\| model layers' "$QRIG_GPU_REPORT"
} | tee "$out/thresholds_summary.md"
exit $status
