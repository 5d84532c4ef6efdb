// TEMPORARY (not committed): records, with the code of main before the plan redesign, which kernel variants
// the CUDA executor launches for every op of the preset plans, per range of rows, as golden files.
#include <catch2/catch.hpp>

#include <fstream>
#include <regex>
#include <set>
#include <sstream>

#include <fmt/format.h>

#include "runtime/cuda/attention.h"
#include "runtime/cuda/gdn.h"
#include "runtime/cuda/gemm.h"
#include "runtime/cuda/plan_kernels.h"
#include "runtime/cuda/pointwise.h"
#include "runtime/cuda/sampling.h"
#include "tests/cuda/cuda_test_util.h"

using namespace qrig;
using namespace qrig::cuda;

namespace {

// The old executor's matmul groups (executor_weights.cpp upload_weight_groups), by weight name -> head weight.
std::map<std::string, std::string> groups_of(const ir::Graph& g) {
  std::map<std::string, int> uses;
  for (const auto& op : g.ops)
    if (op.has("weight")) ++uses[op.s("weight")];
  std::map<std::string, std::string> head_of;
  for (size_t i = 0; i < g.ops.size();) {
    const ir::Op& op = g.ops[i];
    auto groupable = [&](const ir::Op& o) {
      return o.kind == "matmul" && o.type.shape.size() == 2 && o.type.shape[0] == ir::kTokens && o.args.size() == 1 &&
             uses[o.s("weight")] == 1;
    };
    size_t j = i + 1;
    if (groupable(op))
      while (j < g.ops.size() && j - i < 4 && groupable(g.ops[j]) && g.ops[j].args[0] == op.args[0]) ++j;
    if (j - i >= 2)
      for (size_t m = i; m < j; ++m) head_of[g.ops[m].s("weight")] = op.s("weight");
    i = j;
  }
  return head_of;
}

std::string ranges(const std::vector<std::pair<int64_t, std::string>>& per_t, int64_t max_t) {
  // per_t: (T, names) for T = 1..max_t, in order
  std::string out;
  size_t i = 0;
  while (i < per_t.size()) {
    size_t j = i;
    while (j + 1 < per_t.size() && per_t[j + 1].second == per_t[i].second) ++j;
    if (!per_t[i].second.empty())
      out += fmt::format("{}{}-{}:{}", out.empty() ? "" : " ", per_t[i].first, per_t[j].first, per_t[i].second);
    i = j + 1;
  }
  (void)max_t;
  return out;
}

// Writes the lines with the layer prefix of op names replaced by "l*." and identical lines counted once
// ("COUNT x LINE"), in the order of first appearance.
struct Deduped {
  std::vector<std::string> order;
  std::map<std::string, int> count;
  std::ostringstream line_buf;
  void flush_line(std::string line) {
    static const std::regex layer("^l[0-9]+\\.");
    line = std::regex_replace(line, layer, "l*.");
    if (count[line]++ == 0) order.push_back(line);
  }
};

void dump(const std::string& model, const std::string& rig, const ir::Plan& p, const std::string& path) {
  std::ostringstream f;
  const ir::Graph& g = p.graph;
  const int sms = (int)p.device_sms;
  const int64_t max_t = p.max_batch_tokens;
  const int64_t max_r = std::min(max_t, std::max<int64_t>(1, p.max_sequences));
  f << fmt::format("# {} on {}: max_batch_tokens {} max_sequences {} precise_rows {} context {} sms {}\n", model, rig,
                   max_t, p.max_sequences, p.precise_rows, p.context_length, sms);
  auto head_of = groups_of(g);
  std::set<std::string> fused_norms;
  for (const auto& op : g.ops)
    if (op.kind == "rmsnorm" && rmsnorm_feeds_matmul(g, op)) fused_norms.insert(op.result);
  for (const auto& op : g.ops) {
    const std::string id = op.result.empty() ? op.kind + "@" + op.s("cache") : op.result;
    const bool rows = !op.type.shape.empty() && op.type.shape[0] == ir::kRows;
    const int64_t most = rows ? max_r : max_t;
    std::vector<std::pair<int64_t, std::string>> per_t;
    auto each = [&](auto fn) {
      for (int64_t T = 1; T <= most; ++T) per_t.emplace_back(T, fn(T));
    };
    if (op.kind == "embed") {
      each([&](int64_t) { return embed_q8_0_variant(op.type.shape.back()).name; });
    } else if (op.kind == "rmsnorm") {
      const int64_t w = op.type.shape.back();
      each([&](int64_t T) {
        if (!fused_norms.count(op.result)) return rmsnorm_f32_variant(w).name;
        return rmsnorm_f32_variant(w, T <= p.precise_rows ? 2 : 1).name;
      });
    } else if (op.kind == "matmul") {
      const int64_t k = g.type_of(op.args[0])->shape.back(), n = op.type.shape.back();
      const bool fused_in = fused_norms.count(op.args[0]) > 0;
      auto h = head_of.find(op.s("weight"));
      const bool in_group = h != head_of.end();
      const bool head = in_group && h->second == op.s("weight");
      // quantization of the input (the first matmul reading a non-fused value quantizes it; group members after
      // the head reuse it)
      bool first_reader = true;
      for (const auto& o : g.ops) {
        if (&o == &op) break;
        if (o.kind == "matmul" && o.args[0] == op.args[0]) first_reader = false;
      }
      std::vector<std::pair<int64_t, std::string>> qt;
      for (int64_t T = 1; T <= most; ++T) {
        const bool two = T <= p.precise_rows;
        qt.emplace_back(T, !fused_in && first_reader ? quant_act_q8_variant(two ? 2 : 1).name : std::string());
      }
      const std::string q = ranges(qt, most);
      if (!q.empty()) f << fmt::format("{}.quant {}\n", id, q);
      each([&](int64_t T) -> std::string {
        const bool two = T <= p.precise_rows;
        if (T == 1 && in_group) return head ? gemv_q8_0_variant(k, p.precise_rows >= 1 ? 2 : 1).name + "@group" : "";
        return matmul_q8_0_choice(k, n, T, sms, two ? 2 : 1).name;
      });
    } else if (op.kind == "add") {
      each([&](int64_t) { return add_f32_variant().name; });
    } else if (op.kind == "swiglu") {
      each([&](int64_t) { return swiglu_f32_variant().name; });
    } else if (op.kind == "conv1d_silu") {
      const ir::State* st = g.state(op.s("state"));
      each([&](int64_t) { return conv1d_silu_f32_variant(st->type.shape[0] + 1).name; });
    } else if (op.kind == "gdn") {
      const GdnDims d{op.i("key_heads"), op.i("value_heads"), op.i("key_dim"), op.i("value_dim")};
      const auto vs = gdn_variants(d, op.i_or("chunk", 64));
      const int64_t below = op.i_or("recurrent_below", 1);
      each([&](int64_t T) { return T < below ? vs[0].name : vs[1].name + "+" + vs[2].name; });
    } else if (op.kind == "gated_rmsnorm") {
      each([&](int64_t) { return gated_rmsnorm_f32_variant(op.i("head_dim")).name; });
    } else if (op.kind == "head_rmsnorm") {
      each([&](int64_t) { return head_rmsnorm_f32_variant(op.i("head_dim")).name; });
    } else if (op.kind == "rope") {
      each([&](int64_t) { return rope_neox_f32_variant(op.i("head_dim"), op.i("rope_dims")).name; });
    } else if (op.kind == "kv_write") {
      each([&](int64_t) { return kv_write_f16_variant().name; });
    } else if (op.kind == "attention") {
      const AttentionDims d{op.i("heads"), op.i("kv_heads"), op.i("head_dim")};
      const auto vs = attention_variants(d, p.context_length, sms);
      // decode n=1 for T = 1, decode n=N for 2..N, prefill above; merge when split (always listed)
      const int64_t g2 = d.Hq / d.Hkv, nmax = std::max<int64_t>(1, 8 / g2);
      each([&](int64_t T) {
        const std::string merge = vs.back().name;
        if (T == 1) return vs[0].name + "+" + merge;
        if (T <= nmax) return vs[1].name + "+" + merge;
        return vs[vs.size() - 2].name + "+" + merge;
      });
    } else if (op.kind == "gather_rows") {
      continue;
    }
    f << fmt::format("{} {}\n", id, ranges(per_t, most));
  }
  f << fmt::format("step quant_act_q8 {}\n", quant_act_q8_variant(1).name);
  f << fmt::format("step argmax {}\n", argmax_f32_variant().name);
  for (auto& v : TopKSelector::variants()) f << fmt::format("step topk {}\n", v.name);
  f << "variants";
  for (const auto& v : plan_kernels(p).variants) f << " " << v.name;
  f << "\n";
  Deduped d;
  std::istringstream in(f.str());
  for (std::string line; std::getline(in, line);) d.flush_line(line);
  std::ofstream out(path);
  for (const auto& l : d.order) out << d.count[l] << " x " << l << "\n";
}

}  // namespace

TEST_CASE("golden dump", "[golden_dump]") {
  const std::string dir = std::string(QRIG_SOURCE_DIR) + "/tests/compiler/golden/";
  std::filesystem::create_directories(dir);
  for (const std::string rig : {"h200", "cmp-100-210-x4"})
    for (const std::string model : {"tiny", "9b", "27b"}) {
      // batch 64 (the CUDA tests' preset plans) and the compile defaults (512 tokens, 4 sequences) where it fits
      dump(model, rig, test::preset_plan(model, rig), dir + model + "@" + rig + "_b64.txt");
      static test::ScratchDir sd("golden");
      const std::string path =
          model == "tiny" ? test::kFixtures + "tiny.gguf" : test::write_sparse_synth(model, sd.path).string();
      const gguf::File f = gguf::File::open(path);
      compiler::CompileOptions o;
      try {
        const ir::Plan p = compiler::compile(f, compiler::Rig::load(test::kRigs + rig + ".toml"), o);
        dump(model, rig, p, dir + model + "@" + rig + "_b512.txt");
      } catch (const std::exception& e) {
        WARN(model << "@" << rig << " b512: " << e.what());
      }
    }
}
