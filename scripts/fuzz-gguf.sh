#!/usr/bin/env bash
# Fuzz the GGUF reader: builds tests/fuzz/fuzz_gguf.cpp with libFuzzer + ASan/UBSan (clang, build-fuzz/),
# seeds a corpus from the fixtures and a few hand-made small files, and runs it single-process.
# Usage: scripts/fuzz-gguf.sh [seconds=600] [extra libFuzzer flags...]
# The corpus grows in build-fuzz/fuzz-gguf-corpus (kept between runs); crashes, leaks, timeouts and
# over-large allocations are written to build-fuzz/fuzz-gguf-artifacts/ (turn each into a regression case
# in tests/gguf/test_gguf_corrupt.cpp).
set -euo pipefail
secs=${1:-600}
shift || true
root=$(cd "$(dirname "$0")/.." && pwd)
build=$root/build-fuzz
fixtures=$root/../shared/fixtures

cmake -S "$root" -B "$build" -G Ninja -DQRIG_FUZZ=ON -DCMAKE_CXX_COMPILER=clang++ -DCMAKE_C_COMPILER=clang >/dev/null
ninja -j2 -C "$build" fuzz_gguf

seeds=$build/fuzz-gguf-seeds
corpus=$build/fuzz-gguf-corpus
artifacts=$build/fuzz-gguf-artifacts
mkdir -p "$seeds" "$corpus" "$artifacts"

# Little-endian integers and GGUF strings on stdout.
le() { local v=$1 n=$2 i; for ((i = 0; i < n; i++)); do printf "\\x$(printf %02x $(((v >> (8 * i)) & 255)))"; done; }
u8() { le "$1" 1; }
u16() { le "$1" 2; }
u32() { le "$1" 4; }
u64() { le "$1" 8; }
str() { u64 ${#1}; printf '%s' "$1"; }
pad_to() { local have=$1 align=$2; while ((have % align)); do printf '\x00'; have=$((have + 1)); done; }

# Whole fixtures (libFuzzer cuts inputs to -max_len, so these also act as truncated files).
for f in tiny.gguf tiny-ref.gguf tiny-mtp.gguf; do
  [ -f "$fixtures/$f" ] && cp "$fixtures/$f" "$seeds/$f"
done
# The fixtures' metadata as complete small files: the first 64 KiB with the tensor count set to 0 (tiny.gguf)
# or 1 (tiny-ref.gguf: its first tensor is I32 [300], whose "data" is then the bytes after its info).
if [ -f "$fixtures/tiny.gguf" ]; then
  head -c 65536 "$fixtures/tiny.gguf" >"$seeds/tiny-metadata.gguf"
  u64 0 | dd of="$seeds/tiny-metadata.gguf" bs=1 seek=8 conv=notrunc status=none
fi
if [ -f "$fixtures/tiny-ref.gguf" ]; then
  head -c 65536 "$fixtures/tiny-ref.gguf" >"$seeds/tiny-ref-one-tensor.gguf"
  u64 1 | dd of="$seeds/tiny-ref-one-tensor.gguf" bs=1 seek=8 conv=notrunc status=none
fi
# Every metadata value type, nested and empty arrays, no tensors.
{
  printf 'GGUF'; u32 3; u64 0; u64 16
  str k.u8; u32 0; u8 200
  str k.i8; u32 1; u8 255
  str k.u16; u32 2; u16 65535
  str k.i16; u32 3; u16 32768
  str k.u32; u32 4; u32 4000000000
  str k.i32; u32 5; u32 4294967295
  str k.f32; u32 6; u32 1065353216
  str k.bool; u32 7; u8 1
  str k.str; u32 8; str "hello"
  str k.u64; u32 10; u64 -1
  str k.i64; u32 11; u64 -2
  str k.f64; u32 12; u64 4607182418800017408
  str k.arr_i32; u32 9; u32 5; u64 3; u32 1; u32 2; u32 3
  str k.arr_str; u32 9; u32 8; u64 2; str a; str ""
  str k.nested; u32 9; u32 9; u64 2; u32 4; u64 1; u32 7; u32 8; u64 0
  str k.empty; u32 9; u32 12; u64 0
} >"$seeds/all-value-types.gguf"
# Small tensors of each type the reader dequantizes, alignment 64.
f=$seeds/small-tensors.gguf
{
  printf 'GGUF'; u32 3; u64 4; u64 1; str general.alignment; u32 4; u32 64
  str t.f32; u32 1; u64 4; u32 0; u64 0
  str t.f16; u32 2; u64 2; u64 2; u32 1; u64 64
  str t.q8; u32 2; u64 32; u64 2; u32 8; u64 128
  str t.bf16; u32 1; u64 3; u32 30; u64 256
} >"$f"
{
  pad_to "$(stat -c %s "$f")" 64
  u32 1065353216; u32 3212836864; u32 0; u32 2139095040; pad_to 16 64   # f32 1 -1 0 inf
  u16 15360; u16 48128; u16 31744; u16 32767; pad_to 8 64              # f16 1 -2 inf nan
  for b in 0 1; do u16 11264; for ((i = 0; i < 32; i++)); do u8 $(((i * 37 + b) & 255)); done; done
  pad_to 68 128                                                      # q8_0, two blocks
  u16 16256; u16 49024; u16 0; pad_to 6 64                              # bf16 1 -1 0
} >>"$f"

echo "fuzz-gguf: ${secs}s, seeds in $seeds, corpus in $corpus"
cd "$build"
exec ./fuzz_gguf "$corpus" "$seeds" -max_total_time="$secs" -max_len=65536 -timeout=10 -rss_limit_mb=2048 \
  -malloc_limit_mb=256 -print_final_stats=1 -artifact_prefix="$artifacts/" "$@"
