// Streaming stop-string matcher (see stop.h for the semantics).
#include "text/stop.h"

#include <algorithm>
#include <stdexcept>

namespace qrig::text {

size_t incomplete_utf8_suffix(std::string_view s) {
  const size_t n = s.size();
  for (size_t k = 1; k <= 3 && k <= n; ++k) {
    const unsigned char c = static_cast<unsigned char>(s[n - k]);
    if ((c & 0xC0) == 0x80) continue;  // continuation byte: look further back for the lead byte
    size_t need = 1;
    if (c >= 0xC2 && c <= 0xDF) need = 2;
    else if (c >= 0xE0 && c <= 0xEF) need = 3;
    else if (c >= 0xF0 && c <= 0xF4) need = 4;
    return need > k ? k : 0;
  }
  return 0;
}

size_t partial_tag_suffix(std::string_view s, std::string_view tag) {
  if (tag.empty()) return 0;
  for (size_t k = std::min(s.size(), tag.size() - 1); k > 0; --k)
    if (s.substr(s.size() - k) == tag.substr(0, k)) return k;
  return 0;
}

StopMatcher::StopMatcher(std::vector<std::string> stops) : stops_(std::move(stops)) {
  for (const std::string& s : stops_)
    if (s.empty()) throw std::invalid_argument("stop strings must not be empty");
}

StopMatcher::Result StopMatcher::feed(std::string_view piece) {
  if (stopped_) throw std::logic_error("StopMatcher::feed after a stop string matched");
  if (flushed_) throw std::logic_error("StopMatcher::feed after flush");
  held_.append(piece);

  // Earliest-ending occurrence; held_ never contains a complete match from before, so any match here
  // ends inside the new piece. The first occurrence of each stop is also its earliest-ending one.
  size_t best_start = std::string::npos, best_end = std::string::npos;
  const std::string* best = nullptr;
  for (const std::string& s : stops_) {
    const size_t pos = held_.find(s);
    if (pos == std::string::npos) continue;
    const size_t end = pos + s.size();
    if (best == nullptr || end < best_end || (end == best_end && pos < best_start)) {
      best = &s;
      best_start = pos;
      best_end = end;
    }
  }
  Result r;
  if (best != nullptr) {
    r.text = held_.substr(0, best_start);
    r.stopped = true;
    stopped_ = true;
    matched_ = *best;
    held_.clear();
    return r;
  }

  size_t hold = incomplete_utf8_suffix(held_);
  for (const std::string& s : stops_) hold = std::max(hold, partial_tag_suffix(held_, s));
  r.text = held_.substr(0, held_.size() - hold);
  held_.erase(0, held_.size() - hold);
  return r;
}

std::string StopMatcher::flush() {
  flushed_ = true;
  std::string out;
  out.swap(held_);
  return out;
}

}  // namespace qrig::text
