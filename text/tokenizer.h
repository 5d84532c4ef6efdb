// Byte-level BPE tokenizer for Qwen3.5/3.6 (and Qwen2/Qwen3) vocabularies, matching Hugging Face
// `tokenizers` (encode without added special tokens): added-token split, NFC, the pre-tokenizer
// regex (PCRE2 + JIT), byte-level BPE by merge rank. Plus decoding, incremental (streaming) decoding
// that never emits half a character, and the end-of-generation set the sampler stops on.
//
// Invalid UTF-8 given to encode() is not an error: each maximal ill-formed subsequence is replaced
// by U+FFFD first (sanitize_utf8), exactly as a client's lossy decoding would.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "text/unicode.h"
#include "text/vocab.h"

namespace qrig::gguf {
class File;
}

namespace qrig::text {

class Tokenizer {
 public:
  // Builds the lookup tables; throws TokenizerError if a merge names a token that is not in the
  // vocabulary or a byte has no token.
  explicit Tokenizer(Vocab vocab);
  static Tokenizer from_gguf(const gguf::File& file);
  ~Tokenizer();
  Tokenizer(Tokenizer&&) noexcept;
  Tokenizer& operator=(Tokenizer&&) noexcept;
  Tokenizer(const Tokenizer&) = delete;
  Tokenizer& operator=(const Tokenizer&) = delete;

  // Text -> ids. parse_special: control and user-defined tokens written in the text (e.g.
  // "<|im_start|>", "<think>") become their single ids (leftmost-longest match, as HF does);
  // otherwise they are ordinary text. No BOS/EOS is added. Thread-safe.
  std::vector<int32_t> encode(std::string_view utf8, bool parse_special) const;

  // Text -> ids with added tokens recognised everywhere except in the byte ranges `literal`
  // ([begin, end) of utf8, sorted, disjoint; empty ones are ignored), whose bytes stay ordinary text:
  // a match that would overlap a range is not taken (a shorter token at the same place still can be).
  // Used for a rendered chat, whose ranges are the text that came from the request (chat.h:
  // encode_chat). The text between recognised tokens is normalised, pre-tokenized and merged as one
  // piece across range boundaries, exactly as encode(utf8, true) does, so the ids equal
  // encode(utf8, true) whenever no match of that overlaps a range, and encode(utf8, false) when one
  // range covers the text. Invalid UTF-8 is repaired range by range and gap by gap (so each range
  // still covers its own text). Throws std::invalid_argument for ranges that are unsorted,
  // overlapping, reversed or past the end. Thread-safe.
  std::vector<int32_t> encode_literal(std::string_view utf8,
                                      const std::vector<std::pair<size_t, size_t>>& literal) const;

  // Ids -> the exact bytes the tokens stand for (may be invalid UTF-8 if the ids split a character;
  // pass it through sanitize_utf8 before handing it to JSON). Throws TokenizerError for an id
  // outside the vocabulary.
  std::string decode(const std::vector<int32_t>& ids) const;

  // Raw bytes of one token: byte-level tokens decoded to bytes, control and user-defined tokens
  // give their text, unused (padding) tokens give "". Throws TokenizerError when out of range.
  const std::string& token_to_bytes(int32_t id) const;

  // End of generation: eos (<|im_end|>), eot if the file names one, and <|endoftext|>.
  bool is_eog(int32_t id) const;
  std::vector<int32_t> eog_ids() const;

  // Ids >= n_real() are padding rows (never sample them). n_vocab() counts all rows.
  int32_t n_real() const;
  int32_t n_vocab() const;
  TokenType token_type(int32_t id) const;

  // The id of the token whose stored text is exactly `text` (added tokens such as "<|im_end|>" are
  // stored as plain text, byte-level tokens in GPT-2's mapping, e.g. "Ġthe").
  std::optional<int32_t> find_token(std::string_view text) const;

  const Vocab& vocab() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Incremental decoding for streaming: feed ids one at a time, get back text that is always valid,
// complete UTF-8. An incomplete multi-byte sequence at the end is held back until later tokens
// complete it; ill-formed bytes become U+FFFD. The concatenation of every push() and the final
// flush() equals sanitize_utf8(tokenizer.decode(ids)).
class StreamDecoder {
 public:
  explicit StreamDecoder(const Tokenizer& tokenizer) : tok_(&tokenizer) {}
  std::string push(int32_t id);
  // Emits whatever is held back (an unfinished character becomes U+FFFD) and resets.
  std::string flush();
  // Bytes currently held back (0..3).
  size_t pending() const { return pending_.size(); }

 private:
  const Tokenizer* tok_;
  std::string pending_;
};

}  // namespace qrig::text
