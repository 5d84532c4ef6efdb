// `qrig synth`: builds the converter's Qwen3.5 layout (metadata keys in the converter's order, tensors in the
// order llama.cpp's convert_hf_to_gguf.py writes them, checked against fixtures/tiny.gguf) with random weights
// generated row by row while the file streams to disk, so 9B/27B files need no more memory than a chunk.
#include "cli/synth.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <thread>

#include <fmt/format.h>

#include "cli/args.h"

namespace qrig::cli {

namespace {

using gguf::TensorType;
using gguf::Value;

const std::vector<SynthPreset>& presets() {
  static const std::vector<SynthPreset> p = {
      // name   hidden layers  ffn   heads kv  hdim  Hk  Hv  dk   conv vocab   context
      {"tiny", 256, 8, 512, 2, 1, 256, 2, 4, 128, 4, 1088, 8192},
      {"9b", 4096, 32, 12288, 16, 4, 256, 16, 32, 128, 4, 248320, 262144},
      {"27b", 5120, 64, 17408, 24, 4, 256, 16, 48, 128, 4, 248320, 262144},
  };
  return p;
}

// ---- random numbers: splitmix64, seeded per (model seed, tensor name, row) so rows are independent ----
uint64_t mix64(uint64_t x) {
  x += 0x9E3779B97F4A7C15ull;
  x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
  x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
  return x ^ (x >> 31);
}
struct Rng {
  uint64_t s;
  uint64_t next() { return mix64(s += 0x9E3779B97F4A7C15ull); }
  double uniform() { return (double)(next() >> 11) * 0x1.0p-53; }  // [0, 1)
  double normal() {                                                  // Box-Muller
    double u = 1.0 - uniform(), v = uniform();
    return std::sqrt(-2.0 * std::log(u)) * std::cos(6.283185307179586 * v);
  }
};
uint64_t name_seed(uint64_t seed, const std::string& name) {
  uint64_t h = 0xcbf29ce484222325ull;  // FNV-1a
  for (unsigned char c : name) h = (h ^ c) * 0x100000001b3ull;
  return mix64(seed ^ mix64(h));
}
Rng row_rng(uint64_t tensor_seed, uint64_t row) { return Rng{mix64(tensor_seed + mix64(row))}; }

// int8 values ~ round(N(0, kQSigma^2)) clipped to +-127, drawn by a 16-bit index into this table (built
// from the normal CDF: entry i is the value whose probability interval holds (i + 0.5) / 65536).
constexpr double kQSigma = 42.0;
const int8_t* q_table() {
  static const std::vector<int8_t> t = [] {
    std::vector<int8_t> out(65536);
    int k = -127;
    auto upper = [](int q) { return q >= 127 ? 2.0 : 0.5 * std::erfc(-(q + 0.5) / kQSigma / std::sqrt(2.0)); };
    for (size_t i = 0; i < out.size(); ++i) {
      double p = (i + 0.5) / 65536.0;
      while (p >= upper(k)) ++k;
      out[i] = (int8_t)k;
    }
    return out;
  }();
  return t.data();
}

// Q8_0 rows with values ~N(0, sigma^2): per block a scale sigma/kQSigma jittered by 2^U(-0.35, 0.35) (so
// kernels that pick the wrong block's scale show it), then 32 table-drawn int8 values.
void fill_q8_rows(uint64_t tseed, double sigma, uint64_t row_blocks, uint64_t first, uint64_t n, uint8_t* dst) {
  const int8_t* table = q_table();
  for (uint64_t r = 0; r < n; ++r) {
    Rng rng = row_rng(tseed, first + r);
    uint8_t* out = dst + r * row_blocks * gguf::kQ8_0Bytes;
    for (uint64_t b = 0; b < row_blocks; ++b, out += gguf::kQ8_0Bytes) {
      double jitter = std::exp2(0.7 * rng.uniform() - 0.35);
      uint16_t d = gguf::float_to_fp16((float)(sigma / kQSigma * jitter));
      std::memcpy(out, &d, 2);
      for (int k = 0; k < 32; k += 4) {
        uint64_t x = rng.next();
        for (int j = 0; j < 4; ++j) out[2 + k + j] = (uint8_t)table[(x >> (16 * j)) & 0xFFFF];
      }
    }
  }
}

// Spreads a chunk's rows over a few threads (rows are seeded independently, so the bytes do not depend on it).
void parallel_rows(uint64_t n, uint64_t row_bytes, const std::function<void(uint64_t, uint64_t)>& work) {
  unsigned threads = std::min(8u, std::max(1u, std::thread::hardware_concurrency()));
  if (n * row_bytes < (4u << 20) || threads == 1 || n < threads) return work(0, n);
  std::vector<std::thread> pool;
  uint64_t per = (n + threads - 1) / threads;
  for (uint64_t s = 0; s < n; s += per) pool.emplace_back(work, s, std::min(per, n - s));
  for (auto& t : pool) t.join();
}

enum class VecKind { Norm, SsmA, DtBias, Conv };

float vec_value(VecKind kind, Rng& rng) {
  switch (kind) {
    case VecKind::Norm: return (float)(1.0 + 0.1 * rng.normal());       // stored +1 (ssm_norm: plain, also ~1)
    case VecKind::SsmA: return (float)-(1.0 + 15.0 * rng.uniform());    // -exp(A_log), A_log = log U(1, 16)
    case VecKind::DtBias: {                                              // softplus(dt_bias) = dt, log-uniform
      double dt = std::exp(std::log(1e-3) + (std::log(1.0) - std::log(1e-3)) * rng.uniform());
      return (float)(dt + std::log(-std::expm1(-dt)));
    }
    case VecKind::Conv: return (float)(rng.uniform() - 0.5);             // PyTorch's Conv1d default, k = 4
  }
  return 0;
}

// A float row ~N(0, sigma^2) with the Q8_0 rows' per-32-value scale jitter 2^U(-0.35, 0.35) (in is a multiple
// of 32), for the types quantized from floats.
void float_row(uint64_t tseed, double sigma, uint64_t row, uint64_t in, float* out) {
  Rng rng = row_rng(tseed, row);
  for (uint64_t b = 0; b < in; b += 32) {
    const double s = sigma * std::exp2(0.7 * rng.uniform() - 0.35);
    for (uint64_t k = b; k < std::min(in, b + 32); ++k) out[k] = (float)(s * rng.normal());
  }
}

struct Builder {
  gguf::Writer w;
  uint64_t seed;
  SynthMix* mix = nullptr;  // null: Q8_0 drawn directly (the default layout)

  void matrix(const std::string& name, uint64_t in, uint64_t out, double sigma) {
    if (mix) return quantized_matrix(name, in, out, sigma, mix->next(name, in));
    uint64_t tseed = name_seed(seed, name), blocks = in / gguf::kQ8_0Block;
    w.add_tensor(name, TensorType::Q8_0, {in, out}, [tseed, sigma, blocks](uint64_t first, uint64_t n, uint8_t* dst) {
      parallel_rows(n, blocks * gguf::kQ8_0Bytes, [&](uint64_t s, uint64_t k) {
        fill_q8_rows(tseed, sigma, blocks, first + s, k, dst + s * blocks * gguf::kQ8_0Bytes);
      });
    });
  }
  void quantized_matrix(const std::string& name, uint64_t in, uint64_t out, double sigma, TensorType type) {
    const gguf::TypeTraits& tr = *gguf::type_traits(static_cast<uint32_t>(type));
    const uint64_t tseed = name_seed(seed, name), row_bytes = in / tr.block_elems * tr.block_bytes;
    w.add_tensor(name, type, {in, out}, [=](uint64_t first, uint64_t n, uint8_t* dst) {
      parallel_rows(n, row_bytes, [&](uint64_t s, uint64_t k) {
        std::vector<float> row(in);
        for (uint64_t r = s; r < s + k; ++r) {
          float_row(tseed, sigma, first + r, in, row.data());
          gguf::quantize(type, row.data(), dst + r * row_bytes, in);
        }
      });
    });
  }
  void linear(const std::string& name, uint64_t in, uint64_t out) { matrix(name, in, out, 1.0 / std::sqrt((double)in)); }
  void vec(const std::string& name, std::vector<uint64_t> ne, VecKind kind) {
    uint64_t tseed = name_seed(seed, name), row = ne[0];
    w.add_tensor(name, TensorType::F32, std::move(ne), [tseed, row, kind](uint64_t first, uint64_t n, uint8_t* dst) {
      for (uint64_t r = 0; r < n; ++r) {
        Rng rng = row_rng(tseed, first + r);
        for (uint64_t k = 0; k < row; ++k) {
          float v = vec_value(kind, rng);
          std::memcpy(dst + (r * row + k) * 4, &v, 4);
        }
      }
    });
  }
};

// gguf-py's size label: two significant digits at least ("7.9M", "9.0B", "27B").
std::string size_label(uint64_t params) {
  double x = (double)params;
  const char* suffix = "K";
  double scaled = x * 1e-3;
  if (x > 1e12) { scaled = x * 1e-12; suffix = "T"; }
  else if (x > 1e9) { scaled = x * 1e-9; suffix = "B"; }
  else if (x > 1e6) { scaled = x * 1e-6; suffix = "M"; }
  int digits = (int)std::to_string((long long)std::llround(scaled)).size();
  return fmt::format("{:.{}f}{}", scaled, std::max(2 - digits, 0), suffix);
}

}  // namespace

std::vector<std::string> synth_preset_names() {
  std::vector<std::string> out;
  for (const auto& p : presets()) out.push_back(p.name);
  return out;
}

const SynthPreset& synth_preset(const std::string& name) {
  for (const auto& p : presets())
    if (p.name == name) return p;
  std::string all;
  for (const auto& n : synth_preset_names()) all += (all.empty() ? "" : ", ") + n;
  throw UsageError(fmt::format("unknown synth preset '{}' (presets: {})", name, all));
}

gguf::Writer synth_model(const std::string& preset, uint64_t seed, const std::string& type) {
  return synth_model(synth_preset(preset), seed, type);
}

std::vector<float> synth_float_row(uint64_t seed, const std::string& name, uint64_t row, uint64_t in, double sigma) {
  std::vector<float> out(in);
  float_row(name_seed(seed, name), sigma, row, in, out.data());
  return out;
}

gguf::Writer synth_model(const SynthPreset& p, uint64_t seed, const std::string& type) {
  const uint64_t D = p.hidden, key_dim = p.gdn_k_heads * p.gdn_head_dim, value_dim = p.gdn_v_heads * p.gdn_head_dim;
  const uint64_t conv_dim = 2 * key_dim + value_dim, q_dim = p.n_head * p.head_dim, kv_dim = p.n_head_kv * p.head_dim;
  SynthMix mix = synth_mix(type, p);
  Builder b{gguf::Writer(), seed, mix.base == TensorType::Q8_0 ? nullptr : &mix};

  // Tensors first (the parameter count goes into the metadata), in the converter's order: lm_head, embeddings,
  // then per layer the HF names sorted (input_layernorm, linear_attn.* | mlp.*, post_attention_layernorm,
  // self_attn.*), then the final norm.
  b.linear("output.weight", D, p.vocab);
  b.matrix("token_embd.weight", D, p.vocab, 1.0);
  for (uint64_t i = 0; i < p.layers; ++i) {
    const std::string blk = fmt::format("blk.{}.", i);
    const bool attention = (i + 1) % 4 == 0;
    b.vec(blk + "attn_norm.weight", {D}, VecKind::Norm);
    if (!attention) {
      b.vec(blk + "ssm_a", {p.gdn_v_heads}, VecKind::SsmA);
      b.vec(blk + "ssm_conv1d.weight", {p.conv_kernel, conv_dim}, VecKind::Conv);
      b.vec(blk + "ssm_dt.bias", {p.gdn_v_heads}, VecKind::DtBias);
      b.linear(blk + "ssm_alpha.weight", D, p.gdn_v_heads);
      b.linear(blk + "ssm_beta.weight", D, p.gdn_v_heads);
      b.linear(blk + "attn_qkv.weight", D, conv_dim);
      b.linear(blk + "attn_gate.weight", D, value_dim);
      b.vec(blk + "ssm_norm.weight", {p.gdn_head_dim}, VecKind::Norm);
      b.linear(blk + "ssm_out.weight", value_dim, D);
    }
    b.linear(blk + "ffn_down.weight", p.ffn, D);
    b.linear(blk + "ffn_gate.weight", D, p.ffn);
    b.linear(blk + "ffn_up.weight", D, p.ffn);
    b.vec(blk + "post_attention_norm.weight", {D}, VecKind::Norm);
    if (attention) {
      b.vec(blk + "attn_k_norm.weight", {p.head_dim}, VecKind::Norm);
      b.linear(blk + "attn_k.weight", D, kv_dim);
      b.linear(blk + "attn_output.weight", q_dim, D);
      b.vec(blk + "attn_q_norm.weight", {p.head_dim}, VecKind::Norm);
      b.linear(blk + "attn_q.weight", D, 2 * q_dim);  // query and output gate, interleaved per head
      b.linear(blk + "attn_v.weight", D, kv_dim);
    }
  }
  b.vec("output_norm.weight", {D}, VecKind::Norm);
  uint64_t params = 0;
  for (const auto& e : b.w.tensor_table()) {
    uint64_t n = 1;
    for (uint64_t d : e.ne) n *= d;
    params += n;
  }

  gguf::Writer& w = b.w;
  w.set("general.architecture", Value::of_str("qwen35"));
  w.set("general.type", Value::of_str("model"));
  w.set("general.name", Value::of_str("qrig synth " + p.name));
  w.set("general.size_label", Value::of_str(size_label(params)));
  w.set("qwen35.block_count", Value::of_u32((uint32_t)p.layers));
  w.set("qwen35.context_length", Value::of_u32((uint32_t)p.context_length));
  w.set("qwen35.embedding_length", Value::of_u32((uint32_t)D));
  w.set("qwen35.feed_forward_length", Value::of_u32((uint32_t)p.ffn));
  w.set("qwen35.attention.head_count", Value::of_u32((uint32_t)p.n_head));
  w.set("qwen35.attention.head_count_kv", Value::of_u32((uint32_t)p.n_head_kv));
  w.set("qwen35.rope.dimension_sections", Value::of_i32s({11, 11, 10, 0}));
  w.set("qwen35.rope.freq_base", Value::of_f32(1e7f));
  w.set("qwen35.attention.layer_norm_rms_epsilon", Value::of_f32(1e-6f));
  w.set("qwen35.attention.key_length", Value::of_u32((uint32_t)p.head_dim));
  w.set("qwen35.attention.value_length", Value::of_u32((uint32_t)p.head_dim));
  w.set("general.file_type", Value::of_u32(mix.file_type));  // LLAMA_FTYPE_MOSTLY_Q8_0 (7) by default
  w.set("qwen35.ssm.conv_kernel", Value::of_u32((uint32_t)p.conv_kernel));
  w.set("qwen35.ssm.state_size", Value::of_u32((uint32_t)p.gdn_head_dim));
  w.set("qwen35.ssm.group_count", Value::of_u32((uint32_t)p.gdn_k_heads));
  w.set("qwen35.ssm.time_step_rank", Value::of_u32((uint32_t)p.gdn_v_heads));
  w.set("qwen35.ssm.inner_size", Value::of_u32((uint32_t)value_dim));
  w.set("qwen35.full_attention_interval", Value::of_u32(4));
  w.set("qwen35.rope.dimension_count", Value::of_u32(64));
  w.set("general.quantization_version", Value::of_u32(2));
  SynthVocab v = synth_vocab(p.vocab);
  w.set("tokenizer.ggml.model", Value::of_str("gpt2"));
  w.set("tokenizer.ggml.pre", Value::of_str("qwen35"));
  w.set("tokenizer.ggml.tokens", Value::of_strs(std::move(v.tokens)));
  w.set("tokenizer.ggml.token_type", Value::of_i32s(std::move(v.types)));
  w.set("tokenizer.ggml.merges", Value::of_strs(std::move(v.merges)));
  w.set("tokenizer.ggml.eos_token_id", Value::of_u32(v.eos_id));
  w.set("tokenizer.ggml.padding_token_id", Value::of_u32(v.padding_id));
  w.set("tokenizer.chat_template", Value::of_str(qwen35_chat_template()));
  return std::move(b.w);
}

void write_synth_model(const std::string& preset, uint64_t seed, const std::string& path) {
  synth_model(preset, seed).write(path);
}

int cmd_synth(int argc, char** argv) {
  Args a(argc, argv, 2, {"--preset", "--type", "--seed", "-o", "--out"}, {"--dry-run"});
  std::string types;
  for (const auto& n : synth_type_names()) types += (types.empty() ? "" : "|") + n;
  const std::string usage = "usage: qrig synth --preset tiny|9b|27b [--type " + types + "] [--seed N] -o FILE.gguf [--dry-run]";
  if (!a.positional().empty() || !a.has("--preset")) throw UsageError(usage);
  std::string out = a.get("-o", a.get("--out"));
  if (out.empty() && !a.has("--dry-run")) throw UsageError("qrig synth needs -o FILE.gguf\n" + usage);
  long long seed = a.get_int("--seed", 0);
  if (seed < 0) throw UsageError("--seed must be >= 0");
  const std::string type = a.get("--type", "q8_0");
  gguf::Writer w = synth_model(a.get("--preset"), (uint64_t)seed, type);
  auto table = w.tensor_table();
  const double gib = (double)w.file_size() / (1024.0 * 1024.0 * 1024.0);
  if (a.has("--dry-run")) {
    for (const auto& [k, v] : w.metadata())
      fmt::print("{} = {}\n", k, v.type == gguf::ValueType::ARRAY ? fmt::format("[{} x {}]", v.size(), gguf::value_type_name(v.elem))
                               : v.type == gguf::ValueType::STRING ? (v.s.size() > 60 ? v.s.substr(0, 60) + "..." : v.s)
                               : v.type == gguf::ValueType::FLOAT32 ? fmt::format("{}", v.f) : fmt::format("{}", v.u));
    for (const auto& e : table) {
      std::string shape;
      for (uint64_t d : e.ne) shape += (shape.empty() ? "" : ", ") + std::to_string(d);
      fmt::print("{:<34} {:<5} [{}]\n", e.name, gguf::tensor_type_name(e.type), shape);
    }
    fmt::print("{} tensors, {:.2f} GiB\n", table.size(), gib);
    return 0;
  }
  auto t0 = std::chrono::steady_clock::now();
  fmt::print("writing {} ({} preset, {}, seed {}, {} tensors, {:.2f} GiB)\n", out, a.get("--preset"), type, seed,
             table.size(), gib);
  std::fflush(stdout);
  w.write(out);
  double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  fmt::print("wrote {} in {:.1f} s\n", out, s);
  return 0;
}

}  // namespace qrig::cli
