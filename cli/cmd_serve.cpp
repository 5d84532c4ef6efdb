// `qrig serve [MODEL.gguf|PLAN_DIR]`: the OpenAI-compatible server. Listens first (GET /health is 503 while
// the model loads), compiles a .gguf for this machine or reads a plan, builds the engine and serves it.
// Every flag has an environment variable (flag > environment > default; see kOptions and docs/server.md).
// SIGINT/SIGTERM/SIGHUP drain: new requests get 503, requests in flight finish (up to --shutdown-timeout
// seconds, 8 by default so that it fits Docker's 10 s stop grace; then they are cancelled; a second signal
// cancels at once), and the process exits 0. A start that fails (no such model, unreadable file) exits 1.
#include <pthread.h>
#include <signal.h>
#include <sys/resource.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <map>
#include <thread>

#include <fmt/format.h>

#include "cli/args.h"
#include "cli/commands.h"
#include "cli/load_report.h"
#include "cli/model_source.h"
#include "gguf/gguf.h"
#include "runtime/backend.h"
#include "runtime/engine.h"
#include "server/http_server.h"
#include "server/metrics.h"
#include "text/tokenizer.h"

namespace qrig::cli {

namespace {

struct Option {
  const char* flag;
  const char* env;
  const char* dflt;
  const char* help;
};

const Option kOptions[] = {
    {"--host", "QRIG_HOST", "127.0.0.1", "address to listen on"},
    {"--port", "QRIG_PORT", "8080", "port to listen on (0: any free port, printed at start)"},
    {"--parallel", "QRIG_PARALLEL", "4", "sequence slots: requests generated concurrently (.gguf only)"},
    {"--ctx", "QRIG_CTX", "0", "context tokens per slot (0: the most that fits; .gguf only)"},
    {"--api-key", "QRIG_API_KEY", "", "require 'Authorization: Bearer KEY' or 'x-api-key: KEY' (GET /health stays public); several: a comma list"},
    {"--api-key-file", "QRIG_API_KEY_FILE", "", "more accepted API keys, one per line ('#' starts a comment line)"},
    {"--alias", "QRIG_ALIAS", "", "model name in the API (default: the model file's name)"},
    {"--max-queue", "QRIG_MAX_QUEUE", "64", "requests waiting for a slot before 429"},
    {"--timeout", "QRIG_TIMEOUT", "600", "seconds a response write may stall (client not reading); a whole body"},
    {"--head-timeout", "QRIG_HEAD_TIMEOUT", "10", "seconds a client gets to send a request head (408 after); longest pause in a body"},
    {"--max-body", "QRIG_MAX_BODY", "16777216", "largest request body in bytes, chunked too (413 above)"},
    {"--max-connections", "QRIG_MAX_CONNECTIONS", "1024", "open connections at most (the oldest idle one is closed for a new one)"},
    {"--threads-http", "QRIG_THREADS_HTTP", "0", "request threads, started on demand (0: parallel + max-queue + 8, in [16, 1024])"},
    {"--shutdown-timeout", "QRIG_SHUTDOWN_TIMEOUT", "8", "seconds requests in flight get to finish on SIGTERM (Docker kills at 10)"},
    {"--rig", "QRIG_RIG", "", "rig description for compiling a .gguf (default: this machine's CPU)"},
    {"--backend", "QRIG_BACKEND", "", "force a backend when compiling a .gguf: cpu | cuda"},
    {"--kv", "QRIG_KV", "", "key/value cache formats when compiling a .gguf: k16v16, k8v8, k8v3, k3v3, ... (default: the most precise pair that fits)"},
    {"--gpu-memory-utilization", "QRIG_GPU_MEMORY_UTILIZATION", "0.92",
     "fraction of each GPU's memory a compiled plan may use (.gguf only; the runtime needs ~0.6 GiB beyond the plan)"},
    {"--draft", "QRIG_DRAFT", "-1",
     "draft tokens per step of speculative decoding with the model's MTP head, 0 off (-1: the compiler's cost model; "
     ".gguf only; a request sets \"draft\": false to decode without)"},
    {"--prefix-cache-mib", "QRIG_PREFIX_CACHE_MIB", "-1",
     "MiB for the prefix cache shared by all slots (cached KV + snapshots; 0: none; -1: 16 snapshots per slot; .gguf on the CPU only)"},
    {"--model", "(flag only)", "", "the model; with a plan directory: its model file at a new place"},
    {"--metrics-compat", "QRIG_METRICS_COMPAT", "", "also name metrics as llama-server and/or vLLM do: llamacpp,vllm"},
};

// llama-server's spellings of the same flags (-ngl is handled on its own: qrig has no per-layer offload).
const std::map<std::string, std::string> kLlamaServerAliases = {
    {"-m", "--model"}, {"-c", "--ctx"}, {"--ctx-size", "--ctx"}, {"-np", "--parallel"}, {"-a", "--alias"},
    {"-ngl", "--n-gpu-layers"}, {"--gpu-layers", "--n-gpu-layers"}};

const char* kUsage = "usage: qrig serve [MODEL.gguf|DIR|PLAN_DIR] [options]   (no model: a built-in tiny random model)";

}  // namespace

std::string serve_usage() {
  std::string s = std::string(kUsage) + "\n";
  for (const Option& o : kOptions)
    s += fmt::format("  {:<26} {:<28} {}{}\n", o.flag, o.env, o.help,
                     *o.dflt ? fmt::format(" [{}]", o.dflt) : std::string());
  s += fmt::format("  {:<26} {:<28} {}\n", "--metrics-public", "QRIG_METRICS_PUBLIC=1",
                   "GET /metrics without the API key (like /health)");
  s += fmt::format("  {:<26} {:<28} {}\n", "--no-request-log", "QRIG_REQUEST_LOG=0", "no per-request log lines");
  s += fmt::format("  {:<26} {:<28} {}\n", "--ignore-unsupported-fields", "QRIG_IGNORE_UNSUPPORTED_FIELDS=1",
                   "request fields that would change the output but are not implemented: ignored (named in the "
                   "X-Qrig-Ignored-Fields header) instead of a 400");
  s += fmt::format("  {:<26} {:<28} {}\n", "--no-cuda-graphs", "(flag only)",
                   "CUDA plans: decode kernel by kernel instead of the plan's CUDA graphs");
  s += fmt::format("  {:<26} {:<28} {}\n", "--ptx", "(flag only)",
                   "compiling a .gguf for the rig: load its kernels as PTX through the driver's JIT (docs/gpu.md)");
  s += fmt::format("  {:<26} {:<28} {}\n", "MODEL", "QRIG_MODEL",
                   "the .gguf (first shard of a split one), a directory holding it, or a plan directory");
  s += "llama-server's spellings work too: -m (--model), -c and --ctx-size (--ctx), -np (--parallel), -a (--alias);\n"
       "-ngl 0 is --backend cpu (qrig has no per-layer offload: the plan places every layer).\n";
  return s;
}

namespace {

class Settings {
 public:
  explicit Settings(const Args& a) : a_(a) {}
  bool given(const Option& o) const { return a_.has(o.flag) || std::getenv(o.env); }
  std::string str(const char* flag) const {
    const Option& o = find(flag);
    if (a_.has(o.flag)) return a_.get(o.flag);
    if (const char* e = std::getenv(o.env)) return e;
    return o.dflt;
  }
  double number(const char* flag, double lo, double hi) const {
    const Option& o = find(flag);
    std::string v = str(flag);
    char* end = nullptr;
    double x = std::strtod(v.c_str(), &end);
    const char* from = a_.has(o.flag) ? o.flag : o.env;
    if (v.empty() || *end) throw UsageError(fmt::format("{} wants a number, got '{}'", from, v));
    if (!(x >= lo && x <= hi)) throw UsageError(fmt::format("{} must be in [{}, {}], got {}", from, lo, hi, v));
    return x;
  }
  long long integer(const char* flag, long long lo, long long hi) const {
    const Option& o = find(flag);
    std::string v = str(flag);
    char* end = nullptr;
    long long x = std::strtoll(v.c_str(), &end, 10);
    const char* from = a_.has(o.flag) ? o.flag : o.env;
    if (v.empty() || *end) throw UsageError(fmt::format("{} wants an integer, got '{}'", from, v));
    if (x < lo || x > hi) throw UsageError(fmt::format("{} must be in [{}, {}], got {}", from, lo, hi, x));
    return x;
  }
  const Option& find(const char* flag) const {
    for (const Option& o : kOptions)
      if (std::string(o.flag) == flag) return o;
    throw std::logic_error(std::string("no option ") + flag);
  }

 private:
  const Args& a_;
};

}  // namespace

int cmd_serve(int argc, char** argv) {
  const auto t_start = std::chrono::steady_clock::now();
  std::set<std::string> value_flags = {"--n-gpu-layers"};
  for (const Option& o : kOptions) value_flags.insert(o.flag);
  Args a(argc, argv, 2, value_flags,
         {"--no-request-log", "--no-cuda-graphs", "--ptx", "--ignore-unsupported-fields", "--metrics-public", "--help",
          "-h"},
         kLlamaServerAliases);
  if (a.has("--help") || a.has("-h")) {
    fmt::print("{}", serve_usage());
    return 0;
  }
  if (a.positional().size() > 1) throw UsageError(kUsage);
  Settings set(a);
  const std::string backend = backend_for_ngl(a, set.str("--backend"));

  server::ServerOptions so;
  so.host = set.str("--host");
  so.port = (int)set.integer("--port", 0, 65535);
  so.api_key = set.str("--api-key");
  so.api_key_file = set.str("--api-key-file");
  so.timeout_s = (int)set.integer("--timeout", 1, 86400);
  so.head_timeout_s = (int)set.integer("--head-timeout", 1, 3600);
  so.max_body_bytes = (size_t)set.integer("--max-body", 1024, 1ll << 32);
  so.max_connections = (int)set.integer("--max-connections", 1, 1 << 20);
  so.http_threads = (int)set.integer("--threads-http", 0, server::kMaxHttpThreads);
  so.max_queue = set.integer("--max-queue", 1, 1 << 20);
  so.slots = set.integer("--parallel", 1, 1024);
  const char* log_env = std::getenv("QRIG_REQUEST_LOG");
  so.log_requests = !a.has("--no-request-log") && !(log_env && std::string(log_env) == "0");
  const char* ignore_env = std::getenv("QRIG_IGNORE_UNSUPPORTED_FIELDS");
  so.ignore_unsupported_fields = a.has("--ignore-unsupported-fields") || (ignore_env && std::string(ignore_env) == "1");
  const char* public_env = std::getenv("QRIG_METRICS_PUBLIC");
  so.metrics_public = a.has("--metrics-public") || (public_env && std::string(public_env) == "1");
  so.metrics_compat = set.str("--metrics-compat");
  for (const std::string& c : server::metrics_compat_names(so.metrics_compat))
    if (c != "llamacpp" && c != "vllm")
      throw UsageError(fmt::format("--metrics-compat takes llamacpp, vllm or both (comma-separated), not '{}'", c));
  const long long grace_s = set.integer("--shutdown-timeout", 0, 86400);
  // Checked before anything starts: a bad value is a usage error, not a failed load.
  const long long ctx_tokens = set.integer("--ctx", 0, 1ll << 40);
  const double gpu_fraction = set.number("--gpu-memory-utilization", 0.01, 1.0);
  const long long draft_tokens = set.integer("--draft", -1, 4);
  const long long prefix_mib = set.integer("--prefix-cache-mib", -1, 1ll << 30);

  // The model: the positional (or QRIG_MODEL), or --model; with a plan directory --model is its model file.
  std::string model_path = !a.positional().empty() ? a.positional()[0] : std::getenv("QRIG_MODEL") ? std::getenv("QRIG_MODEL") : "";
  std::string model_override = a.get("--model");
  if (model_path.empty()) std::swap(model_path, model_override);
  const bool builtin = model_path.empty();
  // A missing model is a failed start (exit 1, as for an unreadable one), not a usage error.
  const ModelSource source = builtin ? ModelSource{} : resolve_model(model_path);
  const bool plan_dir = source.plan;
  if (!model_override.empty() && !plan_dir)
    throw UsageError(fmt::format("give the model once: {} and --model {}", model_path, model_override));
  if (plan_dir)
    for (const char* f : {"--parallel", "--ctx", "--rig", "--backend", "--gpu-memory-utilization", "--kv", "--draft",
                          "--prefix-cache-mib"})
      if (set.given(set.find(f)) || (std::string(f) == "--backend" && !backend.empty()))
        throw UsageError(fmt::format("{} applies when compiling a .gguf; the plan {} fixes it (recompile with qrig compile)",
                                     f, model_path));

  // Signals are handled by one thread (sigwait), so every other thread must block them: block them now,
  // before any thread exists. SIGPIPE is ignored: a client closing its socket is an error to handle, not a kill.
  // SIGHUP (the terminal or an ssh session closing) drains like SIGTERM instead of killing the process.
  // SIGUSR1 is internal: it tells the signal thread that the server has stopped.
  sigset_t sigs;
  sigemptyset(&sigs);
  sigaddset(&sigs, SIGINT);
  sigaddset(&sigs, SIGTERM);
  sigaddset(&sigs, SIGHUP);
  sigaddset(&sigs, SIGUSR1);
  pthread_sigmask(SIG_BLOCK, &sigs, nullptr);
  signal(SIGPIPE, SIG_IGN);
  // Every open connection is a file descriptor: let --max-connections have them (soft limit up to the hard one).
  if (rlimit rl{}; getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur != RLIM_INFINITY) {
    const rlim_t want = (rlim_t)so.max_connections + 256;
    if (rl.rlim_cur < want) {
      rl.rlim_cur = rl.rlim_max == RLIM_INFINITY ? want : std::min<rlim_t>(want, rl.rlim_max);
      setrlimit(RLIMIT_NOFILE, &rl);
    }
  }
  auto signal_name = [](int sig) { return sig == SIGINT ? "SIGINT" : sig == SIGHUP ? "SIGHUP" : "SIGTERM"; };

  server::HttpServer http(so);
  const int port = http.bind();
  fmt::print(stderr, "qrig serve: listening on http://{}:{} (loading the model)\n", so.host, port);
  std::thread http_thread([&http] { http.run(); });
  std::atomic<bool> loaded{false};
  std::thread signal_thread([&http, &loaded, sigs, grace_s, signal_name] {
    int sig = 0;
    sigwait(&sigs, &sig);
    if (sig == SIGUSR1) return;  // the server stopped on its own (load failure)
    if (!loaded) {
      fmt::print(stderr, "qrig serve: {} while loading: exiting\n", signal_name(sig));
      std::fflush(stderr);
      std::_Exit(0);
    }
    fmt::print(stderr, "qrig serve: {}: draining (requests in flight get up to {} s; signal again to cancel them)\n",
               signal_name(sig), grace_s);
    http.drain();
    timespec ts{(time_t)grace_s, 0};
    sig = sigtimedwait(&sigs, nullptr, &ts);
    if (sig == SIGUSR1) return;  // everything finished in time
    fmt::print(stderr, "qrig serve: {}: cancelling requests in flight\n", sig > 0 ? "signal" : "shutdown timeout");
    http.cancel_all();
    sigwait(&sigs, &sig);  // until the server has stopped
  });
  // Stops the signal thread once the server has stopped (it may be waiting for a signal or the timeout).
  auto stop_signal_thread = [&signal_thread] {
    pthread_kill(signal_thread.native_handle(), SIGUSR1);
    signal_thread.join();
  };

  try {
    LoadOptions lo;
    lo.rig_path = set.str("--rig");
    lo.backend = backend;
    lo.max_sequences = so.slots;
    lo.ptx_jit = a.has("--ptx");
    lo.context_length = ctx_tokens;
    lo.gpu_memory_utilization = gpu_fraction;
    lo.prefix_cache_mib = prefix_mib;
    lo.model_override = model_override;
    lo.kv = set.str("--kv");
    lo.draft_tokens = draft_tokens;
    if (builtin) {
      model_path = builtin_model_path();
      if (!set.given(set.find("--ctx"))) lo.context_length = 8192;
    }
    ir::Plan plan = load_or_compile_plan(model_path, lo);
    fmt::print(stderr, "qrig serve: {} {}: {} backend, context {} tokens x {} slots{}\n",
               plan_dir ? "plan" : "compiled a plan for", plan_dir ? model_path : plan.model_path, plan.backend,
               plan.context_length, plan.max_sequences,
               plan.draft_tokens > 0 ? fmt::format(", {} draft tokens per step (MTP head)", plan.draft_tokens) : "");
    auto model = std::make_shared<server::ServedModel>();
    {
      gguf::File f = gguf::File::open(plan.model_path);
      model->tokenizer = std::make_shared<text::Tokenizer>(text::Tokenizer::from_gguf(f));
    }
    runtime::BackendOptions bo;
    bo.cuda_graphs = !a.has("--no-cuda-graphs");
    LoadReporter progress("qrig serve");
    bo.progress = progress.callback();
    model->engine = std::make_shared<runtime::Engine>(runtime::make_backend(plan, bo), so.max_queue);
    print_memory_summary(plan, "qrig serve");
    std::string alias = set.str("--alias");
    model->id = !alias.empty() ? alias : plan_dir ? std::filesystem::path(model_path).stem().string()
                                                  : model_display_name(plan.model_path);
    model->path = plan_dir ? model_path : plan.model_path;
    model->created = (int64_t)std::time(nullptr);
    model->init();
    const double ready_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t_start).count();
    fmt::print(stderr, "qrig serve: ready in {:.1f} s: model '{}' ({} backend, context {} tokens x {} slots) at http://{}:{}/v1\n",
               ready_s, model->id, plan.backend, plan.context_length, plan.max_sequences, so.host, port);
    http.set_model(std::move(model));
    loaded = true;
  } catch (const std::exception& e) {
    fmt::print(stderr, "qrig serve: error: cannot load the model: {}\n", e.what());
    http.stop();
    http_thread.join();
    stop_signal_thread();
    return 1;
  }
  http_thread.join();  // returns once draining has finished every connection
  stop_signal_thread();
  fmt::print(stderr, "qrig serve: stopped\n");
  return 0;
}

}  // namespace qrig::cli
