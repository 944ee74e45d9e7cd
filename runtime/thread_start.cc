#include "runtime/thread_start.h"

#include <sys/resource.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <fstream>
#include <mutex>
#include <string>
#include <system_error>

#include <fmt/format.h>

#include "base/error.h"

namespace zest {

namespace {

std::atomic<long> starts{0};
std::atomic<long> failing_start{0};  // the start that fails, counted by `starts`; 0: none
std::once_flag environment_read;

void read_environment() {
  const char* text = std::getenv("ZEST_DEBUG_FAIL_THREAD_START");
  if (text != nullptr) failing_start = std::atol(text);
}

// The first word of a /proc or /sys file, or "?".
std::string first_word(const char* path) {
  std::ifstream file(path);
  std::string word;
  return file >> word ? word : "?";
}

// "Threads:" of /proc/self/status: how many threads this process runs now.
std::string threads_in_process() {
  std::ifstream status("/proc/self/status");
  for (std::string line; std::getline(status, line);) {
    if (line.rfind("Threads:", 0) == 0) return line.substr(line.find_first_not_of(" \t", 8));
  }
  return "?";
}

std::string user_limit() {
  rlimit limit{};
  if (getrlimit(RLIMIT_NPROC, &limit) != 0) return "?";
  return limit.rlim_cur == RLIM_INFINITY ? "unlimited" : std::to_string(limit.rlim_cur);
}

[[noreturn]] void refused(const std::string& what, const std::system_error& error) {
  // Note: the limits are read when a thread is refused, not before: reading them costs file
  // reads, and which one bit (a user limit, the kernel's, a container's pids.max that the
  // process cannot always see) is for the user to tell from the numbers.
  throw Error(ErrorKind::kDevice,
              fmt::format("cannot start {}: {} (threads in this process: {}; ulimit -u: {} "
                          "processes and threads for this user; kernel.threads-max: {}); each "
                          "rank runs a thread and one per stream: lower world.ranks or raise the "
                          "limit",
                          what, error.code().message(), threads_in_process(), user_limit(),
                          first_word("/proc/sys/kernel/threads-max")));
}

}  // namespace

std::thread start_thread(const std::string& what, std::function<void()> body) {
  std::call_once(environment_read, read_environment);
  try {
    const long failing = failing_start.load();
    if (failing > 0 && starts.fetch_add(1) + 1 == failing) {
      throw std::system_error(EAGAIN, std::generic_category(), "injected");
    }
    return std::thread(std::move(body));
  } catch (const std::system_error& error) {
    refused(what, error);
  }
}

namespace detail {

void fail_nth_thread_start(long n) {
  std::call_once(environment_read, read_environment);
  starts = 0;
  failing_start = n;
}

}  // namespace detail

}  // namespace zest
