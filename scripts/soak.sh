#!/usr/bin/env bash
# The long soak for release checks: tests/server/client/soak.test.mjs (16 mixed clients against one
# `qrig serve` on the tiny fixture: zero errors, bounded RSS) for SECONDS (default 900; CI runs it for 60).
# Usage: scripts/soak.sh [seconds=900]   (builds nothing: run after `ninja -C build qrig`)
set -euo pipefail
secs=${1:-900}
root=$(cd "$(dirname "$0")/.." && pwd)
build=${QRIG_BUILD_DIR:-$root/build}
[ -x "$build/qrig" ] || { echo "soak: no $build/qrig (build it first)" >&2; exit 2; }
[ -d "$root/tests/server/client/node_modules" ] || npm ci --prefix "$root/tests/server/client" --no-audit --no-fund
cd "$root/tests/server/client"
QRIG_BINARY="$build/qrig" QRIG_SHARED_DIR="${QRIG_SHARED_DIR:-$root/../shared}" QRIG_SOAK_SECONDS="$secs" \
  exec node --test --test-reporter=spec soak.test.mjs
