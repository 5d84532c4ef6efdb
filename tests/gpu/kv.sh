#!/usr/bin/env bash
# The quantized KV cache on a GPU machine (issue 19, "GPU run: quantized KV cache and 256K contexts"), with the
# gpu-bundle built here (ninja -C build qrig_tests_gpu: the test binary and qrig). Usage:
#   tests/gpu/kv.sh [STEPS]        STEPS: a comma list of the steps below (default all: 1,1l,2,3,4,5,6,6p,6g,6b,7; "quick"
#                                  is 1,1l,2,3,4,5). A device call runs at most 10 minutes: run e.g. "1", "1l,2",
#                                  "3,4,5", "6", "7" as separate calls on one warm machine (the kernel cache under
#                                  /tmp, the models and $OUT's reports are kept between them when $OUT is).
# Steps, logs under $OUT (default ./gpu-out):
#   1. qrig_tests_gpu "[kv]~[long]~[long262k]~[bench]": kv_write, decode and prefill attention over every format vs
#      the CPU reference ops at 9B/27B shapes to 1.6K keys (gpu_kv_tests.log, kv_report.md: error per case).
#   1l. "[kv][long]": decode over 32K, 128K and 256K quantized keys, prefill at 32K (gpu_kv_tests_long.log).
#   2. compute-sanitizer memcheck (and racecheck) of "[kv][short]" when installed.
#   3. qrig probe -> rig.toml; qrig verify of fixtures/tiny.gguf vs tiny-ref.gguf at every format on the GPU and
#      on the CPU backend (the GPU's numbers should be the CPU's for that format: same formats, same rotation),
#      prefill and --split 17 (decode steps).
#   4. The 262144-token context: "[long262k]" (prefill 262144 tokens, decode 8; k8v3 and k3v3 vs k16v16).
#   5. compute-sanitizer memcheck of one short quantized-cache verify (k8v3, --split 17).
#   6. 9B Q8_0 synth: qrig bench -n 128 -d 0,32768,131072,262144 for k16v16 (fits an H200), k8v8, k8v3, k3v3
#      ($QRIG_KV_FORMATS and $QRIG_KV_DEPTHS narrow it: a fill of 262144 tokens takes minutes; each depth is
#      filled once per format). 6p: -p 4096 -d 32768 for the same formats. 6g: a plan of the 9B limited to 16 GiB
#      (rig16.toml: the probed GPU with memory_gib = 16, the CMP card's) at --ctx 262144, inspected, decoding at
#      depth 261888.
#   6b. the attention decode micro-benchmark over every pair to 256K keys ("[bench][kv]": GB/s of the rows read,
#      % of $QRIG_PEAK_GBPS, default 4300: bench_kv_attention.md): the plans' kernels (attn_decode_dp4a, the int8
#      query, over quantized keys), and k8v8/k8v3/k3v3 at 256K with the fp32-query attn_decode for comparison.
#   7. 27B Q8_0 synth (a 27 GB file; QRIG_KV_27B=0 skips): qrig bench -n 128 -d 32768,131072 for k16v16 and k8v3.
# Targets (issue 23): decode at 32K with k8v3 >= 0.9x k16v16; at 256K the attention kernels read the quantized
# cache at >= 70% of the copy bandwidth (the bench's decode rate at depth 262144 against depth 0 gives the
# attention's share; nsys/ncu give the kernels' bandwidth). A short table is printed last; exit non-zero when a
# test, a sanitizer or a verify failed.
set -uo pipefail
source "$(dirname "$0")/bundle_env.sh" kv.sh
models=${QRIG_MODEL_DIR:-/tmp/qrig-models}
reps=${QRIG_BENCH_REPS:-2}
mkdir -p "$out" "$models"
export QRIG_GPU_REPORT=$out/kv_report.md
[[ -s "$QRIG_GPU_REPORT" ]] || printf '| op | shape | measure | value | threshold | |\n|---|---|---|---|---|---|\n' >"$QRIG_GPU_REPORT"
steps=${1:-1,1l,2,3,4,5,6,6p,6g,6b,7}
[[ "$steps" == quick ]] && steps=1,1l,2,3,4,5
want() { [[ ",$steps," == *",$1,"* ]]; }
status=0
summary=()
add() { summary+=("| $1 | $2 |"); }

if want 1; then
"$tests" "[kv]~[long]~[long262k]~[bench]" >"$out/gpu_kv_tests.log" 2>&1
rc=$?
[[ $rc -ne 0 ]] && status=1
add "gpu tests [kv] (write, decode, prefill vs CPU reference, to 1.6K keys)" "$( [[ $rc == 0 ]] && echo ok || echo FAIL): $(catch2_line "$out/gpu_kv_tests.log")"
fi
if want 1l; then
"$tests" "[kv][long]" >"$out/gpu_kv_tests_long.log" 2>&1
rc=$?
[[ $rc -ne 0 ]] && status=1
add "gpu tests [kv][long] (decode over 32K/128K/256K keys, prefill at 32K)" "$( [[ $rc == 0 ]] && echo ok || echo FAIL): $(catch2_line "$out/gpu_kv_tests_long.log")"
fi

# 2
if ! want 2; then
  :
elif [[ -n "$sanitizer" ]]; then
  for tool in memcheck racecheck; do
    "$sanitizer" --tool $tool --error-exitcode 3 "$tests" "[kv][short]" >"$out/${tool}_kv.log" 2>&1
    rc=$?
    [[ $rc -ne 0 ]] && status=1
    add "$tool [kv][short]" "$( [[ $rc == 0 ]] && echo ok || echo FAIL) ($(grep -E 'ERROR SUMMARY|RACECHECK SUMMARY' "$out/${tool}_kv.log" | tail -1))"
  done
else
  add "compute-sanitizer" "not installed"
fi

# 3 (every later step needs the probed rig.toml)
[[ -f "$out/rig.toml" ]] || "$qrig" probe -o "$out/rig.toml" >"$out/probe.log" 2>&1 || { add probe FAIL; status=1; }
want 3 && for kv in k16v16 k8v8 k8v4 k8v3 k4v4 k4v3 k3v3; do
  for split in "" 17; do
    tag="${kv}${split:+_split$split}"
    "$qrig" verify "$shared/fixtures/tiny.gguf" "$shared/fixtures/tiny-ref.gguf" --rig "$out/rig.toml" --kv $kv \
      ${split:+--split $split} >"$out/verify_gpu_$tag.log" 2>&1
    rc=$?
    [[ $rc -ne 0 ]] && status=1
    "$qrig" verify "$shared/fixtures/tiny.gguf" "$shared/fixtures/tiny-ref.gguf" --backend cpu --kv $kv \
      ${split:+--split $split} >"$out/verify_cpu_$tag.log" 2>&1
    add "verify tiny $tag" "gpu $( [[ $rc == 0 ]] && echo ok || echo FAIL): $(tail -1 "$out/verify_gpu_$tag.log"); cpu: $(tail -1 "$out/verify_cpu_$tag.log")"
  done
done

# 4
if want 4; then
"$tests" "[long262k]" >"$out/gpu_kv_long.log" 2>&1
rc=$?
[[ $rc -ne 0 ]] && status=1
add "262144-token context (tiny, k8v3/k3v3 vs k16v16)" "$( [[ $rc == 0 ]] && echo ok || echo FAIL): $(catch2_line "$out/gpu_kv_long.log"); $(grep -E '^\| 262144' "$out/gpu_kv_long.log" | awk -F'|' '{printf "%s %s %s;", $3, $4, $5}')"
fi

# 5
if want 5 && [[ -n "$sanitizer" ]]; then
  "$sanitizer" --tool memcheck --error-exitcode 3 "$qrig" verify "$shared/fixtures/tiny.gguf" \
    "$shared/fixtures/tiny-ref.gguf" --rig "$out/rig.toml" --kv k8v3 --split 17 >"$out/memcheck_verify_k8v3.log" 2>&1
  rc=$?
  [[ $rc -ne 0 ]] && status=1
  add "memcheck, verify k8v3 --split 17" "$( [[ $rc == 0 ]] && echo ok || echo FAIL) ($(grep -E 'ERROR SUMMARY' "$out/memcheck_verify_k8v3.log" | tail -1))"
fi

bench_row() { grep -E '^\| [^|]+ \| [0-9.]+ GiB' "$1" | awk -F'|' '{printf "%s %s;", $6, $7}'; }

kv_formats=${QRIG_KV_FORMATS:-k16v16 k8v8 k8v3 k3v3}
kv_depths=${QRIG_KV_DEPTHS:-0,32768,131072,262144}
if want 6 || want 6p || want 6g; then
  [[ -f "$models/9b.gguf" ]] || "$qrig" synth --preset 9b -o "$models/9b.gguf" >"$out/synth9b.log" 2>&1
fi
if want 6; then
  for kv in $kv_formats; do
    "$qrig" bench "$models/9b.gguf" --rig "$out/rig.toml" --kv $kv -p 0 -n 128 -d "$kv_depths" -r "$reps" \
      --json "$out/bench9b_$kv.json" >"$out/bench9b_$kv.md" 2>&1
    add "bench 9B $kv tg128 @ d$kv_depths" "$(bench_row "$out/bench9b_$kv.md")"
  done
fi
if want 6p; then
  for kv in $kv_formats; do
    "$qrig" bench "$models/9b.gguf" --rig "$out/rig.toml" --kv $kv -p 4096 -n 0 -d 32768 -r "$reps" \
      --json "$out/bench9b_${kv}_pp.json" >"$out/bench9b_${kv}_pp.md" 2>&1
    add "bench 9B $kv pp4096 @ d32K" "$(bench_row "$out/bench9b_${kv}_pp.md")"
  done
fi
if want 6g; then
  sed -E 's/^([[:space:]]*)memory_gib[[:space:]]*=.*/\1memory_gib = 16.0/' "$out/rig.toml" >"$out/rig16.toml"
  "$qrig" compile "$models/9b.gguf" --rig "$out/rig16.toml" --ctx 262144 --parallel 1 -o "$out/plan9b_16g" \
    >"$out/compile9b_16g.log" 2>&1
  rc=$?
  [[ $rc -ne 0 ]] && status=1
  "$qrig" inspect "$out/plan9b_16g" >"$out/inspect9b_16g.log" 2>&1
  "$qrig" bench "$out/plan9b_16g" -p 0 -n 128 -d 261888 -r 1 >"$out/bench9b_16g.md" 2>&1
  add "9B in 16 GiB at ctx 262144" "compile $( [[ $rc == 0 ]] && echo ok || echo FAIL): $(grep -E '^kv cache' "$out/inspect9b_16g.log" | head -1); tg128 @ d261888: $(bench_row "$out/bench9b_16g.md")"
fi
if want 6b; then
  # 6b
  QRIG_BENCH_KV_OUT=$out/bench_kv_attention.md "$tests" "[bench][kv]" >"$out/bench_kv_attention.log" 2>&1
  add "attention decode GB/s, 9B k8v3 @ 32K/128K/256K (int8 query)" "$(grep -E '^\| 9B \| decode k8v3 .*attn_decode_dp4a' "$out/bench_kv_attention.md" 2>/dev/null | awk -F'|' '{printf "%s %s;", $6, $7}')"
  add "attention decode, 9B @ 256K: pair kernel GB/s %" "$(grep -E '^\| 9B \| decode k[0-9]+v[0-9]+ pos0=262143' "$out/bench_kv_attention.md" 2>/dev/null | awk -F'|' '{split($3, w, " "); k = $4 ~ /dp4a/ ? "int8q" : "fp32q"; printf "%s %s %s %s;", w[2], k, $6, $7}')"

fi
if want 7; then
  if [[ "${QRIG_KV_27B:-1}" != 0 ]]; then
    [[ -f "$models/27b.gguf" ]] || "$qrig" synth --preset 27b -o "$models/27b.gguf" >"$out/synth27b.log" 2>&1
    for kv in k16v16 k8v3; do
      "$qrig" bench "$models/27b.gguf" --rig "$out/rig.toml" --kv $kv -n 128 -d 32768,131072 -r "$reps" \
        --json "$out/bench27b_$kv.json" >"$out/bench27b_$kv.md" 2>&1
      add "bench 27B $kv tg128 @ d32K,128K" "$(bench_row "$out/bench27b_$kv.md")"
    done
  fi
fi

{
  echo "| step | result |"
  echo "|---|---|"
  printf '%s\n' "${summary[@]}"
} | tee "$out/kv_summary.md"
exit $status
