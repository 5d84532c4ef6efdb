// The IR: a small typed op graph that the compiler lowers models into, passes annotate, and the runtime
// executes. It has a text form that round-trips exactly (print -> parse -> print is identical), so plans
// can be read, diffed and hand-edited. Includes nothing of qrig.
#pragma once

#include <cstdint>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

namespace qrig::ir {

struct Error : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Symbolic dimensions: resolved per forward call by the runtime.
constexpr int64_t kTokens = -1;   // "T": tokens in this step
constexpr int64_t kRows = -2;     // "R": rows whose output is requested (e.g. logits of the last token)
constexpr int64_t kContext = -3;  // "C": the context length the plan allows (sizes KV caches)

enum class DType { f32, f16, i32 };
const char* dtype_name(DType d);

struct Type {
  DType dtype = DType::f32;
  std::vector<int64_t> shape;  // may contain kTokens / kRows
  bool operator==(const Type&) const = default;
};
std::string type_string(const Type& t);

// Attribute values: integer, float, string or integer list.
using AttrValue = std::variant<int64_t, double, std::string, std::vector<int64_t>>;

struct Op {
  std::string result;              // value name without '%'; empty for ops with only side effects
  std::string kind;                // embed, rmsnorm, matmul, ...
  std::vector<std::string> args;   // value names without '%'
  std::vector<std::pair<std::string, AttrValue>> attrs;  // in order
  Type type;                       // result type (unused when result is empty)

  bool has(std::string_view key) const;
  int64_t i(std::string_view key) const;         // throws Error naming op and key
  double f(std::string_view key) const;          // accepts integers too
  const std::string& s(std::string_view key) const;
  const std::vector<int64_t>& ints(std::string_view key) const;
  int64_t i_or(std::string_view key, int64_t dflt) const;
  void set(const std::string& key, AttrValue v);  // replaces or appends
  std::string describe() const;                   // "%x3 = add(...)" for messages
};

struct Input {
  std::string name;
  Type type;
};

// Per-sequence state that persists across forward calls (conv windows, GDN states, KV caches).
struct State {
  std::string name;
  Type type;
};

struct Graph {
  std::string name;
  std::vector<Input> inputs;
  std::vector<State> states;
  std::vector<Op> ops;
  std::vector<std::string> outputs;

  const Op* producer(std::string_view value) const;  // nullptr for inputs / unknown
  const Type* type_of(std::string_view value) const;
  const State* state(std::string_view name) const;
};

std::string print(const Graph& g);
Graph parse(std::string_view text);  // throws Error with the line number

// Structural checks: unique names, every argument defined earlier, known op kinds with the right number
// of arguments and the attributes each kind requires. Throws Error naming the op.
void verify(const Graph& g);

// The op vocabulary: for each kind, the argument count and required attributes.
struct OpSchema {
  const char* kind;
  int n_args;
  bool has_result;
  std::vector<const char*> required_attrs;
  const char* doc;
};
const std::vector<OpSchema>& op_schemas();
const OpSchema* find_schema(std::string_view kind);

}  // namespace qrig::ir
