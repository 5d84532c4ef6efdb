// `qrig compile` and `qrig inspect` for the CMP rig, run as a user runs them: the plan records which NVRTC
// compiled its kernels, for which code target and how they load (plan.toml kernel_nvrtc / kernel_target /
// kernel_code), and inspect shows it. With an NVRTC that targets sm_70 the kernels are sm_70 cubins; with only
// one that cannot (NVRTC 13, named through QRIG_NVRTC) the plan is the degraded sm_75 one and says what to
// install; with none, compile fails naming the package; `--ptx` makes a plan that loads sm_70 PTX through the
// driver's JIT (how the sm_70 family is checked on a newer GPU).
#include <catch2/catch.hpp>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>

#include <unistd.h>

#include "runtime/cuda/nvrtc_lib.h"
#include "tests/fixtures.h"
#include "tests/missing_input.h"
#include "tests/shell_command.h"

using namespace qrig;
using namespace qrig::cuda;

namespace {

namespace fs = std::filesystem;

qrig::test::CommandOutput sh(const std::string& cmd) { return qrig::test::run_command(cmd, true); }  // stdout + stderr

std::string read_file(const fs::path& p) {
  std::ifstream f(p);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

}  // namespace

TEST_CASE("qrig compile records the NVRTC, code target and loading of a CMP plan's kernels; inspect shows them",
          "[cuda][cli][fixtures]") {
  const NvrtcLib* sm70 = nullptr;
  const NvrtcLib* newer_only = nullptr;  // one that cannot target sm_70 (NVRTC 13), if this machine has one
  for (const NvrtcLib& l : nvrtc_libraries()) {
    if (l.supports(70) && !sm70) sm70 = &l;
    if (!l.supports(70) && !newer_only) newer_only = &l;
  }
  QRIG_REQUIRE_INPUT(sm70, "an NVRTC that targets sm_70; " << nvrtc_install_hint(70));

  const fs::path dir = fs::temp_directory_path() / ("qrig-compile-cmd-" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  // A kernel cache of its own (XDG_CACHE_HOME), so the compile really runs NVRTC.
  const std::string env = "XDG_CACHE_HOME=" + (dir / "cache").string() + " ";
  const std::string compile = std::string(QRIG_BINARY) + " compile " +
                              qrig::fixtures::shared_path("fixtures/tiny.gguf") + " --rig " + QRIG_SOURCE_DIR + "/rigs/cmp-100-210-x4.toml --gpus 1";
  const std::string inspect = std::string(QRIG_BINARY) + " inspect ";

  {  // the NVRTC that targets sm_70, named explicitly (QRIG_NVRTC replaces the search)
    const auto c = sh(env + "QRIG_NVRTC=" + sm70->path + " " + compile + " -o " + (dir / "p70").string());
    INFO(c.text);
    REQUIRE(c.rc == 0);
    const std::string toml = read_file(dir / "p70" / "plan.toml");
    CHECK(toml.find("kernel_nvrtc = '" + sm70->version() + "'") != std::string::npos);
    CHECK(toml.find("kernel_target = 'sm_70'") != std::string::npos);
    CHECK(toml.find("kernel_code = 'cubin'") != std::string::npos);
    const auto i = sh(inspect + (dir / "p70").string());
    INFO(i.text);
    CHECK(i.rc == 0);
    CHECK(i.text.find("kernels   sm_70 cubins by NVRTC " + sm70->version()) != std::string::npos);
  }
  {  // --ptx: sm_70 PTX for the driver's JIT
    const auto c = sh(env + "QRIG_NVRTC=" + sm70->path + " " + compile + " --ptx -o " + (dir / "ptx").string());
    INFO(c.text);
    REQUIRE(c.rc == 0);
    CHECK(c.text.find("PTX through the driver's JIT") != std::string::npos);
    const std::string toml = read_file(dir / "ptx" / "plan.toml");
    CHECK(toml.find("kernel_code = 'ptx'") != std::string::npos);
    CHECK(toml.find("kernel_target = 'sm_70'") != std::string::npos);
    CHECK(sh(inspect + (dir / "ptx").string()).text.find("kernels   sm_70 PTX") != std::string::npos);
  }
  {  // no NVRTC at all: a clear error naming what to install, no plan written
    const auto c = sh(env + "QRIG_NVRTC=" + (dir / "no-such-libnvrtc.so").string() + " " + compile + " -o " +
                     (dir / "none").string());
    INFO(c.text);
    CHECK(c.rc != 0);
    CHECK(c.text.find("no NVRTC can compile for sm_70") != std::string::npos);
    CHECK(c.text.find("libnvrtc11.2") != std::string::npos);
    CHECK(c.text.find("no-such-libnvrtc.so") != std::string::npos);
    CHECK_FALSE(fs::exists(dir / "none" / "plan.toml"));
  }
  if (newer_only) {  // only an NVRTC that cannot target sm_70: the degraded sm_75 plan, said so
    const auto c = sh(env + "QRIG_NVRTC=" + newer_only->path + " " + compile + " -o " + (dir / "degraded").string());
    INFO(c.text);
    REQUIRE(c.rc == 0);
    CHECK(c.text.find("degraded") != std::string::npos);
    CHECK(c.text.find("libnvrtc11.2") != std::string::npos);
    const std::string toml = read_file(dir / "degraded" / "plan.toml");
    CHECK(toml.find("kernel_target = 'sm_75'") != std::string::npos);
    CHECK(toml.find("kernel_nvrtc = '" + newer_only->version() + "'") != std::string::npos);
    CHECK(sh(inspect + (dir / "degraded").string()).text.find("kernels   sm_75 cubins by NVRTC " +
                                                                 newer_only->version()) != std::string::npos);
  } else {
    WARN("no NVRTC here that cannot target sm_70: the degraded mode is checked by pick_nvrtc's unit tests only");
  }
  fs::remove_all(dir);
}
