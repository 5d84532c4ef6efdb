#!/usr/bin/env bash
# Hardware counters of single decode kernels (Nsight Compute) on a GPU machine whose runtime lets ncu read them
# (the H200 machines on Firecracker: /work/.library/device/KINDS.md), with the gpu-bundle built here. Usage:
#   tests/gpu/ncu.sh TARGET...   TARGET: wq:TYPE[:SHAPE]  the block-type GEMV the plans choose for TYPE (Q4_K, Q6_K,
#                                         ...), one plane, SHAPE 1..3 = 4096->12288, 12288->4096, 4096->4096 (default 1)
#                                q8[:SHAPE]  the Q8_0 GEMV of the plans (r1 u2 t256), two planes (decode), same shapes
# Each target profiles one launch (the 11th of its shape: past the warm-up of the benchmark's weight copies) of a
# micro-benchmark (the "[.bench]" GEMV tests, QRIG_BENCH_TYPES restricting the block types), with the clocks left
# alone (--clock-control none, METHOD.md). Per target: ncu-TARGET.txt under $OUT (speed of light, occupancy, launch,
# scheduler and warp-state statistics, instruction and memory tables), and a short table printed last.
set -uo pipefail
source "$(dirname "$0")/bundle_env.sh" ncu.sh
mkdir -p "$out"
ncu_bin=$(command -v ncu || true)
[[ -z "$ncu_bin" ]] && for c in /usr/local/cuda/bin/ncu /opt/nvidia/nsight-compute/*/ncu; do [[ -x "$c" ]] && ncu_bin=$c; done
[[ -z "$ncu_bin" ]] && { echo "ncu.sh: no ncu on this machine"; exit 2; }
sections=(--section SpeedOfLight --section Occupancy --section LaunchStats --section SchedulerStats
          --section WarpStateStats --section InstructionStats --section MemoryWorkloadAnalysis)
summary=("| target | kernel | duration | DRAM % of peak | issue slots busy | warps per scheduler | top stall |" "|---|---|---|---|---|---|---|")
for target in "$@"; do
  IFS=: read -r kind a b <<<"$target"
  case $kind in
    wq)
      shape=${b:-1}
      # Launches of gemm_wq_dp4a_skinny per shape for a K-quant (144..210 bytes per 256 values at these shapes):
      # copies + 200 (copies = 2 GiB / matrix bytes + 1). Counted from the benchmark's own rule.
      bpb=$(case $a in Q4_K) echo 144;; Q5_K) echo 176;; Q6_K) echo 210;; Q2_K) echo 84;; Q3_K) echo 110;; Q4_0|IQ4_NL) echo 144;; *) echo 0;; esac)
      [[ $bpb == 0 ]] && { summary+=("| $target | unknown type |"); continue; }
      per=() ; for s in "4096 12288" "12288 4096" "4096 4096"; do
        read -r k n <<<"$s"; bytes=$(( n * k / 256 * bpb )); copies=$(( (2 << 30) / bytes + 1 )); (( copies < 2 )) && copies=2
        iters=$(( copies > 200 ? copies : 200 )); per+=($(( copies + iters )))
      done
      skip=10; for (( i = 1; i < shape; ++i )); do skip=$(( skip + per[i-1] )); done
      name=gemm_wq_dp4a_skinny
      cmd=(env QRIG_BENCH_TYPES="$a" "$tests" "block-type GEMV bandwidth at 9B shapes") ;;
    q8)
      shape=${a:-1}
      # gemv_q8_0_dp4a: per shape 18 variants (r 1,2,4 x u 2,4,8 x t 128,256) x (copies + iters) launches for one
      # plane, then the same for two; the plans' r1 u2 t256 is the second variant.
      per=(); for s in "4096 12288" "12288 4096" "4096 4096"; do
        read -r k n <<<"$s"; bytes=$(( n * k + n * k / 32 * 2 )); copies=$(( (2 << 30) / bytes + 1 ))
        iters=$(( copies > 200 ? copies : 200 )); per+=($(( copies + iters )))
      done
      skip=0; for (( i = 1; i < shape; ++i )); do skip=$(( skip + 36 * per[i-1] )); done
      skip=$(( skip + 18 * per[shape-1] + per[shape-1] + 10 ))
      name=gemv_q8_0_dp4a
      cmd=("$tests" "decode GEMV bandwidth at 9B shapes") ;;
    *) summary+=("| $target | unknown target |"); continue ;;
  esac
  log="$out/ncu-${target//:/_}.txt"
  "$ncu_bin" --clock-control none --kernel-name "$name" --launch-skip "$skip" --launch-count 1 "${sections[@]}" \
    "${cmd[@]}" >"$log" 2>&1
  rc=$?
  pick() { grep -E "^\s+$1 " "$log" | head -1 | awk '{print $NF}'; }
  stall=$(grep -iE "Stall|stalled" "$log" | grep -E "cycles|%" | head -1 | sed 's/^ *//' | cut -c1-90)
  summary+=("| $target (rc $rc) | $name, launch $skip | $(pick Duration) | $(pick 'DRAM Throughput') | $(pick 'Issue Slots Busy') | $(pick 'Active Warps Per Scheduler') | ${stall:-see log} |")
done
printf '%s\n' "${summary[@]}" | tee "$out/ncu_summary.md"
