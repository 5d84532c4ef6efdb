// number_dfa (grammar_number.h): bounds read as doubles and rounded inward, then an automaton built from
// digit ranges - integers in [lo, hi] as the usual split into same-length digit-string ranges, fixed-point
// decimals as an integer-part range followed by a fraction compared digit by digit - intersected with a
// remainder automaton for multipleOf.
#include "text/grammar_number.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <map>
#include <string>
#include <tuple>

namespace qrig::text::grammar {

namespace {

using json = nlohmann::ordered_json;

constexpr int64_t kMaxInt = 9999999999999999;  // 16 digits
constexpr int kFrac = 16;                         // fraction digits of fixed-point outputs
constexpr int64_t kMaxMultiple = 1000;

std::string shown(const json& v) { return v.dump(-1, ' ', false, json::error_handler_t::replace); }

// A numeric keyword as the double validators see; throws for non-numbers and for integers no double holds.
std::optional<double> bound(const json& s, const char* key) {
  auto it = s.find(key);
  if (it == s.end()) return std::nullopt;
  if (it->is_boolean()) return std::nullopt;  // draft 4's exclusiveMinimum / exclusiveMaximum: see below
  if (!it->is_number()) throw GrammarError(std::string(key) + " must be a number, got " + shown(*it));
  const double d = it->get<double>();
  if (it->is_number_unsigned()) {
    const uint64_t u = it->get<uint64_t>();
    if (d >= 18446744073709551615.0 || static_cast<uint64_t>(d) != u)
      throw GrammarError(std::string(key) + " " + shown(*it) + " is not exactly representable as a double");
  } else if (it->is_number_integer()) {
    const int64_t i = it->get<int64_t>();
    if (d >= 9223372036854775807.0 || d < -9223372036854775807.0 || static_cast<int64_t>(d) != i)
      throw GrammarError(std::string(key) + " " + shown(*it) + " is not exactly representable as a double");
  }
  return d == 0 ? 0.0 : d;  // -0 is 0
}

bool draft4_exclusive(const json& s, const char* key) {
  auto it = s.find(key);
  return it != s.end() && it->is_boolean() && it->get<bool>();
}

std::string digits_of(int64_t v) { return std::to_string(v); }

// Same-length digit strings a <= b: every digit string between them.
void same_length(ByteNfa& n, uint32_t from, uint32_t to, const std::string& a, const std::string& b) {
  if (a.empty()) {
    n.eps(from, to);
    return;
  }
  auto any_digits = [&](uint32_t x, size_t count, uint32_t y) {
    uint32_t cur = x;
    for (size_t i = 0; i < count; ++i) {
      const uint32_t nxt = i + 1 == count ? y : n.add_state();
      n.bytes(cur, nxt, '0', '9');
      cur = nxt;
    }
    if (count == 0) n.eps(x, y);
  };
  const std::string ra = a.substr(1), rb = b.substr(1);
  if (a[0] == b[0]) {
    const uint32_t mid = n.add_state();
    n.bytes(from, mid, static_cast<uint8_t>(a[0]), static_cast<uint8_t>(a[0]));
    same_length(n, mid, to, ra, rb);
    return;
  }
  if (ra == std::string(ra.size(), '0') && rb == std::string(rb.size(), '9')) {
    const uint32_t mid = n.add_state();
    n.bytes(from, mid, static_cast<uint8_t>(a[0]), static_cast<uint8_t>(b[0]));
    any_digits(mid, ra.size(), to);
    return;
  }
  const uint32_t lo = n.add_state(), hi = n.add_state();
  n.bytes(from, lo, static_cast<uint8_t>(a[0]), static_cast<uint8_t>(a[0]));
  same_length(n, lo, to, ra, std::string(ra.size(), '9'));
  if (a[0] + 1 <= b[0] - 1) {
    const uint32_t mid = n.add_state();
    n.bytes(from, mid, static_cast<uint8_t>(a[0] + 1), static_cast<uint8_t>(b[0] - 1));
    any_digits(mid, ra.size(), to);
  }
  n.bytes(from, hi, static_cast<uint8_t>(b[0]), static_cast<uint8_t>(b[0]));
  same_length(n, hi, to, std::string(rb.size(), '0'), rb);
}

// Non-negative integers lo..hi without leading zeros.
void int_range(ByteNfa& n, uint32_t from, uint32_t to, int64_t lo, int64_t hi) {
  if (lo > hi) return;
  if (lo == 0) {
    n.literal(from, to, "0");
    lo = 1;
    if (lo > hi) return;
  }
  int64_t p = 1;  // 10^(len-1)
  for (size_t len = 1; len <= 16; ++len, p *= 10) {
    const int64_t top = p * 10 - 1;
    const int64_t a = std::max(lo, p), b = std::min(hi, top);
    if (a <= b) same_length(n, from, to, digits_of(a), digits_of(b));
  }
}

// A non-negative fixed-point value: integer part and 16 fraction digits.
struct Fixed {
  int64_t i = 0;
  std::string f = std::string(kFrac, '0');
  bool operator<(const Fixed& o) const { return i != o.i ? i < o.i : f < o.f; }
  bool operator>(const Fixed& o) const { return o < *this; }
};

// |x| truncated to 16 fraction digits, and whether digits were cut off. Requires |x| < 10^16.
Fixed truncated(long double x, bool& cut) {
  char buf[1400];
  std::snprintf(buf, sizeof buf, "%.1200Lf", std::fabs(x));  // exact: binary fractions have finite expansions
  const std::string s(buf);
  const size_t dot = s.find('.');
  Fixed out;
  out.i = std::stoll(s.substr(0, dot));
  out.f = s.substr(dot + 1, kFrac);
  cut = s.find_first_not_of('0', dot + 1 + kFrac) != std::string::npos;
  return out;
}

Fixed plus_tiny(Fixed v) {  // + 10^-16
  for (int k = kFrac - 1; k >= 0; --k) {
    if (v.f[static_cast<size_t>(k)] != '9') {
      ++v.f[static_cast<size_t>(k)];
      return v;
    }
    v.f[static_cast<size_t>(k)] = '0';
  }
  ++v.i;
  return v;
}

Fixed minus_tiny(Fixed v) {  // - 10^-16, v > 0
  for (int k = kFrac - 1; k >= 0; --k) {
    if (v.f[static_cast<size_t>(k)] != '0') {
      --v.f[static_cast<size_t>(k)];
      return v;
    }
    v.f[static_cast<size_t>(k)] = '9';
  }
  --v.i;
  return v;
}

// A signed fixed-point decimal.
struct Dec {
  bool neg = false;
  Fixed mag;
};

bool is_zero(const Fixed& f) { return f.i == 0 && f.f == std::string(kFrac, '0'); }

// The smallest 16-digit decimal strictly above m (|m| < 10^16).
Dec strictly_above(long double m) {
  bool cut;
  const Fixed t = truncated(m, cut);
  if (m >= 0) return Dec{false, plus_tiny(t)};
  const Fixed mag = cut ? t : minus_tiny(t);
  return is_zero(mag) ? Dec{} : Dec{true, mag};
}

// The largest 16-digit decimal strictly below m.
Dec strictly_below(long double m) {
  bool cut;
  const Fixed t = truncated(m, cut);
  if (m <= 0) return Dec{true, plus_tiny(t)};
  if (cut) return Dec{false, t};
  if (is_zero(t)) return Dec{true, plus_tiny(t)};
  return Dec{false, minus_tiny(t)};
}

// Optional fraction ("." then 1..16 digits) whose digits, padded with zeros, lie between p and q (each
// bound applies only while `tl` / `th`).
void fraction(ByteNfa& n, uint32_t from, uint32_t to, const std::string& p, const std::string& q, bool tl, bool th) {
  auto zeros_from = [&](size_t i) { return p.find_first_not_of('0', i) == std::string::npos; };
  if (!tl || zeros_from(0)) n.eps(from, to);  // no fraction: the value is the integer part
  // states (i, tl, th), i = digits written
  std::map<std::tuple<size_t, bool, bool>, uint32_t> ids;
  std::vector<std::tuple<size_t, bool, bool>> todo;
  auto id = [&](size_t i, bool a, bool b) {
    auto [it, fresh] = ids.emplace(std::make_tuple(i, a, b), 0);
    if (fresh) {
      it->second = n.add_state();
      todo.emplace_back(i, a, b);
      if (i >= 1 && (!a || zeros_from(i))) n.eps(it->second, to);
    }
    return it->second;
  };
  const uint32_t dot = id(0, tl, th);
  n.bytes(from, dot, '.', '.');
  for (size_t k = 0; k < todo.size(); ++k) {
    const auto [i, a, b] = todo[k];
    if (i == static_cast<size_t>(kFrac)) continue;
    const uint32_t src = ids.at(todo[k]);
    for (char d = '0'; d <= '9'; ++d) {
      if (a && d < p[i]) continue;
      if (b && d > q[i]) continue;
      n.bytes(src, id(i + 1, a && d == p[i], b && d == q[i]), static_cast<uint8_t>(d), static_cast<uint8_t>(d));
    }
  }
}

// Fixed-point magnitudes lo..hi.
void fixed_range(ByteNfa& n, uint32_t from, uint32_t to, const Fixed& lo, const Fixed& hi) {
  if (hi < lo) return;
  const std::string nines(kFrac, '9'), zeros(kFrac, '0');
  if (lo.i == hi.i) {
    const uint32_t mid = n.add_state();
    int_range(n, from, mid, lo.i, lo.i);
    fraction(n, mid, to, lo.f, hi.f, true, true);
    return;
  }
  const uint32_t a = n.add_state(), m = n.add_state(), b = n.add_state();
  int_range(n, from, a, lo.i, lo.i);
  fraction(n, a, to, lo.f, nines, true, false);
  int_range(n, from, m, lo.i + 1, hi.i - 1);
  fraction(n, m, to, zeros, nines, false, false);
  int_range(n, from, b, hi.i, hi.i);
  fraction(n, b, to, zeros, hi.f, false, true);
}

ByteDfa remainder_dfa(int64_t k) {
  ByteDfa d;
  for (int64_t r = 0; r < k; ++r) d.add_state(r == 0);
  for (int64_t r = 0; r < k; ++r) {
    d.next[static_cast<size_t>(r) * 256 + '-'] = static_cast<int32_t>(r);
    for (int c = '0'; c <= '9'; ++c)
      d.next[static_cast<size_t>(r) * 256 + static_cast<size_t>(c)] = static_cast<int32_t>((r * 10 + (c - '0')) % k);
  }
  return d;
}

}  // namespace

std::optional<ByteDfa> number_dfa(const json& s, bool integer) {
  const auto minimum = bound(s, "minimum"), maximum = bound(s, "maximum");
  const auto xmin = bound(s, "exclusiveMinimum"), xmax = bound(s, "exclusiveMaximum");
  for (const char* k : {"exclusiveMinimum", "exclusiveMaximum"})
    if (auto it = s.find(k); it != s.end() && it->is_boolean() && it->get<bool>() &&
                             !s.contains(std::string(k) == "exclusiveMinimum" ? "minimum" : "maximum"))
      throw GrammarError(std::string(k) + ": true needs " + (std::string(k) == "exclusiveMinimum" ? "minimum" : "maximum"));
  std::optional<double> multiple;
  if (auto it = s.find("multipleOf"); it != s.end()) {
    if (!it->is_number() || it->get<double>() <= 0) throw GrammarError("multipleOf must be a number > 0, got " + shown(*it));
    multiple = it->get<double>();
  }
  if (!minimum && !maximum && !xmin && !xmax && !multiple) return std::nullopt;

  const double inf = HUGE_VAL;
  double lo = -inf, hi = inf;  // inclusive, in double space
  if (minimum) lo = draft4_exclusive(s, "exclusiveMinimum") ? std::nextafter(*minimum, inf) : *minimum;
  if (maximum) hi = draft4_exclusive(s, "exclusiveMaximum") ? std::nextafter(*maximum, -inf) : *maximum;
  if (xmin) lo = std::max(lo, std::nextafter(*xmin, inf));
  if (xmax) hi = std::min(hi, std::nextafter(*xmax, -inf));

  int64_t k = 1;
  if (multiple) {
    const double m = *multiple;
    if (m != std::floor(m))
      throw GrammarError("multipleOf " + shown(s["multipleOf"]) +
                         " is not supported: only integers (validators test fractions by floating-point division, "
                         "which no decimal output reliably passes)");
    if (m > double(kMaxMultiple))
      throw GrammarError("multipleOf " + shown(s["multipleOf"]) + " is not supported (at most " +
                         std::to_string(kMaxMultiple) + ")");
    k = static_cast<int64_t>(m);
  }
  ByteNfa n;
  const uint32_t start = n.add_state(), end = n.add_state();
  n.start = start;
  n.accept = end;
  const uint32_t neg = n.add_state();
  n.literal(start, neg, "-");
  if (integer || multiple) {
    if (lo > double(kMaxInt) || hi < -double(kMaxInt))
      throw GrammarError("the range of minimum/maximum holds no integer of at most 16 digits");
    const int64_t a = lo < -double(kMaxInt) ? -kMaxInt : static_cast<int64_t>(std::ceil(lo));
    const int64_t b = hi > double(kMaxInt) ? kMaxInt : static_cast<int64_t>(std::floor(hi));
    if (a <= b) {
      if (b >= 0) int_range(n, start, end, std::max<int64_t>(a, 0), b);
      if (a < 0) int_range(n, neg, end, std::max<int64_t>(1, b < 0 ? -b : 1), -a);
    }
  } else {
    // Decimals that round (to nearest) into [lo, hi]: strictly between the midpoints to the neighbouring
    // doubles, so that "0.1" satisfies minimum 0.1 although 0.1 is not exactly the double 0.1.
    if (lo >= 1e16 || hi <= -1e16)
      throw GrammarError("the range of minimum/maximum holds no number of at most 16 integer digits");
    Fixed top;
    top.i = kMaxInt;
    top.f = std::string(kFrac, '9');
    const Dec low = lo <= -1e16 ? Dec{true, top}
                                : strictly_above((static_cast<long double>(lo) + std::nextafter(lo, -inf)) / 2);
    const Dec high = hi >= 1e16 ? Dec{false, top}
                                : strictly_below((static_cast<long double>(hi) + std::nextafter(hi, inf)) / 2);
    if (!high.neg) fixed_range(n, start, end, low.neg ? Fixed{} : low.mag, high.mag);
    if (low.neg) fixed_range(n, neg, end, high.neg ? high.mag : plus_tiny(Fixed{}), low.mag);
  }
  ByteDfa d = determinize(n, "the numeric range");
  if (k > 1) d = intersect(d, remainder_dfa(k), "multipleOf");
  return d;
}

}  // namespace qrig::text::grammar
