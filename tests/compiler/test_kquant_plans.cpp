// Plans for llama.cpp's weight formats (../shared/fixtures/kquant): CPU plans compile for every file and count
// each tensor at its real type (the weight bytes are the file's tensor bytes, listed per type in a note that
// `qrig inspect` shows); CUDA plans run every block type on the dp4a kernels (one activation plane for the types
// other than Q8_0), the F16 file is refused naming the tensor and its type; a 27B Q4_K_M plan needs fewer CMP
// cards than Q8_0.
#include <catch2/catch.hpp>

#include <map>
#include <string>

#include <fmt/format.h>

#include "compiler/compile.h"
#include "gguf/gguf.h"
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
      if (op.kind != ir::OpKind::matmul) continue;
      const auto& t = f.tensor(op.s("weight"));
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
      if (op.kind == ir::OpKind::matmul) {
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
