// Collectives and point-to-point transfers across the ranks of a group (the world, or a group
// split from it: a pipeline stage's data-parallel group, a pipeline group). Each call is enqueued
// on the caller's stream and runs asynchronously in stream order; buffers must stay alive until
// that stream has passed the call (record an event, or synchronize). Every collective has a timeout: a rank
// that does not arrive, or that failed, makes every waiting rank fail with an Error naming the
// collective and the rank(s) — nobody hangs. All ranks must call the same collectives in the
// same order with the same count and dtype; a mismatch is an Error, not a corrupt result.
#pragma once

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

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

  // ---- point to point ------------------------------------------------------------------------
  // `count` elements to or from rank `peer` of this communicator. The i-th send from rank a to
  // rank b pairs with the i-th receive on b from a, in the order each rank issued them, whatever
  // streams run them; count and element size must agree (else kCommMismatch, both sides). A
  // send's stream waits until the peer has taken the data (a rendezvous, as NCCL's and large MPI
  // messages are), so a rank must not issue a send and, later on the same stream, a receive the
  // peer can only match after its own send on one stream too: put sends on a stream of their own
  // (pipeline/schedule.h assumes sends never hold up a rank's schedule). Both wait at most the
  // timeout; a peer that failed or finished without its side fails the other at once, naming it.
  virtual void send(Stream& stream, const void* data, std::size_t count, DType dtype,
                    int peer) = 0;
  virtual void receive(Stream& stream, void* data, std::size_t count, DType dtype, int peer) = 0;

  // ---- groups --------------------------------------------------------------------------------
  // Splits this communicator's ranks into groups, as MPI_Comm_split: ranks that pass the same
  // `color` form one group, numbered by `key`, then by rank here; a negative color joins none
  // (null is returned). Collective over this communicator (every rank calls its splits in the
  // same order) and blocking on the host — not enqueued on a stream — bounded by the timeout.
  // The group keeps its own timeout (`timeout`, or this one's when zero) and its own order of
  // collectives, and `name` names it in its errors ("data-parallel group of pipeline stage 1
  // (ranks 2, 3)"), where ranks are still the world's. Destroy a group before its parent.
  virtual std::unique_ptr<Communicator> split(int color, int key, const std::string& name,
                                              std::chrono::milliseconds timeout = {}) = 0;
  // The group's name in errors; empty for the world.
  virtual std::string group_name() const { return {}; }
  // The groups an all_reduce over this communicator runs over, in turn, which together hold every
  // rank it spans: this one; hybrid sharding's shard group, then its replica group.
  virtual std::vector<Communicator*> spanning_groups() { return {this}; }
  // The world rank of rank `rank` of this group, as errors name ranks.
  virtual int world_rank_of(int rank) const { return rank; }

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

// "rank 2 waited 5 s for rank 1 to send 'activations of micro-batch 3' (receive #0, 8 x fp32)":
// how errors name a point-to-point transfer, from the side of `rank` (world ranks): who waited
// for whom and what. `op` is "send" or "receive"; `waited` ("5 s") may be empty.
std::string describe_transfer(std::string_view op, std::uint64_t sequence, std::size_t count,
                              DType dtype, int rank, int peer, std::string_view label,
                              std::string_view waited = {});

// " at step N" for errors, or "" for step 0 (outside steps).
std::string at_step(std::int64_t step);

// "5 s", "0.5 s": a timeout as errors show it.
std::string seconds_text(std::chrono::milliseconds duration);

}  // namespace zest
