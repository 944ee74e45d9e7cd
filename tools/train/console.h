// zest-train's output on stdout: plain lines, and on a terminal one live progress line at the
// bottom that is redrawn in place. Every line the trainer prints goes through here, so a message
// (a checkpoint saved, an evaluation) never lands in the middle of the live line: the live line
// is cleared, the message printed, and the live line drawn again below it.
#pragma once

#include <string>

namespace zest {

class Console {
 public:
  // Whether stdout is a terminal (and TERM is not "dumb"): live lines are drawn only there.
  static bool is_terminal();

  // Prints `line` and a newline, keeping the live line (if any) below it.
  static void say(const std::string& line);
  // Replaces the live line with `line` (a terminal only; elsewhere it is ignored).
  static void live(const std::string& line);
  // Ends the live line: it stays on screen as a plain line.
  static void end_live();
  // end_live for a process about to end from another thread (the World's end after a stalled
  // rank): does nothing if a thread holds the console, which may be one stalled inside a write.
  static void end_live_before_exit();
};

}  // namespace zest
