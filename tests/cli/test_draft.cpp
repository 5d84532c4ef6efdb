// The CLI of speculative decoding with the MTP head: qrig verify checks the head against the draft reference
// (tiny-mtp-draft-ref.gguf) within 1e-4 on every row and intermediate, and fails a tolerance it misses; --draft N on
// compile (shown by inspect), run and bench (acceptance and tokens per step reported); CUDA plans draft with --draft N
// (inspect shows the head's kernels, cache and memory; compiled without a GPU) and are off by default with a note; a
// plan directory's drafting is decided.
#include <catch2/catch.hpp>

#include <filesystem>
#include <regex>
#include <string>

#include <unistd.h>

#include "tests/fixtures.h"
#include "tests/shell_command.h"

namespace {

const std::string kShared = qrig::fixtures::shared_dir();
const std::string kTinyMtp = kShared + "/fixtures/tiny-mtp.gguf";
const std::string kDraftRef = kShared + "/fixtures/tiny-mtp-draft-ref.gguf";

qrig::test::CommandOutput sh(const std::string& cmd, bool both = true) { return qrig::test::run_command(cmd, both); }

std::string tmp(const std::string& name) {
  auto dir = std::filesystem::temp_directory_path() / ("qrig-draft-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  return (dir / name).string();
}

double number_after(const std::string& text, const std::string& key) {
  std::smatch m;
  REQUIRE(std::regex_search(text, m, std::regex(key + " ([0-9.e+-]+)")));
  return std::stod(m[1]);
}

}  // namespace

TEST_CASE("qrig verify checks the MTP draft head against the draft reference on the CPU", "[cli][fixtures]") {
  const std::string bin = QRIG_BINARY;
  for (const char* split : {"", " --split 20"}) {
    INFO("split '" << split << "'");
    auto v = sh(bin + " verify " + kTinyMtp + " " + kDraftRef + " --draft 2" + split);
    INFO(v.text);
    CHECK(v.rc == 0);
    for (const char* seq : {"seq long mtp", "seq short mtp", "seq random mtp"}) CHECK(v.text.find(seq) != std::string::npos);
    CHECK(number_after(v.text, "draft mtp max_rel_err") <= 1e-4);
    CHECK(v.text.find("top1 1.0000 (391/391)") != std::string::npos);
  }
  // The same check fails a tolerance below what fp32 reaches (it can fail), and a plan without the head is refused.
  CHECK(sh(bin + " verify " + kTinyMtp + " " + kDraftRef + " --draft 2 --tol 1e-9").rc == 1);
  const std::string off = tmp("off-plan");
  REQUIRE(sh(bin + " compile " + kTinyMtp + " --draft 0 --ctx 512 -o " + off).rc == 0);
  auto no = sh(bin + " verify " + off + " " + kDraftRef);
  CHECK(no.rc != 0);
  CHECK(no.text.find("no MTP draft head") != std::string::npos);
}

TEST_CASE("--draft N on compile, inspect, run and bench; on CUDA plans too (off by default there)", "[cli][fixtures]") {
  const std::string bin = QRIG_BINARY;
  const std::string plan = tmp("draft-plan");
  auto c = sh(bin + " compile " + kTinyMtp + " --draft 2 --ctx 512 -o " + plan);
  REQUIRE(c.rc == 0);
  CHECK(c.text.find("draft.ir") != std::string::npos);
  auto i = sh(bin + " inspect " + plan);
  CHECK(i.text.find("draft     2 tokens per step from the MTP head") != std::string::npos);
  CHECK(i.text.find("draft: 2 token(s) per step") != std::string::npos);
  CHECK(i.text.find("rollback copies of the recurrent states") != std::string::npos);
  auto r = sh(bin + " run " + plan + " -p 'hello there' -n 12 --temp 0");
  CHECK(r.rc == 0);
  CHECK(r.text.find("draft: 2 tokens per step planned | acceptance") != std::string::npos);
  CHECK(r.text.find("tokens per step (12 tokens in") != std::string::npos);
  // Greedy text with drafting equals drafting off.
  auto off = sh(bin + " run " + kTinyMtp + " --draft 0 -p 'hello there' -n 12 --temp 0 --quiet", false);
  auto on = sh(bin + " run " + plan + " -p 'hello there' -n 12 --temp 0 --quiet", false);
  CHECK(off.rc == 0);
  CHECK(on.text == off.text);
  CHECK(sh(bin + " run " + plan + " -p hi --draft 1").rc == 2);  // a plan directory's drafting is decided
  auto b = sh(bin + " bench " + kTinyMtp + " --draft 1 -p 16 -n 8 -r 1");
  CHECK(b.rc == 0);
  CHECK(b.text.find("draft: 1 tokens per step (MTP head): acceptance") != std::string::npos);
  // CUDA: --draft N plans the MTP head on the GPU (inspect shows its kernels, cache and memory); by default drafting
  // is off there with the reason.
  const std::string rig = std::string(QRIG_SOURCE_DIR) + "/rigs/h200.toml";
  const std::string cuda_plan = tmp("cuda-plan");
  auto cuda = sh(bin + " compile " + kTinyMtp + " --rig " + rig + " --draft 2 --no-precompile -o " + cuda_plan);
  CHECK(cuda.rc == 0);
  auto ci = sh(bin + " inspect " + cuda_plan);
  CHECK(ci.text.find("draft     2 tokens per step from the MTP head") != std::string::npos);
  CHECK(ci.text.find("its cache k16v16, 1024 bytes per token") != std::string::npos);
  CHECK(ci.text.find("activations") != std::string::npos);
  CHECK(ci.text.find("concat        draft") != std::string::npos);      // the head's kernel rows
  CHECK(ci.text.find("attention     draft heads 2/1 dim 256") != std::string::npos);
  CHECK(ci.text.find("memory: the MTP head on cuda:0") != std::string::npos);
  CHECK(ci.text.find("two planes up to 12 rows") != std::string::npos);  // a verify of 3 tokens in each of 4 slots
  auto cuda_default = sh(bin + " compile " + kTinyMtp + " --rig " + rig + " --no-precompile -o " + tmp("cuda-plan2"));
  CHECK(cuda_default.rc == 0);
  CHECK(cuda_default.text.find("draft: off: on the CUDA backend drafting is turned on by --draft N") !=
        std::string::npos);
  // A model without an MTP block: a forced --draft is refused, the default is off.
  auto plain = sh(bin + " compile " + kShared + "/fixtures/tiny.gguf --draft 1 -o " + tmp("plain"));
  CHECK(plain.rc != 0);
  CHECK(plain.text.find("no MTP block") != std::string::npos);
}
