// Server tests' fixtures: a scripted Backend (greedy decoding reproduces a chosen output token by token, so
// reasoning, content and tool calls can be driven exactly), and an in-process HttpServer on a free port
// serving it with the real tokenizer of ../shared/fixtures/tiny.gguf.
#pragma once

#include <atomic>
#include <chrono>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <vector>

#include <httplib.h>
#include <nlohmann/json.hpp>

#include "gguf/gguf.h"
#include "runtime/backend.h"
#include "runtime/engine.h"
#include "server/http_server.h"
#include "text/tokenizer.h"
#include "tests/fixtures.h"

namespace qrig::test {

inline std::shared_ptr<const text::Tokenizer> tiny_tokenizer() {
  static std::shared_ptr<const text::Tokenizer> tok = [] {
    gguf::File f = gguf::File::open(qrig::fixtures::shared_dir() + "/fixtures/tiny.gguf");
    return std::make_shared<const text::Tokenizer>(text::Tokenizer::from_gguf(f));
  }();
  return tok;
}

// Greedy decoding of this backend's logits yields `script` (then <|im_end|>). Where the output starts is
// found from the tokens a slot has seen: right after the last occurrence of `anchor` (the end of the
// generation prompt). Steps can be slowed down to test cancellation.
class ScriptedBackend final : public runtime::Backend {
 public:
  ScriptedBackend(const text::Tokenizer& tok, std::vector<int32_t> script, std::vector<int32_t> anchor, int slots,
                  int64_t ctx = 4096)
      : script_(std::move(script)), anchor_(std::move(anchor)), eos_(*tok.find_token("<|im_end|>")) {
    plan_.backend = "scripted";
    plan_.vocab_real = tok.n_real();
    plan_.context_length = ctx;
    plan_.max_sequences = slots;
    plan_.max_batch_tokens = 64;
    rows_ = tok.n_vocab();
    history_.resize((size_t)slots);
  }
  const ir::Plan& plan() const override { return plan_; }
  int slots() const override { return (int)history_.size(); }
  int64_t vocab_rows() const override { return rows_; }
  int64_t context_length() const override { return plan_.context_length; }
  int64_t position(int slot) const override {
    std::lock_guard<std::mutex> lk(mu_);
    return (int64_t)history_[(size_t)slot].size();
  }
  void reset(int slot) override {
    std::lock_guard<std::mutex> lk(mu_);
    history_[(size_t)slot].clear();
  }
  std::vector<std::vector<float>> step(const std::vector<runtime::StepInput>& batch) override {
    if (step_delay_ms > 0) std::this_thread::sleep_for(std::chrono::milliseconds(step_delay_ms.load()));
    steps += 1;
    for (const auto& in : batch) tokens_fed += (int64_t)in.tokens.size();
    std::lock_guard<std::mutex> lk(mu_);
    std::vector<std::vector<float>> out(batch.size());
    for (size_t k = 0; k < batch.size(); ++k) {
      auto& h = history_[(size_t)batch[k].slot];
      h.insert(h.end(), batch[k].tokens.begin(), batch[k].tokens.end());
      if (!batch[k].want_logits) continue;
      out[k].assign((size_t)rows_, -10.0f);
      out[k][(size_t)next_token(h)] = 10.0f;
    }
    return out;
  }
  struct Snap : runtime::Snapshot {
    std::vector<int32_t> tokens;
  };
  std::shared_ptr<runtime::Snapshot> save(int slot) const override {
    std::lock_guard<std::mutex> lk(mu_);
    auto s = std::make_shared<Snap>();
    s->tokens = history_[(size_t)slot];
    s->position = (int64_t)s->tokens.size();
    return s;
  }
  void restore(int slot, const runtime::Snapshot& snap) override {
    std::lock_guard<std::mutex> lk(mu_);
    history_[(size_t)slot] = dynamic_cast<const Snap&>(snap).tokens;
  }
  int64_t snapshot_bytes() const override { return 0; }

  std::atomic<int> step_delay_ms{0};
  std::atomic<int64_t> steps{0};
  std::atomic<int64_t> tokens_fed{0};  // prompt and generated tokens stepped through, over all slots

 private:
  int32_t next_token(const std::vector<int32_t>& h) const {
    size_t start = 0;
    if (!anchor_.empty() && h.size() >= anchor_.size())
      for (size_t i = h.size() - anchor_.size() + 1; i-- > 0;)
        if (std::equal(anchor_.begin(), anchor_.end(), h.begin() + (long)i)) {
          start = i + anchor_.size();
          break;
        }
    size_t k = h.size() - start;
    return k < script_.size() ? script_[k] : eos_;
  }

  ir::Plan plan_;
  int64_t rows_ = 0;
  std::vector<int32_t> script_, anchor_;
  int32_t eos_;
  mutable std::mutex mu_;
  std::vector<std::vector<int32_t>> history_;
};

// An HttpServer on 127.0.0.1:<free port> serving a backend, on its own thread.
class TestServer {
 public:
  TestServer(std::unique_ptr<runtime::Backend> backend, server::ServerOptions opt = {}, int64_t max_queue = 64) {
    opt.host = "127.0.0.1";
    opt.port = 0;
    opt.log_requests = false;
    http_ = std::make_unique<server::HttpServer>(opt);
    port_ = http_->bind();
    auto m = std::make_shared<server::ServedModel>();
    m->tokenizer = tiny_tokenizer();
    m->engine = std::make_shared<runtime::Engine>(std::move(backend), max_queue);
    m->id = "scripted";
    m->created = 1;
    m->init();
    engine_ = m->engine;
    http_->set_model(m);
    thread_ = std::thread([this] { http_->run(); });
  }
  ~TestServer() {
    http_->stop();
    if (thread_.joinable()) thread_.join();
  }
  int port() const { return port_; }
  server::HttpServer& http() { return *http_; }
  runtime::Engine& engine() { return *engine_; }
  httplib::Client client() const {
    httplib::Client c("127.0.0.1", port_);
    c.set_read_timeout(30, 0);
    return c;
  }
  void join() {
    if (thread_.joinable()) thread_.join();
  }

 private:
  std::unique_ptr<server::HttpServer> http_;
  std::shared_ptr<runtime::Engine> engine_;
  std::thread thread_;
  int port_ = 0;
};

// The "data: ..." payloads of an SSE body, in order.
inline std::vector<std::string> sse_payloads(const std::string& body) {
  std::vector<std::string> out;
  size_t pos = 0;
  while ((pos = body.find("data: ", pos)) != std::string::npos) {
    size_t end = body.find("\n\n", pos);
    out.push_back(body.substr(pos + 6, end - pos - 6));
    pos = end == std::string::npos ? body.size() : end + 2;
  }
  return out;
}

}  // namespace qrig::test
