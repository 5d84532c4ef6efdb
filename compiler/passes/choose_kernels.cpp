// Pass: the kernel variants of a CUDA plan. For every op, per range of rows (a step's tokens, its output rows,
// or one sequence's tokens for ops on a sequence's state), the variants that run it, chosen by the kernel
// library's choice functions (kernels/) with the plan's tuning data, written as the op's `kernel` attribute
// (ir/kernel_attr.h) and, with the cost model's reason, into the plan's kernel table (`qrig inspect`). The ops on a
// sequence's state (conv1d_silu, gdn, kv_write, attention) also get a `decode_kernel` attribute in plans of several
// sequences: per number of sequences of a decode step (one token each), what runs them: for one sequence its own
// kernels, for 2..min(sequences, rows per call) the batched variants that run all of the step's sequences in one
// launch (the table lists them with the shape's ", per sequences" rows). The greedy argmax and the sampling
// candidates' kernels are graph attributes. The runtime loads exactly these.
#include <algorithm>
#include <map>
#include <tuple>

#include <fmt/format.h>

#include "compiler/passes/passes.h"
#include "ir/kernel_attr.h"
#include "kernels/attention.h"
#include "kernels/gdn.h"
#include "kernels/matmul.h"
#include "kernels/pointwise.h"
#include "kernels/sampling.h"

namespace qrig::compiler::passes {

namespace {

using kernels::KernelRange;
using kernels::Variant;

std::vector<std::string> names(const std::vector<Variant>& vs) {
  std::vector<std::string> out;
  for (const Variant& v : vs) out.push_back(v.name);
  return out;
}

std::vector<ir::LaunchRange> to_ir(const std::vector<KernelRange>& rs) {
  std::vector<ir::LaunchRange> out;
  for (const KernelRange& r : rs) {
    ir::LaunchRange l{r.first, r.last, {}};
    for (const auto& part : r.parts) l.parts.push_back(names(part));
    out.push_back(std::move(l));
  }
  return out;
}

KernelRange all_rows(int64_t max_rows, Variant v, std::string why) { return {1, max_rows, {{std::move(v)}}, std::move(why)}; }

// Two planes up to precise_rows rows, one above: the rule of the quantizing ops and the matmuls.
template <class F>
std::vector<KernelRange> by_planes(int64_t precise_rows, int64_t max_rows, F for_planes) {
  std::vector<KernelRange> out;
  if (precise_rows > 0)
    for (auto& r : for_planes(1, std::min(precise_rows, max_rows), 2)) out.push_back(std::move(r));
  if (max_rows > precise_rows)
    for (auto& r : for_planes(precise_rows + 1, max_rows, 1)) out.push_back(std::move(r));
  return out;
}

std::string planes_reason(int64_t planes) {
  return planes == 2 ? "two int8 planes (~15 bits): steps of at most precise_rows rows"
                     : "one int8 plane (llama.cpp's numerics): larger steps";
}

struct Table {
  std::map<std::tuple<std::string, std::string, int64_t, int64_t, std::string>, ir::KernelChoice> rows;
  void add(const std::string& op, const std::string& shape, const KernelRange& r, const ir::LaunchRange& l) {
    std::string variants = ir::print_launch_ranges({l});
    variants = variants.substr(variants.find(':') + 1);
    auto key = std::make_tuple(op, shape, r.first, r.last, variants);
    auto [it, fresh] = rows.try_emplace(key, ir::KernelChoice{op, shape, 0, r.first, r.last, variants, r.reason});
    ++it->second.ops;
  }
};

// The op's key and value cache formats (the KV-format pass sets them; f16 for a graph without them).
kernels::KvPair op_kv_pair(const ir::Op& op) {
  kernels::KvPair kv;
  if (op.has("k_format")) {
    const auto k = kernels::parse_kv_format(op.s("k_format")), v = kernels::parse_kv_format(op.s("v_format"));
    if (!k || !v) throw CompileError(fmt::format("{}: unknown cache formats {}/{}", op.describe(), op.s("k_format"),
                                                 op.s("v_format")));
    kv = {*k, *v};
  }
  return kv;
}

// The kernels of one graph's ops into their attributes and the table. The draft head's graph (draft = true): its
// table rows' shapes start with "draft", and it has no decode_kernel (the head runs one sequence per call).
void choose_graph_kernels(CompileContext& cx, ir::Graph& g, bool draft, Table& table) {
  ir::Plan& p = cx.plan;
  const int sms = (int)p.device_sms;
  const kernels::Tuning& tun = cx.tuning;
  const int64_t max_t = p.rows_per_call(), max_r = p.max_logit_rows;  // rows of one call (a pipeline's micro-batch)
  const int64_t P = p.precise_rows;
  // The two-plane rule of a quantizing op (quantize, rmsnorm_quant and the fusions into them) or a matmul: its own
  // precise_rows (quantize_matmul_inputs gives block-type matmuls and their inputs one plane), the plan's where it
  // has none.
  auto op_precise = [&](const ir::Op& op) { return op.has("precise_rows") ? op.i("precise_rows") : P; };
  // The most sequences a decode step holds (the draft head: one per call).
  const int64_t decode_seqs = draft ? 1 : std::min(p.max_sequences, max_t);
  for (ir::Op& op : g.ops) {
    const int64_t rows = op.has_result() && !op.types[0].shape.empty() && op.types[0].shape[0] == ir::kRows ? max_r : max_t;
    const int64_t width = op.has_result() && !op.types[0].shape.empty() ? op.types[0].shape.back() : 0;
    auto in_width = [&](size_t a) -> int64_t {
      const ir::Type* t = g.type_of(op.args.at(a));
      if (!t || t->shape.empty() || t->shape.back() <= 0)
        throw CompileError(fmt::format("{}: argument %{} has no fixed row length", op.describe(), op.args[a]));
      return t->shape.back();
    };
    std::vector<KernelRange> ranges, decode;  // decode: per sequences of a decode step (decode_kernel)
    std::string shape;
    try {
      switch (op.kind) {
        case ir::OpKind::embed:
          shape = fmt::format("d {}", width);
          if (const gguf::TensorInfo* t = cx.file.find_tensor(op.s("weight"));
              t && kernels::wq_dp4a_type((int64_t)t->type))
            ranges = {all_rows(rows, kernels::embed_wq_variant((int64_t)t->type, width),
                               fmt::format("the {} embedding rows dequantized as the reference does, one block per "
                                           "token", gguf::tensor_type_name(t->type)))};
          else
            ranges = {all_rows(rows, kernels::embed_q8_0_variant(width), "the Q8_0 embedding rows, one block per token")};
          break;
        case ir::OpKind::rmsnorm:
          shape = fmt::format("d {}", width);
          ranges = {all_rows(rows, kernels::rmsnorm_f32_variant(width), "one block per row")};
          break;
        case ir::OpKind::rmsnorm_quant:
          shape = fmt::format("d {}", width);
          ranges = by_planes(op_precise(op), rows, [&](int64_t lo, int64_t hi, int64_t planes) {
            return std::vector<KernelRange>{{lo, hi, {{kernels::rmsnorm_f32_variant(width, planes)}},
                                             "normalise and quantize in one kernel, " + planes_reason(planes)}};
          });
          break;
        case ir::OpKind::add_rmsnorm_quant:
          shape = fmt::format("d {}", width);
          ranges = by_planes(op_precise(op), rows, [&](int64_t lo, int64_t hi, int64_t planes) {
            return std::vector<KernelRange>{{lo, hi, {{kernels::add_rmsnorm_q8_variant(width, planes)}},
                                             "residual add, then normalise and quantize the sum, in one kernel, " +
                                                 planes_reason(planes)}};
          });
          break;
        case ir::OpKind::quantize:
          shape = fmt::format("d {}", width);
          ranges = by_planes(op_precise(op), rows, [&](int64_t lo, int64_t hi, int64_t planes) {
            return std::vector<KernelRange>{{lo, hi, {{kernels::quant_act_q8_variant(planes)}}, planes_reason(planes)}};
          });
          break;
        case ir::OpKind::matmul: {
          const int64_t k = in_width(0);
          shape = fmt::format("{}->{}", k, width);
          if (const int64_t wt = kernels::wq_type_of_format(op.s("format")); wt >= 0) {
            shape += " " + op.s("format");
            ranges = by_planes(op_precise(op), rows, [&](int64_t lo, int64_t hi, int64_t planes) {
              return kernels::choose_matmul_wq(wt, k, width, lo, hi, planes, sms, tun.matmul);
            });
            break;
          }
          if (op.s("format") != "q8_0")
            throw CompileError(fmt::format("{}: weight {} is {}; the CUDA dp4a family has no kernels for it (use the "
                                           "CPU backend)", op.describe(), op.s("weight"), op.s("format")));
          ranges = by_planes(op_precise(op), rows, [&](int64_t lo, int64_t hi, int64_t planes) {
            return kernels::choose_matmul_q8_0(k, width, lo, hi, sms, planes, tun.matmul);
          });
          break;
        }
        case ir::OpKind::matmul_stack: {
          const int64_t k = in_width(0);
          const auto& formats = op.strs("formats");
          if (formats.empty() || formats.size() != op.types.size())
            throw CompileError(fmt::format("{}: {} formats for {} results", op.describe(), formats.size(), op.types.size()));
          for (const auto& f : formats)
            if (f != formats[0])
              throw CompileError(fmt::format("{}: stacked weights must share their format, not {} and {}",
                                             op.describe(), formats[0], f));
          const int64_t wt = kernels::wq_type_of_format(formats[0]);
          if (formats[0] != "q8_0" && wt < 0)
            throw CompileError(fmt::format("{}: stacked weights are {}; the CUDA dp4a family stacks Q8_0 and the block "
                                           "types it decodes", op.describe(), formats[0]));
          const int64_t pr = op_precise(op);
          int64_t total = 0;
          std::vector<int64_t> member_rows;
          shape = fmt::format("{}->", k);
          for (size_t m = 0; m < op.types.size(); ++m) {
            member_rows.push_back(op.types[m].shape.back());
            total += member_rows.back();
            shape += (m ? "|" : "") + std::to_string(member_rows.back());
          }
          if (wt >= 0) {
            shape += " " + formats[0];
            kernels::check_wq_stack(wt, k, member_rows);  // its members' views (KernelError -> CompileError below)
          }
          // One row: one GEMV over the stacked weights (Q8_0: its GEMV; the block types: the type's one-row kernel
          // for the stacked shape). More: every member's own choice, on the union of their ranges.
          if (wt >= 0)
            ranges.push_back(kernels::choose_matmul_stack_wq(wt, k, total, (int64_t)op.types.size(),
                                                             pr >= 1 ? 2 : 1, sms, tun.matmul));
          else
            ranges.push_back({1, 1, {{kernels::gemv_q8_0_variant(k, pr >= 1 ? 2 : 1, tun.matmul)}},
                              fmt::format("one row: one GEMV over the {} stacked weights, each member's rows to its "
                                          "own result", op.types.size())});
          if (rows >= 2) {
            std::vector<std::vector<KernelRange>> members;
            std::vector<int64_t> cuts;
            for (const auto& t : op.types) {
              members.push_back(by_planes(pr, rows, [&](int64_t lo, int64_t hi, int64_t planes) {
                if (std::max<int64_t>(lo, 2) > hi) return std::vector<KernelRange>{};
                if (wt >= 0)
                  return kernels::choose_matmul_wq(wt, k, t.shape.back(), std::max<int64_t>(lo, 2), hi, planes, sms,
                                                   tun.matmul);
                return kernels::choose_matmul_q8_0(k, t.shape.back(), std::max<int64_t>(lo, 2), hi, sms, planes,
                                                   tun.matmul);
              }));
              for (const auto& r : members.back()) cuts.push_back(r.first);
            }
            std::sort(cuts.begin(), cuts.end());
            cuts.erase(std::unique(cuts.begin(), cuts.end()), cuts.end());
            for (size_t c = 0; c < cuts.size(); ++c) {
              const int64_t lo = cuts[c], hi = c + 1 < cuts.size() ? cuts[c + 1] - 1 : rows;
              KernelRange r{lo, hi, {}, {}};
              for (const auto& mr : members)
                for (const auto& x : mr)
                  if (lo >= x.first && lo <= x.last) {
                    r.parts.push_back(x.parts[0]);
                    if (r.reason.empty()) r.reason = "each member's own kernel on its slice of the stack: " + x.reason;
                  }
              ranges.push_back(std::move(r));
            }
          }
          break;
        }
        case ir::OpKind::add:
          ranges = {all_rows(rows, kernels::add_f32_variant(), "float4 grid-stride")};
          break;
        case ir::OpKind::swiglu:
          ranges = {all_rows(rows, kernels::swiglu_f32_variant(), "float4 grid-stride")};
          break;
        case ir::OpKind::swiglu_quant:
          shape = fmt::format("d {}", width);
          ranges = by_planes(op_precise(op), rows, [&](int64_t lo, int64_t hi, int64_t planes) {
            return std::vector<KernelRange>{{lo, hi, {{kernels::swiglu_q8_variant(planes)}},
                                             "silu(gate) * up quantized in one kernel, " + planes_reason(planes)}};
          });
          break;
        case ir::OpKind::conv1d_silu: {
          const ir::State* st = g.state(op.s("state"));
          if (!st || st->type.shape.size() != 2)
            throw CompileError(fmt::format("{}: no [K-1][C] state", op.describe()));
          shape = fmt::format("taps {}", st->type.shape[0] + 1);
          ranges = {all_rows(max_t, kernels::conv1d_silu_f32_variant(st->type.shape[0] + 1), "one thread per channel")};
          if (decode_seqs >= 2) decode = kernels::choose_conv1d_silu_decode(st->type.shape[0] + 1, decode_seqs);
          break;
        }
        case ir::OpKind::gdn: {
          const kernels::GdnDims d{op.i("key_heads"), op.i("value_heads"), op.i("key_dim"), op.i("value_dim")};
          shape = fmt::format("heads {}/{} dims {}/{}", d.Hk, d.Hv, d.dk, d.dv);
          ranges = kernels::choose_gdn(d, op.i("chunk"), max_t, tun);
          if (decode_seqs >= 2) decode = kernels::choose_gdn_decode(d, op.i("chunk"), decode_seqs, tun);
          break;
        }
        case ir::OpKind::gated_rmsnorm:
          shape = fmt::format("head_dim {}", op.i("head_dim"));
          ranges = {all_rows(rows, kernels::gated_rmsnorm_f32_variant(op.i("head_dim")), "one warp per token and head")};
          break;
        case ir::OpKind::head_rmsnorm:
          shape = fmt::format("head_dim {}", op.i("head_dim"));
          ranges = {all_rows(rows, kernels::head_rmsnorm_f32_variant(op.i("head_dim")), "one warp per token and head")};
          break;
        case ir::OpKind::rope:
          shape = fmt::format("head_dim {} rotated {}", op.i("head_dim"), op.i("rope_dims"));
          ranges = {all_rows(rows, kernels::rope_neox_f32_variant(op.i("head_dim"), op.i("rope_dims")),
                             "one block per token, fp64 angles")};
          break;
        case ir::OpKind::kv_write: {
          const kernels::KvPair kv = op_kv_pair(op);
          ranges = {all_rows(max_t, kernels::kv_write_variant(kv),
                             "rows appended at the sequence's positions in the KV-format pass's formats")};
          if (decode_seqs >= 2) decode = kernels::choose_kv_write_decode(kv, decode_seqs);
          break;
        }
        case ir::OpKind::attention: {
          const kernels::AttentionDims d{op.i("heads"), op.i("kv_heads"), op.i("head_dim")};
          shape = fmt::format("heads {}/{} dim {}", d.Hq, d.Hkv, d.hd);
          // The context is fixed by the memory pass after this one: plan for the most it may allow.
          const int64_t context = std::max(cx.options.context_length, cx.params.context_length);
          const kernels::AttentionChoice c =
              kernels::choose_attention(d, context, std::min(max_t, context), sms, tun, op_kv_pair(op));
          ranges = c.ranges;
          op.set("split_ctas", std::vector<int64_t>{c.ctas.decode1, c.ctas.decode_n, c.ctas.prefill});
          if (decode_seqs >= 2) decode = kernels::choose_attention_decode(d, decode_seqs, op_kv_pair(op));
          break;
        }
        case ir::OpKind::gather_rows:
        case ir::OpKind::bridge:
          break;  // device-to-device copies (of the chosen rows; of the rows a bridge brought), no kernel
        case ir::OpKind::concat:  // the MTP draft graph's [enorm(e) ; hnorm(h)] (docs/speculative.md)
          ranges = {all_rows(rows, kernels::concat_f32_variant(), "grid-stride copy of both rows")};
          break;
      }
    } catch (const kernels::KernelError& e) {
      throw CompileError(fmt::format("{}: {}", op.describe(), e.what()));
    }
    if (ranges.empty()) continue;
    if (draft) shape = shape.empty() ? "draft" : "draft " + shape;
    const auto launch = to_ir(ranges);
    op.set("kernel", ir::print_launch_ranges(launch));
    for (size_t i = 0; i < ranges.size(); ++i) table.add(ir::op_name(op.kind), shape, ranges[i], launch[i]);
    if (!decode.empty()) {
      const auto per_seq = to_ir(decode);
      op.set("decode_kernel", ir::print_launch_ranges(per_seq));
      for (size_t i = 0; i < decode.size(); ++i)
        table.add(ir::op_name(op.kind), shape + (shape.empty() ? "" : ", ") + "per sequences", decode[i], per_seq[i]);
    }
  }
}

}  // namespace

void choose_kernels(CompileContext& cx) {
  ir::Plan& p = cx.plan;
  if (p.backend != "cuda") {
    p.notes.push_back(p.kernel_family == "reference"
                          ? "kernels: cpu reference ops (fp32, weights dequantized on the fly)"
                          : "kernels: cpu reference ops with the dp4a family's quantization and fp16 KV");
    return;
  }
  const int sms = (int)p.device_sms;
  Table table;
  const auto graphs = plan_graphs(p);
  for (size_t i = 0; i < graphs.size(); ++i) choose_graph_kernels(cx, *graphs[i], i > 0, table);
  ir::Graph& g = p.graph;
  // What runs on the output rows: the greedy argmax and the sampling candidates (chunk select, then merge).
  g.set_attr("argmax_kernel", kernels::argmax_f32_variant().name);
  g.set_attr("top_k_kernels", names(kernels::top_k_variants()));
  p.kernels.clear();
  for (auto& [key, row] : table.rows) p.kernels.push_back(row);
  std::sort(p.kernels.begin(), p.kernels.end(), [](const ir::KernelChoice& a, const ir::KernelChoice& b) {
    return std::tie(a.op, a.shape, a.first_rows) < std::tie(b.op, b.shape, b.first_rows);
  });
  p.decode_graphs = cx.options.decode_graphs;
  // Programmatic dependent launch: griddepcontrol is sm_90's (PTX 7.8). The plan's architecture decides, not the
  // GPU it may run on through the JIT (an sm_70 plan's kernels have no wait to overlap on).
  const int arch_sm = std::stoi(p.arch_target.substr(3));
  p.programmatic_launch = cx.options.programmatic_launch && arch_sm >= 90;
  p.notes.push_back(fmt::format("kernels: default family (dp4a matmuls, fp32 norms/GDN/attention over the KV-format pass's caches) for {} SMs; "
                                "{} distinct choices (qrig inspect lists them with their reasons)",
                                sms, p.kernels.size()));
  p.notes.push_back(p.decode_graphs ? "decode: steps of one token per sequence run as CUDA graphs"
                                    : "decode: CUDA graphs off (by request): every step launches kernel by kernel");
  if (p.programmatic_launch)
    p.notes.push_back("launch: programmatic dependent launch (sm_90+): each kernel is launched while the one before it "
                      "runs and waits for it on the GPU, hiding the launch latency between kernels");
  else
    p.notes.push_back(arch_sm >= 90 ? "launch: plain launches (programmatic dependent launch off by request)"
                                    : fmt::format("launch: plain launches ({} has no programmatic dependent launch; "
                                                  "sm_90+ does)", p.arch_target));
}

}  // namespace qrig::compiler::passes
