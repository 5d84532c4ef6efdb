// `qrig synth`: the tiny preset reproduces fixtures/tiny.gguf's layout (keys, value types, tensor names, types,
// shapes, order, offsets) with sane random weights, deterministically per seed; the 9B/27B presets have the
// QWEN35.md shapes and sizes (checked from the tensor table, without generating data).
#include <catch2/catch.hpp>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <set>
#include <string>
#include <vector>

#include <unistd.h>

#include "cli/args.h"
#include "cli/synth.h"
#include "gguf/gguf.h"
#include "tests/fixtures.h"

using namespace qrig;
using Catch::Matchers::Contains;

namespace {

std::string fixture(const std::string& name) { return qrig::fixtures::shared_dir() + "/" + name; }

std::vector<uint8_t> read_file(const std::string& path) {
  std::ifstream f(path, std::ios::binary);
  return std::vector<uint8_t>(std::istreambuf_iterator<char>(f), {});
}

std::string temp_dir() {
  auto dir = std::filesystem::temp_directory_path() / ("qrig-synth-" + std::to_string(::getpid()));
  std::filesystem::create_directories(dir);
  return dir.string();
}

std::vector<uint64_t> shape_of(const std::vector<gguf::Writer::Entry>& table, const std::string& name) {
  for (const auto& e : table)
    if (e.name == name) return e.ne;
  return {};
}

uint64_t u(const gguf::Writer& w, const std::string& key) {
  for (const auto& [k, v] : w.metadata())
    if (k == key) return v.u;
  FAIL("missing key " << key);
  return 0;
}

struct Stats {
  double mean = 0, std = 0, min = 1e300, max = -1e300;
  bool finite = true;
};
Stats stats_of(const gguf::File& f, const gguf::TensorInfo& t) {
  std::vector<float> x(t.n_elements);
  gguf::dequantize(t.type, f.tensor_data(t), x.data(), x.size());
  Stats s;
  double sum = 0, sum2 = 0;
  for (float v : x) {
    s.finite = s.finite && std::isfinite(v);
    sum += v;
    sum2 += (double)v * v;
    s.min = std::min(s.min, (double)v);
    s.max = std::max(s.max, (double)v);
  }
  s.mean = sum / x.size();
  s.std = std::sqrt(std::max(0.0, sum2 / x.size() - s.mean * s.mean));
  return s;
}

}  // namespace

TEST_CASE("synth tiny has exactly tiny.gguf's metadata keys, value types and tensor table", "[cli][fixtures]") {
  std::string path = temp_dir() + "/tiny.gguf";
  cli::write_synth_model("tiny", 1, path);
  gguf::File s = gguf::File::open(path);
  gguf::File t = gguf::File::open(fixture("fixtures/tiny.gguf"));

  REQUIRE(s.metadata().size() == t.metadata().size());
  for (size_t k = 0; k < t.metadata().size(); ++k) {
    const auto& [tk, tv] = t.metadata()[k];
    const auto& [sk, sv] = s.metadata()[k];
    INFO(tk);
    CHECK(sk == tk);
    CHECK(sv.type == tv.type);
    if (tv.type == gguf::ValueType::ARRAY) {
      CHECK(sv.elem == tv.elem);
      CHECK(sv.size() == (tk == "tokenizer.ggml.merges" ? sv.size() : tv.size()));
    }
    bool vocab = tk == "tokenizer.ggml.tokens" || tk == "tokenizer.ggml.token_type" || tk == "tokenizer.ggml.merges";
    if (tk != "general.name" && !vocab) {  // every other value equals the converter's, size label included
      CHECK(sv.u == tv.u);
      CHECK(sv.f == tv.f);
      CHECK(sv.s == tv.s);
      CHECK(sv.ints == tv.ints);
    }
  }
  // The vocabulary: byte tokens, added tokens and padding as in tiny.gguf; only the merges differ.
  const auto& st = s.get_string_array("tokenizer.ggml.tokens");
  const auto& tt = t.get_string_array("tokenizer.ggml.tokens");
  auto stype = s.get_int_array("tokenizer.ggml.token_type"), ttype = t.get_int_array("tokenizer.ggml.token_type");
  for (size_t id = 0; id < tt.size(); ++id) {
    if (id >= 256 && id < 1000) continue;
    INFO("token " << id);
    CHECK(st[id] == tt[id]);
    CHECK(stype[id] == ttype[id]);
  }
  CHECK(s.get_string("tokenizer.chat_template") == t.get_string("tokenizer.chat_template"));

  REQUIRE(s.tensors().size() == t.tensors().size());
  for (size_t k = 0; k < t.tensors().size(); ++k) {
    const gguf::TensorInfo &a = s.tensors()[k], &b = t.tensors()[k];
    INFO(b.name);
    CHECK(a.name == b.name);
    CHECK(a.type == b.type);
    CHECK(a.ne == b.ne);
    CHECK(a.offset == b.offset);
  }
  CHECK(s.file_size() - s.data_offset() == t.file_size() - t.data_offset());
  std::filesystem::remove_all(temp_dir());
}

TEST_CASE("synth vocabulary is a valid BPE vocabulary padded to the preset size", "[cli][fixtures]") {
  cli::SynthVocab v = cli::synth_vocab(1088);
  REQUIRE(v.tokens.size() == 1088);
  REQUIRE(v.types.size() == 1088);
  std::map<std::string, size_t> id;
  for (size_t k = 0; k < v.tokens.size(); ++k) CHECK(id.emplace(v.tokens[k], k).second);  // unique
  CHECK(v.tokens[0] == "!");
  CHECK(v.tokens[188] == "\xC4\x80");  // byte 0x00 -> U+0100
  CHECK(v.tokens[220] == "\xC4\xA0");  // byte 0x20 -> U+0120 "Ġ"
  CHECK(v.merges.size() >= 744);
  size_t bad = 0;
  for (const std::string& m : v.merges) {
    size_t sp = m.find(' ');
    std::string a = m.substr(0, sp), b = m.substr(sp + 1);
    bad += !(sp != std::string::npos && id.count(a) && id.count(b) && id.count(a + b) && id[a + b] < 1000 &&
             id[a] < id[a + b] && id[b] < id[a + b]);
  }
  CHECK(bad == 0);
  CHECK(v.eos_id == 1002);
  CHECK(v.tokens[v.eos_id] == "<|im_end|>");
  CHECK(v.padding_id == 1000);
  CHECK(v.tokens[1032] == "<|audio_pad|>");
  CHECK(v.tokens[1087] == "[PAD1087]");
  CHECK(v.types[999] == 1);
  CHECK(v.types[1024] == 3);
  CHECK(v.types[1033] == 5);
  std::vector<uint8_t> ref = read_file(fixture("reference/qwen3.5-chat-template.jinja"));
  CHECK(cli::qwen35_chat_template() == std::string(ref.begin(), ref.end()));
  CHECK_THROWS(cli::synth_vocab(1000));
}

TEST_CASE("synth weights have the intended statistics", "[cli]") {
  std::vector<uint8_t> bytes = cli::synth_model("tiny", 3).to_bytes();
  gguf::File f = gguf::File::from_bytes(bytes.data(), bytes.size());
  std::set<uint16_t> scales;
  size_t minus128 = 0;
  for (const gguf::TensorInfo& t : f.tensors()) {
    INFO(t.name);
    Stats s = stats_of(f, t);
    CHECK(s.finite);
    const std::string& n = t.name;
    auto ends = [&](const char* suf) { return n.size() >= std::strlen(suf) && n.compare(n.size() - std::strlen(suf), std::string::npos, suf) == 0; };
    if (t.type == gguf::TensorType::Q8_0) {
      double want = n == "token_embd.weight" ? 1.0 : 1.0 / std::sqrt((double)t.ne[0]);
      CHECK(s.std == Approx(want).epsilon(0.1));
      CHECK(std::fabs(s.mean) < 0.1 * want);
      const uint8_t* p = f.tensor_data(t);
      for (uint64_t b = 0; b < t.n_elements / 32; ++b) {
        uint16_t d;
        std::memcpy(&d, p + 34 * b, 2);
        scales.insert(d);
        for (int k = 0; k < 32; ++k) minus128 += (int8_t)p[34 * b + 2 + k] == -128;
      }
    } else if (ends("norm.weight")) {
      CHECK(s.mean == Approx(1.0).margin(0.05));
      CHECK(s.std == Approx(0.1).margin(0.05));
    } else if (ends("ssm_a")) {
      CHECK(s.min >= -16.0);
      CHECK(s.max <= -1.0);
    } else if (ends("ssm_dt.bias")) {
      CHECK(s.min >= std::log(std::expm1(1e-3)) - 1e-3);  // softplus(dt_bias) in [1e-3, 1]
      CHECK(s.max <= std::log(std::expm1(1.0)) + 1e-6);
    } else if (ends("ssm_conv1d.weight")) {
      CHECK(s.min >= -0.5);
      CHECK(s.max <= 0.5);
      CHECK(s.std == Approx(1.0 / std::sqrt(12.0)).epsilon(0.1));
    } else {
      FAIL("unexpected F32 tensor");
    }
  }
  CHECK(scales.size() > 100);  // per-block scales vary
  CHECK(minus128 == 0);        // int8 values stay in -127..127 like the converter's
}

TEST_CASE("synth is deterministic per seed", "[cli]") {
  std::vector<uint8_t> a = cli::synth_model("tiny", 42).to_bytes();
  std::vector<uint8_t> b = cli::synth_model("tiny", 42).to_bytes();
  std::vector<uint8_t> c = cli::synth_model("tiny", 43).to_bytes();
  CHECK(a == b);
  REQUIRE(a.size() == c.size());
  uint64_t data = gguf::File::from_bytes(a.data(), a.size()).data_offset();
  CHECK(std::equal(a.begin(), a.begin() + data, c.begin()));  // same metadata and tensor table
  size_t same = 0;
  for (size_t k = data; k < a.size(); ++k) same += a[k] == c[k];
  CHECK(same < (a.size() - data) / 10);  // the weights differ (padding and equal int8 draws aside)

  // The command line writes the same bytes.
  std::string path = temp_dir() + "/cmd.gguf";
  std::vector<std::string> args = {"qrig", "synth", "--preset", "tiny", "--seed", "42", "-o", path};
  std::vector<char*> argv;
  for (auto& s : args) argv.push_back(s.data());
  CHECK(cli::cmd_synth((int)argv.size(), argv.data()) == 0);
  CHECK(read_file(path) == a);
  std::vector<std::string> bad = {"qrig", "synth", "--preset", "13b", "-o", path};
  std::vector<char*> bad_argv;
  for (auto& s : bad) bad_argv.push_back(s.data());
  CHECK_THROWS_WITH(cli::cmd_synth((int)bad_argv.size(), bad_argv.data()), Contains("13b") && Contains("tiny, 9b, 27b"));
  CHECK_THROWS_AS(cli::cmd_synth(4, bad_argv.data()), cli::UsageError);  // no -o
  std::filesystem::remove_all(temp_dir());
}

TEST_CASE("synth 9b and 27b have the QWEN35.md shapes and sizes", "[cli]") {
  struct Want {
    const char* preset;
    uint64_t D, layers, ffn, hq, hk_gdn, hv_gdn;
    double params, gib;
  };
  for (const Want& w : {Want{"9b", 4096, 32, 12288, 16, 16, 32, 8.95e9, 8.86}, Want{"27b", 5120, 64, 17408, 24, 16, 48, 26.9e9, 26.6}}) {
    INFO(w.preset);
    gguf::Writer m = cli::synth_model(w.preset, 0);
    auto table = m.tensor_table();
    const uint64_t key = w.hk_gdn * 128, value = w.hv_gdn * 128, conv = 2 * key + value, q = w.hq * 256;
    using V = std::vector<uint64_t>;
    CHECK(shape_of(table, "token_embd.weight") == V{w.D, 248320});
    CHECK(shape_of(table, "output.weight") == V{w.D, 248320});
    CHECK(shape_of(table, "blk.0.attn_qkv.weight") == V{w.D, conv});
    CHECK(shape_of(table, "blk.0.attn_gate.weight") == V{w.D, value});
    CHECK(shape_of(table, "blk.0.ssm_alpha.weight") == V{w.D, w.hv_gdn});
    CHECK(shape_of(table, "blk.0.ssm_beta.weight") == V{w.D, w.hv_gdn});
    CHECK(shape_of(table, "blk.0.ssm_conv1d.weight") == V{4, conv});
    CHECK(shape_of(table, "blk.0.ssm_a") == V{w.hv_gdn});
    CHECK(shape_of(table, "blk.0.ssm_norm.weight") == V{128});
    CHECK(shape_of(table, "blk.0.ssm_out.weight") == V{value, w.D});
    CHECK(shape_of(table, "blk.3.attn_q.weight") == V{w.D, 2 * q});
    CHECK(shape_of(table, "blk.3.attn_k.weight") == V{w.D, 4 * 256});
    CHECK(shape_of(table, "blk.3.attn_v.weight") == V{w.D, 4 * 256});
    CHECK(shape_of(table, "blk.3.attn_output.weight") == V{q, w.D});
    CHECK(shape_of(table, "blk.3.attn_q_norm.weight") == V{256});
    CHECK(shape_of(table, "blk.1.ffn_gate.weight") == V{w.D, w.ffn});
    CHECK(shape_of(table, "blk.1.ffn_down.weight") == V{w.ffn, w.D});
    std::string last = "blk." + std::to_string(w.layers - 1) + ".";
    CHECK(!shape_of(table, last + "attn_q.weight").empty());  // the last layer is full attention
    CHECK(shape_of(table, "blk." + std::to_string(w.layers) + ".attn_norm.weight").empty());
    CHECK(shape_of(table, "blk.3.ssm_a").empty());
    CHECK(table.size() == 3 + w.layers / 4 * (3 * 14 + 11));
    CHECK(table.back().name == "output_norm.weight");

    CHECK(u(m, "qwen35.block_count") == w.layers);
    CHECK(u(m, "qwen35.embedding_length") == w.D);
    CHECK(u(m, "qwen35.feed_forward_length") == w.ffn);
    CHECK(u(m, "qwen35.attention.head_count") == w.hq);
    CHECK(u(m, "qwen35.attention.head_count_kv") == 4);
    CHECK(u(m, "qwen35.ssm.group_count") == w.hk_gdn);
    CHECK(u(m, "qwen35.ssm.time_step_rank") == w.hv_gdn);
    CHECK(u(m, "qwen35.ssm.inner_size") == value);
    CHECK(u(m, "qwen35.context_length") == 262144);
    CHECK(u(m, "tokenizer.ggml.eos_token_id") == 1002);

    double params = 0;
    for (const auto& e : table) {
      double n = 1;
      for (uint64_t d : e.ne) n *= (double)d;
      params += n;
    }
    CHECK(params == Approx(w.params).epsilon(0.005));
    CHECK((double)m.file_size() / (1024.0 * 1024 * 1024) == Approx(w.gib).epsilon(0.005));
  }
}
