// llama.cpp's weight formats end to end (../shared/fixtures/kquant: one small qwen35 model quantized by
// llama-quantize into each type, float64 references of each file's dequantized weights): `qrig verify` passes
// on the CPU backend at its tolerance (1e-4) and with --emulate-dp4a at the dp4a family's (1e-1) for every file,
// the files together hold every block type qrig dequantizes, and a NaN scale in one block is refused at load
// with a message naming the tensor, not answered with NaN logits or a crash.
#include <catch2/catch.hpp>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <set>
#include <string>
#include <vector>

#include <unistd.h>

#include "gguf/gguf.h"
#include "tests/fixtures.h"
#include "tests/shell_command.h"

using namespace qrig;
using Catch::Matchers::Contains;

namespace {

const char* const kFiles[] = {"f16",  "q4_0",   "q4_1",   "q5_0",   "q5_1", "q2_k",
                              "q3_k_m", "q4_k_m", "q5_k_m", "q6_k", "iq4_nl", "iq4_xs"};

std::string kq(const std::string& name) { return qrig::fixtures::shared_path("fixtures/kquant/kq-" + name); }

// The max_rel_err of verify's summary line ("backend cpu max_rel_err X (tolerance ..."); -1 when absent.
// max_rel_err of verify's summary line ("backend cpu [kv K V] max_rel_err X ..."); -1 when there is none.
double summary_err(const std::string& text) {
  const size_t line = text.rfind("backend cpu ");
  if (line == std::string::npos) return -1.0;
  const std::string key = "max_rel_err ";
  const size_t at = text.find(key, line);
  return at == std::string::npos ? -1.0 : std::stod(text.substr(at + key.size()));
}

}  // namespace

TEST_CASE("qrig verify passes on every kquant fixture, on the CPU and with --emulate-dp4a", "[cli][fixtures]") {
  const std::string bin = QRIG_BINARY;
  std::set<std::string> types;
  for (const char* name : kFiles) {
    INFO("kq-" << name);
    const std::string model = kq(std::string(name) + ".gguf"), ref = kq(std::string(name) + "-ref.gguf");
    REQUIRE(std::filesystem::exists(model));
    REQUIRE(std::filesystem::exists(ref));
    const gguf::File f = gguf::File::open(model);
    for (const auto& t : f.tensors()) types.insert(gguf::tensor_type_name(t.type));
    const auto cpu = qrig::test::run_command(bin + " verify " + model + " " + ref, true);
    INFO(cpu.text);
    CHECK(cpu.rc == 0);
    const double e = summary_err(cpu.text);
    CHECK(e >= 0);
    CHECK(e <= 1e-4);
    const auto emu = qrig::test::run_command(bin + " verify " + model + " " + ref + " --emulate-dp4a", true);
    INFO(emu.text);
    CHECK(emu.rc == 0);
    CHECK(summary_err(emu.text) > e);  // the int8 activations do show
  }
  for (const char* t : {"Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K", "IQ4_NL", "IQ4_XS"})
    CHECK(types.count(t) == 1);
}

TEST_CASE("a kquant file with a NaN scale is refused at load, naming the tensor", "[cli][fixtures]") {
  const std::string bin = QRIG_BINARY;
  const std::string src = kq("q4_k_m.gguf");
  REQUIRE(std::filesystem::exists(src));
  std::string name;
  uint64_t pos = 0;
  {
    const gguf::File f = gguf::File::open(src);
    for (const auto& t : f.tensors())
      if (t.type == gguf::TensorType::Q4_K && t.name.find("ffn_up") != std::string::npos) {
        name = t.name;
        pos = f.data_offset() + t.offset + 3 * 144;  // block 3's d
        break;
      }
  }
  REQUIRE(!name.empty());
  std::ifstream in(src, std::ios::binary);
  std::vector<char> bytes((std::istreambuf_iterator<char>(in)), {});
  bytes[pos] = 0x00;
  bytes[pos + 1] = 0x7e;  // fp16 NaN
  const auto dir = std::filesystem::temp_directory_path() / ("qrig-kquant-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  const std::string bad = (dir / "kq-nan.gguf").string();
  std::ofstream(bad, std::ios::binary).write(bytes.data(), (std::streamsize)bytes.size());
  const auto r = qrig::test::run_command(bin + " verify " + bad + " " + kq("q4_k_m-ref.gguf"), true);
  INFO(r.text);
  CHECK(r.rc != 0);
  CHECK(r.rc != -1);  // exited, did not crash
  CHECK_THAT(r.text, Contains(name) && Contains("NaN") && Contains("Q4_K") && Contains("corrupt"));
  std::filesystem::remove_all(dir);
}

// A GPU plan of the Q4_K_M file (compiled without a GPU, kernels not precompiled) stacks its matmuls on one input per
// format, and `qrig inspect` shows it: matmul_stack rows of the kernel table with the stack's format and its
// single-row launch, the fusion note's count per format, the stacked uploads of the memory plan, and with --graph
// each stack's formats (q and k Q4_K, the Q6_K members of the file's mix alone).
TEST_CASE("qrig inspect shows a Q4_K_M GPU plan's stacked matmuls", "[cli][fixtures][wq]") {
  const std::string bin = QRIG_BINARY;
  const auto dir = std::filesystem::temp_directory_path() / ("qrig-kquant-stack-" + std::to_string(::getpid()));
  std::filesystem::remove_all(dir);
  const std::string plan = (dir / "plan").string();
  const auto c = qrig::test::run_command(bin + " compile " + kq("q4_k_m.gguf") + " --rig " +
                                             std::string(QRIG_SOURCE_DIR) + "/rigs/h200.toml --no-precompile -o " + plan,
                                         true);
  INFO(c.text);
  REQUIRE(c.rc == 0);
  const auto r = qrig::test::run_command(bin + " inspect " + plan + " --graph", true);
  INFO(r.text);
  CHECK(r.rc == 0);
  CHECK_THAT(r.text, Contains("matmul_stack  256->1024|512|4|4 q4_k") &&
                         Contains("one row: one launch over the 4 stacked weights") &&
                         Contains("-> matmul_stack") && Contains("q4_k 8") &&
                         Contains("weights on cuda:0 stacked: 8 matmul_stack uploads of 21 tensors") &&
                         Contains(R"(formats=["q4_k","q4_k"])") && Contains(R"(format="q6_k")"));
  std::filesystem::remove_all(dir);
}
