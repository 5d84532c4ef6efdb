// The part of binding a plan's graph that both executors share: value ids (the inputs %tokens, %pos, %rows
// first), each op's argument and result ids, whether it runs over the step's tokens (T) or its output rows (R),
// its row widths, its state references resolved to state indices, its tap; the states with the context length
// resolved. Checks the graph's contract with the runtime (those three inputs, %logits the only output and the
// last op's result). The backends then bind weights and kernels per op through their own op tables.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "ir/plan.h"

namespace qrig::runtime {

struct BoundValue {
  std::string name;
  ir::Type type;
  int64_t width = 0;  // last dimension (values per row)
  bool rows = false;  // R rows (output rows) instead of T (tokens)
};

struct BoundState {
  std::string name;
  ir::DType dtype = ir::DType::f32;
  std::vector<int64_t> shape;  // kContext resolved to the plan's context length
  int64_t elements = 0;
  bool positional = false;     // a key or value cache (one row per position)
  int64_t row_width = 0;       // positional: values per position
};

struct BoundOp {
  const ir::Op* op = nullptr;
  ir::OpKind kind{};
  std::vector<int> args, results;  // value ids
  bool rows = false;               // runs over the output rows (R) instead of the tokens (T)
  int state = -1, k_state = -1, v_state = -1;  // state indices of `state`, `k_cache`, `v_cache`
  std::string tap;
};

struct BoundGraph {
  static constexpr int kTokens = 0, kPos = 1, kRows = 2, kHidden = 3;
  std::vector<BoundValue> values;
  std::vector<BoundState> states;
  std::vector<BoundOp> ops;
  int logits = -1;  // value id of %logits
  bool has_hidden = false;  // a draft graph (Plan::draft): a fourth input %hidden [T, width] (value kHidden)

  explicit BoundGraph(const ir::Plan& plan) : BoundGraph(plan, plan.graph) {}
  // The plan's graph or its draft graph; throws RuntimeError naming the op or value at fault.
  BoundGraph(const ir::Plan& plan, const ir::Graph& g);
  int64_t width(int value) const { return values.at((size_t)value).width; }
};

}  // namespace qrig::runtime
