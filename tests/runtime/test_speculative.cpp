// Speculative decoding with the MTP head of tiny-mtp.gguf on the CPU backend (runtime/speculative.h,
// docs/speculative.md): the rollback inside a verify step is exact (logits bit for bit with a plain run, at every
// position), greedy generation with drafting (k = 1, 2, 4) is token for token the drafting-off output over several
// prompt lengths, sequences at once and prefix reuse, and a drafter forced to propose the target's own tokens (but
// one wrong at a chosen position) shows the tokens-per-step accounting and a rollback at every rejection position.
#include <catch2/catch.hpp>

#include <functional>
#include <future>
#include <map>

#include "engine_test_util.h"
#include "runtime/speculative.h"

namespace qrig::test {

namespace {

const std::string kTinyMtp = qrig::fixtures::shared_dir() + "/fixtures/tiny-mtp.gguf";

ir::Plan mtp_plan(int64_t draft, int64_t slots = 4, int64_t ctx = 512, int64_t batch = 512, int64_t logit_rows = 0) {
  gguf::File f = gguf::File::open(kTinyMtp);
  compiler::CompileOptions co;
  co.context_length = ctx;
  co.max_sequences = slots;
  co.max_batch_tokens = batch;
  co.draft_tokens = draft;
  co.max_logit_rows = logit_rows;
  ir::Plan p = compiler::compile(f, compiler::Rig::parse("[[device]]\nkind=\"cpu\"\nmemory_gib=2.0\n", "t"), co);
  REQUIRE(p.draft_tokens == draft);
  return p;
}

std::vector<Result> run_all(runtime::Engine& e, const std::vector<runtime::Request>& reqs) {
  std::vector<std::future<Result>> fs;
  for (const auto& r : reqs) fs.push_back(submit(e, r));
  std::vector<Result> out;
  for (auto& f : fs) out.push_back(f.get());
  return out;
}

// Proposes the target's own greedy continuation (from a drafting-off run) with the token at draft index
// `wrong_at` replaced (none when wrong_at >= k); the MTP head still runs (its state follows the sequence).
class OracleDrafter final : public ForwardingBackend {
 public:
  OracleDrafter(const ir::Plan& plan, std::vector<int32_t> prompt, std::vector<int32_t> continuation, int wrong_at)
      : ForwardingBackend(plan), prompt_(std::move(prompt)), cont_(std::move(continuation)), wrong_at_(wrong_at) {}
  std::vector<int32_t> draft(int slot, int32_t next, int k, const DraftPick& pick) override {
    if (!active) return ForwardingBackend::draft(slot, next, k, pick);  // the head's own drafts
    const int64_t m = position(slot) - (int64_t)prompt_.size();  // next is continuation[m]
    REQUIRE(m >= 0);
    REQUIRE(m < (int64_t)cont_.size());
    CHECK(next == cont_[(size_t)m]);
    int j = 0;
    auto oracle = [&](const float* logits) {
      (void)pick(logits);  // the engine's own pick runs too (its bookkeeping), its choice is replaced
      const size_t at = (size_t)(m + 1 + j);
      int32_t t = at < cont_.size() ? cont_[at] : 0;
      if (j == wrong_at_) t = (t + 1) % 1000;
      ++j;
      return t;
    };
    ++drafts;
    return ForwardingBackend::draft(slot, next, k, oracle);
  }
  std::vector<std::vector<float>> step(const std::vector<runtime::StepInput>& batch) override {
    for (const auto& in : batch) max_rows = std::max<int64_t>(max_rows, in.logit_rows);
    return ForwardingBackend::step(batch);
  }
  int64_t drafts = 0, max_rows = 0;
  bool active = true;  // false: the head's own drafts (a request the continuation is not for)

 private:
  std::vector<int32_t> prompt_, cont_;
  int wrong_at_;
};

}  // namespace

TEST_CASE("a verify step rolls back exactly: at every position, the next logits equal a plain run's bit for bit",
          "[runtime][speculative][fixtures]") {
  const ir::Plan plan = mtp_plan(4, 1);
  std::mt19937 rng(7);
  const auto prompt = random_prompt(rng, 37);
  const int64_t k = 4;
  // A plain run: the prompt, then k + 2 tokens one at a time; logits after each.
  runtime::CpuExecutor ex(plan, runtime::open_plan_model(plan));
  const auto cont = random_prompt(rng, (int)k + 2);
  std::vector<std::vector<float>> plain;  // plain[i]: logits after prompt + cont[0..i]
  {
    auto s = ex.new_sequence();
    ex.forward(s, prompt, {});
    for (int32_t t : cont) plain.push_back(ex.forward(s, {t}, {0}));
  }
  for (int64_t accepted = 0; accepted <= k; ++accepted) {
    INFO("kept drafts " << accepted);
    auto backend = runtime::make_backend(plan);
    REQUIRE(backend->draft_tokens() == 4);
    backend->step({{0, prompt, false}});
    runtime::StepInput verify{0, std::vector<int32_t>(cont.begin(), cont.begin() + k + 1), true, (int32_t)k + 1};
    auto rows = backend->step({verify});
    REQUIRE((int64_t)rows[0].size() == (k + 1) * backend->vocab_rows());
    for (int64_t i = 0; i <= k; ++i)  // the verify's rows are the plain run's
      CHECK(bit_equal(std::vector<float>(rows[0].begin() + i * backend->vocab_rows(),
                                         rows[0].begin() + (i + 1) * backend->vocab_rows()),
                      plain[(size_t)i]));
    const int64_t pos = (int64_t)prompt.size() + 1 + accepted;
    backend->rollback(0, pos);
    CHECK(backend->position(0) == pos);
    // Continue with the token the plain run had next: the same logits, bit for bit.
    auto next = backend->step({{0, {cont[(size_t)accepted + 1]}, true}});
    CHECK(bit_equal(next[0], plain[(size_t)accepted + 1]));
    CHECK_THROWS_WITH(backend->rollback(0, pos - 1), Catch::Contains("kept"));  // only inside the last step
  }
}

TEST_CASE("greedy generation with drafting (k = 1, 2, 4) is token for token the drafting-off output",
          "[runtime][speculative][fixtures]") {
  std::mt19937 rng(11);
  std::vector<runtime::Request> reqs;
  for (int n : {1, 5, 63, 64, 65, 130}) reqs.push_back(greedy(random_prompt(rng, n), 24));
  reqs.push_back(greedy(random_prompt(rng, 9), 3));  // ends before a full draft fits
  // Then prefix reuse: each prompt again with a few more tokens (its snapshot at the old prompt's end is reused),
  // the first with drafting turned off by the request; and a prompt continuing a generated output (the slot's
  // history: prompt + output). Both engines see the same history, so they cut the prompts the same way.
  std::vector<runtime::Request> again;
  for (const auto& r : reqs) again.push_back(greedy(concat(r.prompt, random_prompt(rng, 3)), 16));
  again[0].draft = false;
  auto phases = [&](runtime::Engine& e, std::vector<Result>& first) {
    std::vector<std::vector<Result>> out;
    out.push_back(first = run_all(e, reqs));  // 7 requests at once on 8 slots
    out.push_back(run_all(e, again));
    out.push_back(run_all(e, {greedy(concat(again[3].prompt, out[1][3].tokens), 12)}));
    return out;
  };
  std::vector<Result> off_first;
  std::vector<std::vector<Result>> want;
  {
    runtime::Engine off(runtime::make_backend(mtp_plan(0, 8)));
    want = phases(off, off_first);
  }
  for (int64_t k : {1, 2, 4}) {
    INFO("k = " << k);
    runtime::Engine on(runtime::make_backend(mtp_plan(k, 8)));
    std::vector<Result> first;
    const auto got = phases(on, first);
    int64_t cached = 0;
    for (size_t ph = 0; ph < got.size(); ++ph)
      for (size_t i = 0; i < got[ph].size(); ++i) {
        INFO("phase " << ph << " request " << i);
        CHECK(got[ph][i].tokens == want[ph][i].tokens);
        CHECK(got[ph][i].done.reason == want[ph][i].done.reason);
        CHECK(got[ph][i].done.cached_tokens == want[ph][i].done.cached_tokens);
        CHECK(got[ph][i].done.decode_steps >= 1);
        cached += got[ph][i].done.cached_tokens;
        if (ph == 1 && i == 0) {
          CHECK(got[ph][i].done.drafted == 0);
          CHECK(got[ph][i].done.decode_steps == (int64_t)got[ph][i].tokens.size());
        } else {
          CHECK(got[ph][i].done.drafted > 0);
        }
      }
    CHECK(cached > 0);
  }
}

TEST_CASE("a drafter proposing the target's own tokens: tokens per step and a rollback at every rejection position",
          "[runtime][speculative][fixtures]") {
  std::mt19937 rng(5);
  const auto prompt = random_prompt(rng, 21);
  const int64_t N = 30;
  Result want;
  {
    runtime::Engine off(runtime::make_backend(mtp_plan(0, 1)));
    want = run_all(off, {greedy(prompt, N)})[0];
  }
  REQUIRE((int64_t)want.tokens.size() == N);
  for (int64_t k : {1, 2, 4}) {
    for (int wrong_at = 0; wrong_at <= (int)k; ++wrong_at) {  // wrong_at == k: every draft is right
      INFO("k = " << k << ", draft " << wrong_at << " wrong");
      auto backend = std::make_unique<OracleDrafter>(mtp_plan(k, 1), prompt, want.tokens, wrong_at);
      OracleDrafter* oracle = backend.get();
      runtime::Engine e(std::move(backend));
      const Result got = run_all(e, {greedy(prompt, N)})[0];
      CHECK(got.tokens == want.tokens);
      // Expected: the prompt's step gives the first token; then each step drafts min(k, tokens left - 1) and keeps
      // the drafts before the wrong one, plus the target's own token.
      int64_t generated = 1, steps = 1, drafted = 0, accepted = 0;
      while (generated < N) {
        const int64_t room = std::min<int64_t>(k, N - generated - 1);
        const int64_t keep = room > 0 ? std::min<int64_t>(wrong_at, room) : 0;
        drafted += room;
        accepted += keep;
        generated += keep + 1;
        ++steps;
      }
      CHECK(got.done.generated_tokens == N);
      CHECK(got.done.decode_steps == steps);
      CHECK(got.done.drafted == drafted);
      CHECK(got.done.accepted == accepted);
      CHECK(oracle->max_rows == k + 1);
      if (wrong_at == k) CHECK(got.done.decode_steps < N / (double)k + 2);  // k + 1 tokens per step
    }
  }
}

namespace {

// Counts the output rows each step asks for (the plan's max_logit_rows bounds them; the backend refuses more).
class RowCounter final : public ForwardingBackend {
 public:
  using ForwardingBackend::ForwardingBackend;
  std::vector<std::vector<float>> step(const std::vector<runtime::StepInput>& batch) override {
    int64_t r = 0;
    for (const auto& in : batch) r += in.want_logits ? in.logit_rows : 0;
    max_rows = std::max(max_rows, r);
    return ForwardingBackend::step(batch);
  }
  int64_t max_rows = 0;
};

}  // namespace

// Every sequence verifying k + 1 positions at once needs k + 1 output rows: the draft pass gives a drafting plan
// slots * (k + 1) of them, and with fewer (an explicit max_logit_rows) the engine drafts only within what the plan has,
// the output unchanged.
TEST_CASE("drafting stays within the plan's output rows per step", "[runtime][speculative][fixtures]") {
  CHECK(mtp_plan(0, 4).max_logit_rows == 4);
  CHECK(mtp_plan(2, 4).max_logit_rows == 12);
  CHECK(mtp_plan(4, 4, 512, 16).max_logit_rows == 16);  // at most the step's tokens
  std::mt19937 rng(23);
  std::vector<runtime::Request> reqs;
  for (int n : {3, 17, 40, 66}) reqs.push_back(greedy(random_prompt(rng, n), 20));
  std::vector<Result> want;
  {
    runtime::Engine off(runtime::make_backend(mtp_plan(0, 4)));
    want = run_all(off, reqs);
  }
  for (int64_t rows : {0, 6}) {  // 0: the draft pass's 20 rows; 6: room for two drafts beyond one row per sequence
    INFO("max_logit_rows option " << rows);
    const ir::Plan plan = mtp_plan(4, 4, 512, 512, rows);
    CHECK(plan.max_logit_rows == (rows > 0 ? rows : 20));
    auto backend = std::make_unique<RowCounter>(plan);
    RowCounter* counter = backend.get();
    runtime::Engine e(std::move(backend));
    const auto got = run_all(e, reqs);
    int64_t drafted = 0;
    for (size_t i = 0; i < reqs.size(); ++i) {
      INFO("request " << i);
      CHECK(got[i].done.error.empty());
      CHECK(got[i].tokens == want[i].tokens);
      drafted += got[i].done.drafted;
    }
    CHECK(drafted > 0);
    CHECK(counter->max_rows <= plan.max_logit_rows);
    if (rows == 0) CHECK(counter->max_rows > 4);  // several sequences verified in one step
  }
  // The backend refuses a step asking for more rows than the plan has (as the CUDA backend's logits buffer does).
  auto be = runtime::make_backend(mtp_plan(4, 4, 512, 512, 6));
  std::vector<runtime::StepInput> batch;
  for (int s = 0; s < 2; ++s) {
    runtime::StepInput in{s, {1, 2, 3, 4}, true};
    in.logit_rows = 4;
    batch.push_back(in);
  }
  CHECK_THROWS_WITH(be->step(batch), Catch::Contains("max_logit_rows 6"));
}

}  // namespace qrig::test

namespace qrig::test {

TEST_CASE("a stop token inside a verify step ends the output where drafting off does, and the state stays reusable",
          "[runtime][speculative][fixtures]") {
  std::mt19937 rng(17);
  const auto prompt = random_prompt(rng, 12);
  Result want;
  {
    runtime::Engine off(runtime::make_backend(mtp_plan(0, 1)));
    want = run_all(off, {greedy(prompt, 20)})[0];
  }
  REQUIRE(want.tokens.size() == 20);
  // Stop at the token at index 6: drafts that are all right carry it inside a verify step (k = 4: steps of 5).
  const int32_t stop = want.tokens[6];
  const auto first = std::find(want.tokens.begin(), want.tokens.end(), stop) - want.tokens.begin();
  auto stopping = greedy(prompt, 20);
  stopping.stop_tokens = {stop};
  std::vector<Result> base, got;
  {
    runtime::Engine off(runtime::make_backend(mtp_plan(0, 1)));
    base = run_all(off, {stopping});
    auto next = greedy(concat(concat(prompt, base[0].tokens), {7, 8}), 6);
    base.push_back(run_all(off, {next})[0]);
  }
  {
    auto backend = std::make_unique<OracleDrafter>(mtp_plan(4, 1), prompt, want.tokens, 4);
    OracleDrafter* oracle = backend.get();
    runtime::Engine on(std::move(backend));
    got = run_all(on, {stopping});
    oracle->active = false;  // engine thread idle between requests
    auto next = greedy(concat(concat(prompt, got[0].tokens), {7, 8}), 6);
    got.push_back(run_all(on, {next})[0]);
  }
  CHECK(got[0].tokens.size() == (size_t)first);
  CHECK(got[0].tokens == base[0].tokens);
  CHECK(got[0].done.reason == runtime::Finish::stop);
  CHECK(got[0].done.accepted > 0);
  // The slot's state held exactly the tokens before the stop: the next prompt reuses them all, as without drafting.
  CHECK(got[1].done.cached_tokens == base[1].done.cached_tokens);
  CHECK(got[1].done.cached_tokens == (int64_t)(prompt.size() + first));
  CHECK(got[1].tokens == base[1].tokens);
}

}  // namespace qrig::test

namespace qrig::test {

// The shared prefix cache restores a prefix into another slot by copying its KV span and then its snapshot; the
// draft head's cache rows stay in the slot they were computed in, so there the head starts over (no drafts until
// the slot resets) while the main model continues exactly; restored into its own slot without a copy, the head
// keeps drafting from where the snapshot was.
TEST_CASE("a snapshot restored into another slot through a KV span resets the draft head; its own slot keeps it",
          "[runtime][speculative][fixtures]") {
  const ir::Plan plan = mtp_plan(2, 2);
  auto b = runtime::make_backend(plan);
  REQUIRE(b->kv_spans());
  std::mt19937 rng(23);
  const auto prompt = random_prompt(rng, 40);
  const int32_t next = 5;
  b->step({{0, prompt, false}});
  b->step({{0, {next}, true}});
  REQUIRE(b->can_draft(0));
  const auto snap = b->save(0);
  const auto span = b->save_kv(0, 0, snap->position);

  b->restore_kv(1, *span, 0, snap->position);
  b->restore(1, *snap);
  CHECK(b->position(1) == snap->position);
  CHECK_FALSE(b->can_draft(1));
  auto a0 = b->step({{0, {9}, true}});
  auto a1 = b->step({{1, {9}, true}});
  CHECK(bit_equal(a0[0], a1[0]));  // the main model's state came across exactly

  b->restore(0, *snap);  // slot 0 back to the snapshot without a copy: the head's rows are still its own
  CHECK(b->position(0) == snap->position);
  CHECK(b->can_draft(0));
  CHECK(bit_equal(b->step({{0, {9}, true}})[0], a0[0]));
}

}  // namespace qrig::test
