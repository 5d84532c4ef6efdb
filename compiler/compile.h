// The compiler entry point: GGUF metadata + rig -> lowered IR -> ordered passes -> plan.
#pragma once

#include <string>

#include "compiler/hparams.h"
#include "compiler/rig.h"
#include "gguf/gguf.h"
#include "ir/plan.h"

namespace qrig::compiler {

// GPU matmuls over at most this many rows use two-plane activations unless asked otherwise: two planes are
// nearly free while a matmul is bound by its weight bytes (decode of a few sequences, a few rows of logits).
constexpr int64_t kDefaultPreciseRows = 4;

struct CompileOptions {
  int64_t context_length = 0;    // 0: the most that fits, capped by the model's context_length
  int64_t max_sequences = 4;     // sequence slots (server --parallel)
  int64_t max_batch_tokens = 512;  // tokens per forward call (prefill chunk)
  std::string force_backend;     // "" (from the rig), "cpu"
  int64_t max_gpus = 0;          // use at most this many of the rig's GPUs (0: all of them)
  // GPU matmuls over at most this many rows use two-plane (~15-bit) activations; -1: the default
  // (kDefaultPreciseRows), a value >= max_batch_tokens: every matmul (prefill too, at about half its speed).
  int64_t precise_rows = -1;
};

// What every pass sees. Passes run in a fixed order, each in its own file under compiler/passes/.
struct CompileContext {
  const gguf::File& file;
  Qwen35Params params;
  Rig rig;
  CompileOptions options;
  ir::Plan plan;  // filled in as passes decide
};

ir::Plan compile(const gguf::File& file, const Rig& rig, const CompileOptions& options);
std::string compiler_version();

}  // namespace qrig::compiler
