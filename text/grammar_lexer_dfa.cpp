// string_lexer (grammar_lexer.h): a lexer table for strings whose decoded characters must spell a word of a
// byte automaton (a `pattern` / `format`, grammar_regex.h), built as a breadth-first product of that
// automaton with the JSON escape syntax (or, for raw tool-call values, with the exit and tag patterns), then
// cut down to the states from which the string can still end, so that a mask is never empty inside it.
#include <array>
#include <tuple>

#include "text/grammar_dfa.h"
#include "text/grammar_json.h"
#include "text/grammar_lexer.h"

namespace qrig::text::grammar {

namespace {

constexpr size_t kMaxStates = 30000;

// JSON escape phases: Plain = between characters; Esc after '\'; U0 after "\u", U1 after "\u0", U2 after
// "\u00", U3a after "\u000", U3b after "\u001".
enum Phase : uint8_t { Plain, Esc, U0, U1, U2, U3a, U3b, Final };

int hex_value(uint8_t b) {
  if (b >= '0' && b <= '9') return b - '0';
  if (b >= 'a' && b <= 'f') return b - 'a' + 10;
  if (b >= 'A' && b <= 'F') return b - 'A' + 10;
  return -1;
}

bool continuation(uint8_t b) { return b >= 0x80 && b <= 0xBF; }

}  // namespace

std::shared_ptr<const Lexer> string_lexer(const ByteDfa& value, StringLexerMode mode, const std::string& key) {
  const bool raw = mode == StringLexerMode::RawToolValue;
  std::vector<LexPattern> patterns;
  if (raw) patterns.push_back({"\n</parameter>", true});
  if (mode != StringLexerMode::Json)
    for (const std::string& t : tool_call_tags()) patterns.push_back({t, false});
  const PatternMatcher pm(patterns);
  const std::string exit_text = raw ? patterns[0].text : "";

  // A state: (value state, phase, matcher node). Raw values: the value state is the one before the bytes
  // that may still turn out to be the exit pattern (pm.pending of the node), which are fed to `value` only
  // once they cannot be the exit any more.
  using Key = std::tuple<int32_t, uint8_t, uint16_t>;
  const size_t n_nodes = pm.go.size();
  std::vector<uint32_t> ids(value.size() * 8 * n_nodes, UINT32_MAX);  // (v, phase, node) -> state
  std::vector<Key> states;
  std::vector<std::array<int64_t, 256>> edges;  // -1 = none; else to | char_start << 32
  uint32_t final_id = UINT32_MAX;
  auto id_of = [&](int32_t v, uint8_t ph, uint16_t m) -> uint32_t {
    if (ph == Final) m = 0, v = 0;
    uint32_t& id = ids[(static_cast<size_t>(v) * 8 + ph) * n_nodes + m];
    if (id == UINT32_MAX) {
      if (states.size() >= kMaxStates)
        throw GrammarError(key + ": the string automaton needs more than " + std::to_string(kMaxStates) + " states");
      id = static_cast<uint32_t>(states.size());
      states.emplace_back(v, ph, m);
      edges.emplace_back().fill(-1);
      if (ph == Final) final_id = id;
    }
    return id;
  };
  auto feed = [&](int32_t v, std::string_view bytes) {
    for (unsigned char c : bytes) {
      if (v == ByteDfa::kNone) return v;
      v = value.step(v, c);
    }
    return v;
  };
  id_of(0, Plain, 0);
  for (size_t i = 0; i < states.size(); ++i) {
    const auto [v, ph, m] = states[i];
    if (ph == Final) continue;
    for (int c = 0; c < 256; ++c) {
      const auto b = static_cast<uint8_t>(c);
      const uint16_t m2 = pm.go[m][b];
      if (pm.action[m2] == PatternMatcher::Reject) continue;
      int64_t to = -1;
      bool start = !continuation(b);
      if (raw) {
        if (pm.action[m2] == PatternMatcher::Exit) {
          if (value.accept[static_cast<size_t>(v)]) to = id_of(0, Final, 0);
          start = false;
        } else {
          const size_t k = pm.pending[m], k2 = pm.pending[m2];
          std::string window = exit_text.substr(0, k);
          window += static_cast<char>(b);
          const int32_t v2 = feed(v, std::string_view(window).substr(0, window.size() - k2));
          if (v2 != ByteDfa::kNone) to = id_of(v2, Plain, m2);
        }
      } else {
        auto decoded = [&, v = v](uint8_t d) {  // v by init-capture: clang before 16 cannot capture a binding
          const int32_t v2 = value.step(v, d);
          return v2 == ByteDfa::kNone ? int64_t{-1} : int64_t{id_of(v2, Plain, m2)};
        };
        switch (ph) {
          case Plain:
            if (b == '"') {
              if (value.accept[static_cast<size_t>(v)]) to = id_of(0, Final, 0);
              start = false;
            } else if (b == '\\') {
              to = id_of(v, Esc, m2);
            } else if (b >= 0x20) {
              to = decoded(b);
            }
            break;
          case Esc: {
            start = false;
            static constexpr std::pair<char, uint8_t> kShort[] = {{'"', '"'}, {'\\', '\\'}, {'/', '/'}, {'b', 0x08},
                                                                  {'f', 0x0C}, {'n', 0x0A}, {'r', 0x0D}, {'t', 0x09}};
            for (const auto& [e, d] : kShort)
              if (b == static_cast<uint8_t>(e)) to = decoded(d);
            if (b == 'u') to = id_of(v, U0, m2);
            break;
          }
          case U0: start = false; if (b == '0') to = id_of(v, U1, m2); break;
          case U1: start = false; if (b == '0') to = id_of(v, U2, m2); break;
          case U2:
            start = false;
            if (b == '0') to = id_of(v, U3a, m2);
            else if (b == '1') to = id_of(v, U3b, m2);
            break;
          case U3a:
          case U3b:
            start = false;
            if (const int h = hex_value(b); h >= 0) to = decoded(static_cast<uint8_t>((ph == U3b ? 16 : 0) + h));
            break;
          default: break;
        }
      }
      if (to >= 0) edges[i][static_cast<size_t>(c)] = to | (int64_t{start} << 32);
    }
  }
  if (final_id == UINT32_MAX) return nullptr;
  // Keep the states from which the final one is reachable.
  const size_t n = states.size();
  std::vector<std::vector<uint32_t>> rev(n);
  for (size_t i = 0; i < n; ++i)
    for (int c = 0; c < 256; ++c)
      if (edges[i][static_cast<size_t>(c)] >= 0) rev[static_cast<uint32_t>(edges[i][static_cast<size_t>(c)])].push_back(static_cast<uint32_t>(i));
  std::vector<bool> live(n, false);
  std::vector<uint32_t> stack{final_id};
  live[final_id] = true;
  while (!stack.empty()) {
    const uint32_t s = stack.back();
    stack.pop_back();
    for (uint32_t p : rev[s])
      if (!live[p]) {
        live[p] = true;
        stack.push_back(p);
      }
  }
  if (!live[0]) return nullptr;
  std::vector<uint16_t> table(n * 256, Lexer::kDead), pending(n, 0);
  for (size_t i = 0; i < n; ++i) {
    const auto [v, ph, m] = states[i];
    pending[i] = ph == Final ? static_cast<uint16_t>(exit_text.size()) : pm.pending[m];
    if (!live[i]) continue;
    for (int c = 0; c < 256; ++c) {
      const int64_t e = edges[i][static_cast<size_t>(c)];
      if (e < 0 || !live[static_cast<uint32_t>(e)]) continue;
      table[i * 256 + static_cast<size_t>(c)] =
          static_cast<uint16_t>(static_cast<uint32_t>(e) | ((e >> 32) ? Lexer::kCharStart : 0));
    }
  }
  const char* mode_name = mode == StringLexerMode::Json ? "json" : mode == StringLexerMode::JsonToolSafe ? "json-tool" : "raw-tool";
  return std::make_shared<const Lexer>("dfa:" + std::string(mode_name) + ":" + key, std::move(table), std::move(pending),
                                       static_cast<uint16_t>(final_id));
}

}  // namespace qrig::text::grammar
