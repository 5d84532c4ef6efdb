// `qrig bench PLAN|MODEL`: llama-bench's tests on a plan. ppN = prefill N random tokens into an empty sequence
// (in steps of the plan's max_batch_tokens, the last one producing the next token), tgN = N greedy decode steps
// of one token; -d D first fills the sequence with D tokens (untimed, once per depth: each repetition restores the
// filled state), so the test runs at depth D. Each test
// runs once to warm up, then -r times; the table gives mean +- sd of tokens/s over the repetitions, like
// llama-bench. On CUDA plans the greedy choice is made on the GPU (argmax kernel), so no logits cross the bus;
// on CPU plans the logits are read and argmaxed on the host. A pipeline plan (several stages) runs through its
// pipeline backend (logits argmaxed on the host), and a second table gives, per test and stage, the share of the
// time the stage was computing and the time per token its outgoing bridge spent moving rows (--simulate-link-gbps
// holds each crossing to what a link of that speed would take: a test aid).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <fstream>
#include <functional>
#include <memory>
#include <optional>
#include <random>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cli/args.h"
#include "cli/commands.h"
#include "runtime/backend.h"
#include "runtime/speculative.h"
#include "runtime/cpu/executor.h"
#ifdef QRIG_HAVE_CUDA
#include "runtime/cuda/executor.h"
#endif

namespace qrig::cli {

namespace {

// One sequence (slot 0) that can prefill and decode greedily.
class BenchModel {
 public:
  virtual ~BenchModel() = default;
  virtual void reset() = 0;
  // Runs the tokens (already split to fit a step); returns the greedy next token when `last`.
  virtual int32_t run(const std::vector<int32_t>& tokens, bool last) = 0;
  virtual int64_t max_step() const = 0;
  virtual std::string backend() const = 0;
  virtual std::string note() const { return {}; }  // a line under the table
  virtual std::vector<runtime::StageStats> stage_stats() const { return {}; }
  virtual void reset_stage_stats() {}
  // The sequence's state at its position (runtime/backend.h Snapshot): a test at depth D fills D tokens once and
  // each repetition restores this instead of filling again (the KV rows below D are not touched by the test).
  virtual std::shared_ptr<runtime::Snapshot> save() const = 0;
  virtual void restore(const runtime::Snapshot& s) = 0;
  // Several sequences at once (--sequences): one step over the inputs (each slot's tokens); the greedy next token
  // of each input that wants logits (-1 for the others), in order.
  virtual std::vector<int32_t> run_many(const std::vector<runtime::StepInput>& inputs) = 0;
  virtual void reset_slot(int slot) = 0;
  // Speculative decoding (plans that draft): one step from `next` with at most `room` drafts; the tokens generated.
  virtual int draft_tokens() const { return 0; }
  virtual std::vector<int32_t> run_draft(int32_t next, int64_t room) {
    (void)next, (void)room;
    return {};
  }
  int64_t drafted = 0, accepted = 0, draft_steps = 0, draft_generated = 0;
  // --profile (one-stage CUDA plans): GPU time per op kind and kernels, from CUDA events around each op of eager
  // steps. set_profiling(true) starts a fresh sum; false when the model cannot profile.
  struct ProfileRow {
    std::string op;
    int64_t calls = 0;
    double ms = 0;
  };
  virtual bool set_profiling(bool on) {
    (void)on;
    return false;
  }
  virtual std::vector<ProfileRow> profile() const { return {}; }
};

class BackendModel final : public BenchModel {
 public:
  // A backend that selects candidates where the logits are (a CUDA pipeline's last stage) picks the greedy token
  // there: no row of logits crosses to the host, as with CudaModel's argmax.
  BackendModel(const ir::Plan& plan, const runtime::BackendOptions& opt)
      : b_(runtime::make_backend(plan, opt)), max_(plan.max_batch_tokens),
        greedy_(greedy_params(), (int32_t)std::max<int64_t>(1, std::min(plan.vocab_real, b_->vocab_rows()))) {}
  std::vector<runtime::StageStats> stage_stats() const override { return b_->stage_stats(); }
  void reset_stage_stats() override { b_->reset_stage_stats(); }
  void reset() override { b_->reset(0); }
  void reset_slot(int slot) override { b_->reset(slot); }
  std::vector<int32_t> run_many(const std::vector<runtime::StepInput>& inputs) override {
    auto out = b_->step(inputs);
    std::vector<int32_t> next;
    for (const auto& l : out)
      next.push_back(l.empty() ? -1 : (int32_t)(std::max_element(l.begin(), l.end()) - l.begin()));
    return next;
  }
  std::shared_ptr<runtime::Snapshot> save() const override { return b_->save(0); }
  void restore(const runtime::Snapshot& s) override { b_->restore(0, s); }
  int32_t run(const std::vector<int32_t>& tokens, bool last) override {
    if (last && b_->top_k_max() > 0) {
      std::vector<std::optional<runtime::TopCandidates>> top;
      auto out = b_->step_select({runtime::StepInput{0, tokens, true}}, {{&greedy_, 1}}, top);
      if (top[0]) return greedy_.pick_top(*top[0], 0.0);
      return greedy_.pick(out[0].data(), (int32_t)out[0].size(), 0.0);
    }
    auto out = b_->step({runtime::StepInput{0, tokens, last}});
    if (!last) return -1;
    const auto& l = out[0];
    return (int32_t)(std::max_element(l.begin(), l.end()) - l.begin());
  }
  int64_t max_step() const override { return std::max<int64_t>(1, max_); }
  int draft_tokens() const override { return b_->draft_tokens(); }
  std::vector<int32_t> run_draft(int32_t next, int64_t room) override {
    auto t = runtime::spec_greedy_step(*b_, 0, next, room, greedy_.n_real_vocab(), drafted, accepted);
    ++draft_steps;
    draft_generated += (int64_t)t.size();
    return t;
  }
  std::string backend() const override {
    const ir::Plan& p = b_->plan();
    return p.placement.size() > 1 ? fmt::format("{} pipeline of {} stages", p.backend, p.placement.size()) : p.backend;
  }

 private:
  static runtime::SamplingParams greedy_params() {
    runtime::SamplingParams p;
    p.temperature = 0;
    p.penalty_last_n = 0;
    return p;
  }
  std::unique_ptr<runtime::Backend> b_;
  int64_t max_;
  runtime::Sampler greedy_;
};

#ifdef QRIG_HAVE_CUDA
class CudaModel final : public BenchModel {
 public:
  CudaModel(const ir::Plan& plan, bool graphs)
      : ex_(plan, runtime::open_plan_model(plan), runtime::CudaOptions{0, {}, graphs, {}, {}}) {}
  void reset() override { ex_.reset(0); }
  void reset_slot(int slot) override { ex_.reset(slot); }
  std::vector<int32_t> run_many(const std::vector<runtime::StepInput>& inputs) override {
    std::vector<std::vector<int32_t>> rows;
    for (const auto& in : inputs)
      rows.push_back(in.want_logits ? std::vector<int32_t>{(int32_t)in.tokens.size() - 1} : std::vector<int32_t>{});
    const auto picked = ex_.step(inputs, rows, false, true).argmax;
    std::vector<int32_t> next;
    size_t k = 0;
    for (const auto& in : inputs) next.push_back(in.want_logits ? picked.at(k++) : -1);
    return next;
  }
  std::shared_ptr<runtime::Snapshot> save() const override { return ex_.save(0); }
  void restore(const runtime::Snapshot& s) override { ex_.restore(0, s); }
  int32_t run(const std::vector<int32_t>& tokens, bool last) override {
    std::vector<std::vector<int32_t>> rows(1);
    if (last) rows[0].push_back((int32_t)tokens.size() - 1);
    auto o = ex_.step({runtime::StepInput{0, tokens, last}}, rows, false, last);
    return last ? o.argmax.at(0) : -1;
  }
  int64_t max_step() const override { return std::max<int64_t>(1, ex_.plan().max_batch_tokens); }
  std::string backend() const override {
    return "CUDA " + ex_.device_name() + (ex_.plan().kernel_code == "ptx" ? " (" + ex_.plan().arch_target + " PTX JIT)" : "");
  }
  std::string note() const override {
    const runtime::GraphStats g = ex_.graph_stats();
    return fmt::format("kernels: {}\nsteps: {} decode steps as CUDA graphs ({} captured, {} replayed), {} launched "
                       "kernel by kernel{}",
                       ex_.kernel_load(), g.captured + g.replayed, g.captured, g.replayed, g.eager,
                       g.disabled_because.empty() ? "" : "; graphs off: " + g.disabled_because);
  }
  runtime::CudaExecutor& ex() { return ex_; }
  bool set_profiling(bool on) override {
    ex_.set_profiling(on);
    return true;
  }
  std::vector<ProfileRow> profile() const override {
    std::vector<ProfileRow> out;
    for (const auto& p : ex_.profile()) out.push_back({p.op, p.calls, p.ms});
    return out;
  }

 private:
  runtime::CudaExecutor ex_;
};
#endif

struct Test {
  std::string name;
  int64_t n_prompt = 0, n_gen = 0, depth = 0;
  std::vector<double> tps;
};

// Prefill `n` tokens in steps; returns the greedy next token.
int32_t prefill(BenchModel& m, const std::vector<int32_t>& toks) {
  int32_t next = -1;
  for (size_t i = 0; i < toks.size();) {
    const size_t n = std::min<size_t>((size_t)m.max_step(), toks.size() - i);
    next = m.run(std::vector<int32_t>(toks.begin() + (ptrdiff_t)i, toks.begin() + (ptrdiff_t)(i + n)), i + n == toks.size());
    i += n;
  }
  return next;
}

// Prefills toks[b] into slot b for every b, packing the sequences' pieces into steps of at most m.max_step()
// tokens in all (as the engine batches prompts); next[b]: the greedy token after slot b's last piece.
void pack_prefill(BenchModel& m, const std::vector<std::vector<int32_t>>& toks, std::vector<int32_t>& next) {
  std::vector<size_t> done(toks.size(), 0);
  for (;;) {
    std::vector<runtime::StepInput> in;
    std::vector<int> slot_of;
    int64_t room = m.max_step();
    for (size_t b = 0; b < toks.size() && room > 0; ++b) {
      const size_t left = toks[b].size() - done[b];
      if (left == 0) continue;
      const size_t n = std::min<size_t>(left, (size_t)room);
      in.push_back(runtime::StepInput{(int)b, std::vector<int32_t>(toks[b].begin() + (ptrdiff_t)done[b],
                                                                  toks[b].begin() + (ptrdiff_t)(done[b] + n)),
                                      done[b] + n == toks[b].size()});
      slot_of.push_back((int)b);
      done[b] += n;
      room -= (int64_t)n;
    }
    if (in.empty()) return;
    const auto out = m.run_many(in);
    for (size_t k = 0; k < in.size(); ++k)
      if (in[k].want_logits) next[(size_t)slot_of[k]] = out[k];
  }
}

double mean(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x;
  return v.empty() ? 0 : s / (double)v.size();
}
double stddev(const std::vector<double>& v) {
  if (v.size() < 2) return 0;
  const double m = mean(v);
  double s = 0;
  for (double x : v) s += (x - m) * (x - m);
  return std::sqrt(s / (double)(v.size() - 1));
}

}  // namespace

int cmd_bench(int argc, char** argv) {
  Args a(argc, argv, 2,
         {"-p", "-n", "-d", "-r", "--rig", "--backend", "--ctx", "--json", "--seed", "--model", "--gpu-memory-utilization",
          "--simulate-link-gbps", "--kv", "--draft", "--sequences"},
         {"--no-cuda-graphs", "--profile"}, {{"-m", "--model"}, {"-npl", "--sequences"}});
  if (a.positional().size() != 1)
    throw UsageError("usage: qrig bench PLAN_DIR|MODEL.gguf [-p 512,4096] [-n 128] [-d 0,32768] [-r 3] [--json FILE] "
                     "[--rig RIG.toml] [--backend cpu|cuda] [--ctx N] [--kv k8v3] [--draft N] [--sequences 1,16,32] [--no-cuda-graphs] "
                     "[--profile] [--simulate-link-gbps F]");
  const auto pps = a.get_int_list("-p", {512});
  const auto tgs = a.get_int_list("-n", {128});
  const auto depths = a.get_int_list("-d", {0});
  const int reps = (int)a.get_int("-r", 3);
  if (reps < 1) throw UsageError("-r must be at least 1");
  // --sequences B: the tests run for B sequences at once as well (llama-batched-bench's -npl): ppN xB prefills N
  // tokens into each of B sequences, packed into steps of the plan's max_batch_tokens; tgN xB decodes N tokens
  // in each of B sequences, one step carrying one token of each; t/s counts the tokens of all B.
  const auto seqs = a.get_int_list("--sequences", {1});
  long long max_seqs = 1;
  for (long long b : seqs) {
    if (b < 1 || b > 4096) throw UsageError("--sequences takes counts from 1 to 4096");
    max_seqs = std::max(max_seqs, b);
  }
  LoadOptions lo;
  lo.rig_path = a.get("--rig");
  lo.backend = a.get("--backend");
  lo.max_sequences = max_seqs;
  int64_t need = 0;
  for (long long d : depths)
    for (long long p : pps) need = std::max<int64_t>(need, d + p + 1);
  for (long long d : depths)
    for (long long n : tgs) need = std::max<int64_t>(need, d + n + 1);
  lo.context_length = a.get_int("--ctx", need);
  lo.gpu_memory_utilization = a.get_float("--gpu-memory-utilization", 0);
  lo.model_override = a.get("--model");
  lo.kv = a.get("--kv");  // key/value cache formats when compiling a .gguf (docs/kv-cache.md)
  if (a.has("--draft")) lo.draft_tokens = a.get_int("--draft", -1);
  if (a.has("--draft") && lo.draft_tokens < 0) throw UsageError("--draft must be 0 (off) .. 4");
  const std::string path = a.positional()[0];
  ir::Plan plan = load_or_compile_plan(path, lo);
  if (plan.context_length < need)
    throw runtime::RuntimeError(fmt::format("the plan allows {} tokens per sequence; these tests need {} (compile it "
                                            "with --ctx {})", plan.context_length, need, need));
  if (plan.max_sequences < max_seqs)
    throw runtime::RuntimeError(fmt::format("the plan has {} sequence slot(s); --sequences {} needs that many (compile "
                                            "it with --parallel {})", plan.max_sequences, max_seqs, max_seqs));
  if (max_seqs > 1 && plan.draft_tokens > 0)
    throw UsageError("--sequences: a plan that drafts is benchmarked one sequence at a time (its tg test)");
  std::unique_ptr<BenchModel> model;
  const bool pipeline = plan.placement.size() > 1;
  runtime::BackendOptions bo;
  bo.cuda_graphs = !a.has("--no-cuda-graphs");
  bo.simulate_link_gbps = a.get_float("--simulate-link-gbps", 0);
  if (bo.simulate_link_gbps < 0) throw UsageError("--simulate-link-gbps must be positive");
  if (bo.simulate_link_gbps > 0 && !pipeline) throw UsageError("--simulate-link-gbps is for plans of several stages");
#ifdef QRIG_HAVE_CUDA
  // A plan that drafts runs through its backend, where the MTP head is (runtime/cuda/draft_head.h).
  if (plan.backend == "cuda" && !pipeline && plan.draft_tokens == 0)
    model = std::make_unique<CudaModel>(plan, bo.cuda_graphs);
#endif
  if (!model) model = std::make_unique<BackendModel>(plan, bo);
  struct StageRow {
    std::string test, device;
    double busy_share, bridge_ms_per_token;
  };
  std::vector<StageRow> stage_rows;
  // Stage time of the timed part of each repetition only (what ran between b0 and now), summed into acc.
  auto add_delta = [&](const std::vector<runtime::StageStats>& b0, std::vector<runtime::StageStats>& acc) {
    const auto now = model->stage_stats();
    if (acc.empty()) acc.assign(now.size(), runtime::StageStats{});
    for (size_t k = 0; k < now.size() && k < b0.size(); ++k) {
      acc[k].device = now[k].device;
      acc[k].busy_s += now[k].busy_s - b0[k].busy_s;
      acc[k].bridge_s += now[k].bridge_s - b0[k].bridge_s;
    }
  };
  auto add_stage_rows = [&](const std::string& test, const std::vector<runtime::StageStats>& acc, double wall_s,
                            int64_t tokens) {
    for (const auto& s : acc)
      stage_rows.push_back({test, s.device, wall_s > 0 ? s.busy_s / wall_s : 0,
                            tokens > 0 ? s.bridge_s * 1e3 / (double)tokens : 0});
  };

  std::mt19937 rng((uint32_t)a.get_int("--seed", 1));
  const int64_t vocab = std::max<int64_t>(2, plan.vocab_real);
  auto random_tokens = [&](int64_t n) {
    std::vector<int32_t> t((size_t)n);
    for (auto& x : t) x = (int32_t)(rng() % (uint64_t)vocab);
    return t;
  };
  using clock = std::chrono::steady_clock;
  std::vector<Test> tests;
  // --profile: after the first pp test and the first tg test (at the first depth), and the first tg test of each
  // number of sequences at once, one more pass kernel by kernel with CUDA events around each op; a table per pass
  // after the results (per token, or for several sequences per step of all of them).
  const bool want_profile = a.has("--profile");
  if (want_profile && !model->set_profiling(false))
    throw UsageError("--profile times the ops of a one-stage CUDA plan (this plan runs on " + model->backend() + ")");
  struct Profiled {
    std::string test;
    int64_t tokens = 0;  // tokens, or steps of several sequences
    double wall_s = 0;
    std::vector<BenchModel::ProfileRow> rows;
    std::string unit = "token";
  };
  std::vector<Profiled> profiles;
  bool profiled_pp = !want_profile, profiled_tg = !want_profile;
  auto profile_pass = [&](const std::string& test, int64_t tokens, const std::function<void()>& run,
                          const std::string& unit = "token") {
    model->set_profiling(true);
    const auto t0 = clock::now();
    run();
    const double s = std::chrono::duration<double>(clock::now() - t0).count();
    profiles.push_back({test, tokens, s, model->profile(), unit});
    model->set_profiling(false);
  };
  for (long long d : depths) {
    // The depth is filled once (untimed) and restored before each repetition. A drafting plan fills again each
    // time: its next step also needs the last position's hidden row, which a snapshot does not hold.
    std::shared_ptr<runtime::Snapshot> filled;
    int32_t filled_next = -1;
    const bool reuse_fill = d > 0 && model->draft_tokens() == 0;
    auto at_depth = [&](int64_t fill_min) {
      if (reuse_fill && filled) {
        model->restore(*filled);
        return filled_next;
      }
      model->reset();
      const int64_t n = std::max<int64_t>(d, fill_min);
      const int32_t next = n > 0 ? prefill(*model, random_tokens(n)) : -1;
      if (reuse_fill) filled = model->save(), filled_next = next;
      return next;
    };
    for (long long p : pps) {
      if (p <= 0) continue;
      Test t{fmt::format("pp{}{}", p, d ? fmt::format(" @ d{}", d) : ""), p, 0, d, {}};
      double wall = 0;
      std::vector<runtime::StageStats> acc;
      for (int r = 0; r <= reps; ++r) {
        at_depth(0);
        const auto toks = random_tokens(p);
        const auto b0 = model->stage_stats();
        const auto t0 = clock::now();
        prefill(*model, toks);
        const double s = std::chrono::duration<double>(clock::now() - t0).count();
        if (r > 0) {  // the first run warms up
          t.tps.push_back((double)p / s), wall += s;
          add_delta(b0, acc);
        }
      }
      add_stage_rows(t.name, acc, wall, p * reps);
      tests.push_back(t);
      if (!profiled_pp) {
        profiled_pp = true;
        at_depth(0);
        const auto toks = random_tokens(p);
        profile_pass(t.name, p, [&] { prefill(*model, toks); });
      }
    }
    for (long long n : tgs) {
      if (n <= 0) continue;
      Test t{fmt::format("tg{}{}", n, d ? fmt::format(" @ d{}", d) : ""), 0, n, d, {}};
      double wall = 0;
      std::vector<runtime::StageStats> acc;
      for (int r = 0; r <= reps; ++r) {
        int32_t next = at_depth(1);
        const auto b0 = model->stage_stats();
        const auto t0 = clock::now();
        if (model->draft_tokens() > 0) {  // speculative: each step verifies the MTP head's drafts
          for (long long i = 0; i < n;) {
            const auto toks = model->run_draft(next, n - i - 1);
            i += (long long)toks.size();
            next = toks.back();
          }
        } else {
          for (long long i = 0; i < n; ++i) next = model->run({next}, true);
        }
        const double s = std::chrono::duration<double>(clock::now() - t0).count();
        if (r > 0) {
          t.tps.push_back((double)n / s), wall += s;
          add_delta(b0, acc);
        }
      }
      add_stage_rows(t.name, acc, wall, n * reps);
      tests.push_back(t);
      if (!profiled_tg && model->draft_tokens() == 0) {
        profiled_tg = true;
        int32_t next = at_depth(1);
        profile_pass(t.name, n, [&] {
          for (long long i = 0; i < n; ++i) next = model->run({next}, true);
        });
      }
    }
  }

  // Several sequences at once.
  for (long long B : seqs) {
    if (B <= 1) continue;
    for (long long d : depths) {
      const std::string at = d ? fmt::format(" @ d{}", d) : "";
      // Every slot filled to depth d (d >= 1 for a tg test: its first token); the greedy next token of each.
      auto fill = [&](int64_t fill_min) {
        std::vector<int32_t> next((size_t)B, -1);
        for (int b = 0; b < (int)B; ++b) model->reset_slot(b);
        std::vector<std::vector<int32_t>> toks((size_t)B);
        for (auto& t : toks) t = random_tokens(std::max<int64_t>(d, fill_min));
        pack_prefill(*model, toks, next);
        return next;
      };
      for (long long p : pps) {
        if (p <= 0) continue;
        Test t{fmt::format("pp{} x{}{}", p, B, at), p, 0, d, {}};
        for (int r = 0; r <= reps; ++r) {
          fill(0);
          std::vector<std::vector<int32_t>> toks((size_t)B);
          for (auto& x : toks) x = random_tokens(p);
          std::vector<int32_t> next((size_t)B, -1);
          const auto t0 = clock::now();
          pack_prefill(*model, toks, next);
          const double sec = std::chrono::duration<double>(clock::now() - t0).count();
          if (r > 0) t.tps.push_back((double)(p * B) / sec);
        }
        tests.push_back(t);
      }
      for (long long n : tgs) {
        if (n <= 0) continue;
        Test t{fmt::format("tg{} x{}{}", n, B, at), 0, n, d, {}};
        for (int r = 0; r <= reps; ++r) {
          std::vector<int32_t> next = fill(1);
          const auto t0 = clock::now();
          for (long long i = 0; i < n; ++i) {
            std::vector<runtime::StepInput> in;
            for (int b = 0; b < (int)B; ++b) in.push_back(runtime::StepInput{b, {next[(size_t)b]}, true});
            next = model->run_many(in);
          }
          const double sec = std::chrono::duration<double>(clock::now() - t0).count();
          if (r > 0) t.tps.push_back((double)(n * B) / sec);
        }
        tests.push_back(t);
        if (want_profile && d == depths.front() && n == tgs.front()) {
          std::vector<int32_t> next = fill(1);
          profile_pass(t.name, n, [&] {
            for (long long i = 0; i < n; ++i) {
              std::vector<runtime::StepInput> in;
              for (int b = 0; b < (int)B; ++b) in.push_back(runtime::StepInput{b, {next[(size_t)b]}, true});
              next = model->run_many(in);
            }
          }, fmt::format("step of {} sequences", B));
        }
      }
    }
  }

  int64_t bytes = 0, params = 0;
  {
    gguf::File f = gguf::File::open(plan.model_path);
    for (const auto& t : f.tensors()) {
      bytes += (int64_t)t.n_bytes;
      params += (int64_t)t.n_elements;
    }
  }
  const std::string model_name = plan.model_name.empty() ? plan.arch : plan.model_name;
  fmt::print("| model | size | params | backend | test | t/s |\n| --- | ---: | ---: | --- | ---: | ---: |\n");
  for (const auto& t : tests)
    fmt::print("| {} | {:.2f} GiB | {:.2f} B | {} | {} | {:.2f} ± {:.2f} |\n", model_name, (double)bytes / (1 << 30),
               (double)params / 1e9, model->backend(), t.name, mean(t.tps), stddev(t.tps));
  if (const std::string note = model->note(); !note.empty()) fmt::print("\n{}\n", note);
  if (model->draft_tokens() > 0)
    fmt::print("\ndraft: {} tokens per step (MTP head): acceptance {:.3f} ({}/{} drafted), {:.2f} tokens per step in "
               "the tg tests (warm-up runs included)\n", model->draft_tokens(),
               model->drafted > 0 ? (double)model->accepted / (double)model->drafted : 0.0, model->accepted,
               model->drafted, model->draft_steps > 0 ? (double)model->draft_generated / (double)model->draft_steps : 0.0);
  if (!stage_rows.empty()) {
    fmt::print("\n| test | stage | busy share | bridge ms/token |\n| --- | --- | ---: | ---: |\n");
    for (const auto& r : stage_rows)
      fmt::print("| {} | {} | {:.2f} | {:.4f} |\n", r.test, r.device, r.busy_share, r.bridge_ms_per_token);
    if (bo.simulate_link_gbps > 0)
      fmt::print("\n(bridges held to a simulated {:g} GB/s host link each way)\n", bo.simulate_link_gbps);
  }
  for (const Profiled& pr : profiles) {
    double total = 0;
    int64_t calls = 0;
    for (const auto& r : pr.rows) total += r.ms, calls += r.calls;
    const std::string u = pr.unit == "token" ? "token" : "step";
    fmt::print("\nprofile of {} (one more pass, kernel by kernel, CUDA events around each op): {} ops, {:.1f} us of "
               "GPU time per {} in them, {:.1f} us wall per {} (eager: launch gaps included)\n\n| op: kernels | "
               "calls/{} | us/{} | share |\n| --- | ---: | ---: | ---: |\n", pr.test, calls,
               total * 1e3 / (double)pr.tokens, pr.unit, pr.wall_s * 1e6 / (double)pr.tokens, pr.unit, u, u);
    std::vector<BenchModel::ProfileRow> rows = pr.rows;
    std::stable_sort(rows.begin(), rows.end(), [](const auto& x, const auto& y) { return x.ms > y.ms; });
    for (const auto& r : rows)
      fmt::print("| {} | {:.2f} | {:.2f} | {:.1f}% |\n", r.op, (double)r.calls / (double)pr.tokens,
                 r.ms * 1e3 / (double)pr.tokens, total > 0 ? 100.0 * r.ms / total : 0.0);
  }
  if (a.has("--json")) {
    nlohmann::json j = nlohmann::json::array();
    for (const auto& t : tests)
      j.push_back({{"model", model_name}, {"model_path", plan.model_path}, {"backend", model->backend()},
                   {"arch_target", plan.arch_target}, {"test", t.name}, {"n_prompt", t.n_prompt}, {"n_gen", t.n_gen},
                   {"n_depth", t.depth}, {"avg_ts", mean(t.tps)}, {"stddev_ts", stddev(t.tps)}, {"samples_ts", t.tps},
                   {"max_batch_tokens", plan.max_batch_tokens}});
    std::ofstream out(a.get("--json"));
    out << j.dump(2) << "\n";
    if (!out) throw runtime::RuntimeError("cannot write " + a.get("--json"));
  }
  return 0;
}

}  // namespace qrig::cli
