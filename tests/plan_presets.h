// Test helpers shared by the areas that compile real plans: scratch directories, and plans for the rig presets
// compiled from tiny.gguf and from metadata-only (sparse) GGUFs with the exact `qrig synth` layouts of the 9B
// and 27B models (the compiler reads metadata only), so the plans under test are the ones users get.
#pragma once

#include <unistd.h>

#include <atomic>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>

#include "cli/synth.h"
#include "compiler/compile.h"
#include "gguf/gguf.h"
#include "ir/plan.h"
#include "tests/fixtures.h"

namespace qrig::presets {

const std::string kFixtures = qrig::fixtures::shared_dir() + "/fixtures/";
const std::string kRigs = std::string(QRIG_SOURCE_DIR) + "/rigs/";

// A fresh directory under the system temp dir, removed with everything in it at scope exit.
struct ScratchDir {
  std::filesystem::path path;
  explicit ScratchDir(const std::string& tag) {
    static std::atomic<int> n{0};
    path = std::filesystem::temp_directory_path() /
           ("qrig-" + tag + "-" + std::to_string(::getpid()) + "-" + std::to_string(n++));
    std::filesystem::remove_all(path);
    std::filesystem::create_directories(path);
  }
  ~ScratchDir() {
    std::error_code ec;
    std::filesystem::remove_all(path, ec);
  }
};

// A GGUF holding the header of `qrig synth --preset <preset>` and a hole where the weights would be: the
// compiler reads metadata only, so this plans a 9B or 27B model without writing 9 or 28 GB.
// `type`: a `qrig synth --type` (its per-tensor mix; the weights are not drawn).
inline std::filesystem::path write_sparse_synth(const std::string& preset, const std::filesystem::path& dir,
                                                const std::string& type = "q8_0") {
  const gguf::Writer w = cli::synth_model(preset, 1, type);
  const auto header = w.header();
  const auto path = dir / (preset + "-" + type + "-sparse.gguf");
  {
    std::ofstream out(path, std::ios::binary);
    out.write(reinterpret_cast<const char*>(header.data()), (std::streamsize)header.size());
  }
  std::filesystem::resize_file(path, w.file_size());
  return path;
}

// "tiny" (fixtures/tiny.gguf), "9b" or "27b" compiled for rigs/<rig>.toml. Cached per process. Prefill chunks
// of 64 tokens: plan_memory budgets every activation of a step as live at once, and at the default 512 the
// 9B model does not fit a 16 GiB CMP card. The kernel variants do not depend on the chunk length.
inline const ir::Plan& preset_plan(const std::string& model, const std::string& rig) {
  static std::map<std::string, ir::Plan> plans;
  const std::string key = model + "@" + rig;
  auto it = plans.find(key);
  if (it != plans.end()) return it->second;
  static ScratchDir dir("cuda-plans");
  const std::string path = model == "tiny" ? kFixtures + "tiny.gguf" : write_sparse_synth(model, dir.path).string();
  const gguf::File f = gguf::File::open(path);
  compiler::CompileOptions o;
  o.max_batch_tokens = 64;
  return plans[key] = compiler::compile(f, compiler::Rig::load(kRigs + rig + ".toml"), o);
}

// The same with the compile defaults (512 tokens per step, 4 sequences) and the given options on top; `type` as
// write_sparse_synth's (9b / 27b).
inline ir::Plan compile_preset(const std::string& model, const std::string& rig, compiler::CompileOptions o = {},
                               const std::string& type = "q8_0") {
  static ScratchDir dir("preset-plans");
  const std::string path =
      model == "tiny" ? kFixtures + "tiny.gguf" : write_sparse_synth(model, dir.path, type).string();
  const gguf::File f = gguf::File::open(path);
  return compiler::compile(f, compiler::Rig::load(kRigs + rig + ".toml"), o);
}

}  // namespace qrig::presets
