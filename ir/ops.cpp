// The op schema table (ops.h): one row per OpKind, in enum order.
#include "ir/ops.h"

#include <stdexcept>

namespace qrig::ir {

const std::vector<OpSchema>& op_schemas() {
  static const std::vector<OpSchema> schemas = [] {
    std::vector<OpSchema> s = {
        {OpKind::embed, "embed", 1, 1, {"weight"}, "rows of a table for token ids"},
        {OpKind::rmsnorm, "rmsnorm", 1, 1, {"weight", "eps"}, "x * rsqrt(mean(x^2) + eps) * w per row"},
        {OpKind::rmsnorm_quant, "rmsnorm_quant", 1, 1, {"weight", "eps", "precise_rows"},
         "rmsnorm whose output only feeds matmuls: the output quantized as `quantize` does (a q8 value)"},
        {OpKind::add_rmsnorm_quant, "add_rmsnorm_quant", 2, 2, {"weight", "eps", "precise_rows"},
         "residual add whose sum feeds an rmsnorm_quant: results the sum (f32, as `add`) and rmsnorm_quant of it (q8)"},
        {OpKind::quantize, "quantize", 1, 1, {"precise_rows"},
         "f32 rows -> int8 per 32 values with an f32 scale (one plane; two planes, ~15 bits, for steps of at most "
         "precise_rows rows): the matmul input of the dp4a family"},
        {OpKind::matmul, "matmul", 1, 1, {"weight"}, "x W^T with a GGUF weight [in, out]"},
        {OpKind::matmul_stack, "matmul_stack", 1, -1, {"weights"},
         "x W_i^T for several weights read by one input (stacked on the device), one result per weight"},
        {OpKind::add, "add", 2, 1, {}, "elementwise sum"},
        {OpKind::swiglu, "swiglu", 2, 1, {}, "silu(gate) * up"},
        {OpKind::swiglu_quant, "swiglu_quant", 2, 1, {"precise_rows"},
         "swiglu whose output only feeds a quantize: the output quantized as `quantize` does (a q8 value)"},
        {OpKind::conv1d_silu, "conv1d_silu", 1, 1, {"weight", "state"},
         "causal depthwise conv over time with state, then SiLU"},
        {OpKind::gdn, "gdn", 3, 1, {"ssm_a", "dt_bias", "key_heads", "value_heads", "key_dim", "value_dim", "state"},
         "gated delta rule over (mixed qkv, alpha, beta) with recurrent state"},
        {OpKind::gated_rmsnorm, "gated_rmsnorm", 2, 1, {"weight", "heads", "head_dim", "eps"},
         "w * o/rms(o) * silu(z) per head"},
        {OpKind::head_rmsnorm, "head_rmsnorm", 1, 1, {"weight", "heads", "head_dim", "head_stride", "head_offset", "eps"},
         "RMSNorm over each head, reading heads at a stride"},
        {OpKind::rope, "rope", 2, 1, {"heads", "head_dim", "rope_dims", "theta"},
         "partial NeoX rotary embedding at positions"},
        {OpKind::kv_write, "kv_write", 3, 0, {"k_cache", "v_cache"},
         "store k, v rows at positions in a sequence's key and value caches"},
        {OpKind::attention, "attention", 3, 1,
         {"k_cache", "v_cache", "heads", "kv_heads", "head_dim", "scale", "gate_head_stride", "gate_offset"},
         "causal GQA attention over a sequence's key and value caches, times sigmoid(gate)"},
        {OpKind::gather_rows, "gather_rows", 2, 1, {}, "select rows of x by index"},
        {OpKind::bridge, "bridge", 1, 1, {"from", "to"},
         "the same rows on the next pipeline stage: copied from device `from` to device `to` through pinned host "
         "memory (the op runs on `to`; its argument was made on `from`)"},
        {OpKind::concat, "concat", 2, 1, {},
         "each row of the first argument followed by the same row of the second (widths add)"},
    };
    for (size_t i = 0; i < s.size(); ++i)
      if ((size_t)s[i].kind != i) throw std::logic_error("ir::op_schemas is not in OpKind order");
    if (s.size() != kOpKindCount) throw std::logic_error("ir::op_schemas lacks an OpKind");
    return s;
  }();
  return schemas;
}

const OpSchema& schema(OpKind k) { return op_schemas().at((size_t)k); }
const char* op_name(OpKind k) { return schema(k).name; }

bool makes_q8(OpKind k, size_t result) {
  switch (k) {
    case OpKind::quantize:
    case OpKind::rmsnorm_quant:
    case OpKind::swiglu_quant: return result == 0;
    case OpKind::add_rmsnorm_quant: return result == 1;
    default: return false;
  }
}

const OpSchema* find_schema(std::string_view name) {
  for (const OpSchema& s : op_schemas())
    if (name == s.name) return &s;
  return nullptr;
}

}  // namespace qrig::ir
