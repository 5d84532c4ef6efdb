// Tests of the pattern / format automata (text/grammar_regex.h): each pattern's automaton is compared with
// PCRE2 (UTF mode, $ only at the very end, CR and LF as line ends so that "." means what ECMA-262 says) on
// thousands of strings - random strings over an alphabet the pattern cares about, and strings sampled from
// the automaton itself so that the accepting side is covered too; the formats are checked exhaustively
// (dates) or against independent reference checks; unsupported features are refused by name.
#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <catch2/catch.hpp>

#include <algorithm>
#include <climits>
#include <functional>
#include <map>
#include <random>
#include <string>
#include <vector>

#include "text/grammar_regex.h"

using namespace qrig::text;
using namespace qrig::text::grammar;

namespace {

class Pcre {
 public:
  explicit Pcre(const std::string& pattern, uint32_t extra = 0) {
    pcre2_compile_context* cc = pcre2_compile_context_create(nullptr);
    pcre2_set_newline(cc, PCRE2_NEWLINE_ANYCRLF);
    int err;
    PCRE2_SIZE off;
    code_ = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern.data()), pattern.size(),
                          PCRE2_UTF | PCRE2_DOLLAR_ENDONLY | extra, &err, &off, cc);
    pcre2_compile_context_free(cc);
    REQUIRE(code_ != nullptr);
    md_ = pcre2_match_data_create_from_pattern(code_, nullptr);
  }
  ~Pcre() {
    pcre2_match_data_free(md_);
    pcre2_code_free(code_);
  }
  bool search(const std::string& s) const {
    const int rc = pcre2_match(code_, reinterpret_cast<PCRE2_SPTR>(s.data()), s.size(), 0, 0, md_, nullptr);
    REQUIRE(rc >= PCRE2_ERROR_NOMATCH);
    return rc >= 0;
  }

 private:
  pcre2_code* code_;
  pcre2_match_data* md_;
};

// Shortest distance (in bytes) from each state to acceptance.
std::vector<int> distances(const ByteDfa& d) {
  std::vector<int> dist(d.size(), INT32_MAX);
  for (bool changed = true; changed;) {
    changed = false;
    for (size_t s = 0; s < d.size(); ++s) {
      int best = d.accept[s] ? 0 : INT32_MAX;
      for (int c = 0; c < 256; ++c) {
        const int32_t t = d.step(static_cast<int32_t>(s), static_cast<uint8_t>(c));
        if (t != ByteDfa::kNone && dist[static_cast<size_t>(t)] != INT32_MAX) best = std::min(best, dist[static_cast<size_t>(t)] + 1);
      }
      if (best < dist[s]) dist[s] = best, changed = true;
    }
  }
  return dist;
}

// A random accepted string of d: random bytes, steered towards acceptance half of the time and once the
// budget is used up.
bool sample(const ByteDfa& d, std::mt19937_64& rng, size_t max_len, std::string& out) {
  static std::map<const ByteDfa*, std::vector<int>> memo;
  auto& dist = memo[&d];
  if (dist.size() != d.size()) dist = distances(d);
  out.clear();
  int32_t s = 0;
  for (size_t i = 0; i < 4 * max_len + 64; ++i) {
    if (d.accept[static_cast<size_t>(s)] && (rng() % 4 == 0 || i >= max_len)) return true;
    std::vector<int> bytes, closer;
    for (int c = 0; c < 256; ++c) {
      const int32_t t = d.step(s, static_cast<uint8_t>(c));
      if (t == ByteDfa::kNone) continue;
      bytes.push_back(c);
      if (dist[static_cast<size_t>(t)] < dist[static_cast<size_t>(s)]) closer.push_back(c);
    }
    if (bytes.empty()) return d.accept[static_cast<size_t>(s)];
    const bool steer = !closer.empty() && (i >= max_len || rng() % 2 == 0);
    const int c = steer ? closer[rng() % closer.size()] : bytes[rng() % bytes.size()];
    out += static_cast<char>(c);
    s = d.step(s, static_cast<uint8_t>(c));
  }
  return d.accept[static_cast<size_t>(s)];
}

const std::vector<std::string> kAlphabet = {"a", "b", "c", "x", "Z", "0", "1", "5", "9", "-", "_", ".", "@", " ",
                                            "\n", "\r", "\t", "/", "\\", "é", "日", "😀", "(", "]"};

std::string random_string(std::mt19937_64& rng, size_t max_len) {
  std::string s;
  const size_t n = rng() % (max_len + 1);
  for (size_t i = 0; i < n; ++i) s += kAlphabet[rng() % kAlphabet.size()];
  return s;
}

bool valid_utf8(const std::string& s) {
  for (size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    const int len = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (len == 0 || i + static_cast<size_t>(len) > s.size()) return false;
    for (int k = 1; k < len; ++k)
      if ((static_cast<unsigned char>(s[i + static_cast<size_t>(k)]) & 0xC0) != 0x80) return false;
    i += static_cast<size_t>(len);
  }
  return true;
}

}  // namespace

TEST_CASE("pattern automata agree with PCRE2 on random and sampled strings", "[text]") {
  // (ECMA pattern, the same for PCRE2 where the syntax differs)
  const std::vector<std::pair<std::string, std::string>> patterns = {
      {"abc", ""},
      {"^abc$", ""},
      {"^a.c$", ""},
      {"a|b|xy", ""},
      {"^(a|b)*c$", ""},
      {"^[a-c]+$", ""},
      {"^[^a-c]*$", ""},
      {"^\\d{3}-\\d{2,4}$", ""},
      {"^\\w+@\\w+\\.\\w{2,}$", ""},
      {"\\s", "[\\t\\n\\x0b\\f\\r \\x{a0}\\x{1680}\\x{2000}-\\x{200a}\\x{2028}\\x{2029}\\x{202f}\\x{205f}\\x{3000}\\x{feff}]"},
      {"^\\S+$", "^[^\\t\\n\\x0b\\f\\r \\x{a0}\\x{1680}\\x{2000}-\\x{200a}\\x{2028}\\x{2029}\\x{202f}\\x{205f}\\x{3000}\\x{feff}]+$"},
      {"^\\D\\W$", ""},
      {"^.{2,5}$", ""},
      {"^.*$", ""},
      {"^(?:ab|a)(?:bc|c)?$", ""},
      {"^(?<word>[a-z]+)-$", ""},
      {"^a{0}b{1}c{2,}$", ""},
      {"^(a?){3}a{3}$", ""},
      {"^x*?y+?z??$", ""},
      {"^[\\d\\-_.]+$", ""},
      {"^[é日]+[😀]?$", ""},
      {"^\\u00e9\\u{1F600}\\x41$", "^\\x{e9}\\x{1f600}\\x41$"},
      {"^[\\u0061-\\u0063]$", "^[a-c]$"},
      {"^\\t\\n\\r\\/\\.\\\\$", "^\\t\\n\\r/\\.\\\\$"},
      {"^[^]$", "^[\\s\\S]$"},
      {"^[]$", "(*FAIL)"},
      {"^$", ""},
      {"", ""},
      {"a$|^b", ""},
      {"^(ab|cd){2}$", ""},
      {"^[a-z0-9]([a-z0-9-]*[a-z0-9])?$", ""},
      {"(^|-)5$", ""},
      {"^\\(\\d+\\]$", ""},
      {"^[+-]?(\\d+(\\.\\d*)?|\\.\\d+)$", ""},
      {"1{2}$", ""},
      {"^(a|)+b$", ""},
      {"[.]", "\\."},
      {"^[\\w.]+$", ""},
      {"^\\cJ$", "^\\n$"},
  };
  std::mt19937_64 rng(42);
  for (const auto& [ecma, pcre_src] : patterns) {
    INFO("pattern " << ecma);
    const ByteDfa d = pattern_dfa(ecma);
    const Pcre ref(pcre_src.empty() ? ecma : pcre_src);
    size_t accepted = 0;
    for (int i = 0; i < 3000; ++i) {
      const std::string s = random_string(rng, 8);
      INFO("string \"" << s << "\"");
      REQUIRE(d.matches(s) == ref.search(s));
      accepted += d.matches(s);
    }
    std::string s;
    for (int i = 0; i < 300; ++i) {
      if (!sample(d, rng, 12, s)) continue;
      INFO("sampled \"" << s << "\"");
      REQUIRE(valid_utf8(s));
      REQUIRE(ref.search(s));
      ++accepted;
      // one byte changed: both still agree
      std::string t = s;
      if (!t.empty()) t[rng() % t.size()] = kAlphabet[rng() % 9][0];
      if (valid_utf8(t)) REQUIRE(d.matches(t) == ref.search(t));
    }
    if (ecma != "^[]$") CHECK(accepted > 0);
  }
}

TEST_CASE("pattern: ECMA-262 specifics (\\s, dot, $ at the very end)", "[text]") {
  CHECK(pattern_dfa("^\\s$").matches("\xC2\xA0"));       // U+00A0 is ECMA white space
  CHECK(pattern_dfa("^\\s$").matches("\xE3\x80\x80"));   // U+3000
  CHECK_FALSE(pattern_dfa("^\\s$").matches("\xC2\x85"));  // U+0085 is not
  CHECK_FALSE(pattern_dfa("^.$").matches("\r"));
  CHECK_FALSE(pattern_dfa("^.$").matches("\xE2\x80\xA8"));  // U+2028
  CHECK(pattern_dfa("^.$").matches("\xF0\x9F\x98\x80"));    // one code point, four bytes
  CHECK_FALSE(pattern_dfa("^.$").matches("ab"));
  CHECK_FALSE(pattern_dfa("^a$").matches("a\n"));  // no PCRE-style "before a final newline"
  CHECK_FALSE(pattern_dfa("^\\d$").matches("\xD9\xA3"));  // Arabic-Indic three: \d is ASCII
  CHECK_FALSE(pattern_dfa("x").matches("\xFF" "x"));       // invalid UTF-8 never matches
}

TEST_CASE("pattern: what cannot be enforced is refused, naming the feature", "[text]") {
  const std::vector<std::pair<std::string, std::string>> refused = {
      {"a(?=b)", "lookahead"},      {"a(?!b)", "lookahead"},        {"(?<=a)b", "lookbehind"},
      {"(?<!a)b", "lookbehind"},    {"(a)\\1", "backreference"},   {"(?<n>a)\\k<n>", "backreference"},
      {"\\bword\\b", "word boundary"}, {"\\Bx", "word boundary"},  {"\\p{L}+", "Unicode property"},
      {"(?i)abc", "inline flag"},  {"a{1001}", "above 1000"},     {"(a", "unterminated group"},
      {"a)", "unmatched"},         {"[a-", "unterminated"},       {"*a", "nothing to repeat"},
      {"\\q", "invalid escape"},   {"[z-a]", "out of order"},     {"a{3,2}", "n > m"},
      {"(x+x+)+y.{30}z", "automaton states"},
  };
  for (const auto& [p, what] : refused) {
    INFO("pattern " << p);
    try {
      (void)pattern_dfa(p);
      FAIL("accepted");
    } catch (const GrammarError& e) {
      const std::string m = e.what();
      INFO(m);
      CHECK(m.find(what) != std::string::npos);
      CHECK(m.find("pattern") != std::string::npos);
    }
  }
}

namespace {

bool leap(int y) { return y % 4 == 0 && (y % 100 != 0 || y % 400 == 0); }

bool reference_date(int y, int m, int d) {
  static const int days[] = {0, 31, 28, 31, 30, 31, 30, 31, 31, 30, 31, 30, 31};
  if (y < 0 || y > 9999 || m < 1 || m > 12 || d < 1) return false;
  return d <= (m == 2 && leap(y) ? 29 : days[m]);
}

std::string two(int v) { return (v < 10 ? "0" : "") + std::to_string(v); }
std::string four(int v) {
  std::string s = std::to_string(v);
  return std::string(4 - s.size(), '0') + s;
}

}  // namespace

TEST_CASE("format date: every day of 2,000 years, and impossible days, exactly", "[text]") {
  const ByteDfa d = format_dfa("date");
  size_t checked = 0;
  for (int y = 0; y <= 9999; y += (y < 2100 ? 1 : 97))
    for (int m = 0; m <= 13; ++m)
      for (int day = 0; day <= 32; ++day) {
        const std::string s = four(y) + "-" + two(m) + "-" + two(day);
        INFO(s);
        REQUIRE(d.matches(s) == reference_date(y, m, day));
        ++checked;
      }
  CHECK(checked > 900000);
  CHECK(d.matches("2024-02-29"));
  CHECK(d.matches("2000-02-29"));
  CHECK_FALSE(d.matches("1900-02-29"));
  CHECK_FALSE(d.matches("2023-02-29"));
  CHECK_FALSE(d.matches("2024-2-29"));
  CHECK_FALSE(d.matches("2024-02-29 "));
  CHECK_FALSE(d.matches("12024-02-29"));
}

TEST_CASE("formats time, date-time, uuid, email, ipv4: samples pass an independent check", "[text]") {
  // ajv-formats' own expressions (full mode, case-insensitive) as PCRE2; time also checks the ranges.
  const Pcre time_re("^(\\d\\d):(\\d\\d):(\\d\\d(?:\\.\\d+)?)(z|([+-])(\\d\\d)(?::?(\\d\\d))?)$", PCRE2_CASELESS);
  const Pcre uuid_re("^(?:urn:uuid:)?[0-9a-f]{8}-(?:[0-9a-f]{4}-){3}[0-9a-f]{12}$", PCRE2_CASELESS);
  const Pcre email_re(
      "^[a-z0-9!#$%&'*+/=?^_`{|}~-]+(?:\\.[a-z0-9!#$%&'*+/=?^_`{|}~-]+)*@(?:[a-z0-9](?:[a-z0-9-]*[a-z0-9])?\\.)+"
      "[a-z0-9](?:[a-z0-9-]*[a-z0-9])?$",
      PCRE2_CASELESS);
  const Pcre ipv4_re("^(?:(?:25[0-5]|2[0-4]\\d|1\\d\\d|[1-9]?\\d)\\.){3}(?:25[0-5]|2[0-4]\\d|1\\d\\d|[1-9]?\\d)$");
  auto time_ok = [&](const std::string& t) {
    if (!time_re.search(t)) return false;
    const int h = std::stoi(t.substr(0, 2)), m = std::stoi(t.substr(3, 2)), s = std::stoi(t.substr(6, 2));
    if (h > 23 || m > 59 || s > 59) return false;
    const size_t z = t.find_first_of("Zz+-", 8);
    if (z == std::string::npos) return false;
    if (t[z] == 'Z' || t[z] == 'z') return true;
    return std::stoi(t.substr(z + 1, 2)) <= 23 && std::stoi(t.substr(z + 4, 2)) <= 59;
  };
  auto date_time_ok = [&](const std::string& s) {
    if (s.size() < 11 || s[10] != 'T') return false;
    const std::string date = s.substr(0, 10);
    if (!format_dfa("date").matches(date)) return false;
    return reference_date(std::stoi(date.substr(0, 4)), std::stoi(date.substr(5, 2)), std::stoi(date.substr(8, 2))) &&
           time_ok(s.substr(11));
  };
  std::mt19937_64 rng(7);
  struct Case {
    const char* format;
    std::function<bool(const std::string&)> ok;
  };
  const std::vector<Case> cases = {
      {"time", time_ok},
      {"date-time", date_time_ok},
      {"uuid", [&](const std::string& s) { return uuid_re.search(s); }},
      {"email", [&](const std::string& s) { return email_re.search(s); }},
      {"ipv4", [&](const std::string& s) { return ipv4_re.search(s); }},
  };
  for (const Case& c : cases) {
    const ByteDfa d = format_dfa(c.format);
    std::string s;
    int n = 0;
    for (int i = 0; i < 2000; ++i) {
      if (!sample(d, rng, 60, s)) continue;
      INFO(c.format << ": " << s);
      REQUIRE(c.ok(s));
      ++n;
    }
    CHECK(n > 500);
  }
  const ByteDfa t = format_dfa("time"), dt = format_dfa("date-time"), u = format_dfa("uuid"), e = format_dfa("email"),
                ip = format_dfa("ipv4");
  CHECK(t.matches("23:59:59Z"));
  CHECK(t.matches("00:00:00.123456789+05:30"));
  CHECK_FALSE(t.matches("24:00:00Z"));
  CHECK_FALSE(t.matches("12:60:00Z"));
  CHECK_FALSE(t.matches("12:00:00"));  // RFC 3339 full-time needs the offset
  CHECK(dt.matches("2024-02-29T12:00:00-08:00"));
  CHECK_FALSE(dt.matches("2023-02-29T12:00:00Z"));
  CHECK(u.matches("123e4567-E89B-12d3-a456-426614174000"));
  CHECK_FALSE(u.matches("123e4567e89b12d3a456426614174000"));
  CHECK(e.matches("first.last+tag@mail.example.org"));
  CHECK_FALSE(e.matches("a@b"));
  CHECK_FALSE(e.matches("a..b@example.org"));
  CHECK_FALSE(e.matches("a@-example.org"));
  CHECK(ip.matches("255.0.10.199"));
  CHECK_FALSE(ip.matches("256.1.1.1"));
  CHECK_FALSE(ip.matches("01.1.1.1"));
  try {
    (void)format_dfa("uri");
    FAIL("uri accepted");
  } catch (const GrammarError& err) {
    CHECK(std::string(err.what()).find("format \"uri\" is not supported") != std::string::npos);
  }
}
