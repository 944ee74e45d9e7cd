// The failure a World run reports when ranks that are threads fail: the first cause, not the
// echoes of it. A rank whose collective failed because a peer failed (kPeerFailure) only echoes
// that peer's error, so its failure is kept only if no rank reports a cause. Internal to World
// (world.cc and the CUDA world share it). Invariant: offer() may be called from any thread,
// and a communicator offers its group's first failure the moment it happens (a timeout), so
// the cause is kept before the ranks' echoes of it arrive.
#pragma once

#include <chrono>
#include <exception>
#include <mutex>
#include <optional>
#include <string>

#include "base/error.h"

namespace zest::detail {

class FirstFailure {
 public:
  using Clock = std::chrono::steady_clock;

  void offer(int rank, const std::exception& error) {
    const auto* zest_error = dynamic_cast<const Error*>(&error);
    const bool echo = zest_error && zest_error->kind() == ErrorKind::kPeerFailure;
    std::lock_guard lock(mutex_);
    if (!first_at_) first_at_ = Clock::now();
    if (failure_ && (echo || !failure_is_echo_)) return;
    failure_ = with_context(error, "rank " + std::to_string(rank));
    failure_is_echo_ = echo;
  }
  // When the first failure was offered: nothing while none has been.
  std::optional<Clock::time_point> first_at() const {
    std::lock_guard lock(mutex_);
    return first_at_;
  }
  // The kept failure, "rank R: ...".
  std::optional<Error> failure() const {
    std::lock_guard lock(mutex_);
    return failure_;
  }
  // Throws the kept failure, if any: after every rank has been joined.
  void rethrow() const {
    if (const std::optional<Error> kept = failure()) raise(*kept);
  }

 private:
  mutable std::mutex mutex_;
  std::optional<Error> failure_;
  bool failure_is_echo_ = false;
  std::optional<Clock::time_point> first_at_;
};

}  // namespace zest::detail
