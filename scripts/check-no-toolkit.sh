#!/usr/bin/env bash
# Builds qrig's CUDA backend and runs its no-GPU tests on this machine with the CUDA toolkit hidden: every
# /usr/local/cuda* directory is covered by an empty one in a private mount namespace (needs root and
# unshare), so the build can use nothing of the toolkit and the tests only the NVRTC the distribution gives
# (Debian's libnvrtc11.2). Proves that the CUDA backend needs no toolkit to build (docs/gpu.md).
#   scripts/check-no-toolkit.sh [build-dir]     (default: build-no-toolkit)
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$root/build-no-toolkit}
if [[ "${QRIG_NO_TOOLKIT_INNER:-}" != 1 ]]; then
  exec env QRIG_NO_TOOLKIT_INNER=1 unshare -m bash "$0" "$build"
fi
empty=$(mktemp -d)
for d in /usr/local/cuda*; do [[ -d "$d" ]] && mount --bind "$empty" "$d"; done
echo "hidden: $(ls -d /usr/local/cuda* 2>/dev/null | tr '\n' ' ')($(find /usr/local/cuda*/ -mindepth 1 2>/dev/null | wc -l) files left visible)"
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
ninja -C "$build" qrig qrig_tests_cuda
echo "CUDA libraries qrig links: $(ldd "$build/qrig" | grep -ciE 'libcuda|nvrtc|cudart' || true)"
"$build/qrig" probe 2>&1 | grep -E '^(driver|nvrtc):' || true
cd "$build" && ./qrig_tests_cuda
