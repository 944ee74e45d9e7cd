// Multi-process fault tests: a test starts its own mpirun on its own executable, running one of
// the suite's DISABLED_ scenarios, and bounds the job's time with `timeout`, so a job that hangs
// fails the test instead of the suite. Only for suites built as mpi tests (ZEST_MPIEXEC and
// ZEST_MPIEXEC_FLAGS come from cmake/ZestTests.cmake).
#pragma once

#include <sys/wait.h>

#include <array>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <stdexcept>
#include <string>

#include "runtime/world.h"

namespace zest::testing {

using ScenarioClock = std::chrono::steady_clock;

// The scenarios' collective timeout: far longer than a test may take, so that a job that ends in
// time was ended by the failure, not by peers timing out.
constexpr std::chrono::seconds kScenarioCollectiveTimeout(120);
// What a test allows the whole job, start-up included, on a loaded two-core machine.
constexpr std::chrono::seconds kScenarioJobBound(40);

struct ScenarioResult {
  int status = -1;  // the launcher's exit status; 124 where `timeout` had to end it
  std::string output;
  ScenarioClock::duration elapsed{};
};

// Runs `suite`.DISABLED_`scenario` of this executable under mpirun with `processes` processes.
inline ScenarioResult run_mpi_scenario(const std::string& suite, const std::string& scenario,
                                       int processes) {
  const std::string self = std::filesystem::read_symlink("/proc/self/exe").string();
  const std::string command =
      "timeout -k 5 " + std::to_string(kScenarioJobBound.count() + 20) + " " ZEST_MPIEXEC " " +
      ZEST_MPIEXEC_FLAGS + " -np " + std::to_string(processes) + " '" + self +
      "' --gtest_also_run_disabled_tests --gtest_filter='" + suite + ".DISABLED_" + scenario +
      "' 2>&1";
  ScenarioResult result;
  const auto start = ScenarioClock::now();
  FILE* pipe = popen(command.c_str(), "r");
  if (pipe == nullptr) throw std::runtime_error("popen failed: " + command);
  std::array<char, 4096> chunk;
  while (std::fgets(chunk.data(), chunk.size(), pipe) != nullptr) result.output += chunk.data();
  const int wait_status = pclose(pipe);
  result.elapsed = ScenarioClock::now() - start;
  result.status = WIFEXITED(wait_status) ? WEXITSTATUS(wait_status) : 128 + WTERMSIG(wait_status);
  return result;
}

// The World of a scenario: the mpi backend, the long collective timeout, a program name that
// the expected messages start with.
inline WorldOptions scenario_world_options() {
  WorldOptions options;
  options.backend = "mpi";
  options.timeout = kScenarioCollectiveTimeout;
  options.program = "fault-scenario";
  return options;
}

}  // namespace zest::testing
