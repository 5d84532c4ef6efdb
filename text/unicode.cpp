// UTF-8 validation/repair, NFC through utf8proc, and the GPT-2 byte <-> unicode table (see unicode.h).
#include "text/unicode.h"

#include <utf8proc.h>

#include <cstdlib>
#include <memory>
#include <stdexcept>
#include <vector>

namespace qrig::text {

namespace {

enum class Scan { Ok, Bad, Truncated };

// Examine the character starting at s[i]. Ok: `len` is its length. Bad: `len` is the length of the
// maximal ill-formed subpart (>= 1). Truncated: s ends inside a well-formed prefix of `len` bytes.
Scan scan_char(std::string_view s, size_t i, size_t& len) {
  const auto b0 = static_cast<unsigned char>(s[i]);
  if (b0 < 0x80) {
    len = 1;
    return Scan::Ok;
  }
  size_t need;                       // continuation bytes required
  unsigned char lo = 0x80, hi = 0xBF;  // allowed range of the first continuation byte
  if (b0 >= 0xC2 && b0 <= 0xDF) {
    need = 1;
  } else if (b0 >= 0xE0 && b0 <= 0xEF) {
    need = 2;
    if (b0 == 0xE0) lo = 0xA0;
    if (b0 == 0xED) hi = 0x9F;
  } else if (b0 >= 0xF0 && b0 <= 0xF4) {
    need = 3;
    if (b0 == 0xF0) lo = 0x90;
    if (b0 == 0xF4) hi = 0x8F;
  } else {
    len = 1;
    return Scan::Bad;
  }
  for (size_t k = 1; k <= need; ++k) {
    if (i + k >= s.size()) {
      len = k;
      return Scan::Truncated;
    }
    const auto b = static_cast<unsigned char>(s[i + k]);
    const unsigned char l = k == 1 ? lo : 0x80, h = k == 1 ? hi : 0xBF;
    if (b < l || b > h) {
      len = k;
      return Scan::Bad;
    }
  }
  len = need + 1;
  return Scan::Ok;
}

const char kReplacement[] = "\xEF\xBF\xBD";  // U+FFFD

}  // namespace

int utf8_char_len(std::string_view s, size_t i) {
  size_t len = 0;
  switch (scan_char(s, i, len)) {
    case Scan::Ok: return static_cast<int>(len);
    case Scan::Bad: return 0;
    case Scan::Truncated: return -1;
  }
  return 0;
}

size_t utf8_complete_prefix(std::string_view s) {
  // An incomplete character is at most 3 bytes long, so only the last few positions can start one.
  const size_t from = s.size() > 3 ? s.size() - 3 : 0;
  for (size_t i = from; i < s.size(); ++i) {
    const auto b = static_cast<unsigned char>(s[i]);
    if (b < 0xC2 || b > 0xF4) continue;  // not a multi-byte lead byte
    size_t len = 0;
    if (scan_char(s, i, len) == Scan::Truncated && i + len == s.size()) return i;
  }
  return s.size();
}

std::string sanitize_utf8(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) {
    // Copy runs of ASCII quickly.
    size_t j = i;
    while (j < s.size() && static_cast<unsigned char>(s[j]) < 0x80) ++j;
    out.append(s.data() + i, j - i);
    i = j;
    if (i >= s.size()) break;
    size_t len = 0;
    if (scan_char(s, i, len) == Scan::Ok) {
      out.append(s.data() + i, len);
    } else {
      out.append(kReplacement);
    }
    i += len;
  }
  return out;
}

bool is_valid_utf8(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    size_t len = 0;
    if (scan_char(s, i, len) != Scan::Ok) return false;
    i += len;
  }
  return true;
}

namespace {

void append_nfc_utf8proc(std::string& out, std::string_view s) {
  if (s.empty()) return;
  utf8proc_uint8_t* mapped = nullptr;
  // UTF8PROC_STABLE | UTF8PROC_COMPOSE is NFC; without NULLTERM the length is used (embedded NULs
  // are kept).
  const utf8proc_ssize_t n = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(s.data()),
                                          static_cast<utf8proc_ssize_t>(s.size()), &mapped,
                                          static_cast<utf8proc_option_t>(UTF8PROC_STABLE | UTF8PROC_COMPOSE));
  if (n < 0) {
    throw std::runtime_error(std::string("NFC normalisation failed: ") + utf8proc_errmsg(n));
  }
  std::unique_ptr<utf8proc_uint8_t, decltype(&std::free)> guard(mapped, &std::free);
  out.append(reinterpret_cast<const char*>(mapped), static_cast<size_t>(n));
}

}  // namespace

// NFC works on runs between ASCII characters: an ASCII character has combining class 0, no
// decomposition and is never the second character of a composition, so nothing reorders or composes
// across the boundary before it (it may still take marks that follow it, so it joins the run after
// it). A run of code points below U+0300 is already NFC (all have combining class 0 and NFC_QC=Yes),
// so utf8proc only sees runs that hold a combining mark or a script where composition can happen.
std::string nfc(std::string_view s) {
  std::string valid;
  if (!is_valid_utf8(s)) {
    valid = sanitize_utf8(s);
    s = valid;
  }
  std::string out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) {
    size_t j = i;
    while (j < s.size() && static_cast<unsigned char>(s[j]) < 0x80) ++j;
    if (j == s.size()) {
      out.append(s.data() + i, j - i);
      break;
    }
    // s[j] starts a non-ASCII run; the ASCII character before it (if any) belongs to the run.
    const size_t run_begin = j > i ? j - 1 : j;
    out.append(s.data() + i, run_begin - i);
    size_t k = j;
    bool simple = true;  // every code point < U+0300
    while (k < s.size() && static_cast<unsigned char>(s[k]) >= 0x80) {
      const auto b = static_cast<unsigned char>(s[k]);
      // Lead bytes C2..CB encode U+0080..U+02FF; anything higher needs a real check.
      if (b > 0xCB) simple = false;  // continuation bytes are 80..BF
      ++k;
    }
    if (simple) {
      out.append(s.data() + run_begin, k - run_begin);
    } else {
      append_nfc_utf8proc(out, s.substr(run_begin, k - run_begin));
    }
    i = k;
  }
  return out;
}

void append_utf8(std::string& out, char32_t cp) {
  if (cp < 0x80) {
    out.push_back(static_cast<char>(cp));
  } else if (cp < 0x800) {
    out.push_back(static_cast<char>(0xC0 | (cp >> 6)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else if (cp < 0x10000) {
    out.push_back(static_cast<char>(0xE0 | (cp >> 12)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  } else {
    out.push_back(static_cast<char>(0xF0 | (cp >> 18)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 12) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | ((cp >> 6) & 0x3F)));
    out.push_back(static_cast<char>(0x80 | (cp & 0x3F)));
  }
}

namespace {

struct ByteUnicodeTables {
  ByteUnicode fwd;
  std::vector<int> inverse;  // indexed by code point, -1 where unmapped
};

ByteUnicodeTables build_byte_unicode() {
  ByteUnicodeTables t;
  auto printable = [](int b) { return (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF); };
  char32_t next = 256;
  for (int b = 0; b < 256; ++b) {
    t.fwd.byte_to_cp[b] = printable(b) ? static_cast<char32_t>(b) : next++;
  }
  t.inverse.assign(next, -1);
  for (int b = 0; b < 256; ++b) {
    t.inverse[t.fwd.byte_to_cp[b]] = b;
    append_utf8(t.fwd.byte_to_utf8[b], t.fwd.byte_to_cp[b]);
  }
  return t;
}

const ByteUnicodeTables& tables() {
  static const ByteUnicodeTables t = build_byte_unicode();
  return t;
}

}  // namespace

int ByteUnicode::cp_to_byte(char32_t cp) const {
  const auto& inv = tables().inverse;
  return cp < inv.size() ? inv[cp] : -1;
}

const ByteUnicode& byte_unicode() { return tables().fwd; }

}  // namespace qrig::text
