// Runs a program as a user would (a tool's binary, mpirun, a shell), for the tests that check
// what it prints and how it exits. Its stdout and stderr go to files, not pipes, so a chatty
// child never blocks on a pipe nobody drains; they are read back once it has exited.
// Invariant: ProcessResult::status is the exit status, 128 + the signal when a signal ended the
// child (as a shell reports it), and -1 (with a test failure) when it could not be started.
#pragma once

#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/resource.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <thread>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include <gtest/gtest.h>

extern char** environ;

namespace zest::testing {

struct ProcessResult {
  int status = -1;
  std::string out;  // stdout; stdout and stderr together when they shared a file
  std::string err;  // stderr; empty when it went to the stdout file
  bool killed_at_limit = false;  // wait_for_program_within had to end it (status 128 + 9)
};

// Where a child's stdout and stderr go, truncated first.
struct OutputFiles {
  std::string stdout_path;
  std::string stderr_path = {};  // empty: stderr goes to the stdout file, in the order written
};

inline std::string read_file(const std::filesystem::path& path) {
  std::ifstream file(path, std::ios::binary);
  std::ostringstream text;
  text << file.rdbuf();
  return text.str();
}

inline std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream stream(text);
  for (std::string line; std::getline(stream, line);) lines.push_back(line);
  return lines;
}

// Starts `program` (a path; PATH is not searched) with `arguments`, in this process's working
// directory and environment. Returns its pid, or -1 when it could not be started.
inline pid_t start_program(const std::string& program, const std::vector<std::string>& arguments,
                           const OutputFiles& files) {
  std::vector<std::string> strings = {program};
  strings.insert(strings.end(), arguments.begin(), arguments.end());
  std::vector<char*> argv;
  for (std::string& argument : strings) argv.push_back(argument.data());
  argv.push_back(nullptr);
  posix_spawn_file_actions_t actions;
  posix_spawn_file_actions_init(&actions);
  posix_spawn_file_actions_addopen(&actions, STDOUT_FILENO, files.stdout_path.c_str(),
                                   O_WRONLY | O_CREAT | O_TRUNC, 0644);
  if (files.stderr_path.empty()) {
    posix_spawn_file_actions_adddup2(&actions, STDOUT_FILENO, STDERR_FILENO);
  } else {
    posix_spawn_file_actions_addopen(&actions, STDERR_FILENO, files.stderr_path.c_str(),
                                     O_WRONLY | O_CREAT | O_TRUNC, 0644);
  }
  pid_t pid = -1;
  const int error = posix_spawn(&pid, program.c_str(), &actions, nullptr, argv.data(), environ);
  posix_spawn_file_actions_destroy(&actions);
  if (error != 0) {
    ADD_FAILURE() << "cannot run " << program << ": " << std::strerror(error);
    return -1;
  }
  return pid;
}

// Waits for the child `pid` (from start_program with the same `files`) to end.
inline ProcessResult wait_for_program(pid_t pid, const OutputFiles& files) {
  ProcessResult result;
  if (pid == -1) return result;
  int status = 0;
  waitpid(pid, &status, 0);
  if (WIFEXITED(status)) result.status = WEXITSTATUS(status);
  if (WIFSIGNALED(status)) result.status = 128 + WTERMSIG(status);
  result.out = read_file(files.stdout_path);
  if (!files.stderr_path.empty()) result.err = read_file(files.stderr_path);
  return result;
}

// wait_for_program, bounded: a child still running after `limit` is killed (SIGKILL), so that
// a test of "this ends in time" fails instead of hanging when it does not.
inline ProcessResult wait_for_program_within(pid_t pid, const OutputFiles& files,
                                             std::chrono::milliseconds limit) {
  ProcessResult result;
  if (pid == -1) return result;
  const auto deadline = std::chrono::steady_clock::now() + limit;
  int status = 0;
  while (waitpid(pid, &status, WNOHANG) == 0) {
    if (std::chrono::steady_clock::now() >= deadline) {
      kill(pid, SIGKILL);
      waitpid(pid, &status, 0);
      result.killed_at_limit = true;
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }
  if (WIFEXITED(status)) result.status = WEXITSTATUS(status);
  if (WIFSIGNALED(status)) result.status = 128 + WTERMSIG(status);
  result.out = read_file(files.stdout_path);
  if (!files.stderr_path.empty()) result.err = read_file(files.stderr_path);
  return result;
}

inline ProcessResult run_program(const std::string& program,
                                 const std::vector<std::string>& arguments,
                                 const OutputFiles& files) {
  return wait_for_program(start_program(program, arguments, files), files);
}

// For a child that must fail fast and small: the address space it may map (RLIMIT_AS, so that an
// attempted large allocation fails inside it instead of swapping the machine) and how long it may
// run before it is killed (so that a child blocked on a FIFO fails the test instead of hanging it).
struct ProcessLimits {
  std::size_t address_space_bytes = 0;  // 0: no limit
  double timeout_s = 60.0;
};

struct LimitedResult : ProcessResult {
  bool timed_out = false;          // killed at timeout_s (status 128 + SIGKILL)
  double seconds = 0.0;            // wall time from start to exit
  std::size_t peak_rss_bytes = 0;  // the child's largest resident set (getrusage ru_maxrss)
};

// run_program under `limits`: started with fork and execv, the limit set in the child only.
inline LimitedResult run_program_limited(const std::string& program,
                                         const std::vector<std::string>& arguments,
                                         const OutputFiles& files, const ProcessLimits& limits) {
  std::vector<std::string> strings = {program};
  strings.insert(strings.end(), arguments.begin(), arguments.end());
  std::vector<char*> argv;
  for (std::string& argument : strings) argv.push_back(argument.data());
  argv.push_back(nullptr);
  const std::string stderr_path = files.stderr_path.empty() ? files.stdout_path : files.stderr_path;
  LimitedResult result;
  const auto start = std::chrono::steady_clock::now();
  const pid_t pid = ::fork();
  if (pid == 0) {
    // The child: only async-signal-safe calls until execv.
    if (limits.address_space_bytes > 0) {
      const rlimit limit{limits.address_space_bytes, limits.address_space_bytes};
      if (::setrlimit(RLIMIT_AS, &limit) != 0) ::_exit(126);
    }
    const int out = ::open(files.stdout_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (out < 0 || ::dup2(out, STDOUT_FILENO) < 0) ::_exit(126);
    if (files.stderr_path.empty()) {
      if (::dup2(STDOUT_FILENO, STDERR_FILENO) < 0) ::_exit(126);
    } else {
      const int err = ::open(stderr_path.c_str(), O_WRONLY | O_CREAT | O_TRUNC, 0644);
      if (err < 0 || ::dup2(err, STDERR_FILENO) < 0) ::_exit(126);
    }
    ::execv(program.c_str(), argv.data());
    ::_exit(127);
  }
  if (pid < 0) {
    ADD_FAILURE() << "cannot fork to run " << program << ": " << std::strerror(errno);
    return result;
  }
  const auto deadline = start + std::chrono::duration<double>(limits.timeout_s);
  int status = 0;
  rusage usage{};
  while (::wait4(pid, &status, WNOHANG, &usage) == 0) {
    if (std::chrono::steady_clock::now() > deadline) {
      result.timed_out = true;
      ::kill(pid, SIGKILL);
      ::wait4(pid, &status, 0, &usage);
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(2));
  }
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  result.peak_rss_bytes = static_cast<std::size_t>(usage.ru_maxrss) * 1024;  // Linux: KiB
  if (WIFEXITED(status)) result.status = WEXITSTATUS(status);
  if (WIFSIGNALED(status)) result.status = 128 + WTERMSIG(status);
  result.out = read_file(files.stdout_path);
  if (!files.stderr_path.empty()) result.err = read_file(files.stderr_path);
  return result;
}

// The address-space limit the tests of impossible inputs run a tool under: far below what the
// old code allocated for them (5 GB and more building units, reading /dev/zero), far above what
// the tool's own libraries map. Note: a CUDA build maps cuBLAS, cuBLASLt and NCCL; under 1 GiB
// OpenBLAS's worker threads then cannot get their buffers, and the process waits for them at
// exit forever.
// Sanitizer builds run without it: ASan and TSan reserve terabytes of address space for their
// shadow memory at start-up, so under any such limit the tool could not start at all.
// GCC says so by __SANITIZE_*__, clang by __has_feature.
#if defined(__has_feature)
#if __has_feature(address_sanitizer) || __has_feature(thread_sanitizer)
#define ZEST_TEST_UNDER_SANITIZER 1
#endif
#endif
#if defined(__SANITIZE_ADDRESS__) || defined(__SANITIZE_THREAD__) || defined(ZEST_TEST_UNDER_SANITIZER)
inline constexpr std::size_t kToolAddressSpaceLimit = 0;
#else
inline constexpr std::size_t kToolAddressSpaceLimit = std::size_t{4} << 30;
#endif

// A tool's resident set when it does nothing but start and print its --help, so that a test can
// bound what a run adds to it: a CUDA build's libraries alone are some 220 MB resident.
inline std::size_t idle_resident_bytes(const std::string& program, const OutputFiles& files) {
  return run_program_limited(program, {"--help"}, files, {kToolAddressSpaceLimit, 60})
      .peak_rss_bytes;
}

}  // namespace zest::testing
