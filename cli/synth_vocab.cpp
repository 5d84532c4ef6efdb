// The vocabulary of `qrig synth` models: byte tokens, BPE merges trained here on a small built-in text (the
// chat template plus a paragraph), the Qwen3.5 added tokens and padding rows; and the embedded chat template.
#include <map>
#include <set>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "cli/synth.h"

namespace qrig::cli {

namespace {

constexpr size_t kBaseTokens = 1000;  // byte tokens + merges; the added tokens follow (ids as in tiny.gguf)

const char* const kTemplate =
#include "cli/chat_template_qwen35.inc"
    ;

// Training text besides the template (written for this file).
const char* const kParagraph =
    "A language model reads text as a sequence of tokens and predicts the next one. Each token is a row of the "
    "embedding table; the layers mix information across positions, and the output head turns the final hidden "
    "state into a score for every token in the vocabulary. Hybrid models interleave linear attention layers, "
    "whose state has a fixed size, with full attention layers that keep every key and value. The linear layers "
    "make long contexts cheap, while the attention layers keep the precise recall that retrieval needs.\n"
    "Quantized weights store small integers with one scale per block of thirty-two values. The engine "
    "compiles a static plan for each rig: which layers go on which card, which kernels run, how much memory "
    "the cache may use. Then it serves requests over an HTTP interface that speaks the same protocol as "
    "other servers, so existing clients work without changes.\n"
    "Tokenizers split words into pieces that occur often in the training text. The first pieces are single "
    "bytes, so any input can be encoded; later pieces join frequent pairs into longer units such as common "
    "words, prefixes and suffixes. The merge list records the order in which the pairs were joined.\n"
    "def main(argv):\n    for index, value in enumerate(argv):\n        print(f\"{index}: {value}\")\n    "
    "return 0\n\nint add(int a, int b) { return a + b; }\n"
    "In 2024 and 2025 the models grew to 9, 27 and 397 billion parameters; numbers like 3.14, 42 and 1000 "
    "appear in ordinary prose too.\n";

// The 33 added tokens of Qwen3.5 in the order of their real ids (248044..248076); all CONTROL in tiny.gguf.
const char* const kAddedTokens[] = {
    "<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|object_ref_start|>", "<|object_ref_end|>", "<|box_start|>",
    "<|box_end|>", "<|quad_start|>", "<|quad_end|>", "<|vision_start|>", "<|vision_end|>", "<|vision_pad|>",
    "<|image_pad|>", "<|video_pad|>", "<tool_call>", "</tool_call>", "<|fim_prefix|>", "<|fim_middle|>",
    "<|fim_suffix|>", "<|fim_pad|>", "<|repo_name|>", "<|file_sep|>", "<tool_response>", "</tool_response>",
    "<think>", "</think>", "<|audio_start|>", "<|audio_end|>", "<tts_pad>", "<tts_text_bos>", "<tts_text_eod>",
    "<tts_text_bos_single>", "<|audio_pad|>",
};
constexpr int32_t kNormal = 1, kControl = 3, kUnused = 5;

std::string utf8(uint32_t cp) {  // code points below 0x800 are all this mapping needs
  std::string s;
  if (cp < 0x80) {
    s += (char)cp;
  } else {
    s += (char)(0xC0 | (cp >> 6));
    s += (char)(0x80 | (cp & 0x3F));
  }
  return s;
}

// GPT-2 byte-level mapping: printable bytes map to themselves, the others to U+0100 upwards. Returns, in
// token-id order, the bytes and their unicode strings.
std::vector<std::pair<uint8_t, std::string>> byte_tokens() {
  std::vector<std::pair<uint8_t, std::string>> out;
  std::vector<bool> direct(256, false);
  for (int b = 0; b < 256; ++b) direct[b] = (b >= 33 && b <= 126) || (b >= 161 && b <= 172) || (b >= 174);
  for (int b = 0; b < 256; ++b)
    if (direct[b]) out.emplace_back((uint8_t)b, utf8((uint32_t)b));
  uint32_t next = 256;
  for (int b = 0; b < 256; ++b)
    if (!direct[b]) out.emplace_back((uint8_t)b, utf8(next++));
  return out;
}

// A simplified ASCII form of the Qwen pre-tokenizer (letters with one optional leading non-letter, single
// digits, punctuation runs with an optional leading space, whitespace), good enough to train merges on.
std::vector<std::string> split_words(const std::string& s) {
  auto letter = [](unsigned char c) { return (c | 0x20) >= 'a' && (c | 0x20) <= 'z' ? true : c >= 0x80; };
  auto digit = [](unsigned char c) { return c >= '0' && c <= '9'; };
  auto nl = [](unsigned char c) { return c == '\n' || c == '\r'; };
  auto space = [&](unsigned char c) { return c == ' ' || c == '\t' || nl(c); };
  auto punct = [&](unsigned char c) { return !space(c) && !letter(c) && !digit(c); };
  std::vector<std::string> out;
  size_t i = 0, n = s.size();
  while (i < n) {
    unsigned char c = s[i];
    size_t j = i + 1;
    if (letter(c) || (!nl(c) && !digit(c) && !letter(c) && j < n && letter(s[j]))) {
      while (j < n && letter(s[j])) ++j;
    } else if (digit(c)) {
    } else if (punct(c) || (c == ' ' && j < n && punct(s[j]))) {
      while (j < n && punct(s[j])) ++j;
      while (j < n && nl(s[j])) ++j;
    } else {  // whitespace: up to the last newline of the run, else all but a space before a word
      while (j < n && space(s[j])) ++j;
      size_t last_nl = std::string::npos;
      for (size_t k = i; k < j; ++k)
        if (nl(s[k])) last_nl = k;
      if (last_nl != std::string::npos) j = last_nl + 1;
      else if (j < n && j - i > 1) --j;
    }
    out.push_back(s.substr(i, j - i));
    i = j;
  }
  return out;
}

struct Trained {
  std::vector<std::string> tokens;  // bytes, then merge results in order of creation
  std::vector<std::string> merges;
};

// Plain BPE training: repeatedly join the most frequent adjacent pair (ties: the smallest pair), until the
// vocabulary has kBaseTokens entries.
Trained train() {
  Trained t;
  std::map<uint8_t, std::string> sym_of_byte;
  for (const auto& [b, s] : byte_tokens()) {
    sym_of_byte[b] = s;
    t.tokens.push_back(s);
  }
  std::set<std::string> known(t.tokens.begin(), t.tokens.end());
  std::map<std::string, uint64_t> counts;
  for (const std::string& w : split_words(std::string(kTemplate) + "\n" + kParagraph)) ++counts[w];
  struct Word {
    std::vector<std::string> sym;
    uint64_t count;
  };
  std::vector<Word> words;
  for (const auto& [w, c] : counts) {
    Word word{{}, c};
    for (unsigned char b : w) word.sym.push_back(sym_of_byte[b]);
    words.push_back(std::move(word));
  }
  while (t.tokens.size() < kBaseTokens) {
    std::map<std::pair<std::string, std::string>, uint64_t> pairs;
    for (const Word& w : words)
      for (size_t k = 0; k + 1 < w.sym.size(); ++k) pairs[{w.sym[k], w.sym[k + 1]}] += w.count;
    if (pairs.empty()) throw std::logic_error("synth vocabulary: training text too small for the merges");
    auto best = pairs.begin();
    for (auto it = pairs.begin(); it != pairs.end(); ++it)
      if (it->second > best->second) best = it;
    const auto [a, b] = best->first;
    t.merges.push_back(a + " " + b);
    if (known.insert(a + b).second) t.tokens.push_back(a + b);
    for (Word& w : words) {
      std::vector<std::string> next;
      for (size_t k = 0; k < w.sym.size(); ++k) {
        if (k + 1 < w.sym.size() && w.sym[k] == a && w.sym[k + 1] == b) {
          next.push_back(a + b);
          ++k;
        } else {
          next.push_back(w.sym[k]);
        }
      }
      w.sym = std::move(next);
    }
  }
  return t;
}

}  // namespace

const std::string& qwen35_chat_template() {
  static const std::string t = kTemplate;
  return t;
}

SynthVocab synth_vocab(uint64_t vocab_size) {
  static const Trained trained = train();
  constexpr size_t n_added = sizeof(kAddedTokens) / sizeof(kAddedTokens[0]);
  if (vocab_size < kBaseTokens + n_added)
    throw std::invalid_argument("synth vocabulary needs at least " + std::to_string(kBaseTokens + n_added) + " rows");
  SynthVocab v;
  v.tokens = trained.tokens;
  v.types.assign(v.tokens.size(), kNormal);
  v.merges = trained.merges;
  for (const char* tok : kAddedTokens) {
    if (std::string(tok) == "<|endoftext|>") v.padding_id = (uint32_t)v.tokens.size();
    if (std::string(tok) == "<|im_end|>") v.eos_id = (uint32_t)v.tokens.size();
    v.tokens.push_back(tok);
    v.types.push_back(kControl);
  }
  while (v.tokens.size() < vocab_size) {
    v.tokens.push_back("[PAD" + std::to_string(v.tokens.size()) + "]");
    v.types.push_back(kUnused);
  }
  return v;
}

}  // namespace qrig::cli
