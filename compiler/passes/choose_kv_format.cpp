// Pass: the element formats of the KV cache, keys and values separately (kernels/kv_format.h; docs/kv-cache.md).
// It runs in two halves because the choice depends on memory the later passes lay out:
//  - choose_kv_format (in pass order): the candidates, most precise first: the backend's own cache (fp32 on the
//    CPU reference, which is exact; fp16 for the dp4a family), then k8v8, k8v4, k8v3, k4v4, k4v3, k3v3 (keys
//    never less precise than values: keys are the more fragile, KERNELS.md), or the one pair `--kv` forces; the
//    states (and the kv_write / attention ops' k_format / v_format) get the first candidate meanwhile.
//  - settle_kv_format (called by the memory pass once it knows what every device has left for the caches and
//    has tabulated the context each pair allows): the most precise candidate at which the requested context
//    (without one, the model's trained length) fits; when none does, a requested context is refused naming
//    what would fit, and without one the most compact candidate is taken (the most context).
// CUDA plans choose among the same pairs (f16 is their own cache; f32 has no CUDA kernels and is refused by
// name). Their kernel pass runs before the memory pass settles the format, so applying a pair also renames the
// cache kernels the plan names (attn_decode/attn_prefill/merge/kv_write carry the formats in their names), in the
// kernel and decode_kernel attributes.
// With the pair comes the decode attention's query precision: over q8/t4/t3 keys the dp4a family (and the CPU's
// dp4a-emulated family) quantizes the query to int8 per 32 values in decode calls (at most
// attention_decode_max_tokens tokens per sequence; the attention op's query_int8_tokens), which lets
// attn_decode_dp4a take Q.K by dp4a over the key codes and read the cache at the memory's rate; --precise (two
// planes in every matmul) keeps the fp32 query (attn_decode). Prefill always takes the fp32 query.
#include <map>

#include <fmt/format.h>

#include "ir/kernel_attr.h"
#include "kernels/attention.h"

#include "compiler/passes/passes.h"

namespace qrig::compiler::passes {

namespace {

using kernels::KvFormat;
using kernels::KvPair;

ir::DType to_dtype(KvFormat f) {
  switch (f) {
    case KvFormat::f32: return ir::DType::f32;
    case KvFormat::f16: return ir::DType::f16;
    case KvFormat::q8: return ir::DType::q8;
    case KvFormat::t4: return ir::DType::t4;
    case KvFormat::t3: return ir::DType::t3;
  }
  return ir::DType::f32;
}

// The attention layers' head dim (every cache row is kv_heads vectors of it); 0 without attention layers.
int64_t cache_head_dim(const ir::Plan& p) {
  for (const auto& op : p.graph.ops)
    if (op.kind == ir::OpKind::attention) return op.i("head_dim");
  return 0;
}

// Whether a format can hold the model's head vectors (q8: 32-value blocks, t4/t3: 256-value rotations).
bool holds(KvFormat f, int64_t hd) {
  if (f == KvFormat::q8) return hd % kernels::kKvQ8Block == 0;
  if (kernels::kv_format_rotated(f)) return hd % kernels::kKvRotBlock == 0;
  return true;
}

std::string describe(KvPair pr) {
  return fmt::format("{} ({} keys, {} values)", kernels::kv_pair_name(pr), kernels::kv_format_name(pr.k),
                     kernels::kv_format_name(pr.v));
}

std::optional<KvPair> forced(const CompileContext& cx) {
  if (cx.options.kv.empty()) return std::nullopt;
  auto pr = kernels::parse_kv_pair(cx.options.kv);
  if (!pr)
    throw CompileError(fmt::format("--kv '{}' names no key/value cache formats: k<bits>v<bits> with bits 16 (f16), 8 "
                                   "(q8), 4 (t4) or 3 (t3), or 32 (f32, the CPU reference's); e.g. k16v16, k8v3",
                                   cx.options.kv));
  return pr;
}

}  // namespace

// The pairs the backend's executor runs, most precise first (the forced pair alone when --kv is given).
std::vector<KvPair> kv_candidates(const CompileContext& cx) {
  if (auto f = forced(cx)) return {*f};
  std::vector<KvPair> out;
  for (const KvPair& pr : kv_table_pairs(cx))
    if (cx.plan.backend != "cuda" || (pr.k != KvFormat::f32 && pr.v != KvFormat::f32)) out.push_back(pr);
  return out;
}

namespace {

// Whether decode attention over these keys takes the int8 query (see the header).
bool int8_query(const CompileContext& cx, KvPair pr) {
  return cx.plan.kernel_family != "reference" && kernels::attention_int8_query(pr) &&
         cx.options.precise_rows < cx.options.max_batch_tokens;
}

// The pair's element types on a graph's key and value caches and its kv_write / attention ops (their formats, the
// int8 query of the decode calls where `int8`, and the cache kernels they name renamed to the pair's: `renamed`
// collects old name -> new name).
void apply_to_graph(ir::Graph& g, KvPair pr, bool int8, std::map<std::string, std::string>& renamed) {
  const std::string k = kernels::kv_format_name(pr.k), v = kernels::kv_format_name(pr.v);
  for (auto& st : g.states) {
    if (st.name.rfind("k.", 0) == 0) st.type.dtype = to_dtype(pr.k);
    if (st.name.rfind("v.", 0) == 0) st.type.dtype = to_dtype(pr.v);
  }
  auto rename = [&](std::vector<ir::LaunchRange> ranges) {
    for (auto& r : ranges)
      for (auto& part : r.parts)
        for (auto& name : part) {
          const std::string to = kernels::with_kv_formats(kernels::parse_variant(name), pr, int8).name;
          renamed[name] = to;
          name = to;
        }
    return ir::print_launch_ranges(ranges);
  };
  for (auto& op : g.ops)
    if (op.kind == ir::OpKind::kv_write || op.kind == ir::OpKind::attention) {
      op.set("k_format", k);
      op.set("v_format", v);
      if (op.kind == ir::OpKind::attention && int8)
        op.set("query_int8_tokens", kernels::attention_decode_max_tokens(op.i("heads") / op.i("kv_heads")));
      else if (op.kind == ir::OpKind::attention)
        op.erase("query_int8_tokens");
      if (op.has("kernel")) op.set("kernel", rename(ir::parse_launch_ranges(op.s("kernel"))));
      if (op.has("decode_kernel")) op.set("decode_kernel", rename(ir::parse_launch_ranges(op.s("decode_kernel"))));
    }
}

// CUDA plans that draft: the MTP head's own cache takes the plan's pair too (its kernels are the main model's
// attention kernels). The CPU head keeps an f32 cache whatever the pair (the draft's precision changes only
// acceptance, never the output).
bool draft_follows_kv(const ir::Plan& p) { return p.backend == "cuda" && !p.draft.ops.empty(); }

void apply(CompileContext& cx, KvPair pr) {
  ir::Plan& p = cx.plan;
  p.k_dtype = kernels::kv_format_name(pr.k);
  p.v_dtype = kernels::kv_format_name(pr.v);
  std::map<std::string, std::string> renamed;  // variant names of the previous formats -> these formats'
  const bool int8 = int8_query(cx, pr);
  apply_to_graph(p.graph, pr, int8, renamed);
  if (draft_follows_kv(p)) apply_to_graph(p.draft, pr, int8, renamed);
  for (auto& kc : p.kernels) {  // the kernel table's rows: names between ',' and '+'
    std::string out, name;
    for (size_t i = 0; i <= kc.variants.size(); ++i) {
      const char c = i < kc.variants.size() ? kc.variants[i] : '\0';
      if (c == ',' || c == '+' || c == '\0') {
        auto it = renamed.find(name);
        out += it == renamed.end() ? name : it->second;
        if (c) out += c;
        name.clear();
      } else {
        name += c;
      }
    }
    kc.variants = out;
  }
}

}  // namespace

std::vector<KvPair> kv_table_pairs(const CompileContext& cx) {
  const ir::Plan& p = cx.plan;
  const int64_t hd = cache_head_dim(p);
  const KvFormat own = p.kernel_family == "reference" ? KvFormat::f32 : KvFormat::f16;
  std::vector<KvPair> all = {{own, own},
                             {KvFormat::q8, KvFormat::q8},
                             {KvFormat::q8, KvFormat::t4},
                             {KvFormat::q8, KvFormat::t3},
                             {KvFormat::t4, KvFormat::t4},
                             {KvFormat::t4, KvFormat::t3},
                             {KvFormat::t3, KvFormat::t3}};
  if (auto f = forced(cx)) {
    bool listed = false;
    for (const auto& pr : all) listed |= pr == *f;
    if (!listed) all.insert(all.begin(), *f);
  }
  std::vector<KvPair> out;
  for (const auto& pr : all)
    if (hd == 0 || (holds(pr.k, hd) && holds(pr.v, hd))) out.push_back(pr);
  return out;
}

void choose_kv_format(CompileContext& cx) {
  ir::Plan& p = cx.plan;
  const int64_t hd = cache_head_dim(p);
  if (auto f = forced(cx)) {
    const bool cuda = p.backend == "cuda";
    for (KvFormat x : {f->k, f->v}) {
      if (cuda && x == KvFormat::f32)
        throw CompileError(fmt::format(
            "--kv {}: f32 caches are the CPU reference's; CUDA plans run f16, q8, t4 or t3 caches (e.g. k16v16, "
            "k8v3; --backend cpu for k32v32)", cx.options.kv));
      if (hd > 0 && !holds(x, hd))
        throw CompileError(fmt::format("--kv {}: a {} cache cannot hold head vectors of {} values (q8: a multiple of "
                                       "32, t4/t3: of 256)", cx.options.kv, kernels::kv_format_name(x), hd));
    }
  }
  const auto cands = kv_candidates(cx);
  apply(cx, cands.front());
  std::string list;
  for (const auto& pr : cands) list += (list.empty() ? "" : ", ") + kernels::kv_pair_name(pr);
  p.notes.push_back(fmt::format("kv cache: {}; candidates {}", cx.options.kv.empty() ? "chosen by memory below" : "forced by --kv",
                                list));
}

void draft_kv_format(CompileContext& cx) {
  ir::Plan& p = cx.plan;
  if (!draft_follows_kv(p)) return;
  std::map<std::string, std::string> renamed;
  const KvPair pr{*kernels::parse_kv_format(p.k_dtype), *kernels::parse_kv_format(p.v_dtype)};
  apply_to_graph(p.draft, pr, int8_query(cx, pr), renamed);
}

void settle_kv_format(CompileContext& cx) {
  ir::Plan& p = cx.plan;
  const auto& fits = p.memory.kv_fits;
  auto context_of = [&](KvPair pr) {
    for (const auto& f : fits)
      if (f.kv == kernels::kv_pair_name(pr)) return f.context;
    throw CompileError(fmt::format("internal: the memory pass did not size kv {}", kernels::kv_pair_name(pr)));
  };
  const auto cands = kv_candidates(cx);
  const bool requested = cx.options.context_length > 0;
  const int64_t target = requested ? cx.options.context_length : std::max<int64_t>(1, cx.params.context_length);
  std::optional<KvPair> chosen;
  for (const auto& pr : cands)
    if (context_of(pr) >= target) {
      chosen = pr;
      break;
    }
  std::string why;
  if (chosen) {
    why = cands.size() == 1 ? std::string("the only candidate")
                            : fmt::format("the most precise candidate at which {} tokens x {} sequences fit", target,
                                          p.max_sequences);
  } else if (requested && context_of(cands.back()) > 256) {  // else the memory pass says what does not fit
    std::string table;
    for (const auto& f : fits) table += fmt::format("{}{} {}", table.empty() ? "" : ", ", f.kv, f.context);
    std::string runs;
    for (const auto& pr : cands) runs += (runs.empty() ? "" : ", ") + kernels::kv_pair_name(pr);
    throw CompileError(fmt::format(
        "context length {} x {} sequences does not fit with {} (the most tokens per sequence each key/value format "
        "allows: {})", target, p.max_sequences, runs, table));
  } else {
    chosen = cands.back();
    why = cands.size() == 1 ? std::string("the only candidate")
                            : fmt::format("no candidate reaches the model's {} tokens: the most compact one", target);
  }
  apply(cx, *chosen);
  p.notes.push_back(fmt::format("kv cache: {}: {}", describe(*chosen), why));
  if (int8_query(cx, *chosen))
    p.notes.push_back("attention: decode calls quantize the query to int8 per 32 values (dp4a Q.K over the q8/t4/t3 "
                      "key codes: attn_decode_dp4a on a GPU); prefill keeps it in fp32; --precise keeps it in fp32 "
                      "everywhere");
}

}  // namespace qrig::compiler::passes
