# Sourced by the GPU batch scripts (wq.sh, kv.sh): finds the gpu-bundle built here (ninja -C build qrig_tests_gpu),
# puts its libraries and the CUDA ones on LD_LIBRARY_PATH, points the kernel cache under /tmp and sets root,
# bundle, qrig, tests, shared (QRIG_SHARED_DIR, default ../shared beside the checkout) and out ($OUT or ./gpu-out);
# sanitizer (compute-sanitizer, empty when not installed) and catch2_line LOG (a Catch2 log's result line).
# $1: the sourcing script's name, for the error message.
root=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
bundle=""
for c in "$root/build-gpu/gpu-bundle" "$root/build/gpu-bundle"; do
  [[ -x "$c/qrig_tests_gpu" && -x "$c/qrig" ]] && { bundle=$c; break; }
done
[[ -z "$bundle" ]] && { echo "$1: no gpu-bundle with qrig_tests_gpu and qrig (build it: ninja -C build qrig_tests_gpu)" >&2; exit 2; }
for d in "$bundle" "$bundle/qrig-libs" /usr/local/cuda/lib64 /usr/local/cuda/lib; do
  [[ -d "$d" ]] && LD_LIBRARY_PATH="$d${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
done
export LD_LIBRARY_PATH
export XDG_CACHE_HOME=${QRIG_GPU_CACHE:-${TMPDIR:-/tmp}/qrig-gpu-cache}
qrig="$bundle/qrig"
tests="$bundle/qrig_tests_gpu"
shared=${QRIG_SHARED_DIR:-$root/../shared}
export QRIG_SHARED_DIR=$shared
out=${OUT:-$PWD/gpu-out}
sanitizer=$(command -v compute-sanitizer || true)
[[ -z "$sanitizer" && -x /usr/local/cuda/bin/compute-sanitizer ]] && sanitizer=/usr/local/cuda/bin/compute-sanitizer
catch2_line() { grep -E "All tests passed|test cases:" "$1" | tail -1 | sed 's/^ *//; s/ *| */, /g'; }
