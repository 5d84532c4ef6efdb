// The vocabulary of a byte-level BPE tokenizer as model files store it: token strings, their types,
// the merge list and the few special ids. Loaded from a GGUF (what qrig serves) or from a Hugging
// Face tokenizer.json (what tests compare against); the Tokenizer is built from it.
#pragma once

#include <cstdint>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace qrig::gguf {
class File;
}

namespace qrig::text {

// Every problem with a vocabulary or a tokenizer call (unsupported model, inconsistent tables,
// id out of range) is reported as this.
struct TokenizerError : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// llama.cpp's token types (GGUF key tokenizer.ggml.token_type).
enum class TokenType : int32_t {
  Normal = 1,
  Unknown = 2,
  Control = 3,
  UserDefined = 4,
  Unused = 5,
  Byte = 6,
};

struct Vocab {
  // Token strings as stored: normal tokens in GPT-2's byte-to-unicode mapping, added tokens
  // (control / user-defined) as their plain text.
  std::vector<std::string> tokens;
  std::vector<TokenType> types;
  // Merges in rank order (index = rank): the two token strings joined by one merge.
  std::vector<std::pair<std::string, std::string>> merges;
  // Pre-tokenizer: "qwen35" (Qwen3.5/3.6 regex, with \p{M}) or "qwen2" (Qwen2/Qwen3).
  std::string pre;
  int32_t eos_id = -1;
  std::optional<int32_t> eot_id;      // tokenizer.ggml.eot_token_id when present
  std::optional<int32_t> padding_id;  // Qwen: <|endoftext|>
  std::optional<int32_t> bos_id;      // Qwen GGUFs may set it to <|endoftext|> too
  // Count of real tokens: ids >= n_real are padding rows of the embedding (type Unused, "[PAD...]")
  // and must never be produced. Computed by finalize().
  int32_t n_real = 0;
  // Apply NFC before pre-tokenizing (Qwen's tokenizer.json normalizer). GGUF files do not record
  // the normalizer; Qwen models use NFC, so from_gguf sets true.
  bool nfc = true;
  // HF BPE option: a pre-token that is itself in the vocabulary is emitted whole without merging.
  // Not recorded in GGUF; false for Qwen.
  bool ignore_merges = false;

  int32_t size() const { return static_cast<int32_t>(tokens.size()); }

  // Reads tokenizer.ggml.{model,pre,tokens,token_type,merges,eos_token_id,...}. Throws
  // TokenizerError (naming the key) for a non-"gpt2" model, an unsupported pre-tokenizer, missing
  // keys or inconsistent tables.
  static Vocab from_gguf(const gguf::File& file);

  // Reads a Hugging Face tokenizer.json (BPE model, byte-level). The pre-tokenizer is recognised from
  // its Split regex unless `pre` names it. Added tokens become Control (special: true) or
  // UserDefined (special: false).
  static Vocab from_hf_json(const std::string& path, std::optional<std::string> pre = std::nullopt);

  // Checks consistency (sizes, ids in range, known pre-tokenizer) and computes n_real. Called by
  // both constructors; call it again after editing a Vocab by hand.
  void finalize();
};

}  // namespace qrig::text
