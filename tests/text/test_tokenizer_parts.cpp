// Tokenizer building blocks on their own: UTF-8 repair and NFC, the pre-tokenizer regex, BPE merge
// order on hand-made vocabularies, vocabulary validation errors, and encode speed on a long document.
#include <catch2/catch.hpp>

#include <chrono>
#include <cstdlib>
#include <cstring>
#include <random>
#include <time.h>
#include <utf8proc.h>

#include "gguf/writer.h"
#include "text/tokenizer_pretok.h"
#include "tokenizer_test_util.h"

using namespace qrig;
using namespace qrig::text;
using namespace qrig::text::testutil;

namespace {

const std::string kFFFD = "\xEF\xBF\xBD";

std::vector<std::string> pieces(const PreTokenizer& pre, const std::string& text) {
  std::vector<std::string> out;
  pre.split(text, [&](std::string_view p) { out.emplace_back(p); });
  return out;
}

// A minimal byte-level vocabulary: the 256 byte tokens (ids 0..255 in byte order), then the merged
// tokens of `merges`, then <|im_end|> (control).
Vocab mini_vocab(const std::vector<std::pair<std::string, std::string>>& merges) {
  Vocab v;
  for (int b = 0; b < 256; ++b) {
    v.tokens.push_back(byte_unicode().byte_to_utf8[b]);
    v.types.push_back(TokenType::Normal);
  }
  for (const auto& [a, b] : merges) {
    v.tokens.push_back(a + b);
    v.types.push_back(TokenType::Normal);
  }
  v.merges = merges;
  v.tokens.push_back("<|im_end|>");
  v.types.push_back(TokenType::Control);
  v.eos_id = v.size() - 1;
  v.pre = "qwen35";
  return v;
}

// A GGUF image holding the tokenizer keys of mini_vocab(), editable before serialising.
gguf::Writer mini_gguf() {
  const Vocab v = mini_vocab({{"a", "b"}});
  gguf::Writer w;
  w.set("general.architecture", gguf::Value::of_str("qwen35"));
  w.set("tokenizer.ggml.model", gguf::Value::of_str("gpt2"));
  w.set("tokenizer.ggml.pre", gguf::Value::of_str("qwen35"));
  w.set("tokenizer.ggml.tokens", gguf::Value::of_strs(v.tokens));
  std::vector<int32_t> types;
  for (TokenType t : v.types) types.push_back(static_cast<int32_t>(t));
  w.set("tokenizer.ggml.token_type", gguf::Value::of_i32s(types));
  w.set("tokenizer.ggml.merges", gguf::Value::of_strs({"a b"}));
  w.set("tokenizer.ggml.eos_token_id", gguf::Value::of_u32(static_cast<uint32_t>(v.eos_id)));
  return w;
}

Vocab load(const gguf::Writer& w) {
  const auto bytes = w.to_bytes();
  return Vocab::from_gguf(gguf::File::from_bytes(bytes.data(), bytes.size()));
}

}  // namespace

TEST_CASE("sanitize_utf8 replaces maximal ill-formed subparts with U+FFFD", "[text]") {
  CHECK(sanitize_utf8("plain ascii") == "plain ascii");
  CHECK(sanitize_utf8("\xC3\xA9\xE2\x82\xAC\xF0\x9F\x98\x80") == "\xC3\xA9\xE2\x82\xAC\xF0\x9F\x98\x80");
  CHECK(sanitize_utf8("\x80") == kFFFD);
  CHECK(sanitize_utf8("\xE2\x82") == kFFFD);            // truncated: one replacement
  CHECK(sanitize_utf8("\xE2\x82" "A") == kFFFD + "A");
  CHECK(sanitize_utf8("\xC0\xAF") == kFFFD + kFFFD);    // overlong lead byte is never valid
  CHECK(sanitize_utf8("\xE0\x80\x80") == kFFFD + kFFFD + kFFFD);  // overlong 3-byte
  CHECK(sanitize_utf8("\xED\xA0\x80") == kFFFD + kFFFD + kFFFD);  // surrogate
  CHECK(sanitize_utf8("\xF4\x90\x80\x80") == kFFFD + kFFFD + kFFFD + kFFFD);  // > U+10FFFF
  CHECK(sanitize_utf8("\xF0\x9F\x98" "x") == kFFFD + "x");
  CHECK(sanitize_utf8("\xFF") == kFFFD);
  CHECK(is_valid_utf8(""));
  CHECK_FALSE(is_valid_utf8("\xC3"));
  CHECK(utf8_complete_prefix("a\xE2\x82") == 1);
  CHECK(utf8_complete_prefix("a\xE2\x82\xAC") == 4);
  CHECK(utf8_complete_prefix("\xF0\x9F") == 0);
  CHECK(utf8_complete_prefix("a\x80") == 2);       // ill-formed is not held back
  CHECK(utf8_complete_prefix("a\xE2" "A") == 3);
  CHECK(utf8_complete_prefix("") == 0);
  CHECK(utf8_char_len("\xE2\x82\xAC", 0) == 3);
  CHECK(utf8_char_len("\xE2\x82", 0) == -1);
  CHECK(utf8_char_len("\xE2" "A", 0) == 0);
}

TEST_CASE("nfc composes, keeps NFC text and repairs invalid UTF-8", "[text]") {
  CHECK(nfc("e\xCC\x81") == "\xC3\xA9");                    // e + U+0301 -> U+00E9
  CHECK(nfc("\xC3\xA9") == "\xC3\xA9");
  CHECK(nfc("\xE1\xBA\x9B\xCC\xA3") == "\xE1\xBA\x9B\xCC\xA3");  // U+1E9B U+0323 stays (UAX #15 example)
  CHECK(nfc("\xE2\x84\xAB") == "\xC3\x85");                  // U+212B ANGSTROM SIGN -> U+00C5
  CHECK(nfc("Vie\xCC\x82\xCC\x81t") == "Vi\xE1\xBA\xBFt");   // e + U+0302 + U+0301 -> U+1EBF
  CHECK(nfc("ascii only") == "ascii only");
  CHECK(nfc("") == "");
  CHECK(nfc(std::string("a\0e\xCC\x81", 5)) == std::string("a\0\xC3\xA9", 4));
  CHECK(nfc("\xFF" "e\xCC\x81") == kFFFD + "\xC3\xA9");
}

TEST_CASE("nfc's ASCII-run shortcut agrees with whole-string utf8proc NFC", "[text]") {
  // Code points chosen to exercise composition, reordering, exclusions, Hangul and starters that
  // compose (U+0B47 U+0B3E), mixed with ASCII that may or may not take the marks.
  const std::vector<char32_t> cps = {'a', 'e', 'A', ' ', '.', 0xE9, 0xC5, 0x212B, 0x300, 0x301, 0x323, 0x327,
                                     0x31B, 0x344, 0x345, 0x1100, 0x1161, 0x11A8, 0xAC00, 0x4E00, 0x1F600,
                                     0xF73, 0xB47, 0xB3E, 0x93C, 0x958, 0x2FF, 0x1E9B, 0x3B1, 0x313};
  std::mt19937 rng(7);
  for (int n = 0; n < 20000; ++n) {
    std::string s;
    const int len = 1 + static_cast<int>(rng() % 12);
    for (int i = 0; i < len; ++i) append_utf8(s, cps[rng() % cps.size()]);
    utf8proc_uint8_t* ref = nullptr;
    const auto m = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(s.data()), static_cast<utf8proc_ssize_t>(s.size()),
                                &ref, static_cast<utf8proc_option_t>(UTF8PROC_STABLE | UTF8PROC_COMPOSE));
    REQUIRE(m >= 0);
    const std::string expected(reinterpret_cast<const char*>(ref), static_cast<size_t>(m));
    std::free(ref);
    INFO("input " << show(s));
    REQUIRE(nfc(s) == expected);
  }
}

TEST_CASE("GPT-2 byte to unicode table", "[text]") {
  const ByteUnicode& bu = byte_unicode();
  CHECK(bu.byte_to_utf8[' '] == "\xC4\xA0");   // U+0120 "Ġ"
  CHECK(bu.byte_to_utf8['\n'] == "\xC4\x8A");  // U+010A "Ċ"
  CHECK(bu.byte_to_utf8['A'] == "A");
  CHECK(bu.byte_to_cp[0] == 0x100);
  CHECK(bu.byte_to_cp[0xAD] == 0x143);
  CHECK(bu.byte_to_cp[0xFF] == 0xFF);
  for (int b = 0; b < 256; ++b) CHECK(bu.cp_to_byte(bu.byte_to_cp[b]) == b);
  CHECK(bu.cp_to_byte(0x144) == -1);
  CHECK(bu.cp_to_byte(0x4E00) == -1);
}

TEST_CASE("pre-tokenizer splits like the Qwen regexes", "[text]") {
  const PreTokenizer q35("qwen35"), q2("qwen2");
  using V = std::vector<std::string>;
  CHECK(q35.jit());  // Debian's PCRE2 has JIT on x86-64 and arm64
  CHECK(pieces(q35, "Hello world") == V{"Hello", " world"});
  CHECK(pieces(q35, "  Hello") == V{" ", " Hello"});                   // \s+(?!\S) leaves one space
  CHECK(pieces(q35, "a  \n\n  b") == V{"a", "  \n\n", " ", " b"});
  CHECK(pieces(q35, "it's I'LL") == V{"it", "'s", " I", "'LL"});         // case-insensitive contractions
  CHECK(pieces(q35, "x=1234;\n") == V{"x", "=", "1", "2", "3", "4", ";\n"});
  CHECK(pieces(q35, "trailing  ") == V{"trailing", "  "});
  // \p{M}: a combining mark stays in the word for qwen35, starts a new piece for qwen2.
  CHECK(pieces(q35, "e\xCC\x81x") == V{"e\xCC\x81x"});
  CHECK(pieces(q2, "e\xCC\x81x") == V{"e", "\xCC\x81x"});
  // Unicode whitespace is \s (Oniguruma's set, which includes U+0085 NEL).
  CHECK(pieces(q35, "a\xC2\x85\xC2\x85" "b") == V{"a", "\xC2\x85", "\xC2\x85" "b"});
  CHECK(pieces(q35, "a\xE3\x80\x80\xE3\x80\x80" "b") == V{"a", "\xE3\x80\x80", "\xE3\x80\x80" "b"});
  CHECK(pieces(q35, "").empty());
  CHECK_THROWS_AS(PreTokenizer("gpt4o"), TokenizerError);
  // Long runs stay linear and in one piece (JIT stack is not exhausted).
  const std::string letters(1 << 20, 'x');
  CHECK(pieces(q35, letters) == V{letters});
  const std::string spaces = std::string(1 << 20, ' ') + "a";
  CHECK(pieces(q35, spaces) == V{std::string((1 << 20) - 1, ' '), " a"});
}

TEST_CASE("BPE applies merges lowest rank first, leftmost on ties", "[text]") {
  {
    const Tokenizer tok(mini_vocab({{"a", "a"}, {"aa", "aa"}}));
    const int32_t aa = 256, aaaa = 257;
    CHECK(tok.encode("aaaaa", false) == std::vector<int32_t>{aaaa, 'a'});
    CHECK(tok.encode("aaa", false) == std::vector<int32_t>{aa, 'a'});
    CHECK(tok.encode("a", false) == std::vector<int32_t>{'a'});
    CHECK(tok.encode("aa", false) == std::vector<int32_t>{aa});
  }
  {
    const Tokenizer tok(mini_vocab({{"b", "c"}, {"a", "b"}}));  // "b c" outranks "a b"
    CHECK(tok.encode("abc", false) == std::vector<int32_t>{'a', 256});
    CHECK(tok.encode("ab", false) == std::vector<int32_t>{257});
    CHECK(tok.encode("abab", false) == std::vector<int32_t>{257, 257});
  }
  {
    // A long piece: 100k "ab" merges to 100k tokens (no quadratic blowup, no cache).
    const Tokenizer tok(mini_vocab({{"a", "b"}}));
    std::string s;
    for (int i = 0; i < 100000; ++i) s += "ab";
    const auto ids = tok.encode(s, false);
    REQUIRE(ids.size() == 100000);
    CHECK(std::all_of(ids.begin(), ids.end(), [](int32_t id) { return id == 256; }));
    CHECK(tok.decode(ids) == s);
  }
}

TEST_CASE("vocabulary loading rejects bad input with clear errors", "[text]") {
  using Catch::Contains;
  {
    const Vocab v = load(mini_gguf());
    CHECK(v.size() == 258);
    CHECK(v.n_real == 258);
    const Tokenizer tok(v);
    CHECK(tok.encode("xab", false) == std::vector<int32_t>{'x', 256});
  }
  auto with = [](const std::string& key, gguf::Value value) {
    gguf::Writer w = mini_gguf();
    w.set(key, std::move(value));
    return w;
  };
  CHECK_THROWS_WITH(load(with("tokenizer.ggml.model", gguf::Value::of_str("llama"))), Contains("gpt2"));
  CHECK_THROWS_WITH(load(with("tokenizer.ggml.pre", gguf::Value::of_str("gpt-4o"))), Contains("gpt-4o"));
  CHECK_THROWS_WITH(load(with("tokenizer.ggml.token_type", gguf::Value::of_i32s({1, 1}))),
                    Contains("token_type"));
  CHECK_THROWS_WITH(load(with("tokenizer.ggml.token_type", gguf::Value::of_i32s(std::vector<int32_t>(258, 9)))),
                    Contains("token type"));
  CHECK_THROWS_WITH(load(with("tokenizer.ggml.eos_token_id", gguf::Value::of_u32(999))), Contains("eos"));
  CHECK_THROWS_WITH(load(with("tokenizer.ggml.merges", gguf::Value::of_strs({"ab"}))), Contains("'A B'"));
  CHECK_THROWS_WITH(load(with("tokenizer.ggml.tokens", gguf::Value::of_u32(3))), Contains("tokenizer.ggml.tokens"));
  // A merge whose result is not a token is caught when the tokenizer is built.
  CHECK_THROWS_WITH(Tokenizer(load(with("tokenizer.ggml.merges", gguf::Value::of_strs({"a c"})))),
                    Contains("'ac' is not a token"));
  Vocab no_bytes = mini_vocab({});
  no_bytes.tokens[65] = "not-a-byte";
  CHECK_THROWS_WITH(Tokenizer(no_bytes), Contains("byte 0x41"));
  CHECK_THROWS_WITH(Vocab::from_hf_json("/nonexistent/tokenizer.json"), Contains("cannot open"));
  CHECK_THROWS_AS(Vocab::from_hf_json(shared_path("fixtures/tiny-chat-cases.json")), TokenizerError);
}

TEST_CASE("encoding a long document is fast", "[text][fixtures]") {
  // Varied content: the test strings plus generated prose, code, numbers, CJK and emoji.
  std::vector<std::string> parts;
  for (const char* f : {"reference/tokenizer-tests/ggml-vocab-qwen35.gguf", "reference/tokenizer-tests/ggml-vocab-qwen2.gguf"})
    for (const auto& c : read_vocab_tests(shared_path(f))) parts.push_back(c.text);
  const std::vector<std::string> words = {"the", "model", "tokenizer", "GPU", "throughput", "résumé", "naïve",
                                          "Привет", "мир", "数据", "模型", "推理", "🚀", "😀", "for", "int",
                                          "return", "std::vector<int>", "x_1", "HTTP/1.1", "don't", "we'll"};
  std::mt19937 rng(1234);
  std::string doc;
  while (doc.size() < (3u << 20)) {
    switch (rng() % 6) {
      case 0: doc += parts[rng() % parts.size()]; break;
      case 1: doc += std::to_string(rng()); break;
      case 2: doc += "\n    if (a[" + std::to_string(rng() % 100) + "] != b) {\n        return;\n    }\n"; break;
      default:
        for (int i = 0; i < 12; ++i) doc += (i ? " " : "") + words[rng() % words.size()];
        doc += rng() % 3 ? ". " : ".\n\n";
    }
  }
  // The bound is on the process's CPU time, not the wall clock: on a loaded 2-core machine (ctest -j2 beside
  // other builds) the wall clock also counts the time other processes had the cores.
  auto cpu_seconds = [] {
    timespec t{};
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
    return static_cast<double>(t.tv_sec) + static_cast<double>(t.tv_nsec) * 1e-9;
  };
  auto time_encode = [&](const Tokenizer& tok, std::string_view text, const char* what) {
    std::vector<int32_t> ids;
    double best = 1e9, first = 0, first_wall = 0;
    for (int rep = 0; rep < 3; ++rep) {
      const auto w0 = std::chrono::steady_clock::now();
      const double c0 = cpu_seconds();
      ids = tok.encode(text, true);
      const double s = cpu_seconds() - c0;
      if (rep == 0) first = s, first_wall = std::chrono::duration<double>(std::chrono::steady_clock::now() - w0).count();
      best = std::min(best, s);
    }
    WARN(what << ": " << ids.size() << " tokens from " << text.size() << " bytes: first (cold cache) "
              << first * 1e3 << " ms CPU (" << first_wall * 1e3 << " ms wall), best " << best * 1e3 << " ms CPU");
    CHECK(tok.decode(ids) == nfc(text));
#if defined(__OPTIMIZE__) && !defined(__SANITIZE_ADDRESS__)
    CHECK(first < 1.0 * static_cast<double>(ids.size()) / 262144.0 + 0.1);  // "well under a second" per 256K
#endif
    return ids.size();
  };
  // Cut the document to about 256K tokens of each vocabulary (the tiny one needs far more tokens per
  // byte), at a character boundary; time a fresh tokenizer so the first run has a cold cache.
  auto cut_to_256k = [&](const Tokenizer& tok) {
    size_t cut = doc.size() * 262144 / tok.encode(doc, false).size();
    while (cut < doc.size() && (static_cast<unsigned char>(doc[cut]) & 0xC0) == 0x80) ++cut;
    return std::string_view(doc).substr(0, std::min(cut, doc.size()));
  };
  {
    const auto cut = cut_to_256k(tiny_tokenizer());
    const Tokenizer tiny = Tokenizer::from_gguf(gguf::File::open(shared_path("fixtures/tiny.gguf")));
    CHECK(time_encode(tiny, cut, "tiny vocab") > 200000);
  }
  QRIG_REQUIRE_INPUT(qwen3_tokenizer(), "qwen3 vocabulary timing not run: " << kQwen3Missing);
  const auto cut = cut_to_256k(*qwen3_tokenizer());
  const Tokenizer qwen3(Vocab::from_hf_json(std::getenv("QRIG_QWEN3_TOKENIZER_JSON")));
  CHECK(time_encode(qwen3, cut, "qwen3 vocab") > 200000);
  CHECK(time_encode(qwen3, doc, "qwen3 vocab, whole document") > 800000);
}
