// Kernel variants of a CUDA plan (see plan_kernels.h): the same choices the executor makes when it binds the
// graph (runtime/cuda/executor_bind.cpp), so that precompiling these is exactly what a run loads.
#include "runtime/cuda/plan_kernels.h"

#include <algorithm>
#include <set>

#include <fmt/format.h>

#include "runtime/cuda/attention.h"
#include "runtime/cuda/gdn.h"
#include "runtime/cuda/gemm.h"
#include "runtime/cuda/pointwise.h"
#include "runtime/cuda/sampling.h"

namespace qrig::cuda {

namespace {

int64_t row_length(const ir::Graph& g, const std::string& value, const ir::Op& op) {
  const ir::Type* t = g.type_of(value);
  if (!t || t->shape.empty() || t->shape.back() <= 0)
    throw KernelError(fmt::format("plan: {} has an argument %{} without a fixed row length", op.describe(), value));
  return t->shape.back();
}

int64_t result_length(const ir::Op& op) {
  if (op.type.shape.empty() || op.type.shape.back() <= 0)
    throw KernelError(fmt::format("plan: {} has no fixed row length", op.describe()));
  return op.type.shape.back();
}

}  // namespace

bool rmsnorm_feeds_matmul(const ir::Graph& g, const ir::Op& norm) {
  if (norm.kind != "rmsnorm" || norm.result.empty() || norm.type.shape.empty() || norm.type.shape.back() % 32 != 0)
    return false;
  return std::any_of(g.ops.begin(), g.ops.end(), [&](const ir::Op& op) {
    return op.kind == "matmul" && !op.args.empty() && op.args[0] == norm.result;
  });
}

PlanKernels plan_kernels(const ir::Plan& plan) {
  if (plan.backend != "cuda")
    throw KernelError(fmt::format("plan for rig '{}' targets the {} backend, not cuda", plan.rig_name, plan.backend));
  if (plan.kernel_family != "dp4a")
    throw KernelError(fmt::format("plan kernel family '{}' has no CUDA kernels (only dp4a)", plan.kernel_family));
  const int sms = plan.device_sms > 0 ? (int)plan.device_sms : 80;
  const int64_t max_t = std::max<int64_t>(1, plan.max_batch_tokens);
  const int64_t max_r = std::min(max_t, std::max<int64_t>(1, plan.max_sequences));
  std::set<std::string> names, missing;
  std::vector<Variant> variants;
  auto add = [&](Variant v) {
    if (names.insert(v.name).second) variants.push_back(std::move(v));
  };
  add(quant_act_q8_variant(1));
  if (plan.precise_rows > 0) add(quant_act_q8_variant(2));
  add(argmax_f32_variant());
  for (auto& v : TopKSelector::variants()) add(v);  // sampling's top-k selection (any vocabulary)
  const ir::Graph& g = plan.graph;
  for (const ir::Op& op : g.ops) {
    if (op.kind == "embed") {
      add(embed_q8_0_variant(result_length(op)));
    } else if (op.kind == "rmsnorm") {
      add(rmsnorm_f32_variant(result_length(op)));
      if (rmsnorm_feeds_matmul(g, op)) {
        add(rmsnorm_f32_variant(result_length(op), 1));
        if (plan.precise_rows > 0) add(rmsnorm_f32_variant(result_length(op), 2));
      }
    } else if (op.kind == "matmul") {
      const int64_t k = row_length(g, op.args.at(0), op);
      if (k % 32 != 0)
        throw KernelError(fmt::format("plan: {} has an input of {} values, not a multiple of 32", op.describe(), k));
      const bool rows = !op.type.shape.empty() && op.type.shape[0] == ir::kRows;
      // One plane above plan.precise_rows rows, two up to it (the executor's MatmulQ8 pair).
      const int64_t most = rows ? max_r : max_t;
      if (most > plan.precise_rows)
        for (auto& v : matmul_q8_0_variants(k, result_length(op), most, sms, 1, plan.precise_rows + 1)) add(v);
      if (plan.precise_rows > 0)
        for (auto& v : matmul_q8_0_variants(k, result_length(op), std::min(most, plan.precise_rows), sms, 2)) add(v);
    } else if (op.kind == "add") {
      add(add_f32_variant());
    } else if (op.kind == "swiglu") {
      add(swiglu_f32_variant());
    } else if (op.kind == "conv1d_silu") {
      const ir::State* st = g.state(op.s("state"));
      if (!st || st->type.shape.size() != 2) throw KernelError(fmt::format("plan: {} has no [K-1][C] state", op.describe()));
      add(conv1d_silu_f32_variant(st->type.shape[0] + 1));
    } else if (op.kind == "gdn") {
      const GdnDims d{op.i("key_heads"), op.i("value_heads"), op.i("key_dim"), op.i("value_dim")};
      for (auto& v : gdn_variants(d, op.i_or("chunk", 64))) add(v);
    } else if (op.kind == "gated_rmsnorm") {
      add(gated_rmsnorm_f32_variant(op.i("head_dim")));
    } else if (op.kind == "head_rmsnorm") {
      add(head_rmsnorm_f32_variant(op.i("head_dim")));
    } else if (op.kind == "rope") {
      add(rope_neox_f32_variant(op.i("head_dim"), op.i("rope_dims")));
    } else if (op.kind == "kv_write") {
      add(kv_write_f16_variant());
    } else if (op.kind == "attention") {
      const AttentionDims d{op.i("heads"), op.i("kv_heads"), op.i("head_dim")};
      for (auto& v : attention_variants(d, plan.context_length, sms)) add(v);
    } else if (op.kind == "gather_rows") {
      // a device-to-device copy per row, no kernel
    } else {
      missing.insert(op.kind);
    }
  }
  std::sort(variants.begin(), variants.end());
  return {std::move(variants), {missing.begin(), missing.end()}};
}

}  // namespace qrig::cuda

#include <atomic>
#include <mutex>
#include <thread>

namespace qrig::cuda {

PrecompileResult precompile_plan_kernels(const ir::Plan& plan, KernelCompiler& compiler, int threads) {
  const PlanKernels pk = plan_kernels(plan);
  const int sm = parse_sm(plan.arch_target);
  PrecompileResult r;
  r.variants = (int64_t)pk.variants.size();
  std::atomic<size_t> next{0};
  std::atomic<int64_t> compiled{0}, cached{0};
  std::mutex mu;
  std::vector<std::string> errors;
  auto work = [&] {
    for (size_t i; (i = next++) < pk.variants.size();) {
      try {
        CompiledKernel k = compiler.get(pk.variants[i], sm);
        (k.from_disk ? cached : compiled)++;
      } catch (const std::exception& e) {
        std::lock_guard<std::mutex> lock(mu);
        errors.push_back(e.what());
      }
    }
  };
  std::vector<std::thread> pool;
  for (int t = 1; t < std::max(1, threads); ++t) pool.emplace_back(work);
  work();
  for (auto& t : pool) t.join();
  if (!errors.empty()) {
    std::string all;
    for (const auto& e : errors) all += "\n  " + e;
    throw KernelError(fmt::format("{} of {} kernel variants failed to compile:{}", errors.size(), r.variants, all));
  }
  r.compiled = compiled;
  r.cached = cached;
  r.notes = compiler.notes();
  return r;
}

}  // namespace qrig::cuda
