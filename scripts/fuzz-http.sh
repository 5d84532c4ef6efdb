#!/usr/bin/env bash
# Fuzz the HTTP request path: builds tests/fuzz/fuzz_http.cpp with libFuzzer + ASan/UBSan (clang, build-fuzz/,
# CPU only), seeds a corpus with a valid request for every route and the framing cases of issue 16 (chunked,
# CL+TE, bad chunk sizes, Expect, odd methods), and runs it single-process.
# Usage: scripts/fuzz-http.sh [seconds=600] [extra libFuzzer flags...]
# The corpus grows in build-fuzz/fuzz-http-corpus (kept between runs); crashes, hangs and bad answers are
# written to build-fuzz/fuzz-http-artifacts/ (turn each into a case in tests/server/client/hardening.test.mjs).
set -euo pipefail
secs=${1:-600}
shift || true
root=$(cd "$(dirname "$0")/.." && pwd)
build=$root/build-fuzz

cmake -S "$root" -B "$build" -G Ninja -DQRIG_FUZZ=ON -DQRIG_CUDA=OFF -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_C_COMPILER=clang >/dev/null
ninja -j2 -C "$build" fuzz_http

seeds=$build/fuzz-http-seeds
corpus=$build/fuzz-http-corpus
artifacts=$build/fuzz-http-artifacts
mkdir -p "$seeds" "$corpus" "$artifacts"

post() {  # post NAME PATH BODY [EXTRA_HEADERS]
  printf 'POST %s HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n%sContent-Length: %d\r\n\r\n%s' \
    "$2" "${4:-}" "${#3}" "$3" >"$seeds/$1"
}
chat='{"messages": [{"role": "system", "content": "s"}, {"role": "user", "content": "hi"}], "max_tokens": 2, "temperature": 0}'
post chat /v1/chat/completions "$chat"
post chat-stream /v1/chat/completions '{"messages": [{"role": "user", "content": "hi"}], "stream": true, "stream_options": {"include_usage": true}, "max_tokens": 2}'
post chat-tools /v1/chat/completions '{"messages": [{"role": "user", "content": "w"}, {"role": "assistant", "content": "", "reasoning_content": "r", "tool_calls": [{"id": "c", "type": "function", "function": {"name": "f", "arguments": "{\"a\": 1}"}}]}, {"role": "tool", "tool_call_id": "c", "content": "ok"}], "tools": [{"type": "function", "function": {"name": "f", "parameters": {"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]}}}], "tool_choice": "required", "max_tokens": 4}'
post chat-schema /v1/chat/completions '{"messages": [{"role": "user", "content": "j"}], "response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {"type": "object", "properties": {"n": {"type": "number"}, "s": {"enum": ["a", "b"]}}}}}, "max_tokens": 4, "logprobs": true, "top_logprobs": 2, "logit_bias": {"5": -1}, "stop": ["x", "y"], "seed": 3}'
post completion /v1/completions '{"prompt": "Once", "max_tokens": 2, "echo": true, "logprobs": 1}'
post completion-ids /completions '{"prompt": [1, 2, 3], "max_tokens": 2, "stream": true}'
post tokenize /tokenize '{"content": "hello <|im_start|> world", "with_pieces": true}'
post tokenize-chat /tokenize '{"messages": [{"role": "user", "content": "hi"}], "add_generation_prompt": true}'
post detokenize /detokenize '{"tokens": [1, 2, 3, 1002]}'
post unknown-fields /v1/chat/completions '{"messages": [{"role": "user", "content": "x"}], "mirostat": 2, "a\nb": 1, "temperature": 1e400}'
post expect /v1/chat/completions "$chat" $'Expect: 100-continue\r\n'
post auth /v1/chat/completions "$chat" $'Authorization: Bearer k\r\n'
printf 'GET /health HTTP/1.1\r\nHost: x\r\n\r\nGET /v1/models HTTP/1.1\r\nHost: x\r\n\r\nGET /v1/models/scripted HTTP/1.1\r\nHost: x\r\nRange: bytes=0-0\r\n\r\nGET /metrics HTTP/1.0\r\n\r\n' >"$seeds/gets-pipelined"
printf 'OPTIONS /v1/chat/completions HTTP/1.1\r\nHost: x\r\nOrigin: http://o\r\n\r\nPROPFIND /x HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nhello' >"$seeds/options-propfind"
printf 'POST /tokenize HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n7;ext=1\r\n{"conte\r\n9\r\nnt": "hi"\r\n1\r\n}\r\n0\r\nTrailer: t\r\n\r\n' >"$seeds/chunked"
printf 'POST /tokenize HTTP/1.1\r\nHost: x\r\nContent-Length: 16\r\nTransfer-Encoding: chunked\r\n\r\n0\r\n\r\nGET / HTTP/1.1\r\n\r\n' >"$seeds/cl-te"
printf 'POST /tokenize HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n0x10\r\n{"content": "x"}\r\n0\r\n\r\n' >"$seeds/bad-chunk"
printf 'GET http://x/v1/models?x=%%41 HTTP/1.1\r\nHost: x\r\nContent-Encoding: gzip\r\n\r\n' >"$seeds/absolute-form"

echo "fuzz-http: ${secs}s, seeds in $seeds, corpus in $corpus"
cd "$build"
exec ./fuzz_http "$corpus" "$seeds" -max_total_time="$secs" -max_len=16384 -timeout=60 -rss_limit_mb=4096 \
  -print_final_stats=1 -artifact_prefix="$artifacts/" "$@"
