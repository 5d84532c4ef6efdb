// The op vocabulary: one enum and one schema table. Everything that handles ops dispatches on OpKind through a
// table indexed by it (the verifier here, the CPU backend's run table, the CUDA backend's bind and run
// tables), so a missing case is a compile error or a failing test, not a silent default.
//
// Adding an op (docs/ir.md says the same with an example):
//   1. here: its OpKind and its row in op_schemas() (ops.cpp): argument and result counts, required
//      attributes, what it computes;
//   2. the lowering (compiler/models/*.cpp) or a pass that emits it, and the kernel pass (choose_kernels.cpp)
//      naming its variants for CUDA plans (the memory pass sizes its results from their types);
//   3. the CPU reference op (runtime/cpu/ops*.cpp) and its row in the CPU run table (runtime/cpu/executor.cpp);
//   4. for CUDA plans: its kernels (templates/ + kernels/<area>.cpp + launchers in runtime/cuda) and its rows
//      in the CUDA bind/run tables (runtime/cuda/executor_ops.cpp), with a kernel-vs-CPU test in tests/gpu.
// A test walks the table and fails for an op a backend table lacks (tests/runtime/test_op_tables.cpp).
#pragma once

#include <cstddef>
#include <string_view>
#include <vector>

namespace qrig::ir {

enum class OpKind : unsigned char {
  embed,          // rows of a table for token ids
  rmsnorm,        // x * rsqrt(mean(x^2) + eps) * w per row
  rmsnorm_quant,  // rmsnorm, its output quantized for the matmuls it feeds (fusion of rmsnorm + quantize)
  add_rmsnorm_quant,  // residual add, and rmsnorm_quant of the sum (fusion of add + rmsnorm_quant): two results
  quantize,       // f32 rows -> int8 activation planes + a scale per 32 values (a q8 value)
  matmul,         // x W^T with a GGUF weight [in, out]
  matmul_stack,   // several matmuls reading one input, their weights stacked (one result per weight)
  add,
  swiglu,
  swiglu_quant,   // swiglu, its output quantized for the one matmul it feeds (fusion of swiglu + quantize)
  conv1d_silu,
  gdn,
  gated_rmsnorm,
  head_rmsnorm,
  rope,
  kv_write,
  attention,
  gather_rows,
  bridge,         // a value crossing from one pipeline stage (device) to the next, through pinned host memory
  concat,         // rows of two values side by side (the MTP head's [enorm(e) ; hnorm(h)])
};
constexpr size_t kOpKindCount = (size_t)OpKind::concat + 1;

struct OpSchema {
  OpKind kind;
  const char* name;
  int n_args;
  int n_results;  // 0 (side effects only), 1, 2 (add_rmsnorm_quant), or -1: one or more (one per stacked weight)
  std::vector<const char*> required_attrs;
  const char* doc;
};

const std::vector<OpSchema>& op_schemas();  // indexed by OpKind
const OpSchema& schema(OpKind k);
const OpSchema* find_schema(std::string_view name);  // nullptr for unknown names
const char* op_name(OpKind k);
// Whether result k of an op of kind `k` is a quantized activation (q8): the results of quantize, rmsnorm_quant and
// swiglu_quant, the second one of add_rmsnorm_quant.
bool makes_q8(OpKind k, size_t result);

}  // namespace qrig::ir
