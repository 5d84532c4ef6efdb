// TokenVocab: the depth-first byte trie of a vocabulary, the per-tokenizer cache, and the per-lexer-state
// token sets (grammar_vocab.h).
#include "text/grammar_vocab.h"

#include <algorithm>
#include <functional>
#include <string_view>

#include "text/grammar_lexer.h"
#include "text/tokenizer.h"

namespace qrig::text {

namespace {

// The tags of Qwen's reasoning and tool-call format. Real Qwen3.5 GGUFs mark them USER_DEFINED, but a
// converter that marks every added token special (tiny.gguf does) makes them CONTROL; the model still writes
// them as single tokens, so they stay usable as text wherever the grammar wants their bytes. Other control
// tokens (<|im_start|>, vision markers...) are never text.
bool is_qwen_tag(const std::string& text) {
  return text == "<tool_call>" || text == "</tool_call>" || text == "<think>" || text == "</think>";
}

}  // namespace

TokenVocab::TokenVocab(std::vector<std::string> token_bytes, std::vector<bool> is_control, std::vector<int32_t> eog)
    : bytes_(std::move(token_bytes)) {
  const size_t n = bytes_.size();
  if (is_control.size() != n)
    throw GrammarError("TokenVocab: " + std::to_string(is_control.size()) + " control flags for " +
                       std::to_string(n) + " tokens");
  if (n == 0 || n > 0x7FFFFFFF) throw GrammarError("TokenVocab: vocabulary size " + std::to_string(n));
  eog_flag_.assign(n, false);
  for (int32_t id : eog) {
    if (id < 0 || static_cast<size_t>(id) >= n)
      throw GrammarError("TokenVocab: end-of-generation id " + std::to_string(id) + " out of range");
    if (!eog_flag_[static_cast<size_t>(id)]) eog_.push_back(id);
    eog_flag_[static_cast<size_t>(id)] = true;
  }
  std::sort(eog_.begin(), eog_.end());
  text_.assign(n, false);
  std::vector<int32_t> ids;
  for (size_t i = 0; i < n; ++i) {
    if (is_control[i] || eog_flag_[i] || bytes_[i].empty()) continue;
    if (bytes_[i].size() > 32767) throw GrammarError("TokenVocab: token " + std::to_string(i) + " is longer than 32767 bytes");
    text_[i] = true;
    ids.push_back(static_cast<int32_t>(i));
    max_len_ = std::max(max_len_, bytes_[i].size());
  }
  std::sort(ids.begin(), ids.end(), [&](int32_t a, int32_t b) {
    const int c = bytes_[static_cast<size_t>(a)].compare(bytes_[static_cast<size_t>(b)]);
    return c != 0 ? c < 0 : a < b;
  });

  // Sorted strings -> pre-order trie: the nodes deeper than the common prefix with the previous string are
  // complete when the next string diverges from them.
  nodes_.push_back(Node{0, 0, 0, 0, 0});
  std::vector<uint32_t> path{0};
  const std::string* prev = nullptr;
  for (int32_t id : ids) {
    const std::string& s = bytes_[static_cast<size_t>(id)];
    size_t lcp = 0;
    if (prev)
      while (lcp < s.size() && lcp < prev->size() && (*prev)[lcp] == s[lcp]) ++lcp;
    while (path.size() - 1 > lcp) {
      nodes_[path.back()].end = static_cast<uint32_t>(nodes_.size());
      path.pop_back();
    }
    for (size_t k = lcp; k < s.size(); ++k) {
      path.push_back(static_cast<uint32_t>(nodes_.size()));
      nodes_.push_back(Node{0, 0, 0, static_cast<uint16_t>(k + 1), static_cast<uint8_t>(s[k])});
    }
    Node& node = nodes_[path.back()];
    if (node.n_tok == 0) node.tok_begin = static_cast<uint32_t>(trie_tokens_.size());
    trie_tokens_.push_back(id);
    ++node.n_tok;
    prev = &s;
  }
  while (!path.empty()) {
    nodes_[path.back()].end = static_cast<uint32_t>(nodes_.size());
    path.pop_back();
  }
}

std::shared_ptr<const TokenVocab> TokenVocab::of(const Tokenizer& tok) {
  const int32_t n = tok.n_real();
  uint64_t hash = 1469598103934665603ull ^ static_cast<uint64_t>(n);
  auto mix = [&hash](uint64_t v) { hash = (hash ^ v) * 1099511628211ull + (hash >> 29); };
  const std::hash<std::string_view> hash_bytes;
  // Every token's length and type, the bytes of every 8th token: a tokenizer that differs from a cached one
  // at the same address is caught unless it differs only inside unsampled tokens of unchanged lengths.
  const auto& types = tok.vocab().types;
  for (int32_t i = 0; i < n; ++i) {
    const std::string& b = tok.token_to_bytes(i);
    mix(i % 8 == 0 ? hash_bytes(b) : b.size());
    mix(static_cast<uint64_t>(types[static_cast<size_t>(i)]));
  }
  for (int32_t id : tok.eog_ids()) mix(static_cast<uint64_t>(id));

  struct Entry {
    const void* key;
    uint64_t hash;
    std::shared_ptr<const TokenVocab> vocab;
  };
  static std::mutex mutex;
  static std::vector<Entry> cache;  // a handful of tokenizers at most; the oldest is dropped beyond 4
  const void* key = &tok.vocab();
  {
    std::lock_guard<std::mutex> lock(mutex);
    for (const Entry& e : cache)
      if (e.key == key && e.hash == hash) return e.vocab;
  }
  std::vector<std::string> bytes(static_cast<size_t>(n));
  std::vector<bool> control(static_cast<size_t>(n), false);
  for (int32_t i = 0; i < n; ++i) {
    const TokenType t = tok.token_type(i);
    const std::string& b = tok.token_to_bytes(i);
    control[static_cast<size_t>(i)] = (t == TokenType::Control && !is_qwen_tag(b)) || t == TokenType::Unused;
    bytes[static_cast<size_t>(i)] = b;
  }
  std::vector<int32_t> eog;
  for (int32_t id : tok.eog_ids())
    if (id >= 0 && id < n) eog.push_back(id);
  auto vocab = std::make_shared<const TokenVocab>(std::move(bytes), std::move(control), std::move(eog));
  std::lock_guard<std::mutex> lock(mutex);
  for (const Entry& e : cache)
    if (e.key == key && e.hash == hash) return e.vocab;
  std::erase_if(cache, [&](const Entry& e) { return e.key == key; });
  if (cache.size() >= 4) cache.erase(cache.begin());
  cache.push_back(Entry{key, hash, vocab});
  return vocab;
}

std::shared_ptr<const TokenVocab::LexTokens> TokenVocab::lex_tokens(const grammar::Lexer& lexer, uint16_t state) const {
  const std::string key = lexer.signature() + "#" + std::to_string(state);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (auto it = lex_cache_.find(key); it != lex_cache_.end()) return it->second;
  }
  auto out = std::make_shared<LexTokens>();
  out->inside.assign(n_words(), 0);
  // Depth-first over the trie with one lexer state per depth: a dead byte skips the subtree, the end of the
  // lexeme makes every token below an exit candidate.
  std::vector<uint16_t> level(max_len_ + 1);
  level[0] = state;
  std::unordered_map<std::string, size_t> group_of;  // exit suffix -> index in exit_groups
  for (size_t i = 1; i < nodes_.size();) {
    const Node& node = nodes_[i];
    const uint16_t e = lexer.next(level[node.depth - 1], node.byte);
    if (e == grammar::Lexer::kDead) {
      i = node.end;
      continue;
    }
    const uint16_t s = static_cast<uint16_t>(e & ~grammar::Lexer::kCharStart);
    if (lexer.is_final(s)) {
      for (size_t j = i; j < node.end; ++j)
        for (uint32_t t = 0; t < nodes_[j].n_tok; ++t) {
          const int32_t id = trie_tokens_[nodes_[j].tok_begin + t];
          out->exits.push_back(id);
          auto [it, fresh] = group_of.emplace(bytes_[static_cast<size_t>(id)].substr(node.depth), out->exit_groups.size());
          if (fresh) out->exit_groups.push_back(LexTokens::ExitGroup{it->first, {}});
          out->exit_groups[it->second].ids.push_back(id);
        }
      i = node.end;
      continue;
    }
    for (uint32_t t = 0; t < node.n_tok; ++t) {
      const auto id = static_cast<uint32_t>(trie_tokens_[node.tok_begin + t]);
      out->inside[id >> 6] |= uint64_t{1} << (id & 63);
    }
    level[node.depth] = s;
    ++i;
  }
  const size_t bytes = out->inside.size() * 8 + out->exits.size() * 8 + key.size() + 64;
  std::lock_guard<std::mutex> lock(mutex_);
  auto [it, fresh] = lex_cache_.emplace(key, std::move(out));
  auto kept = it->second;
  if (fresh) remember("L" + key, bytes);
  return kept;
}

std::shared_ptr<const std::vector<int16_t>> TokenVocab::lex_peaks(const grammar::Lexer& lexer, uint16_t state) const {
  const std::string key = lexer.signature() + "#" + std::to_string(state);
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (auto it = peak_cache_.find(key); it != peak_cache_.end()) return it->second;
  }
  auto out = std::make_shared<std::vector<int16_t>>(n_words() * 64, int16_t{-32767});  // whole words
  struct Level {
    uint16_t state;
    int32_t chars;  // characters started along the path
    int32_t peak;
  };
  std::vector<Level> level(max_len_ + 1);
  level[0] = Level{state, 0, -32767};
  for (size_t i = 1; i < nodes_.size();) {
    const Node& node = nodes_[i];
    const Level& up = level[node.depth - 1];
    const uint16_t e = lexer.next(up.state, node.byte);
    const auto s = static_cast<uint16_t>(e & ~grammar::Lexer::kCharStart);
    if (e == grammar::Lexer::kDead || lexer.is_final(s)) {  // not an inside token: no peak needed
      i = node.end;
      continue;
    }
    Level& here = level[node.depth];
    here.state = s;
    here.chars = up.chars + ((e & grammar::Lexer::kCharStart) ? 1 : 0);
    here.peak = (e & grammar::Lexer::kCharStart) ? std::max(up.peak, here.chars - lexer.pending_chars(s)) : up.peak;
    for (uint32_t t = 0; t < node.n_tok; ++t)
      (*out)[static_cast<size_t>(trie_tokens_[node.tok_begin + t])] = static_cast<int16_t>(std::clamp(here.peak, -32767, 32767));
    ++i;
  }
  const size_t bytes = out->size() * 2 + key.size() + 64;
  std::lock_guard<std::mutex> lock(mutex_);
  auto [it, fresh] = peak_cache_.emplace(key, std::move(out));
  auto kept = it->second;
  if (fresh) remember("P" + key, bytes);
  return kept;
}

void TokenVocab::remember(const std::string& key, size_t bytes) const {
  cache_order_.emplace_back(key, bytes);
  cache_bytes_ += bytes;
  while (cache_bytes_ > kCacheBytes && cache_order_.size() > 1) {
    const auto& [old, n] = cache_order_.front();
    if (old[0] == 'L') lex_cache_.erase(old.substr(1));
    else peak_cache_.erase(old.substr(1));
    cache_bytes_ -= n;
    cache_order_.pop_front();
  }
}

}  // namespace qrig::text
