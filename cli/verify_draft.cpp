// `qrig verify MODEL DRAFT-REF.gguf` for a draft reference (../shared/fixtures/README.md, tiny-mtp-draft-ref.gguf:
// mtp_logits.<seq>, mtp_hidden_in, mtp_eh, mtp_hidden_out): runs the main model over each sequence, feeds its
// final-normed hidden (the plan's draft graph names the value: hidden_from) with the next tokens to the plan's MTP
// draft head, and compares the head's logits and intermediates row by row. The head runs twice: on the engine's
// own hidden (what drafting uses) and on the reference's mtp_hidden_in (the head alone, as the fixture's tip says),
// so a fault is localised to the main model or to the head. On the CPU backend (reference family) and the CUDA
// backend (the executor's draft graph: CudaExecutor::draft_forward); on CUDA a call returns the logits of at most the
// plan's output rows, so the head runs in pieces of that many rows (the same split as the main model otherwise).
#include <algorithm>
#include <climits>
#include <cmath>
#include <cstring>
#include <map>
#include <memory>

#include <fmt/format.h>

#include "cli/verify.h"
#include "runtime/cpu/executor.h"
#ifdef QRIG_HAVE_CUDA
#include "runtime/cuda/executor.h"
#endif

namespace qrig::cli {

namespace {

double rel_err(const float* a, const float* r, int64_t n) {
  double num = 0, den = 0;
  for (int64_t i = 0; i < n; ++i) {
    const double d = std::fabs((double)a[i] - (double)r[i]);
    if (!(d <= num)) num = std::isnan(d) ? INFINITY : d;
    den = std::max(den, std::fabs((double)r[i]));
  }
  return den > 0 ? num / den : (num > 0 ? INFINITY : 0.0);
}

std::vector<float> f32_tensor(const gguf::File& ref, const std::string& name, int64_t rows, int64_t width) {
  const gguf::TensorInfo& t = ref.tensor(name);
  if (t.type != gguf::TensorType::F32) throw gguf::Error(fmt::format("draft reference tensor '{}' must be F32", name));
  if ((int64_t)t.n_elements != rows * width)
    throw gguf::Error(fmt::format("draft reference tensor '{}' has {} values, not {} rows x {}", name, t.n_elements,
                                  rows, width));
  std::vector<float> v(t.n_elements);
  gguf::dequantize(t.type, ref.tensor_data(t), v.data(), t.n_elements);
  return v;
}

struct HeadErrors {
  double logits = 0, eh = 0, out = 0;
  int64_t top1 = 0;
};

// The main model and the draft head of a plan, one sequence at a time: the main model's forward reports its taps
// (the head's hidden_from among them); the head's forward runs rows at its next positions with the hidden rows
// given (host) and returns the logits of every row.
class DraftRunner {
 public:
  virtual ~DraftRunner() = default;
  virtual int64_t vocab() const = 0;
  virtual int64_t width() const = 0;
  virtual int64_t max_main_rows() const = 0;  // rows per main model call
  virtual int64_t max_head_rows() const = 0;  // rows per head call (each returns every row's logits)
  virtual void begin() = 0;                   // a new sequence for both
  virtual void main_forward(const std::vector<int32_t>& tokens, const runtime::TapFn& tap) = 0;
  virtual std::vector<float> head_forward(const std::vector<int32_t>& next, const float* hidden,
                                          const runtime::TapFn& tap) = 0;
  virtual void head_begin() = 0;              // the head alone starts over
};

class CpuDraftRunner final : public DraftRunner {
 public:
  explicit CpuDraftRunner(const ir::Plan& plan)
      : file_(runtime::open_plan_model(plan)), main_(plan, file_), head_(plan, file_, {}, true),
        ms_(main_.new_sequence()), hs_(head_.new_sequence()) {}
  int64_t vocab() const override { return main_.vocab_rows(); }
  int64_t width() const override { return head_.hidden_width(); }
  int64_t max_main_rows() const override { return INT64_MAX; }
  int64_t max_head_rows() const override { return INT64_MAX; }
  void begin() override {
    ms_ = main_.new_sequence();
    head_begin();
  }
  void head_begin() override { hs_ = head_.new_sequence(); }
  void main_forward(const std::vector<int32_t>& tokens, const runtime::TapFn& tap) override {
    main_.forward(ms_, tokens, {}, tap);
  }
  std::vector<float> head_forward(const std::vector<int32_t>& next, const float* hidden,
                                  const runtime::TapFn& tap) override {
    std::vector<int32_t> rows(next.size());
    for (size_t t = 0; t < rows.size(); ++t) rows[t] = (int32_t)t;
    return head_.forward(hs_, next, rows, tap, hidden);
  }

 private:
  std::shared_ptr<const gguf::File> file_;
  runtime::CpuExecutor main_, head_;
  runtime::CpuSequence ms_, hs_;
};

#ifdef QRIG_HAVE_CUDA
class CudaDraftRunner final : public DraftRunner {
 public:
  explicit CudaDraftRunner(const ir::Plan& plan) : ex_(plan, runtime::open_plan_model(plan)) {}
  int64_t vocab() const override { return ex_.vocab_rows(); }
  int64_t width() const override { return ex_.draft_width(); }
  int64_t max_main_rows() const override { return ex_.plan().rows_per_call(); }
  int64_t max_head_rows() const override { return std::min(ex_.plan().rows_per_call(), ex_.plan().max_logit_rows); }
  void begin() override {
    ex_.reset(0);
    head_begin();
  }
  void head_begin() override { head_pos_ = 0; }
  void main_forward(const std::vector<int32_t>& tokens, const runtime::TapFn& tap) override {
    ex_.step({runtime::StepInput{0, tokens, false}}, {{}}, false, false, tap);
  }
  std::vector<float> head_forward(const std::vector<int32_t>& next, const float* hidden,
                                  const runtime::TapFn& tap) override {
    std::vector<int32_t> rows(next.size());
    for (size_t t = 0; t < rows.size(); ++t) rows[t] = (int32_t)t;
    auto logits = ex_.draft_forward(0, head_pos_, next, {{hidden, (int64_t)next.size(), true}}, rows, tap);
    head_pos_ += (int64_t)next.size();
    return logits;
  }

 private:
  runtime::CudaExecutor ex_;
  int64_t head_pos_ = 0;
};
#endif

}  // namespace

bool is_draft_reference(const gguf::File& ref) {
  if (!ref.find("reference.sequences")) return false;
  for (const std::string& s : ref.get_string_array("reference.sequences"))
    if (ref.find_tensor("mtp_logits." + s)) return true;
  return false;
}

int verify_draft_reference(const ir::Plan& plan, const gguf::File& ref, double tol, int64_t split, double min_top1) {
  if (plan.draft_tokens <= 0)
    throw runtime::RuntimeError("the plan has no MTP draft head (draft_tokens = 0): compile the model with --draft N");
  std::unique_ptr<DraftRunner> runner;
  if (plan.backend == "cpu") {
    runner = std::make_unique<CpuDraftRunner>(plan);
  } else {
#ifdef QRIG_HAVE_CUDA
    runner = std::make_unique<CudaDraftRunner>(plan);
#else
    throw runtime::RuntimeError(fmt::format("backend '{}' is not available in this build of qrig", plan.backend));
#endif
  }
  const int64_t V = runner->vocab(), D = runner->width();
  const std::string hidden_from = std::get<std::string>(*plan.draft.attr("hidden_from"));
  double worst = 0;
  int64_t agree = 0, total = 0;
  for (const std::string& name : ref.get_string_array("reference.sequences")) {
    if (!ref.find_tensor("mtp_logits." + name)) continue;
    const gguf::TensorInfo& tt = ref.tensor("tokens." + name);
    if (tt.type != gguf::TensorType::I32) throw gguf::Error(fmt::format("tokens.{} must be I32", name));
    const int64_t n = (int64_t)tt.n_elements, rows = n - 1;
    if (rows < 1) continue;
    std::vector<int32_t> tokens((size_t)n);
    std::memcpy(tokens.data(), ref.tensor_data(tt), (size_t)n * 4);
    const auto r_logits = f32_tensor(ref, "mtp_logits." + name, rows, V);
    const auto r_in = f32_tensor(ref, "mtp_hidden_in." + name, rows, D);
    const auto r_eh = f32_tensor(ref, "mtp_eh." + name, rows, D);
    const auto r_out = f32_tensor(ref, "mtp_hidden_out." + name, rows, D);

    // The main model: its final-normed hidden at every position (prefill `split` tokens, then one at a time).
    std::vector<float> hidden;
    runner->begin();
    const int64_t first = split > 0 && split < n ? split : n;
    for (int64_t done = 0; done < n;) {
      const int64_t T = done < first ? std::min(first - done, runner->max_main_rows()) : 1;
      const std::vector<int32_t> chunk(tokens.begin() + done, tokens.begin() + done + T);
      runner->main_forward(chunk, [&](const std::string& tap, const float* x, int64_t nr, int64_t w) {
        if (tap == hidden_from) hidden.insert(hidden.end(), x, x + nr * w);
      });
      done += T;
    }
    if ((int64_t)hidden.size() != n * D) throw runtime::RuntimeError("the main model did not report " + hidden_from);
    double in_err = 0;
    for (int64_t t = 0; t < rows; ++t) in_err = std::max(in_err, rel_err(hidden.data() + t * D, r_in.data() + t * D, D));

    // The head on a hidden: row t = (hidden_t, tokens[t+1]), the same split as the main model (rows - 1 of them).
    auto run_head = [&](const float* h) {
      HeadErrors e;
      runner->head_begin();
      const int64_t hfirst = split > 0 && split - 1 < rows ? std::max<int64_t>(1, split - 1) : rows;
      for (int64_t done = 0; done < rows;) {
        const int64_t T = done < hfirst ? std::min(hfirst - done, runner->max_head_rows()) : 1;
        const std::vector<int32_t> next(tokens.begin() + done + 1, tokens.begin() + done + 1 + T);
        auto tap = [&](const std::string& tap_name, const float* x, int64_t nr, int64_t w) {
          const std::vector<float>* r = tap_name == "mtp_eh" ? &r_eh : tap_name == "mtp_hidden_out" ? &r_out : nullptr;
          if (!r) return;
          double& m = tap_name == "mtp_eh" ? e.eh : e.out;
          for (int64_t t = 0; t < nr; ++t) m = std::max(m, rel_err(x + t * w, r->data() + (done + t) * w, w));
        };
        const auto got = runner->head_forward(next, h + done * D, tap);
        for (int64_t t = 0; t < T; ++t) {
          const float* g = got.data() + t * V;
          const float* r = r_logits.data() + (done + t) * V;
          e.logits = std::max(e.logits, rel_err(g, r, V));
          e.top1 += (std::max_element(g, g + V) - g) == (std::max_element(r, r + V) - r);
        }
        done += T;
      }
      return e;
    };
    const HeadErrors own = run_head(hidden.data()), alone = run_head(r_in.data());
    const double seq_worst = std::max({own.logits, own.eh, own.out, alone.logits, alone.eh, alone.out, in_err});
    fmt::print("seq {} mtp max_rel_err {:.3e} top1 {}/{} eh {:.3e} hidden_out {:.3e} hidden_in {:.3e}; head alone "
               "(reference hidden): max_rel_err {:.3e} eh {:.3e} hidden_out {:.3e}\n",
               name, own.logits, own.top1, rows, own.eh, own.out, in_err, alone.logits, alone.eh, alone.out);
    worst = std::max(worst, std::isnan(seq_worst) ? INFINITY : seq_worst);
    agree += own.top1;
    total += rows;
  }
  if (total == 0) throw gguf::Error("the draft reference has no sequence with an MTP row");
  const double top1 = (double)agree / (double)total;
  fmt::print("backend {} draft mtp max_rel_err {:.3e} (every row and intermediate; tolerance {:.1e}) top1 {:.4f} "
             "({}/{}{})\n", plan.backend, worst, tol, top1, agree, total,
             min_top1 > 0 ? fmt::format(", minimum {:.2f}", min_top1) : std::string());
  return worst <= tol && top1 >= min_top1 ? 0 : 1;
}

}  // namespace qrig::cli
