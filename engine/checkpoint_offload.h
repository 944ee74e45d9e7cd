// activation_checkpointing.cpu_checkpointing: the input a recomputed unit keeps from forward to
// backward (the previous unit's output) waits in the host arena (category offload; page-locked
// on CUDA) instead of device memory. It goes to the host on a copy stream of its own once the
// unit's forward has read it, its device buffer released after the copy; in backward it comes
// back one unit ahead of the unit that reads it, so both copies overlap compute. Owns the copy
// stream, one host buffer per offloaded output (allocated at its first use, kept between
// micro-batches: page-locked allocation is slow) and the events between the streams.
// Invariant: the compute stream reads an output brought back only after wait_fetched().
#pragma once

#include <cstddef>
#include <deque>
#include <memory>
#include <string>
#include <vector>

#include "memory/allocator.h"
#include "runtime/world.h"

namespace zest {

class CheckpointOffload {
 public:
  // Throws a kConfig Error naming the key when the device has no host arena.
  CheckpointOffload(RankContext& context, std::size_t unit_count);
  ~CheckpointOffload();  // drains the copy stream
  CheckpointOffload(const CheckpointOffload&) = delete;
  CheckpointOffload& operator=(const CheckpointOffload&) = delete;

  // Forward, after the compute work that last reads `output` (unit `producer`'s) was enqueued:
  // copy it to the host, then release the device buffer in copy-stream order.
  void offload(std::size_t producer, Buffer output);
  // On a device whose frees wait for the stream (CPU): before a recomputed unit's call, the host
  // waits for the copies to the host, so the released outputs are not all charged at once
  // (engine/recompute.h's lag). Note: the wait follows the lag's, which has let the last unit's
  // forward finish, and a copy of one unit's input is short beside a unit's compute; waiting
  // for every copy makes the peak the plan's exactly, where allowing one in flight would leave
  // it to the copy's timing.
  void bound_copies();
  // Backward: unit `producer`'s output back in a new device buffer (category activations).
  Buffer fetch(std::size_t producer);
  // The compute work enqueued next waits for fetch(producer)'s copy.
  void wait_fetched(std::size_t producer);
  void synchronize();

 private:
  // A copy on the copy stream, a slice on the timeline's "checkpoints" track when it records.
  void traced_copy(void* destination, const void* source, std::size_t bytes, std::string name);

  RankContext& context_;
  std::vector<Buffer> host_;  // per unit: its output on the host
  std::vector<std::unique_ptr<Event>> read_;     // per unit: compute has read its output
  std::vector<std::unique_ptr<Event>> fetched_;  // per unit: the copy back has run
  std::deque<std::unique_ptr<Event>> copies_in_flight_;  // copies to the host, oldest first
  std::vector<std::unique_ptr<Event>> spare_events_;
  const bool bound_copies_;
  // The last member: drained and destroyed before the events and buffers its work uses.
  std::unique_ptr<Stream> stream_;
};

}  // namespace zest
