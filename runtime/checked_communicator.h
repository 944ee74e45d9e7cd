// The collective-order check (debug.check_collectives, or ZEST_CHECK_COLLECTIVES=1). The
// commonest ZeRO-3 hang comes from ranks that issue different collectives — different control
// flow, a unit skipped on one rank — so each waits in a collective the others never join, or
// worse, they pair up wrongly and exchange garbage. This wrapper makes every rank, before each
// collective, all-gather a small record of it (sequence number, op, element count, dtype,
// reduction or root, the label the caller gave, and a running xxHash of every record so far)
// and compare the records in stream order. Ranks that disagree fail, all of them, with one
// message naming the first collective that differs and what each rank issued there — never a
// hang and never a wrong result.
// Note: the record's all-gather is one collective that every rank issues alike whatever the
// real one is, so it always pairs up; the cost is one small extra collective per collective.
// On a device whose memory is not host memory (NCCL moves device memory only) the records go
// through a device buffer, and reading them back blocks the host until the stream reaches the
// check: a debugging aid that gives up the host's lead over the streams.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>

#include "runtime/communicator.h"
#include "runtime/device.h"

namespace zest {

class CheckedCommunicator final : public Communicator {
 public:
  // `device`: where the records are staged when its memory is not host memory; null or the CPU
  // device: the records are all-gathered from host memory.
  explicit CheckedCommunicator(Communicator& inner, Device* device = nullptr);
  // Owns `inner`: a group split from a checked communicator is checked on its own.
  explicit CheckedCommunicator(std::unique_ptr<Communicator> inner, Device* device = nullptr);

  int rank() const override { return inner_.rank(); }
  int world_size() const override { return inner_.world_size(); }
  std::chrono::milliseconds timeout() const override { return inner_.timeout(); }

  void all_gather(Stream& stream, const void* send, void* recv, std::size_t count,
                  DType dtype) override;
  void reduce_scatter(Stream& stream, const void* send, void* recv, std::size_t count, DType dtype,
                      Reduction reduction) override;
  void all_reduce(Stream& stream, const void* send, void* recv, std::size_t count, DType dtype,
                  Reduction reduction) override;
  void broadcast(Stream& stream, void* buffer, std::size_t count, DType dtype, int root) override;
  void barrier(Stream& stream) override;
  // Point to point pairs by each pair of ranks' own order, which the backends check; passed on.
  void send(Stream& stream, const void* data, std::size_t count, DType dtype, int peer) override;
  void receive(Stream& stream, void* data, std::size_t count, DType dtype, int peer) override;
  // The inner communicator's group, checked on its own (its own order of collectives).
  std::unique_ptr<Communicator> split(int color, int key, const std::string& name,
                                      std::chrono::milliseconds timeout = {}) override;
  std::string group_name() const override { return inner_.group_name(); }
  int world_rank_of(int rank) const override { return inner_.world_rank_of(rank); }
  void label_next(const char* label) override;
  void name_next(const std::string& caller) override { inner_.name_next(caller); }
  void begin_step(std::int64_t step) override { inner_.begin_step(step); }

  // Collectives checked so far on this rank.
  std::uint64_t checked() const { return sequence_; }

 private:
  enum class Op : std::int32_t { kAllGather, kReduceScatter, kAllReduce, kBroadcast, kBarrier };
  // `detail`: the Reduction, or the broadcast root.
  void check(Stream& stream, Op op, std::size_t count, DType dtype, std::int32_t detail);

  std::unique_ptr<Communicator> owned_;  // the inner communicator, when this one owns it
  Communicator& inner_;
  Device* const device_;  // null: records stay in host memory
  std::uint64_t sequence_ = 0;
  std::uint64_t running_hash_ = 0;
  std::string label_;  // for the next collective
};

// Whether ZEST_CHECK_COLLECTIVES is set to something other than "0" or "".
bool collective_check_from_environment();

// The communicator a rank uses: `inner`, or `inner` checked (held in `checked`) when `enabled`
// says so (unset: the environment).
Communicator& maybe_checked(Communicator& inner, std::optional<bool> enabled, Device* device,
                            std::optional<CheckedCommunicator>& checked);

}  // namespace zest
