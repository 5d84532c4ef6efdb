// `qrig run MODEL|PLAN -p "..."`: one-shot generation streamed to the terminal, like llama-cli, with the
// prompt/generation speed at the end. Also `qrig tokenize` and `qrig template`, the text layer's commands.
#include <atomic>
#include <condition_variable>
#include <csignal>
#include <cstdio>
#include <iostream>
#include <iterator>
#include <mutex>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include "cli/args.h"
#include "cli/commands.h"
#include "cli/load_report.h"
#include "gguf/gguf.h"
#include "runtime/engine.h"
#include "text/chat.h"
#include "text/stop.h"
#include "text/tokenizer.h"

namespace qrig::cli {

namespace {

std::atomic<bool> g_interrupted{false};
extern "C" void on_sigint(int) { g_interrupted = true; }

std::string read_stdin() {
  return std::string(std::istreambuf_iterator<char>(std::cin), std::istreambuf_iterator<char>());
}

}  // namespace

runtime::SamplingParams sampling_from_args(const Args& a, bool thinking) {
  runtime::SamplingParams s = runtime::SamplingParams::qwen_defaults(thinking);
  s.temperature = (float)a.get_float("--temp", s.temperature);
  s.top_k = (int32_t)a.get_int("--top-k", s.top_k);
  s.top_p = (float)a.get_float("--top-p", s.top_p);
  s.min_p = (float)a.get_float("--min-p", s.min_p);
  s.presence_penalty = (float)a.get_float("--presence-penalty", s.presence_penalty);
  s.frequency_penalty = (float)a.get_float("--frequency-penalty", s.frequency_penalty);
  s.repetition_penalty = (float)a.get_float("--repeat-penalty", s.repetition_penalty);
  if (a.has("--seed")) s.seed = (uint64_t)a.get_int("--seed", 0);
  return s;
}

const std::set<std::string> kSamplingFlags = {"--temp", "--top-k", "--top-p", "--min-p", "--presence-penalty",
                                              "--frequency-penalty", "--repeat-penalty", "--seed"};

int cmd_run(int argc, char** argv) {
  std::set<std::string> flags = kSamplingFlags;
  flags.insert({"-p", "--prompt", "-n", "--n-predict", "--system", "--rig", "--ctx", "--backend", "--stop", "-f",
                "--model", "--gpu-memory-utilization", "--n-gpu-layers", "--kv", "--draft"});
  // llama-cli's spellings of the same flags.
  Args a(argc, argv, 2, flags, {"--chat", "--no-think", "--quiet", "--parse-special", "--no-cuda-graphs", "--ptx"},
         {{"-m", "--model"}, {"-c", "--ctx"}, {"--ctx-size", "--ctx"}, {"-ngl", "--n-gpu-layers"}});
  if (a.positional().size() > 1)
    throw UsageError("usage: qrig run [MODEL.gguf|DIR|PLAN_DIR] -p PROMPT [--chat] [--no-think] [--parse-special] [-n N] [sampling flags]");
  std::string prompt = a.get("-p", a.get("--prompt"));
  if (a.has("-f")) {
    std::FILE* f = std::fopen(a.get("-f").c_str(), "rb");
    if (!f) throw UsageError("cannot read " + a.get("-f"));
    std::string s;
    char buf[65536];
    size_t n;
    while ((n = std::fread(buf, 1, sizeof buf, f)) > 0) s.append(buf, n);
    std::fclose(f);
    prompt = s;
  }
  if (!a.has("-p") && !a.has("--prompt") && !a.has("-f")) throw UsageError("qrig run needs -p PROMPT (or -f FILE)");
  const bool chat = a.has("--chat");
  const bool thinking = chat && !a.has("--no-think");
  LoadOptions lo;
  lo.rig_path = a.get("--rig");
  lo.backend = backend_for_ngl(a, a.get("--backend"));
  lo.context_length = a.get_int("--ctx", 0);
  lo.max_sequences = 1;
  lo.ptx_jit = a.has("--ptx");
  lo.gpu_memory_utilization = a.get_float("--gpu-memory-utilization", 0);
  lo.kv = a.get("--kv");
  if (a.has("--draft")) lo.draft_tokens = a.get_int("--draft", -1);
  if (a.has("--draft") && lo.draft_tokens < 0) throw UsageError("--draft must be 0 (off) .. 4");
  std::string model = a.positional().empty() ? a.get("--model") : a.positional()[0];
  if (!a.positional().empty()) lo.model_override = a.get("--model");
  if (model.empty()) model = builtin_model_path();
  ir::Plan plan = load_or_compile_plan(model, lo);
  gguf::File file = gguf::File::open(plan.model_path);
  text::Tokenizer tok = text::Tokenizer::from_gguf(file);

  // --parse-special: special tokens written in the prompt (and --system) become their ids. Without it they
  // are text; with --chat the template's own markup is always tokens, so a prompt cannot forge a turn.
  const bool parse_special = a.has("--parse-special");
  std::string text = prompt;
  runtime::Request req;
  if (chat) {
    nlohmann::ordered_json messages = nlohmann::ordered_json::array();
    if (a.has("--system")) messages.push_back({{"role", "system"}, {"content", a.get("--system")}});
    messages.push_back({{"role", "user"}, {"content", prompt}});
    text::ChatOptions co;
    co.enable_thinking = thinking;
    text::RenderedChat rendered = text::render_chat_with_spans(messages, nullptr, co);
    req.prompt = text::encode_chat(tok, rendered, /*literal=*/!parse_special);
    text = std::move(rendered.text);
  } else {
    req.prompt = tok.encode(text, parse_special);
  }
  req.sampling = sampling_from_args(a, thinking);
  req.max_tokens = a.get_int("-n", a.get_int("--n-predict", -1));
  req.stop_tokens = tok.eog_ids();
  text::StopMatcher stops(a.has("--stop") ? std::vector<std::string>{a.get("--stop")} : std::vector<std::string>{});

  runtime::BackendOptions bo;
  bo.cuda_graphs = !a.has("--no-cuda-graphs");
  LoadReporter progress("qrig");
  if (!a.has("--quiet")) bo.progress = progress.callback();
  runtime::Engine engine(runtime::make_backend(plan, bo));
  if (!a.has("--quiet")) fmt::print(stderr, "qrig: {} ({}), {} prompt tokens\n", plan.model_name, plan.backend, req.prompt.size());
  std::fputs(text.c_str(), stdout);
  std::fflush(stdout);

  std::mutex mu;
  std::condition_variable cv;
  bool done = false;
  runtime::DoneEvent result;
  text::StreamDecoder dec(tok);
  uint64_t id = 0;
  std::atomic<bool> stop_hit{false};
  runtime::Callbacks cb;
  cb.on_token = [&](const runtime::TokenEvent& ev) {
    if (stop_hit) return;
    auto r = stops.feed(dec.push(ev.token));
    std::fputs(r.text.c_str(), stdout);
    std::fflush(stdout);
    if (r.stopped) {
      stop_hit = true;
      engine.cancel(id);
    }
  };
  cb.on_done = [&](const runtime::DoneEvent& d) {
    std::lock_guard<std::mutex> lk(mu);
    result = d;
    done = true;
    cv.notify_all();
  };
  std::signal(SIGINT, on_sigint);
  id = engine.submit(std::move(req), cb);
  {
    std::unique_lock<std::mutex> lk(mu);
    while (!done) {
      cv.wait_for(lk, std::chrono::milliseconds(100));
      if (g_interrupted) engine.cancel(id);
    }
  }
  if (!stop_hit) std::fputs(stops.flush().c_str(), stdout);
  std::fputs("\n", stdout);
  std::fflush(stdout);
  std::signal(SIGINT, SIG_DFL);
  if (result.reason == runtime::Finish::error) throw runtime::EngineError(result.error);
  const char* reason = stop_hit ? "stop string" : runtime::finish_name(result.reason);
  if (!a.has("--quiet"))
    fmt::print(stderr, "\nprompt: {} tokens in {:.1f} ms ({:.1f} t/s) | generation: {} tokens in {:.1f} ms ({:.1f} t/s) | {}\n",
               result.prompt_tokens, result.prompt_ms,
               result.prompt_ms > 0 ? 1000.0 * (double)(result.prompt_tokens - result.cached_tokens) / result.prompt_ms : 0.0,
               result.generated_tokens, result.generation_ms,
               result.generation_ms > 0 ? 1000.0 * (double)(result.generated_tokens - 1) / result.generation_ms : 0.0,
               reason);
  if (!a.has("--quiet") && plan.draft_tokens > 0)
    fmt::print(stderr, "draft: {} tokens per step planned | acceptance {:.3f} ({}/{} drafted) | {:.2f} tokens per step "
               "({} tokens in {} steps)\n", plan.draft_tokens,
               result.drafted > 0 ? (double)result.accepted / (double)result.drafted : 0.0, result.accepted,
               result.drafted, result.decode_steps > 0 ? (double)result.generated_tokens / (double)result.decode_steps : 0.0,
               result.generated_tokens, result.decode_steps);
  return 0;
}

int cmd_tokenize(int argc, char** argv) {
  Args a(argc, argv, 2, {}, {"--parse-special"});
  if (a.positional().size() != 1) throw UsageError("usage: qrig tokenize MODEL.gguf [--parse-special] < text");
  gguf::File file = gguf::File::open(a.positional()[0]);
  text::Tokenizer tok = text::Tokenizer::from_gguf(file);
  auto ids = tok.encode(read_stdin(), a.has("--parse-special"));
  std::string line;
  for (size_t k = 0; k < ids.size(); ++k) line += (k ? " " : "") + std::to_string(ids[k]);
  std::puts(line.c_str());
  return 0;
}

int cmd_template(int argc, char** argv) {
  Args a(argc, argv, 2, {}, {});
  if (a.positional().size() != 1) throw UsageError("usage: qrig template MODEL.gguf < request.json");
  gguf::File file = gguf::File::open(a.positional()[0]);  // the model whose chat format applies
  if (!file.find("tokenizer.chat_template"))
    throw text::ChatError(a.positional()[0] + " has no tokenizer.chat_template");
  nlohmann::ordered_json body;
  try {
    body = nlohmann::ordered_json::parse(read_stdin());
  } catch (const nlohmann::json::parse_error& e) {
    throw UsageError(std::string("the request on stdin is not valid JSON: ") + e.what());
  }
  std::fputs(text::render_chat_request(body).c_str(), stdout);
  return 0;
}

}  // namespace qrig::cli
