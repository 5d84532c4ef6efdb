// The GGUF reader on a real-converter file (fixtures/tiny.gguf): metadata values and types, the tensor table
// checked against the raw bytes, and Q8_0/F32 dequantization checked against blocks decoded by hand.
#include <catch2/catch.hpp>

#include <cmath>
#include <filesystem>
#include <set>
#include <string>
#include <vector>

#include "gguf/gguf.h"
#include "tests/gguf/gguf_test_util.h"
#include "tests/fixtures.h"

using namespace qrig;
using namespace qrig::gguf_test;
using Catch::Matchers::Contains;

namespace {

// fp16 decoded with arithmetic only (no bit tricks), to check the library's decoder independently.
double hand_fp16(uint16_t h) {
  int sign = h >> 15, exp = (h >> 10) & 31, man = h & 1023;
  double v = exp == 0 ? std::ldexp(man, -24) : std::ldexp(1024 + man, exp - 25);
  return sign ? -v : v;
}

// The tensors of one Qwen3.5 layer in the order the converter writes them, with shapes for tiny.gguf.
struct Expect {
  std::string name;
  gguf::TensorType type;
  std::vector<uint64_t> ne;
};
std::vector<Expect> expected_tiny_tensors() {
  using gguf::TensorType;
  const auto Q = TensorType::Q8_0, F = TensorType::F32;
  std::vector<Expect> out = {{"output.weight", Q, {256, 1088}}, {"token_embd.weight", Q, {256, 1088}}};
  for (int i = 0; i < 8; ++i) {
    std::string p = "blk." + std::to_string(i) + ".";
    bool attn = (i + 1) % 4 == 0;
    out.push_back({p + "attn_norm.weight", F, {256}});
    if (!attn) {
      for (Expect e : std::vector<Expect>{{"ssm_a", F, {4}},
                                          {"ssm_conv1d.weight", F, {4, 1024}},
                                          {"ssm_dt.bias", F, {4}},
                                          {"ssm_alpha.weight", Q, {256, 4}},
                                          {"ssm_beta.weight", Q, {256, 4}},
                                          {"attn_qkv.weight", Q, {256, 1024}},
                                          {"attn_gate.weight", Q, {256, 512}},
                                          {"ssm_norm.weight", F, {128}},
                                          {"ssm_out.weight", Q, {512, 256}}})
        out.push_back({p + e.name, e.type, e.ne});
    }
    out.push_back({p + "ffn_down.weight", Q, {512, 256}});
    out.push_back({p + "ffn_gate.weight", Q, {256, 512}});
    out.push_back({p + "ffn_up.weight", Q, {256, 512}});
    out.push_back({p + "post_attention_norm.weight", F, {256}});
    if (attn) {
      for (Expect e : std::vector<Expect>{{"attn_k_norm.weight", F, {256}},
                                          {"attn_k.weight", Q, {256, 256}},
                                          {"attn_output.weight", Q, {512, 256}},
                                          {"attn_q_norm.weight", F, {256}},
                                          {"attn_q.weight", Q, {256, 1024}},
                                          {"attn_v.weight", Q, {256, 256}}})
        out.push_back({p + e.name, e.type, e.ne});
    }
  }
  out.push_back({"output_norm.weight", F, {256}});
  return out;
}

}  // namespace

TEST_CASE("tiny.gguf metadata has the converter's keys, types and values", "[gguf][fixtures]") {
  gguf::File f = gguf::File::open(tiny_path());
  CHECK(f.version() == 3);
  CHECK(f.alignment() == 32);
  CHECK(f.file_size() == std::filesystem::file_size(tiny_path()));
  CHECK(f.metadata().size() == 32);
  CHECK(f.metadata().front().first == "general.architecture");
  CHECK(f.metadata().back().first == "tokenizer.chat_template");

  CHECK(f.get_string("general.architecture") == "qwen35");
  CHECK(f.find("qwen35.block_count")->type == gguf::ValueType::UINT32);
  const std::pair<const char*, uint64_t> uints[] = {
      {"qwen35.block_count", 8}, {"qwen35.context_length", 8192}, {"qwen35.embedding_length", 256},
      {"qwen35.feed_forward_length", 512}, {"qwen35.attention.head_count", 2}, {"qwen35.attention.head_count_kv", 1},
      {"qwen35.attention.key_length", 256}, {"qwen35.attention.value_length", 256}, {"qwen35.ssm.conv_kernel", 4},
      {"qwen35.ssm.state_size", 128}, {"qwen35.ssm.group_count", 2}, {"qwen35.ssm.time_step_rank", 4},
      {"qwen35.ssm.inner_size", 512}, {"qwen35.full_attention_interval", 4}, {"qwen35.rope.dimension_count", 64},
      {"general.file_type", 7}, {"general.quantization_version", 2}, {"tokenizer.ggml.eos_token_id", 1002},
      {"tokenizer.ggml.padding_token_id", 1000}};
  for (const auto& [key, value] : uints) {
    INFO(key);
    CHECK(f.get_uint(key) == value);
    CHECK(f.find(key)->type == gguf::ValueType::UINT32);
  }
  const gguf::Value* sections = f.find("qwen35.rope.dimension_sections");
  REQUIRE(sections);
  CHECK(sections->type == gguf::ValueType::ARRAY);
  CHECK(sections->elem == gguf::ValueType::INT32);
  CHECK(f.get_int_array("qwen35.rope.dimension_sections") == std::vector<int64_t>{11, 11, 10, 0});
  CHECK(f.find("qwen35.rope.freq_base")->type == gguf::ValueType::FLOAT32);
  CHECK(f.get_float("qwen35.rope.freq_base") == 1e7);
  CHECK(f.get_float("qwen35.attention.layer_norm_rms_epsilon") == (double)1e-6f);

  CHECK(f.get_string("tokenizer.ggml.model") == "gpt2");
  CHECK(f.get_string("tokenizer.ggml.pre") == "qwen35");
  const auto& tokens = f.get_string_array("tokenizer.ggml.tokens");
  std::vector<int64_t> types = f.get_int_array("tokenizer.ggml.token_type");
  REQUIRE(tokens.size() == 1088);
  REQUIRE(types.size() == 1088);
  CHECK(f.find("tokenizer.ggml.token_type")->elem == gguf::ValueType::INT32);
  CHECK(tokens[0] == "!");
  CHECK(tokens[220] == "\xC4\xA0");  // byte 0x20 in the GPT-2 byte-to-unicode mapping: U+0120
  CHECK(tokens[1000] == "<|endoftext|>");
  CHECK(tokens[1002] == "<|im_end|>");
  CHECK(tokens[1087] == "[PAD1087]");
  CHECK(types[0] == 1);
  CHECK(types[1002] == 3);
  CHECK(types[1087] == 5);
  const auto& merges = f.get_string_array("tokenizer.ggml.merges");
  CHECK(merges.size() == 744);
  CHECK(merges[0] == "\xC4\xA0 \xC4\xA0");
  std::vector<uint8_t> tmpl = read_file(qrig::fixtures::shared_dir() + "/reference/qwen3.5-chat-template.jinja");
  CHECK(f.get_string("tokenizer.chat_template") == std::string(tmpl.begin(), tmpl.end()));

  // Getters name the key and the problem.
  CHECK_THROWS_WITH(f.get_string("qwen35.block_count"), Contains("qwen35.block_count") && Contains("u32"));
  CHECK_THROWS_WITH(f.get_uint("no.such.key"), Contains("no.such.key") && Contains("missing"));
  CHECK_THROWS_AS(f.get_string_array("qwen35.rope.dimension_sections"), gguf::Error);
  CHECK(!f.opt_uint("no.such.key"));
  CHECK(f.opt_string("general.name") == std::optional<std::string>("Tiny Hf"));
}

TEST_CASE("tiny.gguf tensor table matches the converter layout and the raw tensor infos", "[gguf][fixtures]") {
  gguf::File f = gguf::File::open(tiny_path());
  const std::vector<uint8_t>& raw = tiny_bytes();
  Layout l = walk(raw);
  std::vector<Expect> want = expected_tiny_tensors();
  REQUIRE(f.tensors().size() == want.size());
  REQUIRE(l.tensors.size() == want.size());
  CHECK(f.data_offset() == (l.infos_end + 31) / 32 * 32);

  uint64_t next = 0;
  for (size_t k = 0; k < want.size(); ++k) {
    const gguf::TensorInfo& t = f.tensors()[k];
    const TensorPos& tp = l.tensors[k];
    INFO(want[k].name);
    CHECK(t.name == want[k].name);
    CHECK(t.type == want[k].type);
    CHECK(t.ne == want[k].ne);
    uint64_t n = 1;
    for (uint64_t e : want[k].ne) n *= e;
    CHECK(t.n_elements == n);
    CHECK(t.n_bytes == (t.type == gguf::TensorType::Q8_0 ? n / 32 * 34 : n * 4));
    // The same fields read straight from the file.
    CHECK(tp.name == t.name);
    CHECK(get_le<uint32_t>(raw, tp.n_dims) == t.ne.size());
    for (size_t d = 0; d < t.ne.size(); ++d) CHECK(get_le<uint64_t>(raw, tp.dims + 8 * d) == t.ne[d]);
    CHECK(get_le<uint32_t>(raw, tp.type) == static_cast<uint32_t>(t.type));
    CHECK(get_le<uint64_t>(raw, tp.offset) == t.offset);
    // Packed back to back, each aligned to 32.
    CHECK(t.offset == next);
    CHECK(t.offset % 32 == 0);
    next = (t.offset + t.n_bytes + 31) / 32 * 32;
    CHECK(f.tensor_data(t) == f.bytes() + f.data_offset() + t.offset);
  }
  const gguf::TensorInfo& last = f.tensors().back();
  CHECK(f.data_offset() + last.offset + last.n_bytes == raw.size());
  CHECK(f.tensor("blk.3.attn_q.weight").shape_string() == "[256, 1024]");
  CHECK(f.find_tensor("blk.0.attn_q.weight") == nullptr);  // GDN layer
  CHECK_THROWS_WITH(f.tensor("blk.0.attn_q.weight"), Contains("blk.0.attn_q.weight") && Contains("missing"));
  std::set<std::string> names;
  for (const auto& t : f.tensors()) names.insert(t.name);
  CHECK(names.size() == f.tensors().size());
}

TEST_CASE("Q8_0 and F32 dequantization match hand-decoded data", "[gguf][fixtures]") {
  gguf::File f = gguf::File::open(tiny_path());
  const std::vector<uint8_t>& raw = tiny_bytes();
  const gguf::TensorInfo& t = f.tensor("token_embd.weight");
  REQUIRE(t.type == gguf::TensorType::Q8_0);
  std::vector<float> out(t.n_elements);
  gguf::dequantize(t.type, f.tensor_data(t), out.data(), out.size());
  const size_t base = f.data_offset() + t.offset;
  const size_t n_blocks = t.n_elements / 32;
  size_t nonzero = 0;
  for (size_t b : {size_t{0}, size_t{1}, size_t{7}, size_t{8 * 1000 + 3}, n_blocks - 1}) {
    INFO("block " << b);
    double d = hand_fp16(get_le<uint16_t>(raw, base + 34 * b));
    CHECK(d > 0);
    for (size_t k = 0; k < 32; ++k) {
      int8_t q = static_cast<int8_t>(raw[base + 34 * b + 2 + k]);
      CHECK(out[32 * b + k] == (float)(d * q));
      nonzero += q != 0;
    }
  }
  CHECK(nonzero > 100);
  // A prefix of whole blocks decodes the same as the full tensor.
  std::vector<float> head(64);
  gguf::dequantize(t.type, f.tensor_data(t), head.data(), head.size());
  CHECK(std::equal(head.begin(), head.end(), out.begin()));
  CHECK_THROWS_WITH(gguf::dequantize(t.type, f.tensor_data(t), head.data(), 40), Contains("40"));

  // F32: the stored floats. ssm_a = -exp(A_log) is negative; norms are stored with +1 (near 1).
  const gguf::TensorInfo& a = f.tensor("blk.0.ssm_a");
  std::vector<float> av(a.n_elements);
  gguf::dequantize(a.type, f.tensor_data(a), av.data(), av.size());
  for (size_t k = 0; k < av.size(); ++k) {
    CHECK(av[k] == get_le<float>(raw, f.data_offset() + a.offset + 4 * k));
    CHECK(av[k] < 0);
  }
  const gguf::TensorInfo& norm = f.tensor("output_norm.weight");
  std::vector<float> nv(norm.n_elements);
  gguf::dequantize(norm.type, f.tensor_data(norm), nv.data(), nv.size());
  double mean = 0;
  for (float v : nv) mean += v / nv.size();
  CHECK(mean == Approx(1.0).margin(0.05));
}
