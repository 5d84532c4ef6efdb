// Tokenizer tables, encode (added-token split -> NFC -> pre-tokenizer -> BPE; with literal ranges
// the added-token split skips them), decode and the streaming decoder (see tokenizer.h).
//
// BPE runs per piece on token ids: the piece's bytes start as their byte tokens, and adjacent pairs
// merge lowest rank first (leftmost on ties) through a heap with lazy invalidation, O(n log n) in the
// piece length, as Hugging Face's BPE does. Results are cached per piece text (bounded, shared by
// threads), so long documents pay mostly one hash lookup per piece.
#include "text/tokenizer.h"

#include <algorithm>
#include <array>
#include <functional>
#include <mutex>
#include <queue>
#include <stdexcept>
#include <unordered_map>

#include "gguf/gguf.h"
#include "text/tokenizer_pretok.h"

namespace qrig::text {

namespace {

using Spans = std::vector<std::pair<size_t, size_t>>;

struct MergeInfo {
  int32_t rank;
  int32_t result;
};

uint64_t pair_key(int32_t a, int32_t b) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32) | static_cast<uint32_t>(b);
}

// Bytes a stored token stands for.
std::string token_bytes_of(const std::string& text, TokenType type) {
  switch (type) {
    case TokenType::Unused:
      return {};
    case TokenType::Control:
    case TokenType::UserDefined:
    case TokenType::Unknown:
      return text;
    case TokenType::Byte:
      // SentencePiece-style "<0xAB>"; anything else is kept as text.
      if (text.size() == 6 && text.compare(0, 3, "<0x") == 0 && text[5] == '>') {
        try {
          return std::string(1, static_cast<char>(std::stoi(text.substr(3, 2), nullptr, 16)));
        } catch (const std::exception&) {
        }
      }
      return text;
    case TokenType::Normal:
      break;
  }
  // Byte-level token: map every code point back to its byte. A code point outside GPT-2's table
  // (never produced by byte-level training) is kept as its own UTF-8.
  std::string out;
  const ByteUnicode& bu = byte_unicode();
  size_t i = 0;
  while (i < text.size()) {
    int len = utf8_char_len(text, i);
    if (len <= 0) {  // ill-formed token text: keep the byte
      out.push_back(text[i]);
      ++i;
      continue;
    }
    char32_t cp = static_cast<unsigned char>(text[i]);
    if (len > 1) {
      cp &= 0x3F >> (len - 1);
      for (int k = 1; k < len; ++k) cp = (cp << 6) | (static_cast<unsigned char>(text[i + k]) & 0x3F);
    }
    const int b = bu.cp_to_byte(cp);
    if (b >= 0) {
      out.push_back(static_cast<char>(b));
    } else {
      out.append(text, i, len);
    }
    i += len;
  }
  return out;
}

constexpr size_t kCacheMaxEntries = 1 << 17;
constexpr size_t kCacheMaxPiece = 256;  // longer pieces are rare and not worth keeping

}  // namespace

struct Tokenizer::Impl {
  Vocab vocab;
  std::unique_ptr<PreTokenizer> pre;
  std::unordered_map<std::string, int32_t> text_to_id;
  std::array<int32_t, 256> byte_token{};
  std::unordered_map<uint64_t, MergeInfo> merges;
  std::vector<std::string> bytes;  // token_to_bytes table
  std::vector<bool> eog;
  // Added tokens matched in text when parse_special: per first byte, (text, id) longest first.
  std::array<std::vector<std::pair<std::string, int32_t>>, 256> specials;

  mutable std::mutex cache_mu;
  mutable std::unordered_map<std::string, std::vector<int32_t>> cache;

  void bpe(std::string_view piece, std::vector<int32_t>& out) const;
  void bpe_uncached(std::string_view piece, std::vector<int32_t>& out) const;
  void encode_plain(std::string_view text, std::vector<int32_t>& out) const;
  void encode_special(std::string_view text, const Spans& literal, std::vector<int32_t>& out) const;
};

Tokenizer::Tokenizer(Vocab vocab) : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  vocab.finalize();
  m.vocab = std::move(vocab);
  const Vocab& v = m.vocab;
  m.pre = std::make_unique<PreTokenizer>(v.pre);

  m.text_to_id.reserve(v.tokens.size());
  m.bytes.reserve(v.tokens.size());
  for (int32_t id = 0; id < v.size(); ++id) {
    m.text_to_id.emplace(v.tokens[id], id);  // first id wins on duplicates
    m.bytes.push_back(token_bytes_of(v.tokens[id], v.types[id]));
  }
  // Byte tokens and merges are looked up among normal tokens only.
  auto normal_id = [&](const std::string& text) -> int32_t {
    auto it = m.text_to_id.find(text);
    if (it == m.text_to_id.end() || v.types[it->second] != TokenType::Normal) return -1;
    return it->second;
  };
  const ByteUnicode& bu = byte_unicode();
  for (int b = 0; b < 256; ++b) {
    m.byte_token[b] = normal_id(bu.byte_to_utf8[b]);
    if (m.byte_token[b] < 0) {
      throw TokenizerError("vocabulary has no token for byte 0x" + std::string(1, "0123456789abcdef"[b >> 4]) +
                           "0123456789abcdef"[b & 15] + " ('" + bu.byte_to_utf8[b] + "'); not a byte-level BPE vocabulary");
    }
  }
  m.merges.reserve(v.merges.size() * 2);
  for (size_t r = 0; r < v.merges.size(); ++r) {
    const auto& [a, b] = v.merges[r];
    const int32_t ia = normal_id(a), ib = normal_id(b), ir = normal_id(a + b);
    if (ia < 0 || ib < 0 || ir < 0) {
      throw TokenizerError("merge " + std::to_string(r) + " '" + a + " " + b + "': '" +
                           (ia < 0 ? a : ib < 0 ? b : a + b) + "' is not a token of the vocabulary");
    }
    m.merges.emplace(pair_key(ia, ib), MergeInfo{static_cast<int32_t>(r), ir});  // first rank wins
  }

  for (int32_t id = 0; id < v.size(); ++id) {
    const TokenType t = v.types[id];
    if ((t == TokenType::Control || t == TokenType::UserDefined) && !v.tokens[id].empty()) {
      m.specials[static_cast<unsigned char>(v.tokens[id][0])].emplace_back(v.tokens[id], id);
    }
  }
  for (auto& list : m.specials) {
    std::stable_sort(list.begin(), list.end(), [](const auto& x, const auto& y) { return x.first.size() > y.first.size(); });
  }

  m.eog.assign(v.tokens.size(), false);
  m.eog[v.eos_id] = true;
  if (v.eot_id) m.eog[*v.eot_id] = true;
  for (const char* t : {"<|im_end|>", "<|endoftext|>"}) {
    auto it = m.text_to_id.find(t);
    if (it != m.text_to_id.end() && v.types[it->second] == TokenType::Control) m.eog[it->second] = true;
  }
}

Tokenizer Tokenizer::from_gguf(const gguf::File& file) { return Tokenizer(Vocab::from_gguf(file)); }

Tokenizer::~Tokenizer() = default;
Tokenizer::Tokenizer(Tokenizer&&) noexcept = default;
Tokenizer& Tokenizer::operator=(Tokenizer&&) noexcept = default;

void Tokenizer::Impl::bpe_uncached(std::string_view piece, std::vector<int32_t>& out) const {
  const size_t n = piece.size();
  if (n == 0) return;
  std::vector<int32_t> id(n), prev(n), next(n);
  for (size_t i = 0; i < n; ++i) {
    id[i] = byte_token[static_cast<unsigned char>(piece[i])];
    prev[i] = static_cast<int32_t>(i) - 1;
    next[i] = i + 1 < n ? static_cast<int32_t>(i + 1) : -1;
  }
  // Heap entries: (rank, left position); smallest rank first, then leftmost.
  using Entry = std::pair<int32_t, int32_t>;
  std::priority_queue<Entry, std::vector<Entry>, std::greater<Entry>> heap;
  auto consider = [&](int32_t left) {
    if (left < 0 || next[left] < 0) return;
    auto it = merges.find(pair_key(id[left], id[next[left]]));
    if (it != merges.end()) heap.emplace(it->second.rank, left);
  };
  for (int32_t i = 0; i + 1 < static_cast<int32_t>(n); ++i) consider(i);
  while (!heap.empty()) {
    const auto [rank, left] = heap.top();
    heap.pop();
    if (id[left] < 0 || next[left] < 0) continue;  // merged away, or now last
    const int32_t right = next[left];
    auto it = merges.find(pair_key(id[left], id[right]));
    if (it == merges.end() || it->second.rank != rank) continue;  // pair changed since it was queued
    id[left] = it->second.result;
    id[right] = -1;
    next[left] = next[right];
    if (next[right] >= 0) prev[next[right]] = left;
    consider(prev[left]);
    consider(left);
  }
  for (int32_t i = 0; i >= 0; i = next[i]) out.push_back(id[i]);
}

void Tokenizer::Impl::bpe(std::string_view piece, std::vector<int32_t>& out) const {
  if (piece.size() == 1) {
    out.push_back(byte_token[static_cast<unsigned char>(piece[0])]);
    return;
  }
  if (vocab.ignore_merges) {
    std::string mapped;
    for (char c : piece) mapped += byte_unicode().byte_to_utf8[static_cast<unsigned char>(c)];
    auto it = text_to_id.find(mapped);
    if (it != text_to_id.end() && vocab.types[it->second] == TokenType::Normal) {
      out.push_back(it->second);
      return;
    }
  }
  if (piece.size() > kCacheMaxPiece) {
    bpe_uncached(piece, out);
    return;
  }
  std::string key(piece);
  {
    std::lock_guard<std::mutex> lock(cache_mu);
    auto it = cache.find(key);
    if (it != cache.end()) {
      out.insert(out.end(), it->second.begin(), it->second.end());
      return;
    }
  }
  const size_t start = out.size();
  bpe_uncached(piece, out);
  std::vector<int32_t> result(out.begin() + static_cast<ptrdiff_t>(start), out.end());
  std::lock_guard<std::mutex> lock(cache_mu);
  if (cache.size() >= kCacheMaxEntries) cache.clear();
  cache.emplace(std::move(key), std::move(result));
}

void Tokenizer::Impl::encode_plain(std::string_view text, std::vector<int32_t>& out) const {
  if (text.empty()) return;
  std::string normalised;
  if (vocab.nfc) {
    normalised = nfc(text);
    text = normalised;
  }
  std::vector<std::pair<size_t, size_t>> spans;
  spans.reserve(text.size() / 4 + 1);
  pre->split_spans(text, spans);
  for (auto [b, e] : spans) bpe(text.substr(b, e - b), out);
}

// Leftmost-longest match of added tokens, none overlapping a literal range; the text between two
// matches is encoded as one piece. `text` is valid UTF-8.
void Tokenizer::Impl::encode_special(std::string_view text, const Spans& literal, std::vector<int32_t>& out) const {
  size_t plain_start = 0, i = 0, k = 0;  // literal[k]: the first non-empty range ending after i
  while (i < text.size()) {
    while (k < literal.size() && (literal[k].second <= i || literal[k].first == literal[k].second)) ++k;
    size_t limit = text.size();  // a match must end by here
    if (k < literal.size()) {
      if (literal[k].first <= i) {  // inside a literal range: no match starts here
        i = literal[k].second;
        continue;
      }
      limit = literal[k].first;
    }
    const std::pair<std::string, int32_t>* hit = nullptr;
    for (const auto& c : specials[static_cast<unsigned char>(text[i])]) {
      if (c.first.size() <= limit - i && text.compare(i, c.first.size(), c.first) == 0) {
        hit = &c;
        break;
      }
    }
    if (!hit) {
      ++i;
      continue;
    }
    encode_plain(text.substr(plain_start, i - plain_start), out);
    out.push_back(hit->second);
    i += hit->first.size();
    plain_start = i;
  }
  encode_plain(text.substr(plain_start), out);
}

std::vector<int32_t> Tokenizer::encode(std::string_view utf8, bool parse_special) const {
  const Impl& m = *impl_;
  std::string repaired;
  if (!is_valid_utf8(utf8)) {
    repaired = sanitize_utf8(utf8);
    utf8 = repaired;
  }
  std::vector<int32_t> out;
  out.reserve(utf8.size() / 3 + 1);
  if (parse_special) m.encode_special(utf8, {}, out);
  else m.encode_plain(utf8, out);
  return out;
}

std::vector<int32_t> Tokenizer::encode_literal(std::string_view utf8, const Spans& literal) const {
  size_t prev_end = 0;
  for (size_t k = 0; k < literal.size(); ++k) {
    const auto [b, e] = literal[k];
    if (b > e || e > utf8.size() || b < prev_end) {
      throw std::invalid_argument("encode_literal: range " + std::to_string(k) + " [" + std::to_string(b) + ", " +
                                  std::to_string(e) + ") is reversed, overlaps the one before or ends past the " +
                                  std::to_string(utf8.size()) + "-byte text");
    }
    prev_end = e;
  }
  std::vector<int32_t> out;
  out.reserve(utf8.size() / 3 + 1);
  if (is_valid_utf8(utf8)) {
    impl_->encode_special(utf8, literal, out);
    return out;
  }
  std::string text;
  Spans spans;
  size_t pos = 0;
  for (const auto& [b, e] : literal) {
    text += sanitize_utf8(utf8.substr(pos, b - pos));
    const size_t nb = text.size();
    text += sanitize_utf8(utf8.substr(b, e - b));
    spans.emplace_back(nb, text.size());
    pos = e;
  }
  text += sanitize_utf8(utf8.substr(pos));
  impl_->encode_special(text, spans, out);
  return out;
}

const std::string& Tokenizer::token_to_bytes(int32_t id) const {
  if (id < 0 || id >= n_vocab()) {
    throw TokenizerError("token id " + std::to_string(id) + " is outside the vocabulary of " +
                         std::to_string(n_vocab()) + " tokens");
  }
  return impl_->bytes[id];
}

std::string Tokenizer::decode(const std::vector<int32_t>& ids) const {
  std::string out;
  for (int32_t id : ids) out += token_to_bytes(id);
  return out;
}

bool Tokenizer::is_eog(int32_t id) const { return id >= 0 && id < n_vocab() && impl_->eog[id]; }

std::vector<int32_t> Tokenizer::eog_ids() const {
  std::vector<int32_t> ids;
  for (int32_t id = 0; id < n_vocab(); ++id)
    if (impl_->eog[id]) ids.push_back(id);
  return ids;
}

int32_t Tokenizer::n_real() const { return impl_->vocab.n_real; }
int32_t Tokenizer::n_vocab() const { return impl_->vocab.size(); }

TokenType Tokenizer::token_type(int32_t id) const {
  token_to_bytes(id);  // range check
  return impl_->vocab.types[id];
}

std::optional<int32_t> Tokenizer::find_token(std::string_view text) const {
  auto it = impl_->text_to_id.find(std::string(text));
  if (it == impl_->text_to_id.end()) return std::nullopt;
  return it->second;
}

const Vocab& Tokenizer::vocab() const { return impl_->vocab; }

std::string StreamDecoder::push(int32_t id) {
  pending_ += tok_->token_to_bytes(id);
  const size_t cut = utf8_complete_prefix(pending_);
  std::string out = sanitize_utf8(std::string_view(pending_).substr(0, cut));
  pending_.erase(0, cut);
  return out;
}

std::string StreamDecoder::flush() {
  std::string out = sanitize_utf8(pending_);
  pending_.clear();
  return out;
}

}  // namespace qrig::text
