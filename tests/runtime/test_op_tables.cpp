// The runtime decides nothing the plan decided, checked on the sources and the tables: every op kind has its
// rows in the CPU backend's bind and run tables; no runtime or server file includes compiler code; no file of
// the CUDA runtime calls a choice function of the kernel library (it reads the variants the plan names).
#include <catch2/catch.hpp>

#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>

#include "runtime/cpu/executor.h"

namespace fs = std::filesystem;

namespace {

// The file's text without // comments (names in prose are not calls).
std::string code_of(const fs::path& p) {
  std::ifstream in(p);
  std::string out;
  for (std::string line; std::getline(in, line);) {
    const size_t c = line.find("//");
    out += (c == std::string::npos ? line : line.substr(0, c)) + "\n";
  }
  return out;
}

std::vector<fs::path> sources_under(const std::string& dir) {
  std::vector<fs::path> out;
  for (const auto& e : fs::recursive_directory_iterator(fs::path(QRIG_SOURCE_DIR) / dir))
    if (e.is_regular_file() && (e.path().extension() == ".cpp" || e.path().extension() == ".h")) out.push_back(e.path());
  return out;
}

}  // namespace

TEST_CASE("the CPU backend's op tables have a row for every op kind", "[runtime]") {
  CHECK(qrig::runtime::cpu_op_tables_complete());
}

TEST_CASE("the runtime includes no compiler code and the CUDA runtime chooses no kernel", "[runtime]") {
  const std::regex include_compiler("#include \"compiler/");
  for (const char* dir : {"runtime", "server", "text", "gguf", "ir", "kernels"}) {
    const auto files = sources_under(dir);
    REQUIRE(!files.empty());
    for (const auto& f : files) {
      INFO(f.string());
      CHECK(!std::regex_search(code_of(f), include_compiler));
    }
  }
  // The kernel library's choices and variant builders (kernels/*.h): the compiler calls them, the runtime reads
  // the names the plan holds (parse_variant) and nothing else.
  const std::regex choice(
      "\\b(choose_matmul_q8_0|choose_gdn|choose_attention|matmul_q8_0_choice|matmul_q8_0_variants|gdn_variants|"
      "attention_variants|default_tuning|top_k_variants|[a-z0-9_]+_(f32|f16|q8_0|q8)_variant|gemv_q8_0_variant|"
      "gemm_q8_0_(tiled|skinny)_variant|gdn_(recurrent|chunk_prep|chunk_scan)_variant|attn_(decode|prefill|merge)_"
      "variant|make_variant)\\s*\\(");
  const auto files = sources_under("runtime/cuda");
  REQUIRE(files.size() > 10);
  for (const auto& f : files) {
    INFO(f.string());
    std::smatch m;
    const std::string code = code_of(f);
    CHECK_FALSE(std::regex_search(code, m, choice));
    if (!m.empty()) FAIL_CHECK("calls " << m.str());
  }
}
