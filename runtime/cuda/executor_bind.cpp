// The binding half of the CUDA executor (executor.h): checks the plan against the device, works out and checks
// its allocations (layout.h), uploads the weights (executor_weights.cpp), binds every op through the op table
// (executor_ops.cpp: the kernels its `kernel` attribute names, its weights, its arena places), allocates the
// slots, then forbids compiling.
#include <algorithm>

#include <fmt/format.h>

#include "ir/kernel_attr.h"
#include "runtime/cuda/executor_impl.h"
#include "runtime/cuda/plan_kernels.h"
#include "runtime/cuda/ptx_scan.h"

namespace qrig::runtime {

Slot& CudaExecutor::Impl::slot(int s) {
  if (s < 0 || s >= (int)slots.size()) throw RuntimeError(fmt::format("no slot {}", s));
  return slots[(size_t)s];
}

const cuda::LoadedKernel* CudaExecutor::Impl::load(const cuda::Variant& v) {
  auto it = kernels.find(v.name);
  if (it != kernels.end()) return it->second.get();
  const cuda::CompiledKernel c = compiler->get(v, arch);
  auto k = std::make_unique<cuda::LoadedKernel>(cuda::load_kernel(c, ptx_jit));
  // Programmatic launches only for a kernel that waits for the one before it (every template on sm_90+ but
  // those marked TemplateInfo::plain_launch, the tiled GEMMs: tests/cuda checks each variant's PTX); one
  // that does not is launched plainly, which is always correct.
  k->kernel.set_programmatic(plan.programmatic_launch && cuda::waits_for_previous_grid(c.ptx));
  return kernels.emplace(v.name, std::move(k)).first->second.get();
}

cuda::KernelLoader CudaExecutor::Impl::loader() {
  return [this](const cuda::Variant& v) { return *load(v); };
}

Q8Value CudaExecutor::Impl::q8_at(int64_t offset, int64_t rows, int64_t width) const {
  // The memory pass's q8 layout: values, scales, second plane, each part 256-byte aligned.
  auto align = [](int64_t x) { return (x + 255) / 256 * 256; };
  Q8Value v;
  char* base = arena.data() + offset;
  v.q = reinterpret_cast<int8_t*>(base);
  v.d = reinterpret_cast<float*>(base + align(rows * width));
  v.q2 = plan.precise_rows > 0 ? reinterpret_cast<int8_t*>(base + align(rows * width) + align(rows * (width / 32) * 4))
                               : nullptr;
  return v;
}

// The MTP draft head (plan draft_tokens > 0): the draft graph bound over the weights, kernels and arena of the main
// one, its row buffers (counted in the layout's io bytes), the values it is fed from and carries.
void CudaExecutor::Impl::bind_draft() {
  draft_graph = std::make_unique<BoundGraph>(plan, plan.draft);
  const ir::AttrValue* from = plan.draft.attr("hidden_from");
  if (!from || !std::holds_alternative<std::string>(*from))
    throw RuntimeError("the draft graph does not say which value feeds its %hidden (hidden_from)");
  // A tap names an op's first result (add_rmsnorm_quant: the sum).
  for (const BoundOp& b : graph->ops)
    if (b.tap == std::get<std::string>(*from) && !b.results.empty()) hidden_value = b.results[0];
  for (const BoundOp& b : draft_graph->ops)
    if (b.tap == "mtp_hidden_out" && !b.results.empty()) carry_value = b.results[0];
  const int64_t W = layout.draft_width;
  if (hidden_value < 0 || graph->width(hidden_value) != W || graph->values[(size_t)hidden_value].rows)
    throw RuntimeError(fmt::format("the main graph has no value tapped {} of {} values per token to feed the draft "
                                   "head", std::get<std::string>(*from), W));
  if (carry_value < 0 || draft_graph->width(carry_value) != W || draft_graph->values[(size_t)carry_value].rows)
    throw RuntimeError(fmt::format("the draft graph has no value tapped mtp_hidden_out of {} values per token", W));
  hidden_stage = cuda::DeviceBuffer<float>(opt.device, (size_t)(layout.max_t * W), "the step's rows for the draft head");
  draft_hidden = cuda::DeviceBuffer<float>(opt.device, (size_t)(layout.max_t * W), "the draft head's input rows");
  draft_carry = cuda::DeviceBuffer<float>(opt.device, (size_t)W, "the draft head's carried row");
  KernelBinder kb{plan, *draft_graph, [this](const std::string& name) { return load(name); }, loader(), matmuls, gdns,
                  attentions, batched_attentions, draft_steps};
  draft_steps.reserve(draft_graph->ops.size());
  for (const BoundOp& b : draft_graph->ops) {
    draft_steps.emplace_back();
    CudaStep& s = draft_steps.back();
    s.g = draft_graph.get();
    s.b = &b;
    try {
      bind_op_kernels(kb, s);
      bind_op_resources(*this, s);
    } catch (const ir::Error& e) {
      throw RuntimeError(fmt::format("draft graph: {}: {}", s.b->op->describe(), e.what()));
    }
  }
}

void CudaExecutor::Impl::bind() {
  use_graphs = opt.graphs && plan.decode_graphs;
  if (plan.backend != "cuda") throw RuntimeError(fmt::format("the CUDA executor cannot run a '{}' plan", plan.backend));
  if (plan.kernel_family != "dp4a")
    throw RuntimeError(fmt::format("plan kernel family '{}' has no CUDA kernels (only dp4a)", plan.kernel_family));
  if (plan.placement.size() > 1 && opt.stage.empty())
    throw RuntimeError(fmt::format("the plan is a pipeline of {} stages: one executor per stage", plan.placement.size()));
  if (!opt.stage.empty()) {
    const ir::Placement* pl = nullptr;
    for (const auto& p : plan.placement)
      if (p.device == opt.stage) pl = &p;
    if (!pl) throw RuntimeError(fmt::format("the plan has no stage {}", opt.stage));
    if (pl->ordinal != opt.device)
      throw RuntimeError(fmt::format("stage {} runs on CUDA device {}, not {}", opt.stage, pl->ordinal, opt.device));
  }
  graph = std::make_unique<BoundGraph>(plan);
  layout = cuda::device_layout(plan, *graph, *file, opt.stage);
  cuda::check_layout(layout, plan, opt.stage);

  std::string why;
  const int n_dev = cuda::device_count(&why);
  if (n_dev == 0) throw RuntimeError("the plan targets CUDA but no GPU is usable: " + why);
  if (opt.device < 0 || opt.device >= n_dev) throw RuntimeError(fmt::format("no CUDA device {} ({} present)", opt.device, n_dev));
  cuda::init_devices();
  info = cuda::device_info(opt.device);
  feature_sm = cuda::parse_sm(plan.arch_target);
  arch = cuda::plan_arch(plan);
  ptx_jit = plan.kernel_code == "ptx";
  if (ptx_jit ? info.sm < arch.target_sm : arch.target_sm != info.sm)
    throw RuntimeError(fmt::format(
        "the plan was compiled for {} (code for sm_{}) but device {} ({}) is sm_{}: compile the plan for this GPU's "
        "rig (qrig probe, qrig compile --rig){}",
        plan.arch_target, arch.target_sm, opt.device, info.name, info.sm,
        !ptx_jit && info.sm > arch.target_sm ? "; or, to check these kernels on this newer GPU, compile it with --ptx "
                                               "(PTX through the driver's JIT)"
                                             : ""));
  kernel_load = ptx_jit ? fmt::format("sm_{} PTX by NVRTC {}, JIT-compiled by the driver for sm_{} (checks the {} "
                                      "kernels here; their speed is not an sm_{} GPU's)",
                                      arch.target_sm, arch.nvrtc, info.sm, plan.arch_target, arch.target_sm)
                        : fmt::format("sm_{} cubins by NVRTC {}", arch.target_sm, arch.nvrtc);
  if (layout.total() > info.total_bytes)
    throw RuntimeError(fmt::format("the plan needs {:.2f} GiB on device {} ({}), which has {:.2f} GiB: compile it for "
                                   "this GPU's rig", (double)layout.total() / (1 << 30), opt.device, info.name,
                                   (double)info.total_bytes / (1 << 30)));
  cuda::DeviceGuard guard(opt.device);
  compiler = std::make_unique<cuda::KernelCompiler>(opt.cache_dir);
  stream = std::make_unique<cuda::Stream>(opt.device);

  upload_weights();
  arena = cuda::DeviceBuffer<char>(opt.device, (size_t)layout.arena_bytes, "activation arena");
  allocated += layout.arena_bytes;
  vocab_rows = layout.vocab_rows;
  KernelBinder kb{plan, *graph, [this](const std::string& name) { return load(name); }, loader(), matmuls, gdns,
                  attentions, batched_attentions, steps};
  steps.reserve(graph->ops.size());
  for (size_t i = 0; i < graph->ops.size(); ++i) {
    const BoundOp& b = graph->ops[i];
    if (!opt.stage.empty() && b.kind == ir::OpKind::bridge && b.op->s("from") == opt.stage) bridge_out_value = b.args[0];
    if (!cuda::on_stage(*b.op, opt.stage)) continue;
    if (b.kind == ir::OpKind::bridge) bridge_in_step = (int)steps.size();
    steps.emplace_back();
    CudaStep& s = steps.back();
    s.g = graph.get();
    s.b = &b;
    try {
      bind_op_kernels(kb, s);
      bind_op_resources(*this, s);
    } catch (const ir::Error& e) {
      throw RuntimeError(fmt::format("{}: {}", s.b->op->describe(), e.what()));
    }
  }
  if (layout.has_output) {
    std::vector<std::string> top_k_names;
    bind_output_kernels(kb, argmax, top_k_names);
    top_k = std::make_unique<cuda::TopKSelector>(loader(), top_k_names, opt.device, vocab_rows, layout.top_k_vocab,
                                                 layout.top_k_rows, layout.top_k_adjust);
    allocated += top_k->device_bytes();
  }
  for (int k = 0; k < 2; ++k) {
    if (layout.bridge_in_width > 0)
      bridge_in[k] = cuda::DeviceBuffer<float>(opt.device, (size_t)(layout.max_t * layout.bridge_in_width),
                                               fmt::format("bridge rows in ({})", k));
    if (layout.bridge_out_width > 0)
      bridge_out[k] = cuda::DeviceBuffer<float>(opt.device, (size_t)(layout.max_t * layout.bridge_out_width),
                                                fmt::format("bridge rows out ({})", k));
  }  // counted in the layout's io bytes (added with the step buffers below)
  if ((layout.bridge_in_width > 0) != (bridge_in_step >= 0) || (layout.bridge_out_width > 0) != (bridge_out_value >= 0))
    throw RuntimeError("CUDA executor: the stage's bridges and its layout disagree (a bug)");

  if (plan.draft_tokens > 0) bind_draft();
  tokens_dev = cuda::DeviceBuffer<int32_t>(opt.device, (size_t)layout.max_t, "step tokens");
  pos_dev = cuda::DeviceBuffer<int32_t>(opt.device, (size_t)layout.max_t, "step positions");
  rows_dev = cuda::DeviceBuffer<int32_t>(opt.device, (size_t)layout.max_r, "step output rows");
  argmax_dev = cuda::DeviceBuffer<int32_t>(opt.device, (size_t)layout.max_r, "argmax");
  decode_tables = cuda::DeviceBuffer<uint64_t>(opt.device, (size_t)(layout.slots * (1 + (int64_t)graph->states.size())),
                                               "batched decode tables (state and cache pointers per slot)");
  decode_seq = cuda::DeviceBuffer<int32_t>(opt.device, (size_t)(2 * layout.slots), "decode step's slots and positions");
  decode_seq.fill_bytes(0);
  allocated += layout.io_bytes;

  for (int64_t i = 0; i < layout.slots; ++i) {
    Slot sl;
    if (layout.rec_floats > 0) {
      sl.rec = cuda::DeviceBuffer<float>(opt.device, (size_t)layout.rec_floats, fmt::format("slot {} states", i));
      sl.rec.fill_bytes(0);
    }
    if (layout.kept_floats > 0) {  // a plan that drafts: a verify step's states per position (rollback)
      sl.kept = cuda::DeviceBuffer<float>(opt.device, (size_t)layout.kept_floats, fmt::format("slot {} kept states", i));
      sl.kept.fill_bytes(0);
    }
    for (size_t k = 0; k < graph->states.size(); ++k) {
      sl.cache.emplace_back();
      if (layout.cache_halves[k] > 0) {
        sl.cache.back() = cuda::DeviceBuffer<uint16_t>(opt.device, (size_t)layout.cache_halves[k],
                                                       fmt::format("slot {} {}", i, graph->states[k].name));
        sl.cache.back().fill_bytes(0);
      }
    }
    if (draft_graph) {  // the MTP head's caches and its waiting hidden rows
      for (size_t k = 0; k < draft_graph->states.size(); ++k) {
        sl.draft_cache.emplace_back(opt.device, (size_t)layout.draft_cache_halves.at(k),
                                    fmt::format("slot {} draft head {}", i, draft_graph->states[k].name));
        sl.draft_cache.back().fill_bytes(0);
      }
      sl.draft_pending = cuda::DeviceBuffer<float>(opt.device, (size_t)(layout.draft_pending_rows * layout.draft_width),
                                                   fmt::format("slot {} rows waiting for the draft head", i));
      sl.draft_pending.fill_bytes(0);
    }
    allocated += layout.slot_bytes;
    slots.push_back(std::move(sl));
  }
  {  // the batched decode kernels' tables: each slot's recurrent-state image and caches
    const size_t n = slots.size();
    std::vector<uint64_t> t(n * (1 + graph->states.size()), 0);
    for (size_t i = 0; i < n; ++i) {
      t[i] = reinterpret_cast<uint64_t>(slots[i].rec.data());
      for (size_t k = 0; k < graph->states.size(); ++k)
        t[(1 + k) * n + i] = reinterpret_cast<uint64_t>(slots[i].cache[k].data());
    }
    decode_tables.upload(t);
  }
  if (allocated != layout.total())
    throw RuntimeError(fmt::format("CUDA executor: allocated {} bytes where the layout says {} (a bug)", allocated,
                                   layout.total()));
  compiler->forbid_jit();  // everything is loaded: a compile from here on would be a bug
}

}  // namespace qrig::runtime
