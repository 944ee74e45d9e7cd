#include "tools/train/console.h"

#include <unistd.h>

#include <cstdlib>
#include <cstring>
#include <iostream>
#include <mutex>

#include "base/printable.h"

namespace zest {

namespace {

std::mutex console_mutex;
std::string live_line;  // what the terminal shows on its last line now ("" = nothing live)

// "\r" returns to the line's start and "ESC [ K" erases to its end: the portable pair every
// terminal emulator understands.
constexpr const char* kClearLine = "\r\033[K";

}  // namespace

bool Console::is_terminal() {
  static const bool terminal = [] {
    const char* term = std::getenv("TERM");
    return isatty(STDOUT_FILENO) == 1 && (term == nullptr || std::strcmp(term, "dumb") != 0);
  }();
  return terminal;
}

void Console::say(const std::string& line) {
  std::lock_guard<std::mutex> lock(console_mutex);
  if (!live_line.empty()) std::cout << kClearLine;
  // A line may quote a file's text (a path from the config, a checkpoint's name): escaped, so
  // that no control character in it reaches the terminal.
  std::cout << printable(line) << '\n';
  if (!live_line.empty()) std::cout << live_line;
  std::cout << std::flush;
}

void Console::live(const std::string& line) {
  if (!is_terminal()) return;
  std::lock_guard<std::mutex> lock(console_mutex);
  live_line = line;
  std::cout << kClearLine << live_line << std::flush;
}

void Console::end_live() {
  std::lock_guard<std::mutex> lock(console_mutex);
  if (live_line.empty()) return;
  std::cout << '\n' << std::flush;
  live_line.clear();
}

void Console::end_live_before_exit() {
  std::unique_lock<std::mutex> lock(console_mutex, std::try_to_lock);
  if (!lock.owns_lock()) return;
  if (!live_line.empty()) std::cout << '\n';
  live_line.clear();
  std::cout << std::flush;
}

}  // namespace zest
