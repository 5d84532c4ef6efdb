// The binding half of the CUDA executor (executor.h): checks the plan against the device, binds every op to
// its weights (uploaded by executor_weights.cpp) and kernels (every variant loaded, then compiling is
// forbidden), lays out the activation arena by liveness, allocates slot states.
#include <algorithm>
#include <cstdlib>
#include <cstring>

#include <fmt/format.h>

#include "runtime/cuda/executor_impl.h"
#include "runtime/cuda/plan_kernels.h"

namespace qrig::runtime {

namespace {

constexpr int kTokens = 0, kPos = 1, kRows = 2;

int64_t align_up(int64_t x, int64_t a) { return (x + a - 1) / a * a; }

OpKind kind_of(const ir::Op& op) {
  static const std::map<std::string, OpKind> kinds = {
      {"embed", OpKind::embed}, {"rmsnorm", OpKind::rmsnorm}, {"matmul", OpKind::matmul}, {"add", OpKind::add},
      {"swiglu", OpKind::swiglu}, {"conv1d_silu", OpKind::conv1d_silu}, {"gdn", OpKind::gdn},
      {"gated_rmsnorm", OpKind::gated_rmsnorm}, {"head_rmsnorm", OpKind::head_rmsnorm}, {"rope", OpKind::rope},
      {"kv_write", OpKind::kv_write}, {"attention", OpKind::attention}, {"gather_rows", OpKind::gather_rows}};
  auto it = kinds.find(op.kind);
  if (it == kinds.end()) throw RuntimeError(fmt::format("the CUDA backend has no op '{}' ({})", op.kind, op.describe()));
  return it->second;
}

}  // namespace

Slot& CudaExecutor::Impl::slot(int s) {
  if (s < 0 || s >= (int)slots.size()) throw RuntimeError(fmt::format("no slot {}", s));
  return slots[(size_t)s];
}

const cuda::LoadedKernel* CudaExecutor::Impl::load(const cuda::Variant& v) {
  auto it = kernels.find(v.name);
  if (it != kernels.end()) return it->second.get();
  auto k = std::make_unique<cuda::LoadedKernel>(cuda::load_kernel(compiler->get(v, feature_sm)));
  return kernels.emplace(v.name, std::move(k)).first->second.get();
}

cuda::KernelLoader CudaExecutor::Impl::loader() {
  return [this](const cuda::Variant& v) { return *load(v); };
}

void CudaExecutor::Impl::bind() {
  const char* graphs_env = std::getenv("QRIG_CUDA_GRAPHS");
  use_graphs = opt.graphs && !(graphs_env && std::string(graphs_env) == "0");
  if (plan.backend != "cuda") throw RuntimeError(fmt::format("the CUDA executor cannot run a '{}' plan", plan.backend));
  if (plan.kernel_family != "dp4a")
    throw RuntimeError(fmt::format("plan kernel family '{}' has no CUDA kernels (only dp4a)", plan.kernel_family));
  for (const auto& p : plan.placement)
    if (p.device != "cuda:0")
      throw RuntimeError(fmt::format("plan places layers {}-{} on {}: this build runs single-GPU plans only (cuda:0); "
                                     "compile with --gpus 1", p.first_layer, p.last_layer, p.device));
  std::string why;
  const int n_dev = cuda::device_count(&why);
  if (n_dev == 0) throw RuntimeError("the plan targets CUDA but no GPU is usable: " + why);
  if (opt.device < 0 || opt.device >= n_dev) throw RuntimeError(fmt::format("no CUDA device {} ({} present)", opt.device, n_dev));
  cuda::init_devices();
  info = cuda::device_info(opt.device);
  feature_sm = cuda::parse_sm(plan.arch_target);
  const cuda::ArchChoice arch = cuda::choose_arch(feature_sm);
  if (arch.target_sm != info.sm)
    throw RuntimeError(fmt::format("the plan was compiled for {} (code for sm_{}) but device {} ({}) is sm_{}: "
                                   "compile the plan for this GPU's rig (qrig probe, qrig compile --rig)",
                                   plan.arch_target, arch.target_sm, opt.device, info.name, info.sm));
  cuda::DeviceGuard guard(opt.device);
  compiler = std::make_unique<cuda::KernelCompiler>(opt.cache_dir);
  stream = std::make_unique<cuda::Stream>(opt.device);

  const ir::Graph& g = plan.graph;
  max_t = std::max<int64_t>(1, plan.max_batch_tokens);
  max_r = opt.max_logit_rows > 0 ? opt.max_logit_rows : std::max<int64_t>(1, plan.max_sequences);
  max_r = std::min(max_r, max_t);

  std::map<std::string, int> id;
  for (const char* in : {"tokens", "pos", "rows"}) {
    bool found = false;
    for (const auto& i : g.inputs) found |= i.name == in;
    if (!found) throw RuntimeError(fmt::format("graph lacks input %{}", in));
    id[in] = (int)value_names.size();
    value_names.push_back(in);
    value_width.push_back(1);
  }
  if (g.inputs.size() != 3) throw RuntimeError("graph inputs must be %tokens, %pos, %rows");

  // States: conv/GDN f32 in one per-slot buffer, KV caches fp16.
  std::map<std::string, int> state_id;
  int n_kv = 0;
  int64_t kv_halves = 0;
  for (const auto& st : g.states) {
    StateLayout L;
    L.name = st.name;
    int64_t n = 1;
    for (int64_t d : st.type.shape) {
      if (d == ir::kContext) {
        L.positional = true;
        n *= plan.context_length;
      } else {
        n *= d;
      }
    }
    L.elements = n;
    if (L.positional) {
      if (st.type.dtype != ir::DType::f16 || st.type.shape.size() != 3 || st.type.shape[0] != 2)
        throw RuntimeError(fmt::format("state %{} ({}): the CUDA backend keeps KV caches as f16[2,C,W]", st.name,
                                       ir::type_string(st.type)));
      L.width = st.type.shape[2];
      L.kv_index = n_kv++;
      kv_halves += n;
    } else {
      if (st.type.dtype != ir::DType::f32)
        throw RuntimeError(fmt::format("state %{} is {}: recurrent states are f32", st.name, ir::dtype_name(st.type.dtype)));
      L.offset = rec_floats;
      rec_floats += align_up(n, 64);
    }
    state_id[st.name] = (int)state_layout.size();
    state_layout.push_back(L);
  }
  state_bytes = rec_floats * 4 + kv_halves * 2;

  const GroupMap grouping = upload_weight_groups();
  auto q8 = [&](const std::string& name, const ir::Op& op) { return upload_q8(name, op); };
  auto f32 = [&](const std::string& name, const ir::Op& op, int64_t n) { return upload_f32(name, op, n); };
  const auto& group_head_of = grouping.head_of;
  const auto& group_index = grouping.index;
  int64_t max_k = 32;
  const int sms = plan.device_sms > 0 ? (int)plan.device_sms : info.sms;  // what the plan's tilings assume
  for (const ir::Op& op : g.ops) {
    CudaStep s;
    s.op = &op;
    s.kind = kind_of(op);
    for (const auto& a : op.args) {
      auto it = id.find(a);
      if (it == id.end()) throw RuntimeError(fmt::format("{}: argument %{} is not defined before it", op.describe(), a));
      s.args.push_back(it->second);
    }
    if (!op.result.empty()) {
      if (op.type.shape.size() != 2 || op.type.shape[1] <= 0)
        throw RuntimeError(fmt::format("{}: results must be 2-D with a fixed width", op.describe()));
      s.width = op.type.shape[1];
      s.rows_result = op.type.shape[0] == ir::kRows;
      if (s.width % 4 != 0)
        throw RuntimeError(fmt::format("{}: the CUDA backend needs row lengths that are multiples of 4", op.describe()));
    }
    if (op.has("tap")) s.tap = op.s("tap");
    if (op.has("state")) s.state = state_id.at(op.s("state"));
    if (op.has("cache")) s.state = state_id.at(op.s("cache"));
    if (op.has("eps")) s.eps = (float)op.f("eps");
    auto arg_width = [&](size_t i) { return value_width.at((size_t)s.args.at(i)); };
    switch (s.kind) {
      case OpKind::embed:
        s.w = q8(op.s("weight"), op);
        if (s.w.cols != s.width) throw RuntimeError(fmt::format("{}: embedding rows have {} values", op.describe(), s.w.cols));
        s.kernel = load(cuda::embed_q8_0_variant(s.width));
        vocab_rows = s.w.rows;
        break;
      case OpKind::rmsnorm:
        s.vec = f32(op.s("weight"), op, s.width);
        s.kernel = load(cuda::rmsnorm_f32_variant(s.width));
        if (cuda::rmsnorm_feeds_matmul(g, op)) {
          s.norm_quant[1] = load(cuda::rmsnorm_f32_variant(s.width, 1));
          if (plan.precise_rows > 0) s.norm_quant[2] = load(cuda::rmsnorm_f32_variant(s.width, 2));
        }
        break;
      case OpKind::matmul: {
        s.w = q8(op.s("weight"), op);
        s.in_width = arg_width(0);
        if (s.w.cols != s.in_width || s.w.rows != s.width)
          throw RuntimeError(fmt::format("{}: weight [{}][{}] does not map {} to {} values", op.describe(), s.w.rows,
                                         s.w.cols, s.in_width, s.width));
        max_k = std::max(max_k, s.in_width);
        const int64_t rows = s.rows_result ? max_r : max_t;
        auto matmul = [&](int64_t min_rows, int64_t max_rows, int64_t planes) {
          auto& mm = matmuls[fmt::format("{}x{}x{}-{}p{}", s.in_width, s.width, min_rows, max_rows, planes)];
          if (!mm) mm = std::make_unique<cuda::MatmulQ8>(loader(), s.in_width, s.width, max_rows, sms, planes, min_rows);
          return mm.get();
        };
        // Two planes up to plan.precise_rows rows, one above: what step() runs for a matmul of n rows.
        if (rows > plan.precise_rows) s.mm = matmul(plan.precise_rows + 1, rows, 1);
        if (plan.precise_rows > 0) s.mm_precise = matmul(1, std::min(rows, plan.precise_rows), 2);
        if (op.result == "logits") vocab_rows = s.width;
        if (auto h = group_head_of.find(op.s("weight")); h != group_head_of.end() && group_index.count(h->second)) {
          s.group = group_index.at(h->second);
          s.group_head = h->second == op.s("weight");
          groups[(size_t)s.group].members.push_back((int)steps.size());
        }
        break;
      }
      case OpKind::add: s.kernel = load(cuda::add_f32_variant()); break;
      case OpKind::swiglu: s.kernel = load(cuda::swiglu_f32_variant()); break;
      case OpKind::conv1d_silu: {
        const StateLayout& L = state_layout.at((size_t)s.state);
        const int64_t taps = L.elements / s.width + 1;
        if ((taps - 1) * s.width != L.elements) throw RuntimeError(fmt::format("{}: state size does not match", op.describe()));
        s.vec = f32(op.s("weight"), op, taps * s.width);
        s.kernel = load(cuda::conv1d_silu_f32_variant(taps));
        break;
      }
      case OpKind::gdn: {
        const cuda::GdnDims d{op.i("key_heads"), op.i("value_heads"), op.i("key_dim"), op.i("value_dim")};
        s.vec = f32(op.s("ssm_a"), op, d.Hv);
        s.vec2 = f32(op.s("dt_bias"), op, d.Hv);
        s.recurrent_below = op.i_or("recurrent_below", 1);
        const int64_t chunk = op.i_or("chunk", 64);
        const std::string key = fmt::format("{}/{}/{}/{}/{}", d.Hk, d.Hv, d.dk, d.dv, chunk);
        auto& k = gdns[key];
        if (!k) k = std::make_unique<cuda::GdnKernels>(loader(), d, chunk);
        s.gdn = k.get();
        workspace_bytes = std::max(workspace_bytes, k->workspace_bytes(max_t));
        if (state_layout.at((size_t)s.state).elements != d.Hv * d.dk * d.dv)
          throw RuntimeError(fmt::format("{}: state size does not match the heads", op.describe()));
        break;
      }
      case OpKind::gated_rmsnorm:
        s.heads = op.i("heads");
        s.head_dim = op.i("head_dim");
        s.vec = f32(op.s("weight"), op, s.head_dim);
        s.kernel = load(cuda::gated_rmsnorm_f32_variant(s.head_dim));
        break;
      case OpKind::head_rmsnorm:
        s.heads = op.i("heads");
        s.head_dim = op.i("head_dim");
        s.head_stride = op.i("head_stride");
        s.head_offset = op.i("head_offset");
        s.row_stride = arg_width(0);
        s.vec = f32(op.s("weight"), op, s.head_dim);
        s.kernel = load(cuda::head_rmsnorm_f32_variant(s.head_dim));
        break;
      case OpKind::rope: {
        s.heads = op.i("heads");
        s.head_dim = op.i("head_dim");
        const int64_t rd = op.i("rope_dims");
        s.kernel = load(cuda::rope_neox_f32_variant(s.head_dim, rd));
        const auto inv = cuda::rope_inv_freq(rd, (float)op.f("theta"));
        weight_f64.emplace_back(opt.device, inv.size(), op.describe() + " inv_freq");
        weight_f64.back().upload(inv);
        s.inv_freq = weight_f64.back().data();
        break;
      }
      case OpKind::kv_write:
        s.kernel = load(cuda::kv_write_f16_variant());
        if (!state_layout.at((size_t)s.state).positional) throw RuntimeError(op.describe() + ": cache is not a KV state");
        break;
      case OpKind::attention: {
        const cuda::AttentionDims d{op.i("heads"), op.i("kv_heads"), op.i("head_dim")};
        s.heads = d.Hq;
        s.head_dim = d.hd;
        s.scale = (float)op.f("scale");
        s.gate_offset = op.i("gate_offset");
        s.gate_head_stride = op.i("gate_head_stride");
        s.gate_row_stride = arg_width(1);
        const std::string key = fmt::format("{}/{}/{}", d.Hq, d.Hkv, d.hd);
        auto& k = attentions[key];
        if (!k) k = std::make_unique<cuda::AttentionKernels>(loader(), d, plan.context_length, sms);
        s.att = k.get();
        workspace_bytes = std::max(workspace_bytes, k->workspace_bytes(max_t));
        if (state_layout.at((size_t)s.state).width != d.Hkv * d.hd)
          throw RuntimeError(fmt::format("{}: KV cache width does not match the heads", op.describe()));
        break;
      }
      case OpKind::gather_rows: break;
    }
    if (!op.result.empty()) {
      if (id.count(op.result)) throw RuntimeError(fmt::format("{}: %{} is defined twice", op.describe(), op.result));
      s.result = (int)value_names.size();
      id[op.result] = s.result;
      value_names.push_back(op.result);
      value_width.push_back(s.width);
    }
    steps.push_back(std::move(s));
  }
  if (g.outputs.size() != 1 || g.outputs[0] != "logits" || steps.empty() || steps.back().op->result != "logits")
    throw RuntimeError("graph output must be %logits, the last op");
  if (vocab_rows <= 0) throw RuntimeError("graph has no embedding");
  quant = load(cuda::quant_act_q8_variant(1));
  if (plan.precise_rows > 0) quant_precise = load(cuda::quant_act_q8_variant(2));
  argmax = load(cuda::argmax_f32_variant());
  top_k = std::make_unique<cuda::TopKSelector>(loader(), opt.device, vocab_rows,
                                               plan.vocab_real > 0 ? std::min(plan.vocab_real, vocab_rows) : vocab_rows,
                                               max_r);

  // Static activation memory: a value lives from its op to its last reader (the output to the end); a value
  // takes the best-fitting region freed before its op, else a new one.
  const size_t n_values = value_names.size();
  std::vector<int64_t> last_use(n_values, -1), bytes(n_values, 0);
  for (size_t i = 0; i < steps.size(); ++i)
    for (int a : steps[i].args) last_use[(size_t)a] = (int64_t)i;
  last_use[(size_t)steps.back().result] = (int64_t)steps.size();
  // A group's head writes every member's output (single-row steps): members' regions must stay theirs from the
  // head to the last member, even when a member's result is never read.
  for (const MatmulGroup& grp : groups) {
    int64_t last_member = 0;
    for (int mi : grp.members) last_member = std::max<int64_t>(last_member, mi);
    for (int mi : grp.members) {
      const size_t r = (size_t)steps[(size_t)mi].result;
      last_use[r] = std::max(last_use[r], last_member);
    }
  }
  struct Region {
    int64_t offset, bytes, free_after;
  };
  std::vector<Region> regions;
  int64_t arena_bytes = 0;
  std::vector<int64_t> offset(n_values, -1);
  for (size_t i = 0; i < steps.size(); ++i) {
    const CudaStep& s = steps[i];
    if (s.result < 0) continue;
    const int64_t need = align_up((s.rows_result ? max_r : max_t) * s.width * 4, 256);
    bytes[(size_t)s.result] = need;
    Region* best = nullptr;
    for (auto& r : regions)
      if (r.free_after < (int64_t)i && r.bytes >= need && (!best || r.bytes < best->bytes)) best = &r;
    if (!best) {
      regions.push_back({arena_bytes, need, -1});
      arena_bytes += need;
      best = &regions.back();
    }
    best->free_after = std::max<int64_t>(last_use[(size_t)s.result], (int64_t)i);
    offset[(size_t)s.result] = best->offset;
  }
  arena = cuda::DeviceBuffer<char>(opt.device, (size_t)std::max<int64_t>(arena_bytes, 256), "activation arena");
  values.assign(n_values, nullptr);
  for (size_t v = 0; v < n_values; ++v)
    if (offset[v] >= 0) values[v] = reinterpret_cast<float*>(arena.data() + offset[v]);

  tokens_dev = cuda::DeviceBuffer<int32_t>(opt.device, (size_t)max_t, "step tokens");
  pos_dev = cuda::DeviceBuffer<int32_t>(opt.device, (size_t)max_t, "step positions");
  rows_dev = cuda::DeviceBuffer<int32_t>(opt.device, (size_t)max_r, "step output rows");
  argmax_dev = cuda::DeviceBuffer<int32_t>(opt.device, (size_t)max_r, "argmax");
  xq = cuda::DeviceBuffer<int8_t>(opt.device, (size_t)(max_t * max_k), "quantized matmul input");
  xd = cuda::DeviceBuffer<float>(opt.device, (size_t)(max_t * max_k / 32), "quantized matmul input scales");
  if (plan.precise_rows > 0)
    xq2 = cuda::DeviceBuffer<int8_t>(opt.device, (size_t)(std::min(max_t, plan.precise_rows) * max_k),
                                     "quantized matmul input, second plane");
  if (workspace_bytes > 0) workspace = cuda::DeviceBuffer<char>(opt.device, workspace_bytes, "gdn/attention workspace");

  for (int64_t i = 0; i < plan.max_sequences; ++i) {
    Slot sl;
    sl.rec = cuda::DeviceBuffer<float>(opt.device, (size_t)std::max<int64_t>(rec_floats, 64), fmt::format("slot {} states", i));
    sl.rec.fill_bytes(0);
    for (const auto& L : state_layout)
      if (L.positional) {
        sl.kv.emplace_back(opt.device, (size_t)L.elements, fmt::format("slot {} {}", i, L.name));
        sl.kv.back().fill_bytes(0);
      }
    slots.push_back(std::move(sl));
  }
  compiler->forbid_jit();  // everything is loaded: a compile from here on would be a bug
}

}  // namespace qrig::runtime
