// Getting a model in, as a user coming from llama.cpp does it (issue 14): a split model given by its first
// shard loads and verifies, a missing shard or a changed one is an error naming it; a directory holding one
// model is that model; a plan moved together with its model keeps working, and one whose model moved says
// which path it wants and takes --model; --ctx above the trained context warns; the GPU memory fraction of a
// plan is a compile option that `qrig inspect` shows.
#include <catch2/catch.hpp>

#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include "cli/synth.h"
#include "gguf/gguf.h"
#include "ir/plan.h"
#include "tests/fixtures.h"
#include "tests/split_gguf.h"
#include "tests/shell_command.h"

using namespace qrig;
namespace fs = std::filesystem;

namespace {

// A shell command line; stdout and stderr together.
qrig::test::CommandOutput sh(const std::string& cmd) { return qrig::test::run_command(cmd, true); }

bool has(const std::string& text, const std::string& part) { return text.find(part) != std::string::npos; }

struct Scratch {
  fs::path path;
  explicit Scratch(const std::string& tag) {
    static int n = 0;
    path = fs::temp_directory_path() / ("qrig-" + tag + "-" + std::to_string(::getpid()) + "-" + std::to_string(n++));
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~Scratch() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
};

const std::string kBin = QRIG_BINARY;

}  // namespace

TEST_CASE("a split model loads and verifies from its first shard; a missing or changed shard is an error naming it",
          "[cli][split][fixtures]") {
  Scratch dir("split-cli");
  const std::string ref = fixtures::shared_path("fixtures/tiny-ref.gguf");
  const gguf::File tiny = gguf::File::open(fixtures::shared_path("fixtures/tiny.gguf"));
  const auto shards = fixtures::write_split_gguf(tiny, (dir.path / "tiny").string(), 3);

  // The shards verify against the float64 reference exactly as tiny.gguf does; so does their directory.
  auto ok = sh(kBin + " verify " + shards[0] + " " + ref + " --split 20");
  CHECK(ok.rc == 0);
  CHECK(has(ok.text, "seq long max_rel_err"));
  CHECK(has(ok.text, "first_bad_layer none"));
  CHECK(sh(kBin + " verify " + dir.path.string() + " " + ref).rc == 0);

  // A plan records the size of all shards together and checks it at load.
  const std::string plan_dir = (dir.path / "plan").string();
  REQUIRE(sh(kBin + " compile " + shards[0] + " -o " + plan_dir).rc == 0);
  const ir::Plan plan = ir::Plan::read(plan_dir);
  CHECK(plan.model_size == (int64_t)(fs::file_size(shards[0]) + fs::file_size(shards[1]) + fs::file_size(shards[2])));
  CHECK(sh(kBin + " run " + plan_dir + " -p hi -n 2 --quiet").rc == 0);
  { std::ofstream(shards[2], std::ios::binary | std::ios::app) << '\0'; }
  auto changed = sh(kBin + " run " + plan_dir + " -p hi -n 2");
  CHECK(changed.rc == 1);
  CHECK(has(changed.text, "the 3 shards of " + shards[0]));
  CHECK(has(changed.text, "recompile"));

  // The first shard alone (the others gone) fails naming the one it looked for.
  fs::remove(shards[1]);
  auto missing = sh(kBin + " verify " + shards[0] + " " + ref);
  CHECK(missing.rc == 1);
  CHECK(has(missing.text, "shard 2 of 3 is missing: " + shards[1]));
  // A later shard given as the model says which one to give.
  auto later = sh(kBin + " run " + shards[2] + " -p hi -n 1");
  CHECK(later.rc == 1);
  CHECK(has(later.text, "give the first shard (" + shards[0] + ")"));
}

TEST_CASE("a directory holding one model is that model; anything else in a directory is a clear error", "[cli]") {
  Scratch dir("model-dir");
  const fs::path one = dir.path / "one";
  fs::create_directories(one);
  cli::write_synth_model("tiny", 5, (one / "Qwen3.5-tiny-Q8_0.gguf").string());
  { std::ofstream(one / "mmproj-F16.gguf") << "a vision projector, not a language model"; }
  { std::ofstream(one / "README.md") << "notes"; }
  auto r = sh(kBin + " run " + one.string() + " -p hi -n 2 --temp 0");
  CHECK(r.rc == 0);
  CHECK(has(r.text, "generation: 2 tokens"));

  const fs::path empty = dir.path / "empty";
  fs::create_directories(empty);
  auto e = sh(kBin + " run " + empty.string() + " -p hi -n 1");
  CHECK(e.rc == 1);
  CHECK(has(e.text, "neither a plan directory (no plan.toml) nor a directory holding a model"));

  const fs::path two = dir.path / "two";
  fs::create_directories(two);
  fs::copy_file(one / "Qwen3.5-tiny-Q8_0.gguf", two / "a.gguf");
  fs::copy_file(one / "Qwen3.5-tiny-Q8_0.gguf", two / "b.gguf");
  auto t = sh(kBin + " run " + two.string() + " -p hi -n 1");
  CHECK(t.rc == 1);
  CHECK(has(t.text, "holds 2 models (a.gguf, b.gguf): give the .gguf to use"));
}

TEST_CASE("a plan moved with its model keeps working; a plan whose model moved names it and takes --model", "[cli]") {
  Scratch dir("moved-plan");
  const fs::path a = dir.path / "a", b = dir.path / "b", c = dir.path / "c";
  fs::create_directories(a);
  cli::write_synth_model("tiny", 6, (a / "model.gguf").string());
  REQUIRE(sh(kBin + " compile " + (a / "model.gguf").string() + " -o " + (a / "plan").string()).rc == 0);
  CHECK(sh(kBin + " run " + (a / "plan").string() + " -p hi -n 2 --quiet").rc == 0);

  // Moved together: found beside the plan, and said so.
  fs::rename(a, b);
  auto moved = sh(kBin + " run " + (b / "plan").string() + " -p hi -n 2");
  CHECK(moved.rc == 0);
  CHECK(has(moved.text, "using " + (b / "model.gguf").string() + " (found beside the plan)"));

  // The model elsewhere: the error names the path the plan wants and the flag; --model (and -m) point at it.
  fs::create_directories(c);
  fs::rename(b / "model.gguf", c / "renamed.gguf");
  auto lost = sh(kBin + " run " + (b / "plan").string() + " -p hi -n 2");
  CHECK(lost.rc == 1);
  CHECK(has(lost.text, "was compiled for the model " + (a / "model.gguf").string() + ", which is not there"));
  CHECK(has(lost.text, "--model PATH"));
  CHECK(sh(kBin + " run " + (b / "plan").string() + " --model " + (c / "renamed.gguf").string() + " -p hi -n 2 --quiet").rc == 0);
  CHECK(sh(kBin + " run " + (b / "plan").string() + " -m " + (c / "renamed.gguf").string() + " -p hi -n 2 --quiet").rc == 0);
  // Another file is refused by its size.
  cli::write_synth_model("tiny", 7, (c / "other.gguf").string());
  {
    // same tensors, different bytes of metadata: pad the file so its size differs
    std::ofstream(c / "other.gguf", std::ios::binary | std::ios::app) << "xx";
  }
  auto other = sh(kBin + " run " + (b / "plan").string() + " --model " + (c / "other.gguf").string() + " -p hi -n 2");
  CHECK(other.rc == 1);
  CHECK(has(other.text, "recompile the plan"));
  // The model inside the plan directory is found too.
  fs::rename(c / "renamed.gguf", b / "plan" / "model.gguf");
  CHECK(sh(kBin + " run " + (b / "plan").string() + " -p hi -n 2 --quiet").rc == 0);
}

TEST_CASE("--ctx above the model's trained context is a warning that says so", "[cli]") {
  Scratch dir("ctx-warning");
  cli::SynthPreset p = cli::synth_preset("tiny");
  p.context_length = 64;
  const std::string model = (dir.path / "short.gguf").string();
  cli::synth_model(p, 3).write(model);
  auto within = sh(kBin + " run " + model + " --ctx 64 -p hi -n 2");
  CHECK(within.rc == 0);
  CHECK_FALSE(has(within.text, "warning"));
  auto above = sh(kBin + " run " + model + " --ctx 128 -p hi -n 2");
  CHECK(above.rc == 0);
  CHECK(has(above.text, "qrig: warning: context length 128 is above the 64 tokens the model was trained for "
                        "(qwen35.context_length)"));
  // llama.cpp's -c is --ctx; the plan keeps the warning in its notes (qrig inspect, later loads).
  const std::string plan = (dir.path / "plan").string();
  auto compiled = sh(kBin + " compile " + model + " -c 128 -o " + plan);
  CHECK(compiled.rc == 0);
  CHECK(has(compiled.text, "warning: context length 128"));
  CHECK(has(sh(kBin + " inspect " + plan).text, "warning: context length 128"));
  CHECK(has(sh(kBin + " run " + plan + " -p hi -n 1").text, "qrig: warning: context length 128"));
}

TEST_CASE("the GPU memory fraction is a compile option; qrig inspect shows the budget and the headroom", "[cli]") {
  Scratch dir("gpu-fraction");
  const std::string model = (dir.path / "m.gguf").string();
  cli::write_synth_model("tiny", 2, model);
  const std::string rig = std::string(QRIG_SOURCE_DIR) + "/rigs/h200.toml";  // memory_gib = 139
  const std::string def = (dir.path / "default").string(), half = (dir.path / "half").string();
  REQUIRE(sh(kBin + " compile " + model + " --rig " + rig + " --no-precompile -o " + def).rc == 0);
  REQUIRE(sh(kBin + " compile " + model + " --rig " + rig + " --no-precompile --gpu-memory-utilization 0.5 -o " + half)
              .rc == 0);
  const ir::Plan pd = ir::Plan::read(def), ph = ir::Plan::read(half);
  REQUIRE(pd.memory.devices.size() == 1);
  REQUIRE(ph.memory.devices.size() == 1);
  const double gib = 1024.0 * 1024 * 1024;
  CHECK(pd.memory.devices[0].budget == (int64_t)(139 * gib * 0.92));
  CHECK(ph.memory.devices[0].budget == (int64_t)(139 * gib * 0.5));
  auto shown = sh(kBin + " inspect " + half);
  CHECK(shown.rc == 0);
  CHECK(has(shown.text, std::to_string(ph.memory.devices[0].budget)));
  CHECK(has(shown.text, std::to_string(ph.memory.devices[0].budget - ph.memory.devices[0].total)));
  CHECK(has(shown.text, "the plan may use 0.50 of"));
  auto bad = sh(kBin + " compile " + model + " --rig " + rig + " --no-precompile --gpu-memory-utilization 1.5 -o " +
                (dir.path / "bad").string());
  CHECK(bad.rc == 1);
  CHECK(has(bad.text, "--gpu-memory-utilization) must be in (0, 1]"));
}

TEST_CASE("every subcommand's --help prints its usage and exits 0; --version names the commit and NVRTC", "[cli]") {
  for (const char* cmd : {"compile", "inspect", "verify", "run", "serve", "tokenize", "template", "bench", "probe", "synth"}) {
    INFO(cmd);
    for (const char* flag : {"--help", "-h"}) {
      auto r = sh(kBin + " " + cmd + " " + flag);
      CHECK(r.rc == 0);
      CHECK(r.text.rfind(std::string("usage: qrig ") + cmd, 0) == 0);
    }
  }
  auto top = sh(kBin + " --help");
  CHECK(top.rc == 0);
  CHECK(has(top.text, "usage: qrig COMMAND"));
  auto v = sh(kBin + " --version");
  CHECK(v.rc == 0);
  CHECK(v.text.rfind("qrig ", 0) == 0);
  CHECK(has(v.text, "(commit "));
  CHECK_FALSE(has(v.text, "(commit unknown)"));  // built from a git checkout
#ifdef QRIG_HAVE_CUDA
  CHECK(has(v.text, "NVRTC: "));
  CHECK(has(v.text, "nothing of CUDA is linked"));
  // The driver's version, asked of libcuda.so.1: this machine may have none (then: not found).
  CHECK((has(v.text, "CUDA driver: not found (") || has(v.text, " (libcuda.so.1)\n")));
#ifdef QRIG_CUDA_STUB_LIB
  // The toolkit's stub library loads and refuses (cuDriverGetVersion returns CUDA_ERROR_STUB_LIBRARY).
  Scratch lib("fake-driver");
  const fs::path stub = QRIG_CUDA_STUB_LIB;
  INFO(stub.string());
  fs::create_symlink(stub, lib.path / "libcuda.so.1");
  auto s = sh("LD_LIBRARY_PATH=" + lib.path.string() + " " + kBin + " --version");
  CHECK(s.rc == 0);
  CHECK(has(s.text, "CUDA driver: not usable (libcuda.so.1 is not a usable driver: cuDriverGetVersion returned 34"));
#else
  WARN("no CUDA toolkit stub libcuda.so here: --version's 'not usable' driver case is not checked");
#endif
#else
  CHECK(has(v.text, "CUDA: not in this build"));
#endif
  // A usage error points at --help.
  auto bad = sh(kBin + " compile");
  CHECK(bad.rc == 2);
  CHECK(has(bad.text, "qrig compile --help"));
}

TEST_CASE("llama-server's spellings work as aliases or name qrig's flag", "[cli]") {
  // -m is the model, -c the context, -np the slots: their errors say so in qrig's terms.
  auto m = sh(kBin + " serve -m /nonexistent/model.gguf --port 0");
  CHECK(m.rc == 1);
  CHECK(has(m.text, "no such model: /nonexistent/model.gguf"));
  auto c = sh(kBin + " serve -c lots --port 0");
  CHECK(c.rc == 2);
  CHECK(has(c.text, "--ctx wants an integer, got 'lots'"));
  auto ctx_size = sh(kBin + " serve --ctx-size=-5 --port 0");
  CHECK(ctx_size.rc == 2);
  CHECK(has(ctx_size.text, "--ctx must be in"));
  auto np = sh(kBin + " serve -np 0 --port 0");
  CHECK(np.rc == 2);
  CHECK(has(np.text, "--parallel must be in [1, 1024], got 0"));
  // -ngl: qrig has no per-layer offload; the error names the flags that decide where layers go.
  auto ngl = sh(kBin + " serve -ngl 99 --port 0");
  CHECK(ngl.rc == 2);
  CHECK(has(ngl.text, "--rig RIG.toml"));
  CHECK(has(ngl.text, "--backend cpu"));
  auto ngl_run = sh(kBin + " run -ngl 33 -p hi");
  CHECK(ngl_run.rc == 2);
  CHECK(has(ngl_run.text, "no per-layer offload"));
  auto ngl0 = sh(kBin + " serve -ngl 0 --backend cuda --port 0");
  CHECK(ngl0.rc == 2);
  CHECK(has(ngl0.text, "-ngl 0 means --backend cpu"));
}
