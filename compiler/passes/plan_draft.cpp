// Pass: speculative decoding with the model's MTP head (docs/speculative.md). Decides whether a plan drafts and how
// many tokens per step (--draft N forces N, 0 turns it off; without it a cost model chooses), lowers the MTP block
// into the plan's draft graph (compiler/models/qwen35.cpp lower_qwen35_mtp) on the last stage's device, and says
// why in a note. It runs before the quantize, fusion, kernel and memory passes, which then treat the draft graph as
// they treat the main one (plan_graphs): on CUDA its int8 matmul inputs, fusions, kernel variants (the kernel
// table's "draft" rows), its arena places and its own key and value cache in the plan's KV formats. The memory pass
// counts what drafting holds per sequence (the head's cache, the recurrent states a verify step keeps for a
// rollback, on CUDA the head's waiting hidden rows).
//
// The cost model, per step of one sequence: a verify of k + 1 positions costs what reading the weights once costs
// or what computing k + 1 rows costs, whichever is more (the placement pass's decode and prefill figures per token);
// each of the k draft steps reads the head's bytes (its layer, eh_proj and the shared lm_head) once. With a
// probability a that a draft token is accepted given the previous one was, a step yields (1 - a^(k+1)) / (1 - a)
// tokens on average. a is a prior until acceptance is measured on a trained model (kDraftAcceptancePrior); the
// pass takes the k of 1..4 with the best expected tokens per unit of time, and none when no k beats plain decode
// by kMinSpeedup. On CUDA the model's choice is only reported: drafting there is on with --draft N and off by
// default, because neither the acceptance nor the GPU's verify and draft steps have been measured yet (a trained
// model with a real MTP head is needed), and its verify rows round differently from decode's (docs/speculative.md).
#include <algorithm>
#include <cmath>

#include <fmt/format.h>

#include "compiler/models/qwen35.h"
#include "compiler/passes/passes.h"
#include "kernels/matmul.h"

namespace qrig::compiler::passes {

namespace {

// llama.cpp's draft-mtp reports ~75% acceptance with 3 draft tokens on Qwen3.5; per-token acceptance a little lower.
constexpr double kDraftAcceptancePrior = 0.7;
constexpr double kMinSpeedup = 1.05;
constexpr int64_t kMaxDraftTokens = 4;

std::string off(ir::Plan& p, const std::string& why) {
  p.draft_tokens = 0;
  p.draft = {};
  p.notes.push_back("draft: off: " + why);
  return why;
}

// CUDA: the head's matrices need kernels of the dp4a family (the main graph's were checked by select_backend).
void require_cuda_head_types(const CompileContext& cx, const ir::Graph& g) {
  for (const ir::Op& op : g.ops) {
    if (op.kind != ir::OpKind::embed && op.kind != ir::OpKind::matmul) continue;
    const gguf::TensorInfo* t = cx.file.find_tensor(op.s("weight"));
    if (!t) throw CompileError(fmt::format("{}: tensor '{}' is missing", op.describe(), op.s("weight")));
    if (t->type != gguf::TensorType::Q8_0 && !kernels::wq_dp4a_type((int64_t)t->type))
      throw CompileError(fmt::format("--draft: the MTP head's weight {} is {}; the CUDA backend has no kernels for it "
                                     "(--backend cpu drafts with it)", t->name, gguf::tensor_type_name(t->type)));
  }
}

}  // namespace

std::vector<ir::Graph*> plan_graphs(ir::Plan& p) {
  std::vector<ir::Graph*> out{&p.graph};
  if (p.draft_tokens > 0 && !p.draft.ops.empty()) out.push_back(&p.draft);
  return out;
}

void plan_draft(CompileContext& cx) {
  ir::Plan& p = cx.plan;
  const auto& hp = cx.params;
  const int64_t asked = cx.options.draft_tokens;  // -1: the cost model decides
  if (asked < -1 || asked > kMaxDraftTokens)
    throw CompileError(fmt::format("draft tokens (--draft) must be in 0..{}, not {}", kMaxDraftTokens, asked));
  if (asked == 0) {
    off(p, "--draft 0");
    return;
  }
  // Where drafting is not implemented, a forced --draft is refused by name, and the default is off (with why).
  auto refuse = [&](const std::string& why) {
    if (asked > 0) throw CompileError(fmt::format("--draft {}: {}", asked, why));
    off(p, why);
  };
  if (hp.n_mtp < 1) return refuse("the model has no MTP block (nextn_predict_layers) to draft with");
  if (p.placement.size() != 1)
    return refuse("speculative decoding is not implemented on a pipeline of several stages yet");
  const bool cuda = p.backend == "cuda";
  if (!cuda && p.kernel_family != "reference")
    return refuse(fmt::format("speculative decoding is not implemented for the {} kernel family (its matmul "
                              "numerics change with the step's rows, so a verify would not reproduce decode)",
                              p.kernel_family));

  // The cost model (see the top of this file).
  const ir::Placement& pl = p.placement.back();
  int64_t main_bytes = 0, head_bytes = 0;
  const std::string mtp = fmt::format("blk.{}.", hp.n_layer);
  for (const auto& t : cx.file.tensors()) {
    const bool in_mtp = t.name.rfind(mtp, 0) == 0;
    if (in_mtp || t.name == "output.weight") head_bytes += (int64_t)t.n_bytes;
    if (!in_mtp && t.name.rfind("blk.", 0) == 0) main_bytes += (int64_t)t.n_bytes;
    if (t.name == "output.weight" || t.name == "output_norm.weight") main_bytes += (int64_t)t.n_bytes;
  }
  const double decode = std::max(pl.decode_us_per_token, 1e-9), row = std::max(pl.prefill_us_per_token, 0.0);
  const double head = decode * (double)head_bytes / (double)std::max<int64_t>(1, main_bytes);
  const double a = kDraftAcceptancePrior;
  int64_t best_k = 0;
  double best = 1.0;
  std::string table;
  for (int64_t k = 1; k <= kMaxDraftTokens; ++k) {
    const double tokens = (1 - std::pow(a, (double)k + 1)) / (1 - a);
    const double step = std::max(decode, (double)(k + 1) * row) + (double)k * std::max(head, row);
    const double speedup = tokens * decode / step;
    table += fmt::format("{}k={} {:.2f}x", table.empty() ? "" : ", ", k, speedup);
    if (speedup > best) {
      best = speedup;
      best_k = k;
    }
  }
  std::string why;
  if (asked > 0) {
    p.draft_tokens = asked;
    why = fmt::format("--draft {}", asked);
  } else if (cuda) {
    off(p, fmt::format("on the CUDA backend drafting is turned on by --draft N (1..4); by default it stays off until "
                       "acceptance and the GPU's draft and verify steps are measured with a trained MTP head (the "
                       "cost model, acceptance prior {:.2f}: {})", a, table));
    return;
  } else if (best < kMinSpeedup) {
    off(p, fmt::format("the cost model expects no gain (acceptance prior {:.2f}: {})", a, table));
    return;
  } else {
    p.draft_tokens = best_k;
    why = fmt::format("the cost model's best (acceptance prior {:.2f} per token until measured: {})", a, table);
  }
  // A verify step keeps the recurrent states after each position from the token-serial GDN (docs/speculative.md).
  if (p.draft_tokens + 1 >= p.gdn_recurrent_below) {
    const int64_t k = p.draft_tokens;
    return refuse(fmt::format("a verify of {} tokens would run the chunked GDN (recurrent below {} tokens), which "
                              "does not keep the state after each position", k + 1, p.gdn_recurrent_below));
  }
  // Output rows: a verify step asks for the logits of its k + 1 positions, so every sequence drafting at once needs
  // k + 1 rows (the default is one row per sequence). An explicit CompileOptions::max_logit_rows stays; the engine
  // drafts only within the rows the plan has (runtime/engine.cpp).
  if (cx.options.max_logit_rows <= 0) {
    const int64_t want = std::min(p.max_sequences * (p.draft_tokens + 1), p.max_batch_tokens);
    if (want > p.max_logit_rows) {
      p.notes.push_back(fmt::format("draft: output rows per step {} -> {} (k + 1 per sequence verifying at once)",
                                    p.max_logit_rows, want));
      p.max_logit_rows = want;
    }
  }
  p.draft = lower_qwen35_mtp(hp, cx.file);
  for (auto& op : p.draft.ops) op.set("device", pl.device);
  if (cuda) {
    require_cuda_head_types(cx, p.draft);
    draft_kv_format(cx);  // the head's own cache in the plan's key and value formats
  }
  p.notes.push_back(fmt::format("draft: {} token(s) per step from the MTP head blk.{} ({:.1f} MiB with the shared "
                                "lm_head): {}", p.draft_tokens, hp.n_layer, (double)head_bytes / (1 << 20), why));
}

}  // namespace qrig::compiler::passes
