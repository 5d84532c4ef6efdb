// The plan: every decision the compiler made for one model on one rig, as a directory holding plan.toml
// (decisions, memory, placement: human-readable) and graph.ir (the annotated IR). The runtime reads it and
// decides nothing the plan already decided.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ir/ir.h"

namespace qrig::ir {

struct Placement {
  std::string device;      // "cpu" or "cuda:N"
  int64_t first_layer = 0;
  int64_t last_layer = 0;  // inclusive
};

struct MemoryPlan {
  int64_t weight_bytes = 0;
  int64_t kv_bytes_per_token = 0;
  int64_t state_bytes_per_sequence = 0;  // GDN recurrent + conv states
  int64_t activation_bytes = 0;          // per step at max_batch_tokens
  int64_t budget_bytes = 0;              // what the device offers the plan
};

struct Plan {
  static constexpr int64_t kFormat = 1;
  int64_t format = kFormat;
  std::string compiler_version;
  std::string model_path;      // absolute path of the GGUF
  int64_t model_size = 0;      // bytes, checked at load
  std::string arch;
  std::string model_name;
  std::string rig_name;
  std::string backend;         // "cpu" | "cuda"
  std::string arch_target;     // e.g. "sm_90" for cuda; empty for cpu
  int64_t device_sms = 0;      // SMs of the target GPU (kernel tilings and splits are chosen for it); 0 for cpu
  std::string kernel_family;   // "reference" (cpu), "dp4a" ...
  int64_t context_length = 0;  // tokens per sequence the plan allows
  int64_t max_sequences = 1;   // sequence slots
  int64_t max_batch_tokens = 0;  // tokens per forward call (prefill chunk)
  int64_t gdn_chunk = 64;      // chunk length of chunked GDN
  int64_t gdn_recurrent_below = 16;  // steps with fewer tokens run the recurrent GDN
  // GPU matmuls over at most this many activation rows quantize them to two int8 planes (~15 bits: decode is
  // bound by the weight bytes, so it costs little); larger ones (prefill) to one plane, llama.cpp's numerics.
  int64_t precise_rows = 0;
  std::string kv_dtype;        // "f32" | "f16"
  int64_t threads = 0;         // cpu threads (0 = all cores)
  int64_t vocab_real = 0;      // tokens that may be sampled
  std::vector<Placement> placement;
  MemoryPlan memory;
  std::vector<std::string> notes;  // what the passes decided and why, in order
  Graph graph;

  void write(const std::string& dir) const;   // plan.toml + graph.ir (atomic per file)
  static Plan read(const std::string& dir);   // throws Error with the file and what is wrong
  std::string to_toml() const;
};

}  // namespace qrig::ir
