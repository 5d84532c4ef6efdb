// Pass: layer-to-device placement. One device gets every layer; several CUDA devices form a pipeline of
// contiguous layer ranges sized by device memory (only hidden states cross devices). Every op is tagged with
// the device (stage) that runs it: the embedding goes with the first stage, the output head with the last.
#include <cmath>

#include <fmt/format.h>

#include "compiler/passes/passes.h"

namespace qrig::compiler::passes {

namespace {

void tag_devices(ir::Plan& p, int64_t n_layer) {
  for (auto& op : p.graph.ops) {
    const int64_t L = op.i("layer");
    std::string dev = L < 0 ? p.placement.front().device : p.placement.back().device;
    if (L >= 0 && L < n_layer)
      for (const auto& pl : p.placement)
        if (L >= pl.first_layer && L <= pl.last_layer) dev = pl.device;
    op.set("device", dev);
  }
}

}  // namespace

void place_layers(CompileContext& cx) {
  ir::Plan& p = cx.plan;
  const int64_t n = cx.params.n_layer;
  p.placement.clear();
  if (p.backend == "cpu") {
    p.placement.push_back({"cpu", 0, n - 1});
    p.notes.push_back(fmt::format("placement: layers 0-{} on the cpu", n - 1));
    tag_devices(p, n);
    return;
  }
  std::vector<int> gpus;
  for (size_t k = 0; k < cx.rig.devices.size(); ++k)
    if (cx.rig.devices[k].kind == "cuda") gpus.push_back((int)k);
  if ((int64_t)gpus.size() > n) gpus.resize((size_t)n);
  if (cx.options.max_gpus > 0 && (int64_t)gpus.size() > cx.options.max_gpus) gpus.resize((size_t)cx.options.max_gpus);
  double total = 0;
  for (int g : gpus) total += cx.rig.devices[(size_t)g].memory_gib;
  int64_t first = 0;
  double acc = 0;
  for (size_t g = 0; g < gpus.size(); ++g) {
    acc += cx.rig.devices[gpus[g]].memory_gib;
    int64_t last = g + 1 == gpus.size() ? n - 1 : (int64_t)std::llround(acc / total * (double)n) - 1;
    last = std::max(last, first);
    last = std::min(last, n - 1 - (int64_t)(gpus.size() - 1 - g));
    p.placement.push_back({fmt::format("cuda:{}", g), first, last});
    first = last + 1;
  }
  std::string s = "placement:";
  for (const auto& pl : p.placement) s += fmt::format(" {} layers {}-{};", pl.device, pl.first_layer, pl.last_layer);
  p.notes.push_back(s + " (by device memory)" +
                    (cx.options.max_gpus > 0 ? fmt::format("; at most {} GPU(s) by request", cx.options.max_gpus) : ""));
  tag_devices(p, n);
}

}  // namespace qrig::compiler::passes
