// What the CUDA runtime takes on a GPU beyond the plan's memory table (its context, loaded kernel modules, CUDA
// graphs, allocator granularity): the headroom --gpu-memory-utilization must leave (compiler/compile.h
// kDefaultGpuMemoryUtilization). Measured on the tiny fixture's plan after a prefill and CUDA-graph decode steps:
// the device's used bytes (total - free) minus what the executor allocated. Reported as bytes and as a share of a
// 16 GiB card (the CMP 100-210); the test fails when the default's headroom on such a card would not cover it.
#include <catch2/catch.hpp>

#include "compiler/compile.h"
#include "runtime/cuda/executor.h"
#include "tests/fixtures.h"
#include "tests/gpu/gpu_test_util.h"

using namespace qrig;
using namespace qrig::cuda::gputest;

TEST_CASE("the runtime's memory beyond the plan fits the default headroom of a 16 GiB card", "[gpu][memory]") {
  Gpu& g = Gpu::get();
  compiler::Rig rig;
  compiler::RigDevice d;
  d.kind = "cuda";
  d.name = g.info.name;
  d.arch = fmt::format("sm_{}", g.family_sm);
  d.sms = g.info.sms;
  d.memory_gib = 16.0;
  rig.devices.push_back(d);
  const gguf::File f = gguf::File::open(qrig::fixtures::shared_dir() + "/fixtures/tiny.gguf");
  compiler::CompileOptions co;
  co.context_length = 4096;
  co.max_sequences = 4;
  co.ptx_jit = g.ptx;
  const ir::Plan plan = compiler::compile(f, rig, co);
  size_t free0 = 0, total = 0;
  cuda::memory_info(0, &free0, &total);
  {
    runtime::CudaExecutor ex(plan, runtime::open_plan_model(plan));
    std::vector<int32_t> prompt(500);
    for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = (int32_t)(i * 7 % 1000);
    for (int s = 0; s < 4; ++s) ex.step({{s, prompt, true}}, {{499}}, false, true);
    for (int t = 0; t < 30; ++t) {
      std::vector<runtime::StepInput> b;
      std::vector<std::vector<int32_t>> rows;
      for (int s = 0; s < 4; ++s) b.push_back({s, {(int32_t)(t + s)}, true}), rows.push_back({0});
      ex.step(b, rows, false, true);
    }
    ex.synchronize();
    size_t free1 = 0;
    cuda::memory_info(0, &free1, &total);
    const double used = (double)(total - free1), plan_bytes = (double)ex.device_bytes();
    const double beyond = used - plan_bytes;  // the context and everything else the process holds on the device
    const double headroom = 16.0 * (1 << 30) * (1.0 - compiler::kDefaultGpuMemoryUtilization);
    report("memory (tiny, cuda)", fmt::format("{:.0f} MiB allocated by the plan", plan_bytes / (1 << 20)),
           "MiB used beyond the plan (context, modules, graphs)", beyond / (1 << 20), headroom / (1 << 20));
    report("memory (tiny, cuda)", "the same", "share of a 16 GiB card", beyond / (16.0 * (1 << 30)),
           1.0 - compiler::kDefaultGpuMemoryUtilization);
    fmt::print("device free before the executor {:.0f} MiB, after {:.0f} MiB, of {:.0f} MiB\n", free0 / 1048576.0,
               free1 / 1048576.0, total / 1048576.0);
    CHECK(beyond < headroom);
  }
}
