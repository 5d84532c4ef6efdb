// Shared helpers of the no-GPU CUDA tests: scratch directories, and real plans for the rig presets compiled
// from tiny.gguf and from metadata-only (sparse) GGUFs with the exact `qrig synth` layouts of the 9B and 27B
// models, so the kernel variants under test are the ones those plans request.
#pragma once

#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <thread>
#include <vector>
#include <string>

#include "cli/synth.h"
#include "compiler/compile.h"
#include "gguf/gguf.h"
#include "ir/plan.h"
#include "runtime/cuda/nvrtc.h"

namespace qrig::cuda::test {

const std::string kFixtures = std::string(QRIG_SHARED_DIR) + "/fixtures/";
const std::string kRigs = std::string(QRIG_SOURCE_DIR) + "/rigs/";

// One variant to compile for one feature-set architecture.
struct CompileJob {
  Variant variant;
  int sm = 0;
};

// Compiles every job on two threads (NVRTC is thread-safe; CI machines have two cores). A job that fails leaves
// an empty CompiledKernel and a line "<variant> for sm_<N>: <error>" in `errors`.
inline std::vector<CompiledKernel> compile_all(KernelCompiler& c, const std::vector<CompileJob>& jobs,
                                               std::vector<std::string>& errors) {
  std::vector<CompiledKernel> out(jobs.size());
  std::mutex mu;
  std::atomic<size_t> next{0};
  auto work = [&] {
    for (size_t i; (i = next++) < jobs.size();) {
      try {
        out[i] = c.get(jobs[i].variant, jobs[i].sm);
      } catch (const std::exception& e) {
        std::lock_guard<std::mutex> lock(mu);
        errors.push_back(jobs[i].variant.name + " for sm_" + std::to_string(jobs[i].sm) + ": " + e.what());
      }
    }
  };
  std::thread t(work);
  work();
  t.join();
  return out;
}

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
inline std::filesystem::path write_sparse_synth(const std::string& preset, const std::filesystem::path& dir) {
  const gguf::Writer w = cli::synth_model(preset, 1);
  const auto header = w.header();
  const auto path = dir / (preset + "-sparse.gguf");
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

}  // namespace qrig::cuda::test
