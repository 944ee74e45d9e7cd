// A rank's device accounting as the engine's host thread sees it, for the memory planner: an
// allocation is charged when the host makes it; a buffer released on a stream is freed once that
// stream has run to the release, which the host learns only when it synchronizes on the stream
// (directly, or on an event of a stream that waited for it). The planner replays the engine's
// calls against it. Invariant: streams run no further than a synchronization requires — the
// host far ahead of its streams, as it is when enqueuing is much cheaper than the work.
#pragma once

#include <array>
#include <cstddef>
#include <limits>
#include <vector>

#include "memory/category.h"

namespace zest {

class PeakLedger {
 public:
  // kCopy: cpu_checkpointing's copy stream; kSendActivations / kSendGradients: a pipeline
  // stage's send streams (pipeline/interpreter.cc).
  enum class Stream { kCompute, kComm, kCopy, kSendActivations, kSendGradients };
  using Handle = std::size_t;
  static constexpr Handle kNone = std::numeric_limits<Handle>::max();

  // `frees_at_release`: a release is accounted at once, as CUDA's stream-ordered pool does
  // (cudaFreeAsync; the pool, not the accounting, keeps the memory from reuse until the stream
  // gets there). Otherwise, as the CPU device: when the stream has run to the release.
  explicit PeakLedger(bool frees_at_release = false) : frees_at_release_(frees_at_release) {}

  // A zero-byte allocation is kNone, as the allocator's empty Buffer.
  Handle allocate(std::size_t bytes, Category category);
  // Freed once `stream` has run the work enqueued so far (at once with frees_at_release); kNone
  // is ignored.
  void release_on(Stream stream, Handle handle);
  // Freed by the host at once (a buffer no stream uses any more); kNone is ignored.
  void release(Handle handle) {
    if (handle != kNone) free(handle);
  }
  // The position of the work enqueued on `stream` so far (an event recorded now).
  std::size_t record(Stream stream) const;
  // `waiter` runs past this point only after `on` has run to `position`.
  void wait(Stream waiter, Stream on, std::size_t position);
  // The host waits until `stream` has run to `position` / everything enqueued.
  void synchronize(Stream stream, std::size_t position);
  void synchronize(Stream stream);

  std::size_t peak_of(Category category) const;
  std::size_t total_peak() const { return total_peak_; }

 private:
  struct Operation {
    Handle release = kNone;  // a buffer to free, or
    Stream on = Stream::kCompute;  // (release == kNone) a wait for `on` to reach `position`
    std::size_t position = 0;
  };
  struct Allocation {
    std::size_t bytes = 0;
    Category category = Category::kWorkspace;
  };

  static std::size_t index(Stream stream) { return static_cast<std::size_t>(stream); }
  void free(Handle handle);

  const bool frees_at_release_;
  std::vector<Allocation> allocations_;
  std::array<std::vector<Operation>, 5> queues_;
  std::array<std::size_t, 5> done_{};  // operations each stream has run
  std::array<std::size_t, kCategoryCount> current_{};
  std::array<std::size_t, kCategoryCount> peak_{};
  std::size_t total_current_ = 0;
  std::size_t total_peak_ = 0;
};

}  // namespace zest
