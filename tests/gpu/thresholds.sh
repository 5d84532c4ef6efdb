#!/usr/bin/env bash
# Issue 21's GPU checks in one call, with the gpu-bundle built here (ninja -C build qrig_tests_gpu):
#   1. qrig_tests_gpu "[broken]": deliberately broken kernels (tests/gpu/broken_kernels.h: the GEMV, the GEMM
#      tiled and skinny, GDN recurrent and chunked, attention decode, prefill and the split-KV merge) must miss
#      the real tests' thresholds ("caught"), the unpatched templates through the same path must pass ("ok").
#   2. qrig_tests_gpu "[layers]": the precise CUDA plan of the tiny fixture against its CPU emulation, layer by
#      layer (hidden.0 .. hidden.N, logits), prefill and prefill + decode; the first tap over its threshold.
# QRIG_GPU_TEST_FAMILY=sm_70 runs both with the CMP's sm_70 kernels as PTX. About 2-3 minutes on an H200 (most of
# it NVRTC compiling the ~60 broken variants; nothing of them is cached). Logs under $OUT: thresholds_tests.log,
# thresholds_report.md (every row). A short table is printed last; exit status non-zero when a check failed.
set -uo pipefail
source "$(dirname "$0")/bundle_env.sh" thresholds.sh
mkdir -p "$out"
export QRIG_GPU_REPORT=$out/thresholds_report.md
: >"$QRIG_GPU_REPORT"
start=$(date +%s)
"$tests" "[broken],[layers]" >"$out/thresholds_tests.log" 2>&1
rc=$?
{
  echo "family: ${QRIG_GPU_TEST_FAMILY:-native}; $(( $(date +%s) - start )) s; exit $rc; $(grep -E 'All tests passed|test cases:' "$out/thresholds_tests.log" | tail -1 | sed 's/^ *//')"
  echo "| op | shape | measure | value | threshold | |"
  echo "|---|---|---|---|---|---|"
  grep -E '^\| (gemv|gemm|gdn|attn)[a-z0-9_]*, bug: |^\| model layers' "$QRIG_GPU_REPORT"
} | tee "$out/thresholds_summary.md"
exit $rc
