// Collectives across the ranks of a data-parallel group. Each call is enqueued on the caller's
// stream and runs asynchronously in stream order; buffers must stay alive until that stream has
// passed the call (record an event, or synchronize). Every collective has a timeout: a rank
// that does not arrive, or that failed, makes every waiting rank fail with an Error naming the
// collective and the rank(s) — nobody hangs. All ranks must call the same collectives in the
// same order with the same count and dtype; a mismatch is an Error, not a corrupt result.
#pragma once

#include <chrono>
#include <cstddef>

#include "base/dtype.h"
#include "runtime/stream.h"

namespace zest {

enum class Reduction {
  kSum,
  kMean,             // sum, then divide by the world size
  kPreDividedMean,   // divide each input by the world size, then sum: smaller intermediates
};

class Communicator {
 public:
  virtual ~Communicator() = default;

  virtual int rank() const = 0;
  virtual int world_size() const = 0;
  virtual std::chrono::milliseconds timeout() const = 0;

  // `recv` holds world_size × count elements; rank r's `send` lands at recv + r × count.
  // In place when send == recv + rank × count.
  virtual void all_gather(Stream& stream, const void* send, void* recv, std::size_t count,
                          DType dtype) = 0;

  // `send` holds world_size × count elements; `recv` gets the reduction of every rank's slice
  // [rank × count, (rank + 1) × count). In place when recv == send + rank × count.
  // 2-byte types are reduced with float32 accumulation.
  virtual void reduce_scatter(Stream& stream, const void* send, void* recv, std::size_t count,
                              DType dtype, Reduction reduction = Reduction::kSum) = 0;

  // Every rank's `recv` gets the reduction of all `send`s. In place when send == recv.
  virtual void all_reduce(Stream& stream, const void* send, void* recv, std::size_t count,
                          DType dtype, Reduction reduction = Reduction::kSum) = 0;

  // Every rank's `buffer` gets root's `buffer`.
  virtual void broadcast(Stream& stream, void* buffer, std::size_t count, DType dtype,
                         int root) = 0;

  virtual void barrier(Stream& stream) = 0;

  // Names the next collective this rank issues ("gather block3"), for diagnostics only: the
  // collective-order check (checked_communicator.h) shows it when ranks disagree. A no-op
  // elsewhere.
  virtual void label_next(const char* label) { (void)label; }
};

}  // namespace zest
