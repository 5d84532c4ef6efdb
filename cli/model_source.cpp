// resolve_model and locate_plan_model (model_source.h).
#include "cli/model_source.h"

#include <algorithm>
#include <filesystem>
#include <regex>
#include <stdexcept>
#include <vector>

#include <fmt/format.h>

#include "gguf/gguf.h"

namespace qrig::cli {

namespace fs = std::filesystem;

namespace {

bool is_gguf_name(const fs::path& p) {
  std::string ext = p.extension().string();
  std::transform(ext.begin(), ext.end(), ext.begin(), [](unsigned char c) { return (char)std::tolower(c); });
  return ext == ".gguf";
}

// "name-00002-of-00003.gguf" -> {"name", 2, 3}.
struct ShardName {
  std::string prefix;
  int no = 0, count = 0;
};
bool shard_name(const std::string& file, ShardName& out) {
  static const std::regex re(R"(^(.*)-(\d{5})-of-(\d{5})\.gguf$)", std::regex::icase);
  std::smatch m;
  if (!std::regex_match(file, m, re)) return false;
  out = {m[1].str(), std::stoi(m[2].str()), std::stoi(m[3].str())};
  return true;
}

std::string model_in_directory(const fs::path& dir) {
  std::vector<std::string> models, projectors;
  for (const auto& e : fs::directory_iterator(dir)) {
    if (!e.is_regular_file() || !is_gguf_name(e.path())) continue;
    const std::string name = e.path().filename().string();
    (name.rfind("mmproj", 0) == 0 ? projectors : models).push_back(name);
  }
  std::sort(models.begin(), models.end());
  if (models.empty())
    throw std::runtime_error(fmt::format("{} is neither a plan directory (no plan.toml) nor a directory holding a model "
                                         "(no .gguf file{})", dir.string(),
                                         projectors.empty() ? "" : "; mmproj*.gguf files are vision projectors"));
  if (models.size() == 1) return (dir / models[0]).string();
  // Several files: the shards of one split model are one model, opened by its first shard.
  ShardName first;
  bool one_split = shard_name(models[0], first);
  for (const auto& m : models) {
    ShardName s;
    one_split = one_split && shard_name(m, s) && s.prefix == first.prefix && s.count == first.count;
  }
  if (one_split) {
    const std::string want = fs::path(gguf::split_path(first.prefix, 0, (uint32_t)first.count)).filename().string();
    if (models[0] != want)
      throw std::runtime_error(fmt::format("{} holds shards of the split model {} but not its first shard {}",
                                           dir.string(), first.prefix, want));
    return (dir / want).string();
  }
  std::string list;
  for (size_t k = 0; k < models.size() && k < 8; ++k) list += (k ? ", " : "") + models[k];
  if (models.size() > 8) list += fmt::format(", ... ({} more)", models.size() - 8);
  throw std::runtime_error(fmt::format("{} holds {} models ({}): give the .gguf to use", dir.string(), models.size(),
                                       list));
}

}  // namespace

ModelSource resolve_model(const std::string& arg) {
  std::error_code ec;
  const fs::path p(arg);
  if (!fs::exists(p, ec)) throw std::runtime_error(fmt::format("no such model: {}", arg));
  if (fs::is_directory(p, ec)) {
    if (fs::exists(p / "plan.toml", ec)) return {true, arg};
    return {false, model_in_directory(p)};
  }
  return {false, arg};
}

void locate_plan_model(ir::Plan& plan, const std::string& plan_dir, const std::string& override_path,
                       std::string* note) {
  std::error_code ec;
  if (!override_path.empty()) {
    const ModelSource m = resolve_model(override_path);
    if (m.plan) throw std::runtime_error(fmt::format("--model {} is a plan directory, not a model file", override_path));
    const auto abs = fs::absolute(m.path, ec);
    plan.model_path = ec ? m.path : abs.lexically_normal().string();
    return;
  }
  if (fs::exists(plan.model_path, ec)) return;
  const std::string name = fs::path(plan.model_path).filename().string();
  const fs::path dir = fs::absolute(plan_dir, ec).lexically_normal();
  for (const fs::path& candidate : {dir / name, dir.parent_path() / name}) {
    if (fs::is_regular_file(candidate, ec)) {
      if (note)
        *note = fmt::format("the plan's model {} is not there; using {} (found beside the plan)", plan.model_path,
                            candidate.string());
      plan.model_path = candidate.string();
      return;
    }
  }
  throw std::runtime_error(fmt::format(
      "the plan {} was compiled for the model {}, which is not there (nor {} or {}): give the model's new place with "
      "--model PATH (the same file: {} bytes), or recompile the plan",
      plan_dir, plan.model_path, (dir / name).string(), (dir.parent_path() / name).string(), plan.model_size));
}

std::string model_display_name(const std::string& gguf_path) {
  const std::string file = fs::path(gguf_path).filename().string();
  ShardName s;
  if (shard_name(file, s)) return s.prefix;
  return fs::path(file).stem().string();
}

}  // namespace qrig::cli
