#!/usr/bin/env bash
# Runs the GPU tests on a GPU machine. Builds nothing: build on the build machine (ninja qrig_tests_gpu) and
# bring <build>/gpu-bundle/ along (the binary, with libstdc++ linked in, and libfmt; NVRTC comes from the
# GPU machine's CUDA 13 toolkit). Usage:
#   tests/gpu/run.sh [path/to/qrig_tests_gpu]   (default: build-gpu/gpu-bundle/, then build/gpu-bundle/)
# Steps: every "[gpu]" test (kernels vs CPU reference ops at 9B shapes, the CUDA layer), compute-sanitizer
# memcheck (and racecheck) on the short "[short]" subset when compute-sanitizer is installed, the decode GEMV
# micro-benchmark ("[bench]"), then `qrig probe -o rig.toml` when the bundle has the qrig binary. Kernels
# compile into a cache under /tmp (kept between the steps). Logs go to $OUT (or ./gpu-out): gpu_tests.log,
# gpu_report.md (error per op and threshold), memcheck.log, racecheck.log, bench.log, bench_gemv.md,
# probe.log, rig.toml, kernels.tar.gz (cubins, PTX, ptxas reports), summary.md. A short table is printed
# last. Exit status: non-zero when a test, a sanitizer check or the probe failed. QRIG_GPU_SANITIZE=0 and
# QRIG_GPU_BENCH=0 skip the sanitizers and the micro-benchmarks (to save device time); QRIG_GPU_SANITIZERS
# names the tools (default "memcheck racecheck"). Model-level checks and
# benchmarks (qrig verify / qrig bench) are tests/gpu/bench.sh.
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
bin=${1:-}
if [[ -z "$bin" ]]; then
  for c in "$root/build-gpu/gpu-bundle/qrig_tests_gpu" "$root/build/gpu-bundle/qrig_tests_gpu" \
           "$root/build-gpu/qrig_tests_gpu" "$root/build/qrig_tests_gpu"; do
    [[ -x "$c" ]] && { bin=$c; break; }
  done
fi
if [[ -z "$bin" || ! -x "$bin" ]]; then
  echo "run.sh: no qrig_tests_gpu binary (give its path; build it with: cmake -S . -B build-gpu -G Ninja && ninja -C build-gpu qrig_tests_gpu)" >&2
  exit 2
fi
# libfmt beside the binary; NVRTC from the CUDA toolkit wherever this image keeps it.
for d in "$(dirname "$bin")" /usr/local/cuda/lib64 /usr/local/cuda/lib; do
  [[ -d "$d" ]] && LD_LIBRARY_PATH="$d${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
done
export LD_LIBRARY_PATH
out=${OUT:-$PWD/gpu-out}
mkdir -p "$out"
export XDG_CACHE_HOME=${QRIG_GPU_CACHE:-${TMPDIR:-/tmp}/qrig-gpu-cache}
export QRIG_GPU_REPORT=$out/gpu_report.md
export QRIG_BENCH_OUT=$out/bench_gemv.md
: >"$QRIG_GPU_REPORT"
printf '| op | shape | measure | value | threshold | |\n|---|---|---|---|---|---|\n' >"$QRIG_GPU_REPORT"

{
  echo "binary: $bin"
  nvidia-smi --query-gpu=index,name,compute_cap,memory.total,driver_version --format=csv 2>&1 || echo "(no nvidia-smi)"
  missing=$(ldd "$bin" 2>/dev/null | grep "not found")
  [[ -n "$missing" ]] && echo "missing shared libraries (set LD_LIBRARY_PATH to the CUDA lib directory):" && echo "$missing"
} | tee "$out/gpu_tests.log"

# Catch2's last line: "All tests passed (N assertions in M test cases)" or "test cases: M | P passed | F failed".
summary_of() { grep -E "All tests passed|test cases:" "$1" | tail -1 | sed 's/^ *//; s/ *| */, /g'; }

status=0
"$bin" "[gpu]" 2>&1 | tee -a "$out/gpu_tests.log"
tests_rc=${PIPESTATUS[0]}
[[ $tests_rc -ne 0 ]] && status=1
tests_line="$(summary_of "$out/gpu_tests.log") (exit $tests_rc)"

sanitizer=$(command -v compute-sanitizer || true)
[[ -z "$sanitizer" && -x /usr/local/cuda/bin/compute-sanitizer ]] && sanitizer=/usr/local/cuda/bin/compute-sanitizer
declare -A san_line
for tool in ${QRIG_GPU_SANITIZERS:-memcheck racecheck}; do
  if [[ "${QRIG_GPU_SANITIZE:-1}" == 0 ]]; then
    san_line[$tool]="skipped (QRIG_GPU_SANITIZE=0)"
    continue
  fi
  if [[ -z "$sanitizer" ]]; then
    san_line[$tool]="not run: compute-sanitizer not found"
    continue
  fi
  env -u QRIG_GPU_REPORT "$sanitizer" --tool "$tool" --error-exitcode 86 --print-limit 50 "$bin" "[short]" \
    >"$out/$tool.log" 2>&1
  rc=$?
  errors=$(grep -Eo "ERROR SUMMARY: [0-9]+ error|RACECHECK SUMMARY: [0-9]+ hazard[s]? displayed \([0-9]+ error" "$out/$tool.log" | tail -1)
  if [[ $rc -eq 0 ]]; then
    san_line[$tool]="clean: ${errors:-no summary} ; $(summary_of "$out/$tool.log")"
  elif grep -q "Device not supported" "$out/$tool.log"; then
    san_line[$tool]="not available: compute-sanitizer says 'Device not supported' (gVisor machines)"
  else
    san_line[$tool]="FAILED (exit $rc): ${errors:-see log} ; $(summary_of "$out/$tool.log")"
    status=1
  fi
done

export QRIG_BENCH_GEMM_OUT=$out/bench_gemm.md QRIG_BENCH_GDN_OUT=$out/bench_gdn.md QRIG_BENCH_ATTN_OUT=$out/bench_attention.md
if [[ "${QRIG_GPU_BENCH:-1}" == 0 ]]; then
  bench_line="skipped (QRIG_GPU_BENCH=0)"
else
  "$bin" "[bench]" >"$out/bench.log" 2>&1
  bench_rc=$?
  if [[ $bench_rc -eq 0 ]]; then bench_line="ran, tables in bench_*.md"; else bench_line="FAILED (exit $bench_rc)"; status=1; fi
fi

# `qrig probe` from the same bundle (its shared libraries in qrig-libs/, for qrig only): this machine's rig.
qrig_bin="$(dirname "$bin")/qrig"
rm -f "$out/probe.log" "$out/rig.toml"
if [[ -x "$qrig_bin" ]]; then
  LD_LIBRARY_PATH="$(dirname "$bin")/qrig-libs:$LD_LIBRARY_PATH" "$qrig_bin" probe -o "$out/rig.toml" >"$out/probe.log" 2>&1
  probe_rc=$?
  if [[ $probe_rc -eq 0 ]]; then probe_line="ran, rig in rig.toml"; else probe_line="FAILED (exit $probe_rc)"; status=1; fi
else
  probe_line="not run: no qrig binary beside $bin"
fi

tar -czf "$out/kernels.tar.gz" -C "$XDG_CACHE_HOME" qrig 2>/dev/null || true

{
  echo
  echo "### Kernel vs CPU reference (gpu_report.md)"
  cat "$QRIG_GPU_REPORT"
  if [[ -f "$QRIG_BENCH_OUT" ]]; then
    echo
    sed -n '/### Best GEMV tiling per shape/,$p' "$QRIG_BENCH_OUT"
    grep -m1 "device-to-device copy" "$QRIG_BENCH_OUT"
  fi
  if [[ -f "$out/probe.log" ]]; then
    echo
    echo "### qrig probe (probe.log)"
    cat "$out/probe.log"
  fi
  echo
  echo "### GPU run summary"
  echo "| step | result | log |"
  echo "|---|---|---|"
  echo "| gpu tests [gpu] | $tests_line | gpu_tests.log |"
  echo "| compute-sanitizer memcheck [short] | ${san_line[memcheck]:-not run} | memcheck.log |"
  echo "| compute-sanitizer racecheck [short] | ${san_line[racecheck]:-not run (QRIG_GPU_SANITIZERS)} | racecheck.log |"
  echo "| GEMV micro-benchmark [bench] | $bench_line | bench.log |"
  echo "| qrig probe -o rig.toml | $probe_line | probe.log |"
} | tee "$out/summary.md"
exit $status
