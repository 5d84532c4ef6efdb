// End-to-end check of the CPU reference backend against transformers' float64 forward
// (../shared/fixtures/tiny-ref.gguf): logits and every layer's hidden state, for one prefill, for prefill
// followed by single-token decode, and with the GDN forced recurrent or chunked.
#include <catch2/catch.hpp>

#include <algorithm>
#include <cmath>
#include <map>

#include <fmt/format.h>

#include "compiler/compile.h"
#include "runtime/cpu/executor.h"
#include "tests/fixtures.h"

using namespace qrig;

namespace {

const std::string kFixtures = qrig::fixtures::shared_dir() + "/fixtures/";

struct Ref {
  gguf::File file = gguf::File::open(kFixtures + "tiny-ref.gguf");
  std::vector<float> f32(const std::string& name) const {
    const auto& t = file.tensor(name);
    std::vector<float> v(t.n_elements);
    gguf::dequantize(t.type, file.tensor_data(t), v.data(), t.n_elements);
    return v;
  }
  std::vector<int32_t> tokens(const std::string& seq) const {
    const auto& t = file.tensor("tokens." + seq);
    const int32_t* p = reinterpret_cast<const int32_t*>(file.tensor_data(t));
    return {p, p + t.n_elements};
  }
};

const Ref& ref() {
  static Ref r;
  return r;
}

double row_err(const float* a, const float* r, int64_t n) {
  double num = 0, den = 0;
  for (int64_t i = 0; i < n; ++i) {
    double d = std::fabs((double)a[i] - r[i]);
    num = std::isnan(d) ? INFINITY : std::max(num, d);
    den = std::max(den, std::fabs((double)r[i]));
  }
  return num / den;
}

// family "" (the fp32 reference) or "dp4a-emulated" with precise_rows two-plane rows (-1: the default).
ir::Plan tiny_plan(const std::string& model, int64_t recurrent_below, const std::string& family = "",
                   int64_t precise_rows = -1) {
  gguf::File f = gguf::File::open(kFixtures + model);
  compiler::CompileOptions co;
  co.context_length = 512;
  co.max_sequences = 1;
  co.family = family;
  co.precise_rows = precise_rows;
  ir::Plan p = compiler::compile(f, compiler::Rig::parse("[[device]]\nkind=\"cpu\"\nmemory_gib=2.0\n", "test"), co);
  for (auto& op : p.graph.ops)
    if (op.kind == ir::OpKind::gdn) op.set("recurrent_below", recurrent_below);
  return p;
}

// Runs one reference sequence with the given prefill length (rest decoded one token at a time) and returns
// the worst logit error; hidden-state errors per layer go to layer_err.
double run_sequence(const runtime::CpuExecutor& ex, const std::string& seq, int64_t prefill,
                    std::map<std::string, double>& layer_err) {
  const auto tokens = ref().tokens(seq);
  const auto logits = ref().f32("logits." + seq);
  const int64_t n = (int64_t)tokens.size(), V = (int64_t)logits.size() / n;
  std::map<std::string, std::vector<float>> hidden;
  for (int i = 0; i <= 8; ++i) hidden[fmt::format("hidden.{}", i)] = ref().f32(fmt::format("hidden.{}.{}", seq, i));
  auto s = ex.new_sequence();
  double worst = 0;
  int64_t done = 0;
  while (done < n) {
    int64_t T = done == 0 ? std::min(prefill, n) : 1;
    std::vector<int32_t> chunk(tokens.begin() + done, tokens.begin() + done + T), rows;
    for (int64_t t = 0; t < T; ++t) rows.push_back((int32_t)t);
    auto tap = [&](const std::string& name, const float* x, int64_t R, int64_t W) {
      for (int64_t t = 0; t < R; ++t)
        layer_err[name] = std::max(layer_err[name], row_err(x + t * W, hidden[name].data() + (done + t) * W, W));
    };
    auto out = ex.forward(s, chunk, rows, tap);
    REQUIRE((int64_t)out.size() == T * V);
    for (int64_t t = 0; t < T; ++t) worst = std::max(worst, row_err(out.data() + t * V, logits.data() + (done + t) * V, V));
    done += T;
  }
  return worst;
}

}  // namespace

TEST_CASE("cpu backend matches transformers on every reference sequence", "[runtime][fixtures]") {
  for (const char* model : {"tiny.gguf", "tiny-mtp.gguf"}) {
    // recurrent_below 16: prefills use the chunked GDN, single-token decode steps the recurrent one.
    runtime::CpuExecutor ex(tiny_plan(model, 16), runtime::open_plan_model(tiny_plan(model, 16)));
    for (const char* seq : {"long", "short", "random", "single"}) {
      for (int64_t prefill : {int64_t{1000}, int64_t{1}, int64_t{17}}) {
        std::map<std::string, double> layer_err;
        double e = run_sequence(ex, seq, prefill, layer_err);
        INFO(model << " seq " << seq << " prefill " << prefill);
        for (const auto& [layer, le] : layer_err) {
          INFO(layer);
          CHECK(le <= 1e-4);
        }
        CHECK(layer_err.size() == 9);
        CHECK(e <= 1e-4);
      }
    }
  }
}

TEST_CASE("chunked and recurrent GDN give the same model output", "[runtime][fixtures]") {
  auto plan_rec = tiny_plan("tiny.gguf", 1 << 30);  // every step recurrent
  auto plan_chunk = tiny_plan("tiny.gguf", 0);      // every step chunked, even one token
  runtime::CpuExecutor rec(plan_rec, runtime::open_plan_model(plan_rec));
  runtime::CpuExecutor chk(plan_chunk, runtime::open_plan_model(plan_chunk));
  const auto tokens = ref().tokens("long");
  std::vector<int32_t> rows(tokens.size());
  for (size_t t = 0; t < rows.size(); ++t) rows[t] = (int32_t)t;
  auto s1 = rec.new_sequence(), s2 = chk.new_sequence();
  auto a = rec.forward(s1, tokens, rows);
  auto b = chk.forward(s2, tokens, rows);
  const int64_t V = rec.vocab_rows();
  double worst = 0;
  for (size_t t = 0; t < tokens.size(); ++t) worst = std::max(worst, row_err(a.data() + t * V, b.data() + t * V, V));
  CHECK(worst <= 1e-5);
  std::map<std::string, double> le;
  CHECK(run_sequence(rec, "long", 300, le) <= 1e-4);
  CHECK(run_sequence(chk, "short", 1, le) <= 1e-4);
}

TEST_CASE("bad forward calls fail cleanly and leave the sequence usable", "[runtime][fixtures]") {
  auto plan = tiny_plan("tiny.gguf", 16);
  runtime::CpuExecutor ex(plan, runtime::open_plan_model(plan));
  auto s = ex.new_sequence();
  CHECK_THROWS_AS(ex.forward(s, {}, {}), runtime::RuntimeError);
  CHECK_THROWS_AS(ex.forward(s, {5, 2000}, {1}), runtime::RuntimeError);  // id >= vocab rows
  CHECK_THROWS_AS(ex.forward(s, {5, -1}, {1}), runtime::RuntimeError);
  CHECK_THROWS_AS(ex.forward(s, {5, 6}, {2}), runtime::RuntimeError);     // row out of range
  std::vector<int32_t> big(513, 7);
  CHECK_THROWS_WITH(ex.forward(s, big, {0}), Catch::Contains("context overflow"));
  CHECK(s.n_past == 0);
  // The sequence still produces the reference logits after the failed calls.
  std::map<std::string, double> le;
  const auto tokens = ref().tokens("short");
  auto out = ex.forward(s, tokens, {29});
  const auto logits = ref().f32("logits.short");
  CHECK(row_err(out.data(), logits.data() + 29 * ex.vocab_rows(), ex.vocab_rows()) <= 1e-4);
  // Fill to the context limit exactly, then one more token overflows.
  auto s2 = ex.new_sequence();
  std::vector<int32_t> fill(512, 9);
  ex.forward(s2, fill, {511});
  CHECK_THROWS_WITH(ex.forward(s2, {1}, {0}), Catch::Contains("context overflow"));
}

TEST_CASE("the CPU executor can compute the CUDA dp4a family's numerics", "[runtime][reference][fixtures]") {
  // int8 matmul inputs per 32 values + fp16 K/V: what the GPU computes, so a GPU/reference difference can be
  // attributed. Measured on tiny-ref: ~7.8e-2 of the logit range and ~94% top-1 (fp32: 5e-6 and 100%).
  // A dp4a-emulated plan carries those numerics in its graph (quantize ops, fp16 caches); one plane everywhere
  // (precise_rows 0) as the GPU's prefill.
  const ir::Plan fp32 = tiny_plan("tiny.gguf", 16), emulated = tiny_plan("tiny.gguf", 16, "dp4a-emulated", 0);
  CHECK(emulated.kernel_family == "dp4a-emulated");
  CHECK(emulated.k_dtype == "f16");
  runtime::CpuExecutor ex(fp32, runtime::open_plan_model(fp32)), ex_q8(emulated, runtime::open_plan_model(emulated));
  const std::vector<int32_t> tokens = ref().tokens("long");
  const std::vector<float> want = ref().f32("logits.long");
  const int64_t n = (int64_t)tokens.size(), V = ex.vocab_rows();
  std::vector<int32_t> rows((size_t)n);
  for (int64_t t = 0; t < n; ++t) rows[(size_t)t] = (int32_t)t;
  auto run = [&](const runtime::CpuExecutor& e) {
    runtime::CpuSequence s = e.new_sequence();
    return e.forward(s, tokens, rows);
  };
  const std::vector<float> exact = run(ex), q8 = run(ex_q8);
  double e_exact = 0, e_q8 = 0;
  int64_t top1 = 0;
  for (int64_t t = 0; t < n; ++t) {
    e_exact = std::max(e_exact, row_err(exact.data() + t * V, want.data() + t * V, V));
    e_q8 = std::max(e_q8, row_err(q8.data() + t * V, want.data() + t * V, V));
    const float* a = q8.data() + t * V;
    const float* r = want.data() + t * V;
    top1 += std::max_element(a, a + V) - a == std::max_element(r, r + V) - r;
  }
  CHECK(e_exact < 1e-4);
  CHECK(e_q8 > 1e-2);  // the quantization is really applied
  CHECK(e_q8 < 1e-1);
  CHECK((double)top1 / (double)n >= 0.9);
}
