#!/usr/bin/env bash
# The pipeline on a GPU machine (issue "GPU run: the pipeline"), with the gpu-bundle built here (ninja -C build
# qrig_tests_gpu). On a one-GPU machine every stage goes on GPU 0 (rig entries with ordinal = 0): the bridges still
# cross through pinned host memory. Usage: tests/gpu/pipeline.sh [speed|speed2]   ("speed": the 9B benchmarks on
# stages sharing GPU 0; "speed2", on a machine of two or more GPUs: 27B and 9B on 1 GPU vs split over 2, also at a
# simulated 0.25 GB/s link: the targets 27B pp4096 >= 1.8x, tg >= 0.95x)
# Steps, logs under $OUT:
#   1. qrig_tests_gpu "[pipeline],[memory]": CUDA stages vs the one-stage plan, thousands of hand-offs under random
#      delays bit for bit, snapshots, a failing stage; what the runtime takes beyond the plan.
#   2. qrig probe -> rig1.toml; rig2/rig3.toml: the same GPU listed 2 and 3 times with ordinal = 0.
#   3. qrig verify of tiny.gguf on 1-, 2- and 3-stage plans (logits dumped; the split plans' dumps compared with
#      the one-stage one: bit for bit when verify's steps run the same kernels).
#   4. compute-sanitizer memcheck of the 3-stage verify (when installed).
#   5. serve_smoke.sh on the 2-stage rig (engine and server on a split plan).
#   6. speed: 9B synth, qrig bench -p 512,4096 -n 128 on 1 stage and on 2 stages (same GPU), and on 2 stages with
#      the bridge held to a simulated 0.25 GB/s link.
# A short table is printed last.
set -uo pipefail
root=$(cd "$(dirname "$0")/../.." && pwd)
bundle=""
for c in "$root/build-gpu/gpu-bundle" "$root/build/gpu-bundle"; do [[ -x "$c/qrig" ]] && { bundle=$c; break; }; done
[[ -z "$bundle" ]] && { echo "pipeline.sh: no gpu-bundle (build it: ninja -C build qrig_tests_gpu)" >&2; exit 2; }
for d in "$bundle" "$bundle/qrig-libs" /usr/local/cuda/lib64 /usr/local/cuda/lib; do
  [[ -d "$d" ]] && LD_LIBRARY_PATH="$d${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
done
export LD_LIBRARY_PATH
export XDG_CACHE_HOME=${QRIG_GPU_CACHE:-${TMPDIR:-/tmp}/qrig-gpu-cache}
qrig="$bundle/qrig"
shared=${QRIG_SHARED_DIR:-$root/../shared}
export QRIG_SHARED_DIR=$shared
out=${OUT:-$PWD/gpu-out}
mkdir -p "$out"
export QRIG_GPU_REPORT=$out/pipeline_report.md
: >"$QRIG_GPU_REPORT"
summary=()
add() { summary+=("| $1 | $2 |"); }

# 1
"$bundle/qrig_tests_gpu" "[pipeline],[memory]" >"$out/gpu_pipeline_tests.log" 2>&1
add "gpu tests [pipeline],[memory]" "$( [[ $? == 0 ]] && echo ok || echo FAIL) ($(grep -E 'test cases' "$out/gpu_pipeline_tests.log" | tail -1))"

# 2
"$qrig" probe -o "$out/rig1.toml" >"$out/probe.log" 2>&1 || add probe FAIL
python3 - "$out" <<'EOF'
import re, sys
out = sys.argv[1]
text = open(f"{out}/rig1.toml").read()
head, _, dev = text.partition("[[device]]")
dev = "[[device]]" + dev.split("[[link]]")[0].split("[tuning]")[0]
dev = dev.rstrip() + "\nordinal = 0\n\n"
for n in (2, 3):
    open(f"{out}/rig{n}.toml", "w").write(head + dev * n)
EOF

# 3
for n in 1 2 3; do
  "$qrig" compile "$shared/fixtures/tiny.gguf" --rig "$out/rig$n.toml" --ctx 2048 -o "$out/plan$n" >"$out/compile$n.log" 2>&1 || add "compile $n stages" FAIL
  "$qrig" inspect "$out/plan$n" >"$out/inspect$n.log" 2>&1
  "$qrig" verify "$out/plan$n" "$shared/fixtures/tiny-ref.gguf" --dump "$out/dump$n.bin" >"$out/verify$n.log" 2>&1
  rc=$?
  add "verify tiny, $n stage(s)" "$( [[ $rc == 0 ]] && echo ok || echo FAIL): $(grep -E '^backend' "$out/verify$n.log" | tail -1)"
done
for n in 2 3; do
  if cmp -s "$out/dump1.bin" "$out/dump$n.bin"; then add "logits $n stages vs 1" "bit-identical"; else add "logits $n stages vs 1" "differ (see verify logs)"; fi
done

# 4
if command -v compute-sanitizer >/dev/null; then
  compute-sanitizer --tool memcheck --error-exitcode 3 "$qrig" verify "$out/plan3" "$shared/fixtures/tiny-ref.gguf" \
    >"$out/memcheck_pipeline.log" 2>&1
  add "memcheck, 3-stage verify" "$( [[ $? == 0 ]] && echo '0 errors' || echo FAIL) ($(grep -E 'ERROR SUMMARY' "$out/memcheck_pipeline.log" | tail -1))"
else
  add "memcheck" "compute-sanitizer not installed"
fi

# 5
OUT=$out/serve2 bash "$root/tests/gpu/serve_smoke.sh" "$out/rig2.toml" >"$out/serve_smoke2.log" 2>&1
add "serve_smoke on 2 stages" "$( [[ $? == 0 ]] && echo ok || echo FAIL) ($(grep -c ' ok' "$out/serve_smoke2.log") ok lines)"

# 6
if [[ "${1:-}" == speed ]]; then
  models=${QRIG_MODEL_DIR:-/tmp/qrig-models}
  mkdir -p "$models"
  [[ -f "$models/9b.gguf" ]] || "$qrig" synth --preset 9b -o "$models/9b.gguf" >"$out/synth9b.log" 2>&1
  for n in 1 2; do
    "$qrig" compile "$models/9b.gguf" --rig "$out/rig$n.toml" --ctx 8192 --parallel 1 -o "$out/plan9b_$n" \
      >"$out/compile9b_$n.log" 2>&1 || add "compile 9B $n stages" FAIL
    "$qrig" bench "$out/plan9b_$n" -p 512,4096 -n 128 -r 2 >"$out/bench9b_$n.md" 2>&1
    add "bench 9B, $n stage(s)" "$(grep -E '^\| [^|]+ \| [0-9.]+ GiB' "$out/bench9b_$n.md" | awk -F'|' '{printf "%s %s;", $6, $7}')"
  done
  "$qrig" bench "$out/plan9b_2" -p 4096 -n 128 -r 2 --simulate-link-gbps 0.25 >"$out/bench9b_2_link025.md" 2>&1
  add "bench 9B, 2 stages, 0.25 GB/s" "$(grep -E '^\| [^|]+ \| [0-9.]+ GiB' "$out/bench9b_2_link025.md" | awk -F'|' '{printf "%s %s;", $6, $7}')"
fi

# 7
if [[ "${1:-}" == speed2 ]]; then
  models=${QRIG_MODEL_DIR:-/tmp/qrig-models}
  mkdir -p "$models"
  ngpu=$(grep -c '^\[\[device\]\]' "$out/rig1.toml")
  if (( ngpu < 2 )); then
    add "speed2" "needs 2 GPUs; the probe found $ngpu"
  else
    for m in 27b 9b; do
      [[ -f "$models/$m.gguf" ]] || "$qrig" synth --preset $m -o "$models/$m.gguf" >"$out/synth$m.log" 2>&1
      for g in 1 2; do
        "$qrig" compile "$models/$m.gguf" --rig "$out/rig1.toml" --gpus $g --ctx 8192 --parallel 1 -o "$out/plan${m}_g$g" \
          >"$out/compile${m}_g$g.log" 2>&1 || add "compile $m on $g GPU(s)" FAIL
        "$qrig" bench "$out/plan${m}_g$g" -p 512,4096 -n 128 -r 3 >"$out/bench${m}_g$g.md" 2>&1
        add "bench $m, $g GPU(s)" "$(grep -E '^\| [^|]+ \| [0-9.]+ GiB' "$out/bench${m}_g$g.md" | awk -F'|' '{printf "%s %s;", $6, $7}')"
      done
      "$qrig" bench "$out/plan${m}_g2" -p 4096 -n 128 -r 3 --simulate-link-gbps 0.25 >"$out/bench${m}_g2_link025.md" 2>&1
      add "bench $m, 2 GPUs, 0.25 GB/s" "$(grep -E '^\| [^|]+ \| [0-9.]+ GiB' "$out/bench${m}_g2_link025.md" | awk -F'|' '{printf "%s %s;", $6, $7}')"
    done
  fi
fi

{
  echo "| step | result |"
  echo "|---|---|"
  printf '%s\n' "${summary[@]}"
} | tee "$out/summary.md"
