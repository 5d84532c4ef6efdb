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

#include "ir/plan.h"
#include "tests/plan_presets.h"
#include "runtime/cuda/nvrtc.h"

namespace qrig::cuda::test {

using qrig::presets::kFixtures;
using qrig::presets::kRigs;
using qrig::presets::preset_plan;
using qrig::presets::ScratchDir;
using qrig::presets::write_sparse_synth;

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

}  // namespace qrig::cuda::test
