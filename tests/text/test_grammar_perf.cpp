// Cost of one constrained-decoding mask on a large vocabulary (text/grammar.h): a synthetic 248k-token
// vocabulary built in the test (words, punctuation, digits, whitespace runs, CJK and partial UTF-8, quote
// tokens, Qwen tags) and, when QRIG_QWEN3_TOKENIZER_JSON is set, the real 151k Qwen3 vocabulary. Times are
// printed per grammar state; bounds are checked in optimised builds only. Random walks on the synthetic
// vocabulary also check that the trie and the lexeme caches stay correct on real-sized data.
#include <catch2/catch.hpp>

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <ctime>
#include <map>
#include <random>
#include <set>
#include <string>
#include <vector>

#include "tests/text/grammar_test_util.h"
#include "tests/text/tokenizer_test_util.h"
#include "text/grammar.h"

using namespace qrig::text;
using namespace qrig::text::testutil;

namespace {

struct SyntheticVocab {
  std::shared_ptr<const TokenVocab> vocab;
  std::map<std::string, int32_t> ids;
  size_t max_len = 0;

  // Greedy longest match (every byte has a token, so any text can be written).
  std::vector<int32_t> encode(const std::string& s) const {
    std::vector<int32_t> out;
    for (size_t i = 0; i < s.size();) {
      for (size_t n = std::min(max_len, s.size() - i); n > 0; --n)
        if (auto it = ids.find(s.substr(i, n)); it != ids.end()) {
          out.push_back(it->second);
          i += n;
          break;
        }
    }
    return out;
  }
};

const SyntheticVocab& synthetic_vocab() {
  static const SyntheticVocab sv = [] {
    std::mt19937_64 rng(2024);
    std::set<std::string> set;
    auto pick = [&](const std::string& alphabet) { return alphabet[rng() % alphabet.size()]; };
    auto below = [&](size_t n) { return static_cast<size_t>(rng() % n); };
    const std::string letters = "abcdefghijklmnopqrstuvwxyz", punct = "{}[]():;,.\"'`!?<>/=-_+*#@$%^&|~\\";
    while (set.size() < 175000) {  // words, some capitalised, most with a leading space
      std::string w = below(2) ? " " : "";
      const size_t n = 2 + below(11);
      for (size_t i = 0; i < n; ++i) w += pick(letters);
      if (below(5) == 0) w[w.size() - n] = static_cast<char>(std::toupper(w[w.size() - n]));
      set.insert(w);
    }
    while (set.size() < 195000) {  // punctuation runs, sometimes after a space or newline or before one
      std::string w = below(3) == 0 ? " " : below(4) == 0 ? "\n" : "";
      const size_t n = 1 + below(4);
      for (size_t i = 0; i < n; ++i) w += pick(punct);
      if (below(6) == 0) w += "\n";
      set.insert(w);
    }
    for (int i = 0; i < 10000; ++i) set.insert((below(2) ? " " : "") + std::to_string(rng() % 10000));
    for (int n = 1; n <= 64; ++n) {
      set.insert(std::string(static_cast<size_t>(n), ' '));
      set.insert("\n" + std::string(static_cast<size_t>(n), ' '));
      set.insert(std::string(static_cast<size_t>(n), '\t'));
      set.insert(std::string(static_cast<size_t>(2 * n), '-'));
    }
    set.insert(std::string(128, '='));
    for (const char* s : {"\n", "\n\n", "\n\n\n", "\":", "\",", "\"\n", " \"", "=\"", "\")", "\": \"", "\"}", "\"]", "{\"",
                          "\\n", "\\\"", "\\u", "</", "<parameter", "</parameter", ">\n"})
      set.insert(s);
    while (set.size() < 240000) {  // CJK, Cyrillic, accented Latin, some with quotes around
      std::string w = below(3) == 0 ? " " : "";
      const size_t n = 1 + below(3);
      for (size_t i = 0; i < n; ++i) {
        const uint32_t cp = below(3) == 0 ? 0x430 + below(32) : below(2) ? 0x4E00 + below(20000) : 0xE0 + below(30);
        if (cp < 0x800) {
          w += static_cast<char>(0xC0 | (cp >> 6));
          w += static_cast<char>(0x80 | (cp & 0x3F));
        } else {
          w += static_cast<char>(0xE0 | (cp >> 12));
          w += static_cast<char>(0x80 | ((cp >> 6) & 0x3F));
          w += static_cast<char>(0x80 | (cp & 0x3F));
        }
      }
      if (below(20) == 0) w = "\"" + w;
      set.insert(w);
    }
    while (set.size() < 243000) {  // partial UTF-8: the first bytes of a 3-byte character, or its tail
      const uint32_t cp = 0x4E00 + below(20000);
      std::string c{static_cast<char>(0xE0 | (cp >> 12)), static_cast<char>(0x80 | ((cp >> 6) & 0x3F)),
                    static_cast<char>(0x80 | (cp & 0x3F))};
      set.insert(below(2) ? c.substr(0, 2) : c.substr(1));
    }
    while (set.size() < 247500) {  // words glued to quotes and JSON punctuation
      std::string w;
      for (size_t i = 0, n = 2 + below(6); i < n; ++i) w += pick(letters);
      const char* glue[] = {"\"", "\":", "\",", "\"}", "(\"", "\")"};
      set.insert(below(2) ? glue[below(6)] + w : w + glue[below(6)]);
    }
    for (int b = 0; b < 256; ++b) set.insert(std::string(1, static_cast<char>(b)));
    std::vector<std::string> bytes(set.begin(), set.end());
    std::shuffle(bytes.begin(), bytes.end(), rng);
    std::vector<bool> control(bytes.size(), false);
    SyntheticVocab out;
    for (const char* tag : {"<tool_call>", "</tool_call>", "<think>", "</think>"}) {
      bytes.push_back(tag);
      control.push_back(false);
    }
    std::vector<int32_t> eog;
    for (const char* special : {"<|endoftext|>", "<|im_start|>", "<|im_end|>"}) {
      if (std::string(special) != "<|im_start|>") eog.push_back(static_cast<int32_t>(bytes.size()));
      bytes.push_back(special);
      control.push_back(true);
    }
    for (size_t i = 0; i < bytes.size(); ++i) {
      if (control[i]) continue;
      out.ids.emplace(bytes[i], static_cast<int32_t>(i));
      out.max_len = std::max(out.max_len, bytes[i].size());
    }
    out.vocab = std::make_shared<const TokenVocab>(std::move(bytes), std::move(control), std::move(eog));
    return out;
  }();
  return sv;
}

double cpu_ms() {
  timespec t;
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return t.tv_sec * 1e3 + t.tv_nsec * 1e-6;
}

struct Timing {
  double mask_ms;   // allowed(std::vector<bool>&)
  double bits_ms;   // allowed_bits
  double first_ms;  // the first call (fills lexeme caches)
  size_t allowed;
};

// Feeds `prefix` (token ids), then times masks in the state reached.
Timing time_state(TokenGrammar& g, const std::vector<int32_t>& prefix) {
  for (int32_t id : prefix) g.accept(id);
  std::vector<bool> mask;
  std::vector<uint64_t> bits;
  double t0 = cpu_ms();
  g.allowed(mask);
  const double first = cpu_ms() - t0;
  size_t n = 0;
  for (bool b : mask) n += b;
  const int reps = 20;
  t0 = cpu_ms();
  for (int i = 0; i < reps; ++i) g.allowed(mask);
  const double mask_ms = (cpu_ms() - t0) / reps;
  t0 = cpu_ms();
  for (int i = 0; i < reps; ++i) g.allowed_bits(bits);
  const double bits_ms = (cpu_ms() - t0) / reps;
  return {mask_ms, bits_ms, first, n};
}

const char* kPerson =
    R"({"type":"object","properties":{"name":{"type":"string"},"age":{"type":"integer"},"bio":{"type":"string","maxLength":300},
       "tags":{"type":"array","items":{"type":"string"}}},"required":["name","age"]})";

// Ranges, patterns and formats (grammar_number.h, grammar_regex.h).
const char* kRich =
    R"({"type":"object","properties":{"id":{"type":"string","pattern":"^[A-Z]{2}-\\d{4,6}$"},
       "email":{"type":"string","format":"email"},"when":{"type":"string","format":"date-time"},
       "note":{"type":"string","pattern":"^[^<>]*$","maxLength":200},
       "qty":{"type":"integer","minimum":1,"maximum":250,"multipleOf":5},"price":{"type":"number","minimum":0.01,"maximum":99999.99},
       "kind":{"enum":["a","b",{"c":[1,2]}]}},"required":["id","email","when","note","qty","price","kind"]})";

const ojson& perf_tools() {
  static const ojson tools = ojson::parse(R"([{"type":"function","function":{"name":"write_file","parameters":{
      "type":"object","properties":{"path":{"type":"string"},"content":{"type":"string"},"mode":{"type":"integer"},
      "meta":{"type":"object","properties":{"title":{"type":"string"}}}},"required":["path","content"]}}}])");
  return tools;
}

// One row per state: what the server pays per sampling step there.
void report(const char* vocab_name, const std::shared_ptr<const TokenVocab>& vocab,
            const std::function<std::vector<int32_t>(const std::string&)>& encode, std::vector<double>& cached,
            std::vector<double>& walked) {
  struct State {
    const char* what;
    int kind;  // 0 json_object, 1 person schema, 2 tool call (thinking), 3 tool call (no thinking), 4 kRich
    std::string prefix;
    bool lexeme;  // in a cached lexeme state (else: a trie walk)
  };
  const std::vector<State> states = {
      {"json_object: start", 0, "", false},
      {"json_object: value after key", 0, "{\"key\": ", false},
      {"json_object: inside a string", 0, "{\"key\": \"some text", true},
      {"json_object: after a value", 0, "{\"key\": \"v\"", false},
      {"json_object: inside a number", 0, "{\"key\": 12", false},
      {"schema: inside a free string", 1, "{\"name\": \"Ada Lovelace", true},
      {"schema: string near its maxLength (300)", 1,
       "{\"name\": \"A\", \"age\": 36, \"bio\": \"" + std::string(250, 'x'), true},
      {"schema: after a required member", 1, "{\"name\": \"A\", \"age\": 36", false},
      {"tool call: reasoning text", 2, "The user wants a file", true},
      {"tool call: raw string value", 3, "<tool_call>\n<function=write_file>\n<parameter=content>\nHello, world", true},
      {"tool call: between parameters", 3, "<tool_call>\n<function=write_file>\n<parameter=path>\n/tmp/x\n</parameter>\n", false},
      {"tool call: JSON value", 3, "<tool_call>\n<function=write_file>\n<parameter=meta>\n{\"title\": ", false},
      {"rich: inside a pattern string", 4, "{\"id\": \"AB-12", true},
      {"rich: inside an email", 4, "{\"id\": \"AB-1234\", \"email\": \"jane.doe", true},
      {"rich: inside a free-ish pattern string near maxLength", 4,
       "{\"id\": \"AB-1234\", \"email\": \"a@b.co\", \"when\": \"2024-01-01T00:00:00Z\", \"note\": \"" +
           std::string(180, 'x'), true},
      {"rich: inside a ranged integer", 4,
       "{\"id\": \"AB-1234\", \"email\": \"a@b.co\", \"when\": \"2024-01-01T00:00:00Z\", \"note\": \"n\", \"qty\": 1",
       false},
      {"rich: inside a ranged decimal", 4,
       "{\"id\": \"AB-1234\", \"email\": \"a@b.co\", \"when\": \"2024-01-01T00:00:00Z\", \"note\": \"n\", \"qty\": 15, "
       "\"price\": 12.3",
       false},
  };
  for (const State& s : states) {
    std::unique_ptr<TokenGrammar> g;
    if (s.kind == 0) g = TokenGrammar::json_schema(ojson(nullptr), vocab);
    else if (s.kind == 1) g = TokenGrammar::json_schema(ojson::parse(kPerson), vocab);
    else if (s.kind == 4) g = TokenGrammar::json_schema(ojson::parse(kRich), vocab);
    else g = TokenGrammar::tool_call(perf_tools(), std::nullopt, false, s.kind == 2, vocab);
    const Timing t = time_state(*g, encode(s.prefix));
    std::printf("grammar mask, %s (%d tokens), %-42s %7.3f ms (bits %6.3f ms, first %7.2f ms), %6zu allowed\n",
                vocab_name, vocab->size(), s.what, t.mask_ms, t.bits_ms, t.first_ms, t.allowed);
    REQUIRE(t.allowed > 0);
    (s.lexeme ? cached : walked).push_back(t.mask_ms);
  }
}

}  // namespace

TEST_CASE("grammar: mask cost on a large vocabulary (timing printed)", "[text]") {
  const SyntheticVocab& sv = synthetic_vocab();
  REQUIRE(sv.vocab->size() > 245000);
  std::vector<double> cached, walked, builds;
  auto t0 = std::chrono::steady_clock::now();
  for (int i = 0; i < 3; ++i) {
    t0 = std::chrono::steady_clock::now();
    (void)TokenGrammar::json_schema(ojson::parse(kRich), sv.vocab);
    builds.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    std::printf("grammar build (ranges, patterns, formats): %.3f ms\n", builds.back());
    t0 = std::chrono::steady_clock::now();
    (void)TokenGrammar::json_schema(ojson::parse(kPerson), sv.vocab);
    std::printf("grammar build (person schema): %.3f ms\n",
                std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    t0 = std::chrono::steady_clock::now();
    (void)TokenGrammar::tool_call(perf_tools(), std::nullopt, false, true, sv.vocab);
    std::printf("grammar build (tool call): %.3f ms\n",
                std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  report("synthetic", sv.vocab, [&](const std::string& s) { return sv.encode(s); }, cached, walked);
  if (const Tokenizer* q = qwen3_tokenizer()) {
    t0 = std::chrono::steady_clock::now();
    const auto vocab = TokenVocab::of(*q);
    std::printf("TokenVocab::of(qwen3): %.1f ms\n",
                std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    t0 = std::chrono::steady_clock::now();
    REQUIRE(TokenVocab::of(*q) == vocab);  // cached
    std::printf("TokenVocab::of(qwen3) again (cached): %.1f ms\n",
                std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
    report("qwen3", vocab, [&](const std::string& s) { return q->encode(s, true); }, cached, walked);
  }
#ifdef __OPTIMIZE__
  for (double ms : cached) CHECK(ms < 5.0);
  for (double ms : walked) CHECK(ms < 50.0);
  CHECK(*std::min_element(builds.begin(), builds.end()) < 250.0);  // automata built per request
#else
  WARN("unoptimised build: grammar timing bounds not checked");
#endif
  QRIG_REQUIRE_INPUT(qwen3_tokenizer(), "real-vocabulary timing not run: " << kQwen3Missing);
}

TEST_CASE("grammar: random walks on the large synthetic vocabulary", "[text]") {
  const SyntheticVocab& sv = synthetic_vocab();
  auto encode = [&](const std::string& s) { return sv.encode(s); };
  for (uint64_t seed = 1; seed <= 4; ++seed) {
    const ojson schema = ojson::parse(kPerson);
    auto g = TokenGrammar::json_schema(schema, sv.vocab);
    const WalkResult r = random_walk(*g, encode, {"\"", "}", "]", "0", "\"\""}, seed, 3000, true);
    INFO(show(r.text));
    REQUIRE(r.completed);
    CHECK(validate(ojson::parse(r.text), schema, schema) == "");
    auto t = TokenGrammar::tool_call(perf_tools(), std::nullopt, false, true, sv.vocab);
    const WalkResult w = random_walk(*t, encode, {"\n</parameter>\n", "</function>\n</tool_call>", "</think>\n\n", "\"", "}"},
                                     seed, 3000, true);
    INFO(show(w.text));
    REQUIRE(w.completed);
  }
  // Spot-check masks against accepts() in a cached lexeme state (reasoning text) on 20k random ids.
  auto g = TokenGrammar::tool_call(perf_tools(), std::nullopt, false, true, sv.vocab);
  for (int32_t id : sv.encode("Let me think about \"quotes\" and </para")) g->accept(id);
  std::vector<bool> mask;
  g->allowed(mask);
  std::mt19937 rng(5);
  int32_t wrong = -1;
  size_t allowed = 0;
  for (int i = 0; i < 20000; ++i) {
    const auto id = static_cast<int32_t>(rng() % static_cast<uint32_t>(sv.vocab->size()));
    if (mask[static_cast<size_t>(id)] != g->accepts(id)) wrong = id;
    allowed += mask[static_cast<size_t>(id)];
  }
  INFO("mask and accepts() disagree on id " << wrong);
  CHECK(wrong == -1);
  CHECK(allowed > 15000);
}
