// builtin_model_path() (cli/commands.h): the model `qrig run` and `qrig serve` use when given none, a tiny
// random-weight Qwen3.5 written once by the synth preset "tiny" (seed 0) to $XDG_CACHE_HOME/qrig/tiny-synth.gguf
// (else ~/.cache/qrig/, else the temp directory), atomically: written under a temporary name, then renamed.
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
  std::filesystem::path path = dir / "tiny-synth.gguf";
  if (std::filesystem::exists(path)) return path.string();
  std::filesystem::create_directories(dir);
  std::filesystem::path tmp = dir / fmt::format("tiny-synth.gguf.tmp{}", (long)getpid());
  write_synth_model("tiny", 0, tmp.string());
  std::filesystem::rename(tmp, path);  // a concurrent writer's file is identical (same preset and seed)
  fmt::print(stderr, "qrig: wrote the built-in tiny model (random weights) to {}\n", path.string());
  return path.string();
}

}  // namespace qrig::cli
