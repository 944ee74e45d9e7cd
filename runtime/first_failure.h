// The failure a World run reports when ranks that are threads fail: the first cause, not the
// echoes of it. A rank whose collective failed because a peer failed (kPeerFailure) only echoes
// that peer's error, so its failure is kept only if no rank reports a cause. Internal to World
// (world.cc and the CUDA world share it). Invariant: offer() may be called from any rank thread.
#pragma once

#include <exception>
#include <mutex>
#include <optional>
#include <string>

#include "base/error.h"

namespace zest::detail {

class FirstFailure {
 public:
  void offer(int rank, const std::exception& error) {
    const auto* zest_error = dynamic_cast<const Error*>(&error);
    const bool echo = zest_error && zest_error->kind() == ErrorKind::kPeerFailure;
    std::lock_guard lock(mutex_);
    if (failure_ && (echo || !failure_is_echo_)) return;
    failure_ = with_context(error, "rank " + std::to_string(rank));
    failure_is_echo_ = echo;
  }
  // Throws the kept failure, if any: after every rank has been joined.
  void rethrow() const {
    if (failure_) raise(*failure_);
  }

 private:
  std::mutex mutex_;
  std::optional<Error> failure_;
  bool failure_is_echo_ = false;
};

}  // namespace zest::detail
