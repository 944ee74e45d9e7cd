#include "base/printable.h"

#include <cstdint>
#include <cstdio>

namespace zest {
namespace {

// The length of the valid UTF-8 sequence that starts at `at`, with its code point; 0 when there
// is none. Overlong forms, surrogates and code points past U+10FFFF are not valid UTF-8.
std::size_t utf8_sequence(std::string_view text, std::size_t at, std::uint32_t& code) {
  const auto byte = [&](std::size_t i) { return static_cast<std::uint8_t>(text[i]); };
  const std::uint8_t lead = byte(at);
  std::size_t length = 0;
  if (lead < 0x80) {
    code = lead;
    return 1;
  }
  if (lead >= 0xc2 && lead <= 0xdf) {
    length = 2;
    code = lead & 0x1fu;
  } else if (lead >= 0xe0 && lead <= 0xef) {
    length = 3;
    code = lead & 0x0fu;
  } else if (lead >= 0xf0 && lead <= 0xf4) {
    length = 4;
    code = lead & 0x07u;
  } else {
    return 0;
  }
  if (text.size() - at < length) return 0;
  for (std::size_t i = 1; i < length; ++i) {
    if ((byte(at + i) & 0xc0u) != 0x80u) return 0;
    code = code << 6 | (byte(at + i) & 0x3fu);
  }
  const std::uint32_t smallest[] = {0, 0, 0x80, 0x800, 0x10000};
  if (code < smallest[length] || code > 0x10ffff || (code >= 0xd800 && code <= 0xdfff)) return 0;
  return length;
}

// The length of the valid UTF-8 sequence at `at` (a lead byte >= 0x80) that encodes a character
// that is not a control (U+0080..U+009F are the C1 controls); 0 when there is none.
std::size_t printable_sequence(std::string_view text, std::size_t at) {
  std::uint32_t code = 0;
  const std::size_t length = utf8_sequence(text, at, code);
  if (length < 2 || code <= 0x9f) return 0;
  return length;
}

void append_escaped(std::string& out, std::uint8_t byte) {
  char text[5];
  std::snprintf(text, sizeof text, "\\x%02x", byte);
  out += text;
}

// Appends `text` made safe; `in_quotes` also escapes what would end or confuse a quoted string.
void append_printable(std::string& out, std::string_view text, bool in_quotes) {
  for (std::size_t i = 0; i < text.size();) {
    const auto byte = static_cast<std::uint8_t>(text[i]);
    if (byte >= 0x20 && byte < 0x7f) {
      if (in_quotes && (byte == '"' || byte == '\\')) out += '\\';
      out += static_cast<char>(byte);
      ++i;
      continue;
    }
    if (byte >= 0x80) {
      if (const std::size_t length = printable_sequence(text, i)) {
        out.append(text.substr(i, length));
        i += length;
        continue;
      }
    }
    if (in_quotes && byte == '\n') {
      out += "\\n";
    } else if (in_quotes && byte == '\r') {
      out += "\\r";
    } else if (in_quotes && byte == '\t') {
      out += "\\t";
    } else {
      append_escaped(out, byte);
    }
    ++i;
  }
}

}  // namespace

std::string printable(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  append_printable(out, text, false);
  return out;
}

std::string quoted_text(std::string_view text, std::size_t limit) {
  std::string out = "\"";
  // Note: a cut inside a UTF-8 sequence shows its first bytes escaped, which is still exact.
  append_printable(out, text.substr(0, limit), true);
  out += '"';
  if (text.size() > limit) out += "... (" + std::to_string(text.size()) + " bytes)";
  return out;
}

std::string quoted_path(std::string_view path) {
  std::string out = "'" + printable(path.substr(0, kPathShown)) + "'";
  if (path.size() > kPathShown) out += "... (" + std::to_string(path.size()) + " bytes)";
  return out;
}

std::optional<std::size_t> first_invalid_utf8(std::string_view text) {
  for (std::size_t i = 0; i < text.size();) {
    std::uint32_t code = 0;
    const std::size_t length = utf8_sequence(text, i, code);
    if (length == 0) return i;
    i += length;
  }
  return std::nullopt;
}

}  // namespace zest
