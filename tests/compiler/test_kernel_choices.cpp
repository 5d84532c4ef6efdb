// The compiler's kernel pass chooses exactly what the CUDA runtime chose before the plan redesign. The golden
// files (tests/compiler/golden/, recorded with main's executor logic before the choices moved into the compiler:
// tests/cuda/golden_dump.cpp in commit af3d8d3) list, for every op of the preset plans, the variants the old
// executor launched per range of rows; this test derives the same lines from the new plans' graph.ir (the `kernel`
// attributes, the stacked matmuls' members, the quantize ops) and requires the two to be identical, and the set
// of variants the new plan names to be the old precompiled set minus what the old code precompiled and never ran.
// The goldens predate the cache formats in the attention variants' names (issue 23): the plans are compiled with
// fp16 caches (--kv k16v16) and their "_k16_v16" is dropped before comparing; they also predate the batching
// parameter of the per-sequence kernels (issue 25: "_b0" for one sequence per launch), dropped as well, and the
// decode_kernel attribute (the batched decode variants), which the old executor did not have, and the fusions into
// the quantization (add_rmsnorm_quant, swiglu_quant: issue 25), each compared as the two ops it replaces.
#include <catch2/catch.hpp>

#include <fstream>
#include <map>
#include <regex>
#include <set>
#include <sstream>

#include <fmt/format.h>

#include "ir/kernel_attr.h"
#include "kernels/matmul.h"
#include "kernels/pointwise.h"
#include "tests/plan_presets.h"

using namespace qrig;

namespace {

struct Golden {
  std::map<std::string, int> lines;    // "ID RANGES" (layer prefix as l*.) -> count
  std::set<std::string> variants;      // what the old code precompiled
  std::set<std::string> launched;      // variants named by the op and step lines
};

const std::regex kLayer("^l[0-9]+\\.");

void add_line(std::map<std::string, int>& m, const std::string& line) { ++m[std::regex_replace(line, kLayer, "l*.")]; }

// The variant names of "FIRST-LAST:A+B,C ..." entries (golden member lines may start above 1 row).
void add_names(std::set<std::string>& out, const std::string& ranges) {
  std::istringstream ss(ranges);
  for (std::string entry; ss >> entry;) {
    std::string names = entry.substr(entry.find(':') + 1);
    for (char& c : names)
      if (c == '+' || c == ',') c = ' ';
    std::istringstream ns(names);
    for (std::string n; ns >> n;) {
      if (n.size() > 6 && n.compare(n.size() - 6, 6, "@group") == 0) n.resize(n.size() - 6);
      out.insert(n);
    }
  }
}

Golden read_golden(const std::string& file) {
  std::ifstream in(std::string(QRIG_SOURCE_DIR) + "/tests/compiler/golden/" + file);
  REQUIRE(in.good());
  Golden g;
  for (std::string line; std::getline(in, line);) {
    const size_t x = line.find(" x ");
    REQUIRE(x != std::string::npos);
    const int count = std::stoi(line.substr(0, x));
    const std::string body = line.substr(x + 3);
    if (body.rfind("# ", 0) == 0) continue;
    if (body.rfind("variants ", 0) == 0) {
      std::istringstream ss(body.substr(9));
      for (std::string v; ss >> v;) g.variants.insert(v);
      continue;
    }
    if (body.rfind("step quant_act_q8 ", 0) == 0) continue;  // precompiled by the old code whether used or not
    if (body.rfind("step ", 0) == 0) {
      g.launched.insert(body.substr(body.rfind(' ') + 1));
      g.lines[body] += count;
      continue;
    }
    g.lines[body] += count;
    add_names(g.launched, body.substr(body.find(' ') + 1));
  }
  return g;
}

// The golden lines of a new plan: per op the variants per range, as the old executor's ops would name them.
std::map<std::string, int> lines_of(const ir::Plan& p, std::set<std::string>& named) {
  std::map<std::string, int> out;
  const ir::Graph& g = p.graph;
  auto first_reader = [&](const std::string& v) -> const ir::Op* {
    for (const auto& op : g.ops)
      if (!op.args.empty() && op.args[0] == v) return &op;
    return nullptr;
  };
  for (const ir::Op& op : g.ops) {
    if (op.kind == ir::OpKind::gather_rows || op.kind == ir::OpKind::bridge) continue;
    REQUIRE(op.has("kernel"));
    const std::string k =
        std::regex_replace(std::regex_replace(op.s("kernel"), std::regex("_k16_v16"), ""), std::regex("_b0_t"), "_t");
    // The fusions into the quantization (after the goldens) count as the two ops each replaces, with the variants
    // those take at the fused kernel's planes per range: an add (add_f32 on every row) and the rmsnorm_quant of its
    // sum (rmsnorm_f32 q<p>); a swiglu (swiglu_f32) and the quantize of its output (quant_act_q8 p<p>).
    if (op.kind == ir::OpKind::add_rmsnorm_quant || op.kind == ir::OpKind::swiglu_quant) {
      const auto ranges = ir::parse_launch_ranges(k);
      REQUIRE(!ranges.empty());
      std::string quantized;  // the line of the op quantizing (rmsnorm_quant, quantize)
      for (const auto& r : ranges) {
        REQUIRE(r.parts.size() == 1);
        REQUIRE(r.parts[0].size() == 1);
        const kernels::Variant v = kernels::parse_variant(r.parts[0][0]);
        const kernels::Variant unfused = op.kind == ir::OpKind::swiglu_quant
                                             ? kernels::quant_act_q8_variant(v.param("p"))
                                             : kernels::rmsnorm_f32_variant(v.param("d"), v.param("p"));
        named.insert(unfused.name);
        quantized += fmt::format(" {}-{}:{}", r.first, r.last, unfused.name);
      }
      const kernels::Variant first = op.kind == ir::OpKind::swiglu_quant ? kernels::swiglu_f32_variant()
                                                                          : kernels::add_f32_variant();
      named.insert(first.name);
      if (op.kind == ir::OpKind::add_rmsnorm_quant) {
        const std::string& id = op.results.at(1);
        REQUIRE(id.size() > 2);
        add_line(out, op.results.at(0) + fmt::format(" 1-{}:{}", ranges.back().last, first.name));  // the sum
        add_line(out, id.substr(0, id.size() - 2) + quantized);  // the norm's result, before quantization
      } else {
        const std::string& id = op.result();  // the swiglu's result + ".q"
        REQUIRE(id.size() > 2);
        add_line(out, id.substr(0, id.size() - 2) + fmt::format(" 1-{}:{}", ranges.back().last, first.name));
        const ir::Op* m = first_reader(op.result());
        REQUIRE(m);
        add_line(out, m->results.at(0) + ".quant" + quantized);
      }
      continue;
    }
    add_names(named, k);
    switch (op.kind) {
      case ir::OpKind::rmsnorm_quant: {
        std::string id = op.result();
        REQUIRE(id.size() > 2);
        add_line(out, id.substr(0, id.size() - 2) + " " + k);  // the norm's result, before quantization
        break;
      }
      case ir::OpKind::quantize: {
        const ir::Op* m = first_reader(op.result());
        REQUIRE(m);
        add_line(out, m->results.at(0) + ".quant " + k);
        break;
      }
      case ir::OpKind::matmul_stack: {
        const auto ranges = ir::parse_launch_ranges(k);
        for (size_t i = 0; i < op.results.size(); ++i) {
          std::vector<std::tuple<int64_t, int64_t, std::string>> mine;
          for (const auto& r : ranges) {
            std::string name;
            if (r.parts.size() == 1) {
              if (i == 0) name = r.parts[0][0] + "@group";  // the head launches the stacked GEMV
            } else {
              name = r.parts.at(i).at(0);
            }
            if (name.empty()) continue;
            if (!mine.empty() && std::get<2>(mine.back()) == name && std::get<1>(mine.back()) + 1 == r.first)
              std::get<1>(mine.back()) = r.last;
            else
              mine.emplace_back(r.first, r.last, name);
          }
          std::string line = op.results[i];
          for (size_t e = 0; e < mine.size(); ++e)
            line += fmt::format("{}{}-{}:{}", e ? " " : " ", std::get<0>(mine[e]), std::get<1>(mine[e]),
                                std::get<2>(mine[e]));
          add_line(out, line);
        }
        break;
      }
      case ir::OpKind::kv_write:
        add_line(out, "kv_write@kv." + op.s("k_cache").substr(2) + " " + k);
        break;
      default:
        add_line(out, op.result() + " " + k);
    }
  }
  const std::string argmax = std::get<std::string>(*g.attr("argmax_kernel"));
  named.insert(argmax);
  ++out["step argmax " + argmax];
  for (const auto& n : std::get<std::vector<std::string>>(*g.attr("top_k_kernels"))) {
    named.insert(n);
    ++out["step topk " + n];
  }
  return out;
}

void compare(const ir::Plan& p, const std::string& golden_file) {
  INFO(golden_file);
  const Golden want = read_golden(golden_file);
  std::set<std::string> named;
  const auto got = lines_of(p, named);
  for (const auto& [line, n] : want.lines) {
    auto it = got.find(line);
    INFO("golden: " << n << " x " << line.substr(0, 400));
    CHECK((it != got.end() && it->second == n));
  }
  for (const auto& [line, n] : got) {
    INFO("new: " << n << " x " << line.substr(0, 400));
    CHECK(want.lines.count(line) == 1);
  }
  // The variants the plan names: what the old code ran; the old code also precompiled a few it never ran.
  CHECK(named == want.launched);
  for (const auto& v : named) CHECK(want.variants.count(v) == 1);
  for (const auto& v : want.variants)
    if (!named.count(v)) WARN("precompiled by the old code, never launched: " << v);
}

}  // namespace

TEST_CASE("the kernel pass chooses what the CUDA runtime chose before the redesign (golden lists)", "[compiler][fixtures]") {
  for (const std::string rig : {"h200", "cmp-100-210-x4"})
    for (const std::string model : {"tiny", "9b", "27b"}) {
      compiler::CompileOptions o64;
      o64.max_batch_tokens = 64;  // 64 tokens per step
      o64.kv = "k16v16";
      compare(presets::compile_preset(model, rig, o64), model + "@" + rig + "_b64.txt");
      compiler::CompileOptions o;  // the compile defaults: 512 tokens per step, 4 sequences
      o.kv = "k16v16";
      ir::Plan p;
      try {
        p = presets::compile_preset(model, rig, o);
      } catch (const compiler::CompileError& e) {
        FAIL(model << "@" << rig << ": " << e.what());
      }
      compare(p, model + "@" + rig + "_b512.txt");
    }
}
