// Structural verification of a graph (ir.h verify): names, definitions before use, the schema of every op
// (ops.h), state references, and where quantized (q8) values may appear.
#include <map>
#include <set>

#include <fmt/format.h>

#include "ir/ir.h"

namespace qrig::ir {

void verify(const Graph& g) {
  std::set<std::string> defined, states;
  std::set<std::string> q8_values;
  std::map<std::string, std::string> device_of;  // values made by ops placed on a device (inputs are everywhere)
  auto define = [&](const std::string& n, const char* what) {
    if (n.empty()) throw Error(fmt::format("IR: empty {} name", what));
    if (!defined.insert(n).second) throw Error(fmt::format("IR: value %{} defined twice", n));
  };
  for (const Input& in : g.inputs) define(in.name, "input");
  for (const State& st : g.states)
    if (!states.insert(st.name).second) throw Error(fmt::format("IR: state %{} declared twice", st.name));
  for (const Op& op : g.ops) {
    const OpSchema& sc = schema(op.kind);
    if ((int)op.args.size() != sc.n_args)
      throw Error(fmt::format("IR: {} takes {} arguments, has {}", op.describe(), sc.n_args, op.args.size()));
    if (sc.n_results >= 0 && (int)op.results.size() != sc.n_results)
      throw Error(fmt::format("IR: {} {}", op.describe(),
                              sc.n_results == 0 ? "must not have a result" : sc.n_results == 1 ? "needs one result"
                                                                                               : "has the wrong results"));
    if (sc.n_results < 0 && op.results.empty()) throw Error(fmt::format("IR: {} needs a result", op.describe()));
    if (op.types.size() != op.results.size())
      throw Error(fmt::format("IR: {} has {} results and {} types", op.describe(), op.results.size(), op.types.size()));
    for (const std::string& a : op.args)
      if (!defined.count(a)) throw Error(fmt::format("IR: {} uses %{} before it is defined", op.describe(), a));
    for (const char* r : sc.required_attrs)
      if (!op.has(r)) throw Error(fmt::format("IR: {} lacks attribute '{}'", op.describe(), r));
    for (const char* key : {"state", "k_cache", "v_cache"})
      if (op.has(key) && !states.count(op.s(key)))
        throw Error(fmt::format("IR: {} refers to undeclared state %{}", op.describe(), op.s(key)));
    // Placed ops read values of their own device; only a bridge moves a value to another (from -> to).
    if (op.has("device")) {
      const std::string& dev = op.s("device");
      if (op.kind == OpKind::bridge && (op.s("to") != dev || op.s("from") == dev))
        throw Error(fmt::format("IR: {} runs on its destination device and goes from one device to another",
                                op.describe()));
      const std::string want = op.kind == OpKind::bridge ? op.s("from") : dev;
      for (const std::string& a : op.args) {
        auto it = device_of.find(a);
        if (it != device_of.end() && it->second != want)
          throw Error(fmt::format("IR: {} on {} reads %{} of {} (values cross devices only through a bridge)",
                                  op.describe(), want, a, it->second));
      }
      for (const std::string& r : op.results) device_of[r] = dev;
    }
    // Quantized activations are made by the quantizing ops (ir::makes_q8) and read only by matmuls.
    const bool reads_q8 = op.kind == OpKind::matmul || op.kind == OpKind::matmul_stack;
    for (const std::string& a : op.args)
      if (q8_values.count(a) && !reads_q8)
        throw Error(fmt::format("IR: {} reads the quantized value %{} (only matmuls read q8 values)", op.describe(), a));
    for (size_t k = 0; k < op.results.size(); ++k) {
      const bool q8 = makes_q8(op.kind, k);
      if ((op.types[k].dtype == DType::q8) != q8)
        throw Error(fmt::format("IR: {} result %{} is {} ({})", op.describe(), op.results[k],
                                type_string(op.types[k]),
                                q8 ? "this op makes q8 values"
                                   : "only quantize, rmsnorm_quant, swiglu_quant and add_rmsnorm_quant's second "
                                     "result are q8 values"));
      define(op.results[k], "result");
      if (q8) q8_values.insert(op.results[k]);
    }
    if (op.kind == OpKind::matmul_stack && op.strs("weights").size() != op.results.size())
      throw Error(fmt::format("IR: {} has {} weights for {} results", op.describe(), op.strs("weights").size(),
                              op.results.size()));
  }
  for (const std::string& o : g.outputs)
    if (!defined.count(o)) throw Error(fmt::format("IR: output %{} is not defined", o));
}

}  // namespace qrig::ir
