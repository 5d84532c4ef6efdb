// The prefix-cache pass: where prompts are cut and snapshotted (markers taken from the chat template's message
// syntax and the vocabulary, a regular interval on long prompts) and the byte budget of the shared prefix cache
// (ir::PrefixCachePolicy, docs/prefix-cache.md). Runs before plan_memory, which counts the budget in the memory of
// the plan's device and checks that it fits.
#include <fmt/format.h>

#include "compiler/passes/passes.h"

namespace qrig::compiler::passes {

namespace {

// The id of the vocabulary entry spelled exactly `text`, or -1.
int64_t token_id(const gguf::File& f, const std::string& text) {
  const gguf::Value* v = f.find("tokenizer.ggml.tokens");
  if (!v) return -1;
  const auto& tokens = f.get_string_array("tokenizer.ggml.tokens");
  for (size_t i = 0; i < tokens.size(); ++i)
    if (tokens[i] == text) return (int64_t)i;
  return -1;
}

}  // namespace

void plan_prefix_cache(CompileContext& cx) {
  ir::Plan& p = cx.plan;
  ir::PrefixCachePolicy& pc = p.prefix_cache;
  // Regular cut points: every 512 tokens (a multiple of the GDN chunk), where long prompts without message markers
  // (raw completions, long documents) still meet.
  pc.chunk = std::max<int64_t>(p.gdn_chunk, 512 / p.gdn_chunk * p.gdn_chunk);
  // Message markers: a ChatML template (Qwen3.5's) opens every message with <|im_start|>ROLE\n; the newline is the
  // byte-level BPE token "Ċ" (the pre-tokenizer never merges it with the role or with what follows a special token).
  const std::string tmpl = cx.file.opt_string("tokenizer.chat_template").value_or("");
  const int64_t start = token_id(cx.file, "<|im_start|>"), newline = token_id(cx.file, "Ċ");
  if (tmpl.find("<|im_start|>") != std::string::npos && tmpl.find("<|im_end|>") != std::string::npos && start >= 0 &&
      newline >= 0 && start < p.vocab_real && newline < p.vocab_real) {
    pc.turn_start = start;
    pc.header_end = newline;
    pc.header_max = 8;
    pc.markers = fmt::format("chat template: <|im_start|>ROLE\\n (tokens {} ... {} within {})", start, newline,
                             pc.header_max);
  } else {
    pc.turn_start = pc.header_end = -1;
    pc.header_max = 0;
    pc.markers = "none (the chat template has no <|im_start|>/<|im_end|> messages, or the vocabulary lacks them)";
  }
  // The budget: what --prefix-cache-mib says, else room for 16 snapshots per slot with their KV spans. The shared
  // index copies KV entries between slots, which only the CPU backend does so far (its stages too: they share the
  // host's memory, so the budget is counted once, on the first): CUDA plans keep the per-slot snapshots at prompt
  // ends (plan.memory.snapshots_per_slot) and no shared cache.
  const bool copies_kv = p.backend == "cpu";
  const int64_t asked = cx.options.prefix_cache_mib;
  pc.mode = asked == 0 ? "off" : copies_kv ? "shared" : "per-slot";
  if (asked == 0) {
    pc.budget_bytes = 0;
    p.notes.push_back("prefix cache: off (--prefix-cache-mib 0): every prompt is prefilled whole");
  } else if (!copies_kv) {
    pc.budget_bytes = 0;
    if (asked > 0)
      throw CompileError(fmt::format("--prefix-cache-mib: the shared prefix cache runs on the CPU backend only so "
                                     "far (this plan: {} with {} stage(s))", p.backend, p.placement.size()));
    p.notes.push_back(fmt::format("prefix cache: no shared index on {} ({} stage(s)): copying KV spans between slots "
                                  "is not implemented there; each slot reuses its own prompt-end snapshots",
                                  p.backend, p.placement.size()));
  } else if (asked > 0) {
    pc.budget_bytes = asked << 20;
  } else {
    pc.budget_bytes = -1;  // plan_memory: 16 snapshots per slot once their size is known
  }
}

}  // namespace qrig::compiler::passes
