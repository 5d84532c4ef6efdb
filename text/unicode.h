// UTF-8 helpers the tokenizer needs and that tests and output code can share: repairing invalid
// UTF-8 (U+FFFD), NFC normalisation (utf8proc), and GPT-2's byte <-> unicode mapping that byte-level
// BPE vocabularies store their tokens in.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace qrig::text {

// Length in bytes of the well-formed UTF-8 character at s[i], 0 if the bytes there are ill-formed
// (as defined by Unicode table 3-7: no overlongs, no surrogates, nothing above U+10FFFF), or -1 if
// they are a proper prefix of a well-formed character that the end of `s` cuts off.
int utf8_char_len(std::string_view s, size_t i);

// Where the valid UTF-8 prefix of `s` ends if the last character may still be completed by more
// bytes: returns s.size() unless `s` ends with a well-formed but incomplete character, in which case
// it returns the index where that incomplete character starts.
size_t utf8_complete_prefix(std::string_view s);

// `s` with every maximal ill-formed subsequence replaced by U+FFFD (the Unicode "maximal subpart"
// practice, as Python's errors="replace" does). Identity on valid UTF-8. An incomplete character at
// the very end is also replaced.
std::string sanitize_utf8(std::string_view s);
bool is_valid_utf8(std::string_view s);

// Unicode NFC of `s` (invalid UTF-8 first repaired as sanitize_utf8 does). Throws std::runtime_error
// only on allocation failure inside utf8proc.
std::string nfc(std::string_view s);

// Append the UTF-8 encoding of a code point (must be a valid scalar value).
void append_utf8(std::string& out, char32_t cp);

// GPT-2 byte-level mapping: every byte value has a printable code point (printable Latin-1 bytes
// map to themselves, the others to U+0100 upwards in byte order). Tokens of byte-level BPE
// vocabularies are strings of these code points.
struct ByteUnicode {
  std::array<char32_t, 256> byte_to_cp{};
  std::array<std::string, 256> byte_to_utf8;  // UTF-8 of byte_to_cp[b]
  // Inverse: code point -> byte, or -1 if the code point is not in the mapping.
  int cp_to_byte(char32_t cp) const;
};
const ByteUnicode& byte_unicode();

}  // namespace qrig::text
