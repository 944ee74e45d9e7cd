// Text read from a file (a checkpoint's `latest`, a manifest's names), made safe to put in a
// message that reaches a terminal. A byte that is not printable ASCII or part of valid UTF-8, or
// that is a control character (C0, DEL, C1), is written as \xNN, so a message stays one line and
// cannot move the cursor, recolour or retitle the terminal. Invariant: ordinary text (printable
// ASCII, valid UTF-8 letters and symbols) passes through unchanged.
#pragma once

#include <cstddef>
#include <optional>
#include <string>
#include <string_view>

namespace zest {

// `text` with every unsafe byte written as \xNN.
std::string printable(std::string_view text);

// `text` in double quotes for a message: as printable(), with `"` and `\` escaped and \n, \r, \t
// written as such, so that what a file held is shown exactly. Past `limit` bytes the rest is
// left out and the whole length said: "step-1..."... (4096 bytes).
std::string quoted_text(std::string_view text, std::size_t limit = 64);

// A file path for a message, in single quotes: as printable(), and past kPathShown bytes the
// rest left out and the whole length said: '/data/...'... (5000 bytes). Any real path's folders
// and name fit; a path of thousands of bytes (a mistake) still leaves a short message.
inline constexpr std::size_t kPathShown = 256;
std::string quoted_path(std::string_view path);

// The offset of the first byte of `text` that does not begin a valid UTF-8 sequence, or nothing
// when all of it is UTF-8: JSON strings (a config, a manifest) must be, or printing them throws.
std::optional<std::size_t> first_invalid_utf8(std::string_view text);

}  // namespace zest
