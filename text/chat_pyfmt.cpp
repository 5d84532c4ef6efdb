// Python-compatible formatting for the chat formatter: see chat_pyfmt.h for why it exists.
#include "text/chat_pyfmt.h"

#include "text/chat.h"

#include <charconv>
#include <cmath>
#include <cstdio>
#include <cstdlib>

namespace qrig::text::py {
namespace {

using Json = nlohmann::ordered_json;
constexpr int kMaxDepth = 512;

void append_escaped(std::string& out, const std::string& s) {
  out += '"';
  for (char ch : s) {
    unsigned char c = static_cast<unsigned char>(ch);
    switch (c) {
      case '"': out += "\\\""; break;
      case '\\': out += "\\\\"; break;
      case '\n': out += "\\n"; break;
      case '\r': out += "\\r"; break;
      case '\t': out += "\\t"; break;
      case '\b': out += "\\b"; break;
      case '\f': out += "\\f"; break;
      default:
        if (c < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", c);
          out += buf;
        } else {
          out += ch;
        }
    }
  }
  out += '"';
}

void dump(std::string& out, const Json& v, int depth) {
  if (depth > kMaxDepth) throw ChatError("JSON value nested deeper than 512 levels");
  switch (v.type()) {
    case Json::value_t::null: out += "null"; break;
    case Json::value_t::boolean: out += v.get<bool>() ? "true" : "false"; break;
    case Json::value_t::number_integer: out += std::to_string(v.get<int64_t>()); break;
    case Json::value_t::number_unsigned: out += std::to_string(v.get<uint64_t>()); break;
    case Json::value_t::number_float: {
      double d = v.get<double>();
      if (std::isnan(d)) out += "NaN";
      else if (std::isinf(d)) out += d < 0 ? "-Infinity" : "Infinity";
      else out += float_repr(d);
      break;
    }
    case Json::value_t::string: append_escaped(out, v.get_ref<const std::string&>()); break;
    case Json::value_t::array: {
      out += '[';
      bool first = true;
      for (const auto& e : v) {
        if (!first) out += ", ";
        first = false;
        dump(out, e, depth + 1);
      }
      out += ']';
      break;
    }
    case Json::value_t::object: {
      out += '{';
      bool first = true;
      for (const auto& [key, value] : v.items()) {
        if (!first) out += ", ";
        first = false;
        append_escaped(out, key);
        out += ": ";
        dump(out, value, depth + 1);
      }
      out += '}';
      break;
    }
    default: throw ChatError("binary JSON values cannot be printed in a chat prompt");
  }
}

// Decodes the well-formed UTF-8 sequence at s[i]; returns its length, 0 when malformed.
size_t decode_at(std::string_view s, size_t i, char32_t& cp) {
  auto byte = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
  unsigned char b0 = byte(i);
  size_t len;
  char32_t min;
  if (b0 < 0x80) { cp = b0; return 1; }
  if ((b0 & 0xE0) == 0xC0) { len = 2; cp = b0 & 0x1F; min = 0x80; }
  else if ((b0 & 0xF0) == 0xE0) { len = 3; cp = b0 & 0x0F; min = 0x800; }
  else if ((b0 & 0xF8) == 0xF0) { len = 4; cp = b0 & 0x07; min = 0x10000; }
  else return 0;
  if (i + len > s.size()) return 0;
  for (size_t k = 1; k < len; ++k) {
    if ((byte(i + k) & 0xC0) != 0x80) return 0;
    cp = (cp << 6) | (byte(i + k) & 0x3F);
  }
  if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return 0;
  return len;
}

}  // namespace

std::string float_repr(double v) {
  if (std::isnan(v)) return "nan";
  if (std::isinf(v)) return v < 0 ? "-inf" : "inf";
  char buf[64];
  auto res = std::to_chars(buf, buf + sizeof buf, v, std::chars_format::scientific);
  std::string_view s(buf, static_cast<size_t>(res.ptr - buf));  // [-]d[.ddd]e(+|-)XX, shortest
  std::string out;
  if (s.front() == '-') {
    out += '-';
    s.remove_prefix(1);
  }
  size_t e = s.find('e');
  std::string digits;
  for (char c : s.substr(0, e))
    if (c != '.') digits += c;
  int exp = std::atoi(std::string(s.substr(e + 1)).c_str());
  int decpt = exp + 1;  // value = 0.DIGITS * 10^decpt
  int nd = static_cast<int>(digits.size());
  if (decpt <= -4 || decpt > 16) {  // CPython's float_repr_style 'r' switches to exponent here
    out += digits[0];
    if (nd > 1) {
      out += '.';
      out += digits.substr(1);
    }
    out += exp < 0 ? "e-" : "e+";
    int a = std::abs(exp);
    if (a < 10) out += '0';
    out += std::to_string(a);
  } else if (decpt <= 0) {
    out += "0.";
    out.append(static_cast<size_t>(-decpt), '0');
    out += digits;
  } else if (decpt >= nd) {
    out += digits;
    out.append(static_cast<size_t>(decpt - nd), '0');
    out += ".0";
  } else {
    out += digits.substr(0, static_cast<size_t>(decpt));
    out += '.';
    out += digits.substr(static_cast<size_t>(decpt));
  }
  return out;
}

std::string json_dumps(const Json& v) {
  std::string out;
  dump(out, v, 0);
  return out;
}

std::string scalar_str(const Json& v) {
  switch (v.type()) {
    case Json::value_t::null: return "None";
    case Json::value_t::boolean: return v.get<bool>() ? "True" : "False";
    case Json::value_t::number_integer: return std::to_string(v.get<int64_t>());
    case Json::value_t::number_unsigned: return std::to_string(v.get<uint64_t>());
    case Json::value_t::number_float: return float_repr(v.get<double>());
    case Json::value_t::string: return v.get<std::string>();
    default: throw ChatError("internal: scalar_str on a JSON array, object or binary value");
  }
}

bool is_space(char32_t c) {
  return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 ||
         c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 ||
         c == 0x202F || c == 0x205F || c == 0x3000;
}

std::string_view lstrip(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    char32_t cp;
    size_t len = decode_at(s, i, cp);
    if (len == 0 || !is_space(cp)) break;
    i += len;
  }
  return s.substr(i);
}

std::string_view rstrip(std::string_view s) {
  size_t end = s.size();
  while (end > 0) {
    size_t start = end - 1;
    while (start > 0 && end - start < 4 && (static_cast<unsigned char>(s[start]) & 0xC0) == 0x80)
      --start;
    char32_t cp;
    size_t len = decode_at(s, start, cp);
    if (len != end - start || !is_space(cp)) break;
    end = start;
  }
  return s.substr(0, end);
}

std::string_view strip(std::string_view s) { return rstrip(lstrip(s)); }

}  // namespace qrig::text::py
