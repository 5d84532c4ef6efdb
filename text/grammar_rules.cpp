// GrammarBuilder (grammar_rules.h): collects rules, removes what can never finish, rejects left recursion,
// and flattens the rules into the element array the machine walks.
#include "text/grammar_rules.h"

#include <functional>

namespace qrig::text::grammar {

ByteSet byte_set(std::string_view chars) {
  ByteSet s{};
  for (unsigned char c : chars) add(s, c);
  return s;
}

void append_reasoning(GrammarBuilder& b, std::vector<Item>& seq) {
  LexerDef think;
  think.base = LexBase::Utf8Text;
  think.patterns.push_back({"</think>", true});
  seq.push_back(b.lex(think));
  b.lit(seq, "\n\n");
}

uint32_t GrammarBuilder::new_rule() {
  alts_.emplace_back();
  return static_cast<uint32_t>(alts_.size() - 1);
}

void GrammarBuilder::add_alt(uint32_t rule, std::vector<Item> items) { alts_.at(rule).push_back(std::move(items)); }

uint32_t GrammarBuilder::rule_of(std::vector<std::vector<Item>> alts) {
  const uint32_t r = new_rule();
  for (auto& a : alts) add_alt(r, std::move(a));
  return r;
}

void GrammarBuilder::lit(std::vector<Item>& seq, std::string_view bytes) {
  for (unsigned char c : bytes) {
    ByteSet s{};
    add(s, c);
    seq.push_back(set(s));
  }
}

Item GrammarBuilder::set(const ByteSet& s) {
  auto [it, fresh] = set_ids_.emplace(s, static_cast<uint32_t>(sets_.size()));
  if (fresh) sets_.push_back(s);
  return Item{ElemKind::Bytes, it->second};
}

const Lexer& GrammarBuilder::lexer(const LexerDef& def) {
  const std::string sig = def.signature();
  auto it = lexer_ids_.find(sig);
  if (it == lexer_ids_.end()) {
    lexers_.push_back(std::make_shared<const Lexer>(def));
    it = lexer_ids_.emplace(sig, static_cast<uint32_t>(lexers_.size() - 1)).first;
  }
  return *lexers_[it->second];
}

Item GrammarBuilder::lex(const LexerDef& def, uint32_t min_chars, uint32_t max_chars, uint16_t start) {
  if (min_chars > max_chars)
    throw GrammarError("string length range is empty: minLength " + std::to_string(min_chars) + " > maxLength " +
                       std::to_string(max_chars));
  const Lexer& lx = lexer(def);
  if (start >= lx.n_states() || lx.is_final(start)) throw GrammarError("lexeme start state is not inside the lexeme");
  lex_insts_.push_back(LexInst{lexer_ids_.at(lx.signature()), min_chars, max_chars, start});
  return Item{ElemKind::Lex, static_cast<uint32_t>(lex_insts_.size() - 1)};
}

Item GrammarBuilder::lex(std::shared_ptr<const Lexer> lexer, uint32_t min_chars, uint32_t max_chars, uint16_t start) {
  if (!lexer) throw GrammarError("no lexer given");
  auto it = lexer_ids_.find(lexer->signature());
  if (it == lexer_ids_.end()) {
    lexers_.push_back(lexer);
    it = lexer_ids_.emplace(lexer->signature(), static_cast<uint32_t>(lexers_.size() - 1)).first;
  }
  const Lexer& lx = *lexers_[it->second];
  if (min_chars > max_chars) throw GrammarError("string length range is empty");
  if (start >= lx.n_states() || lx.is_final(start)) throw GrammarError("lexeme start state is not inside the lexeme");
  lex_insts_.push_back(LexInst{it->second, min_chars, max_chars, start});
  return Item{ElemKind::Lex, static_cast<uint32_t>(lex_insts_.size() - 1)};
}

Item GrammarBuilder::perm(PermGroup group) {
  if (group.members.size() > 32) throw GrammarError("a permutation group has more than 32 members");
  perms_.push_back(std::move(group));
  return Item{ElemKind::Perm, static_cast<uint32_t>(perms_.size() - 1)};
}

Grammar GrammarBuilder::finish(uint32_t root) {
  const size_t n = alts_.size();
  if (root >= n) throw GrammarError("grammar root is not a rule");

  // Productive rules (those that can finish), least fixed point.
  std::vector<bool> prod(n, false);
  auto item_prod = [&](const Item& it) {
    switch (it.kind) {
      case ElemKind::Call: return static_cast<bool>(prod[it.arg]);
      case ElemKind::Perm: {
        const PermGroup& g = perms_[it.arg];
        for (size_t i = 0; i < g.members.size(); ++i)
          if (((g.required >> i) & 1) && !prod[g.members[i]]) return false;
        return true;
      }
      default: return true;
    }
  };
  for (bool changed = true; changed;) {
    changed = false;
    for (size_t r = 0; r < n; ++r) {
      if (prod[r]) continue;
      for (const auto& alt : alts_[r]) {
        bool ok = true;
        for (const Item& it : alt) ok = ok && item_prod(it);
        if (ok) {
          prod[r] = true;
          changed = true;
          break;
        }
      }
    }
  }
  if (!prod[root]) throw GrammarError("the schema admits no value (every alternative is impossible)");
  // Drop what cannot finish: alternatives with an unproductive item, optional group members that cannot.
  for (size_t r = 0; r < n; ++r)
    std::erase_if(alts_[r], [&](const std::vector<Item>& alt) {
      for (const Item& it : alt)
        if (!item_prod(it)) return true;
      return false;
    });
  for (PermGroup& g : perms_) {
    PermGroup kept;
    for (size_t i = 0; i < g.members.size(); ++i) {
      if (!prod[g.members[i]]) continue;
      if ((g.required >> i) & 1) kept.required |= uint32_t{1} << kept.members.size();
      kept.members.push_back(g.members[i]);
    }
    g = std::move(kept);
  }

  // Nullable rules, then left recursion: a rule that can call itself without consuming a byte.
  std::vector<bool> nullable(n, false);
  auto item_nullable = [&](const Item& it) {
    switch (it.kind) {
      case ElemKind::Call: return static_cast<bool>(nullable[it.arg]);
      case ElemKind::Perm: {
        const PermGroup& g = perms_[it.arg];
        for (size_t i = 0; i < g.members.size(); ++i)
          if (((g.required >> i) & 1) && !nullable[g.members[i]]) return false;
        return true;
      }
      default: return false;
    }
  };
  for (bool changed = true; changed;) {
    changed = false;
    for (size_t r = 0; r < n; ++r) {
      if (nullable[r]) continue;
      for (const auto& alt : alts_[r]) {
        bool all = true;
        for (const Item& it : alt) all = all && item_nullable(it);
        if (all) {
          nullable[r] = true;
          changed = true;
          break;
        }
      }
    }
  }
  std::vector<std::vector<uint32_t>> left(n);
  for (size_t r = 0; r < n; ++r)
    for (const auto& alt : alts_[r])
      for (const Item& it : alt) {
        if (it.kind == ElemKind::Call) left[r].push_back(it.arg);
        if (it.kind == ElemKind::Perm)
          for (uint32_t m : perms_[it.arg].members) left[r].push_back(m);
        if (!item_nullable(it)) break;
      }
  std::vector<uint8_t> color(n, 0);  // 0 new, 1 on the DFS path, 2 done
  std::vector<std::pair<uint32_t, size_t>> stack;
  for (size_t start = 0; start < n; ++start) {
    if (color[start]) continue;
    stack.emplace_back(static_cast<uint32_t>(start), 0);
    color[start] = 1;
    while (!stack.empty()) {
      auto& [r, next] = stack.back();
      if (next == left[r].size()) {
        color[r] = 2;
        stack.pop_back();
        continue;
      }
      const uint32_t s = left[r][next++];
      if (color[s] == 1) throw GrammarError("the schema is left-recursive (a $ref cycle that consumes no input)");
      if (color[s] == 0) {
        color[s] = 1;
        stack.emplace_back(s, 0);
      }
    }
  }

  Grammar g;
  g.elems = {Elem{ElemKind::Call, root}, Elem{ElemKind::End, 0}};
  g.rules.resize(n);
  for (size_t r = 0; r < n; ++r)
    for (const auto& alt : alts_[r]) {
      g.rules[r].push_back(static_cast<uint32_t>(g.elems.size()));
      for (const Item& it : alt) g.elems.push_back(Elem{it.kind, it.arg});
      g.elems.push_back(Elem{ElemKind::End, 0});
    }
  g.sets = sets_;
  g.lexers = lexers_;
  g.lex_insts = lex_insts_;
  g.perms = perms_;
  return g;
}

}  // namespace qrig::text::grammar
