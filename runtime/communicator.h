// Collectives across the ranks of a data-parallel group. Each call is enqueued on the caller's
// stream and runs asynchronously in stream order; buffers must stay alive until that stream has
// passed the call (record an event, or synchronize). Every collective has a timeout: a rank
// that does not arrive, or that failed, makes every waiting rank fail with an Error naming the
// collective and the rank(s) — nobody hangs. All ranks must call the same collectives in the
// same order with the same count and dtype; a mismatch is an Error, not a corrupt result.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

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

  // Names the next collective this rank issues ("gather block3"), for diagnostics only: its
  // errors and the collective-order check (checked_communicator.h) show it. A no-op where a
  // backend keeps no names.
  virtual void label_next(const char* label) { (void)label; }

  // For a wrapper that issues a collective of its own just before the caller's next one (the
  // collective-order check's gather of its record): errors about the next collective name
  // `caller` — the caller's collective, as describe_collective writes it — in its place, so that
  // a timeout names what the caller issued. A no-op where a backend keeps no names.
  virtual void name_next(const std::string& caller) { (void)caller; }

  // The step this rank is in (1, 2, ...; 0: none), for diagnostics only: errors about the
  // collectives issued from now on say "at step N". A trainer sets it as each step begins.
  virtual void begin_step(std::int64_t step) { (void)step; }
};

// How errors name a collective: "all_reduce #4 (3 x fp32, sum)", "broadcast #0 (8 x int32,
// root 1)", "barrier #7", then " 'gather block3'" when the caller labelled it. `op` is the
// interface's name for it ("all_gather", ...); the reduction is shown for reduce_scatter and
// all_reduce, the root for broadcast.
std::string describe_collective(std::string_view op, std::uint64_t sequence, std::size_t count,
                                DType dtype, Reduction reduction, int root,
                                std::string_view label = {});

// " at step N" for errors, or "" for step 0 (outside steps).
std::string at_step(std::int64_t step);

// "5 s", "0.5 s": a timeout as errors show it.
std::string seconds_text(std::chrono::milliseconds duration);

}  // namespace zest
