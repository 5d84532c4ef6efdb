// The compiler entry point: GGUF metadata + rig -> lowered IR -> ordered passes -> plan.
#pragma once

#include <string>

#include "compiler/hparams.h"
#include "compiler/rig.h"
#include "gguf/gguf.h"
#include "ir/plan.h"

namespace qrig::compiler {

struct CompileOptions {
  int64_t context_length = 0;    // 0: the most that fits, capped by the model's context_length
  int64_t max_sequences = 4;     // sequence slots (server --parallel)
  int64_t max_batch_tokens = 512;  // tokens per forward call (prefill chunk)
  std::string force_backend;     // "" (from the rig), "cpu"
  int64_t max_gpus = 0;          // use at most this many of the rig's GPUs (0: all of them)
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
