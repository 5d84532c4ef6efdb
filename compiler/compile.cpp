// compile(): read hyperparameters, lower to IR, run the passes in order, return the plan.
#include "compiler/compile.h"

#include <algorithm>
#include <filesystem>

#include <fmt/format.h>

#include "compiler/models/qwen35.h"
#include "compiler/passes/passes.h"

namespace qrig::compiler {

std::string compiler_version() { return "qrig 0.1.0"; }

ir::Plan compile(const gguf::File& file, const Rig& rig, const CompileOptions& options) {
  CompileContext cx{file, Qwen35Params::from_gguf(file), rig, options, {}, {}};
  ir::Plan& p = cx.plan;
  bool has_cpu = false;
  for (const auto& d : rig.devices) has_cpu |= d.kind == "cpu";
  if (options.force_backend == "cpu" && !has_cpu) {
    cx.rig.devices.push_back(Rig::default_cpu().devices.front());
    p.notes.push_back("rig: no cpu device described; using this machine's CPU for the forced cpu backend");
  }
  p.compiler_version = compiler_version();
  std::error_code ec;
  auto abs = std::filesystem::absolute(file.path(), ec);
  p.model_path = ec ? file.path() : abs.lexically_normal().string();
  p.model_size = (int64_t)file.file_size();
  p.arch = cx.params.arch;
  p.model_name = cx.params.name;
  p.rig_name = rig.name;
  p.vocab_real = cx.params.vocab;
  // Padding rows (UNUSED tokens after the real vocabulary) are never sampled.
  if (const gguf::Value* types = file.find("tokenizer.ggml.token_type")) {
    int64_t n = (int64_t)types->ints.size();
    while (n > 0 && types->ints[(size_t)n - 1] == 5) --n;  // 5 = UNUSED
    if (n > 0 && n <= cx.params.vocab) p.vocab_real = n;
  }
  if (cx.params.n_mtp > 0)
    p.notes.push_back("model: MTP block present (blk." + std::to_string(cx.params.n_layer) +
                      "): the draft head of speculative decoding (the draft pass below decides)");
  if (options.max_batch_tokens < 0 || options.max_batch_tokens > 65536)
    throw CompileError(fmt::format("tokens per step (--batch) must be in 1..65536, not {}", options.max_batch_tokens));
  if (options.max_sequences < 1 || options.max_sequences > 4096)
    throw CompileError(fmt::format("sequences (--parallel) must be in 1..4096, not {}", options.max_sequences));
  if (options.max_logit_rows < 0) throw CompileError("output rows per step must be >= 0");
  p.max_sequences = options.max_sequences;
  p.graph = lower_qwen35(cx.params, file);
  passes::select_backend(cx);
  // Tokens per step: as asked, or by default 512 on one device and, for a pipeline, two micro-batches per stage
  // (so a prefill step keeps every stage busy), at most 4096.
  int64_t batch = options.max_batch_tokens;
  if (batch == 0) {
    const int64_t stages = (int64_t)passes::pipeline_devices(cx).size();
    batch = stages > 1 ? std::min<int64_t>(4096, 2 * stages * (p.backend == "cuda" ? 512 : 128)) : 512;
    if (stages > 1)
      p.notes.push_back(fmt::format("step: {} tokens (two micro-batches per stage of the pipeline; --batch sets it)",
                                    batch));
  }
  p.max_batch_tokens = batch;
  p.max_logit_rows = std::min(options.max_logit_rows > 0 ? options.max_logit_rows : options.max_sequences, batch);
  cx.options.max_batch_tokens = p.max_batch_tokens;
  passes::place_layers(cx);
  passes::choose_kv_format(cx);
  passes::schedule_gdn(cx);
  passes::plan_draft(cx);
  passes::quantize_matmul_inputs(cx);
  passes::fuse_norm_quant(cx);
  passes::fuse_add_norm(cx);
  passes::fuse_swiglu_quant(cx);
  passes::stack_matmuls(cx);
  passes::choose_kernels(cx);
  passes::plan_prefix_cache(cx);
  passes::plan_memory(cx);
  ir::verify(p.graph);
  if (p.draft_tokens > 0) ir::verify(p.draft);
  return p;
}

}  // namespace qrig::compiler
