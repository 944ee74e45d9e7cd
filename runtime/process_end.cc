#include "runtime/process_end.h"

#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <string>

namespace zest::detail {

int exit_status(const Error& error) { return is_input_error(error.kind()) ? 2 : 1; }

void report_failure(const WorldOptions& options, const Error& error) {
  if (options.before_exit) {
    try {
      options.before_exit();
    } catch (...) {
      // The line below matters more than what the program wanted to tidy.
    }
  }
  std::string line = options.program + ": error: " + error.what();
  for (char& c : line) {
    if (c == '\n' || c == '\r') c = ' ';
  }
  line += '\n';
  // Note: write(2), not std::cerr: a stalled rank thread may hold the stream's lock.
  std::size_t written = 0;
  while (written < line.size()) {
    const ssize_t n = ::write(STDERR_FILENO, line.data() + written, line.size() - written);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    written += static_cast<std::size_t>(n);
  }
}

void end_process(const WorldOptions& options, const Error& error) {
  end_process(options, error, exit_status(error));
}

void end_process(const WorldOptions& options, const Error& error, int status) {
  report_failure(options, error);
  std::_Exit(status);
}

}  // namespace zest::detail
