// builtin_model_path() (cli/commands.h): the model `qrig run` and `qrig serve` use when given none, a tiny
// random-weight Qwen3.5 written once by the synth preset "tiny" (seed 0) to
// $XDG_CACHE_HOME/qrig/builtin-<fingerprint>/tiny-synth.gguf (else ~/.cache/qrig/, else the temp directory),
// atomically: written under a temporary name, then renamed. The fingerprint covers the header (metadata, tensor
// layout) and kSynthWeightsVersion, so a qrig whose synth writes another model does not serve an old file; the
// file name stays tiny-synth.gguf, which is the model id the server reports.
#include <unistd.h>

#include <cstdlib>
#include <filesystem>

#include <fmt/format.h>

#include "cli/commands.h"
#include "cli/synth.h"

namespace qrig::cli {

std::string builtin_model_path() {
  std::filesystem::path dir;
  if (const char* x = std::getenv("XDG_CACHE_HOME"); x && *x) dir = x;
  else if (const char* h = std::getenv("HOME"); h && *h) dir = std::filesystem::path(h) / ".cache";
  else dir = std::filesystem::temp_directory_path();
  dir /= "qrig";
  uint64_t h = 1469598103934665603ull ^ (uint64_t)kSynthWeightsVersion;  // FNV-1a
  for (uint8_t b : synth_model("tiny", 0).header()) h = (h ^ b) * 1099511628211ull;
  dir /= fmt::format("builtin-{:016x}", h);
  const std::string name = "tiny-synth.gguf";
  std::filesystem::path path = dir / name;
  if (std::filesystem::exists(path)) return path.string();
  std::filesystem::create_directories(dir);
  std::filesystem::path tmp = dir / fmt::format("{}.tmp{}", name, (long)getpid());
  write_synth_model("tiny", 0, tmp.string());
  std::filesystem::rename(tmp, path);  // a concurrent writer's file is identical (same preset and seed)
  fmt::print(stderr, "qrig: wrote the built-in tiny model (random weights) to {}\n", path.string());
  return path.string();
}

}  // namespace qrig::cli
