// Text form of the per-range kernel attribute (kernel_attr.h).
#include "ir/kernel_attr.h"

#include <charconv>

#include <fmt/format.h>

#include "ir/ir.h"

namespace qrig::ir {

namespace {

std::vector<std::string_view> split(std::string_view s, char sep) {
  std::vector<std::string_view> out;
  size_t b = 0;
  while (true) {
    const size_t e = s.find(sep, b);
    out.push_back(s.substr(b, e == std::string_view::npos ? std::string_view::npos : e - b));
    if (e == std::string_view::npos) return out;
    b = e + 1;
  }
}

int64_t number(std::string_view s, std::string_view entry) {
  int64_t v = 0;
  auto r = std::from_chars(s.data(), s.data() + s.size(), v);
  if (s.empty() || r.ec != std::errc() || r.ptr != s.data() + s.size() || v <= 0)
    throw Error(fmt::format("kernel attribute: '{}' in '{}' is not a positive row count", s, entry));
  return v;
}

}  // namespace

std::vector<LaunchRange> parse_launch_ranges(std::string_view text) {
  std::vector<LaunchRange> out;
  for (std::string_view entry : split(text, ' ')) {
    if (entry.empty()) continue;
    const size_t colon = entry.find(':'), dash = entry.find('-');
    if (colon == std::string_view::npos || dash == std::string_view::npos || dash > colon)
      throw Error(fmt::format("kernel attribute: '{}' is not FIRST-LAST:VARIANTS", entry));
    LaunchRange r;
    r.first = number(entry.substr(0, dash), entry);
    r.last = number(entry.substr(dash + 1, colon - dash - 1), entry);
    if (r.last < r.first) throw Error(fmt::format("kernel attribute: '{}' ends before it starts", entry));
    const int64_t expect = out.empty() ? 1 : out.back().last + 1;
    if (r.first != expect)
      throw Error(fmt::format("kernel attribute: '{}' starts at {} rows, the ranges must continue at {}", entry,
                              r.first, expect));
    for (std::string_view part : split(entry.substr(colon + 1), ',')) {
      std::vector<std::string> names;
      for (std::string_view n : split(part, '+')) {
        if (n.empty()) throw Error(fmt::format("kernel attribute: an empty variant name in '{}'", entry));
        names.emplace_back(n);
      }
      r.parts.push_back(std::move(names));
    }
    out.push_back(std::move(r));
  }
  if (out.empty()) throw Error("kernel attribute: no range");
  return out;
}

std::string print_launch_ranges(const std::vector<LaunchRange>& ranges) {
  std::string s;
  for (const LaunchRange& r : ranges) {
    s += fmt::format("{}{}-{}:", s.empty() ? "" : " ", r.first, r.last);
    for (size_t p = 0; p < r.parts.size(); ++p) {
      if (p) s += ",";
      for (size_t k = 0; k < r.parts[p].size(); ++k) s += (k ? "+" : "") + r.parts[p][k];
    }
  }
  return s;
}

const LaunchRange* launch_range_for(const std::vector<LaunchRange>& ranges, int64_t rows) {
  for (const LaunchRange& r : ranges)
    if (rows >= r.first && rows <= r.last) return &r;
  return nullptr;
}

}  // namespace qrig::ir
