// `qrig verify MODEL REF.gguf`: run every sequence of a reference file (fixture format: tokens.<seq>,
// logits.<seq>, hidden.<seq>.<i>) and report the worst relative error per sequence and the first layer whose
// hidden state is off. This is how a user checks that a rig computes correctly.
#include <algorithm>
#include <climits>
#include <memory>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <map>

#include <fmt/format.h>

#include "cli/args.h"
#include "cli/commands.h"
#include "cli/model_source.h"
#include "cli/verify.h"
#include "compiler/compile.h"
#include "runtime/cpu/executor.h"
#ifdef QRIG_HAVE_CUDA
#include "runtime/cuda/device.h"
#include "runtime/cuda/executor.h"
#endif

namespace qrig::cli {

namespace {

// A CPU plan of several stages runs each stage's executor in turn, the rows of one stage's outgoing bridge being
// the next one's input (what the pipeline's threads do, one step at a time).
class CpuRunner final : public ModelRunner {
 public:
  explicit CpuRunner(const ir::Plan& plan) {
    auto file = runtime::open_plan_model(plan);
    if (plan.placement.size() == 1) {
      stages_.emplace_back(plan, file);
    } else {
      for (const auto& pl : plan.placement) stages_.emplace_back(plan, file, pl.device);
    }
    begin_sequence();
  }
  int64_t vocab() const override { return stages_.front().vocab_rows(); }
  int64_t max_step_tokens() const override { return INT64_MAX; }
  void begin_sequence() override {
    seqs_.clear();
    for (const auto& s : stages_) seqs_.push_back(s.new_sequence());
  }
  std::vector<float> forward(const std::vector<int32_t>& tokens, const std::vector<int32_t>& rows,
                             const runtime::TapFn& tap) override {
    std::vector<float> in, out, logits;
    for (size_t s = 0; s < stages_.size(); ++s) {
      const runtime::CpuExecutor& ex = stages_[s];
      out.assign(ex.last_stage() ? 0 : tokens.size() * (size_t)ex.bridge_width(), NAN);
      logits = ex.forward(seqs_[s], tokens, rows, tap, ex.first_stage() ? nullptr : in.data(),
                          ex.last_stage() ? nullptr : out.data());
      std::swap(in, out);
    }
    return logits;
  }

 private:
  std::vector<runtime::CpuExecutor> stages_;
  std::vector<runtime::CpuSequence> seqs_;
};

#ifdef QRIG_HAVE_CUDA
// A pipeline plan runs each stage's executor in turn, its outgoing bridge rows copied through the host into the
// next stage's incoming ones (what the pipeline's boundaries do).
class CudaRunner final : public ModelRunner {
 public:
  explicit CudaRunner(const ir::Plan& plan) {
    auto file = runtime::open_plan_model(plan);
    if (plan.placement.size() == 1) {
      stages_.push_back(std::make_unique<runtime::CudaExecutor>(plan, file));
    } else {
      for (const auto& pl : plan.placement)
        stages_.push_back(std::make_unique<runtime::CudaExecutor>(
            plan, file, runtime::CudaOptions{(int)pl.ordinal, {}, true, nullptr, pl.device}));
    }
  }
  int64_t vocab() const override { return stages_.front()->vocab_rows(); }
  // Every row's logits come back: a step is at most the plan's output rows long.
  int64_t max_step_tokens() const override {
    const ir::Plan& p = stages_.front()->plan();
    return std::min(p.rows_per_call(), p.max_logit_rows);
  }
  void begin_sequence() override {
    for (auto& s : stages_) s->reset(0);
  }
  std::vector<float> forward(const std::vector<int32_t>& tokens, const std::vector<int32_t>& rows,
                             const runtime::TapFn& tap) override {
    const bool split = stages_.size() > 1;
    std::vector<float> host;
    runtime::StepOutput out;
    for (size_t s = 0; s < stages_.size(); ++s) {
      runtime::CudaExecutor& ex = *stages_[s];
      if (s > 0) {
        cuda::DeviceGuard guard(ex.device());
        cuda::copy_to_device(ex.bridge_in(0), host.data(), host.size() * 4, "verify: bridge rows up");
      }
      const bool last = s + 1 == stages_.size();
      out = ex.step({runtime::StepInput{0, tokens, last && !rows.empty()}}, {last ? rows : std::vector<int32_t>{}},
                    last, false, tap, split ? 0 : -1);
      if (!last) {
        host.assign(tokens.size() * (size_t)ex.bridge_out_width(), NAN);
        cuda::DeviceGuard guard(ex.device());
        cuda::copy_to_host(host.data(), ex.bridge_out(0), host.size() * 4, "verify: bridge rows down");
      }
    }
    return out.logits;
  }

 private:
  std::vector<std::unique_ptr<runtime::CudaExecutor>> stages_;
};
#endif

// Relative error of one position: max |a - r| / max |r| over the row.
double row_rel_err(const float* a, const float* r, int64_t n) {
  double num = 0, den = 0;
  for (int64_t i = 0; i < n; ++i) {
    double d = std::fabs((double)a[i] - (double)r[i]);
    if (!(d <= num)) num = std::isnan(d) ? INFINITY : d;
    den = std::max(den, std::fabs((double)r[i]));
  }
  return den > 0 ? num / den : (num > 0 ? INFINITY : 0.0);
}

// KL(P_r || P_a) of the softmax distributions of two logit rows, in nats (as llama.cpp's perplexity tool's
// KL divergence statistics): sum_i p_i (log p_i - log q_i), in double.
double row_kl(const float* a, const float* r, int64_t n) {
  auto log_sum_exp = [n](const float* x) {
    double m = -INFINITY;
    for (int64_t i = 0; i < n; ++i) m = std::max(m, (double)x[i]);
    double s = 0;
    for (int64_t i = 0; i < n; ++i) s += std::exp((double)x[i] - m);
    return m + std::log(s);
  };
  const double la = log_sum_exp(a), lr = log_sum_exp(r);
  double kl = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double lp = (double)r[i] - lr;
    kl += std::exp(lp) * (lp - ((double)a[i] - la));
  }
  return std::isnan(kl) ? INFINITY : std::max(0.0, kl);
}

std::vector<float> tensor_f32(const gguf::File& ref, const std::string& name) {
  const gguf::TensorInfo& t = ref.tensor(name);
  if (t.type != gguf::TensorType::F32) throw gguf::Error(fmt::format("reference tensor '{}' must be F32", name));
  std::vector<float> v(t.n_elements);
  gguf::dequantize(t.type, ref.tensor_data(t), v.data(), t.n_elements);
  return v;
}

}  // namespace

std::vector<SequenceReport> verify_reference(ModelRunner& ex, const gguf::File& ref, int64_t split,
                                             std::vector<float>* dump) {
  std::vector<SequenceReport> out;
  const auto& seqs = ref.get_string_array("reference.sequences");
  for (const std::string& name : seqs) {
    const gguf::TensorInfo& tt = ref.tensor("tokens." + name);
    if (tt.type != gguf::TensorType::I32) throw gguf::Error(fmt::format("tokens.{} must be I32", name));
    const int64_t n = (int64_t)tt.n_elements;
    std::vector<int32_t> tokens((size_t)n);
    std::memcpy(tokens.data(), ref.tensor_data(tt), (size_t)n * 4);
    std::vector<float> logits = tensor_f32(ref, "logits." + name);
    const int64_t vocab = (int64_t)logits.size() / n;
    if (vocab != ex.vocab())
      throw gguf::Error(fmt::format("reference vocab {} != model vocab {}", vocab, ex.vocab()));
    std::map<std::string, std::vector<float>> hidden;
    for (int i = 0;; ++i) {
      std::string hn = fmt::format("hidden.{}.{}", name, i);
      if (!ref.find_tensor(hn)) break;
      hidden[fmt::format("hidden.{}", i)] = tensor_f32(ref, hn);
    }
    SequenceReport rep;
    rep.name = name;
    rep.tokens = n;
    std::map<int, double> layer_err;
    ex.begin_sequence();
    // Prefill `first` tokens (in pieces of at most max_step_tokens), then decode the rest one at a time
    // (split <= 0 or >= n: one prefill).
    const int64_t first = split > 0 && split < n ? split : n;
    int64_t done = 0;
    while (done < n) {
      const int64_t T = done < first ? std::min(first - done, ex.max_step_tokens()) : 1;
      std::vector<int32_t> chunk(tokens.begin() + done, tokens.begin() + done + T);
      std::vector<int32_t> rows((size_t)T);
      for (int64_t t = 0; t < T; ++t) rows[(size_t)t] = (int32_t)t;
      auto tap = [&](const std::string& tap_name, const float* x, int64_t rows_n, int64_t width) {
        auto it = hidden.find(tap_name);
        if (it == hidden.end()) return;
        int layer = std::stoi(tap_name.substr(7));
        for (int64_t t = 0; t < rows_n; ++t) {
          double e = row_rel_err(x + t * width, it->second.data() + (done + t) * width, width);
          layer_err[layer] = std::max(layer_err[layer], e);
        }
      };
      std::vector<float> got = ex.forward(chunk, rows, tap);
      if (dump) dump->insert(dump->end(), got.begin(), got.end());
      for (int64_t t = 0; t < T; ++t) {
        double e = row_rel_err(got.data() + t * vocab, logits.data() + (done + t) * vocab, vocab);
        rep.max_rel_err = std::max(rep.max_rel_err, std::isnan(e) ? INFINITY : e);
        // top-1 agreement
        const float* g = got.data() + t * vocab;
        const float* r = logits.data() + (done + t) * vocab;
        rep.top1_agree += (std::max_element(g, g + vocab) - g) == (std::max_element(r, r + vocab) - r);
        rep.kl_sum += row_kl(g, r, vocab);
      }
      done += T;
    }
    rep.layer_err = layer_err;
    out.push_back(rep);
  }
  return out;
}

int cmd_verify(int argc, char** argv) {
  Args a(argc, argv, 2, {"--backend", "--tol", "--rig", "--split", "--min-top1", "--dump", "--model", "--kv", "--draft"},
         {"--emulate-dp4a", "--precise", "--ptx"});
  if (a.positional().size() != 2)
    throw UsageError("usage: qrig verify MODEL.gguf|PLAN_DIR REF.gguf [--rig RIG.toml] [--backend cpu|cuda] [--tol X] "
                     "[--min-top1 F] [--split N] [--kv k16v16|k8v8|k8v4|k8v3|k4v4|k3v3|...] [--draft N] [--emulate-dp4a] "
                     "[--precise] [--ptx] [--dump FILE]");
  const bool precise = a.has("--precise");
  const bool emulate = a.has("--emulate-dp4a");
  LoadOptions lo;
  lo.backend = a.get("--backend", a.has("--rig") && !emulate ? "" : "cpu");
  lo.rig_path = a.get("--rig");
  lo.max_sequences = 1;
  lo.max_logit_rows = 512;  // every row of a prefill step (the default 512 tokens)
  if (emulate) lo.family = "dp4a-emulated";
  if (precise) lo.precise_rows = INT64_MAX;
  lo.ptx_jit = a.has("--ptx");
  lo.model_override = a.get("--model");
  lo.kv = a.get("--kv");
  if (a.has("--draft")) lo.draft_tokens = a.get_int("--draft", -1);
  if (a.has("--draft") && lo.draft_tokens < 0) throw UsageError("--draft must be 0 (off) .. 4");
  const bool dir = resolve_model(a.positional()[0]).plan;
  if ((precise || emulate || lo.ptx_jit || !lo.kv.empty()) && dir)
    throw UsageError("--precise, --emulate-dp4a, --ptx and --kv compile the .gguf; a plan directory has its own numerics, "
                     "kernels and cache formats (qrig compile --precise / --emulate-dp4a / --ptx / --kv)");
  if (emulate && lo.backend != "cpu") throw UsageError("--emulate-dp4a is a CPU backend mode");
  ir::Plan plan = load_or_compile_plan(a.positional()[0], lo);
  // The CPU reference runs fp32 throughout: ~5e-6 of the float64 reference, top-1 on every position. The CUDA
  // dp4a family quantizes matmul inputs to int8 per 32 values and keeps the KV cache in fp16. With one int8
  // plane (prefill by default, as llama.cpp's MMQ/MMVQ) that is ~8e-2 of the logit range and ~94% top-1
  // agreement on tiny-ref, on the GPU and on the CPU emulating it: the random tiny model's top-2 logits are
  // often that close (the int8 input of lm_head alone flips 4 of 395 positions). Two planes (~15 bits:
  // decode by default, every matmul with --precise) give ~4e-4 and 100% in the emulation.
  // --emulate-dp4a runs the CPU reference with the GPU family's numerics (a dp4a-emulated plan).
  const bool q8 = plan.kernel_family != "reference";
  const bool q8_everywhere = q8 && plan.precise_rows < plan.max_batch_tokens;
  // Quantized key/value caches (--kv) set their own floor, from their least precise format as measured on tiny-ref
  // (docs/kv-cache.md: f16 1.8e-4, q8 3.8e-3, t4 6.2e-2 and 97% top-1, t3 1.2e-1 and 95%): a random model's top-2
  // logits are close, so these are comparisons of formats, not quality claims.
  double kv_tol = 0, kv_top1 = 1;
  for (const std::string& f : {plan.k_dtype, plan.v_dtype}) {
    if (f == "f16") kv_tol = std::max(kv_tol, 1e-3);
    if (f == "q8") kv_tol = std::max(kv_tol, 1e-2);
    if (f == "t4") kv_tol = std::max(kv_tol, 0.15), kv_top1 = std::min(kv_top1, 0.93);
    if (f == "t3") kv_tol = std::max(kv_tol, 0.25), kv_top1 = std::min(kv_top1, 0.9);
  }
  const double tol = a.get_float("--tol", std::max(kv_tol, q8_everywhere ? 1e-1 : q8 ? 5e-3 : 1e-4));
  const double min_top1 = a.get_float("--min-top1", std::min(kv_top1, q8_everywhere ? 0.9 : 0.99));
  gguf::File ref = gguf::File::open(a.positional()[1]);
  // A draft reference: the CPU reference head within 1e-4 (its cache is f32 whatever --kv); a CUDA head within the
  // tolerance and top-1 minimum of the plan's numerics, as the main model's.
  if (is_draft_reference(ref))
    return plan.backend == "cpu" ? verify_draft_reference(plan, ref, a.get_float("--tol", 1e-4), a.get_int("--split", 0))
                                 : verify_draft_reference(plan, ref, tol, a.get_int("--split", 0), min_top1);
  std::unique_ptr<ModelRunner> runner;
  if (plan.backend == "cpu") {
    runner = std::make_unique<CpuRunner>(plan);
  } else {
#ifdef QRIG_HAVE_CUDA
    runner = std::make_unique<CudaRunner>(plan);
#else
    throw runtime::RuntimeError(fmt::format("backend '{}' is not available in this build of qrig", plan.backend));
#endif
  }
  std::vector<float> dump;
  auto reports = verify_reference(*runner, ref, a.get_int("--split", 0), a.has("--dump") ? &dump : nullptr);
  if (a.has("--dump")) {
    // Raw little-endian f32: every position's logits, sequence by sequence in the reference's order.
    const std::string path = a.get("--dump");
    std::FILE* f = std::fopen(path.c_str(), "wb");
    if (!f || std::fwrite(dump.data(), sizeof(float), dump.size(), f) != dump.size() || std::fclose(f) != 0)
      throw std::runtime_error(fmt::format("cannot write the logits to '{}'", path));
    fmt::print("wrote {} logits ({} bytes) to {}\n", dump.size(), dump.size() * 4, path);
  }
  double worst = 0, kl = 0;
  int64_t agree = 0, total = 0;
  for (const auto& r : reports) {
    std::string bad = "none";
    for (const auto& [layer, e] : r.layer_err)
      if (!(e <= tol)) { bad = std::to_string(layer); break; }
    fmt::print("seq {} max_rel_err {:.3e} top1 {}/{} mean_kl {:.3e} first_bad_layer {}\n", r.name, r.max_rel_err,
               r.top1_agree, r.tokens, r.tokens > 0 ? r.kl_sum / (double)r.tokens : 0.0, bad);
    worst = std::max(worst, r.max_rel_err);
    agree += r.top1_agree;
    total += r.tokens;
    kl += r.kl_sum;
  }
  const double top1 = total > 0 ? (double)agree / (double)total : 0.0;
  fmt::print("backend {} kv k_{} v_{} max_rel_err {:.3e} (tolerance {:.1e}) top1 {:.4f} ({}/{}, minimum {:.2f}) "
             "mean_kl {:.3e}\n", plan.backend, plan.k_dtype, plan.v_dtype, worst, tol, top1, agree, total, min_top1,
             total > 0 ? kl / (double)total : 0.0);
  return worst <= tol && top1 >= min_top1 ? 0 : 1;
}

}  // namespace qrig::cli
