// What `qrig serve` (and `qrig run`) print while a model loads: the backend's progress (runtime::LoadProgress) as
// a bar redrawn in place when stderr is a terminal, or as a line every few seconds when it is a log; then, per
// device of the plan, where its memory goes (ir::Plan::memory.devices).
#pragma once

#include <chrono>
#include <cstdio>
#include <string>

#include "ir/plan.h"
#include "runtime/backend.h"

namespace qrig::cli {

class LoadReporter {
 public:
  // `prefix` starts every line ("qrig serve"). Terminal or not: isatty(fileno(out)), unless forced.
  explicit LoadReporter(std::string prefix, std::FILE* out = stderr);
  void force_terminal(bool terminal) { terminal_ = terminal; }
  // The callback for runtime::BackendOptions::progress.
  void report(const runtime::LoadProgress& p);
  runtime::LoadProgressFn callback() {
    return [this](const runtime::LoadProgress& p) { report(p); };
  }

 private:
  std::string prefix_;
  std::FILE* out_;
  bool terminal_;
  std::string stage_;
  std::chrono::steady_clock::time_point stage_start_, last_;
  bool open_line_ = false;  // a bar is on the terminal's current line
};

// One line per device: weights, KV cache, GDN (recurrent) state, activations, snapshots, their total and what
// is left of the plan's budget for the device.
void print_memory_summary(const ir::Plan& plan, const std::string& prefix, std::FILE* out = stderr);

// "1.5 GiB", "12.0 MiB", "640 KiB", "12 B".
std::string human_bytes(int64_t bytes);

}  // namespace qrig::cli
