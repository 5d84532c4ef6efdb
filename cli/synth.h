// `qrig synth`: Qwen3.5 GGUF files with random weights and exactly the layout llama.cpp's converter writes
// (tensor names, types, shapes, order, metadata keys), for the built-in default model, benchmarks and tests.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "gguf/writer.h"

namespace qrig::cli {

// Model shape of a preset ("tiny" = fixtures/tiny.gguf, "9b", "27b" = QWEN35.md "Sizes").
struct SynthPreset {
  std::string name;
  uint64_t hidden, layers, ffn;
  uint64_t n_head, n_head_kv, head_dim;          // gated full attention
  uint64_t gdn_k_heads, gdn_v_heads, gdn_head_dim;  // Gated DeltaNet
  uint64_t conv_kernel, vocab, context_length;
};
const SynthPreset& synth_preset(const std::string& name);  // throws UsageError naming the presets
std::vector<std::string> synth_preset_names();

// The synthetic vocabulary shared by all presets: the 256 byte tokens (GPT-2 byte-to-unicode order), BPE
// merges trained on a small built-in text up to 1000 tokens, the 33 Qwen3.5 added tokens (ids 1000..1032, as
// in tiny.gguf), then "[PADn]" rows (UNUSED) up to vocab_size.
struct SynthVocab {
  std::vector<std::string> tokens;
  std::vector<int32_t> types;  // llama.cpp token types: 1 normal, 3 control, 5 unused
  std::vector<std::string> merges;
  uint32_t eos_id = 0;      // <|im_end|>
  uint32_t padding_id = 0;  // <|endoftext|>
};
SynthVocab synth_vocab(uint64_t vocab_size);
// The official Qwen3.5 chat template, embedded.
const std::string& qwen35_chat_template();

// A weight format of `qrig synth --type` and its per-tensor mix (synth_types.cpp says which tensor gets which
// type, after llama.cpp's llama_tensor_get_type). next() is asked for every matrix in file order.
struct SynthMix {
  std::string name;              // "q4_k_m", ...
  gguf::TensorType base;         // the type of most matrices
  uint32_t file_type;            // general.file_type (llama.cpp's LLAMA_FTYPE_MOSTLY_*)
  int64_t n_wv, n_down, gqa;     // attn_v + attn_qkv tensors, ffn_down tensors, n_head / n_head_kv
  int64_t i_wv = 0, i_down = 0;  // how many of them were typed so far
  gguf::TensorType next(const std::string& tensor, uint64_t row_length);
};
SynthMix synth_mix(const std::string& type, const SynthPreset& shape);  // throws UsageError naming the types
std::vector<std::string> synth_type_names();

// The model as a Writer whose tensor data is generated (deterministically from `seed`) while it is written:
// building it is cheap, so metadata() and tensor_table() show a 27B layout without producing 28 GB.
// Weights: Q8_0 matrices ~N(0, 1/fan_in) (embeddings N(0, 1)), int8 values drawn directly with a jittered
// per-block scale; F32 norms ~1 + N(0, 0.1^2); ssm_a = -U(1, 16); ssm_dt.bias = softplus^-1 of a log-uniform
// dt in [1e-3, 1]; ssm_conv1d ~U(-0.5, 0.5).
// With another type than "q8_0" (synth_type_names()), every matrix is drawn in float (the same distributions, the
// per-block scale jitter on the values) and quantized by gguf::quantize into the type its mix gives it.
gguf::Writer synth_model(const std::string& preset, uint64_t seed, const std::string& type = "q8_0");
// The same for any shape (tests of shapes no preset has, e.g. 6 GDN value heads).
gguf::Writer synth_model(const SynthPreset& shape, uint64_t seed, const std::string& type = "q8_0");
// Row `row` of matrix `name` as a non-q8_0 synth draws it before quantizing (tests compare the file against it).
std::vector<float> synth_float_row(uint64_t seed, const std::string& name, uint64_t row, uint64_t in, double sigma);
// Bump when the generated weights change for a given preset and seed (the metadata and tensor layout are
// fingerprinted separately): the built-in model's cache file name carries both, so an old file is not reused.
constexpr int kSynthWeightsVersion = 1;
// Streams the model to `path` (through a temp file renamed into place).
void write_synth_model(const std::string& preset, uint64_t seed, const std::string& path);

// qrig synth --preset tiny|9b|27b [--type T] [--seed N] -o FILE.gguf   (or --dry-run: print the layout, write nothing)
int cmd_synth(int argc, char** argv);

}  // namespace qrig::cli
