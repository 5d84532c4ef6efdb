// The compiler entry point: GGUF metadata + rig -> lowered IR -> ordered passes -> plan.
#pragma once

#include <string>

#include "compiler/hparams.h"
#include "compiler/rig.h"
#include "gguf/gguf.h"
#include "ir/plan.h"
#include "kernels/tuning.h"

namespace qrig::compiler {

// GPU matmuls over at most this many rows use two-plane activations unless asked otherwise: two planes are
// nearly free while a matmul is bound by its weight bytes (decode of a few sequences, a few rows of logits).
constexpr int64_t kDefaultPreciseRows = 4;

// The fraction of each GPU's memory (the rig's memory_gib) a plan may use, like vLLM's --gpu-memory-utilization:
// the rest is left to what the runtime needs beyond the plan (CUDA context, kernel libraries, CUDA graphs,
// allocator fragmentation). Measured on an H200 (bench/RESULTS.md, 2026-12-02): 536 MiB beyond the plan for the tiny
// model, ~640 MiB for 9B, after prefill and CUDA-graph decode; 0.92 leaves 1.31 GiB of a 16 GiB card (vLLM: 0.9).
constexpr double kDefaultGpuMemoryUtilization = 0.92;

struct CompileOptions {
  int64_t context_length = 0;    // 0: the most that fits, capped by the model's context_length
  int64_t max_sequences = 4;     // sequence slots (server --parallel)
  // Tokens per step (prefill chunk); 0: 512 on one device, two micro-batches per stage for a pipeline.
  int64_t max_batch_tokens = 0;
  std::string force_backend;     // "" (from the rig), "cpu"
  int64_t max_gpus = 0;          // use at most this many of the rig's GPUs (0: all of them)
  int64_t micro_batch = 0;       // pipeline plans: tokens per micro-batch (0: the placement pass chooses)
  // GPU matmuls over at most this many rows use two-plane (~15-bit) activations; -1: the default
  // (kDefaultPreciseRows), a value >= max_batch_tokens: every matmul (prefill too, at about half its speed).
  int64_t precise_rows = -1;
  // Output rows (logits) one step may return; 0: max_sequences (one per sequence). Verification asks for every
  // row of a prefill (max_batch_tokens).
  int64_t max_logit_rows = 0;
  // "" (the backend's own family), or "dp4a-emulated": the cpu runs the GPU family's numerics.
  std::string family;
  bool decode_graphs = true;  // CUDA plans: decode steps as CUDA graphs
  // CUDA plans: programmatic dependent launch where the architecture has it (sm_90+); false: plain launches
  // (`qrig compile --no-pdl`, to compare).
  bool programmatic_launch = true;
  // CUDA plans: load the kernels as PTX through the driver's JIT (any GPU at least as new as the target runs
  // them: checking an older architecture's plan on a newer GPU) instead of as cubins for the target.
  bool ptx_jit = false;
  // GPU plans: the budget per device is this fraction of its memory, in (0, 1]. CPU rigs say in memory_gib what
  // the plan may use.
  double gpu_memory_utilization = kDefaultGpuMemoryUtilization;
  // Key and value cache formats, spelled "k8v3" (kernels/kv_format.h); "" lets the KV-format pass choose.
  std::string kv;
  // Draft tokens per step of speculative decoding with the model's MTP head (0: off, 1..4); -1: the draft pass's
  // cost model decides (off where drafting is not implemented: CUDA, pipelines).
  int64_t draft_tokens = -1;
  // The shared prefix cache's budget in MiB (cached KV spans + snapshots); -1: the pass's default, 0: none.
  int64_t prefix_cache_mib = -1;
};

// What every pass sees. Passes run in a fixed order, each in its own file under compiler/passes/.
struct CompileContext {
  const gguf::File& file;
  Qwen35Params params;
  Rig rig;
  CompileOptions options;
  kernels::Tuning tuning;  // the measured numbers the kernel choices model the GPU with (select_backend)
  ir::Plan plan;           // filled in as passes decide
};

ir::Plan compile(const gguf::File& file, const Rig& rig, const CompileOptions& options);
std::string compiler_version();

}  // namespace qrig::compiler
