// Plans for llama.cpp's weight formats (../shared/fixtures/kquant): CPU plans compile for every file and count
// each tensor at its real type (the weight bytes are the file's tensor bytes, listed per type in a note that
// `qrig inspect` shows); CUDA plans, whose executor runs Q8_0 matrices only, are refused naming the tensor and
// its type, and so is the F16 file.
#include <catch2/catch.hpp>

#include <map>
#include <string>

#include <fmt/format.h>

#include "compiler/compile.h"
#include "gguf/gguf.h"
#include "tests/fixtures.h"

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
      if (t.type == gguf::TensorType::Q8_0)
        CHECK(op.s("kernel").find("_q8_0_") != std::string::npos);
      else
        CHECK((op.s("kernel").find("wq_dp4a") != std::string::npos &&
               op.s("kernel").find(fmt::format("_w{}_", (int)t.type)) != std::string::npos));
    }
  }
}
