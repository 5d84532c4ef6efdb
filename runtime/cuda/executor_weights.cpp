// Weight upload of the CUDA executor (executor.h): Q8_0 matrices repacked for aligned 16-byte loads (q8_layout.h),
// F32 vectors as they are, and matmul groups: consecutive matmuls that read the same input get their weights
// stacked in one device matrix (each member's Q8Matrix a slice of it, no copy twice), so a single-row step runs
// one GEMV for the whole group (executor.cpp).
#include <fmt/format.h>

#include "runtime/cuda/executor_impl.h"
#include "runtime/cuda/q8_layout.h"

namespace qrig::runtime {

namespace {

const gguf::TensorInfo& need_tensor(const gguf::File& f, const std::string& name, const ir::Op& op) {
  const gguf::TensorInfo* t = f.find_tensor(name);
  if (!t) throw RuntimeError(fmt::format("{}: weight '{}' is not in {}", op.describe(), name, f.path()));
  return *t;
}

}  // namespace

cuda::Q8Matrix CudaExecutor::Impl::upload_q8(const std::string& name, const ir::Op& op) {
  auto it = q8_by_name.find(name);
  if (it != q8_by_name.end()) return it->second;
  const gguf::TensorInfo& t = need_tensor(*file, name, op);
  if (t.ne.size() != 2 || t.type != gguf::TensorType::Q8_0)
    throw RuntimeError(fmt::format("{}: weight '{}' is {} {}; the CUDA dp4a family needs Q8_0 matrices "
                                   "(use the CPU backend for other types)", op.describe(), name,
                                   gguf::tensor_type_name(t.type), t.shape_string()));
  const int64_t cols = (int64_t)t.ne[0], rows = (int64_t)t.ne[1];
  std::vector<int8_t> qs(cuda::q8_qs_bytes(rows, cols));
  std::vector<uint16_t> sc((size_t)rows * (size_t)(cols / 32));
  cuda::repack_q8_0(file->tensor_data(t), rows, cols, qs.data(), sc.data());
  weight_qs.emplace_back(opt.device, qs.size(), name + " (int8)");
  weight_qs.back().upload(qs);
  weight_scales.emplace_back(opt.device, sc.size(), name + " (scales)");
  weight_scales.back().upload(sc);
  weight_bytes += (int64_t)(qs.size() + sc.size() * 2);
  cuda::Q8Matrix m{weight_qs.back().data(), weight_scales.back().data(), rows, cols};
  q8_by_name[name] = m;
  return m;
}

const float* CudaExecutor::Impl::upload_f32(const std::string& name, const ir::Op& op, int64_t n) {
  const gguf::TensorInfo& t = need_tensor(*file, name, op);
  if (t.type != gguf::TensorType::F32 || (int64_t)t.n_elements != n)
    throw RuntimeError(fmt::format("{}: weight '{}' must be F32 with {} values, is {} {}", op.describe(), name, n,
                                   gguf::tensor_type_name(t.type), t.shape_string()));
  auto it = f32_by_name.find(name);
  if (it != f32_by_name.end()) return it->second;
  weight_f32.emplace_back(opt.device, (size_t)n, name);
  weight_f32.back().upload(reinterpret_cast<const float*>(file->tensor_data(t)), (size_t)n);
  weight_bytes += n * 4;
  return f32_by_name[name] = weight_f32.back().data();
}

CudaExecutor::Impl::GroupMap CudaExecutor::Impl::upload_weight_groups() {
  const ir::Graph& g = plan.graph;
  const gguf::File& f = *file;
  // Groups: 2..4 consecutive T-row matmuls on one input, each weight used once in the graph.
  std::map<std::string, int> weight_uses;
  for (const ir::Op& op : g.ops)
    if (op.has("weight")) ++weight_uses[op.s("weight")];
  std::map<std::string, std::vector<const ir::Op*>> group_of;  // first member's weight -> members
  GroupMap out;
  for (size_t i = 0; i < g.ops.size();) {
    const ir::Op& op = g.ops[i];
    auto groupable = [&](const ir::Op& o) {
      return o.kind == "matmul" && o.type.shape.size() == 2 && o.type.shape[0] == ir::kTokens && o.args.size() == 1 &&
             weight_uses[o.s("weight")] == 1;
    };
    size_t j = i + 1;
    if (groupable(op))
      while (j < g.ops.size() && j - i < 4 && groupable(g.ops[j]) && g.ops[j].args[0] == op.args[0]) ++j;
    if (j - i >= 2)
      for (size_t m = i; m < j; ++m) {
        group_of[op.s("weight")].push_back(&g.ops[m]);
        out.head_of[g.ops[m].s("weight")] = op.s("weight");
      }
    i = j;
  }
  for (const auto& [head, members] : group_of) {
    std::vector<const gguf::TensorInfo*> ts;
    int64_t cols = -1, rows = 0;
    bool ok = true;
    for (const ir::Op* m : members) {
      const gguf::TensorInfo& t = need_tensor(f, m->s("weight"), *m);
      ok &= t.ne.size() == 2 && t.type == gguf::TensorType::Q8_0 && (cols < 0 || (int64_t)t.ne[0] == cols);
      if (!ok) break;
      cols = (int64_t)t.ne[0];
      rows += (int64_t)t.ne[1];
      ts.push_back(&t);
    }
    if (!ok) continue;  // the members load (or fail with their own message) one by one
    std::vector<int8_t> qs(cuda::q8_qs_bytes(rows, cols));
    std::vector<uint16_t> sc((size_t)rows * (size_t)(cols / 32));
    int64_t r0 = 0;
    for (const auto* t : ts) {
      cuda::repack_q8_0(f.tensor_data(*t), (int64_t)t->ne[1], cols, qs.data() + r0 * cols, sc.data() + r0 * (cols / 32));
      r0 += (int64_t)t->ne[1];
    }
    const std::string what = head + " (+" + std::to_string(members.size() - 1) + " stacked)";
    weight_qs.emplace_back(opt.device, qs.size(), what + " int8");
    weight_qs.back().upload(qs);
    weight_scales.emplace_back(opt.device, sc.size(), what + " scales");
    weight_scales.back().upload(sc);
    weight_bytes += (int64_t)(qs.size() + sc.size() * 2);
    MatmulGroup grp;
    grp.merged = {weight_qs.back().data(), weight_scales.back().data(), rows, cols};
    grp.gemv = load(cuda::gemv_q8_0_variant(cols, plan.precise_rows >= 1 ? 2 : 1));
    groups.push_back(grp);
    out.index[head] = (int)groups.size() - 1;
    r0 = 0;
    for (const auto* t : ts) {
      const int64_t n = (int64_t)t->ne[1];
      q8_by_name[t->name] = {grp.merged.qs + r0 * cols, grp.merged.scales + r0 * (cols / 32), n, cols};
      r0 += n;
    }
  }
  return out;
}

}  // namespace qrig::runtime
