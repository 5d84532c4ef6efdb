// Reading and writing the plan directory (plan.toml via toml++, graph.ir via the IR text form). A plan is
// input like a GGUF: every field is checked for its type and range when read, so a hand-edited or corrupt plan
// is an error naming the field, never a crash or an allocation of whatever a number says.
#include "ir/plan.h"

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <regex>
#include <set>
#include <sstream>

#include <fmt/format.h>
#include <toml++/toml.h>

namespace qrig::ir {

namespace {

void write_file(const std::string& path, const std::string& text) {
  std::string tmp = path + ".tmp";
  {
    std::ofstream f(tmp, std::ios::trunc);
    if (!f) throw Error(fmt::format("cannot write '{}'", tmp));
    f << text;
    if (!f) throw Error(fmt::format("write to '{}' failed", tmp));
  }
  if (std::rename(tmp.c_str(), path.c_str()) != 0) throw Error(fmt::format("cannot rename '{}'", tmp));
}

std::string read_file(const std::string& path) {
  std::ifstream f(path);
  if (!f) throw Error(fmt::format("cannot read '{}'", path));
  std::stringstream ss;
  ss << f.rdbuf();
  return ss.str();
}

// Reads fields of one table, each checked; errors name the file, table and key.
struct Fields {
  const toml::table& t;
  std::string where;  // "plan.toml [decisions]"

  const toml::node* node(const char* key, bool required) const {
    const toml::node* n = t.get(key);
    if (!n && required) throw Error(fmt::format("{}: {} is missing", where, key));
    return n;
  }
  int64_t integer(const char* key, int64_t lo, int64_t hi, bool required = true, int64_t dflt = 0) const {
    const toml::node* n = node(key, required);
    if (!n) return dflt;
    auto v = n->value_exact<int64_t>();
    if (!v) throw Error(fmt::format("{}: {} must be an integer", where, key));
    if (*v < lo || *v > hi) throw Error(fmt::format("{}: {} = {} is out of range [{}, {}]", where, key, *v, lo, hi));
    return *v;
  }
  double number(const char* key, double lo, double hi, bool required = true, double dflt = 0) const {
    const toml::node* n = node(key, required);
    if (!n) return dflt;
    auto v = n->value<double>();
    if (!v || !std::isfinite(*v)) throw Error(fmt::format("{}: {} must be a finite number", where, key));
    if (*v < lo || *v > hi) throw Error(fmt::format("{}: {} = {} is out of range [{}, {}]", where, key, *v, lo, hi));
    return *v;
  }
  std::string str(const char* key, bool required = true, const std::string& dflt = {}) const {
    const toml::node* n = node(key, required);
    if (!n) return dflt;
    auto v = n->value_exact<std::string>();
    if (!v) throw Error(fmt::format("{}: {} must be a string", where, key));
    return *v;
  }
  std::string one_of(const char* key, const std::set<std::string>& allowed, bool required = true,
                     const std::string& dflt = {}) const {
    std::string v = str(key, required, dflt);
    if (!allowed.count(v)) {
      std::string list;
      for (const auto& a : allowed) list += (list.empty() ? "" : ", ") + ("'" + a + "'");
      throw Error(fmt::format("{}: {} = '{}' is not one of {}", where, key, v, list));
    }
    return v;
  }
  bool boolean(const char* key, bool required = true, bool dflt = false) const {
    const toml::node* n = node(key, required);
    if (!n) return dflt;
    auto v = n->value_exact<bool>();
    if (!v) throw Error(fmt::format("{}: {} must be true or false", where, key));
    return *v;
  }
};

const toml::table& table(const toml::table& root, const char* name, const std::string& file) {
  const toml::table* t = root[name].as_table();
  if (!t) throw Error(fmt::format("{}: [{}] is missing or not a table", file, name));
  return *t;
}

constexpr int64_t kMaxBytes = int64_t{1} << 50;  // 1 PiB: any byte count above this is nonsense
const std::set<std::string> kBackends = {"cpu", "cuda"};
const std::set<std::string> kFamilies = {"reference", "dp4a", "dp4a-emulated"};
const std::set<std::string> kKvTypes = {"f32", "f16", "q8", "t4", "t3"};  // kernels/kv_format.h

bool valid_device(const std::string& d) {
  static const std::regex re("cpu|cpu:[0-9]{1,2}|cuda:[0-9]{1,3}");
  return std::regex_match(d, re);
}

}  // namespace

int64_t pipeline_min_micro_batch(const Plan& p) {
  auto up64 = [](int64_t x) { return (x + 63) / 64 * 64; };
  // (two planes in every matmul: no row count changes the numerics)
  const int64_t precise = p.precise_rows >= p.max_batch_tokens ? 0 : p.precise_rows;
  const int64_t shortest = std::max<int64_t>(p.gdn_recurrent_below, precise + 1);
  return std::max<int64_t>(128, up64(shortest + up64(shortest)));
}

std::string Plan::to_toml() const {
  toml::table plan{{"format", format}, {"compiler_version", compiler_version}, {"backend", backend},
                   {"arch_target", arch_target}, {"device_sms", device_sms}, {"kernel_family", kernel_family},
                   {"tuning_source", tuning_source}, {"rig", rig_name}};
  if (!kernel_nvrtc.empty()) plan.insert("kernel_nvrtc", kernel_nvrtc);
  if (!kernel_target.empty()) plan.insert("kernel_target", kernel_target);
  if (!kernel_code.empty()) plan.insert("kernel_code", kernel_code);
  toml::table model{{"path", model_path}, {"size", model_size}, {"arch", arch}, {"name", model_name},
                    {"vocab_real", vocab_real}};
  toml::table decisions{{"context_length", context_length}, {"max_sequences", max_sequences},
                        {"max_batch_tokens", max_batch_tokens}, {"max_logit_rows", max_logit_rows},
                        {"pipeline_micro_batch", pipeline_micro_batch},
                        {"pipeline_decode_group_rows", pipeline_decode_group_rows},
                        {"gdn_chunk", gdn_chunk}, {"gdn_recurrent_below", gdn_recurrent_below},
                        {"precise_rows", precise_rows}, {"k_dtype", k_dtype}, {"v_dtype", v_dtype},
                        {"decode_graphs", decode_graphs},
                        {"programmatic_launch", programmatic_launch}, {"threads", threads}, {"draft_tokens", draft_tokens}};
  toml::table mem{{"weight_bytes", memory.weight_bytes}, {"kv_bytes_per_token", memory.kv_bytes_per_token},
                  {"state_bytes_per_sequence", memory.state_bytes_per_sequence},
                  {"activation_bytes", memory.activation_bytes}, {"budget_bytes", memory.budget_bytes},
                  {"snapshot_bytes", memory.snapshot_bytes}, {"snapshots_per_slot", memory.snapshots_per_slot},
                  {"bridge_host_bytes", memory.bridge_host_bytes},
                  {"draft_kv_bytes_per_token", memory.draft_kv_bytes_per_token},
                  {"draft_rollback_bytes", memory.draft_rollback_bytes},
                  {"draft_pending_bytes", memory.draft_pending_bytes},
                  {"draft_weight_bytes", memory.draft_weight_bytes},
                  {"draft_arena_bytes", memory.draft_arena_bytes}};
  toml::array devs;
  for (const DeviceMemory& d : memory.devices)
    devs.push_back(toml::table{{"device", d.device}, {"weights", d.weights}, {"arena", d.arena}, {"io", d.io},
                               {"sampling", d.sampling}, {"states", d.states}, {"snapshots", d.snapshots},
                               {"total", d.total}, {"budget", d.budget}});
  mem.insert("device", devs);
  toml::array fits;
  for (const KvFit& f : memory.kv_fits) {
    toml::array ctx;
    for (int64_t c : f.device_contexts) ctx.push_back(c);
    fits.push_back(toml::table{{"kv", f.kv}, {"bytes_per_token", f.bytes_per_token}, {"context", f.context},
                               {"device_contexts", ctx}});
  }
  if (!fits.empty()) mem.insert("kv_fit", fits);
  toml::array places;
  for (const Placement& p : placement)
    places.push_back(toml::table{{"device", p.device}, {"ordinal", p.ordinal}, {"first_layer", p.first_layer},
                                 {"last_layer", p.last_layer}, {"prefill_us_per_token", p.prefill_us_per_token},
                                 {"decode_us_per_token", p.decode_us_per_token}});
  toml::array kern;
  for (const KernelChoice& k : kernels)
    kern.push_back(toml::table{{"op", k.op}, {"shape", k.shape}, {"ops", k.ops}, {"first_rows", k.first_rows},
                               {"last_rows", k.last_rows}, {"variants", k.variants}, {"reason", k.reason}});
  toml::array note_arr;
  for (const auto& n : notes) note_arr.push_back(n);
  toml::table pc{{"mode", prefix_cache.mode}, {"budget_bytes", prefix_cache.budget_bytes}, {"chunk", prefix_cache.chunk},
                 {"turn_start", prefix_cache.turn_start}, {"header_end", prefix_cache.header_end},
                 {"header_max", prefix_cache.header_max}, {"markers", prefix_cache.markers}};
  toml::table root{{"plan", plan}, {"model", model}, {"decisions", decisions}, {"memory", mem},
                   {"prefix_cache", pc}, {"placement", places}, {"kernel", kern}, {"notes", note_arr}};
  std::ostringstream ss;
  ss << "# qrig plan: every decision for this model on this rig. Graph in graph.ir.\n" << root << "\n";
  return ss.str();
}

void Plan::write(const std::string& dir) const {
  std::filesystem::create_directories(dir);
  write_file(dir + "/graph.ir", print(graph));
  if (draft_tokens > 0) write_file(dir + "/draft.ir", print(draft));
  else std::filesystem::remove(dir + "/draft.ir");
  write_file(dir + "/plan.toml", to_toml());
}

Plan Plan::read(const std::string& dir) {
  const std::string file = dir + "/plan.toml";
  if (!std::filesystem::exists(file)) throw Error(fmt::format("'{}' is not a plan directory (no plan.toml)", dir));
  toml::table t;
  try {
    t = toml::parse(read_file(file), file);
  } catch (const toml::parse_error& e) {
    throw Error(fmt::format("{}: {}", file, e.description()));
  }
  Plan p;
  const Fields plan{table(t, "plan", file), file + " [plan]"};
  p.format = plan.integer("format", 0, INT64_MAX);
  if (p.format != kFormat)
    throw Error(fmt::format("{}: plan format {} is not supported by this qrig (wants {}); recompile the plan", file,
                            p.format, kFormat));
  p.compiler_version = plan.str("compiler_version", false);
  p.backend = plan.one_of("backend", kBackends);
  p.kernel_family = plan.one_of("kernel_family", kFamilies);
  p.rig_name = plan.str("rig", false);
  p.tuning_source = plan.str("tuning_source", false);
  p.arch_target = plan.str("arch_target", false);
  p.device_sms = plan.integer("device_sms", 0, 4096, false);
  if (p.backend == "cuda") {
    static const std::regex sm("sm_[0-9]{2,3}");
    if (!std::regex_match(p.arch_target, sm))
      throw Error(fmt::format("{}: arch_target '{}' is not a CUDA architecture like sm_90", file, p.arch_target));
    if (p.device_sms < 1) throw Error(fmt::format("{}: a CUDA plan needs device_sms >= 1", file));
    if (p.kernel_family != "dp4a") throw Error(fmt::format("{}: a CUDA plan runs the dp4a kernel family", file));
    p.kernel_nvrtc = plan.str("kernel_nvrtc", false);
    static const std::regex version("[0-9]{1,2}\\.[0-9]{1,2}");
    if (!p.kernel_nvrtc.empty() && !std::regex_match(p.kernel_nvrtc, version))
      throw Error(fmt::format("{}: kernel_nvrtc '{}' is not an NVRTC version like 12.4", file, p.kernel_nvrtc));
    p.kernel_target = plan.str("kernel_target", false);
    if (!p.kernel_target.empty() && !std::regex_match(p.kernel_target, sm))
      throw Error(fmt::format("{}: kernel_target '{}' is not a CUDA architecture like sm_90", file, p.kernel_target));
    if (p.kernel_nvrtc.empty() != p.kernel_target.empty())
      throw Error(fmt::format("{}: kernel_nvrtc and kernel_target go together", file));
    p.kernel_code = plan.one_of("kernel_code", {"cubin", "ptx"});
  } else if (p.kernel_family == "dp4a") {
    throw Error(fmt::format("{}: the dp4a kernel family runs on cuda (dp4a-emulated on the cpu)", file));
  }
  const Fields model{table(t, "model", file), file + " [model]"};
  p.model_path = model.str("path");
  if (p.model_path.empty()) throw Error(fmt::format("{}: [model] path is empty", file));
  p.model_size = model.integer("size", 1, kMaxBytes);
  p.arch = model.str("arch");
  p.model_name = model.str("name", false);
  p.vocab_real = model.integer("vocab_real", 1, int64_t{1} << 24);
  const Fields dec{table(t, "decisions", file), file + " [decisions]"};
  p.context_length = dec.integer("context_length", 1, int64_t{1} << 24);
  p.max_sequences = dec.integer("max_sequences", 1, 4096);
  p.max_batch_tokens = dec.integer("max_batch_tokens", 1, 65536);
  p.max_logit_rows = dec.integer("max_logit_rows", 1, p.max_batch_tokens);
  p.pipeline_micro_batch = dec.integer("pipeline_micro_batch", 0, p.max_batch_tokens, false, 0);
  p.pipeline_decode_group_rows = dec.integer("pipeline_decode_group_rows", 0, 4096, false, 0);
  p.gdn_chunk = dec.integer("gdn_chunk", 16, 64);
  if (p.gdn_chunk % 16 != 0) throw Error(fmt::format("{}: gdn_chunk must be 16, 32, 48 or 64", file));
  p.gdn_recurrent_below = dec.integer("gdn_recurrent_below", 1, 65536);
  p.precise_rows = dec.integer("precise_rows", 0, p.max_batch_tokens);
  p.k_dtype = dec.one_of("k_dtype", kKvTypes);
  p.v_dtype = dec.one_of("v_dtype", kKvTypes);
  p.decode_graphs = dec.boolean("decode_graphs");
  p.programmatic_launch = dec.boolean("programmatic_launch", false, false);  // absent in plans written before it
  p.threads = dec.integer("threads", 0, 4096);
  p.draft_tokens = dec.integer("draft_tokens", 0, 4, false, 0);

  // [prefix_cache]: absent in plans written before it (no shared cache, no markers).
  if (const toml::table* pct = t["prefix_cache"].as_table()) {
    const Fields pc{*pct, file + " [prefix_cache]"};
    p.prefix_cache.mode = pc.one_of("mode", {"shared", "per-slot", "off"});
    p.prefix_cache.budget_bytes = pc.integer("budget_bytes", 0, kMaxBytes);
    if ((p.prefix_cache.mode == "shared") != (p.prefix_cache.budget_bytes > 0))
      throw Error(fmt::format("{}: prefix_cache mode '{}' with a budget of {} bytes (only 'shared' has one)", file,
                              p.prefix_cache.mode, p.prefix_cache.budget_bytes));
    p.prefix_cache.chunk = pc.integer("chunk", 0, int64_t{1} << 24);
    if (p.prefix_cache.chunk % p.gdn_chunk != 0)
      throw Error(fmt::format("{}: prefix_cache chunk {} is not a multiple of gdn_chunk {}", file, p.prefix_cache.chunk,
                              p.gdn_chunk));
    p.prefix_cache.turn_start = pc.integer("turn_start", -1, INT32_MAX);
    p.prefix_cache.header_end = pc.integer("header_end", -1, INT32_MAX);
    p.prefix_cache.header_max = pc.integer("header_max", 0, 64);
    if (p.prefix_cache.turn_start >= p.vocab_real || p.prefix_cache.header_end >= p.vocab_real)
      throw Error(fmt::format("{}: prefix_cache marker tokens must be below vocab_real {}", file, p.vocab_real));
    if ((p.prefix_cache.turn_start < 0) != (p.prefix_cache.header_end < 0))
      throw Error(fmt::format("{}: prefix_cache turn_start and header_end must both be set or both be -1", file));
    p.prefix_cache.markers = pc.str("markers", false);
  } else if (t.get("prefix_cache")) {
    throw Error(fmt::format("{}: [prefix_cache] must be a table", file));
  }

  const Fields mem{table(t, "memory", file), file + " [memory]"};
  p.memory.weight_bytes = mem.integer("weight_bytes", 0, kMaxBytes);
  p.memory.kv_bytes_per_token = mem.integer("kv_bytes_per_token", 0, kMaxBytes);
  p.memory.state_bytes_per_sequence = mem.integer("state_bytes_per_sequence", 0, kMaxBytes);
  p.memory.activation_bytes = mem.integer("activation_bytes", 0, kMaxBytes);
  p.memory.budget_bytes = mem.integer("budget_bytes", 0, kMaxBytes);
  p.memory.snapshot_bytes = mem.integer("snapshot_bytes", 0, kMaxBytes);
  p.memory.snapshots_per_slot = mem.integer("snapshots_per_slot", 0, 1024);
  p.memory.bridge_host_bytes = mem.integer("bridge_host_bytes", 0, kMaxBytes, false, 0);
  p.memory.draft_kv_bytes_per_token = mem.integer("draft_kv_bytes_per_token", 0, kMaxBytes, false, 0);
  p.memory.draft_rollback_bytes = mem.integer("draft_rollback_bytes", 0, kMaxBytes, false, 0);
  p.memory.draft_pending_bytes = mem.integer("draft_pending_bytes", 0, kMaxBytes, false, 0);
  p.memory.draft_weight_bytes = mem.integer("draft_weight_bytes", 0, kMaxBytes, false, 0);
  p.memory.draft_arena_bytes = mem.integer("draft_arena_bytes", 0, kMaxBytes, false, 0);
  if (const toml::node* n = mem.t.get("device")) {
    const toml::array* arr = n->as_array();
    if (!arr) throw Error(fmt::format("{}: [[memory.device]] must be an array of tables", file));
    for (const auto& e : *arr) {
      const toml::table* dt = e.as_table();
      if (!dt) throw Error(fmt::format("{}: [[memory.device]] entries must be tables", file));
      const Fields d{*dt, file + " [[memory.device]]"};
      DeviceMemory m;
      m.device = d.str("device");
      if (!valid_device(m.device)) throw Error(fmt::format("{}: memory device '{}' is not cpu or cuda:N", file, m.device));
      m.weights = d.integer("weights", 0, kMaxBytes);
      m.arena = d.integer("arena", 0, kMaxBytes);
      m.io = d.integer("io", 0, kMaxBytes);
      m.sampling = d.integer("sampling", 0, kMaxBytes);
      m.states = d.integer("states", 0, kMaxBytes);
      m.snapshots = d.integer("snapshots", 0, kMaxBytes);
      m.total = d.integer("total", 0, kMaxBytes);
      m.budget = d.integer("budget", 0, kMaxBytes);
      if (m.total != m.weights + m.arena + m.io + m.sampling + m.states + m.snapshots)
        throw Error(fmt::format("{}: memory of {}: total {} is not the sum of its parts", file, m.device, m.total));
      p.memory.devices.push_back(m);
    }
  }
  if (const toml::node* n = mem.t.get("kv_fit")) {
    const toml::array* arr = n->as_array();
    if (!arr) throw Error(fmt::format("{}: [[memory.kv_fit]] must be an array of tables", file));
    for (const auto& e : *arr) {
      const toml::table* ft = e.as_table();
      if (!ft) throw Error(fmt::format("{}: [[memory.kv_fit]] entries must be tables", file));
      const Fields f{*ft, file + " [[memory.kv_fit]]"};
      KvFit k;
      k.kv = f.str("kv");
      k.bytes_per_token = f.integer("bytes_per_token", 1, kMaxBytes);
      k.context = f.integer("context", 0, kMaxBytes);
      const toml::array* ctx = ft->get("device_contexts") ? ft->get("device_contexts")->as_array() : nullptr;
      if (!ctx) throw Error(fmt::format("{}: [[memory.kv_fit]] {}: device_contexts must be an array", file, k.kv));
      for (const auto& c : *ctx) {
        auto v = c.value_exact<int64_t>();
        if (!v || *v < 0 || *v > kMaxBytes)
          throw Error(fmt::format("{}: [[memory.kv_fit]] {}: device_contexts must be non-negative integers", file, k.kv));
        k.device_contexts.push_back(*v);
      }
      p.memory.kv_fits.push_back(k);
    }
  }
  if (auto arr = t["placement"].as_array()) {
    for (const auto& e : *arr) {
      const toml::table* pt = e.as_table();
      if (!pt) throw Error(fmt::format("{}: [[placement]] entries must be tables", file));
      const Fields f{*pt, file + " [[placement]]"};
      Placement pl;
      pl.device = f.str("device");
      if (!valid_device(pl.device)) throw Error(fmt::format("{}: placement device '{}' is not cpu or cuda:N", file, pl.device));
      pl.ordinal = f.integer("ordinal", -1, 1023, false, -1);
      if ((pl.device.rfind("cuda:", 0) == 0) != (pl.ordinal >= 0))
        throw Error(fmt::format("{}: placement {}: ordinal {} (a CUDA device index for cuda stages, -1 for cpu ones)",
                                file, pl.device, pl.ordinal));
      pl.first_layer = f.integer("first_layer", 0, 1 << 20);
      pl.last_layer = f.integer("last_layer", pl.first_layer, 1 << 20);
      pl.prefill_us_per_token = f.number("prefill_us_per_token", 0, 1e12, false, 0);
      pl.decode_us_per_token = f.number("decode_us_per_token", 0, 1e12, false, 0);
      for (const Placement& q : p.placement)
        if (q.device == pl.device) throw Error(fmt::format("{}: placement device {} appears twice", file, pl.device));
      if (!p.placement.empty() && pl.first_layer != p.placement.back().last_layer + 1)
        throw Error(fmt::format("{}: placement ranges must be contiguous ({} after {})", file, pl.first_layer,
                                p.placement.back().last_layer));
      p.placement.push_back(pl);
    }
  }
  if (p.placement.empty()) throw Error(fmt::format("{}: [[placement]] is missing", file));
  if (p.placement.front().first_layer != 0)
    throw Error(fmt::format("{}: the first placement starts at layer {}, not 0", file, p.placement.front().first_layer));
  for (const Placement& pl : p.placement)
    if ((pl.device.rfind("cuda", 0) == 0) != (p.backend == "cuda"))
      throw Error(fmt::format("{}: placement device {} in a {} plan", file, pl.device, p.backend));
  if ((p.placement.size() > 1) != (p.pipeline_micro_batch > 0))
    throw Error(fmt::format("{}: pipeline_micro_batch = {} with {} stage(s) (a pipeline needs one, one stage none)",
                            file, p.pipeline_micro_batch, p.placement.size()));
  if ((p.pipeline_micro_batch > 0) != (p.pipeline_decode_group_rows > 0))
    throw Error(fmt::format("{}: pipeline_decode_group_rows = {} with pipeline_micro_batch = {} (set together)", file,
                            p.pipeline_decode_group_rows, p.pipeline_micro_batch));
  const bool cuts = p.pipeline_micro_batch > 0 && p.pipeline_micro_batch < p.max_batch_tokens;
  if (cuts && p.pipeline_micro_batch < pipeline_min_micro_batch(p))
    throw Error(fmt::format("{}: pipeline_micro_batch = {} is below {}: a short last piece of a prefill takes whole "
                            "64-token chunks from the one before it, which must stay at least gdn_recurrent_below "
                            "and precise_rows + 1 long", file, p.pipeline_micro_batch, pipeline_min_micro_batch(p)));
  if (cuts && p.pipeline_micro_batch % 64 != 0)
    throw Error(fmt::format("{}: pipeline_micro_batch = {} is not a multiple of 64 (the GDN chunk)", file,
                            p.pipeline_micro_batch));
  if (auto arr = t["kernel"].as_array()) {
    for (const auto& e : *arr) {
      const toml::table* kt = e.as_table();
      if (!kt) throw Error(fmt::format("{}: [[kernel]] entries must be tables", file));
      const Fields f{*kt, file + " [[kernel]]"};
      KernelChoice k;
      k.op = f.str("op");
      k.shape = f.str("shape", false);
      k.ops = f.integer("ops", 0, INT64_MAX, false);
      k.first_rows = f.integer("first_rows", 1, 65536);
      k.last_rows = f.integer("last_rows", k.first_rows, 65536);
      k.variants = f.str("variants");
      k.reason = f.str("reason", false);
      p.kernels.push_back(k);
    }
  }
  if (auto arr = t["notes"].as_array())
    for (const auto& e : *arr) {
      auto s = e.value_exact<std::string>();
      if (!s) throw Error(fmt::format("{}: notes must be strings", file));
      p.notes.push_back(*s);
    }
  try {
    p.graph = parse(read_file(dir + "/graph.ir"));
    verify(p.graph);
  } catch (const Error& e) {
    throw Error(fmt::format("{}/graph.ir: {}", dir, e.what()));
  }
  if (p.draft_tokens > 0) {
    try {
      p.draft = parse(read_file(dir + "/draft.ir"));
      verify(p.draft);
    } catch (const Error& e) {
      throw Error(fmt::format("{}/draft.ir: {}", dir, e.what()));
    }
    if (p.placement.size() != 1 || (p.backend == "cpu" && p.kernel_family != "reference"))
      throw Error(fmt::format("{}: draft_tokens = {}: speculative decoding runs on one-stage plans of the CPU "
                              "reference and the CUDA backend only", file, p.draft_tokens));
    for (const Op& op : p.draft.ops)
      if (!op.has("device") || op.s("device") != p.placement.back().device)
        throw Error(fmt::format("{}/draft.ir: {} is not on the last stage's device", dir, op.describe()));
    // CUDA: the head's cache is in the plan's formats (its kernels are named for them); the CPU's is f32.
    for (const State& st : p.draft.states) {
      const bool key = st.name.rfind("k.", 0) == 0, value = st.name.rfind("v.", 0) == 0;
      const std::string want = p.backend == "cuda" ? (key ? p.k_dtype : p.v_dtype) : "f32";
      if ((key || value) && dtype_name(st.type.dtype) != want)
        throw Error(fmt::format("{}/draft.ir: state %{} is {} but the plan's head caches are {}", dir, st.name,
                                dtype_name(st.type.dtype), want));
    }
  }
  // The caches' element types are the plan's k_dtype / v_dtype (a hand edit must change both).
  for (const State& st : p.graph.states) {
    const bool key = st.name.rfind("k.", 0) == 0, value = st.name.rfind("v.", 0) == 0;
    if ((key || value) && dtype_name(st.type.dtype) != (key ? p.k_dtype : p.v_dtype))
      throw Error(fmt::format("{}/graph.ir: state %{} is {} but plan.toml says {} = '{}'", dir, st.name,
                              dtype_name(st.type.dtype), key ? "k_dtype" : "v_dtype", key ? p.k_dtype : p.v_dtype));
  }
  const int64_t last = p.placement.back().last_layer;
  std::set<std::string> stage_devices;
  for (const Placement& pl : p.placement) stage_devices.insert(pl.device);
  for (const Op& op : p.graph.ops) {
    const int64_t L = op.i_or("layer", -2);
    if (L < -1 || L > last + 1)
      throw Error(fmt::format("{}/graph.ir: {} has layer {} outside -1..{}", dir, op.describe(), L, last + 1));
    if (!op.has("device") || !stage_devices.count(op.s("device")))
      throw Error(fmt::format("{}/graph.ir: {} is not on a device of the placement", dir, op.describe()));
    if (op.kind == OpKind::bridge && !stage_devices.count(op.s("from")))
      throw Error(fmt::format("{}/graph.ir: {} comes from a device not in the placement", dir, op.describe()));
  }
  return p;
}

}  // namespace qrig::ir
