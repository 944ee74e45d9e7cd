// Text read from a file (a checkpoint's `latest`, a manifest's names), made safe to put in a
// message that reaches a terminal. A byte that is not printable ASCII or part of valid UTF-8, or
// that is a control character (C0, DEL, C1), is written as \xNN, so a message stays one line and
// cannot move the cursor, recolour or retitle the terminal. Invariant: ordinary text (printable
// ASCII, valid UTF-8 letters and symbols) passes through unchanged.
#pragma once

#include <cstddef>
#include <string>
#include <string_view>

namespace zest {

// `text` with every unsafe byte written as \xNN.
std::string printable(std::string_view text);

// `text` in double quotes for a message: as printable(), with `"` and `\` escaped and \n, \r, \t
// written as such, so that what a file held is shown exactly. Past `limit` bytes the rest is
// left out and the whole length said: "step-1..."... (4096 bytes).
std::string quoted_text(std::string_view text, std::size_t limit = 64);

}  // namespace zest
