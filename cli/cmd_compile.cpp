// `qrig compile` (GGUF + rig -> plan directory) and `qrig inspect` (print a plan for people tuning a rig: every
// decision, the kernel of every op kind per range of rows with the cost model's reason, and the bytes per device
// the runtime allocates).
#include <filesystem>
#include <map>

#include <fmt/format.h>

#include "cli/args.h"
#include "cli/commands.h"
#include "cli/model_source.h"
#include "compiler/compile.h"
#ifdef QRIG_HAVE_CUDA
#include <thread>

#include "runtime/cuda/plan_kernels.h"
#endif

namespace qrig::cli {

namespace {

// "k8v3" for q8 keys and t3 values (kernels/kv_format.h's spelling).
std::string kv_spelling(const std::string& k, const std::string& v) {
  auto bits = [](const std::string& f) {
    return f == "f32" ? "32" : f == "f16" ? "16" : f == "q8" ? "8" : f == "t4" ? "4" : f == "t3" ? "3" : "?";
  };
  return std::string("k") + bits(k) + "v" + bits(v);
}

void print_warnings(const ir::Plan& p) {
  for (const auto& n : p.notes)
    if (n.rfind("warning:", 0) == 0) fmt::print(stderr, "qrig: {}\n", n);
}

}  // namespace

ir::Plan load_or_compile_plan(const std::string& path, const LoadOptions& opt) {
  const ModelSource src = resolve_model(path);
  if (src.plan) {
    if (!opt.kv.empty())
      throw UsageError(fmt::format("--kv {}: {} is a plan directory, its cache formats are decided (qrig compile --kv)",
                                   opt.kv, src.path));
    if (opt.draft_tokens >= 0)
      throw UsageError(fmt::format("--draft {}: {} is a plan directory, its draft tokens are decided (qrig compile "
                                   "--draft; a request turns drafting off with \"draft\": false)",
                                   opt.draft_tokens, src.path));
    ir::Plan p = ir::Plan::read(src.path);
    std::string note;
    locate_plan_model(p, src.path, opt.model_override, &note);
    if (!note.empty()) fmt::print(stderr, "qrig: {}\n", note);
    print_warnings(p);
    return p;
  }
  if (!opt.model_override.empty())
    throw UsageError(fmt::format("--model names the model of a plan directory; {} is a model already", path));
  gguf::File f = gguf::File::open(src.path);
  compiler::Rig rig = opt.rig_path.empty() ? compiler::Rig::default_cpu() : compiler::Rig::load(opt.rig_path);
  compiler::CompileOptions co;
  co.context_length = opt.context_length;
  co.max_sequences = opt.max_sequences;
  co.force_backend = opt.backend;
  co.family = opt.family;
  co.precise_rows = opt.precise_rows;
  co.max_logit_rows = opt.max_logit_rows;
  co.ptx_jit = opt.ptx_jit;
  co.kv = opt.kv;
  co.draft_tokens = opt.draft_tokens;
  co.prefix_cache_mib = opt.prefix_cache_mib;
  if (opt.gpu_memory_utilization > 0) co.gpu_memory_utilization = opt.gpu_memory_utilization;
  ir::Plan p = compiler::compile(f, rig, co);
  print_warnings(p);
  return p;
}

std::string backend_for_ngl(const Args& a, const std::string& backend) {
  if (!a.has("--n-gpu-layers")) return backend;
  if (a.get("--n-gpu-layers") != "0")
    throw UsageError(fmt::format("-ngl {}: qrig has no per-layer offload; the rig decides where layers go: --rig RIG.toml "
                                 "(from qrig probe) puts every layer on the GPU, --backend cpu none (-ngl 0)",
                                 a.get("--n-gpu-layers")));
  if (!backend.empty() && backend != "cpu") throw UsageError("-ngl 0 means --backend cpu; --backend says " + backend);
  return "cpu";
}

int cmd_compile(int argc, char** argv) {
  Args a(argc, argv, 2,
         {"--rig", "-o", "--out", "--ctx", "--parallel", "--batch", "--backend", "--gpus", "--precise-rows",
          "--gpu-memory-utilization", "--micro-batch", "--kv", "--draft", "--prefix-cache-mib"},
         {"--no-precompile", "--precise", "--emulate-dp4a", "--no-cuda-graphs", "--no-pdl", "--ptx"},
         {{"-c", "--ctx"}, {"--ctx-size", "--ctx"}, {"-np", "--parallel"}, {"-b", "--batch"}, {"--batch-size", "--batch"}});
  if (a.positional().size() != 1)
    throw UsageError("usage: qrig compile MODEL.gguf|DIR [--rig RIG.toml] -o PLAN_DIR [--ctx N] [--parallel N] [--batch N] "
                     "[--backend cpu|cuda] [--gpus N] [--micro-batch N] [--gpu-memory-utilization F] "
                     "[--kv k16v16|k8v8|k8v4|k8v3|k4v4|k3v3|...] [--draft N] [--prefix-cache-mib N] "
                     "[--precise | --precise-rows N] [--emulate-dp4a] [--no-cuda-graphs] [--no-pdl] [--ptx] [--no-precompile]");
  std::string out = a.get("-o", a.get("--out"));
  if (out.empty()) throw UsageError("qrig compile needs -o PLAN_DIR");
  const ModelSource src = resolve_model(a.positional()[0]);
  if (src.plan) throw UsageError(fmt::format("{} is a plan directory already; compile takes a model (.gguf)", src.path));
  gguf::File f = gguf::File::open(src.path);
  compiler::Rig rig = a.has("--rig") ? compiler::Rig::load(a.get("--rig")) : compiler::Rig::default_cpu();
  compiler::CompileOptions co;
  co.context_length = a.get_int("--ctx", 0);
  co.max_sequences = a.get_int("--parallel", 4);
  co.max_batch_tokens = a.get_int("--batch", 0);
  if (a.has("--batch") && co.max_batch_tokens < 1) throw UsageError("--batch must be at least 1");
  co.force_backend = a.get("--backend");
  co.max_gpus = a.get_int("--gpus", 0);
  if (co.max_gpus < 0) throw UsageError("--gpus must be positive");
  co.micro_batch = a.get_int("--micro-batch", 0);
  if (co.micro_batch < 0) throw UsageError("--micro-batch must be positive");
  if (a.has("--precise") && a.has("--precise-rows")) throw UsageError("give --precise or --precise-rows, not both");
  co.precise_rows = a.has("--precise") ? INT64_MAX : a.get_int("--precise-rows", -1);  // the pass clamps to the step
  if (a.has("--precise-rows") && co.precise_rows < 0) throw UsageError("--precise-rows must be >= 0");
  if (a.has("--emulate-dp4a")) co.family = "dp4a-emulated";
  co.decode_graphs = !a.has("--no-cuda-graphs");
  co.programmatic_launch = !a.has("--no-pdl");
  co.ptx_jit = a.has("--ptx");
  co.gpu_memory_utilization = a.get_float("--gpu-memory-utilization", co.gpu_memory_utilization);
  co.kv = a.get("--kv");
  co.draft_tokens = a.has("--draft") ? a.get_int("--draft", -1) : -1;
  if (a.has("--draft") && co.draft_tokens < 0) throw UsageError("--draft must be 0 (off) .. 4");
  co.prefix_cache_mib = a.get_int("--prefix-cache-mib", -1);
  if (a.has("--prefix-cache-mib") && co.prefix_cache_mib < 0) throw UsageError("--prefix-cache-mib must be >= 0");
  ir::Plan plan = compiler::compile(f, rig, co);
#ifdef QRIG_HAVE_CUDA
  if (plan.backend == "cuda") {
    // Which NVRTC builds the kernels, and for which code target, is this machine's: recorded in the plan.
    try {
      cuda::record_plan_arch(plan);
    } catch (const cuda::KernelError& e) {
      if (!a.has("--no-precompile")) throw;
      plan.notes.push_back(fmt::format("kernels: no NVRTC chosen ({}); the machine that runs the plan chooses",
                                       e.what()));
    }
  }
#endif
  plan.write(out);
  fmt::print("wrote {}/plan.toml and {}/graph.ir ({} ops){} for {} on rig '{}'\n", out, out, plan.graph.ops.size(),
             plan.draft_tokens > 0 ? fmt::format(" and {}/draft.ir ({} ops)", out, plan.draft.ops.size()) : "",
             plan.backend, plan.rig_name);
  for (const auto& n : plan.notes) fmt::print("  {}\n", n);
  if (plan.backend == "cuda" && !a.has("--no-precompile")) {
#ifdef QRIG_HAVE_CUDA
    // NVRTC needs no GPU: the cubins land in the cache the runtime reads, so the first run compiles nothing.
    cuda::KernelCompiler kc;
    const auto r = cuda::precompile_plan_kernels(plan, kc, (int)std::max(1u, std::thread::hardware_concurrency()));
    fmt::print("kernels: {} variants for {} ({} compiled, {} already cached) in {}\n", r.variants, plan.arch_target,
               r.compiled, r.cached, kc.cache().dir().string());
    for (const auto& n : r.notes) fmt::print("  {}\n", n);
#else
    fmt::print("kernels: not precompiled (this build has no CUDA runtime)\n");
#endif
  }
  return 0;
}

int cmd_inspect(int argc, char** argv) {
  Args a(argc, argv, 2, {}, {"--graph"});
  if (a.positional().size() != 1) throw UsageError("usage: qrig inspect PLAN_DIR [--graph]");
  ir::Plan p = ir::Plan::read(a.positional()[0]);
  auto mib = [](int64_t b) { return (double)b / (1024.0 * 1024.0); };
  fmt::print("plan {} (format {}, {})\n", a.positional()[0], p.format, p.compiler_version);
  fmt::print("model     {} ({}, {:.1f} MiB) {}\n", p.model_path, p.arch, mib(p.model_size), p.model_name);
  fmt::print("rig       {}\n", p.rig_name);
  fmt::print("backend   {} {} kernel family {}\n", p.backend, p.arch_target, p.kernel_family);
  if (p.backend == "cuda")
    fmt::print("kernels   {} {} by NVRTC {}\n", p.kernel_target.empty() ? p.arch_target : p.kernel_target,
               p.kernel_code == "ptx" ? "PTX, loaded through the driver's JIT on any newer GPU" : "cubins",
               p.kernel_nvrtc.empty() ? "(chosen where the plan runs)" : p.kernel_nvrtc);
  if (!p.tuning_source.empty()) fmt::print("tuning    {}\n", p.tuning_source);
  fmt::print("context   {} tokens x {} sequences, {} tokens and {} output rows per step\n", p.context_length,
             p.max_sequences, p.max_batch_tokens, p.max_logit_rows);
  fmt::print("gdn       chunk {}, recurrent below {} tokens per sequence\n", p.gdn_chunk, p.gdn_recurrent_below);
  if (p.kernel_family != "reference")
    fmt::print("matmuls   int8 activations: two planes up to {} rows per matmul, one plane above\n", p.precise_rows);
  fmt::print("kv cache  keys {}, values {} ({}), {} bytes per token per sequence\n", p.k_dtype, p.v_dtype,
             kv_spelling(p.k_dtype, p.v_dtype), p.memory.kv_bytes_per_token);
  for (const auto& op : p.graph.ops)
    if (op.kind == ir::OpKind::attention && op.has("query_int8_tokens")) {
      fmt::print("          decode attention: the query in int8 per 32 values (dp4a Q.K over the key codes) in calls "
                 "of <= {} tokens per sequence\n", op.i("query_int8_tokens"));
      break;
    }
  if (!p.memory.kv_fits.empty()) {
    fmt::print("          the longest context per sequence ({} sequences) that fits each format:\n", p.max_sequences);
    fmt::print("          {:<8} {:>13} {:>10}", "kv", "bytes/token", "context");
    for (const auto& d : p.memory.devices) fmt::print(" {:>10}", d.device);
    fmt::print("\n");
    for (const auto& f : p.memory.kv_fits) {
      fmt::print("          {:<8} {:>13} {:>10}", f.kv, f.bytes_per_token, f.context);
      for (int64_t c : f.device_contexts) fmt::print(" {:>10}", c);
      fmt::print("{}\n", f.kv == kv_spelling(p.k_dtype, p.v_dtype) ? "  <- this plan" : "");
    }
  }
  if (p.draft_tokens > 0) {
    std::string kd = "f32", vd = "f32";
    for (const auto& st : p.draft.states) {
      if (st.name.rfind("k.", 0) == 0) kd = ir::dtype_name(st.type.dtype);
      if (st.name.rfind("v.", 0) == 0) vd = ir::dtype_name(st.type.dtype);
    }
    const std::string cache = kv_spelling(kd, vd);
    fmt::print("draft     {} tokens per step from the MTP head ({} ops in draft.ir{}): its cache {}, {} bytes per token, "
               "{:.2f} MiB of rollback states per sequence (why: notes)\n", p.draft_tokens, p.draft.ops.size(),
               p.backend == "cuda" ? "; its kernels: the table's \"draft\" rows" : "", cache,
               p.memory.draft_kv_bytes_per_token, mib(p.memory.draft_rollback_bytes));
    fmt::print("          its own weights {:.2f} MiB (the embedding and lm_head are the main model's){}\n",
               mib(p.memory.draft_weight_bytes),
               p.backend == "cuda" ? fmt::format(", activations {:.2f} MiB (sharing the arena), {:.1f} KiB per "
                                                 "sequence of hidden rows waiting for it",
                                                 mib(p.memory.draft_arena_bytes),
                                                 (double)p.memory.draft_pending_bytes / 1024.0)
                                   : std::string());
  } else
    fmt::print("draft     off (speculative decoding; why: notes)\n");
  if (p.backend == "cuda") fmt::print("decode    CUDA graphs {}\n", p.decode_graphs ? "on" : "off");
  if (p.backend == "cuda")
    fmt::print("launch    {}\n", p.programmatic_launch ? "programmatic dependent launch (sm_90+)" : "plain");
  if (p.placement.size() == 1) {
    fmt::print("placement {}: layers {}-{}\n", p.placement[0].device, p.placement[0].first_layer,
               p.placement[0].last_layer);
  } else {
    fmt::print("pipeline  {} stages; prefill in micro-batches of {} tokens, decode in groups of >= {} sequences; "
               "bridges: f32 rows through {:.1f} MiB of pinned host memory\n",
               p.placement.size(), p.pipeline_micro_batch, p.pipeline_decode_group_rows,
               mib(p.memory.bridge_host_bytes));
    fmt::print("\n{:<8} {:>4} {:>9} {:>7} {:>13} {:>13} {:>11} {:>11} {:>11} {:>11}\n", "stage", "gpu", "layers",
               "count", "prefill us/t", "decode us/t", "weights", "states", "total", "budget");
    for (const auto& pl : p.placement) {
      const ir::DeviceMemory* d = nullptr;
      for (const auto& m : p.memory.devices)
        if (m.device == pl.device) d = &m;
      fmt::print("{:<8} {:>4} {:>9} {:>7} {:>13.2f} {:>13.1f} {:>11} {:>11} {:>11} {:>11}\n", pl.device,
                 pl.ordinal >= 0 ? std::to_string(pl.ordinal) : "-",
                 fmt::format("{}-{}", pl.first_layer, pl.last_layer), pl.last_layer - pl.first_layer + 1,
                 pl.prefill_us_per_token, pl.decode_us_per_token, d ? fmt::format("{:.1f}M", mib(d->weights)) : "-",
                 d ? fmt::format("{:.1f}M", mib(d->states)) : "-", d ? fmt::format("{:.1f}M", mib(d->total)) : "-",
                 d ? fmt::format("{:.1f}M", mib(d->budget)) : "-");
    }
    fmt::print("(per stage: the GPU it runs on, its layers (the first also holds the token embedding, the last the "
               "output head), the placement's cost model per token, MiB planned on its device)\n");
  }
  fmt::print("memory    weights {:.1f} MiB, kv {:.1f} KiB/token, state {:.2f} MiB/sequence, activations {:.1f} MiB, "
             "snapshots {} x {:.2f} MiB per slot, budget {:.1f} MiB\n",
             mib(p.memory.weight_bytes), (double)p.memory.kv_bytes_per_token / 1024.0,
             mib(p.memory.state_bytes_per_sequence), mib(p.memory.activation_bytes), p.memory.snapshots_per_slot,
             mib(p.memory.snapshot_bytes), mib(p.memory.budget_bytes));
  {
    const ir::PrefixCachePolicy& pc = p.prefix_cache;
    if (pc.mode == "shared")
      fmt::print("prefix    shared by all slots, {:.1f} MiB (KV spans + snapshots, LRU); ", mib(pc.budget_bytes));
    else if (pc.mode == "off")
      fmt::print("prefix    off: no reuse (--prefix-cache-mib 0); ");
    else
      fmt::print("prefix    per slot (its own prompt-end snapshots and last output; no shared index here); ");
    fmt::print("cut every {} tokens, at message markers: {}\n", pc.chunk, pc.markers.empty() ? "none" : pc.markers);
    fmt::print("          snapshots at: the first message's end and next header (system prompt, tools), the last\n"
               "          header (start of the assistant turn), every {} tokens, and one token before the prompt's end\n",
               pc.chunk);
  }
  if (!p.memory.devices.empty()) {
    fmt::print("\n{:<8} {:>11} {:>11} {:>9} {:>9} {:>11} {:>11} {:>11} {:>11} {:>11}\n", "device", "weights", "arena", "io",
               "sampling", "states", "snapshots", "total", "budget", "headroom");
    for (const auto& d : p.memory.devices)
      fmt::print("{:<8} {:>11} {:>11} {:>9} {:>9} {:>11} {:>11} {:>11} {:>11} {:>11}\n", d.device, d.weights, d.arena,
                 d.io, d.sampling, d.states, d.snapshots, d.total, d.budget, d.budget - d.total);
    fmt::print("(bytes the runtime allocates on each device; snapshots are the prefix cache's budget, taken on demand;\n"
               " budget: what the plan may use of the device{}; headroom: budget - total, left unused)\n",
               p.backend == "cuda" ? ", the compile's --gpu-memory-utilization of its memory (notes below); the rest is "
                                     "the runtime's (CUDA context, kernels, graphs)"
                                   : " (the rig's memory_gib)");
  }
  if (!p.kernels.empty()) {
    fmt::print("\nkernels (op, shape, rows, variants, reason; ops = how many ops of the graph share the choice):\n");
    for (const auto& k : p.kernels)
      fmt::print("  {:<13} {:<22} {:>5}-{:<5} x{:<3} {}\n      {}\n", k.op, k.shape, k.first_rows, k.last_rows, k.ops,
                 k.variants, k.reason);
  } else {
    std::map<std::string, int> kinds;
    for (const auto& op : p.graph.ops) ++kinds[ir::op_name(op.kind)];
    fmt::print("ops      ");
    for (const auto& [k, n] : kinds) fmt::print(" {} x{}", k, n);
    fmt::print("\n");
  }
  fmt::print("\nnotes:\n");
  for (const auto& n : p.notes) fmt::print("  - {}\n", n);
  if (a.has("--graph")) fmt::print("\n{}", ir::print(p.graph));
  if (a.has("--graph") && p.draft_tokens > 0) fmt::print("\n{}", ir::print(p.draft));
  return 0;
}

}  // namespace qrig::cli
