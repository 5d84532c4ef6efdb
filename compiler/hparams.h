// Qwen3.5/3.6 dense hybrid hyperparameters read from GGUF metadata (never weights) and validated against
// the tensor table, with errors that name the key or tensor at fault.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <vector>

#include "gguf/gguf.h"

namespace qrig::compiler {

struct CompileError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

struct Qwen35Params {
  std::string arch;          // "qwen35"
  std::string name;          // general.name, informational
  int64_t n_layer = 0;       // main-model layers (block_count - nextn_predict_layers)
  int64_t n_mtp = 0;         // MTP blocks kept aside (blk.{n_layer}..)
  int64_t d = 0;             // hidden size
  int64_t ffn = 0;
  int64_t n_head = 0, n_head_kv = 0, head_dim = 0;   // full attention
  double eps = 1e-6;
  double rope_theta = 1e7;
  int64_t rope_dims = 64;
  std::vector<int64_t> rope_sections;
  int64_t conv_kernel = 4;
  int64_t ssm_head_dim = 128;  // ssm.state_size: key and value head dim
  int64_t ssm_k_heads = 0;     // ssm.group_count (Hk)
  int64_t ssm_v_heads = 0;     // ssm.time_step_rank (Hv)
  int64_t ssm_inner = 0;       // ssm.inner_size = Hv * head dim
  int64_t full_attn_interval = 4;
  int64_t context_length = 0;
  int64_t vocab = 0;           // embedding rows
  std::string weight_types;    // e.g. "Q8_0 matrices, F32 vectors", "Q4_K, Q6_K matrices, ...", informational

  bool is_full_attention(int64_t layer) const { return (layer + 1) % full_attn_interval == 0; }
  int64_t key_dim() const { return ssm_k_heads * ssm_head_dim; }
  int64_t value_dim() const { return ssm_v_heads * ssm_head_dim; }
  int64_t conv_dim() const { return 2 * key_dim() + value_dim(); }

  // Reads and validates: head counts divide, dims match tensor shapes, every tensor present with a type the
  // engine executes. Refuses other architectures (naming them) and unsupported tensor types.
  static Qwen35Params from_gguf(const gguf::File& f);
};

}  // namespace qrig::compiler
