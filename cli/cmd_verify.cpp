// `qrig verify MODEL REF.gguf`: run every sequence of a reference file (fixture format: tokens.<seq>,
// logits.<seq>, hidden.<seq>.<i>) and report the worst relative error per sequence and the first layer whose
// hidden state is off. This is how a user checks that a rig computes correctly.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>

#include <fmt/format.h>

#include "cli/args.h"
#include "cli/commands.h"
#include "cli/verify.h"
#include "runtime/cpu/executor.h"

namespace qrig::cli {

namespace {

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

std::vector<float> tensor_f32(const gguf::File& ref, const std::string& name) {
  const gguf::TensorInfo& t = ref.tensor(name);
  if (t.type != gguf::TensorType::F32) throw gguf::Error(fmt::format("reference tensor '{}' must be F32", name));
  std::vector<float> v(t.n_elements);
  gguf::dequantize(t.type, ref.tensor_data(t), v.data(), t.n_elements);
  return v;
}

}  // namespace

std::vector<SequenceReport> verify_reference(const runtime::CpuExecutor& ex, const gguf::File& ref, int64_t split) {
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
    if (vocab != ex.vocab_rows())
      throw gguf::Error(fmt::format("reference vocab {} != model vocab {}", vocab, ex.vocab_rows()));
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
    runtime::CpuSequence seq = ex.new_sequence();
    // Prefill `first` tokens, then decode the rest one at a time (split <= 0 or >= n: one prefill).
    const int64_t first = split > 0 && split < n ? split : n;
    int64_t done = 0;
    while (done < n) {
      const int64_t T = done == 0 ? first : 1;
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
      std::vector<float> got = ex.forward(seq, chunk, rows, tap);
      for (int64_t t = 0; t < T; ++t) {
        double e = row_rel_err(got.data() + t * vocab, logits.data() + (done + t) * vocab, vocab);
        rep.max_rel_err = std::max(rep.max_rel_err, std::isnan(e) ? INFINITY : e);
        // top-1 agreement
        const float* g = got.data() + t * vocab;
        const float* r = logits.data() + (done + t) * vocab;
        rep.top1_agree += (std::max_element(g, g + vocab) - g) == (std::max_element(r, r + vocab) - r);
      }
      done += T;
    }
    rep.layer_err = layer_err;
    out.push_back(rep);
  }
  return out;
}

int cmd_verify(int argc, char** argv) {
  Args a(argc, argv, 2, {"--backend", "--tol", "--rig", "--split"}, {});
  if (a.positional().size() != 2)
    throw UsageError("usage: qrig verify MODEL.gguf|PLAN_DIR REF.gguf [--backend cpu|cuda] [--tol X] [--split N]");
  const double tol = a.get_float("--tol", 1e-4);
  LoadOptions lo;
  lo.backend = a.get("--backend", "cpu");
  lo.rig_path = a.get("--rig");
  lo.max_sequences = 1;
  ir::Plan plan = load_or_compile_plan(a.positional()[0], lo);
  if (plan.backend != "cpu")
    throw runtime::RuntimeError(fmt::format("backend '{}' is not available in this build of qrig (CPU only so far)",
                                            plan.backend));
  runtime::CpuExecutor ex(plan, runtime::open_plan_model(plan));
  gguf::File ref = gguf::File::open(a.positional()[1]);
  auto reports = verify_reference(ex, ref, a.get_int("--split", 0));
  double worst = 0;
  for (const auto& r : reports) {
    std::string bad = "none";
    for (const auto& [layer, e] : r.layer_err)
      if (!(e <= tol)) { bad = std::to_string(layer); break; }
    fmt::print("seq {} max_rel_err {:.3e} first_bad_layer {}\n", r.name, r.max_rel_err, bad);
    worst = std::max(worst, r.max_rel_err);
  }
  fmt::print("max_rel_err {:.3e}\n", worst);
  return worst <= tol ? 0 : 1;
}

}  // namespace qrig::cli
