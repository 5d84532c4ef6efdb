// Qwen pre-tokenizer regexes in PCRE2 syntax and the matching loop (see tokenizer_pretok.h).
//
// Hugging Face runs these patterns with Oniguruma, whose \s (Unicode) is tab..CR, space, U+0085 and
// the Z categories. PCRE2's \s (even with UCP) leaves out U+0085, so \s and \S are spelled out as
// an explicit class to match Oniguruma exactly.
#include "text/tokenizer_pretok.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <memory>
#include <new>

#include "text/vocab.h"

namespace qrig::text {

namespace {

#define QRIG_WS "\\t\\n\\x0B\\f\\r\\x20\\x{85}\\p{Z}"

// (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?[\p{L}\p{M}]+|\p{N}| ?[^\s\p{L}\p{M}\p{N}]+[\r\n]*
//   |\s*[\r\n]+|\s+(?!\S)|\s+
constexpr const char* kQwen35 =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)"
    "|[^\\r\\n\\p{L}\\p{N}]?[\\p{L}\\p{M}]+"
    "|\\p{N}"
    "| ?[^" QRIG_WS "\\p{L}\\p{M}\\p{N}]+[\\r\\n]*"
    "|[" QRIG_WS "]*[\\r\\n]+"
    "|[" QRIG_WS "]+(?![^" QRIG_WS "])"
    "|[" QRIG_WS "]+";

// Qwen2/Qwen3: the same without \p{M}.
constexpr const char* kQwen2 =
    "(?i:'s|'t|'re|'ve|'m|'ll|'d)"
    "|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+"
    "|\\p{N}"
    "| ?[^" QRIG_WS "\\p{L}\\p{N}]+[\\r\\n]*"
    "|[" QRIG_WS "]*[\\r\\n]+"
    "|[" QRIG_WS "]+(?![^" QRIG_WS "])"
    "|[" QRIG_WS "]+";

#undef QRIG_WS

pcre2_code* as_code(void* p) { return static_cast<pcre2_code*>(p); }

std::string pcre2_message(int rc) {
  PCRE2_UCHAR buf[256];
  pcre2_get_error_message(rc, buf, sizeof buf);
  return reinterpret_cast<const char*>(buf);
}

struct MatchDataDeleter {
  void operator()(pcre2_match_data* m) const { pcre2_match_data_free(m); }
};
struct MatchContextDeleter {
  void operator()(pcre2_match_context* m) const { pcre2_match_context_free(m); }
};
struct JitStackDeleter {
  void operator()(pcre2_jit_stack* s) const { pcre2_jit_stack_free(s); }
};

PCRE2_SPTR subject_of(std::string_view s) { return reinterpret_cast<PCRE2_SPTR>(s.data()); }

// Advance past one UTF-8 character of valid text.
size_t next_char(std::string_view s, size_t i) {
  ++i;
  while (i < s.size() && (static_cast<unsigned char>(s[i]) & 0xC0) == 0x80) ++i;
  return i;
}

}  // namespace

PreTokenizer::PreTokenizer(const std::string& name) {
  if (name == "qwen35") {
    pattern_ = kQwen35;
  } else if (name == "qwen2") {
    pattern_ = kQwen2;
  } else {
    throw TokenizerError("unsupported pre-tokenizer '" + name + "' (supported: qwen35, qwen2)");
  }
  int err = 0;
  PCRE2_SIZE err_off = 0;
  pcre2_code* code = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern_.data()), pattern_.size(), PCRE2_UTF,
                                   &err, &err_off, nullptr);
  if (!code) {
    throw TokenizerError("PCRE2 rejected the " + name + " pre-tokenizer pattern at offset " +
                         std::to_string(err_off) + ": " + pcre2_message(err));
  }
  code_ = code;
  // JIT is an optimisation: when the platform lacks it, pcre2_match interprets the same pattern.
  jit_ = pcre2_jit_compile(code, PCRE2_JIT_COMPLETE) == 0;
}

PreTokenizer::~PreTokenizer() {
  if (code_) pcre2_code_free(as_code(code_));
}

void PreTokenizer::split_spans(std::string_view text, std::vector<std::pair<size_t, size_t>>& out) const {
  if (text.empty()) return;
  std::unique_ptr<pcre2_match_data, MatchDataDeleter> md(pcre2_match_data_create_from_pattern(as_code(code_), nullptr));
  if (!md) throw std::bad_alloc();
  // JIT matching uses a 32 KiB stack by default, enough for these patterns on ordinary text. Should a
  // match ever exceed it, that match is retried with a large JIT stack (created only then: making
  // one per call would cost more than tokenizing a short prompt).
  std::unique_ptr<pcre2_match_context, MatchContextDeleter> big_mc;
  std::unique_ptr<pcre2_jit_stack, JitStackDeleter> big_stack;
  auto match = [&](size_t pos) {
    int rc = pcre2_match(as_code(code_), subject_of(text), text.size(), pos, PCRE2_NO_UTF_CHECK, md.get(),
                         big_mc.get());
    if (rc == PCRE2_ERROR_JIT_STACKLIMIT && !big_mc) {
      big_mc.reset(pcre2_match_context_create(nullptr));
      big_stack.reset(pcre2_jit_stack_create(64 * 1024, 64 * 1024 * 1024, nullptr));
      if (!big_mc || !big_stack) throw std::bad_alloc();
      pcre2_jit_stack_assign(big_mc.get(), nullptr, big_stack.get());
      rc = pcre2_match(as_code(code_), subject_of(text), text.size(), pos, PCRE2_NO_UTF_CHECK, md.get(),
                       big_mc.get());
    }
    return rc;
  };
  size_t pos = 0;
  while (pos < text.size()) {
    const int rc = match(pos);
    if (rc == PCRE2_ERROR_NOMATCH) {
      out.emplace_back(pos, text.size());  // unmatched tail (cannot happen with these patterns)
      break;
    }
    if (rc < 0) throw TokenizerError("pre-tokenizer regex failed: " + pcre2_message(rc));
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md.get());
    size_t b = ov[0], e = ov[1];
    if (b > pos) out.emplace_back(pos, b);  // unmatched gap: a piece of its own (HF "Isolated")
    if (e == b) {
      // An empty match would loop forever; the patterns have none, but be safe.
      e = next_char(text, b);
      out.emplace_back(b, e);
    } else {
      out.emplace_back(b, e);
    }
    pos = e;
  }
}

}  // namespace qrig::text
