// The pre-tokenizer: the Qwen split regex, compiled once with PCRE2 (JIT when available), that cuts
// normalised text into the pieces BPE runs on. Kept apart from the tokenizer so the regex and its
// PCRE2 handling can be read and tested on their own.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace qrig::text {

class PreTokenizer {
 public:
  // name: "qwen35" or "qwen2". Throws TokenizerError for other names or if PCRE2 rejects the pattern.
  explicit PreTokenizer(const std::string& name);
  ~PreTokenizer();
  PreTokenizer(const PreTokenizer&) = delete;
  PreTokenizer& operator=(const PreTokenizer&) = delete;

  // The PCRE2 pattern in use (tests print it on failure).
  const std::string& pattern() const { return pattern_; }
  bool jit() const { return jit_; }

  // Calls fn(std::string_view piece) for every piece of `text`, in order; the pieces concatenate to
  // `text`. `text` must be valid UTF-8 (the tokenizer sanitises first). Thread-safe.
  template <typename Fn>
  void split(std::string_view text, Fn&& fn) const {
    std::vector<std::pair<size_t, size_t>> spans;
    split_spans(text, spans);
    for (auto [b, e] : spans) fn(text.substr(b, e - b));
  }
  // The pieces as [begin, end) byte offsets, appended to `out`.
  void split_spans(std::string_view text, std::vector<std::pair<size_t, size_t>>& out) const;

 private:
  std::string pattern_;
  void* code_ = nullptr;  // pcre2_code_8*
  bool jit_ = false;
};

}  // namespace qrig::text
