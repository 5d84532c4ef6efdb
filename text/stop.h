// Streaming stop strings (OpenAI `stop`): generated text arrives in pieces; the matcher passes on what can
// be shown now and holds back any tail that could still become a stop string, so a stop string split over
// several pieces is never shown. The stop string itself and everything after it are not emitted.
//
// Which match wins: the stop string occurrence that is complete first in the text (smallest end offset;
// on a tie the one that starts first, i.e. the longest). This is what token-by-token generation would
// see, and it makes the result independent of how the text is split into pieces.
//
// The two small helpers below are shared with the other streaming filter (output_parser).
#pragma once

#include <cstddef>
#include <string>
#include <string_view>
#include <vector>

namespace qrig::text {

// Length of an unfinished UTF-8 sequence at the end of s (0..3): the bytes to hold back so that emitted
// text never ends inside a character. Invalid bytes are not held (they could never complete).
size_t incomplete_utf8_suffix(std::string_view s);

// Length of the longest proper prefix of `tag` that s ends with (0 if none): text that may still turn
// into `tag` when more arrives.
size_t partial_tag_suffix(std::string_view s, std::string_view tag);

class StopMatcher {
 public:
  // Throws std::invalid_argument if a stop string is empty. No stop strings: everything passes through
  // (except an unfinished UTF-8 character at the end of a piece, held until it completes).
  explicit StopMatcher(std::vector<std::string> stops);

  struct Result {
    std::string text;      // safe to emit now (may be empty)
    bool stopped = false;  // a stop string matched: generation should end; text is the last output
  };
  // Throws std::logic_error after a stop matched or after flush().
  Result feed(std::string_view piece);
  // End of generation without a stop: returns the held-back text (possibly empty). After a stop it
  // returns "". Further feed() calls throw.
  std::string flush();

  bool stopped() const { return stopped_; }
  // The stop string that matched ("" if none).
  const std::string& matched() const { return matched_; }

 private:
  std::vector<std::string> stops_;
  std::string held_;
  std::string matched_;
  bool stopped_ = false;
  bool flushed_ = false;
};

}  // namespace qrig::text
