// LoadReporter and print_memory_summary (load_report.h).
#include "cli/load_report.h"

#include <unistd.h>

#include <fmt/format.h>

namespace qrig::cli {

namespace {

constexpr auto kRedraw = std::chrono::milliseconds(100);  // terminal: bar updates at most this often
constexpr auto kLogEvery = std::chrono::seconds(5);        // log: a progress line this often

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

}  // namespace

std::string human_bytes(int64_t b) {
  const double x = (double)b;
  if (b >= (1ll << 30)) return fmt::format("{:.2f} GiB", x / (1 << 30));
  if (b >= (1ll << 20)) return fmt::format("{:.1f} MiB", x / (1 << 20));
  if (b >= (1ll << 10)) return fmt::format("{:.0f} KiB", x / (1 << 10));
  return fmt::format("{} B", b);
}

LoadReporter::LoadReporter(std::string prefix, std::FILE* out)
    : prefix_(std::move(prefix)), out_(out), terminal_(::isatty(::fileno(out)) == 1) {}

void LoadReporter::report(const runtime::LoadProgress& p) {
  const auto now = std::chrono::steady_clock::now();
  const bool first = p.stage != stage_;
  if (first) {
    if (open_line_) std::fputs("\n", out_);
    open_line_ = false;
    stage_ = p.stage;
    stage_start_ = now;
    last_ = now - kLogEvery;  // the first call of a stage always shows
  }
  const bool done = p.done >= p.total;
  const double frac = p.total > 0 ? std::min(1.0, (double)p.done / (double)p.total) : 1.0;
  if (terminal_) {
    if (!done && !first && now - last_ < kRedraw) return;
    constexpr int kWidth = 30;
    const int filled = (int)(frac * kWidth);
    std::string bar(filled, '#');
    bar.resize(kWidth, '.');
    fmt::print(out_, "\r{}: {} [{}] {:3.0f}% {} / {}{}", prefix_, p.stage, bar, 100 * frac, human_bytes(p.done),
               human_bytes(p.total), done ? fmt::format(" in {:.1f} s\n", seconds_since(stage_start_)) : "");
    open_line_ = !done;
  } else {
    if (!done && now - last_ < kLogEvery) return;
    if (done)
      fmt::print(out_, "{}: {}: done, {} in {:.1f} s\n", prefix_, p.stage, human_bytes(p.total),
                 seconds_since(stage_start_));
    else
      fmt::print(out_, "{}: {}: {:.0f}% ({} of {})\n", prefix_, p.stage, 100 * frac, human_bytes(p.done),
                 human_bytes(p.total));
  }
  last_ = now;
  if (done) stage_.clear();
  std::fflush(out_);
}

void print_memory_summary(const ir::Plan& plan, const std::string& prefix, std::FILE* out) {
  const ir::MemoryPlan& m = plan.memory;
  for (const ir::DeviceMemory& d : m.devices) {
    // The states are every slot's KV caches and recurrent (conv + GDN) states. One device holds them all, so they
    // split exactly; across several devices the plan keeps only their sum.
    std::string states;
    if (m.devices.size() == 1) {
      const int64_t kv = m.kv_bytes_per_token * plan.context_length * plan.max_sequences;
      states = fmt::format("KV cache {}, GDN state {}", human_bytes(kv), human_bytes(d.states - kv));
    } else {
      states = fmt::format("KV cache + GDN state {}", human_bytes(d.states));
    }
    fmt::print(out, "{}: memory on {}: weights {}, {}, activations {}, snapshots {}: {} of the plan's {} budget, {} free\n",
               prefix, d.device, human_bytes(d.weights), states, human_bytes(d.arena + d.io + d.sampling),
               human_bytes(d.snapshots), human_bytes(d.total), human_bytes(d.budget), human_bytes(d.budget - d.total));
  }
}

}  // namespace qrig::cli
