// The IR: a small typed op graph that the compiler lowers models into, passes annotate, and the runtime
// executes. It has a text form that round-trips exactly (print -> parse -> print is identical; text.cpp), so
// plans can be read, diffed and hand-edited. The op vocabulary is ops.h. Includes nothing of qrig.
//
// Conventions every pass and backend relies on:
//  - every op carries `layer` (-1: the embedding, n_layer: the output head, else the block's index) and, once
//    placed, `device` ("cpu", "cuda:N"): the stage that runs it;
//  - matmuls carry `format` (the weight's GGUF type, e.g. "q8_0"; matmul_stack: `formats`, one per weight);
//  - keys and values of an attention layer are separate states (`k.L`, `v.L`), each with its own dtype;
//  - on CUDA plans `kernel` names the variants per range of rows (kernel_attr.h) and `at` the arena offset of
//    each result (`scratch` = [offset, bytes] of an op's scratch), as the memory pass laid them out.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

#include "ir/ops.h"

namespace qrig::ir {

struct Error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Symbolic dimensions: resolved per forward call by the runtime.
constexpr int64_t kTokens = -1;   // "T": tokens in this step
constexpr int64_t kRows = -2;     // "R": rows whose output is requested (e.g. logits of the last token)
constexpr int64_t kContext = -3;  // "C": the context length the plan allows (sizes KV caches)

// q8: activations quantized for the dp4a matmuls (int8 per value with an f32 scale per 32 values, and for
// steps of at most the op's precise_rows rows a second int8 plane); its shape counts the values it encodes.
// Key and value caches (states) may be f32, f16, q8, t4 or t3: kernels/kv_format.h (a q8 cache is int8 per
// value with an fp16 scale per 32 values; t4/t3: rotated Lloyd-Max codes per 256-value vector and its scale).
enum class DType { f32, f16, i32, q8, t4, t3 };
const char* dtype_name(DType d);

struct Type {
  DType dtype = DType::f32;
  std::vector<int64_t> shape;  // may contain kTokens / kRows / kContext
  bool operator==(const Type&) const = default;
};
std::string type_string(const Type& t);

// Attribute values: integer, float, string, integer list or string list.
using AttrValue = std::variant<int64_t, double, std::string, std::vector<int64_t>, std::vector<std::string>>;

struct Op {
  OpKind kind = OpKind::add;
  std::vector<std::string> results;  // value names without '%'; empty for ops with only side effects
  std::vector<Type> types;           // one per result
  std::vector<std::string> args;     // value names without '%'
  std::vector<std::pair<std::string, AttrValue>> attrs;  // in order

  // The only result of a single-result op (throws Error naming the op otherwise), and its type.
  const std::string& result() const;
  const Type& type() const;
  bool has_result() const { return !results.empty(); }

  bool has(std::string_view key) const;
  int64_t i(std::string_view key) const;         // throws Error naming op and key
  double f(std::string_view key) const;          // accepts integers too
  const std::string& s(std::string_view key) const;
  const std::vector<int64_t>& ints(std::string_view key) const;
  const std::vector<std::string>& strs(std::string_view key) const;
  int64_t i_or(std::string_view key, int64_t dflt) const;
  void set(const std::string& key, AttrValue v);  // replaces or appends
  void erase(std::string_view key);
  std::string describe() const;                   // "%x3 = add(...)" for messages
};

struct Input {
  std::string name;
  Type type;
};

// Per-sequence state that persists across forward calls (conv windows, GDN states, key and value caches).
struct State {
  std::string name;
  Type type;
};

struct Graph {
  std::string name;
  std::vector<Input> inputs;
  std::vector<State> states;
  std::vector<std::pair<std::string, AttrValue>> attrs;  // graph-wide decisions (e.g. the output rows' kernels)
  std::vector<Op> ops;
  std::vector<std::string> outputs;

  void set_attr(const std::string& key, AttrValue v);
  const AttrValue* attr(std::string_view key) const;  // nullptr when absent

  const Op* producer(std::string_view value) const;  // nullptr for inputs / unknown
  const Type* type_of(std::string_view value) const;
  const State* state(std::string_view name) const;
};

std::string print(const Graph& g);
Graph parse(std::string_view text);  // throws Error with the line number

// Structural checks: unique names, every argument defined earlier, known op kinds with the right number
// of arguments and results and the attributes each kind requires, state references declared. Throws Error
// naming the op.
void verify(const Graph& g);

}  // namespace qrig::ir
