// Reading and writing the plan directory (plan.toml via toml++, graph.ir via the IR text form).
#include "ir/plan.h"

#include <cstdio>
#include <filesystem>
#include <fstream>
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

template <class T>
T need(const toml::table& t, const char* section, const char* key, const std::string& file) {
  auto v = t[section][key].value<T>();
  if (!v) throw Error(fmt::format("{}: [{}] {} is missing or of the wrong type", file, section, key));
  return *v;
}

}  // namespace

std::string Plan::to_toml() const {
  toml::table plan{{"format", format}, {"compiler_version", compiler_version}, {"backend", backend},
                   {"arch_target", arch_target}, {"device_sms", device_sms}, {"kernel_family", kernel_family}, {"rig", rig_name}};
  toml::table model{{"path", model_path}, {"size", model_size}, {"arch", arch}, {"name", model_name},
                    {"vocab_real", vocab_real}};
  toml::table decisions{{"context_length", context_length}, {"max_sequences", max_sequences},
                        {"max_batch_tokens", max_batch_tokens}, {"gdn_chunk", gdn_chunk},
                        {"gdn_recurrent_below", gdn_recurrent_below}, {"precise_rows", precise_rows},
                        {"kv_dtype", kv_dtype}, {"threads", threads}};
  toml::table mem{{"weight_bytes", memory.weight_bytes}, {"kv_bytes_per_token", memory.kv_bytes_per_token},
                     {"state_bytes_per_sequence", memory.state_bytes_per_sequence},
                     {"activation_bytes", memory.activation_bytes}, {"budget_bytes", memory.budget_bytes}};
  toml::array places;
  for (const Placement& p : placement)
    places.push_back(toml::table{{"device", p.device}, {"first_layer", p.first_layer}, {"last_layer", p.last_layer}});
  toml::array note_arr;
  for (const auto& n : notes) note_arr.push_back(n);
  toml::table root{{"plan", plan}, {"model", model}, {"decisions", decisions}, {"memory", mem},
                   {"placement", places}, {"notes", note_arr}};
  std::ostringstream ss;
  ss << "# qrig plan: every decision for this model on this rig. Graph in graph.ir.\n" << root << "\n";
  return ss.str();
}

void Plan::write(const std::string& dir) const {
  std::filesystem::create_directories(dir);
  write_file(dir + "/graph.ir", print(graph));
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
  p.format = need<int64_t>(t, "plan", "format", file);
  if (p.format != kFormat)
    throw Error(fmt::format("{}: plan format {} is not supported by this qrig (wants {}); recompile the plan", file,
                            p.format, kFormat));
  p.compiler_version = t["plan"]["compiler_version"].value_or(std::string());
  p.backend = need<std::string>(t, "plan", "backend", file);
  p.arch_target = t["plan"]["arch_target"].value_or(std::string());
  p.kernel_family = t["plan"]["kernel_family"].value_or(std::string());
  p.rig_name = t["plan"]["rig"].value_or(std::string());
  p.device_sms = t["plan"]["device_sms"].value_or(int64_t{0});
  p.model_path = need<std::string>(t, "model", "path", file);
  p.model_size = need<int64_t>(t, "model", "size", file);
  p.arch = need<std::string>(t, "model", "arch", file);
  p.model_name = t["model"]["name"].value_or(std::string());
  p.vocab_real = need<int64_t>(t, "model", "vocab_real", file);
  p.context_length = need<int64_t>(t, "decisions", "context_length", file);
  p.max_sequences = need<int64_t>(t, "decisions", "max_sequences", file);
  p.max_batch_tokens = need<int64_t>(t, "decisions", "max_batch_tokens", file);
  p.gdn_chunk = need<int64_t>(t, "decisions", "gdn_chunk", file);
  p.gdn_recurrent_below = need<int64_t>(t, "decisions", "gdn_recurrent_below", file);
  p.precise_rows = need<int64_t>(t, "decisions", "precise_rows", file);
  p.kv_dtype = need<std::string>(t, "decisions", "kv_dtype", file);
  p.threads = need<int64_t>(t, "decisions", "threads", file);
  if (p.context_length <= 0 || p.max_sequences <= 0 || p.max_batch_tokens <= 0 || p.gdn_chunk <= 0)
    throw Error(fmt::format("{}: decisions must be positive", file));
  if (p.precise_rows < 0) throw Error(fmt::format("{}: decisions.precise_rows must be >= 0", file));
  p.memory.weight_bytes = t["memory"]["weight_bytes"].value_or(int64_t{0});
  p.memory.kv_bytes_per_token = t["memory"]["kv_bytes_per_token"].value_or(int64_t{0});
  p.memory.state_bytes_per_sequence = t["memory"]["state_bytes_per_sequence"].value_or(int64_t{0});
  p.memory.activation_bytes = t["memory"]["activation_bytes"].value_or(int64_t{0});
  p.memory.budget_bytes = t["memory"]["budget_bytes"].value_or(int64_t{0});
  if (auto arr = t["placement"].as_array()) {
    for (const auto& e : *arr) {
      const toml::table* pt = e.as_table();
      if (!pt) throw Error(fmt::format("{}: [[placement]] entries must be tables", file));
      Placement pl;
      pl.device = (*pt)["device"].value_or(std::string());
      pl.first_layer = (*pt)["first_layer"].value_or(int64_t{-1});
      pl.last_layer = (*pt)["last_layer"].value_or(int64_t{-1});
      p.placement.push_back(pl);
    }
  }
  if (auto arr = t["notes"].as_array())
    for (const auto& e : *arr) p.notes.push_back(e.value_or(std::string()));
  try {
    p.graph = parse(read_file(dir + "/graph.ir"));
    verify(p.graph);
  } catch (const Error& e) {
    throw Error(fmt::format("{}/graph.ir: {}", dir, e.what()));
  }
  return p;
}

}  // namespace qrig::ir
