// Shared by the `local` communicator's suites: run ranks as threads with the communicator's own
// checks answering (the collective-order check off), and catch the zest::Error a call throws.
#pragma once

#include <chrono>
#include <functional>

#include <gtest/gtest.h>

#include "base/error.h"
#include "runtime/world.h"
#include "tests/support/capture_error.h"

namespace zest::testing {

using std::chrono::milliseconds;

inline void run_world(int ranks, const std::function<void(RankContext&)>& work,
               milliseconds timeout = milliseconds(20000)) {
  WorldOptions options;
  options.ranks = ranks;
  options.timeout = timeout;
  // These tests are about the communicator's own checks (mismatch, timeout), which the
  // collective-order check would otherwise answer first.
  options.check_collectives = false;
  World(options).run(work);
}

}  // namespace zest::testing
