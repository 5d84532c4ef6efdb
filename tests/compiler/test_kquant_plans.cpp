// Plans for llama.cpp's weight formats (../shared/fixtures/kquant): CPU plans compile for every file and count
// each tensor at its real type (the weight bytes are the file's tensor bytes, listed per type in a note that
// `qrig inspect` shows); CUDA plans run every block type on the dp4a kernels (one activation plane for the types
// other than Q8_0), the F16 file is refused naming the tensor and its type; a 27B Q4_K_M plan needs fewer CMP
// cards than Q8_0; the 9B Q4_K_M plan stacks the matmuls on one input by format (q|k Q4_K and v Q6_K apart), as
// its graph text, kernel table and notes (`qrig inspect`) show.
#include <catch2/catch.hpp>

#include <map>
#include <set>
#include <string>

#include <fmt/format.h>

#include "compiler/compile.h"
#include "gguf/gguf.h"
#include "ir/kernel_attr.h"
#include "kernels/matmul.h"
#include "tests/fixtures.h"
#include "tests/plan_presets.h"

using namespace qrig;
using Catch::Matchers::Contains;

namespace {
const char* const kFiles[] = {"f16",  "q4_0",   "q4_1",   "q5_0",   "q5_1", "q2_k",
                              "q3_k_m", "q4_k_m", "q5_k_m", "q6_k", "iq4_nl", "iq4_xs"};
std::string kq(const std::string& name) { return qrig::fixtures::shared_path("fixtures/kquant/kq-" + name + ".gguf"); }
const std::string kRigs = std::string(QRIG_SOURCE_DIR) + "/rigs/";
}  // namespace

TEST_CASE("kquant files: CPU plans count every tensor at its type; CUDA plans run every block type, F16 matrices are refused", "[compiler][fixtures]") {
  const compiler::Rig cpu = compiler::Rig::load(kRigs + "cpu.toml");
  const compiler::Rig gpu = compiler::Rig::load(kRigs + "h200.toml");
  int64_t cuda_extra = -1;
  for (const char* name : kFiles) {
    INFO("kq-" << name);
    const gguf::File f = gguf::File::open(kq(name));
    std::map<std::string, std::pair<int64_t, int64_t>> want;  // type -> tensors, bytes
    int64_t bytes = 0;
    for (const auto& t : f.tensors()) {
      auto& w = want[gguf::tensor_type_name(t.type)];
      ++w.first;
      w.second += (int64_t)t.n_bytes;
      bytes += (int64_t)t.n_bytes;
    }
    const ir::Plan plan = compiler::compile(f, cpu, {});
    CHECK(plan.backend == "cpu");
    CHECK(plan.memory.weight_bytes == bytes);
    REQUIRE(plan.memory.devices.size() == 1);
    CHECK(plan.memory.devices[0].weights == bytes);
    std::string note;
    for (const auto& n : plan.notes)
      if (n.rfind("weights on cpu by type:", 0) == 0) note = n;
    INFO(note);
    for (const auto& [type, w] : want)
      CHECK_THAT(note, Contains(fmt::format(" {} {} ({:.2f} MiB)", type, w.first, (double)w.second / (1 << 20))));

    // CUDA: every block type has dp4a kernels, uploaded as the file's bytes (split in two); F16 matrices have
    // none: the first weight the CUDA graph reads, the embedding, is named.
    if (std::string(name) == "f16") {
      CHECK_THROWS_WITH(compiler::compile(f, gpu, {}),
                        Contains("token_embd.weight") && Contains("F16") && Contains("none for F16 yet") &&
                            Contains("--backend cpu"));
      continue;
    }
    const ir::Plan cp = compiler::compile(f, gpu, {});
    CHECK(cp.backend == "cuda");
    REQUIRE(cp.memory.devices.size() == 1);
    // Every matrix at its file size; beyond them the device holds only the RoPE tables (f64), the same for every
    // file (one architecture).
    const int64_t extra = cp.memory.devices[0].weights - bytes;
    if (cuda_extra < 0) cuda_extra = extra;
    CHECK(extra == cuda_extra);
    CHECK(extra > 0);
    CHECK(extra < 65536);
    for (const auto& op : cp.graph.ops) {
      if (op.kind != ir::OpKind::matmul && op.kind != ir::OpKind::matmul_stack) continue;
      const auto& t = f.tensor(op.kind == ir::OpKind::matmul ? op.s("weight") : op.strs("weights").at(0));
      INFO(op.describe() << " " << op.s("kernel"));
      if (t.type == gguf::TensorType::Q8_0) {
        CHECK(op.s("kernel").find("_q8_0_") != std::string::npos);
        CHECK(op.i("precise_rows") == cp.precise_rows);
      } else {
        CHECK((op.s("kernel").find("wq_dp4a") != std::string::npos &&
               op.s("kernel").find(fmt::format("_w{}_", (int)t.type)) != std::string::npos));
        // One activation plane at every row count, decode included (quantize_matmul_inputs): no p2 kernel.
        CHECK(op.i("precise_rows") == 0);
        CHECK(op.s("kernel").find("_p2_") == std::string::npos);
      }
    }
    // With --precise-rows asked, block-type matmuls follow it as Q8_0's do.
    compiler::CompileOptions precise;
    precise.precise_rows = 4;
    const ir::Plan pp = compiler::compile(f, gpu, precise);
    for (const auto& op : pp.graph.ops)
      if (op.kind == ir::OpKind::matmul || op.kind == ir::OpKind::matmul_stack) {
        INFO(op.describe() << " " << op.s("kernel"));
        CHECK(op.i("precise_rows") == 4);
        CHECK(op.s("kernel").find("_p2_") != std::string::npos);
      }
  }
}

// The point of the small formats on 16 GB cards: the fewest CMP 100-210 cards a 27B plan needs at 32K tokens (4
// sequences), found by compiling with --gpus 1, 2, ... (the placement pass refuses what does not fit).
TEST_CASE("27B at Q4_K_M fits in fewer CMP cards than the same model at Q8_0", "[compiler][pipeline]") {
  auto fewest = [](const std::string& type) {
    for (int64_t n = 1; n <= 4; ++n) {
      compiler::CompileOptions o;
      o.context_length = 32768;
      o.max_gpus = n;
      try {
        const ir::Plan p = presets::compile_preset("27b", "cmp-100-210-x4", o, type);
        CHECK((int64_t)p.placement.size() == n);
        CHECK(p.arch_target == "sm_70");
        for (const auto& d : p.memory.devices) CHECK(d.total <= d.budget);
        return std::make_pair(n, p.memory.weight_bytes);
      } catch (const compiler::CompileError& e) {
        INFO(type << " on " << n << ": " << e.what());
        CHECK(std::string(e.what()).find("fit") != std::string::npos);
      }
    }
    return std::make_pair(int64_t{0}, int64_t{0});
  };
  const auto [q8, q8_bytes] = fewest("q8_0");
  const auto [q4, q4_bytes] = fewest("q4_k_m");
  INFO("Q8_0: " << q8 << " cards, " << q8_bytes << " weight bytes; Q4_K_M: " << q4 << " cards, " << q4_bytes);
  REQUIRE(q8 > 0);
  REQUIRE(q4 > 0);
  CHECK(q4 < q8);
  CHECK((double)q4_bytes < 0.65 * (double)q8_bytes);  // ~16.5 GB of ~28.6
}

// The stacking pass on block types: the 9B synth at Q4_K_M (llama.cpp's mix: attn_v / attn_qkv and ffn_down Q6_K in
// some layers, the rest Q4_K) on an H200. Every group of matmuls that the Q8_0 plan stacks (q|k|v, gate|up, the GDN
// input projections) is, in the Q4_K_M plan, one stack per format with two or more members and a plain matmul for a
// format with one (e.g. q|k Q4_K stacked, v Q6_K alone), all reading the group's input; the single-row launch over a
// stack is the type's one-row kernel for the stacked shape, steps of more rows run each member's own choice; a
// decode token launches only as many matmuls more than Q8_0's as there are such lone members. The graph text names
// each stack's formats, the kernel table has its rows ("matmul_stack" with the member widths and format) and a note
// counts the stacked uploads per format.
TEST_CASE("a Q4_K_M plan stacks the matmuls on one input by format, and says so", "[compiler][wq]") {
  compiler::CompileOptions o;
  o.max_batch_tokens = 64;
  static presets::ScratchDir dir("kquant-stacks");
  const gguf::File q4f = gguf::File::open(presets::write_sparse_synth("9b", dir.path, "q4_k_m"));
  const compiler::Rig rig = compiler::Rig::load(kRigs + "h200.toml");
  const ir::Plan q8 = presets::compile_preset("9b", "h200", o);
  const ir::Plan q4 = compiler::compile(q4f, rig, o);
  REQUIRE(q4.backend == "cuda");
  auto type_of = [&](const std::string& w) { return (int64_t)q4f.tensor(w).type; };
  // Single-row matmul launches of a decode token: one per matmul and one per stack.
  auto launches = [](const ir::Plan& p) {
    int64_t n = 0;
    for (const auto& op : p.graph.ops) n += op.kind == ir::OpKind::matmul || op.kind == ir::OpKind::matmul_stack;
    return n;
  };
  // Per input value: the matmuls and stacks reading it, with their weights.
  std::map<std::string, std::vector<const ir::Op*>> readers;
  for (const auto& op : q4.graph.ops)
    if (op.kind == ir::OpKind::matmul || op.kind == ir::OpKind::matmul_stack) readers[op.args.at(0)].push_back(&op);
  std::map<std::string, const ir::Op*> stack_of;  // weight -> its stack in the Q4_K_M plan
  for (const auto& op : q4.graph.ops)
    if (op.kind == ir::OpKind::matmul_stack)
      for (const auto& w : op.strs("weights")) stack_of[w] = &op;
  int64_t lone = 0, mixed_groups = 0;
  std::map<std::string, int> stacks_by_format;
  for (const auto& g : q8.graph.ops) {
    if (g.kind != ir::OpKind::matmul_stack) continue;
    INFO(g.describe());
    const auto& ws = g.strs("weights");
    std::map<int64_t, std::vector<std::string>> by_type;
    for (const auto& w : ws) by_type[type_of(w)].push_back(w);
    mixed_groups += by_type.size() > 1;
    std::set<std::string> inputs;
    for (const auto& [t, members] : by_type) {
      if (members.size() == 1) {  // a lone format: a plain matmul, not in any stack
        ++lone;
        CHECK(stack_of.count(members[0]) == 0);
        continue;
      }
      REQUIRE(stack_of.count(members[0]) == 1);
      const ir::Op& s = *stack_of.at(members[0]);
      CHECK(s.strs("weights") == members);  // the format's members, in their order
      CHECK(s.strs("formats") == std::vector<std::string>(members.size(), s.strs("formats").at(0)));
      inputs.insert(s.args.at(0));
      ++stacks_by_format[s.strs("formats").at(0)];
      // Its kernels: one launch over the stack for one row (the type's one-row kernel of the stacked shape: the
      // same at any row count, so it is the members' own one-row choice), each member's own for more.
      const auto ranges = ir::parse_launch_ranges(s.s("kernel"));
      REQUIRE(ranges.size() >= 2);
      CHECK(ranges[0].first == 1);
      CHECK(ranges[0].last == 1);
      REQUIRE(ranges[0].parts.size() == 1);
      REQUIRE(ranges[0].parts[0].size() == 1);
      int64_t rows = 0;
      for (const auto& t2 : s.types) rows += t2.shape.back();
      const auto want = kernels::choose_matmul_stack_wq(t, 4096, rows, (int64_t)members.size(), 1, (int)q4.device_sms);
      CHECK(ranges[0].parts[0][0] == want.parts.at(0).at(0).name);
      CHECK(ranges[0].parts[0][0].find(fmt::format("_w{}_", t)) != std::string::npos);
      for (size_t r = 1; r < ranges.size(); ++r) CHECK(ranges[r].parts.size() == members.size());
      CHECK(s.i("precise_rows") == 0);
    }
    // Every part of the group reads the group's one input (a lone member as well).
    for (const auto& w : ws)
      for (const auto& [in, ops] : readers)
        for (const ir::Op* op : ops) {
          const bool has = op->kind == ir::OpKind::matmul ? op->s("weight") == w
                                                           : std::find(op->strs("weights").begin(),
                                                                       op->strs("weights").end(), w) != op->strs("weights").end();
          if (has) inputs.insert(in);
        }
    CHECK(inputs.size() == 1);
  }
  INFO("Q8_0: " << launches(q8) << " matmul launches per token, Q4_K_M: " << launches(q4) << "; " << lone
                << " lone members in " << mixed_groups << " mixed groups");
  CHECK(mixed_groups > 0);  // attention layers with v in Q6_K, GDN layers with qkv in Q6_K
  CHECK(stacks_by_format["q4_k"] > 0);
  CHECK(launches(q4) == launches(q8) + lone);
  // No two plain matmuls of one format read one input: they would have been stacked.
  for (const auto& [in, ops] : readers) {
    std::map<std::string, int> plain;
    for (const ir::Op* op : ops)
      if (op->kind == ir::OpKind::matmul) CHECK(++plain[op->s("format")] == 1);
  }
  // What `qrig inspect` prints: the graph's stacks with their formats, the kernel table's rows, the notes.
  const std::string text = ir::print(q4.graph);
  CHECK_THAT(text, Contains("= matmul_stack(") && Contains(R"(formats=["q4_k","q4_k"])"));
  bool table_row = false;
  for (const auto& k : q4.kernels)
    table_row |= k.op == "matmul_stack" && k.shape.find(" q4_k") != std::string::npos && k.first_rows == 1 &&
                 k.reason.find("one launch over the") != std::string::npos;
  CHECK(table_row);
  std::string fusion, uploads;
  for (const auto& n : q4.notes) {
    if (n.rfind("fusion:", 0) == 0) fusion = n;
    if (n.rfind("weights on cuda:0 stacked:", 0) == 0) uploads = n;
  }
  INFO(fusion << "\n" << uploads);
  int total = 0;
  for (const auto& [f, n] : stacks_by_format) total += n;
  CHECK_THAT(fusion, Contains(fmt::format("q4_k {}", stacks_by_format["q4_k"])));
  CHECK_THAT(uploads, Contains(fmt::format(" q4_k {} of", stacks_by_format["q4_k"])));
  CHECK_THAT(uploads, Contains(fmt::format("{} matmul_stack uploads", total)));
}
